// Benchmark of cpu_adam.cpp: AdamW params/s at 1 and all threads, against the memory
// bandwidth limit; and ZenFlow's CPU side over one window of U steps, run on the two
// threads as zenflow.h runs it. scripts/bench_cpu_adam.py runs this, puts torch next to it
// and turns the window into the shortest training step this host keeps up with.
//
// Usage:
//   bench_cpu_adam [n_params] [reps] [U] [window_elems]     (defaults 32M, 7, 4, 128M)
//   bench_cpu_adam --check DIR N S LR WD B1 B2 EPS   (used by the python script: reads
//       DIR/in.bin = p,m,v,g as N fp32 each, runs one zf_cpu_adam_step at step S with these
//       hyperparameters (hex floats, so they arrive exact), writes DIR/out.bin = p,m,v)
//
// Output: a readable table, plus lines "RESULT <name> <value>" for the script.
//
// How bytes are counted: one AdamW element reads p, m, v, g (16 B) and writes p, m, v
// (12 B) = 28 B. A memcpy of B bytes reads B and writes B, counted as 2B moved. So the
// bandwidth limit is copy_GB/s / 28 bytes per parameter. (glibc's memcpy uses non-temporal
// stores for buffers this large, so the copy does not also read the destination; AdamW
// writes lines it has just read, so it pays no extra read either.)
//
// Layout matters on AMD Zen: arrays exactly a large power of two apart collide in the L1
// way predictor. "staggered" puts the arrays 64 KB further apart than back to back,
// "back to back" packs them (for n = 32M that is exactly 128 MB apart: the bad case).
#include "../cpu_adam.h"
#include "../zenflow.h"

#include <algorithm>
#include <chrono>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
static int max_threads() { return omp_get_max_threads(); }  // OMP_NUM_THREADS or all cores
static void set_threads(int nt) { omp_set_num_threads(nt); }
#else
static int max_threads() { return 1; }
static void set_threads(int) {}
#endif

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}


typedef struct {
    double best, median;  // seconds
} Timing;

// Time fn(arg) reps times after one warm-up call.
static Timing time_it(void (*fn)(void*), void* arg, int reps) {
    fn(arg);
    std::vector<double> t;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        fn(arg);
        t.push_back(now_s() - t0);
    }
    std::sort(t.begin(), t.end());
    Timing out = {t[0], t[t.size() / 2]};
    return out;
}

// ---------------------------------------------------------------------------------------
// AdamW state: p, m, v, g, acc in one 2 MB-aligned arena, each array `gap` bytes after the
// end of the previous one, every byte touched so that page faults are not timed.
typedef struct {
    char* arena;
    float *p, *m, *v, *g, *acc;
    size_t n;
    int s;
    int count;  // steps in the window whose mean run_adam_mean takes (acc holds 4 g)
    ZfAdamHyper h;
} AdamArgs;

static AdamArgs make_adam(size_t n, size_t gap) {
    AdamArgs a;
    size_t stride = (n * 4 + 63) / 64 * 64 + gap;
    size_t bytes = (5 * stride + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    a.arena = (char*)aligned_alloc(2u << 20, bytes);
    if (!a.arena) { fprintf(stderr, "out of memory\n"); exit(1); }
    // first touched by every thread, in 2 MB pieces, as zenflow.h's zf_host_zeros does
    long pieces = (long)(bytes >> 21);
#pragma omp parallel for schedule(static)
    for (long k = 0; k < pieces; k++) memset(a.arena + ((size_t)k << 21), 0, (size_t)1 << 21);
    float* arr[5];
    for (int k = 0; k < 5; k++) arr[k] = (float*)(a.arena + k * stride);
    a.p = arr[0]; a.m = arr[1]; a.v = arr[2]; a.g = arr[3]; a.acc = arr[4];
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        a.p[i] = 0.01f * (float)(i % 200) - 1.0f;
        a.g[i] = (float)((i * 2654435761u) % 1000) * 1e-6f - 5e-4f;  // spread out, no denormals
        a.acc[i] = 4.0f * a.g[i];
    }
    a.n = n;
    a.s = 0;
    a.count = 4;
    a.h = ZfAdamHyper{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
    return a;
}

static void run_adam(void* a) {
    AdamArgs* x = (AdamArgs*)a;
    zf_cpu_adam_step(x->p, x->m, x->v, x->g, 1, x->n, x->h, ++x->s);
}
static void run_adam_mean(void* a) {
    AdamArgs* x = (AdamArgs*)a;
    zf_cpu_adam_step(x->p, x->m, x->v, x->acc, x->count, x->n, x->h, ++x->s);
}
static void run_accumulate(void* a) {
    AdamArgs* x = (AdamArgs*)a;
    zf_cpu_accumulate(x->acc, x->g, x->n, 0);
}
// The memory traffic of AdamW with almost no arithmetic: what this access pattern can
// reach on this machine, a second, pattern-matched ceiling next to the memcpy one.
static void run_same_traffic(void* a) {
    AdamArgs* x = (AdamArgs*)a;
    float *p = x->p, *m = x->m, *v = x->v;
    const float* g = x->g;
    long n = (long)x->n;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        p[i] += g[i];
        m[i] += g[i];
        v[i] += g[i];
    }
}

typedef struct {
    char *dst, *src;
    size_t bytes;
} CopyArgs;

// Every OpenMP thread copies its own contiguous part (one thread: one memcpy).
static void run_copy(void* a) {
    CopyArgs* x = (CopyArgs*)a;
#ifdef _OPENMP
#pragma omp parallel
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t pages = x->bytes / 4096;
        size_t lo = pages * t / nt * 4096, hi = pages * (t + 1) / nt * 4096;
        if (t == nt - 1) hi = x->bytes;
        memcpy(x->dst + lo, x->src + lo, hi - lo);
    }
#else
    memcpy(x->dst, x->src, x->bytes);
#endif
}

// Updater job for the "main thread busy too" measurement.
static int adam_job(void* a) {
    run_adam(a);
    return 0;
}

// The jobs of one ZenFlow window (zenflow.h's zf_accumulate and zf_window_update, without
// the bookkeeping): one step's A += g on the accumulator thread, the window's AdamW with
// G = A / U on the updater thread.
typedef struct {
    float* acc;
    const float* g;
    size_t n;
    int first;  // the window's first step: A = 0 + g
} AccumulateArgs;

static int accumulate_job(void* arg) {
    AccumulateArgs* x = (AccumulateArgs*)arg;
    zf_cpu_accumulate(x->acc, x->g, x->n, x->first);
    return 0;
}

static int window_update_job(void* a) {  // a: AdamArgs whose count is U
    run_adam_mean(a);
    return 0;
}

static double median_ms(std::vector<double> t) {
    std::sort(t.begin(), t.end());
    return t[t.size() / 2] * 1e3;
}

static int check_mode(int argc, char** argv) {
    if (argc != 10) { fprintf(stderr, "usage: --check DIR N S LR WD B1 B2 EPS\n"); return 2; }
    std::string dir = argv[2];
    size_t n = strtoull(argv[3], NULL, 10);
    int s = atoi(argv[4]);
    ZfAdamHyper h = {strtof(argv[5], NULL), strtof(argv[7], NULL), strtof(argv[8], NULL),
                     strtof(argv[9], NULL), strtof(argv[6], NULL)};
    std::vector<float> buf(4 * n);
    FILE* f = fopen((dir + "/in.bin").c_str(), "rb");
    if (!f || fread(buf.data(), 4, 4 * n, f) != 4 * n) {
        fprintf(stderr, "error: %s/in.bin: %s\n", dir.c_str(), f ? "shorter than 4n floats" : strerror(errno));
        return 1;
    }
    fclose(f);
    float *p = buf.data(), *m = p + n, *v = m + n, *g = v + n;
    zf_cpu_adam_step(p, m, v, g, 1, n, h, s);
    f = fopen((dir + "/out.bin").c_str(), "wb");
    if (!f || fwrite(buf.data(), 4, 3 * n, f) != 3 * n) {
        fprintf(stderr, "error: %s/out.bin: cannot write: %s\n", dir.c_str(), strerror(errno));
        return 1;
    }
    fclose(f);
    return 0;
}

// One table row per thread count: best and median rate, printed divided by `scale`;
// the RESULT lines carry the plain rate (params/s, or bytes/s for the copy).
static void row(const char* name, const char* key, void (*fn)(void*), void* arg, int reps,
                int all, double units_per_call, double scale, const char* unit) {
    for (int nt : {1, all}) {
        set_threads(nt);
        Timing t = time_it(fn, arg, reps);
        double best = units_per_call / t.best, med = units_per_call / t.median;
        printf("%-40s %7d %9.1f %s %9.1f %s\n", name, nt, best / scale, unit, med / scale, unit);
        printf("RESULT %s_%dt %.6g\nRESULT %s_med_%dt %.6g\n", key, nt, best, key, nt, med);
        if (all == 1) break;
    }
}

int main(int argc, char** argv) {
    if (argc > 1 && !strcmp(argv[1], "--check")) return check_mode(argc, argv);
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)32 << 20;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    int window_u = argc > 3 ? atoi(argv[3]) : 4;
    size_t window_n = argc > 4 ? strtoull(argv[4], NULL, 10) : (size_t)128 << 20;
    if (n < 1024 || reps < 1 || window_u < 1 || window_n < 1024) {
        fprintf(stderr, "usage: bench_cpu_adam [n_params >= 1024] [reps >= 1] [U >= 1] [window_elems >= 1024]\n");
        return 2;
    }
    int all = max_threads();
    printf("n = %zu params (%.0f MB of p,m,v,g), %d reps after a warm-up, threads 1 and %d\n",
           n, n * 16.0 / 1e6, reps, all);
    printf("RESULT n %zu\nRESULT threads %d\n", n, all);
    printf("\n%-40s %7s %14s %14s\n", "", "threads", "best", "median");

    // Copy bandwidth: buffers as large as the four AdamW arrays together.
    CopyArgs c;
    c.bytes = n * 16;
    c.src = (char*)aligned_alloc(4096, c.bytes);
    c.dst = (char*)aligned_alloc(4096, c.bytes);
    memset(c.src, 1, c.bytes);
    memset(c.dst, 0, c.bytes);
    row("memcpy (read + write bytes)", "copy_bps", run_copy, &c, reps, all, 2.0 * c.bytes, 1e9, "GB/s");
    free(c.src);
    free(c.dst);

    AdamArgs a = make_adam(n, 64 << 10);
    row("same traffic, no math (staggered)", "traffic_pps", run_same_traffic, &a, reps, all, (double)n, 1e6, "M/s ");
    row("zf_cpu_adam_step, steps 1 (staggered)", "adam_pps", run_adam, &a, reps, all, (double)n, 1e6, "M/s ");
    row("zf_cpu_adam_step, steps 4 (staggered)", "adam_mean_pps", run_adam_mean, &a, reps, all, (double)n, 1e6, "M/s ");
    row("zf_cpu_accumulate (staggered)", "accumulate_pps", run_accumulate, &a, reps, all, (double)n, 1e6, "M/s ");

    AdamArgs b = make_adam(n, 0);
    row("zf_cpu_adam_step, steps 1 (back to back)", "adam_b2b_pps", run_adam, &b, reps, all, (double)n, 1e6, "M/s ");

    // The updater's own OpenMP team next to a busy main-thread team: run one AdamW step in
    // a job while the main thread runs another on different arrays (both with all threads),
    // and compare with running the two one after the other. Close to 1.0 (or below) means
    // the two teams share the cores without bad oversubscription (spinning, stragglers).
    set_threads(all);
    ZfWorker* u = zf_worker_create(all);
    zf_worker_wait(u, zf_worker_submit(u, adam_job, &b));  // warm up its thread pool
    std::vector<double> seq, par;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        run_adam(&a);
        zf_worker_wait(u, zf_worker_submit(u, adam_job, &b));
        seq.push_back(now_s() - t0);
        t0 = now_s();
        long tk = zf_worker_submit(u, adam_job, &b);
        run_adam(&a);
        zf_worker_wait(u, tk);
        par.push_back(now_s() - t0);
    }
    double ms_seq = median_ms(seq), ms_par = median_ms(par);
    printf("\ntwo AdamW steps (staggered + back to back), main thread and updater job, %d threads each, median:\n"
           "  one after the other %.1f ms, at the same time %.1f ms, ratio %.2f\n",
           all, ms_seq, ms_par, ms_par / ms_seq);
    printf("RESULT overlap_seq_ms %.2f\nRESULT overlap_par_ms %.2f\n", ms_seq, ms_par);
    free(a.arena);
    free(b.arena);

    // ZenFlow's CPU side over one window, with overlap on (zenflow.h, "Threads"): in the
    // U steps of window w+1 the accumulator thread adds w+1's gradients into one A, step by
    // step, while the updater thread runs window w's AdamW from the other A; the teams are the
    // trainer's (zf_team_sizes: below 4 cores each takes every core, from 4 on they share all
    // but one), and both share the memory bus. The host keeps up when the two are done within
    // U training steps, so U jobs are queued at once here and the window takes as long as both
    // need together. With GPU accumulation (-za gpu) the GPU adds the window up, and the host
    // runs the update alone. Not included: the bus traffic of the copy engines, which write
    // each step's gradients into host memory (-za cpu) and read the window's result. The
    // arrays hold window_n elements each, 512 MB by default, so that the window's 3 GB stream
    // from memory even past a large L3 cache (some servers have 480 MB of it) as a real
    // model's gigabytes would.
    AdamArgs state = make_adam(window_n, 64 << 10);  // the updater's master, m, v and its A
    AdamArgs w = make_adam(window_n, 64 << 10);      // the accumulator's A (w.acc) and staging (w.g)
    AccumulateArgs acc_jobs[2];
    for (int j = 0; j < 2; j++) { acc_jobs[j] = AccumulateArgs{w.acc, w.g, window_n, j == 0}; }
    state.count = window_u;
    int upd_cpu, acc_cpu, upd_gpu, no_acc;  // -za cpu runs both threads, -za gpu the updater alone
    zf_team_sizes(all, 1, &upd_cpu, &acc_cpu);
    zf_team_sizes(all, 0, &upd_gpu, &no_acc);
    ZfWorker* acc_thread = zf_worker_create(acc_cpu);
    ZfWorker* u_cpu = zf_worker_create(upd_cpu);
    ZfWorker* u_gpu = zf_worker_create(upd_gpu);
    std::vector<double> both, upd_alone, acc_alone;
    for (int r = 0; r <= reps; r++) {  // r = 0 warms up the accumulator's thread pool
        double t0 = now_s();
        long last = -1;
        for (int step = 0; step < window_u; step++) {
            last = zf_worker_submit(acc_thread, accumulate_job, &acc_jobs[step == 0 ? 0 : 1]);
        }
        zf_worker_wait(acc_thread, last);
        double t1 = now_s();
        zf_worker_wait(u_gpu, zf_worker_submit(u_gpu, window_update_job, &state));
        double t2 = now_s();
        long tu = zf_worker_submit(u_cpu, window_update_job, &state);
        for (int step = 0; step < window_u; step++) {
            last = zf_worker_submit(acc_thread, accumulate_job, &acc_jobs[step == 0 ? 0 : 1]);
        }
        zf_worker_wait(u_cpu, tu);
        zf_worker_wait(acc_thread, last);
        double t3 = now_s();
        if (r == 0) { continue; }
        acc_alone.push_back(t1 - t0);
        upd_alone.push_back(t2 - t1);
        both.push_back(t3 - t2);
    }
    double ms_acc = median_ms(acc_alone), ms_upd = median_ms(upd_alone), ms_both = median_ms(both);
    printf("\nZenFlow's CPU side, one window of U = %d steps, n = %zu CPU-owned elements, median:\n"
           "  %d accumulations alone %.1f ms (%d threads), the window update alone %.1f ms (%d threads;\n"
           "  -za gpu: the host's whole window), both at the same time on their two threads %.1f ms\n"
           "  (%d + %d threads; -za cpu)\n",
           window_u, window_n, window_u, ms_acc, acc_cpu, ms_upd, upd_gpu, ms_both, upd_cpu, acc_cpu);
    printf("RESULT window_u %d\nRESULT window_n %zu\nRESULT window_accumulate_ms %.3f\n"
           "RESULT window_update_ms %.3f\nRESULT window_both_ms %.3f\n", window_u, window_n, ms_acc, ms_upd, ms_both);
    printf("RESULT window_updater_threads %d\nRESULT window_accumulator_threads %d\n"
           "RESULT window_updater_alone_threads %d\n", upd_cpu, acc_cpu, upd_gpu);
    int rc = zf_worker_destroy(acc_thread);
    rc = rc != 0 ? rc : zf_worker_destroy(u_cpu);
    rc = rc != 0 ? rc : zf_worker_destroy(u_gpu);
    int rc_u = zf_worker_destroy(u);
    free(state.arena);
    free(w.arena);
    return rc != 0 ? rc : rc_u;
}
