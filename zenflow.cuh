/*
ZenFlow on the GPU: the CUDA backend (ZfBackend) of the orchestration in zenflow.h.

zenflow.h decides WHAT happens in a step (docs/zenflow_spec.md section 4); this file says
how a GPU does each part. It reads in step order: the kernels first (4.2 scores, 4.3 the
GPU's AdamW, 4.4 / 7 gathering the CPU's columns, 4.6 putting them back, 6 the sums that
auto U decides with), then the primitives zenflow.h calls, in the same order.

Who owns which columns (spec 3), for one matrix W (rows = OC, cols = IC) with sel = {2, 7}:

        columns:   0  1  2  3  4  5  6  7  8  9
                  [c  c  G  c  c  c  c  G  c  c]     G: GPU-owned, c: CPU-owned

The device describes each side's columns of each matrix as a COLUMN SET (ZfColumnSet): the
matrix, how many columns, and where their indices are in `order` (zenflow.h's cols_by_owner
of every matrix, back to back: the GPU's columns first, then the CPU's, each ascending).
    gpu_sets[i]: matrix i's selected columns  -> the GPU's AdamW, zeroing gradients
    cpu_sets[i]: matrix i's other columns     -> gathered to the host, scattered back
Packed layouts (an element is W[o, col_r], col_r the set's r-th column):
    CPU side, also the staging buffers on the device (zenflow.h's layout):
        packed[cpu_offset + r * rows + o]        column by column
    GPU moments m, v, after all vectors (this file's own layout, see below):
        m[vector_elems + gpu_offset + o * n_sel + r]   row by row
Why row by row on the GPU: the AdamW kernel then walks W's rows in order, so with k = 1
(adamw mode) every access is contiguous and the update runs at full memory bandwidth; with
the column-by-column layout one of (p, g) or (m, v) would be read with a stride. zenflow.h
only sees the moments at a selection or a checkpoint, through moments_to_host/_from_host,
which convert on the host (rare, so simple loops).

Streams and events (all copies are between pinned host buffers and device staging buffers):

    default stream   forward, backward, zero grads, AdamW, gather, scatter   ("compute")
    d2h stream       staging -> host   (gradient columns every step, or A once a window)
    h2d stream       host -> staging   (the CPU's updated columns, once a window)

The copy engines carry nothing else during a step: the trainer's token ids and losses and
auto U's sums cross through mapped host memory, moved by kernels (mapped_alloc in
llmc/cuda_kernels.cuh says why). A selection, once every S steps, still copies its scores
and column sets with cudaMemcpy.

A staging buffer (ZfStaging) remembers the last kernel that used it and the last copy out
of and into it (events); a user waits for exactly what it conflicts with. A host buffer
remembers its last copy (ZfFence), and zenflow.h calls host_wait before the CPU touches it.
One window with overlap, CPU accumulation (U = 4; w-1's update is applied at boundary w),
with the trainer's per-layer hooks (zenflow.h's pipelining): each layer's gradient columns are
gathered and leave as soon as its backward is done (g: the layers', e: the embeddings' last):

  default: |fwd bwd(g g g) e adam|fwd bwd(g g g) e adam|  ...  |fwd bwd(g g g) e adam scatter|
  d2h:              |g |g |g |e|           |g |g |g |e|            |g |g |g |e|
  accumulator:                  |A += g|               |A += g|           |A += g|
  updater:  |AdamW window w-1 ...........................|                 |AdamW window w ...
  h2d:                                                   |result of w-1|     ^ waited here
(the accumulator and the updater are zenflow.h's two CPU threads: the accumulations never
queue behind a window update)

Without the hooks (-zp 0) one gather after the backward and one copy do the same. GPU
accumulation has no per-step copy: at the boundary's backward A leaves the same way, layer by
layer, and the update's result comes back once. With overlap off (offload, warm-up) the CPU's
result is not ready before the boundary, so its copy up is pipelined too: zenflow.h applies
it layer by layer in the next forward, and each scatter waits only for its own layer's copy:

  h2d:      |e |0 |1 |2 | ...        (all copies start at once, in forward order)
  default:   |e fwd-enc|0 fwd-layer 0|1 fwd-layer 1| ...

Stall (spec 8) is measured on the default stream: each wait of that stream for a copy, and
each time the main thread blocks on the CPU side (zenflow.h's host_blocks: a wait for the
CPU threads, a synchronous update, a whole selection with its migration), is bracketed by
two timing events; their elapsed time is how long the GPU had nothing to do. Compute =
the step's elapsed time on the default stream minus the stall. (A selection's own kernels,
the column scores and the gathers of the new CPU columns, fall inside its bracket: a few
passes over the gradients and parameters, counted as stall with the host's part.)

Memory: each staging buffer holds all CPU-owned columns ((1-k) M floats); two with overlap
(a window's result waits in one while gradients leave through the other). Why not a ring of
a few layers' slots for the way out, which would save (1-k) M floats (5 GB at d48)? Because
the full buffer is what lets the copies lag: with it, step t's gradients may still be
leaving during step t+1's forward (the next transfer waits for them only at its first
group), so the copies have a backward plus a forward to hide in; with a ring of R slots the
backward's layer l waits for layer l+R's copy, and they have only the backward. When -za cpu
is PCIe-bound (d48: about 5.6 GB down per step, roughly 110 ms at 50 GB/s, against a
backward of about two thirds of a ~100 ms step) that turns a small stall into a large one.
The way in cannot shrink either: the prefetched result must wait whole until the boundary.
(-za gpu is the memory- and PCIe-lean choice: A leaves once per window.) These are
estimates, not measurements; bench_zenflow.sh prints the memory next to the stall.

Build with -fmad=false (the Makefile does): the AdamW here is bitwise the CPU's.
*/
#ifndef ZENFLOW_CUH
#define ZENFLOW_CUH

#include <cuda_runtime.h>

#include "llmc/cuda_kernels.cuh"
#include "llmc/cuda_trace.cuh"
#include "zenflow.h"

// ----------------------------------------------------------------------------
// the device's view of ownership: column sets, rebuilt at every selection (spec 4.2.4)

typedef struct {
    size_t full_offset;    // W[0, 0] in the parameter / gradient buffer
    size_t packed_offset;  // where the set starts in its packed buffer (see the top)
    int rows, cols;        // W is (rows, cols), row-major: (OC, IC)
    int count;             // columns in the set
    int list_offset;       // its columns, ascending: order[list_offset .. list_offset + count)
} ZfColumnSet;

#define ZF_TILE 32               // gather / scatter move 32 x 32 tiles ...
#define ZF_TILE_ROWS 8           // ... with blocks of 32 x 8 threads
#define ZF_BLOCK 256             // threads of the element-wise kernels
#define ZF_CHUNK (4 * ZF_BLOCK)  // elements per block of the element-wise kernels

// The kernels over column sets run one flat grid over all sets: start[s] is the first unit
// (block) of set s, start[num_sets] the total. A block finds its set by binary search:
// the last s with start[s] <= unit (an empty set has start[s] == start[s + 1], never found).
__host__ __device__ inline int zf_find_set(const long long* start, int num_sets, long long unit) {
    int lo = 0, hi = num_sets - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (start[mid] <= unit) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// W[o, col_r] in the full buffer
__host__ __device__ inline size_t zf_full_index(const ZfColumnSet& s, const int* order, int r, int o) {
    return s.full_offset + (size_t)o * s.cols + order[s.list_offset + r];
}

// the CPU side's packed layout (column by column)
__host__ __device__ inline size_t zf_cpu_packed_index(const ZfColumnSet& s, int r, int o) {
    return s.packed_offset + (size_t)r * s.rows + o;
}

// the GPU moments' layout (row by row)
__host__ __device__ inline size_t zf_gpu_packed_index(const ZfColumnSet& s, int r, int o) {
    return s.packed_offset + (size_t)o * s.count + r;
}

// tiles of a set: 32 set columns x 32 rows each, column tiles fastest
__host__ __device__ inline long long zf_num_tiles(const ZfColumnSet& s) {
    return (long long)((s.count + ZF_TILE - 1) / ZF_TILE) * ((s.rows + ZF_TILE - 1) / ZF_TILE);
}

__host__ __device__ inline long long zf_num_chunks(const ZfColumnSet& s) {
    return ((long long)s.count * s.rows + ZF_CHUNK - 1) / ZF_CHUNK;
}

// The bodies of the kernels below, one thread's part each, as host-and-device functions so
// that dev/cuda/zenflow_host.cu can run exactly this code on the CPU (no GPU needed) and
// check every index against zenflow.h's layouts.

// the tile of block `block` of a tiled kernel: set columns r0.., rows o0..
typedef struct {
    ZfColumnSet set;
    int r0, o0;
} ZfTileRef;

__host__ __device__ inline ZfTileRef zf_tile_of_block(const ZfColumnSet* sets, const long long* tile_start,
                                                      int num_sets, long long block) {
    int s = zf_find_set(tile_start, num_sets, block);
    ZfTileRef t;
    t.set = sets[s];
    long long tile = block - tile_start[s], tiles_r = (t.set.count + ZF_TILE - 1) / ZF_TILE;
    t.r0 = (int)(tile % tiles_r) * ZF_TILE;
    t.o0 = (int)(tile / tiles_r) * ZF_TILE;
    return t;
}

// gather, part 1: thread (tx, ty) reads W[o0 + j, col(r0 + tx)] for j = ty, ty + 8, ... into
// tile[j][tx] (a warp reads 32 set columns of one row of W: ascending, mostly adjacent)
__host__ __device__ inline void zf_gather_load(const ZfTileRef& t, const int* order, const float* full, int tx,
                                               int ty, float (*tile)[ZF_TILE + 1]) {
    if (t.r0 + tx >= t.set.count) { return; }
    for (int j = ty; j < ZF_TILE && t.o0 + j < t.set.rows; j += ZF_TILE_ROWS) {
        tile[j][tx] = full[zf_full_index(t.set, order, t.r0 + tx, t.o0 + j)];
    }
}

// gather, part 2: thread (tx, ty) writes packed column r0 + j, row o0 + tx = tile[tx][j]
// (a warp writes 32 consecutive rows of one packed column)
__host__ __device__ inline void zf_gather_store(const ZfTileRef& t, float* packed, int tx, int ty,
                                                const float (*tile)[ZF_TILE + 1]) {
    if (t.o0 + tx >= t.set.rows) { return; }
    for (int j = ty; j < ZF_TILE && t.r0 + j < t.set.count; j += ZF_TILE_ROWS) {
        packed[zf_cpu_packed_index(t.set, t.r0 + j, t.o0 + tx)] = tile[tx][j];
    }
}

// scatter, part 1: tile[j][tx] = packed column r0 + j, row o0 + tx
__host__ __device__ inline void zf_scatter_load(const ZfTileRef& t, const float* packed, int tx, int ty,
                                                float (*tile)[ZF_TILE + 1]) {
    if (t.o0 + tx >= t.set.rows) { return; }
    for (int j = ty; j < ZF_TILE && t.r0 + j < t.set.count; j += ZF_TILE_ROWS) {
        tile[j][tx] = packed[zf_cpu_packed_index(t.set, t.r0 + j, t.o0 + tx)];
    }
}

// scatter, part 2: W[o0 + j, col(r0 + tx)] = tile[tx][j]
__host__ __device__ inline void zf_scatter_store(const ZfTileRef& t, const int* order, float* full, int tx, int ty,
                                                 const float (*tile)[ZF_TILE + 1]) {
    if (t.r0 + tx >= t.set.count) { return; }
    for (int j = ty; j < ZF_TILE && t.o0 + j < t.set.rows; j += ZF_TILE_ROWS) {
        full[zf_full_index(t.set, order, t.r0 + tx, t.o0 + j)] = tile[tx][j];
    }
}

// Element i of a GPU-owned set, taken row by row: (row o = i / count, set column r =
// i % count); *at = W[o, col_r] in the full buffer, *k = its moments (row by row)
__host__ __device__ inline void zf_gpu_element(const ZfColumnSet& s, const int* order, int i, size_t* at,
                                               size_t* k) {
    int o = i / s.count, r = i % s.count;
    *at = zf_full_index(s, order, r, o);
    *k = zf_gpu_packed_index(s, r, o);
}

// Host side: the column sets of the current ownership (zf->matrices). cpu, gpu: (num_matrices);
// tiles, chunks: (num_matrices + 1) prefix sums; order: (sum of every matrix's cols).
static void zf_build_column_sets(const ZenFlow* zf, ZfColumnSet* cpu, ZfColumnSet* gpu, long long* tiles,
                                 long long* chunks, int* order) {
    int at = 0;
    tiles[0] = chunks[0] = 0;
    for (int i = 0; i < zf->num_matrices; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        memcpy(order + at, mat->cols_by_owner, mat->cols * sizeof(int));
        ZfColumnSet g = {mat->offset, mat->gpu_offset, mat->rows, mat->cols, mat->n_sel, at};
        ZfColumnSet c = {mat->offset, mat->cpu_offset, mat->rows, mat->cols, mat->cols - mat->n_sel,
                         at + mat->n_sel};
        gpu[i] = g;
        cpu[i] = c;
        tiles[i + 1] = tiles[i] + zf_num_tiles(c);
        chunks[i + 1] = chunks[i] + zf_num_chunks(g);
        at += mat->cols;
    }
}

// ----------------------------------------------------------------------------
// kernels, in step order

// 4.2.2 column scores, pass 1: partial[chunk, j] = sum of g[o, j]^2 over the chunk's rows.
// Block (32, 8): 32 columns; thread y sums rows y, y + 8, ... of the chunk, then the 8
// partial sums are added in order. Pass 2 is column_sum_finalize_kernel (chunks in order).
// The order depends only on the shape: the scores are deterministic.
__global__ void zf_column_scores_partial_kernel(float* __restrict__ partial,  // (chunks, cols)
                                                const float* __restrict__ g,  // (rows, cols)
                                                int rows, int cols, int rows_per_chunk) {
    __shared__ float s[8][32];
    int j = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * rows_per_chunk;
    int r1 = min(r0 + rows_per_chunk, rows);
    float sum = 0.0f;
    if (j < cols) {
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            float x = g[(size_t)r * cols + j];
            sum += x * x;
        }
    }
    s[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
        float total = 0.0f;
        for (int y = 0; y < 8; y++) { total += s[y][threadIdx.x]; }
        partial[(size_t)blockIdx.y * cols + j] = total;
    }
}

// 4.3 AdamW on the GPU-owned columns, one thread per element. A set's elements are taken
// row by row, element i = (row o = i / count, set column r = i % count): consecutive
// threads read W's row o left to right, and m, v in order. (The vectors use adamw_update.)
__global__ void zf_adam_columns_kernel(float* __restrict__ params,       // (num_parameters)
                                       const float* __restrict__ grads,  // (num_parameters)
                                       float* __restrict__ m,            // (gpu_sel_elems) row by row
                                       float* __restrict__ v,            // (gpu_sel_elems)
                                       const ZfColumnSet* __restrict__ sets,     // (num_sets) GPU-owned
                                       const long long* __restrict__ chunk_start,  // (num_sets + 1)
                                       int num_sets, const int* __restrict__ order, AdamWConsts c) {
    const int s = zf_find_set(chunk_start, num_sets, blockIdx.x);
    const ZfColumnSet set = sets[s];
    const int n = set.count * set.rows;
    const int base = (int)(blockIdx.x - chunk_start[s]) * ZF_CHUNK;
    for (int j = threadIdx.x; j < ZF_CHUNK; j += ZF_BLOCK) {
        int i = base + j;
        if (i < n) {
            size_t at, k;
            zf_gpu_element(set, order, i, &at, &k);
            adamw_one(params + at, m + k, v + k, grads[at], c);
        }
    }
}

// spec 7, GPU accumulation: before a backward pass inside a window only the GPU-owned
// gradients are zeroed (same element order as the AdamW kernel); the CPU-owned columns keep A
__global__ void zf_zero_columns_kernel(float* __restrict__ grads,  // (num_parameters)
                                       const ZfColumnSet* __restrict__ sets, const long long* __restrict__ chunk_start,
                                       int num_sets, const int* __restrict__ order) {
    const int s = zf_find_set(chunk_start, num_sets, blockIdx.x);
    const ZfColumnSet set = sets[s];
    const int n = set.count * set.rows;
    const int base = (int)(blockIdx.x - chunk_start[s]) * ZF_CHUNK;
    for (int j = threadIdx.x; j < ZF_CHUNK; j += ZF_BLOCK) {
        int i = base + j;
        if (i < n) {
            size_t at, k;
            zf_gpu_element(set, order, i, &at, &k);
            grads[at] = 0.0f;
        }
    }
}

// 4.4 / 7 gather: the CPU-owned columns of W (gradients, or parameters) into the packed CPU
// layout: a transpose by 32 x 32 tiles through shared memory, so that both the reads of W
// (by rows) and the writes of the packed buffer (by columns) are 32 consecutive floats per
// warp where the layouts allow it. Block (32, 8), one tile per block.
// The grid may cover only some of the sets (per-layer pipelining): block b does tile
// first_tile + b of the flat numbering.
__global__ void zf_gather_columns_kernel(float* __restrict__ packed,      // (cpu_elems) column by column
                                         const float* __restrict__ full,  // (num_parameters)
                                         const ZfColumnSet* __restrict__ sets,  // (num_sets) CPU-owned
                                         const long long* __restrict__ tile_start,  // (num_sets + 1)
                                         int num_sets, const int* __restrict__ order, long long first_tile) {
    __shared__ float tile[ZF_TILE][ZF_TILE + 1];  // +1: the column reads hit 32 different banks
    ZfTileRef t = zf_tile_of_block(sets, tile_start, num_sets, first_tile + blockIdx.x);
    zf_gather_load(t, order, full, threadIdx.x, threadIdx.y, tile);
    __syncthreads();
    zf_gather_store(t, packed, threadIdx.x, threadIdx.y, tile);
}

// 4.6 scatter ("apply"): the packed CPU-owned columns back into W, the gather's inverse
__global__ void zf_scatter_columns_kernel(float* __restrict__ full,          // (num_parameters)
                                          const float* __restrict__ packed,  // (cpu_elems)
                                          const ZfColumnSet* __restrict__ sets,
                                          const long long* __restrict__ tile_start, int num_sets,
                                          const int* __restrict__ order, long long first_tile) {
    __shared__ float tile[ZF_TILE][ZF_TILE + 1];
    ZfTileRef t = zf_tile_of_block(sets, tile_start, num_sets, first_tile + blockIdx.x);
    zf_scatter_load(t, packed, threadIdx.x, threadIdx.y, tile);
    __syncthreads();
    zf_scatter_store(t, order, full, threadIdx.x, threadIdx.y, tile);
}

// the sum of every thread's `mine` over a block of ZF_BLOCK threads, added up in a fixed tree
// (the same order every run); `shared` holds ZF_BLOCK doubles
__device__ inline double zf_block_sum(double* shared, double mine) {
    shared[threadIdx.x] = mine;
    __syncthreads();
    for (int half = ZF_BLOCK / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) { shared[threadIdx.x] += shared[threadIdx.x + half]; }
        __syncthreads();
    }
    return shared[0];
}

// spec 6 (auto U), pass 1: partial[b] = sum of |g| over chunk b of the column sets (their
// elements taken row by row, as in the AdamW kernel), in double, added up in a fixed tree
__global__ void zf_abs_sum_partial_kernel(double* __restrict__ partial,      // (chunks)
                                          const float* __restrict__ grads,   // (num_parameters)
                                          const ZfColumnSet* __restrict__ sets,
                                          const long long* __restrict__ chunk_start, int num_sets,
                                          const int* __restrict__ order) {
    __shared__ double sum[ZF_BLOCK];
    const int s = zf_find_set(chunk_start, num_sets, blockIdx.x);
    const ZfColumnSet set = sets[s];
    const int n = set.count * set.rows;
    const int base = (int)(blockIdx.x - chunk_start[s]) * ZF_CHUNK;
    double mine = 0.0;
    for (int j = threadIdx.x; j < ZF_CHUNK; j += ZF_BLOCK) {
        int i = base + j;
        if (i < n) {
            size_t at, k;
            zf_gpu_element(set, order, i, &at, &k);
            mine += fabs((double)grads[at]);
        }
    }
    double total = zf_block_sum(sum, mine);
    if (threadIdx.x == 0) { partial[blockIdx.x] = total; }
}

// pass 2, one block per set: out[s] = the sum of set s's partials (0 for an empty set)
__global__ void zf_abs_sum_finalize_kernel(double* __restrict__ out, const double* __restrict__ partial,
                                           const long long* __restrict__ chunk_start) {
    __shared__ double sum[ZF_BLOCK];
    double mine = 0.0;
    for (long long b = chunk_start[blockIdx.x] + threadIdx.x; b < chunk_start[blockIdx.x + 1]; b += ZF_BLOCK) {
        mine += partial[b];
    }
    double total = zf_block_sum(sum, mine);
    if (threadIdx.x == 0) { out[blockIdx.x] = total; }
}

// ----------------------------------------------------------------------------
// the backend's state

// events only waited for, never timed; a host thread that waits for one sleeps (see
// cuda_init_device: without cudaEventBlockingSync, cudaEventSynchronize spins)
#define ZF_WAITED_EVENT (cudaEventDisableTiming | cudaEventBlockingSync)

#define ZF_MAX_FENCES 8   // host buffers that copies use: master, acc, acc_job, 2 staging
#define ZF_MAX_STALLS 256  // stall intervals measured per step (more are waited for, not timed);
                           // per-layer applies wait once per layer

// a device staging buffer of packed CPU-owned columns, and who used it last
typedef struct {
    float* buf;               // (cpu_capacity) device, zenflow.h's CPU layout
    cudaEvent_t kernel_done;  // default stream: after the last gather into / scatter out of it
    cudaEvent_t d2h_done;     // d2h stream: after the last copy out of it
    cudaEvent_t h2d_done;     // h2d stream: after the last copy into it
} ZfStaging;

// a host buffer of zenflow.h and the last copy into or out of it
typedef struct {
    const float* host;
    size_t bytes;
    cudaEvent_t done;
    int pinned;  // 1 if cudaHostRegister worked (else copies are not asynchronous, still correct)
} ZfFence;

// what one step cost (zf_cuda_step_end)
typedef struct {
    double gpu_ms;      // default stream, from the step's first to its last event
    double stall_ms;    // of that: waiting for a copy or for the CPU side
    double compute_ms;  // gpu_ms - stall_ms
    double cpu_ms;      // CPU optimizer work done during the step (either thread)
    double d2h_bytes, h2d_bytes;  // ZenFlow's PCIe traffic of the step
} ZfStepStats;

typedef struct {
    float* params;  // (num_parameters) device: the working copy, file layout
    float* grads;   // (num_parameters) device
    size_t num_parameters;
    int num_sets;    // = zf->num_matrices
    int total_cols;  // sum of every matrix's cols (the length of order)
    int max_cols;
    // ownership (selection_changed), host mirrors h_* built first, then copied
    ZfColumnSet *cpu_sets, *gpu_sets, *h_cpu_sets, *h_gpu_sets;  // (num_sets)
    long long *cpu_tiles, *gpu_chunks, *h_cpu_tiles, *h_gpu_chunks;  // (num_sets + 1)
    long long *cpu_chunks, *h_cpu_chunks;  // (num_sets + 1) the CPU sets by chunks (auto U's sums)
    int *order, *h_order;                                        // (total_cols)
    // 4.3: the GPU's optimizer state: every vector, then each matrix's selected columns
    float* m;  // (vector_elems + gpu_capacity) device, row by row per matrix (see the top)
    float* v;
    float* host_moments;  // (vector_elems + gpu_capacity) host scratch for the layout change
    // 4.2.2 scratch
    float* scores;         // (max_cols) device
    float* score_partial;  // (COLSUM_MAX_CHUNKS, max_cols) device
    // auto U (spec 6): per set sums of |g|, GPU-owned then CPU-owned; abs_sums' last kernel
    // writes them into mapped host memory (no copy: it would queue behind the gradients
    // leaving, see mapped_alloc) and zf_cuda_abs_sums_wait hands them to zenflow.h's arrays
    double* abs_partial;  // (most chunks either side can have) device
    double* abs_host;     // (2 num_sets) mapped pinned host memory ...
    double* abs_mapped;   // ... and the address the kernel writes it at
    double *abs_sel, *abs_cpu;  // where the last abs_sums call wants them (abs_cpu may be NULL)
    cudaEvent_t abs_done;
    // transfers (spec 7)
    cudaStream_t d2h, h2d;
    ZfStaging staging[2];
    ZfStaging* grads_stage;   // gradient columns (or A) on their way to the host
    ZfStaging* params_stage;  // the CPU's updated columns on their way in; == grads_stage
                              // unless CPU accumulation overlaps (both busy at once there)
    int prefetched;           // params_stage holds the master already (params_prefetch)
    long long uploaded_bytes;  // host-to-device bytes of zf_cuda_upload's copies not yet counted
                               // in a step's h2d_bytes (the updater thread adds too: atomic)
    ZfFence fences[ZF_MAX_FENCES];
    int num_fences;
    size_t staging_bytes, pinned_bytes;
    // measurement (main thread only)
    cudaEvent_t step_begin, step_end;
    cudaEvent_t stall_begin[ZF_MAX_STALLS], stall_end[ZF_MAX_STALLS];
    int num_stalls;
    int blocking;  // inside host_blocks: stream waits are part of that interval
    double d2h_bytes, h2d_bytes, cpu_ms_at_begin;
} ZfCudaDevice;

// ----------------------------------------------------------------------------
// copies, their ordering, and stall measurement

static ZfFence* zf_cuda_fence(ZfCudaDevice* dev, const float* host) {
    for (int i = 0; i < dev->num_fences; i++) {
        if (dev->fences[i].host == host) { return &dev->fences[i]; }
    }
    return NULL;
}

// the default stream waits for an event; timed as a stall unless the host is blocked anyway
static void zf_cuda_compute_waits(ZfCudaDevice* dev, cudaEvent_t event) {
    int timed = !dev->blocking && dev->num_stalls < ZF_MAX_STALLS;
    if (timed) { cudaCheck(cudaEventRecord(dev->stall_begin[dev->num_stalls], 0)); }
    int span = gpu_trace_begin(0);
    cudaCheck(cudaStreamWaitEvent(0, event, 0));
    gpu_trace_end(span, 0, TRACE_WAIT, "GPU waits for a copy");
    if (timed) { cudaCheck(cudaEventRecord(dev->stall_end[dev->num_stalls++], 0)); }
}

// A transfer moves the CPU-owned columns of some matrices (zenflow.h's transfer group; -1:
// all): as RUNS of consecutive matrices [i0, i1), each one gather or scatter launch and one
// copy, since a run's packed columns are one range. Group -1 is one run; a layer's four
// matrices (qkvw.l, attprojw.l, fcw.l, fcprojw.l) are four, the embeddings (wte, wpe) one.
// Walks the runs of mats[0 .. count): returns 0 when done.
static int zf_next_run(const int* mats, int count, int* k, int* i0, int* i1) {
    if (*k >= count) { return 0; }
    *i0 = mats[(*k)++];
    *i1 = *i0 + 1;
    while (*k < count && mats[*k] == *i1) { (*k)++, (*i1)++; }
    return 1;
}

// where the run's columns are in the packed buffers: [*offset, *offset + *n) floats
static void zf_run_range(const ZfCudaDevice* dev, const ZenFlow* zf, int i0, int i1, size_t* offset, size_t* n) {
    size_t end = i1 < dev->num_sets ? dev->h_cpu_sets[i1].packed_offset : zf->cpu_elems;
    *offset = dev->h_cpu_sets[i0].packed_offset;
    *n = end - *offset;
}

// the CPU-owned columns of matrices [i0, i1) of `full` into the packed buffer, and back
static void zf_cuda_gather(ZfCudaDevice* dev, float* packed, const float* full, int i0, int i1) {
    long long first = dev->h_cpu_tiles[i0], tiles = dev->h_cpu_tiles[i1] - first;
    if (tiles == 0) { return; }
    zf_gather_columns_kernel<<<(unsigned)tiles, dim3(ZF_TILE, ZF_TILE_ROWS)>>>(packed, full, dev->cpu_sets, dev->cpu_tiles,
                                                                    dev->num_sets, dev->order, first);
    cudaCheck(cudaGetLastError());
}

static void zf_cuda_scatter(ZfCudaDevice* dev, float* full, const float* packed, int i0, int i1) {
    long long first = dev->h_cpu_tiles[i0], tiles = dev->h_cpu_tiles[i1] - first;
    if (tiles == 0) { return; }
    zf_scatter_columns_kernel<<<(unsigned)tiles, dim3(ZF_TILE, ZF_TILE_ROWS)>>>(full, packed, dev->cpu_sets, dev->cpu_tiles,
                                                                     dev->num_sets, dev->order, first);
    cudaCheck(cudaGetLastError());
}

// The CPU-owned columns of transfer group `group` (-1: all) of `full` (params or grads) to
// `host`: gather into the staging buffer on the default stream, copy out on the d2h stream.
// Asynchronous unless `sync`. The events of the staging buffer and of `host` then stand for
// this copy, and so for every earlier one on its stream.
static void zf_cuda_columns_to_host(ZfCudaDevice* dev, const ZenFlow* zf, ZfStaging* st, const float* full,
                                    float* host, int sync, int group) {
    if (zf->cpu_elems == 0) { return; }
    // the staging buffer is free once its last copy out and its last copy in are done. A
    // transfer in groups waits before its first group only: the later groups write other
    // parts of the buffer, and waiting for this step's own copies would serialize them.
    if (group < 0 || group == zf->num_groups - 1) {
        zf_cuda_compute_waits(dev, st->d2h_done);
        zf_cuda_compute_waits(dev, st->h2d_done);
    }
    if (st == dev->params_stage) { dev->prefetched = 0; }  // about to overwrite a prefetch
    int count, k = 0, i0, i1;
    const int* mats = zf_group(zf, group, &count);
    int span = gpu_trace_begin(0);
    while (zf_next_run(mats, count, &k, &i0, &i1)) { zf_cuda_gather(dev, st->buf, full, i0, i1); }
    gpu_trace_end(span, 0, TRACE_COMPUTE, "gather columns");
    cudaCheck(cudaEventRecord(st->kernel_done, 0));
    cudaCheck(cudaStreamWaitEvent(dev->d2h, st->kernel_done, 0));
    span = gpu_trace_begin(dev->d2h);
    for (k = 0; zf_next_run(mats, count, &k, &i0, &i1);) {
        size_t at, n;
        zf_run_range(dev, zf, i0, i1, &at, &n);
        if (n == 0) { continue; }
        cudaCheck(cudaMemcpyAsync(host + at, st->buf + at, n * sizeof(float), cudaMemcpyDeviceToHost, dev->d2h));
        dev->d2h_bytes += (double)n * sizeof(float);
    }
    gpu_trace_end(span, dev->d2h, TRACE_D2H, full == dev->grads ? "gradient columns" : "parameter columns");
    cudaCheck(cudaEventRecord(st->d2h_done, dev->d2h));
    ZfFence* fence = zf_cuda_fence(dev, host);
    if (fence != NULL) { cudaCheck(cudaEventRecord(fence->done, dev->d2h)); }
    if (sync) { cudaCheck(cudaEventSynchronize(st->d2h_done)); }
}

// Packed CPU-owned columns of transfer group `group` (-1: all) from `host` into the staging
// buffer, on the h2d stream. A new upload (all, or a transfer's first group, 0) goes after
// whatever used the buffer before. Safe to call from the updater thread (params_prefetch).
static void zf_cuda_upload(ZfCudaDevice* dev, const ZenFlow* zf, ZfStaging* st, const float* host, int group) {
    if (zf->cpu_elems == 0) { return; }
    if (group <= 0) {
        cudaCheck(cudaStreamWaitEvent(dev->h2d, st->kernel_done, 0));
        cudaCheck(cudaStreamWaitEvent(dev->h2d, st->d2h_done, 0));
    }
    int count, k = 0, i0, i1;
    const int* mats = zf_group(zf, group, &count);
    int span = gpu_trace_begin(dev->h2d);
    while (zf_next_run(mats, count, &k, &i0, &i1)) {
        size_t at, n;
        zf_run_range(dev, zf, i0, i1, &at, &n);
        if (n > 0) {
            cudaCheck(cudaMemcpyAsync(st->buf + at, host + at, n * sizeof(float), cudaMemcpyHostToDevice, dev->h2d));
            __atomic_add_fetch(&dev->uploaded_bytes, (long long)(n * sizeof(float)), __ATOMIC_RELAXED);
        }
    }
    gpu_trace_end(span, dev->h2d, TRACE_H2D, "packed columns");
    cudaCheck(cudaEventRecord(st->h2d_done, dev->h2d));
    ZfFence* fence = zf_cuda_fence(dev, host);
    if (fence != NULL) { cudaCheck(cudaEventRecord(fence->done, dev->h2d)); }
}

// ----------------------------------------------------------------------------
// the primitives (ZfBackend), in step order

// before the backward pass (zf_before_backward, spec 7)
static void zf_cuda_zero_grads(void* ctx, const ZenFlow* zf, int all) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    if (all) {
        cudaCheck(cudaMemsetAsync(dev->grads, 0, dev->num_parameters * sizeof(float), 0));
        return;
    }
    for (int i = 0; i < zf->num_vectors; i++) {
        const ZfVector* vec = &zf->vectors[i];
        cudaCheck(cudaMemsetAsync(dev->grads + vec->offset, 0, vec->n * sizeof(float), 0));
    }
    long long chunks = dev->h_gpu_chunks[dev->num_sets];
    if (chunks == 0) { return; }
    zf_zero_columns_kernel<<<(unsigned)chunks, ZF_BLOCK>>>(dev->grads, dev->gpu_sets, dev->gpu_chunks, dev->num_sets,
                                                           dev->order);
    cudaCheck(cudaGetLastError());
}

// 4.2.2 scores[j] = sum over rows of g[o, j]^2 of one matrix, to the host
static void zf_cuda_column_scores(void* ctx, const ZfMatrix* mat, float* scores) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    int rows_per_chunk = colsum_rows_per_chunk(mat->rows), chunks = ceil_div(mat->rows, rows_per_chunk);
    int span = gpu_trace_begin(0);
    zf_column_scores_partial_kernel<<<dim3(ceil_div(mat->cols, 32), chunks), dim3(32, 8)>>>(
        dev->score_partial, dev->grads + mat->offset, mat->rows, mat->cols, rows_per_chunk);
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaMemsetAsync(dev->scores, 0, mat->cols * sizeof(float), 0));
    column_sum_finalize_kernel<<<ceil_div(mat->cols, 256), 256>>>(dev->scores, dev->score_partial, chunks, mat->cols);
    cudaCheck(cudaGetLastError());
    gpu_trace_end(span, 0, TRACE_COMPUTE, "column scores");
    cudaCheck(cudaMemcpy(scores, dev->scores, mat->cols * sizeof(float), cudaMemcpyDeviceToHost));
    dev->d2h_bytes += (double)mat->cols * sizeof(float);
}

// 4.2.4 the new ownership, as column sets on the device
static void zf_cuda_selection_changed(void* ctx, const ZenFlow* zf) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    zf_build_column_sets(zf, dev->h_cpu_sets, dev->h_gpu_sets, dev->h_cpu_tiles, dev->h_gpu_chunks, dev->h_order);
    dev->h_cpu_chunks[0] = 0;
    for (int i = 0; i < dev->num_sets; i++) {
        dev->h_cpu_chunks[i + 1] = dev->h_cpu_chunks[i] + zf_num_chunks(dev->h_cpu_sets[i]);
    }
    if (dev->h_cpu_tiles[dev->num_sets] >= (1LL << 31) || dev->h_gpu_chunks[dev->num_sets] >= (1LL << 31) ||
        dev->h_cpu_chunks[dev->num_sets] >= (1LL << 31)) {
        fatal("zenflow.cuh: the model is too large for one grid of tiles (hint: a smaller model)");
    }
    // synchronous copies on the default stream: kernels still reading the old sets finish first
    size_t n = dev->num_sets;
    cudaCheck(cudaMemcpy(dev->cpu_sets, dev->h_cpu_sets, n * sizeof(ZfColumnSet), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->gpu_sets, dev->h_gpu_sets, n * sizeof(ZfColumnSet), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->cpu_tiles, dev->h_cpu_tiles, (n + 1) * sizeof(long long), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->gpu_chunks, dev->h_gpu_chunks, (n + 1) * sizeof(long long), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->cpu_chunks, dev->h_cpu_chunks, (n + 1) * sizeof(long long), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->order, dev->h_order, dev->total_cols * sizeof(int), cudaMemcpyHostToDevice));
}

// 4.3 AdamW (spec 3.1) on every GPU-owned element: the vectors (no weight decay), then the
// selected columns of every matrix in one launch
static void zf_cuda_gpu_adam(void* ctx, const ZenFlow* zf, ZfAdamHyper h, int step) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    int span = gpu_trace_begin(0);
    size_t at = 0;
    for (int i = 0; i < zf->num_vectors; i++) {
        const ZfVector* vec = &zf->vectors[i];
        adamw_update(dev->params + vec->offset, dev->m + at, dev->v + at, dev->grads + vec->offset, vec->n, h.lr,
                     h.beta1, h.beta2, h.eps, 0.0f, step);
        at += vec->n;
    }
    long long chunks = dev->h_gpu_chunks[dev->num_sets];
    if (chunks > 0) {
        AdamWConsts c = adamw_consts(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, step);
        zf_adam_columns_kernel<<<(unsigned)chunks, ZF_BLOCK>>>(dev->params, dev->grads, dev->m + zf->vector_elems,
                                                              dev->v + zf->vector_elems, dev->gpu_sets,
                                                              dev->gpu_chunks, dev->num_sets, dev->order, c);
        cudaCheck(cudaGetLastError());
    }
    gpu_trace_end(span, 0, TRACE_COMPUTE, "GPU-side AdamW");
}

// spec 6, auto U: per matrix the sum of |g| over its GPU-owned elements (and, if cpu is not
// NULL, its CPU-owned ones: with GPU accumulation they hold A), on the default stream after
// the backward; the sums reach the host asynchronously, zf_cuda_abs_sums_wait hands them over
static void zf_cuda_abs_sums(void* ctx, const ZenFlow* zf, double* sel, double* cpu) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    (void)zf;
    const int n = dev->num_sets;
    int span = gpu_trace_begin(0);
    for (int side = 0; side < (cpu != NULL ? 2 : 1); side++) {
        const ZfColumnSet* sets = side == 0 ? dev->gpu_sets : dev->cpu_sets;
        const long long* chunks = side == 0 ? dev->gpu_chunks : dev->cpu_chunks;
        long long total = (side == 0 ? dev->h_gpu_chunks : dev->h_cpu_chunks)[n];
        if (total > 0) {
            zf_abs_sum_partial_kernel<<<(unsigned)total, ZF_BLOCK>>>(dev->abs_partial, dev->grads, sets, chunks, n,
                                                                     dev->order);
            cudaCheck(cudaGetLastError());
        }
        zf_abs_sum_finalize_kernel<<<n, ZF_BLOCK>>>(dev->abs_mapped + side * n, dev->abs_partial, chunks);
        cudaCheck(cudaGetLastError());
    }
    gpu_trace_end(span, 0, TRACE_COMPUTE, "auto U sums");
    cudaCheck(cudaEventRecord(dev->abs_done, 0));  // the sums are in abs_host
    dev->abs_sel = sel;
    dev->abs_cpu = cpu;
}

static void zf_cuda_abs_sums_wait(void* ctx) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    cudaCheck(cudaEventSynchronize(dev->abs_done));
    memcpy(dev->abs_sel, dev->abs_host, dev->num_sets * sizeof(double));
    if (dev->abs_cpu != NULL) { memcpy(dev->abs_cpu, dev->abs_host + dev->num_sets, dev->num_sets * sizeof(double)); }
}

// 4.4 (CPU accumulation: g_t, every step) and 4.6 (GPU accumulation: A, at the boundary):
// the CPU-owned gradient columns to the host, asynchronously; all, or one layer's
static void zf_cuda_grads_to_host(void* ctx, const ZenFlow* zf, float* host, int group) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    zf_cuda_columns_to_host(dev, zf, dev->grads_stage, dev->grads, host, 0, group);
}

// 4.6, on the updater thread right after a window update: its result starts for the device
static void zf_cuda_params_prefetch(void* ctx, const ZenFlow* zf, const float* host) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    cudaCheck(cudaSetDevice(0));  // this thread's current device (the trainer uses device 0)
    zf_cuda_upload(dev, zf, dev->params_stage, host, -1);
    dev->prefetched = 1;  // read by the main thread only after it has waited for this job
}

// 4.6 apply: the CPU's columns into the working copy, before the next forward pass; all,
// or (pipelining, a synchronous apply) one layer's just before that layer's forward: the
// default stream waits only for this group's copy, the later ones are still on their way
static void zf_cuda_params_from_host(void* ctx, const ZenFlow* zf, const float* host, int group) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    if (zf->cpu_elems == 0) { return; }
    ZfStaging* st = dev->params_stage;
    if (!dev->prefetched) { zf_cuda_upload(dev, zf, st, host, group); }
    if (group < 0 || group == zf->num_groups - 1) { dev->prefetched = 0; }  // the transfer's last part
    zf_cuda_compute_waits(dev, st->h2d_done);
    int count, k = 0, i0, i1;
    const int* mats = zf_group(zf, group, &count);
    int span = gpu_trace_begin(0);
    while (zf_next_run(mats, count, &k, &i0, &i1)) { zf_cuda_scatter(dev, dev->params, st->buf, i0, i1); }
    gpu_trace_end(span, 0, TRACE_COMPUTE, "scatter columns (apply)");
    cudaCheck(cudaEventRecord(st->kernel_done, 0));
    // the step of the apply counts the bytes uploaded for it, a prefetch's included (its job
    // was waited for before this call, and the next prefetch starts only after it)
    dev->h2d_bytes += (double)__atomic_exchange_n(&dev->uploaded_bytes, 0LL, __ATOMIC_RELAXED);
}

// zenflow.h's jobs call this before they touch a host buffer a copy may still be using
static void zf_cuda_host_wait(void* ctx, const float* host) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    ZfFence* fence = zf_cuda_fence(dev, host);
    if (fence != NULL) {
        cudaCheck(cudaEventSynchronize(fence->done));
    } else {  // not a buffer we copy asynchronously: wait for every copy, to be safe
        cudaCheck(cudaStreamSynchronize(dev->d2h));
        cudaCheck(cudaStreamSynchronize(dev->h2d));
    }
}

// the main thread blocks on the CPU side: the default stream runs dry from here on
static void zf_cuda_host_blocks(void* ctx, int begin) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    if (begin) {
        dev->blocking = dev->num_stalls < ZF_MAX_STALLS;
        if (dev->blocking) { cudaCheck(cudaEventRecord(dev->stall_begin[dev->num_stalls], 0)); }
    } else if (dev->blocking) {
        cudaCheck(cudaEventRecord(dev->stall_end[dev->num_stalls++], 0));
        dev->blocking = 0;
    }
}

// selection and warm-up: the CPU-owned parameter columns to the host master (synchronous)
static void zf_cuda_params_to_host(void* ctx, const ZenFlow* zf, float* host) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    zf_cuda_columns_to_host(dev, zf, dev->params_stage, dev->params, host, 1, -1);
}

// resuming with GPU accumulation: the open window's A back into the gradient buffer
static void zf_cuda_grads_from_host(void* ctx, const ZenFlow* zf, const float* host) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    if (zf->cpu_elems == 0) { return; }
    ZfStaging* st = dev->grads_stage;
    if (st == dev->params_stage) { dev->prefetched = 0; }
    zf_cuda_upload(dev, zf, st, host, -1);
    cudaCheck(cudaStreamWaitEvent(0, st->h2d_done, 0));
    zf_cuda_scatter(dev, dev->grads, st->buf, 0, dev->num_sets);
    cudaCheck(cudaEventRecord(st->kernel_done, 0));
    cudaCheck(cudaDeviceSynchronize());
    dev->h2d_bytes += (double)__atomic_exchange_n(&dev->uploaded_bytes, 0LL, __ATOMIC_RELAXED);
}

// The GPU moments' layout (row by row per matrix) to and from zenflow.h's (column by
// column); the vectors are the same in both. Host loops: this runs only at a selection or a
// checkpoint, on all threads (k of the model's moments: 1.2 GB at GPT-2 1.5B), each thread
// writing whole columns, or whole rows, of its own. Also used by dev/cuda/zenflow_host.cu.
static void zf_moments_rows_to_columns(const ZenFlow* zf, const float* rows, float* cols) {
    memcpy(cols, rows, zf->vector_elems * sizeof(float));
    for (int i = 0; i < zf->num_matrices; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        size_t base = zf->vector_elems + mat->gpu_offset;
#pragma omp parallel for schedule(static)
        for (int r = 0; r < mat->n_sel; r++) {
            for (int o = 0; o < mat->rows; o++) {
                cols[base + (size_t)r * mat->rows + o] = rows[base + (size_t)o * mat->n_sel + r];
            }
        }
    }
}

static void zf_moments_columns_to_rows(const ZenFlow* zf, const float* cols, float* rows) {
    memcpy(rows, cols, zf->vector_elems * sizeof(float));
    for (int i = 0; i < zf->num_matrices; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        size_t base = zf->vector_elems + mat->gpu_offset;
#pragma omp parallel for schedule(static)
        for (int o = 0; o < mat->rows; o++) {
            for (int r = 0; r < mat->n_sel; r++) {
                rows[base + (size_t)o * mat->n_sel + r] = cols[base + (size_t)r * mat->rows + o];
            }
        }
    }
}

static void zf_cuda_moments_to_host(void* ctx, const ZenFlow* zf, float* m, float* v) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    size_t n = zf->vector_elems + zf->gpu_sel_elems;
    float* device_bufs[2] = {dev->m, dev->v};
    float* host_bufs[2] = {m, v};
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMemcpy(dev->host_moments, device_bufs[i], n * sizeof(float), cudaMemcpyDeviceToHost));
        zf_moments_rows_to_columns(zf, dev->host_moments, host_bufs[i]);
    }
    dev->d2h_bytes += 2.0 * n * sizeof(float);
}

static void zf_cuda_moments_from_host(void* ctx, const ZenFlow* zf, const float* m, const float* v) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    size_t n = zf->vector_elems + zf->gpu_sel_elems;
    float* device_bufs[2] = {dev->m, dev->v};
    const float* host_bufs[2] = {m, v};
    for (int i = 0; i < 2; i++) {
        zf_moments_columns_to_rows(zf, host_bufs[i], dev->host_moments);
        // pageable source: the call returns once the host buffer may be reused
        cudaCheck(cudaMemcpy(device_bufs[i], dev->host_moments, n * sizeof(float), cudaMemcpyHostToDevice));
    }
    dev->h2d_bytes += 2.0 * n * sizeof(float);
}

// ----------------------------------------------------------------------------
// setup, teardown, and what the trainer reads

// pins a host buffer of zenflow.h that asynchronous copies use, and gives it a fence
static void zf_cuda_add_fence(ZfCudaDevice* dev, const float* host, size_t bytes, int pin) {
    if (host == NULL) { return; }
    if (dev->num_fences == ZF_MAX_FENCES) { fatal("zenflow.cuh: too many host buffers (ZF_MAX_FENCES)"); }
    ZfFence* f = &dev->fences[dev->num_fences++];
    f->host = host;
    f->bytes = bytes;
    f->pinned = 0;
    cudaCheck(cudaEventCreateWithFlags(&f->done, ZF_WAITED_EVENT));
    if (pin && bytes > 0) {
        cudaError_t err = cudaHostRegister((void*)host, bytes, cudaHostRegisterDefault);
        if (err == cudaSuccess) {
            f->pinned = 1;
            dev->pinned_bytes += bytes;
        } else {
            cudaGetLastError();  // clear it: the copies still work, only not overlapped
            fprintf(stderr, "warning: could not pin %.1f MiB of host memory (%s): transfers will not "
                    "overlap with compute (hint: free host memory, or raise the locked-memory limit)\n",
                    bytes / 1048576.0, cudaGetErrorString(err));
        }
    }
}

static void zf_cuda_staging_init(ZfStaging* st, size_t floats) {
    st->buf = floats > 0 ? cuda_malloc(floats * sizeof(float), "ZenFlow staging buffer") : NULL;
    cudaCheck(cudaEventCreateWithFlags(&st->kernel_done, ZF_WAITED_EVENT));
    cudaCheck(cudaEventCreateWithFlags(&st->d2h_done, ZF_WAITED_EVENT));
    cudaCheck(cudaEventCreateWithFlags(&st->h2d_done, ZF_WAITED_EVENT));
}

static void zf_cuda_staging_free(ZfStaging* st) {
    cudaCheck(cudaFree(st->buf));
    cudaCheck(cudaEventDestroy(st->kernel_done));
    cudaCheck(cudaEventDestroy(st->d2h_done));
    cudaCheck(cudaEventDestroy(st->h2d_done));
}

// ZenFlow over a model's parameter and gradient buffers (device, file layout); free with
// zenflow_cuda_free. The ZenFlow config is zenflow.h's (zf->cfg is the effective one).
static void zenflow_cuda_init(ZenFlow* zf, ZfCudaDevice* dev, float* params, float* grads,
                              const GPT2Config* model, ZfConfig cfg) {
    memset(dev, 0, sizeof(*dev));
    dev->params = params;
    dev->grads = grads;
    dev->num_parameters = gpt2_num_params(model);
    ZfBackend be;
    memset(&be, 0, sizeof(be));
    be.ctx = dev;
    be.column_scores = zf_cuda_column_scores;
    be.selection_changed = zf_cuda_selection_changed;
    be.zero_grads = zf_cuda_zero_grads;
    be.gpu_adam = zf_cuda_gpu_adam;
    be.grads_to_host = zf_cuda_grads_to_host;
    be.grads_from_host = zf_cuda_grads_from_host;
    be.params_to_host = zf_cuda_params_to_host;
    be.params_prefetch = zf_cuda_params_prefetch;
    be.params_from_host = zf_cuda_params_from_host;
    be.moments_to_host = zf_cuda_moments_to_host;
    be.moments_from_host = zf_cuda_moments_from_host;
    be.host_wait = zf_cuda_host_wait;
    be.host_blocks = zf_cuda_host_blocks;
    be.abs_sums = zf_cuda_abs_sums;
    be.abs_sums_wait = zf_cuda_abs_sums_wait;
    be.traces_device = 1;  // llmc/cuda_trace.cuh: event-timed spans
    zf_init(zf, cfg, model, be);
    const ZfConfig* c = &zf->cfg;

    // ownership tables
    dev->num_sets = zf->num_matrices;
    for (int i = 0; i < zf->num_matrices; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        if ((long long)mat->rows * mat->cols >= (1LL << 31)) {
            fatal("zenflow.cuh: matrix %s has %d x %d elements, more than the kernels index with int",
                    mat->name, mat->rows, mat->cols);
        }
        dev->total_cols += mat->cols;
        dev->max_cols = mat->cols > dev->max_cols ? mat->cols : dev->max_cols;
    }
    size_t n = dev->num_sets;
    dev->cpu_sets = (ZfColumnSet*)cuda_malloc(n * sizeof(ZfColumnSet), "ZenFlow column sets");
    dev->gpu_sets = (ZfColumnSet*)cuda_malloc(n * sizeof(ZfColumnSet), "ZenFlow column sets");
    dev->cpu_tiles = (long long*)cuda_malloc((n + 1) * sizeof(long long), "ZenFlow column sets");
    dev->gpu_chunks = (long long*)cuda_malloc((n + 1) * sizeof(long long), "ZenFlow column sets");
    dev->cpu_chunks = (long long*)cuda_malloc((n + 1) * sizeof(long long), "ZenFlow column sets");
    dev->order = (int*)cuda_malloc(dev->total_cols * sizeof(int), "ZenFlow column order");
    dev->h_cpu_sets = (ZfColumnSet*)callocCheck(n, sizeof(ZfColumnSet));
    dev->h_gpu_sets = (ZfColumnSet*)callocCheck(n, sizeof(ZfColumnSet));
    dev->h_cpu_tiles = (long long*)callocCheck(n + 1, sizeof(long long));
    dev->h_gpu_chunks = (long long*)callocCheck(n + 1, sizeof(long long));
    dev->h_cpu_chunks = (long long*)callocCheck(n + 1, sizeof(long long));
    dev->h_order = (int*)callocCheck(dev->total_cols, sizeof(int));

    // the GPU's optimizer state (zero, like every moment before the first step)
    size_t g = zf->vector_elems + zf->gpu_capacity;
    dev->m = cuda_malloc(g * sizeof(float), "ZenFlow GPU moments m");
    dev->v = cuda_malloc(g * sizeof(float), "ZenFlow GPU moments v");
    cudaCheck(cudaMemset(dev->m, 0, g * sizeof(float)));
    cudaCheck(cudaMemset(dev->v, 0, g * sizeof(float)));
    dev->host_moments = (float*)mallocCheck(g * sizeof(float));
    dev->scores = cuda_malloc(dev->max_cols * sizeof(float), "ZenFlow column scores");
    if (c->update_interval == ZF_AUTO) {  // spec 6's sums: chunks of either side, at most
        size_t most = (zf->gpu_capacity > zf->cpu_capacity ? zf->gpu_capacity : zf->cpu_capacity) / ZF_CHUNK + n;
        dev->abs_partial = (double*)cuda_malloc(most * sizeof(double), "ZenFlow auto U sums");
        dev->abs_host = (double*)mapped_alloc(2 * n * sizeof(double), &dev->abs_mapped, "ZenFlow auto U sums");
    }
    cudaCheck(cudaEventCreateWithFlags(&dev->abs_done, ZF_WAITED_EVENT));
    dev->score_partial = cuda_malloc((size_t)COLSUM_MAX_CHUNKS * dev->max_cols * sizeof(float),
                                     "ZenFlow column scores");

    // transfers: two staging buffers where both directions are busy at once: with overlap, a
    // window's result waits in one (prefetched) while gradients leave through the other
    // (every step with CPU accumulation; at the boundary's backward with GPU accumulation
    // and per-layer pipelining)
    cudaCheck(cudaStreamCreateWithFlags(&dev->d2h, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&dev->h2d, cudaStreamNonBlocking));
    int two = c->overlap;
    zf_cuda_staging_init(&dev->staging[0], zf->cpu_capacity);
    zf_cuda_staging_init(&dev->staging[1], two ? zf->cpu_capacity : 0);
    dev->grads_stage = &dev->staging[0];
    dev->params_stage = two ? &dev->staging[1] : &dev->staging[0];
    dev->staging_bytes = (two ? 2 : 1) * zf->cpu_capacity * sizeof(float);
    // host buffers that asynchronous copies touch; pinned where they carry the traffic
    size_t bytes = zf->cpu_capacity * sizeof(float);
    int gpu_acc = c->accumulate == ZF_ACCUMULATE_GPU;
    zf_cuda_add_fence(dev, zf->master, bytes, 1);
    zf_cuda_add_fence(dev, zf->acc, bytes, gpu_acc);
    zf_cuda_add_fence(dev, zf->acc_job, bytes, gpu_acc && c->overlap);
    zf_cuda_add_fence(dev, zf->grad_stage[0], bytes, 1);
    zf_cuda_add_fence(dev, zf->grad_stage[1], bytes, 1);

    cudaCheck(cudaEventCreate(&dev->step_begin));
    cudaCheck(cudaEventCreateWithFlags(&dev->step_end, cudaEventBlockingSync));  // waited for every step
    for (int i = 0; i < ZF_MAX_STALLS; i++) {
        cudaCheck(cudaEventCreate(&dev->stall_begin[i]));
        cudaCheck(cudaEventCreate(&dev->stall_end[i]));
    }
}

static void zenflow_cuda_free(ZenFlow* zf, ZfCudaDevice* dev) {
    zf_wait(zf);  // no job may touch the device or a pinned buffer any more
    cudaCheck(cudaDeviceSynchronize());
    for (int i = 0; i < dev->num_fences; i++) {
        if (dev->fences[i].pinned) { cudaCheck(cudaHostUnregister((void*)dev->fences[i].host)); }
        cudaCheck(cudaEventDestroy(dev->fences[i].done));
    }
    zf_free(zf);
    zf_cuda_staging_free(&dev->staging[0]);
    zf_cuda_staging_free(&dev->staging[1]);
    cudaCheck(cudaStreamDestroy(dev->d2h));
    cudaCheck(cudaStreamDestroy(dev->h2d));
    cudaCheck(cudaEventDestroy(dev->step_begin));
    cudaCheck(cudaEventDestroy(dev->step_end));
    for (int i = 0; i < ZF_MAX_STALLS; i++) {
        cudaCheck(cudaEventDestroy(dev->stall_begin[i]));
        cudaCheck(cudaEventDestroy(dev->stall_end[i]));
    }
    cudaCheck(cudaEventDestroy(dev->abs_done));
    mapped_free(dev->abs_host);
    void* device_bufs[] = {dev->cpu_sets, dev->gpu_sets, dev->cpu_tiles, dev->gpu_chunks, dev->cpu_chunks, dev->order,
                           dev->m, dev->v, dev->scores, dev->score_partial, dev->abs_partial};
    for (void* p : device_bufs) { cudaCheck(cudaFree(p)); }
    void* host_bufs[] = {dev->h_cpu_sets, dev->h_gpu_sets, dev->h_cpu_tiles, dev->h_gpu_chunks, dev->h_cpu_chunks,
                         dev->h_order, dev->host_moments};
    for (void* p : host_bufs) { free(p); }
    memset(dev, 0, sizeof(*dev));
}

// Step measurement: call zf_cuda_step_begin before the step's forward pass and
// zf_cuda_step_end after zf_step; step_end waits for the default stream (not for copies
// still running on the others: they belong to the next step's overlap).
static void zf_cuda_step_begin(ZfCudaDevice* dev, const ZenFlow* zf) {
    dev->num_stalls = 0;
    dev->blocking = 0;
    dev->d2h_bytes = dev->h2d_bytes = 0.0;
    dev->cpu_ms_at_begin = zf_cpu_work_ms(zf);
    cudaCheck(cudaEventRecord(dev->step_begin, 0));
}

static ZfStepStats zf_cuda_step_end(ZfCudaDevice* dev, const ZenFlow* zf) {
    cudaCheck(cudaEventRecord(dev->step_end, 0));
    cudaCheck(cudaEventSynchronize(dev->step_end));
    ZfStepStats st;
    memset(&st, 0, sizeof(st));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, dev->step_begin, dev->step_end));
    st.gpu_ms = ms;
    for (int i = 0; i < dev->num_stalls; i++) {
        cudaCheck(cudaEventElapsedTime(&ms, dev->stall_begin[i], dev->stall_end[i]));
        st.stall_ms += ms;
    }
    st.compute_ms = st.gpu_ms - st.stall_ms;
    st.cpu_ms = zf_cpu_work_ms(zf) - dev->cpu_ms_at_begin;
    st.d2h_bytes = dev->d2h_bytes;
    st.h2d_bytes = dev->h2d_bytes;
    return st;
}

// the ZenFlow lines of the trainer's memory table (MiB)
static void zenflow_cuda_print_memory(const ZfCudaDevice* dev, const ZenFlow* zf) {
    const double MiB = 1048576.0;
    size_t g = zf->vector_elems + zf->gpu_capacity, c = zf->cpu_capacity;
    printf("[memory] GPU %-34s %10.1f MiB  (m, v of the vectors + k of every matrix)\n", "optimizer state",
           2.0 * g * sizeof(float) / MiB);
    printf("[memory] GPU %-34s %10.1f MiB\n", "transfer staging", dev->staging_bytes / MiB);
    printf("[memory] host %-33s %10.1f MiB  (the CPU-owned elements)\n", "master + m + v",
           3.0 * c * sizeof(float) / MiB);
    size_t stages = (zf->grad_stage[0] != NULL) + (zf->grad_stage[1] != NULL);
    printf("[memory] host %-33s %10.1f MiB  (pinned %.1f MiB)\n", "accumulators + staging",
           (2.0 + stages) * c * sizeof(float) / MiB, dev->pinned_bytes / MiB);
    printf("[memory] host %-33s %10.1f MiB  (used at reselections)\n", "migration scratch",
           (2.0 * c + 4.0 * g) * sizeof(float) / MiB);
}

#endif  // ZENFLOW_CUH
