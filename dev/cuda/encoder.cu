/*
Encoder (token + position embeddings), forward and backward.

  forward:  out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
  backward: dwte[token,:] += dout of the token's positions, in position order;
            dwpe[t,:] += dout[b,t,:] for b in order
The backward kernels add in the CPU's order (positions bucketed by token on the host), so
both directions must match the CPU bit for bit (tolerance 0).

  make -C dev/cuda && ./build/cuda/encoder
*/
#include "cpu_reference.h"  // the CPU trainer's layer functions, named *_cpu
#include "common.h"

// ----------------------------------------------------------------------------

typedef struct {
    float *out, *wte, *wpe, *dout, *dwte, *dwpe;
    int *inp, *buckets;  // buckets: positions (BT) | tokens (BT) | starts (BT + 1)
    int num_buckets;
} EncoderBuffers;

// device buffers for a problem; `skewed` makes most positions share a few tokens, the
// slow case of the bucketed backward
static EncoderBuffers make_buffers(int B, int T, int C, int V, int maxT, uint64_t* rng, float** h_wte,
                                   float** h_wpe, float** h_dout, int** h_inp, int skewed) {
    size_t BT = (size_t)B * T;
    EncoderBuffers e;
    *h_wte = random_floats((size_t)V * C, -1.0f, 1.0f, rng);
    *h_wpe = random_floats((size_t)maxT * C, -1.0f, 1.0f, rng);
    *h_dout = random_floats(BT * C, -1.0f, 1.0f, rng);
    *h_inp = random_ints(BT, V, rng);
    if (skewed) {
        for (size_t i = 0; i < BT; i++) { (*h_inp)[i] = (*h_inp)[i] % 8; }
    }
    int* buckets = (int*)mallocCheck((3 * BT + 1) * sizeof(int));
    int* counts = (int*)callocCheck((size_t)V, sizeof(int));
    e.num_buckets = encoder_backward_buckets(*h_inp, (int)BT, V, buckets, buckets + BT, buckets + 2 * BT, counts);
    e.out = cuda_malloc(BT * C * sizeof(float), "out");
    e.wte = to_device(*h_wte, (size_t)V * C);
    e.wpe = to_device(*h_wpe, (size_t)maxT * C);
    e.dout = to_device(*h_dout, BT * C);
    e.dwte = to_device(*h_wte, (size_t)V * C);  // gradients start non-zero: the kernels add
    e.dwpe = to_device(*h_wpe, (size_t)maxT * C);
    e.inp = to_device_ints(*h_inp, BT);
    e.buckets = to_device_ints(buckets, 3 * BT + 1);
    free(buckets);
    free(counts);
    return e;
}

static void free_buffers(EncoderBuffers* e) {
    cudaCheck(cudaFree(e->out));
    cudaCheck(cudaFree(e->wte));
    cudaCheck(cudaFree(e->wpe));
    cudaCheck(cudaFree(e->dout));
    cudaCheck(cudaFree(e->dwte));
    cudaCheck(cudaFree(e->dwpe));
    cudaCheck(cudaFree(e->inp));
    cudaCheck(cudaFree(e->buckets));
}

static void validate(int B, int T, int C, int V, int skewed, uint64_t* rng) {
    int maxT = T + 3;
    size_t BT = (size_t)B * T;
    printf("B=%d T=%d C=%d V=%d%s\n", B, T, C, V, skewed ? " (8 distinct tokens)" : "");
    float *wte, *wpe, *dout;
    int* inp;
    EncoderBuffers e = make_buffers(B, T, C, V, maxT, rng, &wte, &wpe, &dout, &inp, skewed);
    float* out = (float*)mallocCheck(BT * C * sizeof(float));
    encoder_forward_cpu(out, inp, wte, wpe, B, T, C);
    encoder_forward(e.out, e.inp, e.wte, e.wpe, B, T, C);
    validate_result(e.out, out, BT * C, "encoder_forward", 0.0);
    encoder_backward_cpu(wte, wpe, dout, inp, B, T, C);  // wte/wpe double as the initial gradients
    encoder_backward(e.dwte, e.dwpe, e.dout, e.buckets, e.buckets + BT, e.buckets + 2 * BT, e.num_buckets, B,
                     T, C);
    validate_result(e.dwte, wte, (size_t)V * C, "encoder_backward dwte", 0.0);
    validate_result(e.dwpe, wpe, (size_t)maxT * C, "encoder_backward dwpe", 0.0);
    free(out);
    free(wte);
    free(wpe);
    free(dout);
    free(inp);
    free_buffers(&e);
}

static void benchmark(int B, int T, int C, int V, int skewed, uint64_t* rng) {
    if (!benchmarks_wanted()) { return; }
    size_t BT = (size_t)B * T;
    printf("benchmark B=%d T=%d C=%d V=%d%s\n", B, T, C, V, skewed ? " (8 distinct tokens)" : "");
    float *wte, *wpe, *dout;
    int* inp;
    EncoderBuffers e = make_buffers(B, T, C, V, T, rng, &wte, &wpe, &dout, &inp, skewed);
    float us = benchmark_us(20, [&] { encoder_forward(e.out, e.inp, e.wte, e.wpe, B, T, C); });
    // reads a wte row and a wpe row per position (wpe rows are shared, cached) and writes out
    report_bandwidth("encoder_forward", us, (2.0 * BT * C + (double)T * C) * 4);
    us = benchmark_us(20, [&] {
        encoder_backward(e.dwte, e.dwpe, e.dout, e.buckets, e.buckets + BT, e.buckets + 2 * BT, e.num_buckets,
                         B, T, C);
    });
    // dout read twice (wte, wpe), plus read-modify-write of the touched rows
    report_bandwidth("encoder_backward", us, (2.0 * BT * C + 2.0 * (e.num_buckets + T) * C) * 4);
    free(wte);
    free(wpe);
    free(dout);
    free(inp);
    free_buffers(&e);
}

int main(void) {
    setup_device("encoder");
    uint64_t rng = 1337;
    validate(1, 1, 1, 3, 0, &rng);
    validate(2, 8, 32, 50, 0, &rng);
    validate(3, 37, 100, 257, 1, &rng);
    validate(4, 256, 768, 50257, 0, &rng);
    benchmark(8, 1024, 768, 50257, 0, &rng);
    benchmark(8, 1024, 768, 50257, 1, &rng);
    return finish("encoder");
}
