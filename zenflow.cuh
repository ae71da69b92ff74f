/*
ZenFlow on the GPU: the CUDA backend (ZfBackend) of zenflow.h's orchestration.

zenflow.h decides WHAT happens in a step (docs/zenflow_spec.md section 4); this file says how
a GPU does each part, in the order zf_step calls it: zeroing the gradients before the backward
(7), the selection's column scores and moments (4.2), AdamW on the GPU-owned columns (4.3),
the CPU-owned gradient columns to the host (4.4), the CPU's result back into the model (4.6);
then auto U's sums (6), setup, and the stall measurement (8).

The device sees each matrix's columns as two COLUMN SETS (ZfColumnSet): the GPU's selected
columns and the CPU's others, their indices in `order` (zenflow.h's cols_by_owner of every
matrix, back to back). An element is W[o, col_r], col_r the set's r-th column; packed:
    CPU side, and the device staging buffers:  packed[cpu_offset + r * rows + o]   (by column)
    GPU moments m, v, after all the vectors:   m[vector_elems + gpu_offset + o * n_sel + r]
By row on the GPU, so that the AdamW kernel walks W's rows in order (with k = 1 every access
is contiguous); zenflow.h sees those moments only through moments_to_host and _from_host,
which transpose on the host. The vectors (always GPU-owned) are column sets too, of one
column each, with their moments first in m and v: one more grid, so that their AdamW and
their zeroing are one launch each, by the same kernels as the matrices' columns.

Streams: the default stream runs forward, backward, zeroing, AdamW, gather and scatter; the
d2h stream copies staging -> host (the gradient columns every step, or A once a window), the
h2d stream host -> staging (the CPU's result, once a window). A staging buffer remembers, by
events, the last kernel that used it and its last copy out and in; a host buffer its last copy
(ZfFence), which host_wait waits for. docs/teaching.md ("Inside the code") draws one window's
timeline and says why the staging buffers are full size.

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

// One side's sets as a kernel takes them: one flat grid of blocks over all sets, set s from
// block start[s] on, start[num_sets] blocks in all (a block is a tile or a chunk, below)
typedef struct {
    const ZfColumnSet* sets;  // (num_sets) device
    const long long* start;   // (num_sets + 1) device
    int num_sets;
    const int* order;         // (every matrix's cols) device
} ZfGrid;

#define ZF_TILE 32               // gather / scatter move 32 x 32 tiles ...
#define ZF_TILE_ROWS 8           // ... with blocks of 32 x 8 threads
#define ZF_BLOCK 256             // threads of the element-wise kernels
#define ZF_CHUNK (4 * ZF_BLOCK)  // elements per block of the element-wise kernels

// the set of block b: the last s with start[s] <= b (an empty set, start[s] == start[s + 1],
// is never found)
__device__ inline int zf_find_set(const long long* start, int num_sets, long long b) {
    int lo = 0, hi = num_sets - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (start[mid] <= b) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// The prologue of every element-wise kernel over the GPU-owned columns: this block's chunk
// of ZF_CHUNK elements of one set, taken row by row (so consecutive threads read W's row o
// left to right, and m, v in order).
typedef struct {
    ZfColumnSet set;
    const int* cols;  // the set's columns
    int base;         // the chunk's first element
} ZfChunk;

__device__ inline ZfChunk zf_chunk_of_block(ZfGrid g) {
    int s = zf_find_set(g.start, g.num_sets, blockIdx.x);
    ZfChunk c = {g.sets[s], g.order + g.sets[s].list_offset, (int)(blockIdx.x - g.start[s]) * ZF_CHUNK};
    return c;
}

// element base + j of the chunk, (row o, set column r): *at = W[o, col_r] in the full
// buffer, *k = its packed moment; 0 past the set's end
__device__ inline int zf_chunk_element(const ZfChunk& c, int j, size_t* at, size_t* k) {
    int i = c.base + j;
    if (i >= c.set.count * c.set.rows) { return 0; }
    int o = i / c.set.count, r = i % c.set.count;
    *at = c.set.full_offset + (size_t)o * c.set.cols + c.cols[r];
    *k = c.set.packed_offset + (size_t)o * c.set.count + r;
    return 1;
}

// ----------------------------------------------------------------------------
// the backend's state

// events only waited for, never timed; a host thread that waits for one sleeps (see
// cuda_init_device: without cudaEventBlockingSync, cudaEventSynchronize spins)
#define ZF_WAITED_EVENT (cudaEventDisableTiming | cudaEventBlockingSync)
#define ZF_MAX_FENCES 8    // host buffers that copies use: master, acc, acc_job, 2 staging
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

typedef struct {
    float* params;  // (num_parameters) device: the working copy, file layout
    float* grads;   // (num_parameters) device
    size_t num_parameters;
    int num_sets;    // = zf->num_matrices
    int total_cols;  // sum of every matrix's cols (the length of order)
    int max_cols;
    // ownership (selection_changed): the column sets on the device, their host mirrors h_*,
    // and the three grids over them: the GPU's sets by chunks (AdamW, zeroing, auto U), the
    // CPU's by tiles (gather, scatter) and by chunks (auto U)
    ZfColumnSet *cpu_sets, *gpu_sets, *h_cpu_sets, *h_gpu_sets;  // (num_sets)
    long long *gpu_chunks, *cpu_tiles, *cpu_chunks;              // (num_sets + 1)
    long long *h_gpu_chunks, *h_cpu_tiles, *h_cpu_chunks;
    int *order, *h_order;  // (total_cols)
    ZfGrid gpu_grid, cpu_tile_grid, cpu_chunk_grid;
    // the vectors' grid, built once (they never change owner): vector i is a set of rows = n,
    // cols = 1, its one column 0 (vector_order = {0}), its moments at m[the earlier vectors' n]
    ZfColumnSet* vector_sets;   // (num_vectors) device
    long long* vector_chunks;   // (num_vectors + 1) device
    int* vector_order;          // (1) device
    ZfGrid vector_grid;
    long long vector_blocks;    // chunks of all vectors: the grid's blocks
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
                              // unless overlap keeps both busy at once
    int prefetched;           // params_stage holds the master already (params_prefetch)
    long long uploaded_bytes;  // host-to-device bytes of zf_cuda_upload's copies not yet counted
                               // in a step's h2d_bytes (the updater thread adds too: atomic)
    ZfFence fences[ZF_MAX_FENCES];
    int num_fences;
    size_t staging_bytes, pinned_bytes;
    // measurement (main thread only; the last section of this file)
    cudaEvent_t step_begin, step_end;
    cudaEvent_t stall_begin[ZF_MAX_STALLS], stall_end[ZF_MAX_STALLS];
    int num_stalls;
    int blocking;  // inside host_blocks: stream waits are part of that interval
    double d2h_bytes, h2d_bytes, cpu_ms_at_begin;
} ZfCudaDevice;

// the default stream waits for an event, timed as a stall (the last section)
static void zf_cuda_compute_waits(ZfCudaDevice* dev, cudaEvent_t event);

// ----------------------------------------------------------------------------
// before the backward pass (spec 7): zero the gradients, or with accumulation on the GPU
// inside a window only the GPU-owned ones (the vectors, then the selected columns: one
// launch each)

__global__ void zf_zero_columns_kernel(float* __restrict__ grads,  // (num_parameters)
                                       ZfGrid sets) {
    ZfChunk chunk = zf_chunk_of_block(sets);
    for (int j = threadIdx.x; j < ZF_CHUNK; j += ZF_BLOCK) {
        size_t at, k;
        if (zf_chunk_element(chunk, j, &at, &k)) { grads[at] = 0.0f; }
    }
}

// zero the gradients of a grid's sets; blocks: the grid's chunks
static void zf_cuda_zero_columns(ZfCudaDevice* dev, ZfGrid grid, long long blocks) {
    if (blocks == 0) { return; }
    zf_zero_columns_kernel<<<(unsigned)blocks, ZF_BLOCK>>>(dev->grads, grid);
    cudaCheck(cudaGetLastError());
}

static void zf_cuda_zero_grads(void* ctx, const ZenFlow* zf, int all) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    (void)zf;
    if (all) {
        cudaCheck(cudaMemsetAsync(dev->grads, 0, dev->num_parameters * sizeof(float), 0));
        return;
    }
    zf_cuda_zero_columns(dev, dev->vector_grid, dev->vector_blocks);
    zf_cuda_zero_columns(dev, dev->gpu_grid, dev->h_gpu_chunks[dev->num_sets]);
}

// ----------------------------------------------------------------------------
// selection (spec 4.2): the column scores, the new column sets, the moments both ways

// 4.2.2 scores[j] = sum over rows of g[o, j]^2 of one matrix (llmc/cuda_kernels.cuh's column
// sums: the order depends only on the shape, so the scores are deterministic), to the host
static void zf_cuda_column_scores(void* ctx, const ZfMatrix* mat, float* scores) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    int span = gpu_trace_begin(0);
    cudaCheck(cudaMemsetAsync(dev->scores, 0, mat->cols * sizeof(float), 0));
    column_sums(dev->scores, dev->score_partial, dev->grads + mat->offset, mat->rows, mat->cols, 1);
    gpu_trace_end(span, 0, TRACE_COMPUTE, "column scores");
    cudaCheck(cudaMemcpy(scores, dev->scores, mat->cols * sizeof(float), cudaMemcpyDeviceToHost));
    dev->d2h_bytes += (double)mat->cols * sizeof(float);
}

// tiles of a set (32 set columns x 32 rows each), and chunks (ZF_CHUNK elements each)
static long long zf_num_tiles(const ZfColumnSet& s) {
    return (long long)((s.count + ZF_TILE - 1) / ZF_TILE) * ((s.rows + ZF_TILE - 1) / ZF_TILE);
}

static long long zf_num_chunks(const ZfColumnSet& s) {
    return ((long long)s.count * s.rows + ZF_CHUNK - 1) / ZF_CHUNK;
}

// 4.2.4 the new ownership as column sets: built on the host, then copied to the device
static void zf_cuda_selection_changed(void* ctx, const ZenFlow* zf) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    const int n = dev->num_sets;
    int at = 0;
    dev->h_cpu_tiles[0] = dev->h_gpu_chunks[0] = dev->h_cpu_chunks[0] = 0;
    for (int i = 0; i < n; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        memcpy(dev->h_order + at, mat->cols_by_owner, mat->cols * sizeof(int));
        ZfColumnSet g = {mat->offset, mat->gpu_offset, mat->rows, mat->cols, mat->n_sel, at};
        ZfColumnSet c = {mat->offset, mat->cpu_offset, mat->rows, mat->cols, mat->cols - mat->n_sel, at + mat->n_sel};
        dev->h_gpu_sets[i] = g;
        dev->h_cpu_sets[i] = c;
        dev->h_gpu_chunks[i + 1] = dev->h_gpu_chunks[i] + zf_num_chunks(g);
        dev->h_cpu_tiles[i + 1] = dev->h_cpu_tiles[i] + zf_num_tiles(c);
        dev->h_cpu_chunks[i + 1] = dev->h_cpu_chunks[i] + zf_num_chunks(c);
        at += mat->cols;
    }
    if (dev->h_cpu_tiles[n] >= (1LL << 31) || dev->h_gpu_chunks[n] >= (1LL << 31) || dev->h_cpu_chunks[n] >= (1LL << 31)) {
        fatal("zenflow.cuh: the model is too large for one grid of tiles (hint: a smaller model)");
    }
    // synchronous copies on the default stream: kernels still reading the old sets finish first
    cudaCheck(cudaMemcpy(dev->cpu_sets, dev->h_cpu_sets, n * sizeof(ZfColumnSet), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->gpu_sets, dev->h_gpu_sets, n * sizeof(ZfColumnSet), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->cpu_tiles, dev->h_cpu_tiles, (n + 1) * sizeof(long long), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->gpu_chunks, dev->h_gpu_chunks, (n + 1) * sizeof(long long), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->cpu_chunks, dev->h_cpu_chunks, (n + 1) * sizeof(long long), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->order, dev->h_order, dev->total_cols * sizeof(int), cudaMemcpyHostToDevice));
}

// The GPU moments' layout (row by row per matrix) to zenflow.h's (column by column), or back
// (to_rows = 1); the vectors are the same in both. On the host, only at a selection or a
// checkpoint, on all threads (k of the model's moments: 1.2 GB at GPT-2 1.5B), each thread
// writing whole columns (or rows) of its own.
static void zf_moments_transpose(const ZenFlow* zf, const float* src, float* dst, int to_rows) {
    memcpy(dst, src, zf->vector_elems * sizeof(float));
    for (int i = 0; i < zf->num_matrices; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        const size_t base = zf->vector_elems + mat->gpu_offset;
        const int outer = to_rows ? mat->rows : mat->n_sel, inner = to_rows ? mat->n_sel : mat->rows;
#pragma omp parallel for schedule(static)
        for (int a = 0; a < outer; a++) {
            for (int b = 0; b < inner; b++) {
                const int o = to_rows ? a : b, r = to_rows ? b : a;  // row o of set column r
                const size_t by_row = base + (size_t)o * mat->n_sel + r, by_col = base + (size_t)r * mat->rows + o;
                dst[to_rows ? by_row : by_col] = src[to_rows ? by_col : by_row];
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
        zf_moments_transpose(zf, dev->host_moments, host_bufs[i], 0);
    }
    dev->d2h_bytes += 2.0 * n * sizeof(float);
}

static void zf_cuda_moments_from_host(void* ctx, const ZenFlow* zf, const float* m, const float* v) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    size_t n = zf->vector_elems + zf->gpu_sel_elems;
    float* device_bufs[2] = {dev->m, dev->v};
    const float* host_bufs[2] = {m, v};
    for (int i = 0; i < 2; i++) {
        zf_moments_transpose(zf, host_bufs[i], dev->host_moments, 1);
        // pageable source: the call returns once the host buffer may be reused
        cudaCheck(cudaMemcpy(device_bufs[i], dev->host_moments, n * sizeof(float), cudaMemcpyHostToDevice));
    }
    dev->h2d_bytes += 2.0 * n * sizeof(float);
}

// ----------------------------------------------------------------------------
// 4.3 AdamW on the GPU-owned elements

// one thread per element of a grid's sets: the selected columns (m, v: after the vectors'
// moments), or the vectors (m, v: their moments, at the start)
__global__ void zf_adam_columns_kernel(float* __restrict__ params,       // (num_parameters)
                                       const float* __restrict__ grads,  // (num_parameters)
                                       float* __restrict__ m,            // (the grid's elements) row by row
                                       float* __restrict__ v,            // (the grid's elements)
                                       ZfGrid sets, AdamWConsts c) {
    ZfChunk chunk = zf_chunk_of_block(sets);
    for (int j = threadIdx.x; j < ZF_CHUNK; j += ZF_BLOCK) {
        size_t at, k;
        if (zf_chunk_element(chunk, j, &at, &k)) { adamw_one(params + at, m + k, v + k, grads[at], c); }
    }
}

// AdamW on the elements of a grid's sets, their moments m, v; blocks: the grid's chunks
static void zf_cuda_adam_columns(ZfCudaDevice* dev, ZfGrid grid, long long blocks, float* m, float* v,
                                 AdamWConsts c) {
    if (blocks == 0) { return; }
    zf_adam_columns_kernel<<<(unsigned)blocks, ZF_BLOCK>>>(dev->params, dev->grads, m, v, grid, c);
    cudaCheck(cudaGetLastError());
}

// AdamW (spec 3.1) on every GPU-owned element: the vectors (no weight decay, spec 1) in one
// launch, then the selected columns of every matrix in another
static void zf_cuda_gpu_adam(void* ctx, const ZenFlow* zf, ZfAdamHyper h, int step) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    int span = gpu_trace_begin(0);
    AdamWConsts vectors = adamw_consts(h.lr, h.beta1, h.beta2, h.eps, 0.0f, step);
    zf_cuda_adam_columns(dev, dev->vector_grid, dev->vector_blocks, dev->m, dev->v, vectors);
    AdamWConsts matrices = adamw_consts(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, step);
    zf_cuda_adam_columns(dev, dev->gpu_grid, dev->h_gpu_chunks[dev->num_sets], dev->m + zf->vector_elems,
                         dev->v + zf->vector_elems, matrices);
    gpu_trace_end(span, 0, TRACE_COMPUTE, "GPU-side AdamW");
}

// ----------------------------------------------------------------------------
// 4.4 the CPU-owned columns to the host: gather into a staging buffer on the default
// stream, copy out on the d2h stream

// the tile of block b of a tiled kernel: set columns r0.., rows o0..
typedef struct {
    ZfColumnSet set;
    const int* cols;  // the set's columns
    int r0, o0;
} ZfTile;

__device__ inline ZfTile zf_tile_of_block(ZfGrid g, long long b) {
    int s = zf_find_set(g.start, g.num_sets, b);
    ZfTile t;
    t.set = g.sets[s];
    t.cols = g.order + t.set.list_offset;
    long long tile = b - g.start[s], tiles_r = (t.set.count + ZF_TILE - 1) / ZF_TILE;
    t.r0 = (int)(tile % tiles_r) * ZF_TILE;
    t.o0 = (int)(tile / tiles_r) * ZF_TILE;
    return t;
}

// The CPU-owned columns of W (gradients, or parameters) into the packed CPU layout: a
// transpose by 32 x 32 tiles through shared memory, so that both the reads of W (by rows)
// and the writes of the packed buffer (by columns) are 32 consecutive floats per warp where
// the layouts allow it. Block (32, 8), one tile per block; the grid may cover only some of
// the sets (per-layer pipelining): block b does tile first_tile + b of the flat numbering.
__global__ void zf_gather_columns_kernel(float* __restrict__ packed,      // (cpu_elems) column by column
                                         const float* __restrict__ full,  // (num_parameters)
                                         ZfGrid cpu, long long first_tile) {
    __shared__ float tile[ZF_TILE][ZF_TILE + 1];  // +1: the column reads hit 32 different banks
    const ZfTile t = zf_tile_of_block(cpu, first_tile + blockIdx.x);
    const int tx = threadIdx.x, ty = threadIdx.y;
    // a warp reads 32 set columns of one row of W (ascending, mostly adjacent)
    if (t.r0 + tx < t.set.count) {
        for (int j = ty; j < ZF_TILE && t.o0 + j < t.set.rows; j += ZF_TILE_ROWS) {
            tile[j][tx] = full[t.set.full_offset + (size_t)(t.o0 + j) * t.set.cols + t.cols[t.r0 + tx]];
        }
    }
    __syncthreads();
    // a warp writes 32 consecutive rows of one packed column
    if (t.o0 + tx < t.set.rows) {
        for (int j = ty; j < ZF_TILE && t.r0 + j < t.set.count; j += ZF_TILE_ROWS) {
            packed[t.set.packed_offset + (size_t)(t.r0 + j) * t.set.rows + t.o0 + tx] = tile[tx][j];
        }
    }
}

// A transfer moves the CPU-owned columns of some matrices (zenflow.h's transfer group; -1:
// all) as RUNS of consecutive matrices [i0, i1), each one gather or scatter launch and one
// copy, since a run's packed columns are one range. Walks the runs of mats[0 .. count):
// returns 0 when done.
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

// the CPU-owned columns of matrices [i0, i1) of `full` into the packed buffer
static void zf_cuda_gather(ZfCudaDevice* dev, float* packed, const float* full, int i0, int i1) {
    long long first = dev->h_cpu_tiles[i0], tiles = dev->h_cpu_tiles[i1] - first;
    if (tiles == 0) { return; }
    zf_gather_columns_kernel<<<(unsigned)tiles, dim3(ZF_TILE, ZF_TILE_ROWS)>>>(packed, full, dev->cpu_tile_grid, first);
    cudaCheck(cudaGetLastError());
}

static ZfFence* zf_cuda_fence(ZfCudaDevice* dev, const float* host) {
    for (int i = 0; i < dev->num_fences; i++) {
        if (dev->fences[i].host == host) { return &dev->fences[i]; }
    }
    return NULL;
}

// The CPU-owned columns of transfer group `group` (-1: all) of `full` (params or grads) to
// `host`: gather into the staging buffer, copy out on the d2h stream. Asynchronous unless
// `sync`. The events of the staging buffer and of `host` then stand for this copy.
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

// the gradient columns (accumulation on the CPU: g_t, every step; on the GPU: A, at the
// window's end), asynchronously; all, or one layer's
static void zf_cuda_grads_to_host(void* ctx, const ZenFlow* zf, float* host, int group) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    zf_cuda_columns_to_host(dev, zf, dev->grads_stage, dev->grads, host, 0, group);
}

// selection and warm-up: the CPU-owned parameter columns to the host master (synchronous)
static void zf_cuda_params_to_host(void* ctx, const ZenFlow* zf, float* host) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    zf_cuda_columns_to_host(dev, zf, dev->params_stage, dev->params, host, 1, -1);
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

// ----------------------------------------------------------------------------
// 4.6 apply: the CPU's result back into the working copy: copy in on the h2d stream (from
// the updater thread as soon as the update is done: the prefetch), scatter on the default
// stream at the boundary

// the gather's inverse: packed column r0 + j, row o0 + tx -> W[o0 + j, col(r0 + tx)]
__global__ void zf_scatter_columns_kernel(float* __restrict__ full,          // (num_parameters)
                                          const float* __restrict__ packed,  // (cpu_elems)
                                          ZfGrid cpu, long long first_tile) {
    __shared__ float tile[ZF_TILE][ZF_TILE + 1];
    const ZfTile t = zf_tile_of_block(cpu, first_tile + blockIdx.x);
    const int tx = threadIdx.x, ty = threadIdx.y;
    if (t.o0 + tx < t.set.rows) {
        for (int j = ty; j < ZF_TILE && t.r0 + j < t.set.count; j += ZF_TILE_ROWS) {
            tile[j][tx] = packed[t.set.packed_offset + (size_t)(t.r0 + j) * t.set.rows + t.o0 + tx];
        }
    }
    __syncthreads();
    if (t.r0 + tx < t.set.count) {
        for (int j = ty; j < ZF_TILE && t.o0 + j < t.set.rows; j += ZF_TILE_ROWS) {
            full[t.set.full_offset + (size_t)(t.o0 + j) * t.set.cols + t.cols[t.r0 + tx]] = tile[tx][j];
        }
    }
}

static void zf_cuda_scatter(ZfCudaDevice* dev, float* full, const float* packed, int i0, int i1) {
    long long first = dev->h_cpu_tiles[i0], tiles = dev->h_cpu_tiles[i1] - first;
    if (tiles == 0) { return; }
    zf_scatter_columns_kernel<<<(unsigned)tiles, dim3(ZF_TILE, ZF_TILE_ROWS)>>>(full, packed, dev->cpu_tile_grid, first);
    cudaCheck(cudaGetLastError());
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

// on the updater thread right after a window update: its result starts for the device
static void zf_cuda_params_prefetch(void* ctx, const ZenFlow* zf, const float* host) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    cudaCheck(cudaSetDevice(0));  // this thread's current device (the trainer uses device 0)
    zf_cuda_upload(dev, zf, dev->params_stage, host, -1);
    dev->prefetched = 1;  // read by the main thread only after it has waited for this job
}

// The CPU's columns into the working copy, before the next forward pass; all, or
// (pipelining, a synchronous apply) one layer's just before that layer's forward: the
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

// ----------------------------------------------------------------------------
// auto U (spec 6): per matrix the sum of |g| over its GPU-owned elements (and, if cpu is not
// NULL, its CPU-owned ones: with accumulation on the GPU they hold A), on the default stream
// after the backward; the sums reach the host asynchronously

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

// pass 1: partial[b] = sum of |g| over chunk b of the column sets, in double
__global__ void zf_abs_sum_partial_kernel(double* __restrict__ partial,     // (chunks)
                                          const float* __restrict__ grads,  // (num_parameters)
                                          ZfGrid sets) {
    __shared__ double sum[ZF_BLOCK];
    ZfChunk chunk = zf_chunk_of_block(sets);
    double mine = 0.0;
    for (int j = threadIdx.x; j < ZF_CHUNK; j += ZF_BLOCK) {
        size_t at, k;
        if (zf_chunk_element(chunk, j, &at, &k)) { mine += fabs((double)grads[at]); }
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

static void zf_cuda_abs_sums(void* ctx, const ZenFlow* zf, double* sel, double* cpu) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    (void)zf;
    const int n = dev->num_sets;
    int span = gpu_trace_begin(0);
    for (int side = 0; side < (cpu != NULL ? 2 : 1); side++) {
        const ZfGrid grid = side == 0 ? dev->gpu_grid : dev->cpu_chunk_grid;
        long long total = (side == 0 ? dev->h_gpu_chunks : dev->h_cpu_chunks)[n];
        if (total > 0) {
            zf_abs_sum_partial_kernel<<<(unsigned)total, ZF_BLOCK>>>(dev->abs_partial, dev->grads, grid);
            cudaCheck(cudaGetLastError());
        }
        zf_abs_sum_finalize_kernel<<<n, ZF_BLOCK>>>(dev->abs_mapped + side * n, dev->abs_partial, grid.start);
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

// resuming with accumulation on the GPU: the open window's A back into the gradient buffer
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

// ----------------------------------------------------------------------------
// setup and teardown

static void zf_cuda_host_blocks(void* ctx, int begin);

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
        } else if (getenv("ZF_REQUIRE_PINNED") != NULL) {  // the benchmarks: a number without overlap means nothing
            fatal("could not pin %.1f MiB of host memory (%s) (hint: free host memory, or raise the "
                  "locked-memory limit: ulimit -l)", bytes / 1048576.0, cudaGetErrorString(err));
        } else {
            cudaGetLastError();  // clear it: the copies still work, but each one blocks the launch thread
            fprintf(stderr, "WARNING: could not pin %.1f MiB of host memory (%s): every copy to it blocks "
                    "the thread that launches the GPU's work, and nothing overlaps (hint: free host memory, or "
                    "raise the locked-memory limit: ulimit -l)\n", bytes / 1048576.0, cudaGetErrorString(err));
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

// the vectors' grid (see the top): vector i is a set of one column, 0, of n rows, its
// moments after those of vectors 0 .. i-1
static void zf_cuda_vector_grid(ZfCudaDevice* dev, const ZenFlow* zf) {
    const int n = zf->num_vectors;
    ZfColumnSet* sets = (ZfColumnSet*)callocCheck(n, sizeof(ZfColumnSet));
    long long* chunks = (long long*)callocCheck(n + 1, sizeof(long long));
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const ZfVector* vec = &zf->vectors[i];
        if (vec->n >= (1ULL << 31)) { fatal("zenflow.cuh: a vector of %zu elements, too many for int", vec->n); }
        sets[i] = ZfColumnSet{vec->offset, at, (int)vec->n, 1, 1, 0};
        chunks[i + 1] = chunks[i] + zf_num_chunks(sets[i]);
        at += vec->n;
    }
    const int zero = 0;
    dev->vector_sets = (ZfColumnSet*)cuda_malloc(n * sizeof(ZfColumnSet), "ZenFlow column sets");
    dev->vector_chunks = (long long*)cuda_malloc((n + 1) * sizeof(long long), "ZenFlow column sets");
    dev->vector_order = (int*)cuda_malloc(sizeof(int), "ZenFlow column order");
    cudaCheck(cudaMemcpy(dev->vector_sets, sets, n * sizeof(ZfColumnSet), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->vector_chunks, chunks, (n + 1) * sizeof(long long), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dev->vector_order, &zero, sizeof(int), cudaMemcpyHostToDevice));
    dev->vector_grid = ZfGrid{dev->vector_sets, dev->vector_chunks, n, dev->vector_order};
    dev->vector_blocks = chunks[n];
    free(sets);
    free(chunks);
}

// ZenFlow over a model's parameter and gradient buffers (device, file layout); free with
// zf_cuda_free. The ZenFlow config is zenflow.h's (zf->cfg is the effective one).
static void zf_cuda_init(ZenFlow* zf, ZfCudaDevice* dev, float* params, float* grads, const GPT2Config* model,
                         ZfConfig cfg) {
    memset(dev, 0, sizeof(*dev));
    dev->params = params;
    dev->grads = grads;
    dev->num_parameters = gpt2_num_params(model);
    ZfBackend be;
    memset(&be, 0, sizeof(be));
    be.ctx = dev;
    be.column_scores = zf_cuda_column_scores;
    be.selection_changed = zf_cuda_selection_changed;
    be.moments_to_host = zf_cuda_moments_to_host;
    be.moments_from_host = zf_cuda_moments_from_host;
    be.params_to_host = zf_cuda_params_to_host;
    be.zero_grads = zf_cuda_zero_grads;
    be.gpu_adam = zf_cuda_gpu_adam;
    be.grads_to_host = zf_cuda_grads_to_host;
    be.params_prefetch = zf_cuda_params_prefetch;
    be.params_from_host = zf_cuda_params_from_host;
    be.host_wait = zf_cuda_host_wait;
    be.host_blocks = zf_cuda_host_blocks;
    be.abs_sums = zf_cuda_abs_sums;
    be.abs_sums_wait = zf_cuda_abs_sums_wait;
    be.grads_from_host = zf_cuda_grads_from_host;
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
    dev->gpu_grid = ZfGrid{dev->gpu_sets, dev->gpu_chunks, dev->num_sets, dev->order};
    dev->cpu_tile_grid = ZfGrid{dev->cpu_sets, dev->cpu_tiles, dev->num_sets, dev->order};
    dev->cpu_chunk_grid = ZfGrid{dev->cpu_sets, dev->cpu_chunks, dev->num_sets, dev->order};
    zf_cuda_vector_grid(dev, zf);

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
    // (every step with accumulation on the CPU; at the boundary's backward with accumulation
    // on the GPU and per-layer pipelining)
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

static void zf_cuda_free(ZenFlow* zf, ZfCudaDevice* dev) {
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
                           dev->vector_sets, dev->vector_chunks, dev->vector_order, dev->m, dev->v, dev->scores,
                           dev->score_partial, dev->abs_partial};
    for (void* p : device_bufs) { cudaCheck(cudaFree(p)); }
    void* host_bufs[] = {dev->h_cpu_sets, dev->h_gpu_sets, dev->h_cpu_tiles, dev->h_gpu_chunks, dev->h_cpu_chunks,
                         dev->h_order, dev->host_moments};
    for (void* p : host_bufs) { free(p); }
    memset(dev, 0, sizeof(*dev));
}

// the ZenFlow lines of the trainer's memory table (MiB)
static void zf_cuda_print_memory(const ZfCudaDevice* dev, const ZenFlow* zf) {
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

// ----------------------------------------------------------------------------
// stall and step measurement (spec 8). Measured on the default stream: each wait of that
// stream for a copy, and each time the main thread blocks on the CPU side (zenflow.h's
// host_blocks: a wait for the CPU threads, a synchronous update, a whole selection with its
// migration), is bracketed by two timing events; their elapsed time is how long the GPU had
// nothing to do. Compute = the step's elapsed time on the default stream minus the stall.

// what one step cost (zf_cuda_step_end)
typedef struct {
    double gpu_ms;      // default stream, from the step's first to its last event
    double stall_ms;    // of that: waiting for a copy or for the CPU side
    double compute_ms;  // gpu_ms - stall_ms
    double cpu_ms;      // CPU optimizer work done during the step (either thread)
    double d2h_bytes, h2d_bytes;  // ZenFlow's PCIe traffic of the step
} ZfStepStats;

// the default stream waits for an event; timed as a stall unless the host is blocked anyway
static void zf_cuda_compute_waits(ZfCudaDevice* dev, cudaEvent_t event) {
    int timed = !dev->blocking && dev->num_stalls < ZF_MAX_STALLS;
    if (timed) { cudaCheck(cudaEventRecord(dev->stall_begin[dev->num_stalls], 0)); }
    int span = gpu_trace_begin(0);
    cudaCheck(cudaStreamWaitEvent(0, event, 0));
    gpu_trace_end(span, 0, TRACE_WAIT, "GPU waits for a copy");
    if (timed) { cudaCheck(cudaEventRecord(dev->stall_end[dev->num_stalls++], 0)); }
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

// Call zf_cuda_step_begin before the step's forward pass and zf_cuda_step_end after zf_step;
// step_end waits for the default stream (not for copies still running on the others: they
// belong to the next step's overlap).
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

#endif  // ZENFLOW_CUH
