/*
Causal multi-head self-attention, forward and backward: the permutes to head layout, the
two batched cuBLASLt matmuls per direction, and the causal softmax kernels (one warp per
row; the scale 1/sqrt(hs) is applied inside them; the forward finds a row's max and sum of
exponentials in one online pass, then writes the row).

  forward:  qkv (B,T,3C) -> q,k,v (B,NH,T,hs) -> preatt = q k^T -> att = softmax(scale *
            preatt, causal) -> att v -> atty (B,T,C)
  backward: datty -> datt = datty_h v^T, dv = att^T datty_h -> dpreatt = scale * att *
            (datt - sum(att * datt)) -> dq = dpreatt k, dk = dpreatt^T q -> dqkv (B,T,3C)
Validated with TF32 off (plain fp32) against the CPU trainer's attention_forward/backward:
the matmuls sum over hs or T in another order, so 1e-5 (forward) and 1e-4 (backward,
relative to the tensor). Timed with TF32 on and off.

  make -C dev/cuda && ./build/cuda/attention
*/
#include "cpu_reference.h"  // the CPU trainer's layer functions, named *_cpu
#include "common.h"

// ----------------------------------------------------------------------------

typedef struct {
    float *qkv, *atty, *qkvr, *att, *preatt, *vaccum, *datty, *dqkv, *dqkvr;
} AttentionBuffers;

static AttentionBuffers make_buffers(int B, int T, int C, int NH, const float* qkv, const float* datty) {
    size_t BTC = (size_t)B * T * C, att = (size_t)B * NH * T * T;
    AttentionBuffers a;
    a.qkv = to_device(qkv, 3 * BTC);
    a.datty = to_device(datty, BTC);
    a.atty = cuda_malloc(BTC * sizeof(float), "atty");
    a.qkvr = cuda_malloc(3 * BTC * sizeof(float), "qkvr");
    a.att = cuda_malloc(att * sizeof(float), "att");
    a.preatt = cuda_malloc(att * sizeof(float), "preatt");
    a.vaccum = cuda_malloc(BTC * sizeof(float), "vaccum");
    a.dqkv = cuda_malloc(3 * BTC * sizeof(float), "dqkv");
    a.dqkvr = cuda_malloc(4 * BTC * sizeof(float), "dqkvr");
    // NaN where nothing was written yet, as on the emulator: a GPU's fresh memory is often 0,
    // which would pass for the zeros the softmax must write above the diagonal
    cudaCheck(cudaMemset(a.att, 0xFF, att * sizeof(float)));
    cudaCheck(cudaMemset(a.preatt, 0xFF, att * sizeof(float)));
    return a;
}

static void free_buffers(AttentionBuffers* a) {
    float* all[] = {a->qkv, a->atty, a->qkvr, a->att, a->preatt, a->vaccum, a->datty, a->dqkv, a->dqkvr};
    for (float* p : all) { cudaCheck(cudaFree(p)); }
}

static void validate(int B, int T, int C, int NH, uint64_t* rng) {
    printf("B=%d T=%d C=%d NH=%d\n", B, T, C, NH);
    size_t BTC = (size_t)B * T * C, att = (size_t)B * NH * T * T;
    float* qkv = random_floats(3 * BTC, -1.0f, 1.0f, rng);
    float* datty = random_floats(BTC, -1.0f, 1.0f, rng);
    float* out = (float*)mallocCheck(BTC * sizeof(float));
    float* preatt = (float*)mallocCheck(att * sizeof(float));
    float* h_att = (float*)mallocCheck(att * sizeof(float));
    float* dqkv = (float*)callocCheck(3 * BTC, sizeof(float));
    float* dpreatt = (float*)callocCheck(att, sizeof(float));
    float* datt = (float*)callocCheck(att, sizeof(float));
    attention_forward_cpu(out, preatt, h_att, qkv, B, T, C, NH);
    attention_backward_cpu(dqkv, dpreatt, datt, datty, qkv, h_att, B, T, C, NH);

    AttentionBuffers a = make_buffers(B, T, C, NH, qkv, datty);
    attention_forward(a.atty, a.qkvr, a.att, a.preatt, a.vaccum, a.qkv, B, T, C, NH);
    validate_result(a.att, h_att, att, "softmax_forward att", 1e-5);
    validate_result(a.atty, out, BTC, "attention_forward atty", 1e-5);
    attention_backward(a.dqkv, a.preatt, a.dqkvr, a.datty, a.qkvr, a.att, B, T, C, NH);
    validate_result(a.dqkv, dqkv, 3 * BTC, "attention_backward dqkv", 1e-4);
    // the softmax backward kernel alone, on the CPU's att and datt: dpreatt * scale
    float scale = 1.0f / sqrtf((float)(C / NH));
    for (size_t i = 0; i < att; i++) { dpreatt[i] = dpreatt[i] * scale; }
    cudaCheck(cudaMemcpy(a.preatt, datt, att * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(a.att, h_att, att * sizeof(float), cudaMemcpyHostToDevice));
    int rows = B * NH * T;
    softmax_backward_kernel<<<ceil_div(rows, 8), 256>>>(a.preatt, a.att, scale, rows, T);
    cudaCheck(cudaGetLastError());
    validate_result(a.preatt, dpreatt, att, "softmax_backward dpreatt", 1e-5);
    free(qkv); free(datty); free(out); free(preatt); free(h_att); free(dqkv); free(dpreatt); free(datt);
    free_buffers(&a);
}

static void benchmark(int B, int T, int C, int NH, uint64_t* rng) {
    if (!benchmarks_wanted()) { return; }
    printf("benchmark B=%d T=%d C=%d NH=%d\n", B, T, C, NH);
    size_t BTC = (size_t)B * T * C, att = (size_t)B * NH * T * T;
    float* qkv = random_floats(3 * BTC, -1.0f, 1.0f, rng);
    AttentionBuffers a = make_buffers(B, T, C, NH, qkv, qkv);
    int rows = B * NH * T;
    float scale = 1.0f / sqrtf((float)(C / NH));
    attention_forward(a.atty, a.qkvr, a.att, a.preatt, a.vaccum, a.qkv, B, T, C, NH);
    float us = benchmark_us(10, [&] {
        softmax_forward_kernel<<<ceil_div(rows, 8), 256>>>(a.att, a.preatt, scale, rows, T);
        cudaCheck(cudaGetLastError());
    });
    // at least: the causal half of preatt read (the kernel reads it twice: stats, then output), all of att written
    report_bandwidth("softmax_forward", us, (0.5 + 1.0) * att * 4);
    us = benchmark_us(10, [&] {
        softmax_backward_kernel<<<ceil_div(rows, 8), 256>>>(a.preatt, a.att, scale, rows, T);
        cudaCheck(cudaGetLastError());
    });
    // reads the causal half of att and datt, writes all of dpreatt
    report_bandwidth("softmax_backward", us, (0.5 + 0.5 + 1.0) * att * 4);
    us = benchmark_us(10, [&] { rows_to_heads(a.qkvr, a.qkv, 3 * C, B, T, NH, C / NH); });
    report_bandwidth("rows_to_heads (q)", us, 2.0 * BTC * 4);
    // the whole forward and backward; flops of the four (batched) matmuls, full T x T
    double flops = 2.0 * 2.0 * B * NH * (double)T * T * (C / NH);
    for (int tf32 = 1; tf32 >= 0; tf32--) {
        cublas_set_tf32(tf32);
        us = benchmark_us(10, [&] { attention_forward(a.atty, a.qkvr, a.att, a.preatt, a.vaccum, a.qkv, B, T, C, NH); });
        report_flops(tf32 ? "attention_forward (TF32)" : "attention_forward (fp32)", us, flops);
        us = benchmark_us(10, [&] {
            attention_backward(a.dqkv, a.preatt, a.dqkvr, a.datty, a.qkvr, a.att, B, T, C, NH);
        });
        report_flops(tf32 ? "attention_backward (TF32)" : "attention_backward (fp32)", us, 2.0 * flops);
    }
    cublas_set_tf32(0);
    free(qkv);
    free_buffers(&a);
}

int main(void) {
    setup_device("attention");
    cublas_init(0);  // validation in plain fp32
    uint64_t rng = 1337;
    validate(1, 1, 4, 1, &rng);
    validate(1, 8, 16, 2, &rng);
    validate(2, 37, 48, 3, &rng);    // T not a multiple of anything
    validate(2, 64, 64, 4, &rng);
    validate(2, 256, 768, 12, &rng); // GPT-2 124M's heads (hs = 64)
    benchmark(4, 1024, 768, 12, &rng);
    benchmark(16, 1024, 768, 12, &rng);
    cublas_free();
    return finish("attention");
}
