/*
AdamW, exactly docs/zenflow_spec.md section 3.1: one thread per element, the constants
(1 - b1, 1 - b2, and the bias corrections computed in double and rounded once) on the host.

The GPU result must equal the CPU's scalar loop BIT FOR BIT (tolerance 0). That holds only
if neither side fuses a*b + c into an FMA: this file (device and host code) is built with
-fmad=false and -Xcompiler -ffp-contract=off. If this check fails, look at the build flags
first.

  make -C dev/cuda && ./build/cuda/adamw
*/
#include "common.h"

// ----------------------------------------------------------------------------
// CPU reference: the scalar loop of spec 3.1, written out as llmc/adamw.h's adamw_one is
// (so it catches indexing, constants and fused multiply-adds, not a formula error both
// share: test_gpt2cu checks the formula against PyTorch)

static void adamw_cpu(float* p, float* m, float* v, const float* g, size_t n, float lr, float beta1, float beta2,
                      float eps, float wd, int s) {
    float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    float bc1 = (float)(1.0 - pow((double)beta1, (double)s));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)s));
    for (size_t i = 0; i < n; i++) {
        float mi = beta1 * m[i] + omb1 * g[i];
        float vi = beta2 * v[i] + (omb2 * g[i]) * g[i];
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        float pi = p[i];
        p[i] = pi - lr * (mhat / (sqrtf(vhat) + eps) + wd * pi);
        m[i] = mi;
        v[i] = vi;
    }
}

// ----------------------------------------------------------------------------

static void validate(size_t n, float lr, float wd, int steps, uint64_t* rng) {
    printf("N=%zu lr=%g wd=%g, steps 1..%d\n", n, lr, wd, steps);
    float* p = random_floats(n, -1.0f, 1.0f, rng);
    float* m = (float*)callocCheck(n, sizeof(float));
    float* v = (float*)callocCheck(n, sizeof(float));
    float* g = random_floats(n, -1e-2f, 1e-2f, rng);
    for (size_t i = 0; i < n; i += 97) { g[i] = 0.0f; }   // zero gradients: sign of a zero update
    for (size_t i = 5; i < n; i += 101) { g[i] = 1e-30f; }  // tiny: (1-b2) g g underflows to 0
    for (size_t i = 7; i < n; i += 103) { g[i] = 1e-20f; }  // small: v is a denormal (no flush to 0)
    float *d_p = to_device(p, n), *d_m = to_device(m, n), *d_v = to_device(v, n), *d_g = to_device(g, n);
    for (int s = 1; s <= steps; s++) {
        adamw_cpu(p, m, v, g, n, lr, 0.9f, 0.95f, 1e-8f, wd, s);
        adamw_update(d_p, d_m, d_v, d_g, n, lr, 0.9f, 0.95f, 1e-8f, wd, s);
    }
    validate_result(d_p, p, n, "adamw params", 0.0);
    validate_result(d_m, m, n, "adamw m", 0.0);
    validate_result(d_v, v, n, "adamw v", 0.0);
    free(p); free(m); free(v); free(g);
    cudaCheck(cudaFree(d_p)); cudaCheck(cudaFree(d_m)); cudaCheck(cudaFree(d_v)); cudaCheck(cudaFree(d_g));
}

static void benchmark(size_t n, uint64_t* rng) {
    if (!benchmarks_wanted()) { return; }
    printf("benchmark N=%zu\n", n);
    float* h = random_floats(n, -1.0f, 1.0f, rng);
    float *p = to_device(h, n), *m = to_device(h, n), *v = to_device(h, n), *g = to_device(h, n);
    cudaCheck(cudaMemset(v, 0, n * sizeof(float)));
    int s = 1;
    float us = benchmark_us(10, [&] { adamw_update(p, m, v, g, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, s++); });
    report_bandwidth("adamw (read p m v g, write p m v)", us, 7.0 * n * 4);
    free(h);
    cudaCheck(cudaFree(p)); cudaCheck(cudaFree(m)); cudaCheck(cudaFree(v)); cudaCheck(cudaFree(g));
}

int main(void) {
    setup_device("adamw");
    uint64_t rng = 1337;
    validate(1, 1e-3f, 0.0f, 1, &rng);
    validate(1000, 1e-3f, 0.1f, 3, &rng);
    validate(1 << 20, 3e-4f, 0.0f, 5, &rng);
    validate((1 << 20) + 7, 6e-4f, 0.1f, 20, &rng);
    benchmark(124475904, &rng);  // GPT-2 124M, padded vocabulary
    return finish("adamw");
}
