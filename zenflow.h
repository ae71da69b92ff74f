/*
ZenFlow's orchestration: docs/zenflow_spec.md section 4, written once for every backend.

Read zf_step from top to bottom: it is the spec's step, in the spec's order, with the
section numbers in comments. Everything a device does (compute column scores, run AdamW
on the GPU-owned elements, move columns between the two sides) is a primitive of a
backend (ZfBackend): the CUDA trainer's lives in zenflow.cuh, the CPU reference trainer's
in dev/train_gpt2.cpp. The CPU side is the same code for both: cpu_adam.cpp, run (with
overlap) by two background threads, the updater and the accumulator (see "Threads" below).

Who owns what (spec 3), in one picture, for one matrix W (OC rows, IC columns):

        columns:   0  1  2  3  4  5  6  7  8  9          sel = {2, 7}  (n_sel = k * IC)
                  [c  c  G  c  c  c  c  G  c  c]          G: the GPU updates these every step
                                                          c: the CPU updates these once a window

Both sides keep their part PACKED, column by column, so each side's optimizer runs over one
flat array:
  CPU (host):  master p, m, v, accumulator A  = W's unselected columns in ascending order,
               each column's OC values consecutive: [col 0 | col 1 | col 3 | ... | col 9]
  GPU:         m, v = every vector first (always GPU-owned), then each matrix's selected
               columns in ascending order, OC values each: [vectors | W1: col 2, col 7 | W2 ...]
The working copy of all parameters (what forward/backward read) stays in the model's own
layout on the GPU; the backend gathers/scatters columns between it and the packed buffers.

Modes (spec 2): adamw = k 1 (the CPU owns nothing), offload = k 0, U 1, no overlap (the CPU
owns every matrix element), zenflow = 0 < k < 1 with windows of U steps and overlap. With
U = auto (spec 6, zf_auto_decide) each window closes when the CPU-owned columns' accumulated
gradient has caught up with the GPU-owned ones' per-step gradient, or after U_max steps.

Transport (spec 7), where the window's gradient sum A of the CPU-owned columns is formed:
  cpu:  every step the backend copies the CPU-owned gradient columns into a host staging
        buffer and the accumulator adds them into A (two staging buffers take turns, so the
        copy of step t+1 never overwrites what the job of step t still reads);
  gpu:  the gradient buffer itself keeps adding up the CPU-owned columns over the window
        (zf_before_backward zeroes only the GPU-owned parts inside a window), and A is copied
        to the host once, at the boundary.

Per-layer pipelining (spec 7: "a layer's gradients are final as soon as its backward is done,
and its parameters are free from then until its forward in the next step"). A trainer that
sets zf->pipeline calls two hooks, and the transfers then move one TRANSFER GROUP at a time:
group 0 = the embeddings (wte, wpe), group 1 + l = layer l's four matrices.
  zf_backward_layer_done(zf, l)  after layer l's backward: its CPU-owned gradient columns
        leave now (groups L .. 1), while the backward of the layers below still runs; the
        embeddings (whose gradient is final only after the encoder's backward) leave in
        zf_step. Steps where they may: the ownership is already known (no selection at this
        step) and the host buffer they go to is free without waiting (else all leave in zf_step).
  zf_forward_layer(zf, l)  before layer l's forward (l = -1: before the encoder): a
        synchronous apply (overlap off: offload, warm-up) is done group by group here, so the
        copy of layer l + 1 runs while layer l computes. (With overlap the CPU's result is on
        its way long before the boundary, params_prefetch, and is put in place at once.)
Same numbers either way, bit for bit: only the moment a copy starts changes.

Threads (spec 5). With overlap on, the CPU's work runs on two background threads, each
running its jobs in submission order: the UPDATER runs the window updates, the ACCUMULATOR
(CPU accumulation) the per-step accumulations. Two, because a window update may take up to U
steps while each step's accumulation must be done within two (its staging buffer comes back
then, and auto U's decision needs it one step later): on one thread the accumulations would
queue behind the update and the training loop would wait inside the window. The update of
window w starts once w's last accumulation is done (it waits for that ticket itself); the
accumulations of window w+1 write the other A, which the main thread hands out only after
waiting for the update that last read it. A job reads only buffers that nothing writes until
the main thread has waited for that job (the update's A: once the accumulations it waits for
are done), and the main thread waits only at fixed points (a boundary, reusing a staging
buffer, auto U's decision, a drain). Waits go one way only: the updater may wait for the
accumulator, never the reverse, so they cannot deadlock. Copies between host and device may
still be in flight when a primitive returns: a job calls host_wait on a buffer before it
touches it. So the results never depend on timing. A job that fails stops training at the
next step (zf_check_threads), naming its thread.
*/
#ifndef ZENFLOW_H
#define ZENFLOW_H

#include <algorithm>
#include <vector>

#include "cpu_adam.h"
#include "llmc/gpt2_file.h"
#include "llmc/trace.h"
#include "llmc/utils.h"

typedef enum { ZF_MODE_ADAMW = 0, ZF_MODE_OFFLOAD = 1, ZF_MODE_ZENFLOW = 2 } ZfMode;

static const char* const zf_mode_names[3] = {"adamw", "offload", "zenflow"};

// spec 7: where the window's gradient sum A is formed (see the top of this file)
typedef enum { ZF_ACCUMULATE_CPU = 0, ZF_ACCUMULATE_GPU = 1 } ZfAccumulate;

static const char* const zf_accumulate_names[2] = {"cpu", "gpu"};

#define ZF_AUTO 0  // update_interval: auto (spec 6)

typedef struct {
    ZfMode mode;
    double topk;          // k: fraction of each matrix's columns the GPU owns
    int update_interval;  // U: steps per CPU window; ZF_AUTO: decided by spec 6 (Zen-auto)
    int select_interval;  // S: steps between reselections, 0 = select once
    int warmup;           // W: first W steps are synchronous offload
    int overlap;          // 1: the CPU's window update runs in the background
    int accumulate;       // where the window sum A forms: ZF_ACCUMULATE_CPU or _GPU (spec 7)
    int max_update_interval;  // U_max: with auto U, the longest window (spec 6)
} ZfConfig;

// defaults of spec sections 2 and 6; S = 100 (see docs/zenflow_spec.md, section 10)
static inline ZfConfig zf_default_config(void) {
    ZfConfig c = {ZF_MODE_ZENFLOW, 0.1, 4, 100, 0, 1, ZF_ACCUMULATE_CPU, 16};
    return c;
}

// the three modes are settings of one design (spec 2); with U = 1 both accumulations move the
// same bytes, so the baselines always use the paper's
static inline ZfConfig zf_effective_config(ZfConfig c) {
    // (S = 0: with k = 1 or k = 0 a reselection could only pick the same columns again)
    if (c.mode == ZF_MODE_ADAMW) { c.topk = 1.0; c.update_interval = 1; c.select_interval = 0; c.overlap = 0; c.warmup = 0; }
    if (c.mode == ZF_MODE_OFFLOAD) { c.topk = 0.0; c.update_interval = 1; c.select_interval = 0; c.overlap = 0; c.warmup = 0; }
    if (c.mode != ZF_MODE_ZENFLOW) { c.accumulate = ZF_ACCUMULATE_CPU; }
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

// What a device must provide. Packed layouts are the ones in the comment at the top.
// `group` (grads_to_host, params_from_host): -1 moves every CPU-owned column at once; g >= 0
// only transfer group g's (per-layer pipelining, see the top). zenflow.h sends one transfer's
// groups in a fixed order: to the host num_groups - 1 down to 0, to the device 0 up.
// Every call is complete (host buffers may be reused) when it returns, except where it says
// "asynchronous": then the host buffer may only be read (after grads_to_host) or written
// (after params_prefetch / params_from_host) once host_wait on it has returned.
// Optional entries may be NULL.
typedef struct {
    void* ctx;
    // scores[j] = sum over rows o of g[o, j]^2, for every column j of `mat` (spec 4.2.2)
    void (*column_scores)(void* ctx, const ZfMatrix* mat, float* scores);
    // ownership changed: re-read zf->matrices (cols_by_owner, n_sel, offsets)
    void (*selection_changed)(void* ctx, const struct ZenFlow* zf);
    // before a backward pass (zf_before_backward): zero the whole gradient buffer (all = 1), or
    // only its GPU-owned parts, the vectors and the selected columns (all = 0, spec 7)
    void (*zero_grads)(void* ctx, const struct ZenFlow* zf, int all);
    // AdamW (spec 3.1) on every GPU-owned element with the current gradient (spec 4.3):
    // the vectors with weight decay 0, the selected columns with h.weight_decay
    void (*gpu_adam)(void* ctx, const struct ZenFlow* zf, ZfAdamHyper h, int step);
    // the CPU-owned columns of the gradient, packed, to the host (asynchronous)
    void (*grads_to_host)(void* ctx, const struct ZenFlow* zf, float* host, int group);
    // packed CPU-owned gradient columns from the host into the gradient buffer (resuming a
    // checkpoint with GPU accumulation: the open window's A goes back where it lives)
    void (*grads_from_host)(void* ctx, const struct ZenFlow* zf, const float* host);
    // the CPU-owned columns of the parameters, packed, to the host
    void (*params_to_host)(void* ctx, const struct ZenFlow* zf, float* host);
    // optional, asynchronous, called by the updater thread when a window update is done:
    // start copying the packed CPU-owned parameters to the device, so that the apply at the
    // next boundary only has to put them in place
    void (*params_prefetch)(void* ctx, const struct ZenFlow* zf, const float* host);
    // packed CPU-owned parameter columns from the host into the working copy ("apply";
    // asynchronous; the forward pass that follows sees them)
    void (*params_from_host)(void* ctx, const struct ZenFlow* zf, const float* host, int group);
    // all of the GPU's moments (its packed m, v: vectors, then selected columns), and back
    void (*moments_to_host)(void* ctx, const struct ZenFlow* zf, float* m, float* v);
    void (*moments_from_host)(void* ctx, const struct ZenFlow* zf, const float* m, const float* v);
    // auto U (spec 6), needed only then: starts summing |g| over the gradient buffer, per
    // matrix i: sel[i] over its GPU-owned elements and, if cpu is not NULL, cpu[i] over its
    // CPU-owned ones (with GPU accumulation they hold A). In double. Asynchronous where
    // abs_sums_wait is not NULL: the sums are in sel, cpu once it has returned.
    void (*abs_sums)(void* ctx, const struct ZenFlow* zf, double* sel, double* cpu);
    void (*abs_sums_wait)(void* ctx);
    // optional: blocks until no copy into or out of this host buffer is in flight any more
    // (called by the main thread and both CPU threads)
    void (*host_wait)(void* ctx, const float* host);
    // optional, for measuring stalls: the main thread is about to block on the CPU side
    // (begin = 1) or has stopped blocking (begin = 0); never nested by zenflow.h
    void (*host_blocks)(void* ctx, int begin);
    // 1: the backend puts its device work on the timeline (-tr) itself, timed on the device
    // (the CUDA backend: its calls return before the work is done, so the host clock would
    // time only the launches); zenflow.h then traces the host's work only
    int traces_device;
} ZfBackend;

// a job on one of the CPU threads (the updater or the accumulator); ticket -1: none
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
    struct ZfTicket after;  // CPU accumulation in the background: the window's last accumulation,
                            // on the accumulator thread; the update waits for it first
    double ms;         // out: how long the update took (without waiting for copies)
} ZfWindowJob;

// one step's accumulation A += g_t (spec 4.4, CPU accumulation)
typedef struct {
    struct ZenFlow* zf;
    const float* grads;  // this step's CPU-owned gradient: a staging buffer
    float* acc;          // A of the open window
    size_t n;            // CPU-owned elements
    int first;           // first step of the window: A = 0 + g_t
    double* abs_sums;    // auto U: then, per matrix, the sum of |A| over its elements (or NULL)
    int step;            // s = t + 1 (for the failure test's switch and its message)
} ZfAccumulateJob;

typedef struct ZenFlow {
    ZfConfig cfg;
    ZfBackend backend;
    int num_matrices;
    ZfMatrix* matrices;
    int num_vectors;
    ZfVector vectors[NUM_PARAMETER_TENSORS];
    size_t vector_elems;   // all vector parameters: the first part of the GPU moments
    size_t matrix_elems;   // M: all matrix elements
    size_t cpu_elems;      // matrix elements the CPU owns now
    size_t gpu_sel_elems;  // matrix elements the GPU owns now
    size_t cpu_capacity, gpu_capacity;  // sizes of the buffers below
    // per-layer pipelining (see the top); the trainer sets `pipeline` if it calls the hooks
    int pipeline;
    int num_groups;       // 1 + L: the embeddings, then one per layer
    int* group_mats;      // (num_matrices) group g's matrices: group_mats[group_start[g] ..]
    int* group_start;     // (num_groups + 1)
    int* all_mats;        // (num_matrices) 0, 1, 2, ...: "group -1"
    float* early_dest;    // this step's gradient columns leave per layer into this host
                          // buffer (NULL: all at once in zf_step)
    int early_stage;      // ... from staging buffer grad_stage[early_stage] (CPU accumulation)
    int next_early_group; // the next group to leave (num_groups - 1 down to 0)
    const float* apply_src;  // a synchronous apply waits to be done layer by layer (NULL: none)
    int next_apply_group;    // ... from this group on
    // CPU side (spec 3), packed: master values, moments, window accumulator
    float* master;        // (cpu_capacity)
    float* m;             // (cpu_capacity)
    float* v;             // (cpu_capacity)
    float* acc;           // (cpu_capacity) A of the open window
    float* acc_job;       // (cpu_capacity) A of the window the updater is working on
    // CPU accumulation: this step's CPU-owned gradient, from the device. Two with overlap, used
    // in turns; stage_reader[i] is the last job that reads grad_stage[i]
    float* grad_stage[2];  // (cpu_capacity) each; [1] only with overlap
    ZfTicket stage_reader[2];
    int stage_next;
    ZfAccumulateJob acc_jobs[2];  // the accumulation reading grad_stage[i]
    int window_count;     // n: steps in the open window
    ZfWorker* updater;      // overlap: the window updates (see the top: threads)
    ZfWorker* accumulator;  // overlap and CPU accumulation: the per-step accumulations
    int pending;          // a window's CPU result waits to be applied (overlap on)
    long pending_ticket;  // its updater job, or -1 once it has finished
    ZfWindowJob job;
    int last_select_step;
    // scratch for migration and checkpoints: moments in the new CPU layout, and all GPU
    // moments before / after (vector_elems + gpu_capacity each)
    float *m_new, *v_new, *gpu_m_old, *gpu_v_old, *gpu_m_new, *gpu_v_new;
    // reporting
    int moved_columns;        // columns that changed owner at the last selection
    int num_selections;
    double select_ms;         // host time of the selection (and migration) of the last zf_step, 0 if none
    long groups_out, groups_in;  // transfer groups moved layer by layer so far (pipelining)
    // auto U (spec 6): the evaluation at the end of step t decides whether t + 1 closes
    double* c_sum;        // (num_matrices) sum of c over the open window's evaluated steps
    double* sum_sel;      // (num_matrices) the step's sum of |g| over each matrix's GPU-owned
    double* sum_cpu;      // (num_matrices) ... and of |A| over its CPU-owned elements
    int close_next;       // the next step closes the window
    int closed_window;    // steps in the window the last zf_step closed (0: it closed none)
    int auto_pending;     // the sums of the last step are on their way (zf_auto_decide)
    ZfTicket auto_job;    // ... and, CPU accumulation, the accumulation that computes sum_cpu
    int failed_step;          // the step (s) whose accumulation failed (set atomically by it)
    double cpu_update_ms;     // duration of the last finished window update
    long long cpu_work_us;    // all CPU optimizer work so far (accumulations + updates), both
                              // threads add to it (atomically): read with zf_cpu_work_ms
    FILE* selection_log;      // if set: "sel" and "scores" lines at every selection
    int host_block_depth;     // zf_host_blocks' nesting (a selection waits for the updater inside)
} ZenFlow;

// device work on the timeline (-tr), timed by the host from t0 to now: right for a backend
// whose calls finish the work (the CPU trainer's); the CUDA backend traces its own
static inline void zf_trace_device(const ZenFlow* zf, TraceTrack track, const char* name, double t0) {
    if (!zf->backend.traces_device) { trace_event(track, name, t0, now_ms()); }
}

// spec 2: n_sel = floor(k * IC + 0.5), in double like the reference (k as parsed from the flag)
static inline int zf_n_sel(double k, int cols) { return (int)floor(k * cols + 0.5); }

// ----------------------------------------------------------------------------
// setup

// A CPU-side buffer of n zeros; now = 1: written at once, by every thread. Linux maps a
// page of calloc'ed memory only when it is first written; left to first use, the first
// window update (m, v) would pay for its pages and take 50x longer than the later ones
// (d4c256h4 on the 2-core build machine: 330-400 ms instead of 4-8), slowing the steps it
// overlaps, or stalling the next boundary where it outlasts its window; so would the first
// accumulation into each accumulator (20-40 ms instead of 2), and so would the first
// migration (4.2.4) into m_new and v_new (d12: 3.0 s instead of 0.7, all of it stall; GPT-2
// 1.5B: 11 GB of new pages at step 100). zf_init pays it at start for the window state
// (master, m, v) and in zenflow mode for the two accumulators, the four copies of the GPU's
// moments and, when it will migrate, m_new and v_new, as cudaHostRegister does for the
// pinned buffers; and checks that they fit. The rest stay calloc'ed (now = 0): the
// accumulators, which offload's windows of one step never use, the staging (which
// cudaHostRegister maps), and the reselection buffers of adamw and offload (only a
// checkpoint writes them).
static inline float* zf_host_zeros(size_t n, int now) {
    if (!now) { return (float*)callocCheck(n, sizeof(float)); }
    float* p = (float*)mallocCheck(n * sizeof(float));
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (size_t i = 0; i < n; i++) { p[i] = 0.0f; }
    return p;
}

// The host memory Linux says a new allocation can have without swapping (MemAvailable in
// /proc/meminfo), in bytes; -1 where it cannot tell. Because zf_host_zeros writes every
// page at once, a CPU side that does not fit would otherwise be killed by the kernel's OOM
// killer, without a word. ZF_HOST_MEMORY_MB=<n> says instead that n MiB are available:
// for a virtual machine whose memory grows as it is used (MemAvailable then starts far below
// what it can have), and for the bad-input test, which makes it too small.
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

// Gradient staging buffers on the host: CPU accumulation one, two with overlap (they take turns)
static inline int zf_staging_buffers(const ZfConfig* cfg) {
    return cfg->accumulate == ZF_ACCUMULATE_CPU ? (cfg->overlap ? 2 : 1) : 0;
}

// The host memory zf_init allocates, in bytes: master, m, v, two accumulators and the
// migration's m and v (c floats each), the gradient staging (c each), and the GPU-side
// moments' four copies for reselections and checkpoints (g each).
static inline double zf_host_bytes(const ZfConfig* cfg, size_t c, size_t g) {
    return 4.0 * ((7.0 + zf_staging_buffers(cfg)) * c + 4.0 * g);
}

static inline void zf_init(ZenFlow* zf, ZfConfig cfg, const GPT2Config* model, ZfBackend backend) {
    memset(zf, 0, sizeof(*zf));
    zf->cfg = zf_effective_config(cfg);
    zf->backend = backend;
    zf->pending_ticket = -1;
    zf->last_select_step = -1;
    cfg = zf->cfg;
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
        if (s.is_matrix) {
            for (size_t l = 0; l < s.count; l++) {
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
        } else {
            zf->vectors[zf->num_vectors].offset = offset;
            zf->vectors[zf->num_vectors].n = sizes[i];
            zf->num_vectors++;
            zf->vector_elems += sizes[i];
        }
        offset += sizes[i];
    }
    zf->num_matrices = (int)mats.size();
    zf->matrices = (ZfMatrix*)mallocCheck(mats.size() * sizeof(ZfMatrix));
    memcpy(zf->matrices, mats.data(), mats.size() * sizeof(ZfMatrix));

    // transfer groups: the embeddings, then each layer's matrices (in matrix order)
    zf->num_groups = 1 + model->num_layers;
    zf->group_mats = (int*)mallocCheck(mats.size() * sizeof(int));
    zf->group_start = (int*)callocCheck(zf->num_groups + 1, sizeof(int));
    zf->all_mats = (int*)mallocCheck(mats.size() * sizeof(int));
    int at = 0;
    for (int g = 0; g < zf->num_groups; g++) {
        zf->group_start[g] = at;
        for (int i = 0; i < zf->num_matrices; i++) {
            if (zf->matrices[i].layer + 1 == g) { zf->group_mats[at++] = i; }
        }
    }
    zf->group_start[zf->num_groups] = at;
    for (int i = 0; i < zf->num_matrices; i++) { zf->all_mats[i] = i; }

    // buffer sizes: the most either side can ever own (during warm-up the CPU owns all)
    int cpu_owns_all = cfg.warmup > 0;
    for (int i = 0; i < zf->num_matrices; i++) {
        ZfMatrix* mat = &zf->matrices[i];
        int n_sel = zf_n_sel(cfg.topk, mat->cols);
        zf->gpu_capacity += (size_t)n_sel * mat->rows;
        zf->cpu_capacity += (size_t)(cpu_owns_all ? mat->cols : mat->cols - n_sel) * mat->rows;
    }
    size_t c = zf->cpu_capacity, g = zf->vector_elems + zf->gpu_capacity;
    // what training writes must fit: the window state, the staging, and zenflow's selection
    // buffers (a migration, 4.2.4, follows a warm-up and every reselection)
    int zenflow = cfg.mode == ZF_MODE_ZENFLOW;
    int migrates = zenflow && (cfg.select_interval > 0 || cfg.warmup > 0);
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
    zf->master = zf_host_zeros(c, 1);
    zf->m = zf_host_zeros(c, 1);
    zf->v = zf_host_zeros(c, 1);
    zf->acc = zf_host_zeros(c, zenflow);
    zf->acc_job = zf_host_zeros(c, zenflow);
    for (int i = 0; i < zf_staging_buffers(&cfg); i++) {
        zf->grad_stage[i] = zf_host_zeros(c, 0);
    }
    zf->stage_reader[0] = zf->stage_reader[1] = zf_no_job;
    zf->m_new = zf_host_zeros(c, migrates);
    zf->v_new = zf_host_zeros(c, migrates);
    zf->gpu_m_old = zf_host_zeros(g, zenflow);
    zf->gpu_v_old = zf_host_zeros(g, zenflow);
    zf->gpu_m_new = zf_host_zeros(g, zenflow);
    zf->gpu_v_new = zf_host_zeros(g, zenflow);
    zf->c_sum = (double*)callocCheck(zf->num_matrices, sizeof(double));
    zf->sum_sel = (double*)callocCheck(zf->num_matrices, sizeof(double));
    zf->sum_cpu = (double*)callocCheck(zf->num_matrices, sizeof(double));
    zf->auto_job = zf_no_job;
    if (cfg.overlap) {
        zf->updater = zf_worker_create(0);
        if (zf->updater == NULL) { fatal("could not start the CPU updater thread"); }
        if (cfg.accumulate == ZF_ACCUMULATE_CPU) {
            zf->accumulator = zf_worker_create(0);
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

// the optional backend entries
static inline void zf_host_wait(ZenFlow* zf, const float* host) {
    if (zf->backend.host_wait != NULL) { zf->backend.host_wait(zf->backend.ctx, host); }
}

// The main thread starts (begin = 1) or stops blocking the device: the backend times the
// outermost interval only, since a selection, which blocks as a whole, waits for the CPU
// threads inside
static inline void zf_host_blocks(ZenFlow* zf, int begin) {
    int outermost = begin ? zf->host_block_depth++ == 0 : --zf->host_block_depth == 0;
    if (outermost && zf->backend.host_blocks != NULL) { zf->backend.host_blocks(zf->backend.ctx, begin); }
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

// Warm-up ownership (spec 4.1): the CPU owns every matrix element until the first selection.
// The model's parameters become the CPU master.
static inline void zf_start_warmup(ZenFlow* zf) {
    for (int i = 0; i < zf->num_matrices; i++) { zf->matrices[i].n_sel = 0; }
    zf_layout(zf);
    zf->backend.selection_changed(zf->backend.ctx, zf);
    zf_host_wait(zf, zf->master);
    zf->backend.params_to_host(zf->backend.ctx, zf, zf->master);
}

// ----------------------------------------------------------------------------
// the CPU side: accumulations and window updates (with overlap on the accumulator and the
// updater thread, else inline on the main thread)

// CPU optimizer work is added up by both threads, so atomically (a plain counter would race)
static inline void zf_add_cpu_work(ZenFlow* zf, double t0_ms, double t1_ms) {
    __atomic_add_fetch(&zf->cpu_work_us, (long long)((t1_ms - t0_ms) * 1e3), __ATOMIC_RELAXED);
}

// all CPU optimizer work so far, in ms (a trainer reports its growth per step)
static inline double zf_cpu_work_ms(const ZenFlow* zf) {
    return __atomic_load_n(&zf->cpu_work_us, __ATOMIC_RELAXED) * 1e-3;
}

// A = 0 + g, the first accumulation of a window: bitwise "A = 0, then A += g" (0 + -0 is +0,
// which a plain copy would not give), in one pass instead of two
static inline void zf_accumulate_first(float* acc, const float* g, size_t n) {
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (size_t i = 0; i < n; i++) { acc[i] = 0.0f + g[i]; }
}

// sum of |x[i]| over n floats, in double (auto U, spec 6): fixed chunks summed in order,
// so the result does not depend on how many threads there are (an OpenMP reduction's would)
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

// spec 4.4: A += g_t for the CPU-owned elements (CPU accumulation)
static int zf_accumulate(void* arg) {
    ZfAccumulateJob* job = (ZfAccumulateJob*)arg;
    // debug switch for the failure tests: ZF_FAIL_ACCUMULATE_AT_STEP=<s> makes the
    // accumulation of step s (1-based) fail, as a real error in the CPU side would
    const char* fail_at = getenv("ZF_FAIL_ACCUMULATE_AT_STEP");
    if (fail_at != NULL && atoi(fail_at) == job->step) {
        __atomic_store_n(&job->zf->failed_step, job->step, __ATOMIC_RELAXED);
        return 7;
    }
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
    // debug switch for the failure tests: ZF_FAIL_AT_STEP=<s> makes the update of the window
    // closed at step s (1-based) fail, as a real error in the CPU side would
    const char* fail_at = getenv("ZF_FAIL_AT_STEP");
    if (fail_at != NULL && atoi(fail_at) == job->step) { return 7; }
    if (job->after.ticket >= 0) {  // A is complete once the window's last accumulation is
        int status = zf_worker_wait(job->after.thread, job->after.ticket);
        if (status != 0) { return status; }  // (zf_check_threads names the accumulator)
    }
    zf_host_wait(zf, job->acc);     // GPU accumulation: A's copy from the device has landed
    zf_host_wait(zf, zf->master);   // the previous result has left for the device
    double t0 = now_ms();
    zf_cpu_adam_step_mean(zf->master, zf->m, zf->v, job->acc, job->count, zf->cpu_elems,
                          job->hyper, job->step);
    double t1 = now_ms();
    job->ms = t1 - t0;
    zf_add_cpu_work(zf, t0, t1);
    trace_event(TRACE_CPU_UPDATE, "window update", t0, t1);
    // the result may start its way to the device now; it is applied at the next boundary
    // (a synchronous update is applied at once, and with pipelining layer by layer)
    if (job->prefetch && zf->backend.params_prefetch != NULL) {
        zf->backend.params_prefetch(zf->backend.ctx, zf, zf->master);
    }
    return 0;
}

// runs a job on a background thread (*ticket = its ticket) or, thread NULL, here and now (a
// job of step s, for the error message)
static inline void zf_run_job(ZenFlow* zf, ZfWorker* thread, ZfJobFn fn, void* arg, ZfTicket* ticket,
                              int s) {
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
// failed. Called every step (inside a window the main thread may not wait for the updater at
// all, so a failed window update would otherwise surface only at the next boundary) and after
// a wait that returned an error. The accumulator first: a window update that waited for a
// failed accumulation fails with the same code.
static inline void zf_check_threads(ZenFlow* zf) {
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
// waiting for the updater (spec 5: only at these fixed points)

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
    if (status != 0) { zf_check_threads(zf); }
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
    if (status != 0) { zf_check_threads(zf); }
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

// Per-layer pipelining: layer l's forward comes next (l = -1: the encoder's, which reads
// wte and wpe). A synchronous apply still under way puts the groups up to that layer in
// place first. The trainer calls this before every layer's forward pass.
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

// spec 4.7: before the end of training, a checkpoint, or an evaluation of final weights.
// Afterwards no CPU job is running (the open window's accumulations are done too), so an
// error cannot go unreported and nothing is traced after the trainer closes the trace.
static inline void zf_drain(ZenFlow* zf) {
    zf_apply_pending(zf);
    zf_wait_and_apply(zf);
    zf_wait(zf);
}

// ----------------------------------------------------------------------------
// selection (spec 4.2)

static inline void zf_log_selection(ZenFlow* zf, int t, int index, const ZfMatrix* mat,
                                    const float* scores) {
    FILE* f = zf->selection_log;
    fprintf(f, "sel %d %d %s %d :", t, index, mat->name, mat->n_sel);
    for (int j = 0; j < mat->n_sel; j++) { fprintf(f, " %d", mat->cols_by_owner[j]); }
    fprintf(f, "\nscores %d %d :", t, index);
    for (int j = 0; j < mat->cols; j++) { fprintf(f, " %.9g", scores[j]); }
    fprintf(f, "\n");
}

static inline void zf_select(ZenFlow* zf, int t) {
    const ZfBackend* be = &zf->backend;
    // 4.2.1 drain: the working copy now equals the CPU master on every CPU-owned column
    // (and the updater is idle: the layouts are about to change under its feet)
    zf_drain(zf);
    zf_wait(zf);
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

    // 4.2.4 migrate: every column's (m, v) moves to its new owner, none is reset or lost.
    // old_m[j], old_v[j]: where column j's moments were, in the old CPU or GPU packed buffer
    for (int i = 0; i < zf->num_matrices && !fresh; i++) {
        ZfMatrix* mat = &zf->matrices[i];
        const size_t R = (size_t)mat->rows;
        std::vector<const float*> old_m(mat->cols), old_v(mat->cols);
        std::vector<char> was_gpu(mat->cols, 0);
        for (int r = 0; r < mat->cols; r++) {
            int j = old_order[i][r];
            if (r < old_n_sel[i]) {
                size_t at = zf->vector_elems + old_gpu_offset[i] + (size_t)r * R;
                old_m[j] = zf->gpu_m_old + at;
                old_v[j] = zf->gpu_v_old + at;
                was_gpu[j] = 1;
            } else {
                size_t at = old_cpu_offset[i] + (size_t)(r - old_n_sel[i]) * R;
                old_m[j] = zf->m + at;
                old_v[j] = zf->v + at;
            }
        }
        // every matrix element's (m, v) is copied once here: on all threads (one thread
        // reaches a fraction of the memory bandwidth; at GPT-2 1.5B these are 12 GB)
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
    if (fresh) {
        for (int i = 0; i < zf->num_matrices; i++) { zf->moved_columns += zf->matrices[i].n_sel; }
    } else {
        std::swap(zf->m, zf->m_new);
        std::swap(zf->v, zf->v_new);
        // the vectors' moments stay where they are
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

// ----------------------------------------------------------------------------
// one training step (spec 4). The trainer calls zf_before_backward before the backward pass
// of step t (0-based), then zf_step once the backward has produced g_t; `hyper.lr` is lr(t).
// Before the forward of step t+1 the working copy holds everything this step must show it
// (with pipelining: once zf_forward_layer has been called for each layer).

// 4.2: does zf_step(t) select? At t == W, then at a window start once S steps have passed.
// Known before the step's backward (pipelining needs to know whether the ownership changes).
static inline int zf_selects_at(const ZenFlow* zf, int t) {
    const ZfConfig* cfg = &zf->cfg;
    if (t < cfg->warmup) { return 0; }
    int first = zf->last_select_step < 0;
    int due = cfg->select_interval > 0 && zf->window_count == 0 && t - zf->last_select_step >= cfg->select_interval;
    return first || due;
}

// spec 6, auto U: the evaluation of the last step (its sums were started in zf_step; waiting
// for them one step later costs nothing: they were ready long ago). Matrix i is ready when
// u = (sum |A| over its CPU-owned elements) / (its CPU-owned columns) >= the window's mean of
// c = (sum |g| over its GPU-owned elements) / (its GPU-owned columns). Called before anything
// needs to know whether the next step closes the window.
static inline void zf_auto_decide(ZenFlow* zf) {
    if (!zf->auto_pending) { return; }
    zf->auto_pending = 0;
    if (zf->backend.abs_sums_wait != NULL) { zf->backend.abs_sums_wait(zf->backend.ctx); }
    zf_wait_ticket(zf, zf->auto_job);  // CPU accumulation: the job that summed |A|
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
}

// does the next step close the window? (spec 4.5: U steps; auto: decided by the last step,
// or the window reaches U_max; warm-up: windows of one step)
static inline int zf_next_step_closes(ZenFlow* zf, int warmup) {
    const ZfConfig* cfg = &zf->cfg;
    const int n = zf->window_count + 1;
    if (warmup) { return 1; }
    if (cfg->update_interval != ZF_AUTO) { return n >= cfg->update_interval; }
    zf_auto_decide(zf);
    return zf->close_next || n >= cfg->max_update_interval;
}

// CPU accumulation: the staging buffer for this step's gradient. With the CPU working in the
// background two take turns, and the job that read this one two steps ago must be done.
static inline int zf_take_stage(ZenFlow* zf, int background) {
    int i = background ? zf->stage_next : 0;
    zf->stage_next = background ? 1 - i : 0;
    zf_wait_ticket(zf, zf->stage_reader[i]);
    zf->stage_reader[i] = zf_no_job;
    return i;
}

// Before the backward pass of step t.
// spec 7: the gradient buffer before a backward pass (which ADDS into it) must hold only
// g_t, except, with GPU accumulation, the CPU-owned columns inside an open window: they keep
// A, the sum of the window's gradients so far, and the backward adds g_t to it.
// Pipelining: decides whether this step's gradient columns leave layer by layer.
static inline void zf_before_backward(ZenFlow* zf, int t) {
    const ZfConfig* cfg = &zf->cfg;
    zf_apply_pending(zf);  // every forward hook has run (a trainer without them: nothing pends)
    int all = cfg->accumulate == ZF_ACCUMULATE_CPU || zf->window_count == 0;
    zf->backend.zero_grads(zf->backend.ctx, zf, all);
    zf->early_dest = NULL;
    // (at t = 0 the warm-up's start or the first selection lays out the ownership in zf_step)
    if (!zf->pipeline || t == 0 || zf_selects_at(zf, t) || zf->cpu_elems == 0) { return; }
    const int warmup = t < cfg->warmup;
    if (cfg->accumulate == ZF_ACCUMULATE_CPU) {
        // g_t leaves every step, into the staging buffer zf_step would take, if it is free
        // now (never wait here: that would keep the backward from being launched)
        const int background = cfg->overlap && !warmup;
        int i = background ? zf->stage_next : 0;
        if (!zf_job_finished(zf->stage_reader[i])) { return; }
        zf->early_stage = zf_take_stage(zf, background);  // does not block: its job is done
        zf->early_dest = zf->grad_stage[zf->early_stage];
    } else {
        // A leaves at the window's last step, into zf->acc: no job reads it any more (the
        // window job that read it last, as acc_job, was waited for at the previous boundary)
        if (!zf_next_step_closes(zf, warmup)) { return; }
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

// Per-layer pipelining: layer l's backward is done, so its gradient is final (spec 7). The
// trainer calls this after each layer's backward (l = L - 1 down to 0).
static inline void zf_backward_layer_done(ZenFlow* zf, int l) {
    if (zf->early_dest == NULL) { return; }
    if (1 + l != zf->next_early_group) {
        fatal("zf_backward_layer_done(%d): expected layer %d (the layers' backward runs from the last one down)",
                l, zf->next_early_group - 1);
    }
    zf_grads_leave(zf, zf->early_dest, 1 + l);
}

// this step's CPU-owned gradient columns (or, GPU accumulation, A) to `host`: what has not
// left layer by layer, or all of it at once
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

static inline void zf_step(ZenFlow* zf, int t, ZfAdamHyper hyper) {
    const ZfConfig* cfg = &zf->cfg;
    const ZfBackend* be = &zf->backend;
    const int s = t + 1;
    zf_check_threads(zf);
    if (t == 0 && cfg->warmup > 0) {
        zf_host_blocks(zf, 1);
        zf_start_warmup(zf);
        zf_host_blocks(zf, 0);
    }
    const int warmup = t < cfg->warmup;

    // 4.2 selection: at t == W, then at a window start once S steps have passed. Spec 8
    // counts it as stall: the device waits while the host drains the CPU side, sorts the
    // scores, migrates every moment and copies the new ownership's columns both ways (its
    // own part, scoring the columns and gathering them, is a few passes over the gradients)
    zf->select_ms = 0.0;
    if (zf_selects_at(zf, t)) {
        zf_host_blocks(zf, 1);
        double t0 = now_ms();
        zf_select(zf, t);
        zf->select_ms = now_ms() - t0;
        zf_host_blocks(zf, 0);
        zf_trace_device(zf, TRACE_COMPUTE, "select + migrate", t0);
    }

    // 4.3 GPU update: selected columns and vectors, with g_t (during warm-up: vectors only)
    double t0 = now_ms();
    be->gpu_adam(be->ctx, zf, hyper, s);
    zf_trace_device(zf, TRACE_COMPUTE, "GPU-side AdamW", t0);
    // adamw mode, or a k that selects every column: the CPU owns nothing, so it has nothing
    // to add up, update or send back. The windows still count (below): a reselection waits
    // for a window's start (4.2), and auto U logs its windows, as the reference does.
    const int cpu_work = zf->cpu_elems > 0;

    // the CPU's part of this step runs in the background (overlap), or here and now
    // (overlap off, and warm-up, which is synchronous offload: windows of one step)
    const int background = cfg->overlap && !warmup;
    const int auto_u = cfg->update_interval == ZF_AUTO && !warmup;
    const int closes = zf_next_step_closes(zf, warmup);  // 4.5, known before the step's work
    const int single = closes && zf->window_count == 0;  // a window of one step (U = 1, warm-up)
    zf->closed_window = 0;

    // 4.4 accumulate: A += g_t on the CPU-owned elements, n += 1. `window_sum` is where the
    // window update will find A.
    const float* window_sum = zf->acc;
    int stage = -1;
    if (cfg->accumulate == ZF_ACCUMULATE_CPU && cpu_work) {
        // spec 7, CPU accumulation: g_t's CPU-owned columns to the host, the CPU adds them up
        // (pipelining: most have left already, layer by layer, into the stage taken then)
        stage = zf->early_dest != NULL ? zf->early_stage : zf_take_stage(zf, background);
        zf_grads_to_host(zf, zf->grad_stage[stage]);
        if (single) {
            // a window of one step: A = 0 + g_t, which is g_t itself (a gradient is a sum that
            // starts from +0, so it is never -0, the one value 0 + g would change)
            window_sum = zf->grad_stage[stage];
        } else {
            // (auto U, a step that does not close: the job also sums |A| for spec 6)
            ZfAccumulateJob* job = &zf->acc_jobs[stage];
            *job = ZfAccumulateJob{zf, zf->grad_stage[stage], zf->acc, zf->cpu_elems,
                                   zf->window_count == 0, auto_u && !closes ? zf->sum_cpu : NULL, s};
            zf_run_job(zf, background ? zf->accumulator : NULL, zf_accumulate, job, &zf->stage_reader[stage], s);
        }
    }
    // (spec 7, GPU accumulation: the backward pass has already added g_t into the gradient
    // buffer's CPU-owned columns, on top of the window's earlier steps)
    zf->window_count++;

    // 4.5 boundary? (warm-up: every step, synchronously)
    if (!closes) {
        if (auto_u) {
            // spec 6: this step's sums start now; zf_auto_decide reads them one step later
            // (CPU accumulation: the accumulation job, if any, sums |A| too)
            be->abs_sums(be->ctx, zf, zf->sum_sel, cfg->accumulate == ZF_ACCUMULATE_GPU ? zf->sum_cpu : NULL);
            zf->auto_job = stage >= 0 && background ? zf->stage_reader[stage] : zf_no_job;
            zf->auto_pending = 1;
        }
        return;
    }

    // 4.6 boundary: close the window; the next one starts with n = 0 (and its first
    // accumulation, or with GPU accumulation zf_before_backward, starts A from 0)
    const int n = zf->window_count;
    zf->window_count = 0;
    zf->closed_window = n;
    if (auto_u) {
        zf->close_next = 0;
        memset(zf->c_sum, 0, zf->num_matrices * sizeof(double));
        if (zf->selection_log != NULL) { fprintf(zf->selection_log, "win %d %d\n", t, n); }
    }
    if (!cpu_work) { return; }
    ZfAdamHyper cpu_hyper = hyper;  // every CPU-owned element is a matrix element: decay on
    if (!background) {
        // synchronous: update now, apply before the next forward
        if (cfg->accumulate == ZF_ACCUMULATE_GPU) {
            zf_grads_to_host(zf, zf->acc);  // A, once per window
            window_sum = zf->acc;
        }
        ZfWindowJob job = {zf, window_sum, n, s, cpu_hyper, 0, zf_no_job, 0.0};
        zf_run_job(zf, NULL, zf_window_update, &job, NULL, s);
        zf->cpu_update_ms = job.ms;
        if (zf->pipeline) {
            // layer by layer, each just before its forward (zf_forward_layer)
            zf->apply_src = zf->master;
            zf->next_apply_group = 0;
        } else {
            double t4 = now_ms();
            be->params_from_host(be->ctx, zf, zf->master, -1);
            zf_trace_device(zf, TRACE_H2D, "apply", t4);
        }
    } else {
        // overlap: apply window w-1, then hand window w to the updater and go on training
        zf_wait_and_apply(zf);
        if (cfg->accumulate == ZF_ACCUMULATE_GPU || !single) {
            std::swap(zf->acc, zf->acc_job);  // freeze this window's A for the job
            window_sum = zf->acc_job;
        }
        if (cfg->accumulate == ZF_ACCUMULATE_GPU) {
            zf_grads_to_host(zf, zf->acc_job);  // A, once per window (the buffer that was acc)
        }
        // (CPU accumulation: the update starts after this step's accumulation, on the other thread)
        ZfTicket after = cfg->accumulate == ZF_ACCUMULATE_CPU && !single ? zf->stage_reader[stage] : zf_no_job;
        zf->job = ZfWindowJob{zf, window_sum, n, s, cpu_hyper, 1, after, 0.0};
        zf->pending_ticket = zf_worker_submit(zf->updater, zf_window_update, &zf->job);
        if (cfg->accumulate == ZF_ACCUMULATE_CPU && single) {
            zf->stage_reader[stage] = ZfTicket{zf->updater, zf->pending_ticket};  // it reads the stage
        }
        zf->pending = 1;
    }
}

// ----------------------------------------------------------------------------
// checkpoints: everything ZenFlow needs to continue bit for bit (issue 7). A window job
// still running is waited for but NOT applied: applying early would change when the update
// lands, and so the trajectory. Its result is saved as the master, with `pending` set.

static inline void zf_save_state(ZenFlow* zf, FILE* fp, const char* path) {
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
static inline void zf_load_state(ZenFlow* zf, FILE* fp, const char* path) {
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
    if (zf->cpu_elems > zf->cpu_capacity ||
        zf->gpu_sel_elems > zf->gpu_capacity) {
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

#endif  // ZENFLOW_H
