// cpu_adam.h: the CPU side of ZenFlow.
//  - zf_cpu_adam_step, zf_cpu_accumulate: AdamW (exactly docs/zenflow_spec.md section 3.1) and
//    the window sum over flat fp32 arrays, bitwise the same as a plain scalar loop for any
//    thread count.
//  - zf_worker_*: ZfWorker, one background thread that runs jobs in submission order (spec 4.6,
//    "overlap on"), with a debug switch that injects random delays (spec 5). zenflow.h
//    runs two: the updater (window updates) and the accumulator (per-step A += g).
//
// Build: g++ -std=c++17 -O3 -march=native -fopenmp -ffp-contract=off -c cpu_adam.cpp
// -ffp-contract=off is required (no fused multiply-add, spec 3.1); never -ffast-math
// (it reorders arithmetic and, when linking, sets flush-to-zero for the whole program).
// Without -fopenmp the code still builds and runs single-threaded (used for the
// ThreadSanitizer build, where libgomp would report false races).
#pragma once
#include <stddef.h>

// Hyperparameters as the fp32 roundings spec 3.1 talks about. Callers that hold doubles
// convert once, here, so every side rounds the same way.
typedef struct {
    float lr;            // learning rate of the step at which the update runs
    float beta1;         // default 0.9
    float beta2;         // default 0.95
    float eps;           // default 1e-8
    float weight_decay;  // 0 for vectors (spec 1); it is still applied as 0*p, see llmc/adamw.h
} ZfAdamHyper;

// ---------------------------------------------------------------------------------------
// AdamW. All arrays have n elements and must not overlap each other (p, m, v are updated
// in place). s is the global step number, 1-based (s = t + 1). Runs an OpenMP parallel
// region with the calling thread's OpenMP thread count; the result does not depend on it.
// Speed (not results) may depend on where the arrays lie: p, m, v, g exactly a large power of
// two apart (back-to-back arrays of 2^k floats) can compete for the same cache sets, unlike
// arrays with a 64 KB gap between them (dev/bench_cpu_adam.cpp times both). 64-byte
// alignment is best; any alignment works.

// One AdamW step over n elements with the gradient g[i] / steps: steps = 1 for one step's
// gradient, or the number of steps whose sum g is (a window's A: spec 4.6, the mean). One
// true fp32 division per element (not a multiplication by 1/steps, which rounds differently;
// x / 1 is x, bit for bit). steps >= 1 and exactly representable (< 2^24).
void zf_cpu_adam_step(float* p, float* m, float* v, const float* g, int steps, size_t n,
                      ZfAdamHyper h, int s);

// acc[i] += g[i] (spec 4.4), or with `first` (a window's first step) acc[i] = 0 + g[i]. One
// fp32 addition per element, so the sum over a window is the same sequence of roundings on
// every side.
void zf_cpu_accumulate(float* acc, const float* g, size_t n, int first);

// ---------------------------------------------------------------------------------------
// The worker (ZfWorker): one background thread that runs submitted jobs one at a time, in
// submission order. Determinism (spec 5) is the caller's part: until the caller has waited for a
// job's ticket, the buffers it reads are written by nobody, or only by a job it waits for first.
//
// Errors: a job returns 0 on success or a non-zero error code. The first non-zero code
// sticks: later jobs are not run (they would work on state that is already wrong), and
// every later zf_worker_wait / zf_worker_drain / zf_worker_destroy returns that code,
// and zf_worker_error tells it without waiting.

typedef int (*ZfJobFn)(void* arg);
typedef struct ZfWorker ZfWorker;

// Queue fn(arg). Returns its ticket: 0 for the first job, then 1, 2, ...
long zf_worker_submit(ZfWorker* u, ZfJobFn fn, void* arg);

// Block until the job with this ticket (and so every earlier one) has finished or been
// skipped. Returns 0, or the first error of any job finished so far. A negative ticket
// ("no job yet") returns at once; a ticket never handed out aborts (it would hang).
// Not to be called from inside a job of the same worker (it would wait for itself); a job
// may wait for another worker's ticket, as long as no job of that one waits back.
int zf_worker_wait(ZfWorker* u, long ticket);

// Without blocking: 1 if the job with this ticket has finished or been skipped (a negative
// ticket: 1), else 0. What zf_worker_wait would do now without waiting.
int zf_worker_finished(ZfWorker* u, long ticket);

// Without blocking: the first error of any job so far, or 0 (u may be NULL: 0).
int zf_worker_error(ZfWorker* u);

// idle, without blocking: 1 if every submitted job has finished. drain: blocks until every
// submitted job has, and returns 0 or the first error. u may be NULL (no thread: idle).
int zf_worker_idle(ZfWorker* u);
int zf_worker_drain(ZfWorker* u);

// OpenMP: a job may call zf_cpu_adam_step; its parallel region runs on a team of the
// worker thread, separate from any team of the main thread (libgomp keeps one thread
// pool per thread that starts a parallel region). omp_threads sets that team's size: the
// OpenMP threads for parallel regions run by jobs; 0 = the OpenMP default (OMP_NUM_THREADS
// or all cores). Returns NULL if the thread cannot be started.
// Debug: if the environment variable ZF_WORKER_DELAY_US=<max> is set when the worker is
// created, the thread sleeps a random 0..max microseconds before and after every job
// (seeded from the clock). Results must not change; the determinism tests use this.
ZfWorker* zf_worker_create(int omp_threads);

// the OpenMP default team size: OMP_NUM_THREADS, else the cores (1 without OpenMP)
int zf_cpu_cores(void);

// Drain (pending jobs still run), stop and join the thread, free. Returns 0 or the first
// error, so an error is reported even if nobody waited after it. u may be NULL.
int zf_worker_destroy(ZfWorker* u);
