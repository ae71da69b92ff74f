/*
The weight matmuls through cuBLASLt, forward (with the bias epilogue) and backward (dinp,
dweight accumulated with beta = 1, dbias as a deterministic column sum), against the CPU
reference and against a naive kernel (one thread per output) that shows what cuBLASLt buys.

  forward:  out (BT, OC) = inp (BT, C) @ weight^T (OC, C) + bias (OC)
  backward: dinp = dout @ weight;  dweight += dout^T @ inp;  dbias += column sums of dout
Row-major matrices are column-major transposes; llmc/cuda_kernels.cuh says how each product
maps onto cuBLAS's (m, n, k, transa, transb).

The CPU reference accumulates in double, so it is near exact and the tolerance measures the
GPU's own rounding. TF32 off (plain fp32): a sum of K products carries ~sqrt(K) roundings,
so 1e-5 relative to the tensor for K <= 1024, growing as sqrt(K / 1024) beyond (7e-5 for
the classifier's K = 50304). TF32 on: 5e-3 (TF32 rounds both inputs of each product to 10
mantissa bits, ~1e-3 relative per product, averaging out over the sum). Buffers at odd
offsets check that the alignments we tell cuBLASLt, and the bias fallback for pointers that
the epilogue cannot take, work.

  make -C dev/cuda && ./build/cuda/matmul
*/
#include <algorithm>
#include <vector>

#include "common.h"

// ----------------------------------------------------------------------------
// CPU reference (the math of train_gpt2.cpp, written plainly, accumulated in double)

static void matmul_forward_cpu(float* out, const float* inp, const float* weight, const float* bias, int BT, int C,
                               int OC) {
    for (int r = 0; r < BT; r++) {
        for (int o = 0; o < OC; o++) {
            double s = 0.0;
            for (int i = 0; i < C; i++) { s += (double)inp[(size_t)r * C + i] * weight[(size_t)o * C + i]; }
            out[(size_t)r * OC + o] = (float)(s + (bias != NULL ? bias[o] : 0.0f));
        }
    }
}

// (each sum runs over a row of C doubles, so that the inner loops read memory in order; in
// column order the classifier's case was most of the program's time)
static void matmul_backward_cpu(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                const float* weight, int BT, int C, int OC) {
    std::vector<double> s(C);
    for (int r = 0; r < BT; r++) {  // dinp[r, :] = sum over o of dout[r, o] * weight[o, :]
        std::fill(s.begin(), s.end(), 0.0);
        for (int o = 0; o < OC; o++) {
            const double d = dout[(size_t)r * OC + o];
            for (int i = 0; i < C; i++) { s[i] += d * weight[(size_t)o * C + i]; }
        }
        for (int i = 0; i < C; i++) { dinp[(size_t)r * C + i] = (float)s[i]; }  // the GPU overwrites dinp
    }
    for (int o = 0; o < OC; o++) {  // dweight[o, :] += sum over r of dout[r, o] * inp[r, :]
        std::fill(s.begin(), s.end(), 0.0);
        double sb = 0.0;
        for (int r = 0; r < BT; r++) {
            const double d = dout[(size_t)r * OC + o];
            for (int i = 0; i < C; i++) { s[i] += d * inp[(size_t)r * C + i]; }
            sb += d;
        }
        for (int i = 0; i < C; i++) { dweight[(size_t)o * C + i] = (float)(dweight[(size_t)o * C + i] + s[i]); }
        if (dbias != NULL) { dbias[o] = (float)(dbias[o] + sb); }
    }
}

// ----------------------------------------------------------------------------
// the naive GPU version: one thread per output element, a serial dot product

__global__ void matmul_forward_naive_kernel(float* out, const float* inp, const float* weight, const float* bias,
                                            int BT, int C, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) { return; }
    const float* w = weight + (size_t)o * C;
    for (int r = blockIdx.y; r < BT; r += gridDim.y) {  // grid.y is at most 65535, BT may be more
        const float* x = inp + (size_t)r * C;
        float s = 0.0f;
        for (int i = 0; i < C; i++) { s += x[i] * w[i]; }
        out[(size_t)r * OC + o] = s + (bias != NULL ? bias[o] : 0.0f);
    }
}

static void matmul_forward_naive(float* out, const float* inp, const float* weight, const float* bias, int BT,
                                 int C, int OC) {
    matmul_forward_naive_kernel<<<dim3(ceil_div(OC, 256), std::min(BT, 65535)), 256>>>(out, inp, weight, bias, BT, C,
                                                                                          OC);
    cudaCheck(cudaGetLastError());
}

// ----------------------------------------------------------------------------

// fp32 tolerance for sums of K products (see the top)
static double fp32_tolerance(int K) { return 1e-5 * (K > 1024 ? sqrt(K / 1024.0) : 1.0); }

// a device copy at `offset` floats past a fresh (256-byte aligned) allocation
static float* to_device_at(const float* host, size_t n, int offset, float** base) {
    *base = cuda_malloc((n + offset) * sizeof(float), "test data");
    cudaCheck(cudaMemcpy(*base + offset, host, n * sizeof(float), cudaMemcpyHostToDevice));
    return *base + offset;
}

// with_bias 0: no bias and no dbias, as the trainer calls the classifier (no epilogue)
static void validate(int BT, int C, int OC, int offset, int with_bias, uint64_t* rng) {
    printf("BT=%d C=%d OC=%d%s%s\n", BT, C, OC, offset ? " (buffers offset by 1 float)" : "",
           with_bias ? "" : " (no bias)");
    size_t n_inp = (size_t)BT * C, n_w = (size_t)OC * C, n_out = (size_t)BT * OC;
    float* inp = random_floats(n_inp, -1.0f, 1.0f, rng);
    float* weight = random_floats(n_w, -1.0f, 1.0f, rng);
    float* bias = random_floats(OC, -1.0f, 1.0f, rng);
    float* dout = random_floats(n_out, -1.0f, 1.0f, rng);
    float* dweight = random_floats(n_w, -1.0f, 1.0f, rng);  // gradients start non-zero: they are added to
    float* dbias = random_floats(OC, -1.0f, 1.0f, rng);
    float* out = (float*)mallocCheck(n_out * sizeof(float));
    float* dinp = (float*)mallocCheck(n_inp * sizeof(float));
    float *b_inp, *b_w, *b_bias, *b_dout, *b_dw, *b_db, *b_out, *b_dinp;  // the allocations
    float* d_inp = to_device_at(inp, n_inp, offset, &b_inp);
    float* d_w = to_device_at(weight, n_w, offset, &b_w);
    float* d_bias = to_device_at(bias, OC, offset, &b_bias);
    float* d_dout = to_device_at(dout, n_out, offset, &b_dout);
    float* d_dw = to_device_at(dweight, n_w, offset, &b_dw);
    float* d_db = to_device_at(dbias, OC, offset, &b_db);
    float* d_out = to_device_at(out, n_out, offset, &b_out);
    float* d_dinp = to_device_at(dinp, n_inp, offset, &b_dinp);
    float* ref_bias = with_bias ? bias : NULL;
    float* ref_dbias = with_bias ? dbias : NULL;
    if (!with_bias) { d_bias = d_db = NULL; }  // (their allocations are freed below)

    // each forward writes over NaN, so a launch that leaves an element out fails its check
    // (the one before it would have left the right value there)
    matmul_forward_cpu(out, inp, weight, ref_bias, BT, C, OC);
    cublas_set_tf32(0);
    cudaCheck(cudaMemset(d_out, 0xFF, n_out * sizeof(float)));
    matmul_forward(d_out, d_inp, d_w, d_bias, BT, C, OC);
    validate_result(d_out, out, n_out, "matmul_forward (fp32)", fp32_tolerance(C));
    cudaCheck(cudaMemset(d_out, 0xFF, n_out * sizeof(float)));
    matmul_forward_naive(d_out, d_inp, d_w, d_bias, BT, C, OC);
    validate_result(d_out, out, n_out, "matmul_forward_naive", fp32_tolerance(C));
    if (C >= 16) {  // TF32's 5e-3 rests on a sum to average over (and a result not much smaller than its terms)
        cublas_set_tf32(1);
        cudaCheck(cudaMemset(d_out, 0xFF, n_out * sizeof(float)));
        matmul_forward(d_out, d_inp, d_w, d_bias, BT, C, OC);
        validate_result(d_out, out, n_out, "matmul_forward (TF32)", 5e-3);
        cublas_set_tf32(0);
    }

    matmul_backward_cpu(dinp, dweight, ref_dbias, dout, inp, weight, BT, C, OC);
    matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, BT, C, OC);
    validate_result(d_dinp, dinp, n_inp, "matmul_backward dinp (fp32)", fp32_tolerance(OC));
    validate_result(d_dw, dweight, n_w, "matmul_backward dweight (fp32)", fp32_tolerance(BT));
    if (with_bias) { validate_result(d_db, dbias, OC, "matmul_backward dbias", fp32_tolerance(BT)); }

    free(inp); free(weight); free(bias); free(dout); free(dweight); free(dbias); free(out); free(dinp);
    float* bases[] = {b_inp, b_w, b_bias, b_dout, b_dw, b_db, b_out, b_dinp};
    for (float* p : bases) { cudaCheck(cudaFree(p)); }
}

static void benchmark(const char* name, int BT, int C, int OC, int naive, uint64_t* rng) {
    if (!benchmarks_wanted()) { return; }
    printf("benchmark %s: BT=%d C=%d OC=%d\n", name, BT, C, OC);
    size_t n_inp = (size_t)BT * C, n_w = (size_t)OC * C, n_out = (size_t)BT * OC;
    float* h = random_floats(n_out > n_w ? (n_out > n_inp ? n_out : n_inp) : (n_w > n_inp ? n_w : n_inp), -1.0f,
                             1.0f, rng);
    float *inp = to_device(h, n_inp), *w = to_device(h, n_w), *bias = to_device(h, OC);
    float *dout = to_device(h, n_out), *dw = to_device(h, n_w), *db = to_device(h, OC);
    float* out = cuda_malloc(n_out * sizeof(float), "out");
    float* dinp = cuda_malloc(n_inp * sizeof(float), "dinp");
    float* scratch = cuda_malloc((size_t)COLSUM_MAX_CHUNKS * OC * sizeof(float), "scratch");
    double flops = 2.0 * BT * C * OC;
    char label[96];
    for (int tf32 = 1; tf32 >= 0; tf32--) {
        cublas_set_tf32(tf32);
        float us = benchmark_us(10, [&] { matmul_forward(out, inp, w, bias, BT, C, OC); });
        snprintf(label, sizeof(label), "forward + bias (%s)", tf32 ? "TF32" : "fp32");
        report_flops(label, us, flops);
        us = benchmark_us(10, [&] { matmul_backward(dinp, dw, db, dout, inp, w, BT, C, OC); });
        snprintf(label, sizeof(label), "backward (%s)", tf32 ? "TF32" : "fp32");
        report_flops(label, us, 2.0 * flops);
    }
    float us = benchmark_us(10, [&] { bias_backward(db, dout, BT, OC); });
    report_bandwidth("  of which dbias (one launch)", us, (double)n_out * 4);
    // the same sums in the two passes the column scores take (pass 1 over up to 128 chunks
    // of rows, then one warp per column): which is faster on this GPU for this shape
    us = benchmark_us(10, [&] { column_sums(db, scratch, dout, BT, OC, 0); });
    report_bandwidth("  dbias as two-pass column_sums", us, (double)n_out * 4);
    if (naive) {
        us = benchmark_us(3, [&] { matmul_forward_naive(out, inp, w, bias, BT, C, OC); });
        report_flops("forward, naive kernel", us, flops);
    }
    // determinism: the same product twice gives the same bits
    cublas_set_tf32(1);
    matmul_forward(out, inp, w, bias, BT, C, OC);
    float* first = (float*)mallocCheck(n_out * sizeof(float));
    cudaCheck(cudaMemcpy(first, out, n_out * sizeof(float), cudaMemcpyDeviceToHost));
    matmul_forward(out, inp, w, bias, BT, C, OC);
    validate_result(out, first, n_out, "forward repeatable (TF32)", 0.0);
    cublas_set_tf32(0);
    free(first);
    free(h);
    float* all[] = {inp, w, bias, dout, dw, db, out, dinp, scratch};
    for (float* p : all) { cudaCheck(cudaFree(p)); }
}

int main(void) {
    setup_device("matmul");
    cublas_init(0);
    uint64_t rng = 1337;
    validate(1, 1, 1, 0, 1, &rng);
    validate(8, 16, 24, 0, 1, &rng);
    validate(37, 50, 70, 0, 1, &rng);    // odd sizes
    validate(37, 50, 70, 1, 1, &rng);    // odd sizes at 4-byte aligned addresses (bias: the fallback)
    validate(64, 768, 2304, 0, 1, &rng); // qkv of GPT-2 124M
    validate(64, 768, 2304, 1, 1, &rng);
    validate(256, 3072, 768, 0, 1, &rng);  // fcproj
    validate(16, 768, 50304, 0, 0, &rng);  // the classifier (tied wte, no bias in the trainer)
    validate(1000, 16, 13, 0, 1, &rng);    // many rows per lane of the bias's column sums, 13 columns
    const int BT = 8 * 1024, C = 768;
    benchmark("qkv", BT, C, 3 * C, 0, &rng);
    benchmark("attproj", BT, C, C, 0, &rng);
    benchmark("fc", BT, C, 4 * C, 1, &rng);
    benchmark("fcproj", BT, 4 * C, C, 0, &rng);
    benchmark("classifier", BT, C, 50304, 0, &rng);
    cublas_free();
    return finish("matmul");
}
