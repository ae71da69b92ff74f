// Benchmark of cpu_adam.cpp: AdamW params/s at 1 and all threads, against the memory
// bandwidth limit. scripts/bench_cpu_adam.py runs this and puts torch next to it.
//
// Usage:
//   bench_cpu_adam [n_params] [reps]     (defaults 32M, 7)
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

#include <algorithm>
#include <chrono>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static int max_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();  // OMP_NUM_THREADS or all cores
#else
    return 1;
#endif
}

static void set_threads(int nt) {
#ifdef _OPENMP
    omp_set_num_threads(nt);
#else
    (void)nt;
#endif
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
    ZfAdamHyper h;
} AdamArgs;

static AdamArgs make_adam(size_t n, size_t gap) {
    AdamArgs a;
    size_t stride = (n * 4 + 63) / 64 * 64 + gap;
    size_t bytes = (5 * stride + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    a.arena = (char*)aligned_alloc(2u << 20, bytes);
    if (!a.arena) { fprintf(stderr, "out of memory\n"); exit(1); }
    memset(a.arena, 0, bytes);
    float* arr[5];
    for (int k = 0; k < 5; k++) arr[k] = (float*)(a.arena + k * stride);
    a.p = arr[0]; a.m = arr[1]; a.v = arr[2]; a.g = arr[3]; a.acc = arr[4];
    for (size_t i = 0; i < n; i++) {
        a.p[i] = 0.01f * (float)(i % 200) - 1.0f;
        a.g[i] = (float)((i * 2654435761u) % 1000) * 1e-6f - 5e-4f;  // spread out, no denormals
        a.acc[i] = 4.0f * a.g[i];
    }
    a.n = n;
    a.s = 0;
    a.h = ZfAdamHyper{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
    return a;
}

static void run_adam(void* a) {
    AdamArgs* x = (AdamArgs*)a;
    zf_cpu_adam_step(x->p, x->m, x->v, x->g, x->n, x->h, ++x->s);
}
static void run_adam_mean(void* a) {
    AdamArgs* x = (AdamArgs*)a;
    zf_cpu_adam_step_mean(x->p, x->m, x->v, x->acc, 4, x->n, x->h, ++x->s);
}
static void run_accumulate(void* a) {
    AdamArgs* x = (AdamArgs*)a;
    zf_cpu_accumulate(x->acc, x->g, x->n);
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

static int check_mode(int argc, char** argv) {
    if (argc != 10) { fprintf(stderr, "usage: --check DIR N S LR WD B1 B2 EPS\n"); return 2; }
    std::string dir = argv[2];
    size_t n = strtoull(argv[3], NULL, 10);
    int s = atoi(argv[4]);
    ZfAdamHyper h = {strtof(argv[5], NULL), strtof(argv[7], NULL), strtof(argv[8], NULL),
                     strtof(argv[9], NULL), strtof(argv[6], NULL)};
    std::vector<float> buf(4 * n);
    FILE* f = fopen((dir + "/in.bin").c_str(), "rb");
    if (!f || fread(buf.data(), 4, 4 * n, f) != 4 * n) { fprintf(stderr, "cannot read in.bin\n"); return 1; }
    fclose(f);
    float *p = buf.data(), *m = p + n, *v = m + n, *g = v + n;
    zf_cpu_adam_step(p, m, v, g, n, h, s);
    f = fopen((dir + "/out.bin").c_str(), "wb");
    if (!f || fwrite(buf.data(), 4, 3 * n, f) != 3 * n) { fprintf(stderr, "cannot write out.bin\n"); return 1; }
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
    row("zf_cpu_adam_step (staggered)", "adam_pps", run_adam, &a, reps, all, (double)n, 1e6, "M/s ");
    row("zf_cpu_adam_step_mean (staggered)", "adam_mean_pps", run_adam_mean, &a, reps, all, (double)n, 1e6, "M/s ");
    row("zf_cpu_accumulate (staggered)", "accumulate_pps", run_accumulate, &a, reps, all, (double)n, 1e6, "M/s ");

    AdamArgs b = make_adam(n, 0);
    row("zf_cpu_adam_step (back to back)", "adam_b2b_pps", run_adam, &b, reps, all, (double)n, 1e6, "M/s ");

    // The updater's own OpenMP team next to a busy main-thread team: run one AdamW step in
    // a job while the main thread runs another on different arrays (both with all threads),
    // and compare with running the two one after the other. Close to 1.0 (or below) means
    // the two teams share the cores without bad oversubscription (spinning, stragglers).
    set_threads(all);
    ZfUpdater* u = zf_updater_create(all);
    zf_updater_wait(u, zf_updater_submit(u, adam_job, &b));  // warm up its thread pool
    std::vector<double> seq, par;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        run_adam(&a);
        zf_updater_wait(u, zf_updater_submit(u, adam_job, &b));
        seq.push_back(now_s() - t0);
        t0 = now_s();
        long tk = zf_updater_submit(u, adam_job, &b);
        run_adam(&a);
        zf_updater_wait(u, tk);
        par.push_back(now_s() - t0);
    }
    std::sort(seq.begin(), seq.end());
    std::sort(par.begin(), par.end());
    double ms_seq = seq[reps / 2] * 1e3, ms_par = par[reps / 2] * 1e3;
    printf("\ntwo AdamW steps (staggered + back to back), main thread and updater job, %d threads each, median:\n"
           "  one after the other %.1f ms, at the same time %.1f ms, ratio %.2f\n",
           all, ms_seq, ms_par, ms_par / ms_seq);
    printf("RESULT overlap_seq_ms %.2f\nRESULT overlap_par_ms %.2f\n", ms_seq, ms_par);
    int rc = zf_updater_destroy(u);
    free(a.arena);
    free(b.arena);
    return rc;
}
