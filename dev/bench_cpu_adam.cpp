// Benchmark of cpu_adam.cpp: AdamW params/s at 1 and all threads, against the memory
// bandwidth limit. scripts/bench_cpu_adam.py runs this and puts torch next to it.
//
// Usage:
//   bench_cpu_adam [n_params] [reps]     (defaults 32M, 7)
//   bench_cpu_adam --check DIR N S LR WD  (used by the python script: reads DIR/in.bin =
//       p,m,v,g as N fp32 each, runs one zf_cpu_adam_step at step S with lr LR and decay
//       WD (hex floats are fine), writes DIR/out.bin = p,m,v)
//
// Output: a readable table, plus lines "RESULT <name> <value>" for the script.
//
// How bytes are counted: one AdamW element reads p, m, v, g (16 B) and writes p, m, v
// (12 B) = 28 B. A memcpy of B bytes reads B and writes B, counted as 2B moved. So the
// bandwidth limit is copy_GB/s / 28 bytes per parameter. (glibc's memcpy uses non-temporal
// stores for buffers this large, so the copy does not also read the destination; AdamW
// writes lines it has just read, so it pays no extra read either.)
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

// 64-byte aligned buffer, touched so that page faults are not timed.
static float* alloc_floats(size_t n, float value) {
    float* p = (float*)aligned_alloc(64, ((n * 4 + 63) / 64) * 64);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) p[i] = value;
    return p;
}

typedef struct {
    float *p, *m, *v, *g, *acc;
    size_t n;
    int s;
    ZfAdamHyper h;
} AdamArgs;

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
        size_t lo = x->bytes / 4096 * t / nt * 4096, hi = x->bytes / 4096 * (t + 1) / nt * 4096;
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

static AdamArgs make_adam(size_t n) {
    AdamArgs a;
    a.n = n;
    a.s = 0;
    a.h = ZfAdamHyper{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
    a.p = alloc_floats(n, 0.01f);
    a.m = alloc_floats(n, 0.0f);
    a.v = alloc_floats(n, 0.0f);
    a.g = alloc_floats(n, 0.001f);
    a.acc = alloc_floats(n, 0.004f);
    for (size_t i = 0; i < n; i++) a.g[i] = (float)((i * 2654435761u) % 1000) * 1e-6f - 5e-4f;
    return a;
}

static void free_adam(AdamArgs* a) {
    free(a->p); free(a->m); free(a->v); free(a->g); free(a->acc);
}

static int check_mode(int argc, char** argv) {
    if (argc != 7) { fprintf(stderr, "usage: --check DIR N S LR WD\n"); return 2; }
    std::string dir = argv[2];
    size_t n = strtoull(argv[3], NULL, 10);
    int s = atoi(argv[4]);
    ZfAdamHyper h = {strtof(argv[5], NULL), 0.9f, 0.95f, 1e-8f, strtof(argv[6], NULL)};
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

int main(int argc, char** argv) {
    if (argc > 1 && !strcmp(argv[1], "--check")) return check_mode(argc, argv);
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)32 << 20;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    int all = max_threads();
    printf("n = %zu params (%.0f MB of p,m,v,g), reps = %d (best and median), threads 1 and %d\n",
           n, n * 16.0 / 1e6, reps, all);
    printf("RESULT n %zu\nRESULT threads %d\n", n, all);

    // Copy bandwidth: buffers as large as the four AdamW arrays together.
    CopyArgs c;
    c.bytes = n * 16;
    c.src = (char*)alloc_floats(n * 4, 1.0f);
    c.dst = (char*)alloc_floats(n * 4, 0.0f);
    printf("\n%-34s %8s %12s %12s\n", "", "threads", "best", "median");
    for (int nt : {1, all}) {
        set_threads(nt);
        Timing t = time_it(run_copy, &c, reps);
        double gbs = 2.0 * c.bytes / t.best / 1e9, gbs_med = 2.0 * c.bytes / t.median / 1e9;
        printf("%-34s %8d %9.2f GB/s %7.2f GB/s\n", "memcpy (read+write bytes)", nt, gbs, gbs_med);
        printf("RESULT copy_gbs_%dt %.4f\nRESULT copy_gbs_med_%dt %.4f\n", nt, gbs, nt, gbs_med);
    }
    free(c.src);
    free(c.dst);

    AdamArgs a = make_adam(n);
    struct { const char* name; const char* key; void (*fn)(void*); } rows[] = {
        {"zf_cpu_adam_step", "adam", run_adam},
        {"zf_cpu_adam_step_mean", "adam_mean", run_adam_mean},
        {"zf_cpu_accumulate", "accumulate", run_accumulate},
    };
    for (auto& r : rows)
        for (int nt : {1, all}) {
            set_threads(nt);
            Timing t = time_it(r.fn, &a, reps);
            printf("%-34s %8d %9.1f M/s  %7.1f M/s\n", r.name, nt, n / t.best / 1e6, n / t.median / 1e6);
            printf("RESULT %s_pps_%dt %.1f\nRESULT %s_pps_med_%dt %.1f\n", r.key, nt, n / t.best,
                   r.key, nt, n / t.median);
        }

    // The updater's own OpenMP team next to a busy main-thread team: run one AdamW step in
    // a job while the main thread runs another on different arrays (both with all threads),
    // and compare with running the two one after the other. Close to 1.0 means the two
    // teams share the cores without bad oversubscription (spinning threads, stragglers).
    set_threads(all);
    AdamArgs b = make_adam(n);
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
    double ratio = par[reps / 2] / seq[reps / 2];
    printf("\ntwo AdamW steps, main thread + updater job, %d threads each (median):\n", all);
    printf("  one after the other %.1f ms, at the same time %.1f ms, ratio %.2f\n",
           seq[reps / 2] * 1e3, par[reps / 2] * 1e3, ratio);
    printf("RESULT overlap_seq_ms %.2f\nRESULT overlap_par_ms %.2f\n", seq[reps / 2] * 1e3, par[reps / 2] * 1e3);
    int rc = zf_updater_destroy(u);
    free_adam(&a);
    free_adam(&b);
    return rc;
}
