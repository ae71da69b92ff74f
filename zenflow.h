/*
ZenFlow (docs/zenflow_spec.md section 4), written once for both trainers.

Who owns what (spec 3), for one weight matrix W (OC rows, IC columns), k = 0.2:

        columns:   0  1  2  3  4  5  6  7  8  9      G: the GPU updates these every step, with
                  [c  c  G  c  c  c  c  G  c  c]        their Adam moments on the GPU
                                                     c: the CPU updates these once a window of
                                                        U steps, from the window's summed gradient
Each side keeps its columns PACKED, so that its AdamW runs over one flat array: the CPU's master
p, m, v and the window's sum A are [col 0 | col 1 | col 3 | ... | col 9] of every matrix, column
after column, one transfer group after another (the embeddings, then layer 0, layer 1, ...), so
that one layer's columns move in one copy (the GPU's moments go row by row: zenflow.cuh). The
working copy stays on the device in the model's layout; the backend (ZfBackend) moves columns.

The file reads in the order of one default step (zenflow, k 0.1, U 4, overlap, accumulation on
the CPU, transfers layer by layer): the state; how jobs are run and waited for; before and
during the backward; the selection, the boundary and zf_step itself; the two CPU jobs; the
drain. Each option enters the step through one named call (-za gpu: two; synchronous updates
one more, in the drain) and lives below; then setup, checkpoints, the measurement and the
command line. docs/teaching.md, section 5, explains the threads and what each option costs.
*/
#ifndef ZENFLOW_H
#define ZENFLOW_H

#include <algorithm>
#include <vector>

#include "cpu_adam.h"
#include "llmc/gpt2_file.h"
#include "llmc/trace.h"
#include "llmc/utils.h"

// ----------------------------------------------------------------------------
// configuration (spec 2)

typedef enum { ZF_MODE_ADAMW = 0, ZF_MODE_OFFLOAD = 1, ZF_MODE_ZENFLOW = 2 } ZfMode;
static const char* const zf_mode_names[3] = {"adamw", "offload", "zenflow"};

// -za: where the window's gradient sum A forms (spec 7): on the CPU (the paper's: every step
// the CPU-owned gradient columns go to the host and are added up there) or on the GPU (the
// gradient buffer keeps adding them up, and A goes to the host once, at the window's end)
typedef enum { ZF_ACCUMULATE_CPU = 0, ZF_ACCUMULATE_GPU = 1 } ZfAccumulate;
static const char* const zf_accumulate_names[2] = {"cpu", "gpu"};

#define ZF_AUTO 0  // update_interval: auto (spec 6)

typedef struct {
    ZfMode mode;
    double topk;                // k: fraction of each matrix's columns the GPU owns
    int update_interval;        // U: steps per CPU window; ZF_AUTO: decided by spec 6
    int select_interval;        // S: steps between reselections, 0 = select once
    int warmup;                 // W: the first W steps are synchronous offload
    int overlap;                // 1: the CPU's window update runs in the background
    int accumulate;             // ZF_ACCUMULATE_CPU or ZF_ACCUMULATE_GPU
    int max_update_interval;    // U_max: with auto U, the longest window
    int pipeline;               // 1: transfers layer by layer (spec 7; the trainer calls the layer hooks)
    const char* selection_log;  // if set: every selection's columns and scores go to this file
} ZfConfig;

// the defaults of spec sections 2 and 6; S = 100 (docs/zenflow_spec.md, section 10)
static const ZfConfig ZF_DEFAULTS = {ZF_MODE_ZENFLOW, 0.1, 4, 100, 0, 1, ZF_ACCUMULATE_CPU, 16, 1, NULL};

// The three modes are settings of one design (spec 2): adamw = k 1 (the CPU owns nothing),
// offload = k 0, U 1, no overlap (the CPU owns every matrix element). With k 0 or 1 a
// reselection could only pick the same columns again (S = 0), and with U = 1 both
// accumulations move the same bytes, so the baselines use the paper's.
static inline ZfConfig zf_effective_config(ZfConfig c) {
    if (c.mode == ZF_MODE_ADAMW) { c.topk = 1.0; c.update_interval = 1; c.select_interval = 0; c.overlap = 0; c.warmup = 0; }
    if (c.mode == ZF_MODE_OFFLOAD) { c.topk = 0.0; c.update_interval = 1; c.select_interval = 0; c.overlap = 0; c.warmup = 0; }
    if (c.mode != ZF_MODE_ZENFLOW) { c.accumulate = ZF_ACCUMULATE_CPU; }
    return c;
}

// spec 2: n_sel = floor(k * IC + 0.5), in double like the reference (k as parsed from the flag)
static inline int zf_n_sel(double k, int cols) { return (int)floor(k * cols + 0.5); }

// ----------------------------------------------------------------------------
// state

// one weight matrix (spec 1): wte, wpe, or one layer's slice of qkvw/attprojw/fcw/fcprojw
typedef struct {
    char name[32];        // e.g. "qkvw.3"
    size_t offset;        // of W[0, 0] in the parameter buffer
    int rows, cols;       // OC, IC
    int layer;            // its transformer layer, -1 for wte and wpe (transfer group 1 + layer)
    int first_col;        // its columns' place among all matrices' (the scores, 4.2.2)
    int n_sel;            // columns the GPU owns now: zf_n_sel, floor(k * IC + 0.5) (0 during warm-up)
    int* cols_by_owner;   // (cols): the n_sel selected columns ascending, then the rest ascending
    size_t cpu_offset;    // where its CPU-owned columns start in the packed CPU buffers
    size_t gpu_offset;    // where its GPU-owned columns start in the GPU moments, after vector_elems
} ZfMatrix;

// a contiguous run of vector parameters (one 1-D tensor, e.g. all L layers' ln1w)
typedef struct {
    size_t offset, n;
} ZfVector;

struct ZenFlow;

// What a device does, in the spec's order (per layer, most gradient columns leave during the
// backward). `group`: -1 moves every CPU-owned column, g >= 0 transfer group g's (0: wte, wpe;
// 1 + l: layer l's four matrices). "asynchronous": a host buffer may be read (grads_to_host) or
// written (params_from_host) once host_wait on it has returned. Optional entries may be NULL.
typedef struct {
    void* ctx;
    // the step: zero the gradients before the backward (all = 0: only the GPU-owned parts,
    // -za gpu), AdamW on the GPU-owned elements (4.3), the CPU-owned gradient columns down
    // (4.4, asynchronous), the CPU's result up (4.6, asynchronous)
    void (*zero_grads)(void* ctx, const struct ZenFlow* zf, int all);
    void (*gpu_adam)(void* ctx, const struct ZenFlow* zf, ZfAdamHyper h, int step);
    void (*grads_to_host)(void* ctx, const struct ZenFlow* zf, float* host, int group);
    void (*params_from_host)(void* ctx, const struct ZenFlow* zf, const float* host, int group);
    // optional: the updater thread starts the result's copy as soon as the update is done
    void (*params_prefetch)(void* ctx, const struct ZenFlow* zf, const float* host);
    // block until no copy into or out of this host buffer is in flight any more
    void (*host_wait)(void* ctx, const float* host);
    // a selection (4.2): every matrix's column scores (sum over rows of g^2) into
    // scores[first_col ..]; the new ownership; the GPU's moments to and from zenflow.h's packed
    // layout (vectors, then each matrix's selected columns); the CPU-owned parameter columns down
    void (*column_scores)(void* ctx, const struct ZenFlow* zf, float* scores);
    void (*selection_changed)(void* ctx, const struct ZenFlow* zf);
    void (*moments_to_host)(void* ctx, const struct ZenFlow* zf, float* m, float* v);
    void (*moments_from_host)(void* ctx, const struct ZenFlow* zf, const float* m, const float* v);
    void (*params_to_host)(void* ctx, const struct ZenFlow* zf, float* host);
    // the rest is not the default step's. The measurement (optional): the main thread blocks
    // from begin = 1 to begin = 0, a stall (spec 8). The options: auto U's sums of |g| per
    // matrix (spec 6; asynchronous where abs_sums_wait is set), resuming -za gpu's open window.
    void (*host_blocks)(void* ctx, int begin);
    void (*abs_sums)(void* ctx, const struct ZenFlow* zf, double* sel, double* cpu);
    void (*abs_sums_wait)(void* ctx, const struct ZenFlow* zf);
    void (*grads_from_host)(void* ctx, const struct ZenFlow* zf, const float* host);
    int host_moment_copies;  // host buffers of all GPU moments the backend keeps in zenflow mode
} ZfBackend;

// a job on one of the CPU's worker threads; ticket -1: none
typedef struct ZfTicket {
    ZfWorker* thread;
    long ticket;
} ZfTicket;

static const ZfTicket zf_no_job = {NULL, -1};

// one step's accumulation A += g_t (spec 4.4), reading only frozen buffers (spec 5)
typedef struct {
    struct ZenFlow* zf;
    const float* grads;  // this step's CPU-owned gradient: a landing buffer
    float* acc;          // A of the open window
    size_t n;            // CPU-owned elements
    int first;           // first step of the window: A = 0 + g_t
} ZfAccumulateJob;

// one window's CPU update (spec 4.6)
typedef struct {
    struct ZenFlow* zf;
    const float* acc;  // A of the window: the accumulation `after` still adds into it, no one after it
    int count;         // n
    int step;          // s = t + 1 of the boundary step: the global step (spec 3), not a count of CPU updates
    ZfAdamHyper hyper;
    int prefetch;      // 1 (in the background): start the result's copy to the device when done
    ZfTicket after;    // the window's last accumulation, which the update waits for first
    double ms;         // out: how long the update took (without waiting for copies)
} ZfWindowJob;

typedef struct {  // ownership (spec 1, 3)
    int num_matrices;
    ZfMatrix* matrices;    // (num_matrices)
    int num_vectors;
    ZfVector vectors[NUM_PARAMETER_TENSORS];
    size_t vector_elems;   // all vector parameters: the first part of the GPU moments
    size_t matrix_elems;   // M: all matrix elements
    size_t cpu_elems;      // matrix elements the CPU owns now
    size_t gpu_sel_elems;  // matrix elements the GPU owns now
    size_t cpu_capacity, gpu_capacity;  // the most either side can own (the GPU moments: + vector_elems)
    int total_cols;        // every matrix's cols (the scores)
    int num_groups;        // transfer groups (spec 7): 1 + L
    int* group_mats;       // (num_matrices) the matrices group by group: group g's are
    int* group_start;      // (num_groups + 1) group_mats[group_start[g] .. group_start[g + 1])
} ZfOwnership;

typedef struct {  // the CPU side (spec 3, 5)
    float *master, *m, *v;   // (cpu_capacity) packed: fp32 master values and Adam moments
    ZfWorker* updater;       // overlap: the window updates
    ZfWorker* accumulator;   // overlap and accumulation on the CPU: the per-step accumulations
    int updater_threads, accumulator_threads;  // their OpenMP teams (0: no such thread)
} ZfCpuSide;

// With overlap the two buffers take turns, one step each: a step's buffer was last read by
// the accumulation of two steps before, usually done by then, so the columns leave at once.
typedef struct {  // where g_t's CPU-owned columns land on the host (accumulation on the CPU)
    int count;               // 2 with overlap, used in turns; else 1
    float* buf[2];           // (cpu_capacity)
    ZfTicket last_reader[2]; // the last job that reads buf[i]
    ZfAccumulateJob jobs[2]; // ... the accumulation reading buf[i]
    int current;             // this step's (zf_before_backward turns it)
} ZfLanding;

typedef struct {  // the window (spec 4.5, 4.6)
    int n;                   // steps in the open window
    float *acc, *acc_job;    // (cpu_capacity) A of the open window; of the window in the updater
    int pending;             // a window's result waits to be applied (overlap)
    ZfTicket job_ticket;     // its update, until waited for
    ZfWindowJob job;
} ZfWindow;

typedef struct {  // selection (4.2)
    int last_step, count;    // the last selection's step; how many so far
    int moved_columns;       // columns that moved to the GPU at the last selection
    // the CPU's moments in the new layout (cpu_capacity each); host copies of all GPU moments
    // before and after (vector_elems + gpu_capacity each, matrix columns packed column by
    // column like the CPU's), for migrations and checkpoints
    float *m_new, *v_new, *gpu_m_old, *gpu_v_old, *gpu_m_new, *gpu_v_new;
} ZfSelection;

typedef struct {  // per-layer pipelining (spec 7)
    float* early_dest;       // (cpu_capacity) this step's gradient columns leave layer by layer into it
    int next_group;          // ... the next to leave (num_groups - 1 down to 0)
    const float* apply_src;  // (cpu_capacity) a synchronous update to apply layer by layer (NULL: none)
    int next_apply_group;    // ... from this group on
} ZfPipeline;

// auto U's sum of |A| per matrix, on the accumulator thread after the step's accumulation
typedef struct {
    struct ZenFlow* zf;
    const float* acc;
} ZfAbsSumJob;

typedef struct {  // auto U (spec 6): step t's sums decide, at step t + 1's boundary, whether t + 1 closes
    double* c_sum;           // (num_matrices) sum of c over the open window's evaluated steps
    double* sum_sel;         // (num_matrices) the step's sum of |g| over each matrix's GPU-owned
    double* sum_cpu;         // (num_matrices) ... and of |A| over its CPU-owned elements
    int close_next;          // the next step closes the window
    int closed;              // steps in the window the last step closed (0: none), for the step line
    int pending;             // the last step's sums are on their way
    ZfTicket job;            // ... and, accumulation on the CPU, the job that sums |A|
    ZfAbsSumJob sum_job;
} ZfAutoU;

typedef struct {  // measurement and reporting
    double select_ms;        // host time of the last zf_step's selection, 0 if none
    double cpu_update_ms;    // duration of the last finished window update ...
    long cpu_updates, cpu_updates_shown;  // ... how many have finished, and been reported
    long long cpu_work_us;   // all CPU optimizer work so far; every thread that runs a job adds
    int stall_depth;         // zf_stall_begin's nesting (a selection drains the CPU side)
    int failed_step;         // the step whose job a fault injection failed
    long groups_out, groups_in;  // transfer groups moved layer by layer so far
    FILE* selection_log;     // cfg.selection_log, open
    double host_need_mib, host_available_mib;  // the host-memory check at init ...
    const char* host_source;                   // ... and where the second figure comes from
} ZfStats;

typedef struct ZenFlow {
    ZfConfig cfg;  // the effective one (zf_effective_config)
    ZfBackend backend;
    ZfOwnership own;
    ZfCpuSide cpu;
    ZfLanding landing;
    ZfWindow win;
    ZfSelection sel;
    ZfPipeline pipe;
    ZfAutoU autou;
    ZfStats stats;
} ZenFlow;

// defined below: the options' entry points, the measurement's, and the CPU's two jobs
static inline void zf_warmup_start(ZenFlow* zf);
static inline void zf_step_synchronous(ZenFlow* zf, int t, ZfAdamHyper hyper);
static inline void zf_gpu_sum_before_backward(ZenFlow* zf, int t, int may_leave);
static inline void zf_step_gpu_sum(ZenFlow* zf, int t, ZfAdamHyper hyper);
static inline void zf_apply_pending(ZenFlow* zf);
static inline int zf_auto_step(ZenFlow* zf, int t, int n);
static inline void zf_log_selection(ZenFlow* zf, int t, int index, const float* scores);
static inline FILE* zf_selection_log(ZenFlow* zf);
static inline double zf_stall_begin(ZenFlow* zf);
static inline void zf_stall_end(ZenFlow* zf, double t0, const char* what);
static inline double zf_cpu_work_done(ZenFlow* zf, TraceTrack track, const char* what, double t0);
static inline ZfJobFn zf_fault_injection(ZenFlow* zf, ZfJobFn fn, int s);
static int zf_accumulate(void* arg);  // the CPU's two jobs, and the drain: at the end of the default step
static int zf_window_update(void* arg);
static inline void zf_drain(ZenFlow* zf);

// ============================================================================
// The default step
// ============================================================================

// ----------------------------------------------------------------------------
// running and waiting for the CPU's jobs (the drain, at the end, waits for all of them)

// A failed job stops training with one line naming its thread; called every step and after
// every wait. The accumulator first: an update that waited for a failed accumulation fails too.
static inline void zf_check_workers(ZenFlow* zf) {
    int status = zf_worker_error(zf->cpu.accumulator);
    if (status != 0) {
        fatal("the CPU accumulator failed with code %d (the accumulation of step %d)", status, zf->stats.failed_step);
    }
    status = zf_worker_error(zf->cpu.updater);
    if (status != 0) {
        fatal("the CPU updater failed with code %d (the window update handed over at step %d)", status, zf->win.job.step);
    }
}

// hands a job of step s to a worker thread; returns how to wait for it
static inline ZfTicket zf_submit_job(ZenFlow* zf, ZfWorker* thread, ZfJobFn fn, void* arg, int s) {
    fn = zf_fault_injection(zf, fn, s);  // test hook (dev/test/test_failures.py): fn, or a job that fails
    return ZfTicket{thread, zf_worker_submit(thread, fn, arg)};
}

// Waits for one job, and so for every earlier job of its thread. While the main thread blocks
// here the GPU gets no new work: once its queue runs dry it idles, a stall (spec 8), which
// zf_stall_begin and zf_stall_end measure. (The GPU's own waits for copies: zf_cuda_compute_waits.)
static inline void zf_wait_job(ZenFlow* zf, ZfTicket job) {
    if (!zf_worker_finished(job.thread, job.ticket)) {  // else (or no job) no wait, and no stall
        double t0 = zf_stall_begin(zf);
        zf_worker_wait(job.thread, job.ticket);
        zf_stall_end(zf, t0, "wait for CPU");
    }
    zf_check_workers(zf);  // a failed job stops training here
}

// ----------------------------------------------------------------------------
// before the backward pass of step t (spec 7), which ADDS into the gradient buffer

// 4.2 does zf_step(t) select? At t == W, then at a window's start once S steps have passed.
static inline int zf_selects_at(const ZenFlow* zf, int t) {
    const ZfConfig* cfg = &zf->cfg;
    if (t < cfg->warmup) { return 0; }
    int first = zf->sel.last_step < 0;
    int due = cfg->select_interval > 0 && zf->win.n == 0 && t - zf->sel.last_step >= cfg->select_interval;
    return first || due;
}

// Zeroes the gradients and picks this step's landing buffer (with overlap, two take turns).
// The layers' columns leave during the backward only if the ownership is known (t > 0: zf_step
// sets it; no selection now) and the buffer's last reader, two steps old, is done: no wait.
static inline void zf_before_backward(ZenFlow* zf, int t) {
    ZfLanding* l = &zf->landing;
    const int may_leave = zf->cfg.pipeline && t > 0 && !zf_selects_at(zf, t) && zf->own.cpu_elems > 0;
    zf->pipe.early_dest = NULL;
    if (zf->cfg.accumulate == ZF_ACCUMULATE_GPU) {  // option: -za gpu
        zf_gpu_sum_before_backward(zf, t, may_leave);
        return;
    }
    zf->backend.zero_grads(zf->backend.ctx, zf, 1);
    l->current = (l->current + 1) % l->count;
    const ZfTicket reader = l->last_reader[l->current];
    if (!may_leave || !zf_worker_finished(reader.thread, reader.ticket)) { return; }
    zf->pipe.early_dest = l->buf[l->current];
    zf->pipe.next_group = zf->own.num_groups - 1;
}

// ----------------------------------------------------------------------------
// during the backward pass: a layer's gradient is final once its backward is done

// Hook: the trainer calls this after each layer's backward (l = L - 1 down to 0). The
// gradients of layer l and every layer above it are final: their transfer groups leave.
static inline void zf_backward_layer_done(ZenFlow* zf, int l) {
    ZfPipeline* p = &zf->pipe;
    if (p->early_dest == NULL) { return; }
    for (; p->next_group >= 1 + l; p->next_group--) {
        zf->backend.grads_to_host(zf->backend.ctx, zf, p->early_dest, p->next_group);
        zf->stats.groups_out++;
    }
}

// ----------------------------------------------------------------------------
// the step: once the backward pass of step t has produced g_t (on a GPU: has been queued)

// 4.4: g_t's CPU-owned columns (-za gpu: A) to `host`, all at once. If the layers' columns
// left during the backward (early_dest is `host`), only group 0 is left: the embeddings, whose
// gradient is final only after the whole backward.
static inline void zf_grads_to_host(ZenFlow* zf, float* host) {
    if (zf->pipe.early_dest == NULL) {
        zf->backend.grads_to_host(zf->backend.ctx, zf, host, -1);
        return;
    }
    zf_backward_layer_done(zf, -1);
    zf->pipe.early_dest = NULL;
}

// 4.4: g_t's CPU-owned columns land in this step's landing buffer, once its last reader is
// done; returns it
static inline float* zf_land_grads(ZenFlow* zf) {
    ZfLanding* l = &zf->landing;
    zf_wait_job(zf, l->last_reader[l->current]);  // none if they left early (then it was done)
    zf_grads_to_host(zf, l->buf[l->current]);
    return l->buf[l->current];
}

// Lays out the packed buffers for the current ownership (cols_by_owner, n_sel), one transfer
// group after another on both sides
static inline void zf_layout(ZenFlow* zf) {
    ZfOwnership* own = &zf->own;
    size_t cpu = 0, gpu = 0;
    for (int k = 0; k < own->num_matrices; k++) {
        ZfMatrix* mat = &own->matrices[own->group_mats[k]];
        mat->cpu_offset = cpu;
        mat->gpu_offset = gpu;
        cpu += (size_t)(mat->cols - mat->n_sel) * mat->rows;
        gpu += (size_t)mat->n_sel * mat->rows;
    }
    own->cpu_elems = cpu;
    own->gpu_sel_elems = gpu;
}

// Where the column of rank r in cols_by_owner keeps its (m, v). GPU-owned (*on_gpu = 1): in
// the host copy of the GPU's moments, after the vectors', column by column like the CPU's (the
// backend transposes its row-by-row layout on the way). CPU-owned: in the CPU's packed buffers.
static inline size_t zf_moments_at(const ZfMatrix* mat, int r, size_t vector_elems, int* on_gpu) {
    *on_gpu = r < mat->n_sel;
    if (*on_gpu) { return vector_elems + mat->gpu_offset + (size_t)r * mat->rows; }
    return mat->cpu_offset + (size_t)(r - mat->n_sel) * mat->rows;
}

// 4.2.4 migrate matrix i: every column's (m, v) moves from where the old ownership `old` kept
// it (the CPU's m, v, or gpu_m_old, gpu_v_old) to where the new one keeps it (m_new, v_new, or
// gpu_m_new, gpu_v_new). None is reset or lost.
static inline void zf_migrate(ZenFlow* zf, int i, const ZfMatrix* old) {
    ZfSelection* sel = &zf->sel;
    const ZfMatrix* mat = &zf->own.matrices[i];
    const size_t V = zf->own.vector_elems, bytes = (size_t)mat->rows * sizeof(float);
    std::vector<int> old_rank(mat->cols);
    for (int r = 0; r < mat->cols; r++) { old_rank[old->cols_by_owner[r]] = r; }
    // on all threads: one reaches a fraction of the memory bandwidth (GPT-2 1.5B: 12 GB)
    int moved = 0;
#pragma omp parallel for schedule(static) reduction(+ : moved)
    for (int r = 0; r < mat->cols; r++) {
        int from_gpu, to_gpu;
        size_t from = zf_moments_at(old, old_rank[mat->cols_by_owner[r]], V, &from_gpu);
        size_t to = zf_moments_at(mat, r, V, &to_gpu);
        memcpy((to_gpu ? sel->gpu_m_new : sel->m_new) + to, (from_gpu ? sel->gpu_m_old : zf->cpu.m) + from, bytes);
        memcpy((to_gpu ? sel->gpu_v_new : sel->v_new) + to, (from_gpu ? sel->gpu_v_old : zf->cpu.v) + from, bytes);
        moved += to_gpu && !from_gpu;
    }
    sel->moved_columns += moved;
}

// 4.2 the selection
static inline void zf_select(ZenFlow* zf, int t) {
    const ZfBackend* be = &zf->backend;
    ZfOwnership* own = &zf->own;
    ZfSelection* sel = &zf->sel;
    // 4.2.1 drain (zf_drain, the default step's last function): the working copy then equals the
    // CPU master on every CPU-owned column, and the CPU threads are idle: the layouts change now
    zf_drain(zf);
    // keep the old ownership; the GPU's moments of its old columns come to the host, unless
    // this is the very first selection without warm-up: no optimizer state exists yet
    std::vector<ZfMatrix> old(own->matrices, own->matrices + own->num_matrices);
    std::vector<int> old_order(own->total_cols);
    for (ZfMatrix& mat : old) {
        memcpy(&old_order[mat.first_col], mat.cols_by_owner, mat.cols * sizeof(int));
        mat.cols_by_owner = &old_order[mat.first_col];
    }
    const int fresh = sel->count == 0 && zf->cfg.warmup == 0;
    if (!fresh) { be->moments_to_host(be->ctx, zf, sel->gpu_m_old, sel->gpu_v_old); }

    // 4.2.2 and 4.2.3: score every column of g_t, keep each matrix's n_sel best (ties: lower index)
    std::vector<float> scores(own->total_cols);
    be->column_scores(be->ctx, zf, scores.data());
    sel->moved_columns = 0;
    for (int i = 0; i < own->num_matrices; i++) {
        ZfMatrix* mat = &own->matrices[i];
        const float* score = scores.data() + mat->first_col;
        int n_sel = zf_n_sel(zf->cfg.topk, mat->cols);
        int* order = mat->cols_by_owner;
        for (int j = 0; j < mat->cols; j++) { order[j] = j; }
        std::stable_sort(order, order + mat->cols, [&](int a, int b) { return score[a] > score[b]; });
        std::sort(order, order + n_sel);               // selected, ascending
        std::sort(order + n_sel, order + mat->cols);  // the rest, ascending
        mat->n_sel = n_sel;
        if (zf->cfg.selection_log != NULL) { zf_log_selection(zf, t, i, score); }
    }
    zf_layout(zf);

    // 4.2.4 migrate every column's moments (the vectors' stay where they are)
    if (fresh) {
        for (int i = 0; i < own->num_matrices; i++) { sel->moved_columns += own->matrices[i].n_sel; }
    } else {
        for (int i = 0; i < own->num_matrices; i++) { zf_migrate(zf, i, &old[i]); }
        std::swap(zf->cpu.m, sel->m_new);
        std::swap(zf->cpu.v, sel->v_new);
        memcpy(sel->gpu_m_new, sel->gpu_m_old, own->vector_elems * sizeof(float));
        memcpy(sel->gpu_v_new, sel->gpu_v_old, own->vector_elems * sizeof(float));
    }
    be->selection_changed(be->ctx, zf);
    if (!fresh) { be->moments_from_host(be->ctx, zf, sel->gpu_m_new, sel->gpu_v_new); }  // (fresh: all zero there)
    // the master of the new CPU columns: after the drain the working copy holds every
    // column's current value (the GPU's own columns, and the CPU's applied ones)
    be->host_wait(be->ctx, zf->cpu.master);  // the apply's copy has finished reading the old master
    be->params_to_host(be->ctx, zf, zf->cpu.master);
    sel->last_step = t;
    sel->count++;
}

// 4.5 step t joins the window, which closes after U steps (in warm-up every step; auto U: as
// spec 6 decides). Returns the window's n if it closed, else 0; the next one starts at n = 0.
static inline int zf_window_step(ZenFlow* zf, int t) {
    const int n = zf->win.n + 1;
    const int closes = zf->cfg.update_interval == ZF_AUTO ? zf_auto_step(zf, t, n)  // option: auto U
                                                          : t < zf->cfg.warmup || n >= zf->cfg.update_interval;
    zf->win.n = closes ? 0 : n;
    return closes ? n : 0;
}

// waits for the window update in flight (if any), without applying its result
static inline void zf_wait_window(ZenFlow* zf) {
    ZfWindow* w = &zf->win;
    if (w->job_ticket.ticket < 0) { return; }
    zf_wait_job(zf, w->job_ticket);
    zf->stats.cpu_update_ms = w->job.ms;
    zf->stats.cpu_updates++;
    w->job_ticket = zf_no_job;
}

// 4.6 window w-1's result (if any) into the working copy: waits for its update, then applies
static inline void zf_wait_and_apply(ZenFlow* zf) {
    if (!zf->win.pending) { return; }
    zf_wait_window(zf);
    zf->backend.params_from_host(zf->backend.ctx, zf, zf->cpu.master, -1);
    zf->win.pending = 0;
}

// 4.6 with overlap (spec 5): window w's update, with A = acc_job, goes to the updater thread.
// It starts once `after` is done; the next boundary applies it, one window late.
static inline void zf_submit_window(ZenFlow* zf, ZfTicket after, int n, int s, ZfAdamHyper hyper) {
    ZfWindow* w = &zf->win;
    w->job = ZfWindowJob{zf, w->acc_job, n, s, hyper, 1, after, 0.0};
    w->job_ticket = zf_submit_job(zf, zf->cpu.updater, zf_window_update, &w->job, s);
    w->pending = 1;
}

// Spec 4: one ZenFlow step, once the backward pass of step t has produced g_t; hyper.lr is
// lr(t). Before the forward pass of step t + 1 the working copy holds what it must show.
static inline void zf_step(ZenFlow* zf, int t, ZfAdamHyper hyper) {
    const ZfBackend* be = &zf->backend;
    const int s = t + 1;
    zf_check_workers(zf);    // a failed CPU job stops training here, naming its thread
    if (t == 0 && zf->cfg.warmup > 0) { zf_warmup_start(zf); }  // option: warm-up (4.1)

    // 4.2 selection: at t == W, then at a window's start once S steps have passed. A stall (spec
    // 8): the drain waits for the window update handed over one step before (if any), then it selects.
    zf->stats.select_ms = 0.0;
    if (zf_selects_at(zf, t)) {
        double t0 = zf_stall_begin(zf);
        zf_select(zf, t);
        zf->stats.select_ms = now_ms() - t0;
        zf_stall_end(zf, t0, "select + migrate");
    }

    // 4.3 the GPU updates its selected columns and the vectors, with g_t
    be->gpu_adam(be->ctx, zf, hyper, s);

    // The CPU's part runs in the background, or here and now: offload, warm-up, -zv 0, a CPU that
    // owns nothing (adamw mode).
    if (!zf->cfg.overlap || t < zf->cfg.warmup || zf->own.cpu_elems == 0) {  // option: synchronous
        zf_step_synchronous(zf, t, hyper);
        return;
    }
    if (zf->cfg.accumulate == ZF_ACCUMULATE_GPU) {  // option: -za gpu
        zf_step_gpu_sum(zf, t, hyper);
        return;
    }
    // 4.4 accumulate: g_t's CPU-owned columns land on the host, and the accumulator thread adds
    // them into A
    ZfLanding* l = &zf->landing;
    float* g = zf_land_grads(zf);
    ZfAccumulateJob* job = &l->jobs[l->current];
    *job = ZfAccumulateJob{zf, g, zf->win.acc, zf->own.cpu_elems, zf->win.n == 0};
    const ZfTicket accumulation = zf_submit_job(zf, zf->cpu.accumulator, zf_accumulate, job, s);
    l->last_reader[l->current] = accumulation;  // it reads the landing buffer until done

    // 4.5 the boundary: the window of n steps closes, and the next starts with n = 0
    const int n = zf_window_step(zf, t);
    if (n == 0) { return; }
    // 4.6 apply window w-1's result; its update has read acc_job, free now. Window w's A becomes
    // acc_job, for the updater, which first waits for this step's accumulation (still adding into
    // it). The next window's first accumulation writes acc = 0 + g: the spec's A = 0.
    zf_wait_and_apply(zf);
    std::swap(zf->win.acc, zf->win.acc_job);
    zf_submit_window(zf, accumulation, n, s, hyper);
}

// ----------------------------------------------------------------------------
// the CPU jobs (spec 4.4, 4.6), on the worker threads with overlap, else here and now

// spec 4.4: A += g_t for the CPU-owned elements (A = 0 + g_t at a window's first step)
static int zf_accumulate(void* arg) {
    ZfAccumulateJob* job = (ZfAccumulateJob*)arg;
    const ZfBackend* be = &job->zf->backend;
    be->host_wait(be->ctx, job->grads);  // the copy of g_t from the device has landed
    double t0 = now_ms();
    zf_cpu_accumulate(job->acc, job->grads, job->n, job->first);
    zf_cpu_work_done(job->zf, TRACE_CPU_ACCUMULATE, "accumulate", t0);
    return 0;
}

// spec 4.6: G = A / n, then AdamW on every CPU-owned element (all are matrix elements)
static int zf_window_update(void* arg) {
    ZfWindowJob* job = (ZfWindowJob*)arg;
    ZenFlow* zf = job->zf;
    if (job->after.ticket >= 0) {  // A is complete once the window's last accumulation is
        int status = zf_worker_wait(job->after.thread, job->after.ticket);
        if (status != 0) { return status; }  // (zf_check_workers names the accumulator)
    }
    const ZfBackend* be = &zf->backend;
    // A that came from the device (-za gpu; in a synchronous window of one step, the landing
    // buffer of g_t) has landed. The default's A never crossed: its fence is never recorded.
    be->host_wait(be->ctx, job->acc);
    be->host_wait(be->ctx, zf->cpu.master);  // the previous result has left for the device
    double t0 = now_ms();
    zf_cpu_adam_step(zf->cpu.master, zf->cpu.m, zf->cpu.v, job->acc, job->count, zf->own.cpu_elems, job->hyper,
                     job->step);
    job->ms = zf_cpu_work_done(zf, TRACE_CPU_UPDATE, "window update", t0);
    // the result may start its way to the device now; it is applied at the next boundary
    if (job->prefetch && be->params_prefetch != NULL) { be->params_prefetch(be->ctx, zf, zf->cpu.master); }
    return 0;
}

// ----------------------------------------------------------------------------
// drain (spec 4.7): at the end of training and before a selection (a checkpoint: zf_wait_idle)

// waits until the CPU threads are idle: every job submitted so far has finished (a window
// update waiting to be applied stays pending)
static inline void zf_wait_idle(ZenFlow* zf) {
    zf_wait_window(zf);
    if (!zf_worker_idle(zf->cpu.accumulator) || !zf_worker_idle(zf->cpu.updater)) {  // else no stall
        double t0 = zf_stall_begin(zf);
        zf_worker_drain(zf->cpu.accumulator);  // (either may be NULL: no such thread)
        zf_worker_drain(zf->cpu.updater);
        zf_stall_end(zf, t0, "wait for CPU");
    }
    zf_check_workers(zf);
}

// Finishes a synchronous update still going in layer by layer (option), applies the pending window
// (an open one, n < U, is not), waits for every job: no error goes unreported, nothing is traced after.
static inline void zf_drain(ZenFlow* zf) {
    zf_apply_pending(zf);
    zf_wait_and_apply(zf);
    zf_wait_idle(zf);
}

// ============================================================================
// The options, each entering the step through one named call (-za gpu: two; synchronous
// updates, one more in the drain)
// ============================================================================

// ----------------------------------------------------------------------------
// warm-up (spec 4.1): the CPU owns every matrix element for the first W steps, which are
// synchronous offload (windows of one step); the model's parameters become the CPU master.
// The first selection follows at t = W.

static inline void zf_warmup_start(ZenFlow* zf) {
    double t0 = zf_stall_begin(zf);
    for (int i = 0; i < zf->own.num_matrices; i++) { zf->own.matrices[i].n_sel = 0; }
    zf_layout(zf);
    zf->backend.selection_changed(zf->backend.ctx, zf);
    zf->backend.host_wait(zf->backend.ctx, zf->cpu.master);
    zf->backend.params_to_host(zf->backend.ctx, zf, zf->cpu.master);
    zf_stall_end(zf, t0, "warm-up: parameters to the host");
}

// ----------------------------------------------------------------------------
// does step t close its window? zf_window_step's rule, for the options that must know before
// the step's CPU part (a synchronous window of one step; -za gpu, before the backward)

static inline int zf_auto_closes(ZenFlow* zf, int n);

static inline int zf_closes_window(ZenFlow* zf, int t) {
    const int n = zf->win.n + 1;
    if (t < zf->cfg.warmup) { return 1; }
    if (zf->cfg.update_interval == ZF_AUTO) { return zf_auto_closes(zf, n); }
    return n >= zf->cfg.update_interval;
}

// ----------------------------------------------------------------------------
// synchronous updates: offload, the warm-up's steps and -zv 0 (and a CPU that owns nothing).
// The CPU's part of the step runs here and now while the device waits; its result is applied
// before the next forward pass: at once, or with -zp 1 layer by layer, each group just before
// its layer's forward (zf_forward_layer), so that the copy of layer l + 1 runs while layer l
// computes.

static inline void zf_apply_sync(ZenFlow* zf) {
    if (zf->cfg.pipeline) {
        zf->pipe.apply_src = zf->cpu.master;
        zf->pipe.next_apply_group = 0;
        return;
    }
    zf->backend.params_from_host(zf->backend.ctx, zf, zf->cpu.master, -1);
}

// runs a job of step s here and now, while the device waits: a stall
static inline void zf_run_now(ZenFlow* zf, ZfJobFn fn, void* arg, int s) {
    const char* what = fn == zf_accumulate ? "accumulation" : fn == zf_window_update ? "update" : "auto U sums";
    fn = zf_fault_injection(zf, fn, s);
    double t0 = zf_stall_begin(zf);
    int status = fn(arg);
    zf_stall_end(zf, t0, "wait for CPU (synchronous)");
    if (status != 0) { fatal("step %d: the CPU %s failed with code %d", s, what, status); }
}

static inline void zf_step_synchronous(ZenFlow* zf, int t, ZfAdamHyper hyper) {
    ZfWindow* w = &zf->win;
    const int s = t + 1, on_cpu = zf->cfg.accumulate == ZF_ACCUMULATE_CPU;
    const float* sum = w->acc;  // A
    if (on_cpu && zf->own.cpu_elems > 0) {
        const float* g = zf_land_grads(zf);
        if (w->n == 0 && zf_closes_window(zf, t)) {
            // a window of one step (offload, warm-up): A = 0 + g_t is g_t itself (a gradient is a
            // sum that starts from +0, so it is never -0, the one value 0 + g would change)
            sum = g;
        } else {
            ZfAccumulateJob job = {zf, g, w->acc, zf->own.cpu_elems, w->n == 0};
            zf_run_now(zf, zf_accumulate, &job, s);
        }
    }
    const int n = zf_window_step(zf, t);
    if (n == 0 || zf->own.cpu_elems == 0) { return; }  // (adamw mode: the CPU owns nothing)
    if (!on_cpu) { zf_grads_to_host(zf, w->acc); }       // -za gpu: A, once a window
    ZfWindowJob job = {zf, sum, n, s, hyper, 0, zf_no_job, 0.0};
    zf_run_now(zf, zf_window_update, &job, s);
    zf->stats.cpu_update_ms = job.ms;
    zf->stats.cpu_updates++;
    zf_apply_sync(zf);
}

// Hook: layer l's forward comes next (l = -1: the encoder's, which reads wte and wpe). A
// synchronous update still under way puts the groups up to that layer in place first; with
// overlap there is none after the warm-up, and this returns at once.
static inline void zf_forward_layer(ZenFlow* zf, int l) {
    ZfPipeline* p = &zf->pipe;
    if (p->apply_src == NULL) { return; }
    for (; p->next_apply_group <= 1 + l && p->next_apply_group < zf->own.num_groups; p->next_apply_group++) {
        zf->backend.params_from_host(zf->backend.ctx, zf, p->apply_src, p->next_apply_group);
        zf->stats.groups_in++;
    }
    if (p->next_apply_group == zf->own.num_groups) { p->apply_src = NULL; }
}

// finishes an apply still under way: before anything reads the working copy outside a
// forward pass (a checkpoint of the model, the end of training)
static inline void zf_apply_pending(ZenFlow* zf) { zf_forward_layer(zf, zf->own.num_groups); }

// ----------------------------------------------------------------------------
// -za gpu: the window's sum A forms in the gradient buffer (spec 7). Inside a window the
// backward adds g_t into the CPU-owned columns, which are not zeroed; A goes to the host once,
// at the window's end (layer by layer during the last step's backward, if it may).

static inline void zf_gpu_sum_before_backward(ZenFlow* zf, int t, int may_leave) {
    zf->backend.zero_grads(zf->backend.ctx, zf, zf->win.n == 0);
    if (!may_leave || !zf_closes_window(zf, t)) { return; }
    // into acc: no job reads it any more (the window job that read it last, as acc_job, was
    // waited for at the previous boundary)
    zf->pipe.early_dest = zf->win.acc;
    zf->pipe.next_group = zf->own.num_groups - 1;
}

static inline void zf_step_gpu_sum(ZenFlow* zf, int t, ZfAdamHyper hyper) {
    const int n = zf_window_step(zf, t);
    if (n == 0) { return; }
    zf_wait_and_apply(zf);
    std::swap(zf->win.acc, zf->win.acc_job);
    zf_grads_to_host(zf, zf->win.acc_job);  // A, once a window
    zf_submit_window(zf, zf_no_job, n, t + 1, hyper);
}

// ----------------------------------------------------------------------------
// auto U (spec 6): at the end of a step that does not close its window the device sums |g|
// over each matrix's GPU-owned elements (c), and |A| over its CPU-owned ones (u) is summed on
// the device (-za gpu) or by a job after the step's accumulation (-za cpu: on the accumulator
// thread, or at once without overlap); one step later (they were ready long ago) zf_auto_closes
// reads them: the window closes at the next step once max(1, floor(0.99 * matrices)) have
// u >= the window's mean c (all but one below 100 matrices), or after U_max steps.

// sum of |x[i]| over n floats, in double: fixed chunks summed in order, so the result does
// not depend on how many threads there are (an OpenMP reduction's would)
static inline double zf_abs_sum(const float* x, size_t n) {
    const size_t chunk = 1 << 16;
    const size_t chunks = (n + chunk - 1) / chunk;
    std::vector<double> part(chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        double sum = 0.0;
        for (size_t i = c * chunk; i < std::min(n, (c + 1) * chunk); i++) { sum += fabs((double)x[i]); }
        part[c] = sum;
    }
    double sum = 0.0;
    for (double p : part) { sum += p; }
    return sum;
}

// accumulation on the CPU: per matrix, the sum of |A| over its CPU-owned elements
static int zf_auto_sum_job(void* arg) {
    ZfAbsSumJob* job = (ZfAbsSumJob*)arg;
    ZenFlow* zf = job->zf;
    double t0 = now_ms();
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        zf->autou.sum_cpu[i] = zf_abs_sum(job->acc + mat->cpu_offset, (size_t)(mat->cols - mat->n_sel) * mat->rows);
    }
    zf_cpu_work_done(zf, TRACE_CPU_ACCUMULATE, "auto U sums", t0);
    return 0;
}

// the end of step t: a window closed (the next starts its evaluation afresh), or this step's
// sums start (with accumulation on the CPU, after the step's accumulation, on its thread)
static inline void zf_auto_end_step(ZenFlow* zf, int t, int closed) {
    ZfAutoU* a = &zf->autou;
    a->closed = closed;
    if (t < zf->cfg.warmup) { return; }
    if (closed > 0) {
        a->close_next = 0;
        memset(a->c_sum, 0, zf->own.num_matrices * sizeof(double));
        if (zf->cfg.selection_log != NULL) { fprintf(zf_selection_log(zf), "win %d %d\n", t, closed); }
        return;
    }
    const ZfBackend* be = &zf->backend;
    const int on_cpu = zf->cfg.accumulate == ZF_ACCUMULATE_CPU;
    be->abs_sums(be->ctx, zf, a->sum_sel, on_cpu ? NULL : a->sum_cpu);
    if (on_cpu && zf->own.cpu_elems > 0) {
        a->sum_job = ZfAbsSumJob{zf, zf->win.acc};
        if (zf->cpu.accumulator == NULL) {  // (no overlap)
            zf_run_now(zf, zf_auto_sum_job, &a->sum_job, t + 1);
        } else {
            a->job = zf_submit_job(zf, zf->cpu.accumulator, zf_auto_sum_job, &a->sum_job, t + 1);
        }
    }
    a->pending = 1;
}

// The evaluation of the last step: does the window close with its n-th step? Matrix i is
// ready when u = (sum |A| over its CPU-owned elements) / (its CPU-owned columns) >= the
// window's mean of c = (sum |g| over its GPU-owned elements) / (its GPU-owned columns).
static inline int zf_auto_closes(ZenFlow* zf, int n) {
    ZfAutoU* a = &zf->autou;
    if (!a->pending) { return a->close_next || n >= zf->cfg.max_update_interval; }
    a->pending = 0;
    // the device's sums ran in step t - 1, which the trainer waited for (zf_cuda_step_end): no stall
    if (zf->backend.abs_sums_wait != NULL) { zf->backend.abs_sums_wait(zf->backend.ctx, zf); }
    zf_wait_job(zf, a->job);  // accumulation on the CPU: the job that summed |A|
    a->job = zf_no_job;
    const int evaluated = n - 1;  // steps in the window so far, the evaluated one included
    int ready = 0;
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        const int unsel = mat->cols - mat->n_sel;
        double c = mat->n_sel > 0 ? a->sum_sel[i] / mat->n_sel : 0.0;  // no column: always ready
        double u = unsel > 0 ? a->sum_cpu[i] / unsel : 0.0;
        a->c_sum[i] += c;
        ready += u >= a->c_sum[i] / evaluated;
    }
    int needed = (int)floor(0.99 * zf->own.num_matrices);
    a->close_next = ready >= (needed > 1 ? needed : 1);
    return a->close_next || n >= zf->cfg.max_update_interval;
}

// auto U's one entry in the default step (zf_window_step): step t's decision, from step t - 1's
// sums, then the sums of step t start (with accumulation on the CPU, after the step's own)
static inline int zf_auto_step(ZenFlow* zf, int t, int n) {
    const int closes = zf_closes_window(zf, t);
    zf_auto_end_step(zf, t, closes ? n : 0);
    return closes;
}

// ----------------------------------------------------------------------------
// fault injection for dev/test/test_failures.py: ZF_FAIL_AT_STEP=s fails the window update of
// step s, ZF_FAIL_ACCUMULATE_AT_STEP=s its accumulation (the job becomes one that fails)

static int zf_failing_job(void*) { return 7; }

static inline ZfJobFn zf_fault_injection(ZenFlow* zf, ZfJobFn fn, int s) {
    if ((fn == zf_window_update && debug_fail_at("ZF_FAIL_AT_STEP", s)) ||
        (fn == zf_accumulate && debug_fail_at("ZF_FAIL_ACCUMULATE_AT_STEP", s))) {
        zf->stats.failed_step = s;
        return zf_failing_job;
    }
    return fn;
}

// ============================================================================
// Setup, checkpoints, the host memory, reporting and the command line
// ============================================================================

// ----------------------------------------------------------------------------
// the host memory. zf_init checks that the CPU side fits before it allocates its buffers:
// zf_host_zeros writes every page at once, and a CPU side that does not fit would otherwise
// be killed by the kernel's OOM killer without a word.

// zenflow mode migrates moments (4.2.4) after a warm-up and at every reselection
static inline int zf_migrates(const ZfConfig* cfg) {
    return cfg->mode == ZF_MODE_ZENFLOW && (cfg->select_interval > 0 || cfg->warmup > 0);
}

// landing buffers on the host: accumulation on the CPU one, two with overlap
static inline int zf_landing_buffers(const ZfConfig* cfg) {
    return cfg->accumulate == ZF_ACCUMULATE_CPU ? (cfg->overlap ? 2 : 1) : 0;
}

// The most host memory zf_init allocates, in bytes: master, m, v (c floats each); in zenflow
// mode the two accumulators, the GPU-side moments' four copies and the backend's (g each); the
// migration's m and v; the landing buffers. (Other modes touch more only at a checkpoint: the
// selection's host copies of the GPU's moments and, in offload mode, A, which the file holds as
// zeros; allocated, untouched until then, and not counted here.)
static inline double zf_host_bytes(const ZfConfig* cfg, size_t c, size_t g, int backend_copies) {
    const int zenflow = cfg->mode == ZF_MODE_ZENFLOW, migrates = zf_migrates(cfg);
    return 4.0 * ((3.0 + 2.0 * zenflow + 2.0 * migrates + zf_landing_buffers(cfg)) * c +
                  (4.0 + backend_copies) * zenflow * g);
}

// The host memory a new allocation can have without swapping, in bytes (-1 where it cannot
// tell), and where the figure comes from: MemAvailable in /proc/meminfo, or
// ZF_HOST_MEMORY_MB=<n> (n MiB), for a virtual machine whose memory grows as it is used
// (MemAvailable then starts far below what it can have) and for the bad-input test.
static inline double zf_host_memory_available(const char** source) {
    const char* fake = getenv("ZF_HOST_MEMORY_MB");
    if (fake != NULL) {
        char* end = NULL;
        double mib = strtod(fake, &end);
        if (end == fake || *end != '\0' || !(mib >= 0.0 && mib <= 1e12)) {  // (!: a nan is refused too)
            fatal("ZF_HOST_MEMORY_MB=%s is not a number of MiB from 0 to 1e12 "
                  "(hint: unset it to use /proc/meminfo's MemAvailable)", fake);
        }
        *source = "ZF_HOST_MEMORY_MB";
        return mib * 1048576.0;
    }
    FILE* fp = fopen("/proc/meminfo", "r");
    if (fp == NULL) {
        *source = "unknown: no /proc/meminfo";
        return -1.0;
    }
    char line[256];
    double kib = -1.0;
    while (fgets(line, sizeof(line), fp) != NULL) {
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) { break; }
    }
    fclose(fp);
    *source = kib >= 0 ? "MemAvailable" : "unknown: no MemAvailable in /proc/meminfo";
    return kib < 0 ? -1.0 : kib * 1024.0;
}

static inline void zf_check_host_memory(ZenFlow* zf) {
    const size_t c = zf->own.cpu_capacity, g = zf->own.vector_elems + zf->own.gpu_capacity;
    double need = zf_host_bytes(&zf->cfg, c, g, zf->backend.host_moment_copies);
    const char* source;
    double available = zf_host_memory_available(&source);
    if (available >= 0 && need > available) {
        fatal("ZenFlow's CPU side needs %.2f MiB of host memory and %.2f MiB are available (%s) (hint: "
              "a smaller model; in zenflow mode also a larger -zk without -zw (fewer columns on the CPU), "
              "-za gpu (no landing buffers), -zv 0 (one instead of two) or -zs 0 without -zw "
              "(no migration buffers); on a virtual machine whose memory grows as it is used, "
              "ZF_HOST_MEMORY_MB=<MiB> says how much it can have)",
              need / 1048576.0, available / 1048576.0, source);
    }
    zf->stats.host_need_mib = need / 1048576.0;  // for zf_print_host_memory
    zf->stats.host_available_mib = available / 1048576.0;
    zf->stats.host_source = source;
}

// the trainers' [memory] line of the CPU side: what zf_check_host_memory compared
static inline void zf_print_host_memory(const ZenFlow* zf) {
    const ZfStats* st = &zf->stats;
    printf("[memory] CPU side (master, m, v, accumulators, landing, migration) %.1f MiB", st->host_need_mib);
    if (st->host_available_mib >= 0) { printf(" of %.1f MiB available", st->host_available_mib); }
    printf(" (%s)\n", st->host_source);
}

// A CPU-side buffer of n zeros; now = 1: written at once, by every thread. Linux maps a page
// of calloc'ed memory only when it is first written: left to first use, the first window
// update, accumulation or migration would pay for its pages, 10x to 50x slower than the later
// ones, and slow or stall the steps around it. Buffers a mode never writes stay calloc'ed.
static inline float* zf_host_zeros(size_t n, int now) {
    if (!now) { return (float*)callocCheck(n, sizeof(float)); }
    float* p = (float*)mallocCheck(n * sizeof(float));
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (size_t i = 0; i < n; i++) { p[i] = 0.0f; }
    return p;
}

// ----------------------------------------------------------------------------
// init and free

// The OpenMP teams of the CPU's threads. From 4 cores on they share all cores but one, which
// stays free for the thread that launches the GPU's work (half each when both threads run).
// Below 4 each takes every core: holding one back would cost the CPU side a third or half of
// its speed, and the launch thread, which sleeps between bursts, gets a core as soon as it
// wakes (docs/performance.md, "The launch thread").
static inline void zf_team_sizes(int cores, int both, int* updater, int* accumulator) {
    if (cores < 4) {
        *updater = cores;
        *accumulator = both ? cores : 0;
        return;
    }
    int spare = cores - 1;
    *updater = both ? spare - spare / 2 : spare;
    *accumulator = both ? spare / 2 : 0;
}

// the matrices and vectors in parameter-buffer order (spec 1), and the transfer groups
static inline void zf_init_ownership(ZfOwnership* own, const GPT2Config* model) {
    size_t sizes[NUM_PARAMETER_TENSORS], offset = 0;
    gpt2_param_sizes(model, sizes);
    std::vector<ZfMatrix> mats;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        GPT2TensorShape s = gpt2_tensor_shape(model, i);
        for (size_t l = 0; s.is_matrix && l < s.count; l++) {
            ZfMatrix mat;
            memset(&mat, 0, sizeof(mat));
            if (s.count == 1) {
                snprintf(mat.name, sizeof(mat.name), "%s", gpt2_tensor_names[i]);
            } else {
                snprintf(mat.name, sizeof(mat.name), "%s.%zu", gpt2_tensor_names[i], l);
            }
            mat.offset = offset + l * s.rows * s.cols;
            mat.rows = (int)s.rows;
            mat.cols = (int)s.cols;
            mat.layer = i < 2 ? -1 : (int)l;  // (wte and wpe are tensors 0 and 1)
            mat.first_col = own->total_cols;
            own->total_cols += mat.cols;
            mat.cols_by_owner = (int*)mallocCheck(s.cols * sizeof(int));
            for (int j = 0; j < mat.cols; j++) { mat.cols_by_owner[j] = j; }
            mats.push_back(mat);
            own->matrix_elems += s.rows * s.cols;
        }
        if (!s.is_matrix) {
            own->vectors[own->num_vectors++] = ZfVector{offset, sizes[i]};
            own->vector_elems += sizes[i];
        }
        offset += sizes[i];
    }
    own->num_matrices = (int)mats.size();
    own->matrices = (ZfMatrix*)mallocCheck(mats.size() * sizeof(ZfMatrix));
    memcpy(own->matrices, mats.data(), mats.size() * sizeof(ZfMatrix));
    own->num_groups = 1 + model->num_layers;
    own->group_mats = (int*)mallocCheck(own->num_matrices * sizeof(int));
    own->group_start = (int*)callocCheck(own->num_groups + 1, sizeof(int));
    int at = 0;
    for (int g = 0; g < own->num_groups; g++) {
        own->group_start[g] = at;
        for (int i = 0; i < own->num_matrices; i++) {
            if (own->matrices[i].layer + 1 == g) { own->group_mats[at++] = i; }
        }
    }
    own->group_start[own->num_groups] = at;
}

// the matrices of transfer group g (g = -1: all of them, group by group): *count indices
static inline const int* zf_group(const ZenFlow* zf, int g, int* count) {
    const ZfOwnership* own = &zf->own;
    *count = g < 0 ? own->num_matrices : own->group_start[g + 1] - own->group_start[g];
    return own->group_mats + (g < 0 ? 0 : own->group_start[g]);
}

static inline void zf_init(ZenFlow* zf, ZfConfig cfg, const GPT2Config* model, ZfBackend backend) {
    memset(zf, 0, sizeof(*zf));
    zf->cfg = cfg = zf_effective_config(cfg);
    zf->backend = backend;
    zf->win.job_ticket = zf->landing.last_reader[0] = zf->landing.last_reader[1] = zf->autou.job = zf_no_job;
    zf->sel.last_step = -1;
    if (cfg.topk < 0.0 || cfg.topk > 1.0) { fatal("flag -zk: topk ratio %g is not in [0, 1]", cfg.topk); }
    if (cfg.update_interval < 0) { fatal("flag -zu: update interval must be >= 1, or auto"); }
    if (cfg.max_update_interval < 1) { fatal("flag -zx: the longest window must be >= 1"); }
    if (cfg.update_interval == ZF_AUTO && backend.abs_sums == NULL) {
        fatal("-zu auto: this backend cannot measure the gradients it needs (no abs_sums)");
    }
    if (cfg.accumulate != ZF_ACCUMULATE_CPU && cfg.accumulate != ZF_ACCUMULATE_GPU) {
        fatal("flag -za: accumulation %d is not cpu (0) or gpu (1)", cfg.accumulate);
    }
    ZfOwnership* own = &zf->own;
    zf_init_ownership(own, model);

    // buffer sizes: the most either side can ever own (during warm-up the CPU owns all)
    for (int i = 0; i < own->num_matrices; i++) {
        const ZfMatrix* mat = &own->matrices[i];
        int n_sel = zf_n_sel(cfg.topk, mat->cols);
        own->gpu_capacity += (size_t)n_sel * mat->rows;
        own->cpu_capacity += (size_t)(cfg.warmup > 0 ? mat->cols : mat->cols - n_sel) * mat->rows;
    }
    zf_check_host_memory(zf);

    // the host buffers: what training writes is written now (zf_host_zeros says why); the
    // accumulators only in zenflow mode, the migration's buffers only if it will migrate
    const size_t c = own->cpu_capacity, g = own->vector_elems + own->gpu_capacity;
    const int zenflow = cfg.mode == ZF_MODE_ZENFLOW, migrates = zf_migrates(&cfg);
    zf->cpu.master = zf_host_zeros(c, 1);
    zf->cpu.m = zf_host_zeros(c, 1);
    zf->cpu.v = zf_host_zeros(c, 1);
    zf->win.acc = zf_host_zeros(c, zenflow);
    zf->win.acc_job = zf_host_zeros(c, zenflow);
    zf->landing.count = zf_landing_buffers(&cfg) > 0 ? zf_landing_buffers(&cfg) : 1;
    for (int i = 0; i < zf_landing_buffers(&cfg); i++) { zf->landing.buf[i] = zf_host_zeros(c, 1); }
    ZfSelection* sel = &zf->sel;
    sel->m_new = zf_host_zeros(c, migrates);
    sel->v_new = zf_host_zeros(c, migrates);
    sel->gpu_m_old = zf_host_zeros(g, zenflow);
    sel->gpu_v_old = zf_host_zeros(g, zenflow);
    sel->gpu_m_new = zf_host_zeros(g, zenflow);
    sel->gpu_v_new = zf_host_zeros(g, zenflow);
    zf->autou.c_sum = (double*)callocCheck(own->num_matrices, sizeof(double));
    zf->autou.sum_sel = (double*)callocCheck(own->num_matrices, sizeof(double));
    zf->autou.sum_cpu = (double*)callocCheck(own->num_matrices, sizeof(double));

    // the CPU's worker threads (spec 5), with overlap: the updater, and with -za cpu the accumulator
    if (cfg.overlap) {
        ZfCpuSide* cpu = &zf->cpu;
        zf_team_sizes(zf_cpu_cores(), cfg.accumulate == ZF_ACCUMULATE_CPU, &cpu->updater_threads,
                      &cpu->accumulator_threads);
        cpu->updater = zf_worker_create(cpu->updater_threads);
        if (cpu->updater == NULL) { fatal("could not start the CPU updater thread"); }
        if (cpu->accumulator_threads > 0) {
            cpu->accumulator = zf_worker_create(cpu->accumulator_threads);
            if (cpu->accumulator == NULL) { fatal("could not start the CPU accumulator thread"); }
        }
    }
}

static inline void zf_free(ZenFlow* zf) {
    // the updater first: a window update may still wait for the accumulator
    int status = zf_worker_destroy(zf->cpu.updater);  // (NULL: nothing)
    if (status != 0) { fprintf(stderr, "error: the CPU updater failed with code %d\n", status); }
    status = zf_worker_destroy(zf->cpu.accumulator);
    if (status != 0) { fprintf(stderr, "error: the CPU accumulator failed with code %d\n", status); }
    zf->cpu.updater = zf->cpu.accumulator = NULL;
    if (zf->stats.selection_log != NULL) { fcloseCheck(zf->stats.selection_log, zf->cfg.selection_log); }
    zf->stats.selection_log = NULL;
    for (int i = 0; i < zf->own.num_matrices; i++) { free(zf->own.matrices[i].cols_by_owner); }
    void* buffers[] = {zf->own.matrices, zf->own.group_mats, zf->own.group_start, zf->autou.c_sum,
                       zf->autou.sum_sel, zf->autou.sum_cpu, zf->cpu.master, zf->cpu.m, zf->cpu.v, zf->win.acc,
                       zf->win.acc_job, zf->landing.buf[0], zf->landing.buf[1], zf->sel.m_new, zf->sel.v_new,
                       zf->sel.gpu_m_old, zf->sel.gpu_v_old, zf->sel.gpu_m_new, zf->sel.gpu_v_new};
    for (void* b : buffers) { free(b); }
}

// ----------------------------------------------------------------------------
// checkpoints: everything ZenFlow needs to continue bit for bit. A window job still running
// is waited for but NOT applied: applying early would change when the update lands, and so
// the trajectory; its result is saved as the master, with `pending` set. The trainers hand
// these two to llmc/checkpoint.h, which writes them after its own header.

static inline void zf_save_state(void* ctx, FILE* fp, const char* path) {
    ZenFlow* zf = (ZenFlow*)ctx;
    const ZfBackend* be = &zf->backend;
    const ZfOwnership* own = &zf->own;
    zf_apply_pending(zf);  // (the trainer has done this before it saved the model's parameters)
    zf_wait_idle(zf);  // every job has finished (a window update waiting to be applied stays pending)
    if (zf->cfg.update_interval == ZF_AUTO) {
        zf_auto_closes(zf, zf->win.n + 1);  // auto U: the last step's evaluation, so that it is in the file
    }
    if (zf->win.n > 0 && zf->cfg.accumulate == ZF_ACCUMULATE_GPU) {
        be->grads_to_host(be->ctx, zf, zf->win.acc, -1);  // A lives in the gradient buffer (spec 7)
        zf->backend.host_wait(zf->backend.ctx, zf->win.acc);
    }
    if (zf->win.n == 0) {
        memset(zf->win.acc, 0, own->cpu_elems * sizeof(float));  // no open window: A = 0
    }
    be->moments_to_host(be->ctx, zf, zf->sel.gpu_m_old, zf->sel.gpu_v_old);
    int ints[8] = {(int)zf->cfg.mode, zf->cfg.update_interval, zf->cfg.select_interval,
                   zf->cfg.warmup, zf->cfg.overlap, zf->win.n, zf->win.pending,
                   zf->sel.last_step};
    int more[4] = {zf->sel.count, zf->sel.moved_columns, own->num_matrices, zf->cfg.accumulate};
    fwriteCheck(&zf->cfg.topk, sizeof(double), 1, fp, path);
    fwriteCheck(ints, sizeof(int), 8, fp, path);
    fwriteCheck(more, sizeof(int), 4, fp, path);
    for (int i = 0; i < own->num_matrices; i++) {
        const ZfMatrix* mat = &own->matrices[i];
        fwriteCheck(&mat->n_sel, sizeof(int), 1, fp, path);
        fwriteCheck(mat->cols_by_owner, sizeof(int), mat->cols, fp, path);
    }
    size_t g = own->vector_elems + own->gpu_sel_elems, c = own->cpu_elems;
    const float* arrays[6] = {zf->sel.gpu_m_old, zf->sel.gpu_v_old, zf->cpu.master, zf->cpu.m, zf->cpu.v,
                              zf->win.acc};
    size_t counts[6] = {g, g, c, c, c, c};
    for (int i = 0; i < 6; i++) { fwriteCheck(arrays[i], sizeof(float), counts[i], fp, path); }
    if (zf->cfg.update_interval == ZF_AUTO) {  // spec 6's state: U_max, the decision, the c sums
        int auto_ints[2] = {zf->cfg.max_update_interval, zf->autou.close_next};
        fwriteCheck(auto_ints, sizeof(int), 2, fp, path);
        fwriteCheck(zf->autou.c_sum, sizeof(double), own->num_matrices, fp, path);
    }
}

// U as the -zu flag reads: a number, or auto; text has room for 16 characters
static inline const char* zf_u_flag(int update_interval, char* text) {
    if (update_interval == ZF_AUTO) { return "auto"; }
    snprintf(text, 16, "%d", update_interval);
    return text;
}

#define ZF_MAX_WINDOW (1 << 20)  // the longest U and U_max that -zu and -zx take

// restores what zf_save_state wrote into a ZenFlow set up with zf_init for the same model;
// the settings must be the ones the checkpoint was written with
static inline void zf_load_state(void* ctx, FILE* fp, const char* path) {
    ZenFlow* zf = (ZenFlow*)ctx;
    ZfOwnership* own = &zf->own;
    zf_wait_idle(zf);
    zf->backend.host_wait(zf->backend.ctx, zf->cpu.master);
    zf->backend.host_wait(zf->backend.ctx, zf->win.acc);
    double topk;
    int ints[8], more[4];
    freadCheck(&topk, sizeof(double), 1, fp, path);
    freadCheck(ints, sizeof(int), 8, fp, path);
    freadCheck(more, sizeof(int), 4, fp, path);
    const ZfConfig* c = &zf->cfg;
    if (topk != c->topk || ints[0] != (int)c->mode || ints[1] != c->update_interval ||
        ints[2] != c->select_interval || ints[3] != c->warmup || ints[4] != c->overlap) {
        char was_u[16], now_u[16];
        fatal("%s: written with -zo %s -zk %.15g -zu %s -zs %d -zw %d -zv %d, but this run uses "
              "-zo %s -zk %.15g -zu %s -zs %d -zw %d -zv %d (hint: resume with the same flags)",
              path, ints[0] >= 0 && ints[0] < 3 ? zf_mode_names[ints[0]] : "?", topk,
              zf_u_flag(ints[1], was_u), ints[2], ints[3], ints[4], zf_mode_names[c->mode], c->topk,
              zf_u_flag(c->update_interval, now_u), c->select_interval, c->warmup, c->overlap);
    }
    if (more[2] != own->num_matrices) { fatal("%s: written for another model", path); }
    if (more[3] != c->accumulate) {  // A lives on the host with cpu, in the gradient buffer with gpu
        fatal("%s: written with -za %s, but this run uses -za %s (hint: resume with the same flags)", path,
              more[3] == ZF_ACCUMULATE_GPU ? "gpu" : "cpu", zf_accumulate_names[c->accumulate]);
    }
    // (auto U: the file's -zx comes at its end, compared below; until then the flag's bound)
    int longest = c->update_interval == ZF_AUTO ? ZF_MAX_WINDOW : c->update_interval;
    if (ints[5] < 0 || ints[5] >= longest || (ints[6] != 0 && ints[6] != 1) ||
        (ints[6] == 1 && !c->overlap) || more[0] < 0) {
        fatal("%s: corrupt window state (n=%d, pending=%d)", path, ints[5], ints[6]);
    }
    zf->win.n = ints[5];
    zf->win.pending = ints[6];
    zf->win.job_ticket = zf_no_job;
    zf->sel.last_step = ints[7];
    zf->sel.count = more[0];
    zf->sel.moved_columns = more[1];
    for (int i = 0; i < own->num_matrices; i++) {
        ZfMatrix* mat = &own->matrices[i];
        freadCheck(&mat->n_sel, sizeof(int), 1, fp, path);
        freadCheck(mat->cols_by_owner, sizeof(int), mat->cols, fp, path);
        std::vector<char> seen(mat->cols, 0);
        for (int j = 0; j < mat->cols; j++) {
            int col = mat->cols_by_owner[j];
            if (col < 0 || col >= mat->cols || seen[col]) { fatal("%s: corrupt selection", path); }
            seen[col] = 1;
        }
        // before the first selection the CPU owns everything; after it, exactly n_sel columns
        int expected = zf->sel.count > 0 ? zf_n_sel(c->topk, mat->cols) : 0;
        if (mat->n_sel != expected) { fatal("%s: corrupt selection", path); }
    }
    zf_layout(zf);
    if (own->cpu_elems > own->cpu_capacity || own->gpu_sel_elems > own->gpu_capacity) {
        fatal("%s: its ownership does not fit this run's buffers (corrupt file?)", path);
    }
    size_t g = own->vector_elems + own->gpu_sel_elems, n = own->cpu_elems;
    float* arrays[6] = {zf->sel.gpu_m_new, zf->sel.gpu_v_new, zf->cpu.master, zf->cpu.m, zf->cpu.v, zf->win.acc};
    size_t counts[6] = {g, g, n, n, n, n};
    for (int i = 0; i < 6; i++) { freadCheck(arrays[i], sizeof(float), counts[i], fp, path); }
    zf->autou.pending = 0;
    zf->autou.job = zf_no_job;
    if (c->update_interval == ZF_AUTO) {
        int auto_ints[2];
        freadCheck(auto_ints, sizeof(int), 2, fp, path);
        if (auto_ints[0] != c->max_update_interval) {
            fatal("%s: written with -zx %d, but this run uses -zx %d (hint: resume with the same flags)", path,
                  auto_ints[0], c->max_update_interval);
        }
        if ((auto_ints[1] != 0 && auto_ints[1] != 1) || zf->win.n >= c->max_update_interval) {
            fatal("%s: corrupt auto-U state", path);
        }
        zf->autou.close_next = auto_ints[1];
        freadCheck(zf->autou.c_sum, sizeof(double), own->num_matrices, fp, path);
    }
    const ZfBackend* be = &zf->backend;
    be->selection_changed(be->ctx, zf);
    be->moments_from_host(be->ctx, zf, zf->sel.gpu_m_new, zf->sel.gpu_v_new);
    if (zf->win.n > 0 && zf->cfg.accumulate == ZF_ACCUMULATE_GPU) {
        be->grads_from_host(be->ctx, zf, zf->win.acc);  // the open window's A, back where it lives
    }
    zf->landing.current = 0;
    zf->landing.last_reader[0] = zf->landing.last_reader[1] = zf_no_job;
    zf->pipe.early_dest = NULL;
    zf->pipe.apply_src = NULL;
}

// ----------------------------------------------------------------------------
// measurement and reporting

// The main thread blocks on the CPU side, and the device runs dry meanwhile: spec 8 counts it
// as stall, and the timeline shows it on the waits row. The backend times the outermost
// interval only, since a selection, which blocks as a whole, drains the CPU side.
static inline double zf_stall_begin(ZenFlow* zf) {
    if (zf->stats.stall_depth++ == 0 && zf->backend.host_blocks != NULL) { zf->backend.host_blocks(zf->backend.ctx, 1); }
    return now_ms();
}

static inline void zf_stall_end(ZenFlow* zf, double t0, const char* what) {
    if (--zf->stats.stall_depth == 0 && zf->backend.host_blocks != NULL) { zf->backend.host_blocks(zf->backend.ctx, 0); }
    trace_event(TRACE_WAIT, what, t0, now_ms());
}

// CPU optimizer work, added up by whichever thread runs the job (the two workers at once,
// hence atomically; the main thread when synchronous), and on the timeline
static inline double zf_cpu_work_done(ZenFlow* zf, TraceTrack track, const char* what, double t0) {
    double t1 = now_ms();
    __atomic_add_fetch(&zf->stats.cpu_work_us, (long long)((t1 - t0) * 1e3), __ATOMIC_RELAXED);
    trace_event(track, what, t0, t1);
    return t1 - t0;
}

// all CPU optimizer work so far, in ms (a trainer reports its growth per step)
static inline double zf_cpu_work_ms(const ZenFlow* zf) {
    return __atomic_load_n(&zf->stats.cpu_work_us, __ATOMIC_RELAXED) * 1e-3;
}

// -zl's file: the trainers create it once the run's checks have passed (a refused run leaves it as
// it was, a resumed one writes it anew); else at its first line
static inline FILE* zf_selection_log(ZenFlow* zf) {
    if (zf->stats.selection_log == NULL) { zf->stats.selection_log = fopenCheck(zf->cfg.selection_log, "w"); }
    return zf->stats.selection_log;
}

// -zl: the selection of matrix `index` at step t, and its columns' scores
static inline void zf_log_selection(ZenFlow* zf, int t, int index, const float* scores) {
    FILE* f = zf_selection_log(zf);
    const ZfMatrix* mat = &zf->own.matrices[index];
    fprintf(f, "sel %d %d %s %d :", t, index, mat->name, mat->n_sel);
    for (int j = 0; j < mat->n_sel; j++) { fprintf(f, " %d", mat->cols_by_owner[j]); }
    fprintf(f, "\nscores %d %d :", t, index);
    for (int j = 0; j < mat->cols; j++) { fprintf(f, " %.9g", scores[j]); }
    fprintf(f, "\n");
}

// the trainers' [optimizer] lines: the effective settings, and the CPU threads
static inline void zf_print_config(const ZenFlow* zf) {
    const ZfConfig* c = &zf->cfg;
    char interval[32];
    if (c->update_interval == ZF_AUTO) {
        snprintf(interval, sizeof(interval), "auto (at most %d)", c->max_update_interval);
    } else {
        snprintf(interval, sizeof(interval), "%d", c->update_interval);
    }
    printf("[optimizer] %s: topk %g, update interval %s, select interval %d, warm-up %d, overlap %s, "
           "accumulation on the %s, transfers %s\n", zf_mode_names[c->mode], c->topk, interval,
           c->select_interval, c->warmup, c->overlap ? "on" : "off", zf_accumulate_names[c->accumulate],
           c->pipeline ? "per layer" : "whole");
    if (zf->cpu.updater != NULL) {  // zf_team_sizes says why
        int cores = zf_cpu_cores(), spare = zf->cpu.updater_threads + zf->cpu.accumulator_threads < cores;
        printf("[optimizer] CPU threads: updater %d, accumulator %d of %d cores%s\n", zf->cpu.updater_threads,
               zf->cpu.accumulator_threads, cores, spare ? ", one left free for the thread that launches the GPU's work" : "");
    }
}

// The step line's ZenFlow part, each figure on the steps where it is new: `cpu` when a finished
// window update was waited for, `moved` and `select` when the step selected, `window` (auto U) when it
// closed one
static inline void zf_print_step_stats(ZenFlow* zf) {
    ZfStats* st = &zf->stats;
    if (st->cpu_updates != st->cpu_updates_shown) { printf(" | cpu %.1f ms", st->cpu_update_ms); }
    st->cpu_updates_shown = st->cpu_updates;
    if (st->select_ms > 0.0) { printf(" | moved %d | select %.1f ms", zf->sel.moved_columns, st->select_ms); }
    if (zf->cfg.update_interval == ZF_AUTO && zf->autou.closed > 0) { printf(" | window %d", zf->autou.closed); }
}

// ----------------------------------------------------------------------------
// the command line: llmc/args.h keeps the -z<letter> flags as text, ZenFlow reads them here

#define ZF_USAGE \
    "ZenFlow (docs/zenflow_spec.md):\n" \
    "  -zo <string> optimizer mode: adamw | offload | zenflow (default zenflow)\n" \
    "  -zk <float>  topk ratio k: fraction of each matrix's columns on the GPU (default 0.1)\n" \
    "  -zu <int>    update interval U: steps per CPU window, or auto (spec 6; default 4)\n" \
    "  -zx <int>    with -zu auto: the longest window U_max (default 16)\n" \
    "  -zs <int>    select interval S: steps between reselections, 0 = once (default 100)\n" \
    "  -zw <int>    warm-up steps W of synchronous offload (default 0)\n" \
    "  -zv <0|1>    overlap the CPU update with training (default 1)\n" \
    "  -za <string> where the window's gradient sum accumulates: cpu (the paper: every step's\n" \
    "               CPU-owned gradients go to the host) | gpu (in the gradient buffer; one copy\n" \
    "               per window) (default cpu)\n" \
    "  -zp <0|1>    move the transfers layer by layer, overlapping the backward / forward pass\n" \
    "               (same numbers either way; default 1)\n" \
    "  -zl <string> write every selection (columns and scores), and with -zu auto every\n" \
    "               window's close after the warm-up, to this file\n" \
    "  -zd <string> write every step's column scores to this file (CPU trainer; the locality study)\n" \
    "  -zm <string> write per-step measurements as CSV to this file (CUDA trainer)\n" \
    "Step line: loss of the batch before the update; cpu = the last window update's CPU time and\n" \
    "moved = columns that moved to the GPU at the last selection, each on the step with a new one;\n" \
    "(CUDA) stall = ms the GPU waited for a copy or the CPU side, pcie = MB moved both ways.\n"

// The ZenFlow config of the -z<letter> flags (z[letter - 'a'], NULL: not given). The letters
// in `trainer_letters` are the trainer's own (it reads them itself); any other is an error.
// out_dir: the run's -o (or NULL), which -zl's file may be in before the run creates it.
static inline ZfConfig zf_parse_flags(const char* const z[26], const char* trainer_letters,
                                      const char* out_dir) {
    ZfConfig c = ZF_DEFAULTS;
    for (int i = 0; i < 26; i++) {
        const char letter = (char)('a' + i);
        const char* val = z[i];
        char flag[4] = {'-', 'z', letter, 0};
        if (val == NULL || strchr(trainer_letters, letter) != NULL) { continue; }
        switch (letter) {
            case 'o':
                if (strcmp(val, "adamw") == 0) { c.mode = ZF_MODE_ADAMW; }
                else if (strcmp(val, "offload") == 0) { c.mode = ZF_MODE_OFFLOAD; }
                else if (strcmp(val, "zenflow") == 0) { c.mode = ZF_MODE_ZENFLOW; }
                else { fatal("flag -zo: '%s' is not a mode (adamw, offload or zenflow)", val); }
                break;
            case 'k': c.topk = parse_double(flag, val, 0.0, 1.0); break;
            case 'u':  // a number of steps, or auto (spec 6)
                if (strcmp(val, "auto") == 0) {
                    c.update_interval = ZF_AUTO;
                } else if (val[0] < '0' || val[0] > '9') {
                    fatal("flag -zu: '%s' is neither a number of steps nor auto", val);
                } else if (strcmp(val, "0") == 0) {
                    fatal("flag -zu: 0 is not a number of steps (hint: -zu auto lets the run decide)");
                } else {
                    c.update_interval = (int)parse_int(flag, val, 1, ZF_MAX_WINDOW);
                }
                break;
            case 'x': c.max_update_interval = (int)parse_int(flag, val, 1, ZF_MAX_WINDOW); break;
            case 's': c.select_interval = (int)parse_int(flag, val, 0, 1 << 30); break;
            case 'w': c.warmup = (int)parse_int(flag, val, 0, 1 << 30); break;
            case 'v': c.overlap = (int)parse_int(flag, val, 0, 1); break;
            case 'a':
                if (strcmp(val, "cpu") == 0) { c.accumulate = ZF_ACCUMULATE_CPU; }
                else if (strcmp(val, "gpu") == 0) { c.accumulate = ZF_ACCUMULATE_GPU; }
                else { fatal("flag -za: '%s' is not where to accumulate (cpu or gpu)", val); }
                break;
            case 'p': c.pipeline = (int)parse_int(flag, val, 0, 1); break;
            case 'l':
                check_output_file(flag, val, out_dir);  // created by the trainer (zf_selection_log)
                c.selection_log = val;
                break;
            default: fatal("unknown flag %s (hint: -h lists the flags)", flag);
        }
    }
    if (z['x' - 'a'] != NULL && c.update_interval != ZF_AUTO) {
        fatal("flag -zx: the longest window is a setting of -zu auto (hint: add -zu auto, or drop -zx)");
    }
    return c;
}

#endif  // ZENFLOW_H
