/*
ZenFlow on the GPU: the CUDA backend (ZfBackend) of zenflow.h, which decides WHAT happens in a
step; this file says how a GPU does each part, in the spec's order: zero the gradients (spec
7), AdamW on the GPU-owned columns (4.3), the CPU-owned gradient columns to the host (4.4; per
layer, most leave during the backward, before the AdamW), the CPU's result back (4.6); then
the selection (4.2), the options, setup and the stall measurement (8).

The device sees each side's columns of a matrix as a COLUMN SET (ZfColumnSet); the packed
layouts, with W[o, col_r] the element in row o of the set's r-th column:
    CPU side, and the device staging buffers:  packed[cpu_offset + r * rows + o]   (by column)
    GPU moments m, v, after all the vectors:   m[vector_elems + gpu_offset + o * n_sel + r]
By row on the GPU, so that AdamW walks W's rows in order. Streams: the default stream computes
(zeroing, AdamW, gather, scatter too), d2h copies staging -> host, h2d host -> staging; events
say who used a buffer last. Built with -fmad=false: the AdamW is bitwise the CPU's.
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
// block start[s] on (a block is a tile or a chunk of a set, below); selection_changed fills
// the host mirrors and copies them up
typedef struct {
    ZfColumnSet* sets;     // (num_sets) device
    long long* start;      // (num_sets + 1) device: the prefix sums of the sets' blocks
    int num_sets;
    const int* order;      // (every matrix's cols; the vectors' grid: 1) device
    ZfColumnSet* h_sets;   // ... host mirrors of sets and start
    long long* h_start;
} ZfGrid;

#define ZF_TILE 32                 // gather / scatter move 32 x 32 tiles ...
#define ZF_TILE_ROWS 8             // ... with blocks of 32 x 8 threads
#define ZF_THREADS 256             // threads per block of the element-wise kernels
#define ZF_CHUNK (4 * ZF_THREADS)  // elements per block of the element-wise kernels

// a transfer group's CPU-owned columns (spec 7): one range of the CPU sets' tiles (gather,
// scatter) and one of the packed buffers
typedef struct {
    long long first_tile, tiles;
    size_t at, n;  // floats
} ZfGroupRange;

// ----------------------------------------------------------------------------
// the backend's state

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

#define ZF_MAX_FENCES 8    // host buffers that copies use: master, acc, acc_job, 2 landing, moments
#define ZF_MAX_STALLS 256  // stall intervals measured per step (more are waited for, not timed)
// events only waited for, never timed; a host thread that waits for one sleeps (see
// cuda_init_device: without cudaEventBlockingSync, cudaEventSynchronize spins)
#define ZF_WAITED_EVENT (cudaEventDisableTiming | cudaEventBlockingSync)

// the stall and step measurement (spec 8; main thread only, the last section of this file)
typedef struct {
    cudaEvent_t step_begin, step_end;
    cudaEvent_t stall_begin[ZF_MAX_STALLS], stall_end[ZF_MAX_STALLS];
    int num_stalls;
    int blocking;  // inside host_blocks: stream waits are part of that interval
    long long d2h_bytes, h2d_bytes;  // this step's PCIe bytes, each way
    long long uploaded_bytes;  // host-to-device bytes not yet counted in a step's h2d_bytes (the
                               // updater thread adds too, atomically); the apply counts them
    double cpu_ms_at_begin;
} ZfCudaStats;

// auto U (spec 6): per matrix sums of |g|, GPU-owned then CPU-owned, which abs_sums' finalize
// kernels (one per side) write into mapped host memory (a copy would queue behind the gradients)
typedef struct {
    double* partial;   // (most chunks either side can have) device
    double* host;      // (2 num_matrices) mapped pinned host memory ...
    double* mapped;    // ... and the address the kernel writes it at
    double *sel, *cpu; // where the last abs_sums call wants them (cpu may be NULL)
    cudaEvent_t done;
} ZfCudaAutoU;

typedef struct {
    float* params;  // (num_parameters) device: the working copy, file layout
    float* grads;   // (num_parameters) device
    size_t num_parameters;
    // the column sets (selection_changed): the GPU's by chunks (AdamW) in matrix order; the
    // CPU's by tiles (gather, scatter) in transfer-group order (set k is matrix group_mats[k]);
    // the vectors', built once (they never change owner)
    ZfGrid gpu, cpu_tiles, vectors;
    ZfGroupRange* groups;  // (num_groups + 1) host: transfer group g's; [num_groups]: all of them
    // 4.3: the GPU's optimizer state: every vector, then each matrix's selected columns
    float* m;  // (vector_elems + gpu_capacity) device, row by row per matrix (see the top)
    float* v;  // (vector_elems + gpu_capacity) device, as m
    // transfers (spec 7)
    cudaStream_t d2h, h2d;
    ZfStaging staging[2];
    ZfStaging* grads_stage;   // gradient columns (or A) on their way to the host
    ZfStaging* params_stage;  // the CPU's updated columns on their way in; with overlap not
                              // grads_stage: a prefetched result waits here while g_t leaves
    int prefetched;           // params_stage holds the master already: set by params_prefetch
                              // (with overlap: never grads_stage), read once its job was waited for
    ZfFence fences[ZF_MAX_FENCES];
    int num_fences;
    // the rest is not the default step's: the selection's, the options', the measurement
    int *order, *h_order;  // (every matrix's cols) the sets' columns
    int* vector_order;     // (1) device: {0}, the one column of a vector's set
    float* host_moments;   // (vector_elems + gpu_capacity) host scratch for the layout change (pinned: zf_cuda_init)
    float* scores;         // (every matrix's cols) device, 4.2.2
    float* score_partial;  // (COLSUM_MAX_CHUNKS, the widest matrix's cols) device
    ZfGrid cpu_chunks;     // the CPU's sets by chunks (auto U)
    ZfCudaAutoU autou;
    size_t staging_bytes, pinned_bytes;
    ZfCudaStats stats;
} ZfCudaDevice;

// the default stream waits for an event, timed as a stall (the last section)
static void zf_cuda_compute_waits(ZfCudaDevice* dev, cudaEvent_t event);

// ============================================================================
// The kernels of the default step
// ============================================================================
// Each block takes one chunk (element-wise kernels) or one tile (gather, scatter) of one
// column set; the host side below says when each runs and on which stream.

// the set of block b: the last s with start[s] <= b (an empty set is never found)
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

// llmc/adamw.h's formula on a grid's sets, a chunk of ZF_CHUNK elements per block (4 a thread):
// the selected columns (m, v: after the vectors' moments), or the vectors (m, v: at the start)
__global__ void zf_adam_columns_kernel(float* __restrict__ params,       // (num_parameters)
                                       const float* __restrict__ grads,  // (num_parameters)
                                       float* __restrict__ m,            // (the grid's elements) row by row
                                       float* __restrict__ v,            // (the grid's elements)
                                       ZfGrid sets, AdamWConsts c) {
    ZfChunk chunk = zf_chunk_of_block(sets);
    for (int j = threadIdx.x; j < ZF_CHUNK; j += ZF_THREADS) {
        size_t at, k;
        if (zf_chunk_element(chunk, j, &at, &k)) { adamw_one(params + at, m + k, v + k, grads[at], c); }
    }
}

// The CPU-owned columns of W (gradients, or parameters) into the packed CPU layout: a
// transpose by 32 x 32 tiles through shared memory, so that both the reads of W (by rows)
// and the writes of the packed buffer (by columns) are 32 consecutive floats per warp where
// the layouts allow it. Block (32, 8), one tile per block; the grid may cover only some of
// the sets (one transfer group): block b does tile first_tile + b of the flat numbering.
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

// the gather's inverse, through the same tiles: packed column r, row o -> W[o, col(r)]
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

// ============================================================================
// The default step
// ============================================================================

// ----------------------------------------------------------------------------
// before the backward pass (spec 7): zero the gradients

static void zf_cuda_zero_gpu_owned(ZfCudaDevice* dev);

static void zf_cuda_zero_grads(void* ctx, const ZenFlow* zf, int all) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    if (!all) {  // option: -za gpu inside a window, only the GPU-owned ones
        zf_cuda_zero_gpu_owned(dev);
        return;
    }
    cudaCheck(cudaMemsetAsync(dev->grads, 0, dev->num_parameters * sizeof(float), 0));
}

// ----------------------------------------------------------------------------
// 4.3 AdamW (spec 3.1) on every GPU-owned element: the vectors (no weight decay, spec 1) in
// one launch, then the selected columns of every matrix in another

static void zf_cuda_gpu_adam(void* ctx, const ZenFlow* zf, ZfAdamHyper h, int step) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    const size_t V = zf->own.vector_elems;
    const long long vector_blocks = dev->vectors.h_start[dev->vectors.num_sets];
    const long long matrix_blocks = dev->gpu.h_start[dev->gpu.num_sets];
    int span = gpu_trace_begin(0);
    AdamWConsts vectors = adamw_consts(h.lr, h.beta1, h.beta2, h.eps, 0.0f, step);
    if (vector_blocks > 0) {  // their moments come first in m, v
        zf_adam_columns_kernel<<<(unsigned)vector_blocks, ZF_THREADS>>>(dev->params, dev->grads, dev->m, dev->v,
                                                                        dev->vectors, vectors);
        cudaCheck(cudaGetLastError());
    }
    AdamWConsts matrices = adamw_consts(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, step);
    if (matrix_blocks > 0) {
        zf_adam_columns_kernel<<<(unsigned)matrix_blocks, ZF_THREADS>>>(dev->params, dev->grads, dev->m + V,
                                                                        dev->v + V, dev->gpu, matrices);
        cudaCheck(cudaGetLastError());
    }
    gpu_trace_end(span, 0, TRACE_COMPUTE, "GPU-side AdamW");
}

// ----------------------------------------------------------------------------
// 4.4 the CPU-owned columns to the host: gather into a staging buffer on the default
// stream, copy out on the d2h stream; 4.6 the way back: copy in on the h2d stream, scatter

// Every copy between a host buffer of zenflow.h and a staging buffer: floats [at, at + n), to
// the host (down) on the d2h stream, or from it on the h2d stream. It traces the copy, counts
// its bytes (atomically: the updater thread uploads too), and records the staging buffer's
// event and the host buffer's fence, which then stand for it.
static void zf_cuda_copy(ZfCudaDevice* dev, ZfStaging* st, float* host, size_t at, size_t n, int down,
                         const char* what) {
    cudaStream_t stream = down ? dev->d2h : dev->h2d;
    int span = gpu_trace_begin(stream);
    if (down) {
        cudaCheck(cudaMemcpyAsync(host + at, st->buf + at, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    } else {
        cudaCheck(cudaMemcpyAsync(st->buf + at, host + at, n * sizeof(float), cudaMemcpyHostToDevice, stream));
    }
    gpu_trace_end(span, stream, down ? TRACE_D2H : TRACE_H2D, what);
    __atomic_add_fetch(down ? &dev->stats.d2h_bytes : &dev->stats.uploaded_bytes, (long long)(n * sizeof(float)),
                       __ATOMIC_RELAXED);
    cudaCheck(cudaEventRecord(down ? st->d2h_done : st->h2d_done, stream));
    for (int i = 0; i < dev->num_fences; i++) {
        if (dev->fences[i].host == host) { cudaCheck(cudaEventRecord(dev->fences[i].done, stream)); }
    }
}

// On the default stream, range r's CPU-owned columns between `full` (the parameters or the
// gradients, the model's layout) and a staging buffer: gather (into st->buf) or scatter (out
// of it). The staging buffer's kernel_done then stands for it.
static void zf_cuda_move_columns(ZfCudaDevice* dev, float* full, ZfStaging* st, ZfGroupRange r, int gather) {
    if (r.tiles == 0) { return; }
    const dim3 block(ZF_TILE, ZF_TILE_ROWS);
    int span = gpu_trace_begin(0);
    if (gather) {
        zf_gather_columns_kernel<<<(unsigned)r.tiles, block>>>(st->buf, full, dev->cpu_tiles, r.first_tile);
    } else {
        zf_scatter_columns_kernel<<<(unsigned)r.tiles, block>>>(full, st->buf, dev->cpu_tiles, r.first_tile);
    }
    cudaCheck(cudaGetLastError());
    gpu_trace_end(span, 0, TRACE_COMPUTE, gather ? "gather columns" : "scatter columns");
    cudaCheck(cudaEventRecord(st->kernel_done, 0));
}

// The gradient columns (accumulation on the CPU: g_t, every step; on the GPU: A, at the
// window's end) of transfer group `group` (-1: all) to `host`, asynchronously: one gather into
// the staging buffer on the default stream, one copy out on the d2h stream
static void zf_cuda_grads_to_host(void* ctx, const ZenFlow* zf, float* host, int group) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    ZfStaging* st = dev->grads_stage;
    const ZfGroupRange r = dev->groups[group < 0 ? zf->own.num_groups : group];
    if (r.n == 0) { return; }
    // the staging buffer is free once its last copy out and its last copy in are done (the
    // default stream waits, not the host). A transfer in groups waits only before its first
    // group, the last layer's (the backward's first): the later groups write other parts of the
    // buffer, and waiting for this step's own copies would serialize them.
    if (group < 0 || group == zf->own.num_groups - 1) {
        zf_cuda_compute_waits(dev, st->d2h_done);
        zf_cuda_compute_waits(dev, st->h2d_done);
    }
    zf_cuda_move_columns(dev, dev->grads, st, r, 1);
    cudaCheck(cudaStreamWaitEvent(dev->d2h, st->kernel_done, 0));
    zf_cuda_copy(dev, st, host, r.at, r.n, 1, "gradient columns");
}

// zenflow.h calls this before touching a host buffer a copy may use (each has a fence: setup)
static void zf_cuda_host_wait(void* ctx, const float* host) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    for (int i = 0; i < dev->num_fences; i++) {
        if (dev->fences[i].host == host) {
            cudaCheck(cudaEventSynchronize(dev->fences[i].done));
            return;
        }
    }
    // not a buffer we copy asynchronously: wait for every copy, to be safe
    cudaCheck(cudaStreamSynchronize(dev->d2h));
    cudaCheck(cudaStreamSynchronize(dev->h2d));
}

// Packed CPU-owned columns of transfer group `group` (-1: all) from `host` into the staging
// buffer. A new upload (all, or a transfer's first group: the forward's first, group 0) goes
// after whatever used the buffer before. Safe to call from the updater thread (params_prefetch).
static void zf_cuda_upload(ZfCudaDevice* dev, const ZenFlow* zf, ZfStaging* st, const float* host, int group) {
    const ZfGroupRange r = dev->groups[group < 0 ? zf->own.num_groups : group];
    if (r.n == 0) { return; }
    if (group <= 0) {
        cudaCheck(cudaStreamWaitEvent(dev->h2d, st->kernel_done, 0));
        cudaCheck(cudaStreamWaitEvent(dev->h2d, st->d2h_done, 0));
    }
    zf_cuda_copy(dev, st, (float*)host, r.at, r.n, 0, "packed columns");  // (only read)
}

// on the updater thread right after a window update: its result starts for the device
static void zf_cuda_params_prefetch(void* ctx, const ZenFlow* zf, const float* host) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    cudaCheck(cudaSetDevice(0));  // this thread's current device (the trainer uses device 0)
    zf_cuda_upload(dev, zf, dev->params_stage, host, -1);
    dev->prefetched = 1;
}

// The CPU's columns into the working copy before the next forward pass: all of them (with
// overlap, usually uploaded by the updater's prefetch already), or one group just before its
// layer's forward (a synchronous update, per layer). The default stream waits for this copy.
static void zf_cuda_params_from_host(void* ctx, const ZenFlow* zf, const float* host, int group) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    if (zf->own.cpu_elems == 0) { return; }
    const ZfGroupRange r = dev->groups[group < 0 ? zf->own.num_groups : group];
    ZfStaging* st = dev->params_stage;
    if (!dev->prefetched) { zf_cuda_upload(dev, zf, st, host, group); }
    if (group < 0 || group == zf->own.num_groups - 1) { dev->prefetched = 0; }  // the transfer's last part
    zf_cuda_compute_waits(dev, st->h2d_done);
    zf_cuda_move_columns(dev, dev->params, st, r, 0);
    // the apply's step counts the bytes uploaded for it, a prefetch's too: its job was waited
    // for before this call, and the next prefetch starts only after it
    dev->stats.h2d_bytes += __atomic_exchange_n(&dev->stats.uploaded_bytes, 0LL, __ATOMIC_RELAXED);
}

// ============================================================================
// The selection (spec 4.2): the column scores, the new column sets, the moments both ways
// ============================================================================

// 4.2.2 scores[j] = sum over rows of g[o, j]^2, every matrix's into one buffer (llmc's column
// sums: the order depends only on the shape, so the scores are deterministic), one copy
static void zf_cuda_column_scores(void* ctx, const ZenFlow* zf, float* scores) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    const int n = zf->own.total_cols;
    int span = gpu_trace_begin(0);
    cudaCheck(cudaMemsetAsync(dev->scores, 0, n * sizeof(float), 0));
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        column_sums(dev->scores + mat->first_col, dev->score_partial, dev->grads + mat->offset, mat->rows,
                    mat->cols, 1);
    }
    gpu_trace_end(span, 0, TRACE_COMPUTE, "column scores");
    cudaCheck(cudaMemcpy(scores, dev->scores, n * sizeof(float), cudaMemcpyDeviceToHost));
    dev->stats.d2h_bytes += (long long)n * sizeof(float);
}

// tiles of a set (32 set columns x 32 rows each), and chunks (ZF_CHUNK elements each)
static long long zf_num_tiles(const ZfColumnSet& s) {
    return (long long)((s.count + ZF_TILE - 1) / ZF_TILE) * ((s.rows + ZF_TILE - 1) / ZF_TILE);
}

static long long zf_num_chunks(const ZfColumnSet& s) {
    return ((long long)s.count * s.rows + ZF_CHUNK - 1) / ZF_CHUNK;
}

// set k of a grid and its blocks (the prefix sums are built in order of k)
static void zf_grid_put(ZfGrid* g, int k, ZfColumnSet s, long long blocks) {
    g->h_sets[k] = s;
    g->h_start[k + 1] = g->h_start[k] + blocks;
}

// copies a grid's host mirrors to the device (synchronous, on the default stream: kernels
// still reading the old sets finish first)
static void zf_grid_upload(ZfGrid* g) {
    const int n = g->num_sets;
    if (g->h_start[n] >= (1LL << 31)) { fatal("zenflow.cuh: the model is too large for one grid (hint: a smaller model)"); }
    cudaCheck(cudaMemcpy(g->sets, g->h_sets, n * sizeof(ZfColumnSet), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(g->start, g->h_start, (n + 1) * sizeof(long long), cudaMemcpyHostToDevice));
}

// 4.2.4 the new ownership as column sets: the GPU's in matrix order, the CPU's in
// transfer-group order (zenflow.h's packed layout)
static void zf_cuda_selection_changed(void* ctx, const ZenFlow* zf) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    const ZfOwnership* own = &zf->own;
    const int n = own->num_matrices;
    for (int i = 0; i < n; i++) {
        const ZfMatrix* mat = &own->matrices[i];
        memcpy(dev->h_order + mat->first_col, mat->cols_by_owner, mat->cols * sizeof(int));
        ZfColumnSet g = {mat->offset, mat->gpu_offset, mat->rows, mat->cols, mat->n_sel, mat->first_col};
        zf_grid_put(&dev->gpu, i, g, zf_num_chunks(g));
    }
    for (int k = 0; k < n; k++) {
        const ZfMatrix* mat = &own->matrices[own->group_mats[k]];
        ZfColumnSet c = {mat->offset, mat->cpu_offset, mat->rows, mat->cols, mat->cols - mat->n_sel,
                         mat->first_col + mat->n_sel};
        zf_grid_put(&dev->cpu_tiles, k, c, zf_num_tiles(c));
        zf_grid_put(&dev->cpu_chunks, k, c, zf_num_chunks(c));
    }
    for (int g = 0; g <= own->num_groups; g++) {  // group g's CPU sets are [s0, s1): one range
        const int s0 = g < own->num_groups ? own->group_start[g] : 0;
        const int s1 = g < own->num_groups ? own->group_start[g + 1] : n;
        const size_t end = s1 < n ? dev->cpu_tiles.h_sets[s1].packed_offset : own->cpu_elems;
        const size_t at = s0 < s1 ? dev->cpu_tiles.h_sets[s0].packed_offset : end;  // (no matrices: none)
        const long long* tiles = dev->cpu_tiles.h_start;
        dev->groups[g] = ZfGroupRange{tiles[s0], tiles[s1] - tiles[s0], at, end - at};
    }
    zf_grid_upload(&dev->gpu);
    zf_grid_upload(&dev->cpu_tiles);
    zf_grid_upload(&dev->cpu_chunks);
    cudaCheck(cudaMemcpy(dev->order, dev->h_order, own->total_cols * sizeof(int), cudaMemcpyHostToDevice));
}

// The GPU moments' layout (row by row per matrix) to zenflow.h's (column by column), or back
// (to_rows = 1); the vectors are the same in both. On the host, only at a selection or a
// checkpoint, on all threads (k of the model's moments: 1.2 GB at GPT-2 1.5B), each thread
// writing whole columns (or rows) of its own.
static void zf_moments_transpose(const ZenFlow* zf, const float* src, float* dst, int to_rows) {
    memcpy(dst, src, zf->own.vector_elems * sizeof(float));
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        const size_t base = zf->own.vector_elems + mat->gpu_offset;
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

// the host scratch of the moments' layout change (made at the first use outside zenflow mode)
static float* zf_cuda_host_moments(ZfCudaDevice* dev, const ZenFlow* zf) {
    if (dev->host_moments == NULL) {
        dev->host_moments = (float*)mallocCheck((zf->own.vector_elems + zf->own.gpu_capacity) * sizeof(float));
    }
    return dev->host_moments;
}

// both moments, through the host scratch (synchronous copies)
static void zf_cuda_moments_to_host(void* ctx, const ZenFlow* zf, float* m, float* v) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    size_t n = zf->own.vector_elems + zf->own.gpu_sel_elems;
    float* scratch = zf_cuda_host_moments(dev, zf);
    float* device_bufs[2] = {dev->m, dev->v};
    float* host_bufs[2] = {m, v};
    for (int i = 0; i < 2; i++) {
        cudaCheck(cudaMemcpy(scratch, device_bufs[i], n * sizeof(float), cudaMemcpyDeviceToHost));
        zf_moments_transpose(zf, scratch, host_bufs[i], 0);
    }
    dev->stats.d2h_bytes += 2LL * n * sizeof(float);
}

static void zf_cuda_moments_from_host(void* ctx, const ZenFlow* zf, const float* m, const float* v) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    size_t n = zf->own.vector_elems + zf->own.gpu_sel_elems;
    float* device_bufs[2] = {dev->m, dev->v};
    const float* host_bufs[2] = {m, v};
    float* scratch = zf_cuda_host_moments(dev, zf);
    for (int i = 0; i < 2; i++) {
        zf_moments_transpose(zf, host_bufs[i], scratch, 1);
        cudaCheck(cudaMemcpy(device_bufs[i], scratch, n * sizeof(float), cudaMemcpyHostToDevice));
    }
    dev->stats.h2d_bytes += 2LL * n * sizeof(float);
}

// selection and warm-up: the CPU-owned parameter columns to the host master, through the
// staging buffer once the device is idle (synchronous; a prefetch it held is gone)
static void zf_cuda_params_to_host(void* ctx, const ZenFlow* zf, float* host) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    const ZfGroupRange r = dev->groups[zf->own.num_groups];
    if (r.n == 0) { return; }
    cudaCheck(cudaDeviceSynchronize());  // no copy or kernel uses the staging buffers any more
    dev->prefetched = 0;
    zf_cuda_move_columns(dev, dev->params, dev->params_stage, r, 1);
    cudaCheck(cudaMemcpy(host, dev->params_stage->buf, r.n * sizeof(float), cudaMemcpyDeviceToHost));
    dev->stats.d2h_bytes += (long long)(r.n * sizeof(float));
}

// ============================================================================
// The options
// ============================================================================

// ----------------------------------------------------------------------------
// -za gpu: inside a window the gradient buffer keeps A in the CPU-owned columns, so before
// each backward only the GPU-owned ones are zeroed: the vectors, then the selected columns

// zeroes every element of a grid's sets in the gradient buffer
__global__ void zf_zero_columns_kernel(float* __restrict__ grads,  // (num_parameters)
                                       ZfGrid sets) {
    ZfChunk chunk = zf_chunk_of_block(sets);
    for (int j = threadIdx.x; j < ZF_CHUNK; j += ZF_THREADS) {
        size_t at, k;
        if (zf_chunk_element(chunk, j, &at, &k)) { grads[at] = 0.0f; }
    }
}

// zero the gradients of a grid's sets (one block per chunk)
static void zf_cuda_zero_columns(ZfCudaDevice* dev, ZfGrid grid) {
    const long long blocks = grid.h_start[grid.num_sets];
    if (blocks == 0) { return; }
    zf_zero_columns_kernel<<<(unsigned)blocks, ZF_THREADS>>>(dev->grads, grid);
    cudaCheck(cudaGetLastError());
}

static void zf_cuda_zero_gpu_owned(ZfCudaDevice* dev) {
    zf_cuda_zero_columns(dev, dev->vectors);
    zf_cuda_zero_columns(dev, dev->gpu);
}

// ----------------------------------------------------------------------------
// auto U (spec 6): per matrix the sum of |g| over its GPU-owned elements (and, if cpu is not
// NULL, its CPU-owned ones: with -za gpu they hold A), on the default stream after the
// backward; the sums reach the host asynchronously

// the sum of every thread's `mine` over a block of ZF_THREADS threads, added up in a fixed
// tree (the same order every run); `shared` holds ZF_THREADS doubles
__device__ inline double zf_block_sum(double* shared, double mine) {
    shared[threadIdx.x] = mine;
    __syncthreads();
    for (int half = ZF_THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) { shared[threadIdx.x] += shared[threadIdx.x + half]; }
        __syncthreads();
    }
    return shared[0];
}

// pass 1: partial[b] = sum of |g| over chunk b of the column sets, in double
__global__ void zf_abs_sum_partial_kernel(double* __restrict__ partial,     // (chunks)
                                          const float* __restrict__ grads,  // (num_parameters)
                                          ZfGrid sets) {
    __shared__ double sum[ZF_THREADS];
    ZfChunk chunk = zf_chunk_of_block(sets);
    double mine = 0.0;
    for (int j = threadIdx.x; j < ZF_CHUNK; j += ZF_THREADS) {
        size_t at, k;
        if (zf_chunk_element(chunk, j, &at, &k)) { mine += fabs((double)grads[at]); }
    }
    double total = zf_block_sum(sum, mine);
    if (threadIdx.x == 0) { partial[blockIdx.x] = total; }
}

// pass 2, one block per set: out[s] = the sum of set s's partials (0 for an empty set)
__global__ void zf_abs_sum_finalize_kernel(double* __restrict__ out, const double* __restrict__ partial,
                                           const long long* __restrict__ chunk_start) {
    __shared__ double sum[ZF_THREADS];
    double mine = 0.0;
    for (long long b = chunk_start[blockIdx.x] + threadIdx.x; b < chunk_start[blockIdx.x + 1]; b += ZF_THREADS) {
        mine += partial[b];
    }
    double total = zf_block_sum(sum, mine);
    if (threadIdx.x == 0) { out[blockIdx.x] = total; }
}

static void zf_cuda_abs_sums(void* ctx, const ZenFlow* zf, double* sel, double* cpu) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    const int n = zf->own.num_matrices;
    int span = gpu_trace_begin(0);
    for (int side = 0; side < (cpu != NULL ? 2 : 1); side++) {
        const ZfGrid grid = side == 0 ? dev->gpu : dev->cpu_chunks;
        long long total = grid.h_start[grid.num_sets];
        if (total > 0) {
            zf_abs_sum_partial_kernel<<<(unsigned)total, ZF_THREADS>>>(dev->autou.partial, dev->grads, grid);
            cudaCheck(cudaGetLastError());
        }
        zf_abs_sum_finalize_kernel<<<n, ZF_THREADS>>>(dev->autou.mapped + side * n, dev->autou.partial, grid.start);
        cudaCheck(cudaGetLastError());
    }
    gpu_trace_end(span, 0, TRACE_COMPUTE, "auto U sums");
    cudaCheck(cudaEventRecord(dev->autou.done, 0));  // the sums are in autou.host
    dev->autou.sel = sel;
    dev->autou.cpu = cpu;
}

// the sums to zenflow.h's arrays, by matrix (the CPU's sets are in transfer-group order)
static void zf_cuda_abs_sums_wait(void* ctx, const ZenFlow* zf) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    ZfCudaAutoU* a = &dev->autou;
    const int n = zf->own.num_matrices;
    cudaCheck(cudaEventSynchronize(a->done));
    memcpy(a->sel, a->host, n * sizeof(double));
    if (a->cpu == NULL) { return; }
    for (int k = 0; k < n; k++) { a->cpu[zf->own.group_mats[k]] = a->host[n + k]; }
}

// resuming -za gpu: the open window's A back into the gradient buffer
static void zf_cuda_grads_from_host(void* ctx, const ZenFlow* zf, const float* host) {
    ZfCudaDevice* dev = (ZfCudaDevice*)ctx;
    if (zf->own.cpu_elems == 0) { return; }
    ZfStaging* st = dev->grads_stage;
    zf_cuda_upload(dev, zf, st, host, -1);
    cudaCheck(cudaStreamWaitEvent(0, st->h2d_done, 0));
    zf_cuda_move_columns(dev, dev->grads, st, dev->groups[zf->own.num_groups], 0);
    cudaCheck(cudaDeviceSynchronize());
    dev->stats.h2d_bytes += __atomic_exchange_n(&dev->stats.uploaded_bytes, 0LL, __ATOMIC_RELAXED);
}

// ============================================================================
// Setup and teardown
// ============================================================================

static void zf_cuda_host_blocks(void* ctx, int begin);

// gives a host buffer that zenflow.h may host_wait on a fence, which each asynchronous copy into
// or out of it records (one never recorded: host_wait returns at once); pins it if `pin` is set
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
            cudaGetLastError();  // clear it: the copies still work, but block the thread that issues them
            fprintf(stderr, "WARNING: could not pin %.1f MiB of host memory (%s): copies to and from it block "
                    "the thread that issues them, and most of the overlap is lost (hint: free host memory, or "
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

static void zf_grid_alloc(ZfGrid* g, int n, const int* order) {
    g->num_sets = n;
    g->order = order;
    g->sets = (ZfColumnSet*)cuda_malloc(n * sizeof(ZfColumnSet), "ZenFlow column sets");
    g->start = (long long*)cuda_malloc((n + 1) * sizeof(long long), "ZenFlow column sets");
    g->h_sets = (ZfColumnSet*)callocCheck(n, sizeof(ZfColumnSet));
    g->h_start = (long long*)callocCheck(n + 1, sizeof(long long));
}

static void zf_grid_free(ZfGrid* g) {
    cudaCheck(cudaFree(g->sets));
    cudaCheck(cudaFree(g->start));
    free(g->h_sets);
    free(g->h_start);
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
    be.zero_grads = zf_cuda_zero_grads;
    be.gpu_adam = zf_cuda_gpu_adam;
    be.grads_to_host = zf_cuda_grads_to_host;
    be.params_from_host = zf_cuda_params_from_host;
    be.params_prefetch = zf_cuda_params_prefetch;
    be.host_wait = zf_cuda_host_wait;
    be.column_scores = zf_cuda_column_scores;
    be.selection_changed = zf_cuda_selection_changed;
    be.moments_to_host = zf_cuda_moments_to_host;
    be.moments_from_host = zf_cuda_moments_from_host;
    be.params_to_host = zf_cuda_params_to_host;
    be.abs_sums = zf_cuda_abs_sums;
    be.abs_sums_wait = zf_cuda_abs_sums_wait;
    be.grads_from_host = zf_cuda_grads_from_host;
    be.host_blocks = zf_cuda_host_blocks;
    be.host_moment_copies = 1;  // host_moments
    zf_init(zf, cfg, model, be);
    const ZfConfig* c = &zf->cfg;
    const ZfOwnership* own = &zf->own;

    // ownership tables
    int max_cols = 0;
    for (int i = 0; i < own->num_matrices; i++) {
        const ZfMatrix* mat = &own->matrices[i];
        if ((long long)mat->rows * mat->cols >= (1LL << 31)) {
            fatal("zenflow.cuh: matrix %s has %d x %d elements, more than the kernels index with int",
                  mat->name, mat->rows, mat->cols);
        }
        max_cols = mat->cols > max_cols ? mat->cols : max_cols;
    }
    const int n = own->num_matrices;
    dev->order = (int*)cuda_malloc(own->total_cols * sizeof(int), "ZenFlow column order");
    dev->h_order = (int*)callocCheck(own->total_cols, sizeof(int));
    dev->groups = (ZfGroupRange*)callocCheck(own->num_groups + 1, sizeof(ZfGroupRange));
    zf_grid_alloc(&dev->gpu, n, dev->order);
    zf_grid_alloc(&dev->cpu_tiles, n, dev->order);
    zf_grid_alloc(&dev->cpu_chunks, n, dev->order);
    // the vectors' grid: vector i is a set of one column, 0, of n rows, its moments after
    // those of vectors 0 .. i-1
    const int zero = 0;
    dev->vector_order = (int*)cuda_malloc(sizeof(int), "ZenFlow column order");
    cudaCheck(cudaMemcpy(dev->vector_order, &zero, sizeof(int), cudaMemcpyHostToDevice));
    zf_grid_alloc(&dev->vectors, own->num_vectors, dev->vector_order);
    size_t at = 0;
    for (int i = 0; i < own->num_vectors; i++) {
        const ZfVector* vec = &own->vectors[i];
        if (vec->n >= (1ULL << 31)) { fatal("zenflow.cuh: a vector of %zu elements, too many for int", vec->n); }
        ZfColumnSet s = {vec->offset, at, (int)vec->n, 1, 1, 0};
        zf_grid_put(&dev->vectors, i, s, zf_num_chunks(s));
        at += vec->n;
    }
    zf_grid_upload(&dev->vectors);

    // the GPU's optimizer state (zero, like every moment before the first step)
    size_t g = own->vector_elems + own->gpu_capacity;
    dev->m = cuda_malloc(g * sizeof(float), "ZenFlow GPU moments m");
    dev->v = cuda_malloc(g * sizeof(float), "ZenFlow GPU moments v");
    cudaCheck(cudaMemset(dev->m, 0, g * sizeof(float)));
    cudaCheck(cudaMemset(dev->v, 0, g * sizeof(float)));
    // zenflow mode: kept (and pinned) for its selections; other modes: made at a checkpoint
    if (c->mode == ZF_MODE_ZENFLOW) { dev->host_moments = (float*)mallocCheck(g * sizeof(float)); }
    dev->scores = cuda_malloc(own->total_cols * sizeof(float), "ZenFlow column scores");
    dev->score_partial = cuda_malloc((size_t)COLSUM_MAX_CHUNKS * max_cols * sizeof(float), "ZenFlow column scores");
    if (c->update_interval == ZF_AUTO) {  // spec 6's sums: chunks of either side, at most
        size_t most = (own->gpu_capacity > own->cpu_capacity ? own->gpu_capacity : own->cpu_capacity) / ZF_CHUNK + n;
        dev->autou.partial = (double*)cuda_malloc(most * sizeof(double), "ZenFlow auto U sums");
        dev->autou.host = (double*)mapped_alloc(2 * n * sizeof(double), &dev->autou.mapped, "ZenFlow auto U sums");
    }
    cudaCheck(cudaEventCreateWithFlags(&dev->autou.done, ZF_WAITED_EVENT));

    // transfers: two staging buffers where both directions are busy at once: with overlap, a
    // window's result waits in one (prefetched) while gradients leave through the other
    // (every step with accumulation on the CPU; at the boundary's backward with -za gpu and
    // per-layer pipelining)
    cudaCheck(cudaStreamCreateWithFlags(&dev->d2h, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&dev->h2d, cudaStreamNonBlocking));
    int two = c->overlap;
    zf_cuda_staging_init(&dev->staging[0], own->cpu_capacity);
    zf_cuda_staging_init(&dev->staging[1], two ? own->cpu_capacity : 0);
    dev->grads_stage = &dev->staging[0];
    dev->params_stage = two ? &dev->staging[1] : &dev->staging[0];
    dev->staging_bytes = (two ? 2 : 1) * own->cpu_capacity * sizeof(float);
    // the host buffers zenflow.h waits on (without a fence, host_wait would wait for both copy
    // streams); pinned where copies carry traffic: every step's, and the selection's moments
    size_t bytes = own->cpu_capacity * sizeof(float);
    int gpu_acc = c->accumulate == ZF_ACCUMULATE_GPU;
    zf_cuda_add_fence(dev, zf->cpu.master, bytes, 1);
    zf_cuda_add_fence(dev, zf->win.acc, bytes, gpu_acc);
    zf_cuda_add_fence(dev, zf->win.acc_job, bytes, gpu_acc && c->overlap);
    zf_cuda_add_fence(dev, zf->landing.buf[0], bytes, 1);
    zf_cuda_add_fence(dev, zf->landing.buf[1], bytes, 1);
    zf_cuda_add_fence(dev, dev->host_moments, g * sizeof(float), 1);  // a selection's copies (NULL: none)

    ZfCudaStats* st = &dev->stats;
    cudaCheck(cudaEventCreate(&st->step_begin));
    cudaCheck(cudaEventCreateWithFlags(&st->step_end, cudaEventBlockingSync));  // waited for every step
    for (int i = 0; i < ZF_MAX_STALLS; i++) {
        cudaCheck(cudaEventCreate(&st->stall_begin[i]));
        cudaCheck(cudaEventCreate(&st->stall_end[i]));
    }
}

static void zf_cuda_free(ZenFlow* zf, ZfCudaDevice* dev) {
    zf_wait_idle(zf);  // no job may touch the device or a pinned buffer any more
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
    ZfCudaStats* st = &dev->stats;
    cudaCheck(cudaEventDestroy(st->step_begin));
    cudaCheck(cudaEventDestroy(st->step_end));
    for (int i = 0; i < ZF_MAX_STALLS; i++) {
        cudaCheck(cudaEventDestroy(st->stall_begin[i]));
        cudaCheck(cudaEventDestroy(st->stall_end[i]));
    }
    cudaCheck(cudaEventDestroy(dev->autou.done));
    mapped_free(dev->autou.host);
    ZfGrid* grids[] = {&dev->gpu, &dev->cpu_tiles, &dev->cpu_chunks, &dev->vectors};
    for (ZfGrid* g : grids) { zf_grid_free(g); }
    void* device_bufs[] = {dev->order, dev->vector_order, dev->m, dev->v, dev->scores, dev->score_partial,
                           dev->autou.partial};
    for (void* p : device_bufs) { cudaCheck(cudaFree(p)); }
    free(dev->h_order);
    free(dev->groups);
    free(dev->host_moments);
    memset(dev, 0, sizeof(*dev));
}

// ============================================================================
// Stall and step measurement (spec 8)
// ============================================================================
// Measured on the default stream: each wait of that stream for a copy, and each time the
// main thread blocks on the CPU side (zenflow.h's host_blocks: a wait for the CPU threads, a
// synchronous update, a whole selection with its migration), is bracketed by two timing
// events; their elapsed time is how long the GPU had nothing to do (a selection's and the
// warm-up start's own kernels and copies, queued inside their bracket, count as stall too).
// Compute = the step's elapsed time on the default stream minus the stall.

// what one step cost (zf_cuda_step_end)
typedef struct {
    double gpu_ms;      // default stream, from the step's first to its last event
    double stall_ms;    // of that: waiting for a copy or for the CPU side
    double compute_ms;  // gpu_ms - stall_ms
    double cpu_ms;      // CPU optimizer work that finished during the step (any thread, whole jobs)
    double d2h_bytes, h2d_bytes;  // ZenFlow's PCIe traffic of the step
} ZfStepStats;

// the default stream waits for an event; timed as a stall unless the host is blocked anyway
static void zf_cuda_compute_waits(ZfCudaDevice* dev, cudaEvent_t event) {
    ZfCudaStats* st = &dev->stats;
    int timed = !st->blocking && st->num_stalls < ZF_MAX_STALLS;
    if (timed) { cudaCheck(cudaEventRecord(st->stall_begin[st->num_stalls], 0)); }
    int span = gpu_trace_begin(0);
    cudaCheck(cudaStreamWaitEvent(0, event, 0));
    gpu_trace_end(span, 0, TRACE_WAIT, "GPU waits for a copy");
    if (timed) { cudaCheck(cudaEventRecord(st->stall_end[st->num_stalls++], 0)); }
}

// the main thread blocks on the CPU side: the default stream runs dry from here on
static void zf_cuda_host_blocks(void* ctx, int begin) {
    ZfCudaStats* st = &((ZfCudaDevice*)ctx)->stats;
    if (begin) {
        st->blocking = st->num_stalls < ZF_MAX_STALLS;
        if (st->blocking) { cudaCheck(cudaEventRecord(st->stall_begin[st->num_stalls], 0)); }
    } else if (st->blocking) {
        cudaCheck(cudaEventRecord(st->stall_end[st->num_stalls++], 0));
        st->blocking = 0;
    }
}

// Call zf_cuda_step_begin before the step's forward pass and zf_cuda_step_end after zf_step;
// step_end waits for the default stream (not for copies still running on the others: they
// belong to the next step's overlap).
static void zf_cuda_step_begin(ZfCudaDevice* dev, const ZenFlow* zf) {
    ZfCudaStats* st = &dev->stats;
    st->num_stalls = 0;
    st->blocking = 0;
    st->d2h_bytes = st->h2d_bytes = 0;
    st->cpu_ms_at_begin = zf_cpu_work_ms(zf);
    cudaCheck(cudaEventRecord(st->step_begin, 0));
}

static ZfStepStats zf_cuda_step_end(ZfCudaDevice* dev, const ZenFlow* zf) {
    ZfCudaStats* st = &dev->stats;
    cudaCheck(cudaEventRecord(st->step_end, 0));
    cudaCheck(cudaEventSynchronize(st->step_end));
    ZfStepStats out;
    memset(&out, 0, sizeof(out));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, st->step_begin, st->step_end));
    out.gpu_ms = ms;
    for (int i = 0; i < st->num_stalls; i++) {
        cudaCheck(cudaEventElapsedTime(&ms, st->stall_begin[i], st->stall_end[i]));
        out.stall_ms += ms;
    }
    out.compute_ms = out.gpu_ms - out.stall_ms;
    out.cpu_ms = zf_cpu_work_ms(zf) - st->cpu_ms_at_begin;
    out.d2h_bytes = (double)st->d2h_bytes;
    out.h2d_bytes = (double)st->h2d_bytes;
    return out;
}

#endif  // ZENFLOW_CUH
