/*
The fused classifier: softmax over the first V of Vp logits, the loss -log p[target] of
each row, and dlogits = (p - onehot(target)) / N written in place of the logits (padded
columns 0). One block of 1024 threads per row; max and sum in one online pass (each thread
a running max and sum, rescaled when its max grows), then one block reduction of the pairs.

CPU reference: softmax_crossentropy_forward + softmax_crossentropy_backward of
train_gpt2.cpp. The CPU sums the V exponentials serially, the GPU per thread (with the
rescalings) and then in a tree, which differ by ~sqrt(V) ulps (~1e-5 relative for
V = 50257), hence tolerances of 1e-5. V = 3 leaves most threads without an element.

  make -C dev/cuda && ./build/cuda/classifier
*/
#include "cpu_reference.h"  // the CPU trainer's layer functions, named *_cpu
#include "common.h"

// ----------------------------------------------------------------------------

static void validate(int N, int V, uint64_t* rng) {
    int Vp = (V + 127) / 128 * 128;
    size_t n = (size_t)N * Vp;
    printf("N=%d V=%d Vp=%d\n", N, V, Vp);
    float* logits = random_floats(n, -3.0f, 3.0f, rng);
    for (int r = 0; r < N; r++) {  // padded logits are 0 in the trainer; make them big here:
        for (int i = V; i < Vp; i++) { logits[(size_t)r * Vp + i] = 100.0f; }  // they must not count
    }
    int* targets = random_ints(N, V, rng);
    float* probs = (float*)mallocCheck(n * sizeof(float));
    float* losses = (float*)mallocCheck(N * sizeof(float));
    float* dlogits = (float*)mallocCheck(n * sizeof(float));
    softmax_crossentropy_forward_cpu(probs, losses, logits, targets, N, 1, V, Vp);  // N rows: B = N, T = 1
    softmax_crossentropy_backward_cpu(dlogits, probs, targets, N, 1, V, Vp);
    float* d_logits = to_device(logits, n);
    int* d_targets = to_device_ints(targets, N);
    float* d_losses = cuda_malloc(N * sizeof(float), "losses");
    fused_classifier(d_logits, d_losses, d_targets, 1.0f / N, N, V, Vp);
    validate_result(d_losses, losses, N, "fused_classifier losses", 1e-5);
    validate_result(d_logits, dlogits, n, "fused_classifier dlogits", 1e-5);
    free(logits); free(targets); free(probs); free(losses); free(dlogits);
    cudaCheck(cudaFree(d_logits)); cudaCheck(cudaFree(d_targets)); cudaCheck(cudaFree(d_losses));
}

static void benchmark(int N, int V, uint64_t* rng) {
    if (!benchmarks_wanted()) { return; }
    int Vp = (V + 127) / 128 * 128;
    size_t n = (size_t)N * Vp;
    printf("benchmark N=%d V=%d\n", N, V);
    float* h = random_floats(n, -3.0f, 3.0f, rng);
    int* targets = random_ints(N, V, rng);
    float* logits = to_device(h, n);
    int* d_targets = to_device_ints(targets, N);
    float* losses = cuda_malloc(N * sizeof(float), "losses");
    // the kernel overwrites its input, so later runs see dlogits: same memory traffic
    float us = benchmark_us(10, [&] { fused_classifier(logits, losses, d_targets, 1.0f / N, N, V, Vp); });
    report_bandwidth("fused_classifier (1 read, 1 write)", us, 2.0 * n * 4);
    free(h); free(targets);
    cudaCheck(cudaFree(logits)); cudaCheck(cudaFree(d_targets)); cudaCheck(cudaFree(losses));
}

int main(void) {
    setup_device("classifier");
    uint64_t rng = 1337;
    validate(1, 3, &rng);
    validate(8, 100, &rng);
    validate(5, 1000, &rng);
    validate(64, 50257, &rng);
    validate(256, 50257, &rng);
    benchmark(8 * 1024, 50257, &rng);
    return finish("classifier");
}
