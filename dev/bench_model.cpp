/*
bench_model <spec> <path>: writes a randomly initialized GPT-2 model file (llm.c v3, fp32) for
the benchmarks (scripts/bench_zenflow.sh, scripts/bench_llmc.sh), e.g. `bench_model d48 d48.bin`.

GPT-2's init recipe, except that each weight is uniform with the recipe's standard deviation
(std * sqrt(3) each side) and drawn in parallel from a counter-based generator: seconds
instead of the trainers' minute for d48, and the same file for any thread count. The speed of
a step does not depend on the weights' distribution. Build:
    g++ -O2 -std=c++17 -fopenmp -I. dev/bench_model.cpp -o bench_model
*/
#include <math.h>
#include "llmc/gpt2_file.h"
static inline uint64_t mix(uint64_t z) {  // splitmix64's finalizer
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
int main(int argc, char** argv) {
    GPT2Config c;
    if (argc != 3 || !gpt2_parse_model_spec(argv[1], &c)) { fprintf(stderr, "usage: bench_model d12 out.bin\n"); return 2; }
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_param_sizes(&c, sizes);
    float* params = (float*)callocCheck(gpt2_num_params(&c), sizeof(float));
    float residual_std = 0.02f / sqrtf(2.0f * c.num_layers);
    float* p = params;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (i == 2 || i == 8 || i == 14) {  // LayerNorm gains
            for (size_t j = 0; j < sizes[i]; j++) { p[j] = 1.0f; }
        } else if (gpt2_tensor_shape(&c, i).is_matrix) {
            float a = ((i == 6 || i == 12) ? residual_std : 0.02f) * sqrtf(3.0f);
            long long n = (i == 0) ? (long long)c.vocab_size * c.channels : (long long)sizes[i];
#pragma omp parallel for schedule(static)
            for (long long j = 0; j < n; j++) {
                uint64_t r = mix(((uint64_t)i << 40) + (uint64_t)j + 0x9E3779B97F4A7C15ull);
                p[j] = a * (2.0f * ((r >> 40) / 16777216.0f) - 1.0f);
            }
        }
        p += sizes[i];
    }
    gpt2_write_model(argv[2], &c, params);
    free(params);
    return 0;
}
