/*
The CUDA trainer's GPU memory, part by part: counted where it is allocated, and computed.

Counted: every device allocation of the CUDA trainer goes through cuda_malloc(bytes, what)
(llmc/cuda_kernels.cuh), which adds its bytes to the part that its label `what` names
(gpu_memory_part below). The CUDA trainer prints that table at start, once everything is
allocated for the training batch (B, T): the sums of its cudaMalloc sizes, exact. A sample
longer than T (-g > -t) grows the activations later, to (B, that length): gpt2_allocate.
Computed: gpu_memory_formula gives the same sums from the model's shape, the batch and the
optimizer's split (zenflow.h's capacities). The CPU trainer prints it (it has no GPU: what
the CUDA trainer would allocate in the same mode); scripts/gpu_memory.py is the same formula
in Python and prints docs/memory.md's table of what fits on which GPU.
dev/test/test_gpu_memory.py checks the three against each other on the CPU emulator of CUDA.
Not counted by either: what the CUDA runtime and cuBLASLt keep for themselves (the context,
a few hundred MiB) and fragmentation.
*/
#ifndef LLMC_GPU_MEMORY_H
#define LLMC_GPU_MEMORY_H

#include <stdio.h>
#include <string.h>

#include "gpt2_file.h"

enum {
    GPU_MEM_PARAMETERS,
    GPU_MEM_GRADIENTS,
    GPU_MEM_MOMENTS,      // AdamW's m and v of what the GPU updates
    GPU_MEM_ACTIVATIONS,  // what the forward pass keeps, the scratch buffers, the token ids
    GPU_MEM_WORKSPACE,    // cuBLASLt's
    GPU_MEM_STAGING,      // ZenFlow's transfer buffers for the CPU-owned columns
    GPU_MEM_OTHER,        // ZenFlow's column tables and scores (and any other label)
    GPU_MEM_PARTS
};
static const char* const gpu_memory_part_names[GPU_MEM_PARTS] = {
    "parameters", "gradients", "moments (m, v)", "activations", "cuBLASLt workspace", "staging", "other"};

// the part of an allocation, by the label given to cuda_malloc (a label starting so)
static inline int gpu_memory_part(const char* what) {
    static const struct { const char* label; int part; } labels[] = {
        {"parameters", GPU_MEM_PARAMETERS}, {"gradients", GPU_MEM_GRADIENTS},
        {"ZenFlow GPU moments", GPU_MEM_MOMENTS}, {"AdamW ", GPU_MEM_MOMENTS},
        {"activations", GPU_MEM_ACTIVATIONS}, {"scratch buffers", GPU_MEM_ACTIVATIONS},
        {"token ids", GPU_MEM_ACTIVATIONS}, {"the cuBLASLt workspace", GPU_MEM_WORKSPACE},
        {"ZenFlow staging buffer", GPU_MEM_STAGING}};
    for (size_t i = 0; i < sizeof(labels) / sizeof(labels[0]); i++) {
        if (strncmp(what, labels[i].label, strlen(labels[i].label)) == 0) { return labels[i].part; }
    }
    return GPU_MEM_OTHER;
}

// one line per part and the total, after a heading line
static inline void gpu_memory_print(const size_t bytes[GPU_MEM_PARTS], const char* heading) {
    printf("[memory] %s\n", heading);
    size_t total = 0;
    for (int i = 0; i < GPU_MEM_PARTS; i++) {
        printf("[memory] GPU %-20s %10.1f MiB  (%zu bytes)\n", gpu_memory_part_names[i], bytes[i] / 1048576.0,
               bytes[i]);
        total += bytes[i];
    }
    printf("[memory] GPU %-20s %10.1f MiB  (%zu bytes)\n", "total", total / 1048576.0, total);
}

// What ZenFlow owns where (zenflow.h's zf_init: vector_elems, gpu_capacity, cpu_capacity) and
// the two options that change the GPU's buffers
typedef struct {
    size_t vector_elems, gpu_capacity, cpu_capacity;
    int overlap;        // -zv 1: two staging buffers, else one (none when the CPU owns nothing)
    int auto_interval;  // -zu auto: the partial sums of spec 6
} GpuMemorySplit;

// The bytes of each part, as train_gpt2.cu (gpt2_build, gpt2_allocate), zenflow.cuh
// (zf_cuda_init) and cuda_kernels.cuh (cublas_init) allocate them for a batch (B, T)
static inline void gpu_memory_formula(const GPT2Config* c, int B, int T, GpuMemorySplit z,
                                      size_t bytes[GPU_MEM_PARTS]) {
    const size_t L = c->num_layers, C = c->channels, NH = c->num_heads, Vp = c->padded_vocab_size;
    const size_t BT = (size_t)B * T, BTC = BT * C, att = (size_t)B * NH * T * T;
    const size_t COLSUM_CHUNKS = 128;          // cuda_kernels.cuh's COLSUM_MAX_CHUNKS
    const size_t CHUNK = 1024;                 // zenflow.cuh's ZF_CHUNK
    const size_t SET = 32;                     // sizeof(ZfColumnSet) in zenflow.cuh
    const size_t n = 2 + 4 * L, nv = 10;       // matrices, vector tensors (zenflow.h's lists)
    const size_t total_cols = 2 * C + 7 * L * C, max_cols = 4 * C;
    size_t params = gpt2_num_params(c);
    bytes[GPU_MEM_PARAMETERS] = 4 * params;
    bytes[GPU_MEM_GRADIENTS] = 4 * params;
    bytes[GPU_MEM_MOMENTS] = 2 * 4 * (z.vector_elems + z.gpu_capacity);
    // train_gpt2.cu's activation_sizes (18 tensors), scratch_sizes (6) and the token ids
    size_t acts = (16 * L + 2) * BTC + (4 * L + 2) * BT + L * att + BT * Vp;
    size_t scratch = 10 * BTC + att;
    bytes[GPU_MEM_ACTIVATIONS] = 4 * (acts + scratch) + 4 * (5 * BT + 1);
    bytes[GPU_MEM_WORKSPACE] = (size_t)32 << 20;  // cuda_kernels.cuh's CUBLASLT_WORKSPACE_BYTES
    bytes[GPU_MEM_STAGING] = (z.overlap ? 2 : 1) * 4 * z.cpu_capacity;
    // the column sets (the GPU's, the CPU's by tiles and by chunks, the vectors') and their
    // blocks, the column order, every matrix's column scores and their partial sums
    size_t tables = SET * (3 * n + nv) + 8 * (3 * (n + 1) + nv + 1) + 4 * (total_cols + 1) + 4 * total_cols +
                    4 * COLSUM_CHUNKS * max_cols;
    if (z.auto_interval) {
        size_t most = z.gpu_capacity > z.cpu_capacity ? z.gpu_capacity : z.cpu_capacity;
        tables += 8 * (most / CHUNK + n);
    }
    bytes[GPU_MEM_OTHER] = tables;
}

#endif  // LLMC_GPU_MEMORY_H
