/*
ZenFlow's orchestration: docs/zenflow_spec.md section 4, written once for both trainers.

zf_step is the spec's step, in the spec's order, with the section numbers in comments. What
a device does (score columns, run AdamW on the GPU-owned elements, move columns between the
sides) is a primitive of a backend (ZfBackend): the CUDA trainer's is zenflow.cuh, the CPU
reference trainer's is in train_gpt2.cpp. The CPU's AdamW is cpu_adam.cpp, run in the
background by two worker threads, the updater and the accumulator.

Who owns what (spec 3), for one matrix W (OC rows, IC columns):

        columns:   0  1  2  3  4  5  6  7  8  9          sel = {2, 7}  (n_sel = k * IC)
                  [c  c  G  c  c  c  c  G  c  c]          G: the GPU updates these every step
                                                          c: the CPU updates these once a window
Both sides keep their part PACKED, column by column, so each side's optimizer runs over one
flat array:
  CPU (host):  master p, m, v, accumulator A  = W's unselected columns in ascending order,
               each column's OC values consecutive: [col 0 | col 1 | col 3 | ... | col 9]
  GPU:         m, v = every vector first (always GPU-owned), then each matrix's selected
               columns in ascending order, OC values each: [vectors | W1: col 2, col 7 | W2 ...]
The working copy of all parameters (what forward and backward read) stays in the model's own
layout on the device; the backend gathers and scatters columns between it and the packed
buffers.

This file: state, init, selection (4.2), the step (4.3 to 4.6), the CPU jobs, apply and drain
(4.6, 4.7); then the options, each in a section of its own: warm-up (4.1), auto U (6), per-layer
pipelining (7), checkpoints, the host-memory check, timing and trace. docs/teaching.md
("Inside the code") explains the threads, their waits and the pipelining at length.
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

// -za: where the window's gradient sum A forms (spec 7). On the CPU (the paper): every step
// the CPU-owned gradient columns go to the host, and the accumulator thread adds them up. On
// the GPU: the gradient buffer keeps adding them up over the window, and A goes to the host
// once, at the window's end.
typedef enum { ZF_ACCUMULATE_CPU = 0, ZF_ACCUMULATE_GPU = 1 } ZfAccumulate;
static const char* const zf_accumulate_names[2] = {"cpu", "gpu"};

#define ZF_AUTO 0  // update_interval: auto (spec 6)

typedef struct {
    ZfMode mode;
    double topk;              // k: fraction of each matrix's columns the GPU owns
    int update_interval;      // U: steps per CPU window; ZF_AUTO: decided by spec 6 (Zen-auto)
    int select_interval;      // S: steps between reselections, 0 = select once
    int warmup;               // W: the first W steps are synchronous offload
    int overlap;              // 1: the CPU's window update runs in the background
    int accumulate;           // ZF_ACCUMULATE_CPU or ZF_ACCUMULATE_GPU
    int max_update_interval;  // U_max: with auto U, the longest window (spec 6)
    int pipeline;             // 1: transfers layer by layer (spec 7); the trainer calls the layer hooks
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
    int n_sel;            // columns the GPU owns now (0 during warm-up)
    int* cols_by_owner;   // (cols): the n_sel selected columns ascending, then the rest ascending
    size_t cpu_offset;    // where its CPU-owned columns start in the packed host buffers
    size_t gpu_offset;    // where its GPU-owned columns start in the packed GPU moments
} ZfMatrix;

// a contiguous run of vector parameters (one 1-D tensor, e.g. all L layers' ln1w)
typedef struct {
    size_t offset, n;
} ZfVector;

struct ZenFlow;

// What a device provides, in the order zf_step calls it. Packed layouts: the top of this file.
// `group` (grads_to_host, params_from_host): -1 moves every CPU-owned column at once, g >= 0
// only transfer group g's (per-layer pipelining: 0 = wte and wpe, 1 + l = layer l's matrices).
// "asynchronous": the call may return before its copy is done; the host buffer may then be
// read (after grads_to_host) or written (after params_prefetch / params_from_host) only once
// host_wait on it has returned. Optional entries may be NULL.
typedef struct {
    void* ctx;
    // 4.2.2 scores[j] = sum over rows o of g[o, j]^2, for every column j of `mat`
    void (*column_scores)(void* ctx, const ZfMatrix* mat, float* scores);
    // 4.2.4 the ownership changed: re-read zf->matrices (cols_by_owner, n_sel, offsets)
    void (*selection_changed)(void* ctx, const struct ZenFlow* zf);
    // 4.2.4 all of the GPU's moments (its packed m, v: vectors, then selected columns), and back
    void (*moments_to_host)(void* ctx, const struct ZenFlow* zf, float* m, float* v);
    void (*moments_from_host)(void* ctx, const struct ZenFlow* zf, const float* m, const float* v);
    // the CPU-owned columns of the parameters, packed, to the host
    void (*params_to_host)(void* ctx, const struct ZenFlow* zf, float* host);
    // spec 7, before a backward pass: zero the whole gradient buffer (all = 1), or only its
    // GPU-owned parts, the vectors and the selected columns (all = 0)
    void (*zero_grads)(void* ctx, const struct ZenFlow* zf, int all);
    // 4.3 AdamW (spec 3.1) on every GPU-owned element with the current gradient: the vectors
    // with weight decay 0, the selected columns with h.weight_decay
    void (*gpu_adam)(void* ctx, const struct ZenFlow* zf, ZfAdamHyper h, int step);
    // 4.4 the CPU-owned columns of the gradient, packed, to the host (asynchronous)
    void (*grads_to_host)(void* ctx, const struct ZenFlow* zf, float* host, int group);
    // optional, asynchronous, called by the updater thread when a window update is done:
    // start copying its result to the device, so that the apply only puts it in place
    void (*params_prefetch)(void* ctx, const struct ZenFlow* zf, const float* host);
    // 4.6 apply: packed CPU-owned parameter columns from the host into the working copy
    // (asynchronous; the forward pass that follows sees them)
    void (*params_from_host)(void* ctx, const struct ZenFlow* zf, const float* host, int group);
    // optional: blocks until no copy into or out of this host buffer is in flight any more
    // (called by the main thread and both CPU threads)
    void (*host_wait)(void* ctx, const float* host);
    // optional, for measuring stalls (spec 8): the main thread is about to block on the CPU
    // side (begin = 1) or has stopped (begin = 0); zf_host_blocks calls it for the outermost
    void (*host_blocks)(void* ctx, int begin);
    // auto U (spec 6), needed only then: start summing |g| in double over the gradient
    // buffer, per matrix i: sel[i] over its GPU-owned elements and, if cpu is not NULL, cpu[i]
    // over its CPU-owned ones (with accumulation on the GPU they hold A). Asynchronous where
    // abs_sums_wait is not NULL: the sums are in place once it has returned.
    void (*abs_sums)(void* ctx, const struct ZenFlow* zf, double* sel, double* cpu);
    void (*abs_sums_wait)(void* ctx);
    // resuming a checkpoint with accumulation on the GPU: the open window's packed A back
    // into the gradient buffer's CPU-owned columns, where it lives
    void (*grads_from_host)(void* ctx, const struct ZenFlow* zf, const float* host);
    // 1: the backend puts its device work on the timeline (-tr) itself, timed on the device
    // (the CUDA backend: its calls return before the work is done); zenflow.h then traces
    // only the host's work
    int traces_device;
} ZfBackend;

// a job on one of the CPU's worker threads; ticket -1: none
typedef struct ZfTicket {
    ZfWorker* thread;
    long ticket;
} ZfTicket;

static const ZfTicket zf_no_job = {NULL, -1};

// the frozen inputs of one window's CPU update (spec 5: a job reads only frozen buffers)
typedef struct {
    struct ZenFlow* zf;
    const float* acc;  // A of the window, not written until the job is waited for
    int count;         // n
    int step;          // s = t + 1 of the boundary step
    ZfAdamHyper hyper;
    int prefetch;      // 1 (in the background): start the result's copy to the device when done
    ZfTicket after;    // accumulation on the CPU: the window's last accumulation (on the
                       // accumulator thread), which the update waits for first
    double ms;         // out: how long the update took (without waiting for copies)
} ZfWindowJob;

// one step's accumulation A += g_t (spec 4.4, accumulation on the CPU)
typedef struct {
    struct ZenFlow* zf;
    const float* grads;  // this step's CPU-owned gradient: a staging buffer
    float* acc;          // A of the open window
    size_t n;            // CPU-owned elements
    int first;           // first step of the window: A = 0 + g_t
    double* abs_sums;    // auto U: then, per matrix, the sum of |A| over its elements (or NULL)
    int step;            // s = t + 1 (for the error message)
} ZfAccumulateJob;

typedef struct ZenFlow {
    ZfConfig cfg;  // the effective one (zf_effective_config)
    ZfBackend backend;
    // ownership (spec 1, 3)
    int num_matrices;
    ZfMatrix* matrices;
    int num_vectors;
    ZfVector vectors[NUM_PARAMETER_TENSORS];
    size_t vector_elems;   // all vector parameters: the first part of the GPU moments
    size_t matrix_elems;   // M: all matrix elements
    size_t cpu_elems;      // matrix elements the CPU owns now
    size_t gpu_sel_elems;  // matrix elements the GPU owns now
    size_t cpu_capacity, gpu_capacity;  // the most either side can own: the buffers' sizes
    // the CPU side (spec 3), packed (cpu_capacity floats each)
    float* master;   // fp32 master values
    float* m;        // Adam moments
    float* v;
    float* acc;      // A of the open window
    float* acc_job;  // A of the window the updater is working on
    // accumulation on the CPU: this step's CPU-owned gradient, from the device. Two with
    // overlap, used in turns; stage_reader[i] is the last job that reads grad_stage[i]
    float* grad_stage[2];
    ZfTicket stage_reader[2];
    int stage_next;
    int stage;                    // this step's staging buffer, -1: none
    ZfAccumulateJob acc_jobs[2];  // the accumulation reading grad_stage[i]
    // the window and the CPU threads (spec 4.5, 5)
    int window_count;        // n: steps in the open window
    int closed_window;       // steps in the window the last zf_step closed (0: it closed none)
    ZfWorker* updater;       // overlap: the window updates
    ZfWorker* accumulator;   // overlap and accumulation on the CPU: the per-step accumulations
    int updater_threads, accumulator_threads;  // their OpenMP teams (0: no such thread)
    int pending;             // a window's CPU result waits to be applied (overlap)
    long pending_ticket;     // its updater job, or -1 once it has finished
    ZfWindowJob job;
    int failed_step;         // the step (s) whose accumulation failed (set atomically by it)
    // selection (4.2): moments in the new CPU layout, and all GPU moments before and after
    // (vector_elems + gpu_capacity each), for migrations and checkpoints
    int last_select_step;
    int num_selections;
    int moved_columns;       // columns that changed owner at the last selection
    float *m_new, *v_new, *gpu_m_old, *gpu_v_old, *gpu_m_new, *gpu_v_new;
    // auto U (spec 6): the evaluation at the end of step t decides whether t + 1 closes
    double* c_sum;        // (num_matrices) sum of c over the open window's evaluated steps
    double* sum_sel;      // (num_matrices) the step's sum of |g| over each matrix's GPU-owned
    double* sum_cpu;      // (num_matrices) ... and of |A| over its CPU-owned elements
    int close_next;       // the next step closes the window
    int auto_pending;     // the sums of the last step are on their way (zf_auto_decide)
    ZfTicket auto_job;    // ... and, accumulation on the CPU, the job that sums |A|
    // per-layer pipelining (spec 7): the trainer sets `pipeline` if it calls the layer hooks
    int pipeline;
    int num_groups;          // 1 + L transfer groups: the embeddings, then one per layer
    int* group_mats;         // (num_matrices) group g's matrices: group_mats[group_start[g] ..]
    int* group_start;        // (num_groups + 1)
    int* all_mats;           // (num_matrices) 0, 1, 2, ...: "group -1"
    float* early_dest;       // this step's gradient columns leave per layer into this buffer
    int early_stage;         // ... the staging buffer taken for them (accumulation on the CPU)
    int next_early_group;    // the next group to leave (num_groups - 1 down to 0)
    const float* apply_src;  // a synchronous apply waits to be done layer by layer (NULL: none)
    int next_apply_group;    // ... from this group on
    long groups_out, groups_in;  // transfer groups moved layer by layer so far
    // reporting
    double select_ms;          // host time of the last zf_step's selection, 0 if none
    double cpu_update_ms;      // duration of the last finished window update
    long long cpu_work_us;     // all CPU optimizer work so far; both threads add (atomically)
    int host_block_depth;      // zf_host_blocks' nesting (a selection drains the CPU side)
    FILE* selection_log;       // if set: "sel" and "scores" lines at every selection
} ZenFlow;

// ----------------------------------------------------------------------------
// The options and the bookkeeping, defined at the end of this file, each in a section of its
// own. Each adds to the default step (zenflow, k 0.1, U 4, overlap, accumulation on the CPU).

// warm-up (4.1): the first W steps are synchronous offload
static inline int zf_in_warmup(const ZenFlow* zf, int t) { return t < zf->cfg.warmup; }
static inline void zf_warmup_start(ZenFlow* zf, int t);
// auto U (spec 6): the window closes when the CPU's columns have caught up
static inline int zf_auto_u(const ZenFlow* zf, int t) { return zf->cfg.update_interval == ZF_AUTO && !zf_in_warmup(zf, t); }
static inline int zf_auto_decide(ZenFlow* zf);
static inline void zf_auto_start_sums(ZenFlow* zf, int t);
static inline void zf_auto_window_closed(ZenFlow* zf, int t, int n);
static inline double zf_abs_sum(const float* x, size_t n);
// per-layer pipelining (spec 7): transfers move one layer at a time
static inline void zf_init_groups(ZenFlow* zf, int num_layers);
static inline void zf_pipeline_plan(ZenFlow* zf, int t);
static inline void zf_grads_to_host(ZenFlow* zf, float* host);
static inline void zf_apply_sync(ZenFlow* zf);
static inline void zf_apply_pending(ZenFlow* zf);
// the host memory: checked before anything is allocated, written at once
static inline int zf_staging_buffers(const ZfConfig* cfg);
static inline int zf_migrates(const ZfConfig* cfg);
static inline void zf_check_host_memory(const ZenFlow* zf);
static inline float* zf_host_zeros(size_t n, int now);
// timing and trace
static inline void zf_host_blocks(ZenFlow* zf, int begin);
static inline void zf_trace_device(const ZenFlow* zf, TraceTrack track, const char* name, double t0);
static inline void zf_add_cpu_work(ZenFlow* zf, double t0_ms, double t1_ms);
static inline void zf_log_selection(ZenFlow* zf, int t, int index, const ZfMatrix* mat, const float* scores);

// the optional backend entry
static inline void zf_host_wait(ZenFlow* zf, const float* host) {
    if (zf->backend.host_wait != NULL) { zf->backend.host_wait(zf->backend.ctx, host); }
}

// ----------------------------------------------------------------------------
// init

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

static inline void zf_init(ZenFlow* zf, ZfConfig cfg, const GPT2Config* model, ZfBackend backend) {
    memset(zf, 0, sizeof(*zf));
    zf->cfg = cfg = zf_effective_config(cfg);
    zf->backend = backend;
    zf->pipeline = cfg.pipeline;
    zf->pending_ticket = -1;
    zf->last_select_step = -1;
    zf->stage = -1;
    zf->stage_reader[0] = zf->stage_reader[1] = zf->auto_job = zf_no_job;
    if (cfg.topk < 0.0 || cfg.topk > 1.0) { fatal("flag -zk: topk ratio %g is not in [0, 1]", cfg.topk); }
    if (cfg.update_interval < 0) { fatal("flag -zu: update interval must be >= 1, or auto"); }
    if (cfg.max_update_interval < 1) { fatal("flag -zx: the longest window must be >= 1"); }
    if (cfg.update_interval == ZF_AUTO && backend.abs_sums == NULL) {
        fatal("-zu auto: this backend cannot measure the gradients it needs (no abs_sums)");
    }
    if (cfg.accumulate != ZF_ACCUMULATE_CPU && cfg.accumulate != ZF_ACCUMULATE_GPU) {
        fatal("flag -za: accumulation %d is not cpu (0) or gpu (1)", cfg.accumulate);
    }

    // matrices and vectors in parameter-buffer order (spec 1)
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
            mat.layer = s.count == 1 ? -1 : (int)l;
            mat.cols_by_owner = (int*)mallocCheck(s.cols * sizeof(int));
            for (int j = 0; j < mat.cols; j++) { mat.cols_by_owner[j] = j; }
            mats.push_back(mat);
            zf->matrix_elems += s.rows * s.cols;
        }
        if (!s.is_matrix) {
            zf->vectors[zf->num_vectors++] = ZfVector{offset, sizes[i]};
            zf->vector_elems += sizes[i];
        }
        offset += sizes[i];
    }
    zf->num_matrices = (int)mats.size();
    zf->matrices = (ZfMatrix*)mallocCheck(mats.size() * sizeof(ZfMatrix));
    memcpy(zf->matrices, mats.data(), mats.size() * sizeof(ZfMatrix));
    zf_init_groups(zf, model->num_layers);

    // buffer sizes: the most either side can ever own (during warm-up the CPU owns all)
    for (int i = 0; i < zf->num_matrices; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        int n_sel = zf_n_sel(cfg.topk, mat->cols);
        zf->gpu_capacity += (size_t)n_sel * mat->rows;
        zf->cpu_capacity += (size_t)(cfg.warmup > 0 ? mat->cols : mat->cols - n_sel) * mat->rows;
    }
    zf_check_host_memory(zf);

    // the host buffers: what training writes is written now (zf_host_zeros says why); the
    // accumulators only in zenflow mode, the migration's buffers only if it will migrate
    const size_t c = zf->cpu_capacity, g = zf->vector_elems + zf->gpu_capacity;
    const int zenflow = cfg.mode == ZF_MODE_ZENFLOW, migrates = zf_migrates(&cfg);
    zf->master = zf_host_zeros(c, 1);
    zf->m = zf_host_zeros(c, 1);
    zf->v = zf_host_zeros(c, 1);
    zf->acc = zf_host_zeros(c, zenflow);
    zf->acc_job = zf_host_zeros(c, zenflow);
    for (int i = 0; i < zf_staging_buffers(&cfg); i++) { zf->grad_stage[i] = zf_host_zeros(c, 0); }
    zf->m_new = zf_host_zeros(c, migrates);
    zf->v_new = zf_host_zeros(c, migrates);
    zf->gpu_m_old = zf_host_zeros(g, zenflow);
    zf->gpu_v_old = zf_host_zeros(g, zenflow);
    zf->gpu_m_new = zf_host_zeros(g, zenflow);
    zf->gpu_v_new = zf_host_zeros(g, zenflow);
    zf->c_sum = (double*)callocCheck(zf->num_matrices, sizeof(double));
    zf->sum_sel = (double*)callocCheck(zf->num_matrices, sizeof(double));
    zf->sum_cpu = (double*)callocCheck(zf->num_matrices, sizeof(double));

    // the CPU's two worker threads (spec 5), with overlap
    if (cfg.overlap) {
        zf_team_sizes(zf_cpu_cores(), cfg.accumulate == ZF_ACCUMULATE_CPU, &zf->updater_threads,
                      &zf->accumulator_threads);
        zf->updater = zf_worker_create(zf->updater_threads);
        if (zf->updater == NULL) { fatal("could not start the CPU updater thread"); }
        if (zf->accumulator_threads > 0) {
            zf->accumulator = zf_worker_create(zf->accumulator_threads);
            if (zf->accumulator == NULL) { fatal("could not start the CPU accumulator thread"); }
        }
    }
}

// Lays out the packed buffers for the current ownership (cols_by_owner, n_sel).
static inline void zf_layout(ZenFlow* zf) {
    size_t cpu = 0, gpu = 0;
    for (int i = 0; i < zf->num_matrices; i++) {
        ZfMatrix* mat = &zf->matrices[i];
        mat->cpu_offset = cpu;
        mat->gpu_offset = gpu;
        cpu += (size_t)(mat->cols - mat->n_sel) * mat->rows;
        gpu += (size_t)mat->n_sel * mat->rows;
    }
    zf->cpu_elems = cpu;
    zf->gpu_sel_elems = gpu;
}

// ----------------------------------------------------------------------------
// selection (spec 4.2)

static inline void zf_drain(ZenFlow* zf);

// Does zf_step(t) select? At t == W, then at a window's start once S steps have passed.
// Known before the step's backward (pipelining needs to know whether the ownership changes).
static inline int zf_selects_at(const ZenFlow* zf, int t) {
    const ZfConfig* cfg = &zf->cfg;
    if (t < cfg->warmup) { return 0; }
    int first = zf->last_select_step < 0;
    int due = cfg->select_interval > 0 && zf->window_count == 0 && t - zf->last_select_step >= cfg->select_interval;
    return first || due;
}

// 4.2.4 migrate: every column's (m, v) moves to its new owner, none is reset or lost. The
// old ownership is in old_order, old_n_sel, old_cpu_offset, old_gpu_offset; the GPU's old
// moments in gpu_m_old, gpu_v_old. Writes m_new, v_new and gpu_m_new, gpu_v_new.
static inline void zf_migrate(ZenFlow* zf, int i, const int* old_order, int old_n_sel, size_t old_cpu_offset,
                              size_t old_gpu_offset) {
    ZfMatrix* mat = &zf->matrices[i];
    const size_t R = (size_t)mat->rows;
    // old_m[j], old_v[j]: where column j's moments were, in the old CPU or GPU packed buffer
    std::vector<const float*> old_m(mat->cols), old_v(mat->cols);
    std::vector<char> was_gpu(mat->cols, 0);
    for (int r = 0; r < mat->cols; r++) {
        int j = old_order[r];
        if (r < old_n_sel) {
            size_t at = zf->vector_elems + old_gpu_offset + (size_t)r * R;
            old_m[j] = zf->gpu_m_old + at;
            old_v[j] = zf->gpu_v_old + at;
            was_gpu[j] = 1;
        } else {
            size_t at = old_cpu_offset + (size_t)(r - old_n_sel) * R;
            old_m[j] = zf->m + at;
            old_v[j] = zf->v + at;
        }
    }
    // on all threads: one reaches a fraction of the memory bandwidth (GPT-2 1.5B: 12 GB)
    int moved = 0;
#pragma omp parallel for schedule(static) reduction(+ : moved)
    for (int r = 0; r < mat->cols; r++) {
        int j = mat->cols_by_owner[r];
        float *dst_m, *dst_v;
        if (r < mat->n_sel) {
            dst_m = zf->gpu_m_new + zf->vector_elems + mat->gpu_offset + (size_t)r * R;
            dst_v = zf->gpu_v_new + zf->vector_elems + mat->gpu_offset + (size_t)r * R;
            moved += !was_gpu[j];
        } else {
            dst_m = zf->m_new + mat->cpu_offset + (size_t)(r - mat->n_sel) * R;
            dst_v = zf->v_new + mat->cpu_offset + (size_t)(r - mat->n_sel) * R;
        }
        memcpy(dst_m, old_m[j], R * sizeof(float));
        memcpy(dst_v, old_v[j], R * sizeof(float));
    }
    zf->moved_columns += moved;
}

static inline void zf_select(ZenFlow* zf, int t) {
    const ZfBackend* be = &zf->backend;
    // 4.2.1 drain: the working copy now equals the CPU master on every CPU-owned column, and
    // the CPU threads are idle (the layouts are about to change under their feet)
    zf_drain(zf);
    // keep the old ownership: the GPU's moments of its old columns come to the host
    std::vector<std::vector<int>> old_order(zf->num_matrices);
    std::vector<int> old_n_sel(zf->num_matrices);
    std::vector<size_t> old_cpu_offset(zf->num_matrices), old_gpu_offset(zf->num_matrices);
    for (int i = 0; i < zf->num_matrices; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        old_order[i].assign(mat->cols_by_owner, mat->cols_by_owner + mat->cols);
        old_n_sel[i] = mat->n_sel;
        old_cpu_offset[i] = mat->cpu_offset;
        old_gpu_offset[i] = mat->gpu_offset;
    }
    // the very first selection without warm-up: no optimizer state exists yet (all zero)
    const int fresh = zf->num_selections == 0 && zf->cfg.warmup == 0;
    if (!fresh) { be->moments_to_host(be->ctx, zf, zf->gpu_m_old, zf->gpu_v_old); }

    // 4.2.2 and 4.2.3: score the columns of g_t, keep the n_sel best (ties: lower index)
    zf->moved_columns = 0;
    std::vector<float> scores;
    for (int i = 0; i < zf->num_matrices; i++) {
        ZfMatrix* mat = &zf->matrices[i];
        scores.resize(mat->cols);
        be->column_scores(be->ctx, mat, scores.data());
        int n_sel = zf_n_sel(zf->cfg.topk, mat->cols);
        int* order = mat->cols_by_owner;
        for (int j = 0; j < mat->cols; j++) { order[j] = j; }
        std::stable_sort(order, order + mat->cols,
                         [&](int a, int b) { return scores[a] > scores[b]; });
        std::sort(order, order + n_sel);               // selected, ascending
        std::sort(order + n_sel, order + mat->cols);  // the rest, ascending
        mat->n_sel = n_sel;
        if (zf->selection_log != NULL) { zf_log_selection(zf, t, i, mat, scores.data()); }
    }
    zf_layout(zf);

    // 4.2.4 migrate every column's moments (the vectors' stay where they are)
    if (fresh) {
        for (int i = 0; i < zf->num_matrices; i++) { zf->moved_columns += zf->matrices[i].n_sel; }
    } else {
        for (int i = 0; i < zf->num_matrices; i++) {
            zf_migrate(zf, i, old_order[i].data(), old_n_sel[i], old_cpu_offset[i], old_gpu_offset[i]);
        }
        std::swap(zf->m, zf->m_new);
        std::swap(zf->v, zf->v_new);
        memcpy(zf->gpu_m_new, zf->gpu_m_old, zf->vector_elems * sizeof(float));
        memcpy(zf->gpu_v_new, zf->gpu_v_old, zf->vector_elems * sizeof(float));
    }
    be->selection_changed(be->ctx, zf);
    be->moments_from_host(be->ctx, zf, zf->gpu_m_new, zf->gpu_v_new);
    // the master of the new CPU columns: after the drain the working copy holds every
    // column's current value (the GPU's own columns, and the CPU's applied ones)
    zf_host_wait(zf, zf->master);  // the apply's copy has finished reading the old master
    be->params_to_host(be->ctx, zf, zf->master);
    zf->last_select_step = t;
    zf->num_selections++;
}

// Spec 8 counts a selection as stall: the device waits while the host drains the CPU side,
// sorts the scores and migrates every moment (its own part, scoring and gathering the
// columns, is a few passes over the gradients and parameters).
static inline void zf_select_as_stall(ZenFlow* zf, int t) {
    zf_host_blocks(zf, 1);
    double t0 = now_ms();
    zf_select(zf, t);
    zf->select_ms = now_ms() - t0;
    zf_host_blocks(zf, 0);
    zf_trace_device(zf, TRACE_COMPUTE, "select + migrate", t0);
}

// ----------------------------------------------------------------------------
// the step (spec 4.3 to 4.6)

static int zf_accumulate(void* arg);
static int zf_window_update(void* arg);
static inline void zf_run_job(ZenFlow* zf, ZfWorker* thread, ZfJobFn fn, void* arg, ZfTicket* ticket, int s);
static inline void zf_check_workers(ZenFlow* zf);
static inline void zf_wait_ticket(ZenFlow* zf, ZfTicket job);
static inline void zf_wait_and_apply(ZenFlow* zf);

// the CPU's part of step t runs in the background (overlap), or here and now (offload, and
// warm-up, which is synchronous offload: windows of one step)
static inline int zf_in_background(const ZenFlow* zf, int t) { return zf->cfg.overlap && !zf_in_warmup(zf, t); }

// 4.5 does step t close its window? After U steps (warm-up: every step; auto U: as the last
// step's evaluation decided, or after U_max steps)
static inline int zf_closes_window(ZenFlow* zf, int t) {
    const ZfConfig* cfg = &zf->cfg;
    const int n = zf->window_count + 1;
    if (zf_in_warmup(zf, t)) { return 1; }
    if (cfg->update_interval != ZF_AUTO) { return n >= cfg->update_interval; }
    return zf_auto_decide(zf) || n >= cfg->max_update_interval;
}

// Before the backward pass of step t (0-based), which ADDS into the gradient buffer: it must
// hold only zeros, except, with accumulation on the GPU, the CPU-owned columns inside an open
// window: they keep A, the sum of the window's gradients so far (spec 7).
static inline void zf_before_backward(ZenFlow* zf, int t) {
    zf_apply_pending(zf);  // pipelining: every forward hook has run
    int all = zf->cfg.accumulate == ZF_ACCUMULATE_CPU || zf->window_count == 0;
    zf->backend.zero_grads(zf->backend.ctx, zf, all);
    zf_pipeline_plan(zf, t);  // pipelining: may this step's gradient columns leave layer by layer?
}

// The staging buffer for this step's gradient (accumulation on the CPU). With the CPU working
// in the background two take turns, and the job that read this one two steps ago must be done.
static inline int zf_take_stage(ZenFlow* zf, int background) {
    int i = background ? zf->stage_next : 0;
    zf->stage_next = background ? 1 - i : 0;
    zf_wait_ticket(zf, zf->stage_reader[i]);
    zf->stage_reader[i] = zf_no_job;
    return i;
}

// 4.4 with accumulation on the CPU: g_t's CPU-owned columns go to the host, and the
// accumulator thread adds them into A. Returns where the window update will find A.
static inline const float* zf_accumulate_step(ZenFlow* zf, int t, int closes) {
    zf->stage = -1;
    // (accumulation on the GPU: the backward pass has already added g_t into A, spec 7)
    if (zf->cfg.accumulate == ZF_ACCUMULATE_GPU || zf->cpu_elems == 0) { return zf->acc; }
    const int background = zf_in_background(zf, t);
    // (pipelining: most columns have left already, layer by layer, into the stage taken then)
    const int i = zf->early_dest != NULL ? zf->early_stage : zf_take_stage(zf, background);
    zf->stage = i;
    zf_grads_to_host(zf, zf->grad_stage[i]);
    // a window of one step (U = 1, warm-up): A = 0 + g_t is g_t itself (a gradient is a sum
    // that starts from +0, so it is never -0, the one value 0 + g would change)
    if (closes && zf->window_count == 0) { return zf->grad_stage[i]; }
    ZfAccumulateJob* job = &zf->acc_jobs[i];
    *job = ZfAccumulateJob{zf, zf->grad_stage[i], zf->acc, zf->cpu_elems, zf->window_count == 0,
                           zf_auto_u(zf, t) && !closes ? zf->sum_cpu : NULL, t + 1};
    zf_run_job(zf, background ? zf->accumulator : NULL, zf_accumulate, job, &zf->stage_reader[i], t + 1);
    return zf->acc;
}

// 4.6 without overlap (offload, warm-up): update now, apply before the next forward pass
static inline void zf_update_now(ZenFlow* zf, const float* window_sum, int n, int s, ZfAdamHyper hyper) {
    if (zf->cfg.accumulate == ZF_ACCUMULATE_GPU) { zf_grads_to_host(zf, zf->acc); }  // A, once a window
    ZfWindowJob job = {zf, window_sum, n, s, hyper, 0, zf_no_job, 0.0};
    zf_run_job(zf, NULL, zf_window_update, &job, NULL, s);
    zf->cpu_update_ms = job.ms;
    zf_apply_sync(zf);
}

// 4.6 with overlap (spec 5): window w's update runs on the updater thread while training
// goes on; the next boundary applies it (zf_wait_and_apply), one window late
static inline void zf_submit_window(ZenFlow* zf, const float* window_sum, int n, int s, ZfAdamHyper hyper) {
    const int on_cpu = zf->cfg.accumulate == ZF_ACCUMULATE_CPU;
    if (!on_cpu || n > 1) {  // freeze this window's A for the job: the next window writes the other
        std::swap(zf->acc, zf->acc_job);
        window_sum = zf->acc_job;
    }
    if (!on_cpu) { zf_grads_to_host(zf, zf->acc_job); }  // A, once a window
    // accumulation on the CPU: the update starts once this step's accumulation is done
    ZfTicket after = on_cpu && n > 1 ? zf->stage_reader[zf->stage] : zf_no_job;
    zf->job = ZfWindowJob{zf, window_sum, n, s, hyper, 1, after, 0.0};
    zf->pending_ticket = zf_worker_submit(zf->updater, zf_window_update, &zf->job);
    if (on_cpu && n == 1) { zf->stage_reader[zf->stage] = ZfTicket{zf->updater, zf->pending_ticket}; }
    zf->pending = 1;
}

// Spec 4, once the backward pass of step t has produced g_t; hyper.lr is lr(t). Before the
// forward pass of step t + 1 the working copy holds everything this step must show it.
static inline void zf_step(ZenFlow* zf, int t, ZfAdamHyper hyper) {
    const ZfBackend* be = &zf->backend;
    const int s = t + 1;
    zf_check_workers(zf);  // a failed CPU job stops training here, naming its thread
    zf_warmup_start(zf, t);

    // 4.2 selection: at t == W, then at a window's start once S steps have passed
    zf->select_ms = 0.0;
    if (zf_selects_at(zf, t)) { zf_select_as_stall(zf, t); }

    // 4.3 the GPU updates its selected columns and the vectors, with g_t
    double t0 = now_ms();
    be->gpu_adam(be->ctx, zf, hyper, s);
    zf_trace_device(zf, TRACE_COMPUTE, "GPU-side AdamW", t0);

    // 4.4 accumulate: A += g_t on the CPU-owned elements, n += 1 (4.5 says first whether this
    // step closes the window)
    const int closes = zf_closes_window(zf, t);
    const float* window_sum = zf_accumulate_step(zf, t, closes);
    zf->window_count++;
    zf->closed_window = 0;
    if (!closes) {
        zf_auto_start_sums(zf, t);  // auto U: this step's evaluation, read at the next
        return;
    }

    // 4.5 boundary: the window of n steps closes; 4.6: the next one starts with n = 0
    const int n = zf->window_count;
    zf->window_count = 0;
    zf->closed_window = n;
    zf_auto_window_closed(zf, t, n);
    // adamw mode (or a k that selects every column): the CPU owns nothing to update. The
    // windows still count: a reselection waits for a window's start (4.2).
    if (zf->cpu_elems == 0) { return; }

    // 4.6 the CPU's update with G = A / n: apply window w-1's result, hand window w over
    if (!zf_in_background(zf, t)) {
        zf_update_now(zf, window_sum, n, s, hyper);
        return;
    }
    zf_wait_and_apply(zf);
    zf_submit_window(zf, window_sum, n, s, hyper);
}

// ----------------------------------------------------------------------------
// the CPU jobs (spec 4.4, 4.6), on the worker threads with overlap, else here and now

// A = 0 + g, the first accumulation of a window: bitwise "A = 0, then A += g" (0 + -0 is +0,
// which a plain copy would not give), in one pass instead of two
static inline void zf_accumulate_first(float* acc, const float* g, size_t n) {
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (size_t i = 0; i < n; i++) { acc[i] = 0.0f + g[i]; }
}

// the accumulator names the failed step in zf_check_workers' message
static inline int zf_accumulate_failed(ZfAccumulateJob* job, int code) {
    __atomic_store_n(&job->zf->failed_step, job->step, __ATOMIC_RELAXED);
    return code;
}

// spec 4.4: A += g_t for the CPU-owned elements (accumulation on the CPU)
static int zf_accumulate(void* arg) {
    ZfAccumulateJob* job = (ZfAccumulateJob*)arg;
    if (debug_fail_at("ZF_FAIL_ACCUMULATE_AT_STEP", job->step)) { return zf_accumulate_failed(job, 7); }
    zf_host_wait(job->zf, job->grads);  // the copy of g_t from the device has landed
    double t0 = now_ms();
    if (job->first) {
        zf_accumulate_first(job->acc, job->grads, job->n);
    } else {
        zf_cpu_accumulate(job->acc, job->grads, job->n);
    }
    if (job->abs_sums != NULL) {  // auto U: the sums of |A| that u needs, per matrix
        for (int i = 0; i < job->zf->num_matrices; i++) {
            const ZfMatrix* mat = &job->zf->matrices[i];
            job->abs_sums[i] = zf_abs_sum(job->acc + mat->cpu_offset, (size_t)(mat->cols - mat->n_sel) * mat->rows);
        }
    }
    double t1 = now_ms();
    zf_add_cpu_work(job->zf, t0, t1);
    trace_event(TRACE_CPU_ACCUMULATE, "accumulate", t0, t1);
    return 0;
}

// spec 4.6: G = A / n, then AdamW on every CPU-owned element (all are matrix elements)
static int zf_window_update(void* arg) {
    ZfWindowJob* job = (ZfWindowJob*)arg;
    ZenFlow* zf = job->zf;
    if (debug_fail_at("ZF_FAIL_AT_STEP", job->step)) { return 7; }
    if (job->after.ticket >= 0) {  // A is complete once the window's last accumulation is
        int status = zf_worker_wait(job->after.thread, job->after.ticket);
        if (status != 0) { return status; }  // (zf_check_workers names the accumulator)
    }
    zf_host_wait(zf, job->acc);     // accumulation on the GPU: A's copy from the device has landed
    zf_host_wait(zf, zf->master);   // the previous result has left for the device
    double t0 = now_ms();
    zf_cpu_adam_step_mean(zf->master, zf->m, zf->v, job->acc, job->count, zf->cpu_elems,
                          job->hyper, job->step);
    double t1 = now_ms();
    job->ms = t1 - t0;
    zf_add_cpu_work(zf, t0, t1);
    trace_event(TRACE_CPU_UPDATE, "window update", t0, t1);
    // the result may start its way to the device now; it is applied at the next boundary
    if (job->prefetch && zf->backend.params_prefetch != NULL) {
        zf->backend.params_prefetch(zf->backend.ctx, zf, zf->master);
    }
    return 0;
}

// runs a job on a worker thread (*ticket = its ticket) or, thread NULL, here and now (a job
// of step s, for the error message)
static inline void zf_run_job(ZenFlow* zf, ZfWorker* thread, ZfJobFn fn, void* arg, ZfTicket* ticket, int s) {
    if (thread != NULL) {
        *ticket = ZfTicket{thread, zf_worker_submit(thread, fn, arg)};
        return;
    }
    double t0 = now_ms();
    zf_host_blocks(zf, 1);
    int status = fn(arg);
    zf_host_blocks(zf, 0);
    trace_event(TRACE_WAIT, "wait for CPU (synchronous)", t0, now_ms());
    if (status != 0) {
        fatal("step %d: the CPU %s failed with code %d", s, fn == zf_accumulate ? "accumulation" : "update", status);
    }
}

// A failed job stops training with one line naming its thread; nothing happens if none
// failed. Called every step (inside a window the main thread may not wait for the updater
// at all) and after a wait that returned an error. The accumulator first: a window update
// that waited for a failed accumulation fails with the same code.
static inline void zf_check_workers(ZenFlow* zf) {
    int status = zf_worker_error(zf->accumulator);
    if (status != 0) {
        fatal("the CPU accumulator failed with code %d (the accumulation of step %d)", status,
              __atomic_load_n(&zf->failed_step, __ATOMIC_RELAXED));
    }
    status = zf_worker_error(zf->updater);
    if (status != 0) {
        fatal("the CPU updater failed with code %d (the window update handed over at step %d)", status,
              zf->job.step);
    }
}

// ----------------------------------------------------------------------------
// waiting, apply and drain (spec 4.6, 4.7): the main thread waits only at these points

static inline int zf_job_finished(ZfTicket job) {
    return job.ticket < 0 || zf_worker_finished(job.thread, job.ticket);
}

// waits for one job (and so every earlier one of its thread)
static inline void zf_wait_ticket(ZenFlow* zf, ZfTicket job) {
    if (job.ticket < 0) { return; }
    double t0 = now_ms();
    zf_host_blocks(zf, 1);
    int status = zf_worker_wait(job.thread, job.ticket);
    zf_host_blocks(zf, 0);
    if (status != 0) { zf_check_workers(zf); }
    trace_event(TRACE_WAIT, "wait for CPU", t0, now_ms());
}

// waits for the window job in flight (if any) to finish, without applying its result
static inline void zf_wait_window(ZenFlow* zf) {
    if (zf->pending_ticket < 0) { return; }
    zf_wait_ticket(zf, ZfTicket{zf->updater, zf->pending_ticket});
    zf->cpu_update_ms = zf->job.ms;
    zf->pending_ticket = -1;
}

// waits until the CPU threads are idle: every job submitted so far has finished (a window
// update waiting to be applied stays pending)
static inline void zf_wait(ZenFlow* zf) {
    if (zf->updater == NULL) { return; }
    zf_wait_window(zf);
    double t0 = now_ms();
    zf_host_blocks(zf, 1);
    int status = zf->accumulator != NULL ? zf_worker_drain(zf->accumulator) : 0;
    status |= zf_worker_drain(zf->updater);
    zf_host_blocks(zf, 0);
    if (status != 0) { zf_check_workers(zf); }
    trace_event(TRACE_WAIT, "wait for CPU", t0, now_ms());
    zf->stage_reader[0] = zf->stage_reader[1] = zf_no_job;
    zf->auto_job = zf_no_job;
}

// waits for the pending window (if any) and applies its result to the working copy
static inline void zf_wait_and_apply(ZenFlow* zf) {
    if (!zf->pending) { return; }
    zf_wait_window(zf);
    double t0 = now_ms();
    zf->backend.params_from_host(zf->backend.ctx, zf, zf->master, -1);
    zf_trace_device(zf, TRACE_H2D, "apply", t0);
    zf->pending = 0;
}

// spec 4.7: before the end of training, a checkpoint, a selection or an evaluation of final
// weights. Afterwards no CPU job is running (the open window's accumulations are done too),
// so an error cannot go unreported and nothing is traced after the trainer closes the trace.
static inline void zf_drain(ZenFlow* zf) {
    zf_apply_pending(zf);
    zf_wait_and_apply(zf);
    zf_wait(zf);
}

static inline void zf_free(ZenFlow* zf) {
    // the updater first: a window update may still wait for the accumulator
    int status = zf_worker_destroy(zf->updater);  // (NULL: nothing)
    if (status != 0) { fprintf(stderr, "error: the CPU updater failed with code %d\n", status); }
    status = zf_worker_destroy(zf->accumulator);
    if (status != 0) { fprintf(stderr, "error: the CPU accumulator failed with code %d\n", status); }
    zf->updater = zf->accumulator = NULL;
    for (int i = 0; i < zf->num_matrices; i++) { free(zf->matrices[i].cols_by_owner); }
    free(zf->matrices);
    free(zf->group_mats);
    free(zf->group_start);
    free(zf->all_mats);
    free(zf->c_sum);
    free(zf->sum_sel);
    free(zf->sum_cpu);
    float* buffers[] = {zf->master, zf->m, zf->v, zf->acc, zf->acc_job, zf->grad_stage[0],
                        zf->grad_stage[1], zf->m_new, zf->v_new, zf->gpu_m_old, zf->gpu_v_old,
                        zf->gpu_m_new, zf->gpu_v_new};
    for (float* b : buffers) { free(b); }
}

// ============================================================================
// The options, each in a section of its own
// ============================================================================

// ----------------------------------------------------------------------------
// warm-up (spec 4.1): the CPU owns every matrix element for the first W steps, which are
// synchronous offload (windows of one step, no overlap); the model's parameters become the
// CPU master. The first selection follows at t = W.

static inline void zf_warmup_start(ZenFlow* zf, int t) {
    if (t != 0 || zf->cfg.warmup == 0) { return; }
    zf_host_blocks(zf, 1);
    for (int i = 0; i < zf->num_matrices; i++) { zf->matrices[i].n_sel = 0; }
    zf_layout(zf);
    zf->backend.selection_changed(zf->backend.ctx, zf);
    zf_host_wait(zf, zf->master);
    zf->backend.params_to_host(zf->backend.ctx, zf, zf->master);
    zf_host_blocks(zf, 0);
}

// ----------------------------------------------------------------------------
// auto U (spec 6): at the end of a step that does not close its window the device sums |g|
// over each matrix's GPU-owned elements (c) and |A| over its CPU-owned ones (u); one step
// later (they were ready long ago) zf_auto_decide reads them: the window closes at the next
// step once 99% of the matrices have u >= the window's mean c, or after U_max steps.

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

// this step's sums start now (accumulation on the CPU: the accumulation job sums |A|)
static inline void zf_auto_start_sums(ZenFlow* zf, int t) {
    if (!zf_auto_u(zf, t)) { return; }
    const ZfBackend* be = &zf->backend;
    be->abs_sums(be->ctx, zf, zf->sum_sel, zf->cfg.accumulate == ZF_ACCUMULATE_GPU ? zf->sum_cpu : NULL);
    zf->auto_job = zf->stage >= 0 && zf_in_background(zf, t) ? zf->stage_reader[zf->stage] : zf_no_job;
    zf->auto_pending = 1;
}

// The evaluation of the last step: does the next step close the window? Matrix i is ready
// when u = (sum |A| over its CPU-owned elements) / (its CPU-owned columns) >= the window's
// mean of c = (sum |g| over its GPU-owned elements) / (its GPU-owned columns).
static inline int zf_auto_decide(ZenFlow* zf) {
    if (!zf->auto_pending) { return zf->close_next; }
    zf->auto_pending = 0;
    if (zf->backend.abs_sums_wait != NULL) { zf->backend.abs_sums_wait(zf->backend.ctx); }
    zf_wait_ticket(zf, zf->auto_job);  // accumulation on the CPU: the job that summed |A|
    zf->auto_job = zf_no_job;
    const int n = zf->window_count;  // steps in the window so far, the evaluated one included
    int ready = 0;
    for (int i = 0; i < zf->num_matrices; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        const int unsel = mat->cols - mat->n_sel;
        double c = mat->n_sel > 0 ? zf->sum_sel[i] / mat->n_sel : 0.0;  // no column: always ready
        double u = unsel > 0 ? zf->sum_cpu[i] / unsel : 0.0;
        zf->c_sum[i] += c;
        ready += u >= zf->c_sum[i] / n;
    }
    int needed = (int)floor(0.99 * zf->num_matrices);
    zf->close_next = ready >= (needed > 1 ? needed : 1);
    return zf->close_next;
}

// the window closed: the next one starts its evaluation afresh (-zl logs its length)
static inline void zf_auto_window_closed(ZenFlow* zf, int t, int n) {
    if (!zf_auto_u(zf, t)) { return; }
    zf->close_next = 0;
    memset(zf->c_sum, 0, zf->num_matrices * sizeof(double));
    if (zf->selection_log != NULL) { fprintf(zf->selection_log, "win %d %d\n", t, n); }
}

// ----------------------------------------------------------------------------
// per-layer pipelining (spec 7: "a layer's gradients are final as soon as its backward is
// done, and its parameters are free from then until its forward in the next step"). A
// trainer that sets zf->pipeline calls two hooks, and the transfers move one TRANSFER GROUP
// at a time: group 0 = the embeddings (wte, wpe), group 1 + l = layer l's four matrices.
// Same numbers either way, bit for bit: only the moment a copy starts changes.

static inline void zf_init_groups(ZenFlow* zf, int num_layers) {
    zf->num_groups = 1 + num_layers;
    zf->group_mats = (int*)mallocCheck(zf->num_matrices * sizeof(int));
    zf->group_start = (int*)callocCheck(zf->num_groups + 1, sizeof(int));
    zf->all_mats = (int*)mallocCheck(zf->num_matrices * sizeof(int));
    int at = 0;
    for (int g = 0; g < zf->num_groups; g++) {
        zf->group_start[g] = at;
        for (int i = 0; i < zf->num_matrices; i++) {
            if (zf->matrices[i].layer + 1 == g) { zf->group_mats[at++] = i; }
        }
    }
    zf->group_start[zf->num_groups] = at;
    for (int i = 0; i < zf->num_matrices; i++) { zf->all_mats[i] = i; }
}

// the matrices of transfer group g (g = -1: all of them): *count indices into zf->matrices
static inline const int* zf_group(const ZenFlow* zf, int g, int* count) {
    if (g < 0) {
        *count = zf->num_matrices;
        return zf->all_mats;
    }
    *count = zf->group_start[g + 1] - zf->group_start[g];
    return zf->group_mats + zf->group_start[g];
}

// Before the backward pass of step t: may this step's gradient columns leave layer by layer?
// Only when the ownership is known already (no selection at this step) and the host buffer
// they go to is free without waiting (waiting here would hold back the backward's launch).
static inline void zf_pipeline_plan(ZenFlow* zf, int t) {
    zf->early_dest = NULL;
    // (at t = 0 the warm-up's start or the first selection lays out the ownership in zf_step)
    if (!zf->pipeline || t == 0 || zf_selects_at(zf, t) || zf->cpu_elems == 0) { return; }
    if (zf->cfg.accumulate == ZF_ACCUMULATE_CPU) {
        // g_t leaves every step, into the staging buffer zf_step would take, if it is free now
        const int background = zf_in_background(zf, t);
        if (!zf_job_finished(zf->stage_reader[background ? zf->stage_next : 0])) { return; }
        zf->early_stage = zf_take_stage(zf, background);  // does not block: its job is done
        zf->early_dest = zf->grad_stage[zf->early_stage];
    } else {
        // A leaves at the window's last step, into zf->acc: no job reads it any more (the
        // window job that read it last, as acc_job, was waited for at the previous boundary)
        if (!zf_closes_window(zf, t)) { return; }
        zf->early_dest = zf->acc;
    }
    zf->next_early_group = zf->num_groups - 1;
}

// the groups of one transfer to the host, num_groups - 1 down to `last`
static inline void zf_grads_leave(ZenFlow* zf, float* host, int last) {
    for (; zf->next_early_group >= last; zf->next_early_group--) {
        double t0 = now_ms();
        zf->backend.grads_to_host(zf->backend.ctx, zf, host, zf->next_early_group);
        zf_trace_device(zf, TRACE_D2H, "gradients (layer)", t0);
        zf->groups_out++;
    }
}

// Hook: layer l's backward is done, so its gradient is final. The trainer calls this after
// each layer's backward (l = L - 1 down to 0); the embeddings leave in zf_step.
static inline void zf_backward_layer_done(ZenFlow* zf, int l) {
    if (zf->early_dest == NULL) { return; }
    if (1 + l != zf->next_early_group) {
        fatal("zf_backward_layer_done(%d): expected layer %d (the layers' backward runs from the last one down)",
              l, zf->next_early_group - 1);
    }
    zf_grads_leave(zf, zf->early_dest, 1 + l);
}

// this step's CPU-owned gradient columns (or, accumulation on the GPU, A) to `host`: what
// has not left layer by layer, or all of it at once
static inline void zf_grads_to_host(ZenFlow* zf, float* host) {
    if (zf->early_dest == NULL) {
        double t0 = now_ms();
        zf->backend.grads_to_host(zf->backend.ctx, zf, host, -1);
        zf_trace_device(zf, TRACE_D2H, "gradients", t0);
        return;
    }
    if (host != zf->early_dest) { fatal("zenflow.h: the layers' gradients went to another buffer (a bug)"); }
    zf_grads_leave(zf, host, 0);
    zf->early_dest = NULL;
}

// A synchronous update's result (offload, warm-up) into the working copy: now, or with
// pipelining layer by layer, each just before its forward (zf_forward_layer), so that the
// copy of layer l + 1 runs while layer l computes.
static inline void zf_apply_sync(ZenFlow* zf) {
    if (zf->pipeline) {
        zf->apply_src = zf->master;
        zf->next_apply_group = 0;
        return;
    }
    double t0 = now_ms();
    zf->backend.params_from_host(zf->backend.ctx, zf, zf->master, -1);
    zf_trace_device(zf, TRACE_H2D, "apply", t0);
}

// Hook: layer l's forward comes next (l = -1: the encoder's, which reads wte and wpe). A
// synchronous apply still under way puts the groups up to that layer in place first.
static inline void zf_forward_layer(ZenFlow* zf, int l) {
    if (zf->apply_src == NULL) { return; }
    for (; zf->next_apply_group <= 1 + l && zf->next_apply_group < zf->num_groups; zf->next_apply_group++) {
        double t0 = now_ms();
        zf->backend.params_from_host(zf->backend.ctx, zf, zf->apply_src, zf->next_apply_group);
        zf_trace_device(zf, TRACE_H2D, "apply (layer)", t0);
        zf->groups_in++;
    }
    if (zf->next_apply_group == zf->num_groups) { zf->apply_src = NULL; }
}

// finishes an apply still under way: before anything reads the working copy outside a
// forward pass (a checkpoint of the model, the end of training)
static inline void zf_apply_pending(ZenFlow* zf) { zf_forward_layer(zf, zf->num_groups); }

// ----------------------------------------------------------------------------
// checkpoints: everything ZenFlow needs to continue bit for bit. A window job still running
// is waited for but NOT applied: applying early would change when the update lands, and so
// the trajectory; its result is saved as the master, with `pending` set. The trainers hand
// these two to llmc/checkpoint.h, which writes them after its own header.

static void zf_save_state(void* ctx, FILE* fp, const char* path) {
    ZenFlow* zf = (ZenFlow*)ctx;
    zf_apply_pending(zf);  // (the trainer has done this before it saved the model's parameters)
    zf_wait(zf);  // every job has finished (a window update waiting to be applied stays pending)
    zf_auto_decide(zf);  // auto U: the last step's evaluation, so that it is in the file
    const ZfBackend* be = &zf->backend;
    if (zf->window_count > 0 && zf->cfg.accumulate == ZF_ACCUMULATE_GPU) {
        be->grads_to_host(be->ctx, zf, zf->acc, -1);  // A lives in the gradient buffer (spec 7)
        zf_host_wait(zf, zf->acc);
    }
    if (zf->window_count == 0) {
        memset(zf->acc, 0, zf->cpu_elems * sizeof(float));  // no open window: A = 0
    }
    be->moments_to_host(be->ctx, zf, zf->gpu_m_old, zf->gpu_v_old);
    int ints[8] = {(int)zf->cfg.mode, zf->cfg.update_interval, zf->cfg.select_interval,
                   zf->cfg.warmup, zf->cfg.overlap, zf->window_count, zf->pending,
                   zf->last_select_step};
    int more[3] = {zf->num_selections, zf->moved_columns, zf->num_matrices};
    fwriteCheck(&zf->cfg.topk, sizeof(double), 1, fp, path);
    fwriteCheck(ints, sizeof(int), 8, fp, path);
    fwriteCheck(more, sizeof(int), 3, fp, path);
    for (int i = 0; i < zf->num_matrices; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        fwriteCheck(&mat->n_sel, sizeof(int), 1, fp, path);
        fwriteCheck(mat->cols_by_owner, sizeof(int), mat->cols, fp, path);
    }
    size_t g = zf->vector_elems + zf->gpu_sel_elems, c = zf->cpu_elems;
    const float* arrays[6] = {zf->gpu_m_old, zf->gpu_v_old, zf->master, zf->m, zf->v, zf->acc};
    size_t counts[6] = {g, g, c, c, c, c};
    for (int i = 0; i < 6; i++) { fwriteCheck(arrays[i], sizeof(float), counts[i], fp, path); }
    if (zf->cfg.update_interval == ZF_AUTO) {  // spec 6's state: U_max, the decision, the c sums
        int auto_ints[2] = {zf->cfg.max_update_interval, zf->close_next};
        fwriteCheck(auto_ints, sizeof(int), 2, fp, path);
        fwriteCheck(zf->c_sum, sizeof(double), zf->num_matrices, fp, path);
    }
}

// restores what zf_save_state wrote into a ZenFlow set up with zf_init for the same model;
// the settings must be the ones the checkpoint was written with
static void zf_load_state(void* ctx, FILE* fp, const char* path) {
    ZenFlow* zf = (ZenFlow*)ctx;
    zf_wait(zf);
    zf_host_wait(zf, zf->master);
    zf_host_wait(zf, zf->acc);
    double topk;
    int ints[8], more[3];
    freadCheck(&topk, sizeof(double), 1, fp, path);
    freadCheck(ints, sizeof(int), 8, fp, path);
    freadCheck(more, sizeof(int), 3, fp, path);
    const ZfConfig* c = &zf->cfg;
    if (topk != c->topk || ints[0] != (int)c->mode || ints[1] != c->update_interval ||
        ints[2] != c->select_interval || ints[3] != c->warmup || ints[4] != c->overlap) {
        fatal("%s: written with -zo %s -zk %g -zu %d -zs %d -zw %d -zv %d, but this run uses "
              "-zo %s -zk %g -zu %d -zs %d -zw %d -zv %d (hint: resume with the same flags)",
              path, ints[0] >= 0 && ints[0] < 3 ? zf_mode_names[ints[0]] : "?", topk, ints[1], ints[2], ints[3], ints[4],
              zf_mode_names[c->mode], c->topk, c->update_interval, c->select_interval,
              c->warmup, c->overlap);
    }
    if (more[2] != zf->num_matrices) { fatal("%s: written for another model", path); }
    int longest = c->update_interval == ZF_AUTO ? c->max_update_interval : c->update_interval;
    if (ints[5] < 0 || ints[5] >= longest || (ints[6] != 0 && ints[6] != 1) ||
        (ints[6] == 1 && !c->overlap) || more[0] < 0) {
        fatal("%s: corrupt window state (n=%d, pending=%d)", path, ints[5], ints[6]);
    }
    zf->window_count = ints[5];
    zf->pending = ints[6];
    zf->pending_ticket = -1;
    zf->last_select_step = ints[7];
    zf->num_selections = more[0];
    zf->moved_columns = more[1];
    for (int i = 0; i < zf->num_matrices; i++) {
        ZfMatrix* mat = &zf->matrices[i];
        freadCheck(&mat->n_sel, sizeof(int), 1, fp, path);
        freadCheck(mat->cols_by_owner, sizeof(int), mat->cols, fp, path);
        std::vector<char> seen(mat->cols, 0);
        for (int j = 0; j < mat->cols; j++) {
            int col = mat->cols_by_owner[j];
            if (col < 0 || col >= mat->cols || seen[col]) { fatal("%s: corrupt selection", path); }
            seen[col] = 1;
        }
        // before the first selection the CPU owns everything; after it, exactly n_sel columns
        int expected = zf->num_selections > 0 ? zf_n_sel(c->topk, mat->cols) : 0;
        if (mat->n_sel != expected) { fatal("%s: corrupt selection", path); }
    }
    zf_layout(zf);
    if (zf->cpu_elems > zf->cpu_capacity || zf->gpu_sel_elems > zf->gpu_capacity) {
        fatal("%s: its ownership does not fit this run's buffers (corrupt file?)", path);
    }
    size_t g = zf->vector_elems + zf->gpu_sel_elems, n = zf->cpu_elems;
    float* arrays[6] = {zf->gpu_m_new, zf->gpu_v_new, zf->master, zf->m, zf->v, zf->acc};
    size_t counts[6] = {g, g, n, n, n, n};
    for (int i = 0; i < 6; i++) { freadCheck(arrays[i], sizeof(float), counts[i], fp, path); }
    zf->auto_pending = 0;
    zf->auto_job = zf_no_job;
    if (c->update_interval == ZF_AUTO) {
        int auto_ints[2];
        freadCheck(auto_ints, sizeof(int), 2, fp, path);
        if (auto_ints[0] != c->max_update_interval) {
            fatal("%s: written with -zx %d, but this run uses -zx %d (hint: resume with the same flags)", path,
                  auto_ints[0], c->max_update_interval);
        }
        if (auto_ints[1] != 0 && auto_ints[1] != 1) { fatal("%s: corrupt auto-U state", path); }
        zf->close_next = auto_ints[1];
        freadCheck(zf->c_sum, sizeof(double), zf->num_matrices, fp, path);
    }
    const ZfBackend* be = &zf->backend;
    be->selection_changed(be->ctx, zf);
    be->moments_from_host(be->ctx, zf, zf->gpu_m_new, zf->gpu_v_new);
    if (zf->window_count > 0 && zf->cfg.accumulate == ZF_ACCUMULATE_GPU) {
        be->grads_from_host(be->ctx, zf, zf->acc);  // the open window's A, back where it lives
    }
    zf->stage_next = 0;
    zf->stage_reader[0] = zf->stage_reader[1] = zf_no_job;
    zf->early_dest = NULL;
    zf->apply_src = NULL;
}

// ----------------------------------------------------------------------------
// the host memory. zf_init checks that the CPU side fits before it allocates anything:
// zf_host_zeros writes every page at once, and a CPU side that does not fit would otherwise
// be killed by the kernel's OOM killer without a word.

// zenflow mode migrates moments (4.2.4) after a warm-up and at every reselection
static inline int zf_migrates(const ZfConfig* cfg) {
    return cfg->mode == ZF_MODE_ZENFLOW && (cfg->select_interval > 0 || cfg->warmup > 0);
}

// Gradient staging buffers on the host: accumulation on the CPU one, two with overlap
static inline int zf_staging_buffers(const ZfConfig* cfg) {
    return cfg->accumulate == ZF_ACCUMULATE_CPU ? (cfg->overlap ? 2 : 1) : 0;
}

// The most host memory zf_init allocates, in bytes: master, m, v, two accumulators and the
// migration's m and v (c floats each), the staging (c each), and the GPU-side moments' four
// copies for reselections and checkpoints (g each).
static inline double zf_host_bytes(const ZfConfig* cfg, size_t c, size_t g) {
    return 4.0 * ((7.0 + zf_staging_buffers(cfg)) * c + 4.0 * g);
}

// The host memory Linux says a new allocation can have without swapping (MemAvailable in
// /proc/meminfo), in bytes; -1 where it cannot tell. ZF_HOST_MEMORY_MB=<n> says instead that
// n MiB are available: for a virtual machine whose memory grows as it is used (MemAvailable
// then starts far below what it can have), and for the bad-input test.
static inline double zf_host_memory_available(void) {
    const char* fake = getenv("ZF_HOST_MEMORY_MB");
    if (fake != NULL) { return atof(fake) * 1048576.0; }
    FILE* fp = fopen("/proc/meminfo", "r");
    if (fp == NULL) { return -1.0; }
    char line[256];
    double kib = -1.0;
    while (fgets(line, sizeof(line), fp) != NULL) {
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) { break; }
    }
    fclose(fp);
    return kib < 0 ? -1.0 : kib * 1024.0;
}

// what training writes must fit: the window state, the staging, and zenflow's selection
// buffers (a migration, 4.2.4, follows a warm-up and every reselection)
static inline void zf_check_host_memory(const ZenFlow* zf) {
    const ZfConfig cfg = zf->cfg;
    const size_t c = zf->cpu_capacity, g = zf->vector_elems + zf->gpu_capacity;
    const int zenflow = cfg.mode == ZF_MODE_ZENFLOW, migrates = zf_migrates(&cfg);
    double need = 4.0 * ((3.0 + 2.0 * zenflow + 2.0 * migrates + zf_staging_buffers(&cfg)) * c + 4.0 * zenflow * g);
    double available = zf_host_memory_available();
    if (available >= 0 && need > available) {
        fatal("ZenFlow's CPU side needs %.2f MiB of host memory and %.2f MiB are available (hint: "
              "a smaller model; in zenflow mode also a larger -zk (fewer columns on the CPU), "
              "-za gpu (no staging buffers), -zv 0 (one instead of two) or -zs 0 without -zw "
              "(no migration buffers); on a virtual machine whose memory grows as it is used, "
              "ZF_HOST_MEMORY_MB=<MiB> says how much it can have)",
              need / 1048576.0, available / 1048576.0);
    }
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
// timing, trace and reporting

// The main thread starts (begin = 1) or stops blocking the device: the backend times the
// outermost interval only, since a selection, which blocks as a whole, drains the CPU side
static inline void zf_host_blocks(ZenFlow* zf, int begin) {
    int outermost = begin ? zf->host_block_depth++ == 0 : --zf->host_block_depth == 0;
    if (outermost && zf->backend.host_blocks != NULL) { zf->backend.host_blocks(zf->backend.ctx, begin); }
}

// device work on the timeline (-tr), timed by the host from t0 to now: right for a backend
// whose calls finish the work (the CPU trainer's); the CUDA backend traces its own
static inline void zf_trace_device(const ZenFlow* zf, TraceTrack track, const char* name, double t0) {
    if (!zf->backend.traces_device) { trace_event(track, name, t0, now_ms()); }
}

// CPU optimizer work is added up by both threads, so atomically (a plain counter would race)
static inline void zf_add_cpu_work(ZenFlow* zf, double t0_ms, double t1_ms) {
    __atomic_add_fetch(&zf->cpu_work_us, (long long)((t1_ms - t0_ms) * 1e3), __ATOMIC_RELAXED);
}

// all CPU optimizer work so far, in ms (a trainer reports its growth per step)
static inline double zf_cpu_work_ms(const ZenFlow* zf) {
    return __atomic_load_n(&zf->cpu_work_us, __ATOMIC_RELAXED) * 1e-3;
}

// -zl: the selection of matrix `index` at step t, and its columns' scores
static inline void zf_log_selection(ZenFlow* zf, int t, int index, const ZfMatrix* mat, const float* scores) {
    FILE* f = zf->selection_log;
    fprintf(f, "sel %d %d %s %d :", t, index, mat->name, mat->n_sel);
    for (int j = 0; j < mat->n_sel; j++) { fprintf(f, " %d", mat->cols_by_owner[j]); }
    fprintf(f, "\nscores %d %d :", t, index);
    for (int j = 0; j < mat->cols; j++) { fprintf(f, " %.9g", scores[j]); }
    fprintf(f, "\n");
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
    "  -zl <string> write every selection (columns and scores) to this file\n" \
    "  -zd <string> write every step's column scores to this file (CPU trainer; the locality study)\n" \
    "  -zm <string> write per-step measurements as CSV to this file (CUDA trainer)\n" \
    "Step line: loss of the batch before the update; cpu = the last window update's CPU time and\n" \
    "moved = columns that changed owner at the last selection, each shown when it changes;\n" \
    "(CUDA) stall = ms the GPU waited for a copy or the CPU side, pcie = MB moved both ways.\n"

// The ZenFlow config of the -z<letter> flags (z[letter - 'a'], NULL: not given). The letters
// in `trainer_letters` are the trainer's own (it reads them itself); any other is an error.
static inline ZfConfig zf_parse_flags(const char* const z[26], const char* trainer_letters) {
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
                } else {
                    c.update_interval = (int)parse_int(flag, val, 1, 1 << 20);
                }
                break;
            case 'x': c.max_update_interval = (int)parse_int(flag, val, 1, 1 << 20); break;
            case 's': c.select_interval = (int)parse_int(flag, val, 0, 1 << 30); break;
            case 'w': c.warmup = (int)parse_int(flag, val, 0, 1 << 30); break;
            case 'v': c.overlap = (int)parse_int(flag, val, 0, 1); break;
            case 'a':
                if (strcmp(val, "cpu") == 0) { c.accumulate = ZF_ACCUMULATE_CPU; }
                else if (strcmp(val, "gpu") == 0) { c.accumulate = ZF_ACCUMULATE_GPU; }
                else { fatal("flag -za: '%s' is not where to accumulate (cpu or gpu)", val); }
                break;
            case 'p': c.pipeline = (int)parse_int(flag, val, 0, 1); break;
            case 'l': c.selection_log = val; break;
            default: fatal("unknown flag %s (hint: -h lists the flags)", flag);
        }
    }
    if (z['x' - 'a'] != NULL && c.update_interval != ZF_AUTO) {
        fatal("flag -zx: the longest window is a setting of -zu auto (hint: add -zu auto, or drop -zx)");
    }
    return c;
}

// "4", or "auto (at most 16)": U for the trainers' [optimizer] line
static inline void zf_describe_interval(const ZfConfig* c, char* out, size_t size) {
    if (c->update_interval == ZF_AUTO) {
        snprintf(out, size, "auto (at most %d)", c->max_update_interval);
    } else {
        snprintf(out, size, "%d", c->update_interval);
    }
}

#endif  // ZENFLOW_H
