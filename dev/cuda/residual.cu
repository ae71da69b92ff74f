/*
Residual add, forward (the backward of a sum just passes the gradient on: the trainer
carries one dresidual buffer down the layers instead of running a kernel).

  forward: out = a + b   (one fp32 addition, so bitwise the CPU's)

  make -C dev/cuda && ./build/cuda/residual
*/
#include "cpu_reference.h"  // the CPU trainer's layer functions, named *_cpu
#include "common.h"

static void validate(size_t n, uint64_t* rng) {
    printf("N=%zu\n", n);
    float* a = random_floats(n, -1.0f, 1.0f, rng);
    float* b = random_floats(n, -1.0f, 1.0f, rng);
    float* out = (float*)mallocCheck(n * sizeof(float));
    float *d_a = to_device(a, n), *d_b = to_device(b, n);
    float* d_out = cuda_malloc(n * sizeof(float), "out");
    residual_forward_cpu(out, a, b, n);
    residual_forward(d_out, d_a, d_b, n);
    validate_result(d_out, out, n, "residual_forward", 0.0);
    free(a); free(b); free(out);
    cudaCheck(cudaFree(d_a)); cudaCheck(cudaFree(d_b)); cudaCheck(cudaFree(d_out));
}

static void benchmark(size_t n, uint64_t* rng) {
    if (!benchmarks_wanted()) { return; }
    printf("benchmark N=%zu\n", n);
    float* h = random_floats(n, -1.0f, 1.0f, rng);
    float *a = to_device(h, n), *b = to_device(h, n);
    float* out = cuda_malloc(n * sizeof(float), "out");
    float us = benchmark_us(20, [&] { residual_forward(out, a, b, n); });
    report_bandwidth("residual_forward", us, 3.0 * n * 4);
    free(h);
    cudaCheck(cudaFree(a)); cudaCheck(cudaFree(b)); cudaCheck(cudaFree(out));
}

int main(void) {
    setup_device("residual");
    uint64_t rng = 1337;
    validate(1, &rng);
    validate(1027, &rng);
    validate(4 * 64 * 768, &rng);
    benchmark((size_t)8 * 1024 * 768, &rng);
    benchmark((size_t)16 * 1024 * 768, &rng);
    return finish("residual");
}
