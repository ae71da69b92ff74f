/*
Shared by the kernel files in dev/cuda (llm.c's dev/cuda convention): each file takes the
CPU reference of one kernel family (the CPU trainer's own functions through cpu_reference.h,
or a plain one of its own where the CPU trainer has none or a more exact one is wanted:
matmul.cu's sums in double), validates the trainer's kernels
(llmc/cuda_kernels.cuh, the very code train_gpt2.cu runs) against it on random data at
several sizes, then times them.

- validate_result: copies a device result back and compares it with the CPU reference,
  "relative to the tensor" like the tests (max |gpu - cpu| / max |cpu|); tolerance 0 means
  bitwise equal. Prints one line; returns 1 on failure (finish() exits 1 if any check failed).
- benchmark_us: mean time of a launch over `repeats` runs, timed with CUDA events, with the
  L2 cache flushed before each run (otherwise a kernel re-reading its own input from a
  50 MB L2 would look faster than it is).
- benchmarks_wanted: 0 with ZF_SKIP_BENCHMARKS=1 (each program's benchmark() returns at once).
- report_bandwidth: µs, GB/s and the fraction of the device's copy bandwidth, measured once
  per program with a device-to-device cudaMemcpy (or ZF_PEAK_GBS=<GB/s> from the environment).
Without a CUDA device every program prints "<name>: SKIPPED (...)" and exits 0.
*/
#ifndef DEV_CUDA_COMMON_H
#define DEV_CUDA_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../llmc/cuda_kernels.cuh"

static int g_checks = 0, g_failures = 0;

// exits 0 with a SKIPPED line if there is no device; else selects device 0 and prints it
static void setup_device(const char* prog) {
    char reason[256];
    if (!cuda_device_available(reason, sizeof(reason))) {
        printf("%s: SKIPPED (no CUDA device: %s)\n", prog, reason);
        exit(0);
    }
    cudaDeviceProp prop = cuda_init_device();
    printf("%s on %s (compute capability %d.%d, %d SMs)\n", prog, prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
}

// the last line, and the exit code
static int finish(const char* prog) {
    printf("%s: %d checks, %d failed\n", prog, g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}

// ----------------------------------------------------------------------------
// data

static float* random_floats(size_t n, float lo, float hi, uint64_t* rng) {
    float* x = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = lo + (hi - lo) * random_f32(rng); }
    return x;
}

static int* random_ints(size_t n, int below, uint64_t* rng) {
    int* x = (int*)mallocCheck(n * sizeof(int));
    for (size_t i = 0; i < n; i++) { x[i] = (int)(random_u32(rng) % (uint32_t)below); }
    return x;
}

static float* to_device(const float* host, size_t n) {
    float* d = cuda_malloc(n * sizeof(float), "test data");
    cudaCheck(cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static int* to_device_ints(const int* host, size_t n) {
    int* d = (int*)cuda_malloc(n * sizeof(int), "test data");
    cudaCheck(cudaMemcpy(d, host, n * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}

// ----------------------------------------------------------------------------
// validation

// err is worse than the worst so far: larger, or nan (a nan, once there, stays: nothing is
// larger than nan, and the first nan's place is kept)
static inline int worse(double err, double worst) { return !isnan(worst) && (isnan(err) || err > worst); }

static int validate_result(const float* device_result, const float* ref, size_t n, const char* name,
                           double tolerance) {
    float* got = (float*)mallocCheck(n * sizeof(float));
    cudaCheck(cudaMemcpy(got, device_result, n * sizeof(float), cudaMemcpyDeviceToHost));
    double max_err = 0.0, max_ref = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)ref[i]);
        if (worse(err, max_err)) {
            max_err = err;
            worst = i;
        }
        if (fabs((double)ref[i]) > max_ref) { max_ref = fabs((double)ref[i]); }
    }
    double rel = max_ref > 0.0 ? max_err / max_ref : max_err;
    int ok = tolerance == 0.0 ? memcmp(got, ref, n * sizeof(float)) == 0 : rel <= tolerance;
    printf("  %-34s %10zu values  max|err| %.2e  rel %.2e  (tol %s%.0e)  %s", name, n, max_err, rel,
           tolerance == 0.0 ? "bitwise, " : "", tolerance, ok ? "ok\n" : "FAIL");
    if (!ok) { printf(" (worst at %zu: gpu %.8g cpu %.8g)\n", worst, got[worst], ref[worst]); }
    free(got);
    g_checks++;
    g_failures += !ok;
    return !ok;
}

// ----------------------------------------------------------------------------
// timing

// 0 with ZF_SKIP_BENCHMARKS=1 in the environment: validation only (make test runs these
// programs on the CPU emulator, dev/cuda/emu, where timings mean nothing and take minutes)
static int benchmarks_wanted(void) {
    const char* env = getenv("ZF_SKIP_BENCHMARKS");
    return env == NULL || atoi(env) == 0;
}

// mean µs per call of launch() over `repeats` calls, L2 flushed before each
template <typename Launch>
static float benchmark_us(int repeats, Launch launch) {
    static void* flush_buffer = NULL;
    static size_t flush_bytes = 0;
    if (flush_buffer == NULL) {
        int l2 = 0;
        cudaCheck(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
        flush_bytes = 2 * (size_t)(l2 > 0 ? l2 : 64 << 20);
        cudaCheck(cudaMalloc(&flush_buffer, flush_bytes));
    }
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    launch();  // warm-up: first-call costs (module load, cuBLASLt heuristic) are not timed
    float total_ms = 0.0f;
    for (int i = 0; i < repeats; i++) {
        cudaCheck(cudaMemset(flush_buffer, i & 1, flush_bytes));
        cudaCheck(cudaEventRecord(start));
        launch();
        cudaCheck(cudaEventRecord(stop));
        cudaCheck(cudaEventSynchronize(stop));
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, start, stop));
        total_ms += ms;
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return total_ms * 1000.0f / repeats;
}

// the 100% of report_bandwidth: ZF_PEAK_GBS=<GB/s> from the environment, else this device's
// own device-to-device cudaMemcpy, measured once per program (bytes read + bytes written,
// counted as for the kernels), so that the fractions hold on any GPU and come from the run
// that measured the kernels (an H200 copies about 4.3 TB/s)
static double peak_gbs(void) {
    static double peak = 0.0;
    if (peak > 0.0) { return peak; }
    const char* env = getenv("ZF_PEAK_GBS");
    if (env != NULL && atof(env) > 0.0) {
        peak = atof(env);
        return peak;
    }
    const size_t bytes = (size_t)256 << 20;  // each way: far beyond any L2
    void *src = NULL, *dst = NULL;
    cudaCheck(cudaMalloc(&src, bytes));
    cudaCheck(cudaMalloc(&dst, bytes));
    cudaCheck(cudaMemset(src, 0, bytes));
    float us = benchmark_us(20, [&] { cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
    cudaCheck(cudaFree(src));
    cudaCheck(cudaFree(dst));
    peak = 2.0 * (double)bytes / (us * 1e-6) / 1e9;
    printf("  (100%% below = this device's cudaMemcpy device to device, %.0f MiB: %.0f GB/s read + write)\n",
           bytes / 1048576.0, peak);
    return peak;
}

// bytes: what the kernel must move at least (each input read once, each output written once)
static void report_bandwidth(const char* name, float us, double bytes) {
    double gbs = bytes / (us * 1e-6) / 1e9;
    printf("  %-34s %9.1f us  %8.1f GB/s  %5.1f%% of %.0f GB/s\n", name, us, gbs, 100.0 * gbs / peak_gbs(),
           peak_gbs());
}

static void report_flops(const char* name, float us, double flops) {
    printf("  %-34s %9.1f us  %8.1f TFLOP/s\n", name, us, flops / (us * 1e-6) / 1e12);
}

#endif  // DEV_CUDA_COMMON_H
