/*
GELU (tanh approximation), forward and backward (in place over the incoming gradient).

  forward:  out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  backward: d = gelu'(x) * d
The expressions are the CPU's, term by term; only tanhf differs (CUDA's and glibc's are
each within 2 ulp), hence tolerances instead of bitwise: 1e-6 for the forward, 1e-5 for
the backward, where sech^2 = 1 - tanh^2 cancels for |x| around 3..5 and multiplies a
last-ulp difference of tanh by up to ~20 (near |x| = 5.3, the last x whose tanh rounds below
1; x * (1 + 3 * 0.044715 x^2) grows): 2 ulp there is 2.4e-6, below 1e-5 of |d| <= 1.

  make -C dev/cuda && ./build/cuda/gelu
*/
#include "cpu_reference.h"  // the CPU trainer's layer functions, named *_cpu
#include "common.h"

// ----------------------------------------------------------------------------

static void validate(size_t n, uint64_t* rng) {
    printf("N=%zu\n", n);
    float* inp = random_floats(n, -6.0f, 6.0f, rng);
    float* dout = random_floats(n, -1.0f, 1.0f, rng);
    float* out = (float*)mallocCheck(n * sizeof(float));
    float* dinp = (float*)callocCheck(n, sizeof(float));  // the CPU adds into zeros
    float *d_inp = to_device(inp, n), *d_d = to_device(dout, n);
    float* d_out = cuda_malloc(n * sizeof(float), "out");
    gelu_forward_cpu(out, inp, n);
    gelu_forward(d_out, d_inp, n);
    validate_result(d_out, out, n, "gelu_forward", 1e-6);
    gelu_backward_cpu(dinp, inp, dout, n);
    gelu_backward_inplace(d_d, d_inp, n);
    validate_result(d_d, dinp, n, "gelu_backward", 1e-5);
    free(inp); free(dout); free(out); free(dinp);
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_d)); cudaCheck(cudaFree(d_out));
}

static void benchmark(size_t n, uint64_t* rng) {
    if (!benchmarks_wanted()) { return; }
    printf("benchmark N=%zu\n", n);
    float* h = random_floats(n, -3.0f, 3.0f, rng);
    float *inp = to_device(h, n), *d = to_device(h, n);
    float* out = cuda_malloc(n * sizeof(float), "out");
    float us = benchmark_us(20, [&] { gelu_forward(out, inp, n); });
    report_bandwidth("gelu_forward", us, 2.0 * n * 4);
    us = benchmark_us(20, [&] { gelu_backward_inplace(d, inp, n); });
    report_bandwidth("gelu_backward (in place)", us, 3.0 * n * 4);
    free(h);
    cudaCheck(cudaFree(inp)); cudaCheck(cudaFree(d)); cudaCheck(cudaFree(out));
}

int main(void) {
    setup_device("gelu");
    uint64_t rng = 1337;
    validate(1, &rng);
    validate(1023, &rng);           // not a multiple of the 4 elements per thread
    validate(4 * 64 * 4 * 768, &rng);
    benchmark((size_t)8 * 1024 * 4 * 768, &rng);  // fch of GPT-2 124M at B*T = 8192
    return finish("gelu");
}
