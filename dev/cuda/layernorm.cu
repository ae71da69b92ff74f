/*
LayerNorm, forward and backward.

  forward:  one warp per row: mean, variance (two passes, as the CPU), out = norm * w + b
  backward: two launches: one warp per row for dinp; dweight and dbias as deterministic
            column sums in one kernel (a block per 8 columns reads every row)
Tolerances: the warp sums add in another order than the CPU's serial loops, so results
agree to a few ulps times the length of the sums: 1e-5 for the forward, 1e-5 for dinp,
1e-4 for dweight/dbias (sums over all N rows).

  make -C dev/cuda && ./build/cuda/layernorm
*/
#include "cpu_reference.h"  // the CPU trainer's layer functions, named *_cpu
#include "common.h"

// ----------------------------------------------------------------------------

static void validate(int N, int C, uint64_t* rng) {
    printf("N=%d C=%d\n", N, C);
    size_t NC = (size_t)N * C;
    float* inp = random_floats(NC, -2.0f, 3.0f, rng);  // mean != 0 on purpose
    float* weight = random_floats(C, 0.5f, 1.5f, rng);
    float* bias = random_floats(C, -0.5f, 0.5f, rng);
    float* dout = random_floats(NC, -1.0f, 1.0f, rng);
    float* dinp = random_floats(NC, -1.0f, 1.0f, rng);  // gradients start non-zero: the kernels add
    float* dweight = random_floats(C, -1.0f, 1.0f, rng);
    float* dbias = random_floats(C, -1.0f, 1.0f, rng);
    float* out = (float*)mallocCheck(NC * sizeof(float));
    float* mean = (float*)mallocCheck(N * sizeof(float));
    float* rstd = (float*)mallocCheck(N * sizeof(float));

    float *d_inp = to_device(inp, NC), *d_weight = to_device(weight, C), *d_bias = to_device(bias, C);
    float *d_dout = to_device(dout, NC), *d_dinp = to_device(dinp, NC);
    float *d_dweight = to_device(dweight, C), *d_dbias = to_device(dbias, C);
    float* d_out = cuda_malloc(NC * sizeof(float), "out");
    float* d_mean = cuda_malloc(N * sizeof(float), "mean");
    float* d_rstd = cuda_malloc(N * sizeof(float), "rstd");

    layernorm_forward_cpu(out, mean, rstd, inp, weight, bias, N, 1, C);  // N rows: B = N, T = 1
    layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_weight, d_bias, N, C);
    validate_result(d_out, out, NC, "layernorm_forward out", 1e-5);
    validate_result(d_mean, mean, N, "layernorm_forward mean", 1e-5);
    validate_result(d_rstd, rstd, N, "layernorm_forward rstd", 1e-5);

    // the backward pass uses the CPU's mean/rstd on both sides, so it is tested on its own
    cudaCheck(cudaMemcpy(d_mean, mean, N * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_rstd, rstd, N * sizeof(float), cudaMemcpyHostToDevice));
    layernorm_backward_cpu(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, 1, C);
    layernorm_backward(d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, d_mean, d_rstd, N, C);
    validate_result(d_dinp, dinp, NC, "layernorm_backward dinp", 1e-5);
    validate_result(d_dweight, dweight, C, "layernorm_backward dweight", 1e-4);
    validate_result(d_dbias, dbias, C, "layernorm_backward dbias", 1e-4);

    // determinism: the same call twice gives the same bits
    float* first = (float*)mallocCheck(C * sizeof(float));
    cudaCheck(cudaMemset(d_dweight, 0, C * sizeof(float)));
    cudaCheck(cudaMemset(d_dbias, 0, C * sizeof(float)));
    layernorm_backward(d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, d_mean, d_rstd, N, C);
    cudaCheck(cudaMemcpy(first, d_dweight, C * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemset(d_dweight, 0, C * sizeof(float)));
    layernorm_backward(d_dinp, d_dweight, d_dbias, d_dout, d_inp, d_weight, d_mean, d_rstd, N, C);
    validate_result(d_dweight, first, C, "layernorm_backward repeatable", 0.0);

    free(first);
    free(inp); free(weight); free(bias); free(dout); free(dinp); free(dweight); free(dbias);
    free(out); free(mean); free(rstd);
    float* dev[] = {d_inp, d_weight, d_bias, d_dout, d_dinp, d_dweight, d_dbias, d_out, d_mean, d_rstd};
    for (float* p : dev) { cudaCheck(cudaFree(p)); }
}

static void benchmark(int N, int C, uint64_t* rng) {
    if (!benchmarks_wanted()) { return; }
    printf("benchmark N=%d C=%d\n", N, C);
    size_t NC = (size_t)N * C;
    float* h = random_floats(NC, -1.0f, 1.0f, rng);
    float *inp = to_device(h, NC), *dout = to_device(h, NC), *dinp = to_device(h, NC);
    float *weight = to_device(h, C), *bias = to_device(h + C, C), *dweight = to_device(h, C), *dbias = to_device(h, C);
    float* out = cuda_malloc(NC * sizeof(float), "out");
    float* mean = cuda_malloc(N * sizeof(float), "mean");
    float* rstd = cuda_malloc(N * sizeof(float), "rstd");
    float us = benchmark_us(20, [&] { layernorm_forward(out, mean, rstd, inp, weight, bias, N, C); });
    report_bandwidth("layernorm_forward", us, 2.0 * NC * 4);  // read inp, write out
    us = benchmark_us(20, [&] {
        layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    });
    // dout and inp read, dinp read and written (the column sums read dout and inp again)
    report_bandwidth("layernorm_backward", us, 4.0 * NC * 4);
    us = benchmark_us(20, [&] {
        layernorm_backward_input_kernel<<<ceil_div(N, 8), 256>>>(dinp, dout, inp, weight, mean, rstd, N, C);
        cudaCheck(cudaGetLastError());
    });
    report_bandwidth("  of which dinp (warp per row)", us, 4.0 * NC * 4);
    us = benchmark_us(20, [&] {
        layernorm_param_grad_kernel<<<column_block_grid(C), column_block_shape()>>>(dweight, dbias, dout, inp, mean,
                                                                                    rstd, N, C);
        cudaCheck(cudaGetLastError());
    });
    report_bandwidth("  of which dweight, dbias (one launch)", us, 2.0 * NC * 4);  // dout and inp read
    free(h);
    float* dev[] = {inp, dout, dinp, weight, bias, dweight, dbias, out, mean, rstd};
    for (float* p : dev) { cudaCheck(cudaFree(p)); }
}

int main(void) {
    setup_device("layernorm");
    uint64_t rng = 1337;
    validate(1, 1, &rng);
    validate(3, 7, &rng);
    validate(64, 768, &rng);
    validate(1000, 100, &rng);   // a partial last block of 8 columns; rows unequal over the 128 lanes
    validate(8192, 768, &rng);   // GPT-2 124M's C, B*T = 8 x 1024
    validate(97, 1600, &rng);    // GPT-2 1.5B's C
    benchmark(8 * 1024, 768, &rng);
    benchmark(16 * 1024, 768, &rng);
    return finish("layernorm");
}
