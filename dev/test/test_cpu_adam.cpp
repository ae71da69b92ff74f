// Tests for cpu_adam.cpp: the AdamW kernels against a scalar reference of spec 3.1 (bitwise),
// and the background updater (order, wait/drain, errors, debug delays, destroy).
// Usage: test_cpu_adam [adam|updater]   (default: both)
// Prints one line per check and finally "cpu_adam: N passed, M failed"; exit 1 on failure.
#include "../../cpu_adam.h"

#include <atomic>
#include <stdarg.h>
#include <chrono>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <thread>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
static void set_threads(int nt) { omp_set_num_threads(nt); }
static int max_test_threads() { return 4; }
#else
// built without OpenMP (the ThreadSanitizer build): one thread
static void set_threads(int) {}
static int max_test_threads() { return 1; }
#endif

static int g_passed = 0, g_failed = 0;

static void check(bool ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (ok) g_passed++; else g_failed++;
}

// ---------------------------------------------------------------------------------------
// Reference: spec 3.1 line by line. Every intermediate goes through a volatile float, so
// each operation is rounded to fp32 on its own even if this file were compiled with FMA
// contraction on; a kernel built with contraction then fails the comparison.
static void ref_adam(float* p, float* m, float* v, const float* g, const float* acc, int count,
                     size_t n, ZfAdamHyper h, int s) {
    volatile float b1 = h.beta1, b2 = h.beta2, lr = h.lr, eps = h.eps, wd = h.weight_decay;
    volatile float omb1 = 1.0f - b1;
    volatile float omb2 = 1.0f - b2;
    volatile float bc1 = (float)(1.0 - pow((double)h.beta1, s));
    volatile float bc2 = (float)(1.0 - pow((double)h.beta2, s));
    for (size_t i = 0; i < n; i++) {
        volatile float gi = acc ? acc[i] / (float)count : g[i];
        volatile float t1 = b1 * m[i];
        volatile float t2 = omb1 * gi;
        volatile float mi = t1 + t2;
        volatile float t3 = b2 * v[i];
        volatile float t4 = omb2 * gi;
        volatile float t5 = t4 * gi;
        volatile float vi = t3 + t5;
        volatile float mhat = mi / bc1;
        volatile float vhat = vi / bc2;
        volatile float r = sqrtf(vhat);
        volatile float den = r + eps;
        volatile float q = mhat / den;
        volatile float dec = wd * p[i];
        volatile float u = q + dec;
        volatile float step = lr * u;
        p[i] = p[i] - step;
        m[i] = mi;
        v[i] = vi;
    }
}

// Small deterministic generator (xorshift64*), so failures reproduce.
static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd_u32() {
    g_rng ^= g_rng >> 12; g_rng ^= g_rng << 25; g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545F4914F6CDD1Dull) >> 32);
}
static float rnd_uniform() { return (rnd_u32() >> 8) * (1.0f / 16777216.0f); }  // [0, 1)
static float rnd_sym() { return 2.0f * rnd_uniform() - 1.0f; }                   // [-1, 1)

// Gradients with a wide range of magnitudes, exact zeros, and a few subnormals, so that
// every rounding path (and IEEE subnormal handling) is exercised.
static float rnd_grad() {
    uint32_t k = rnd_u32() % 16;
    if (k == 0) return 0.0f;
    if (k == 1) return rnd_sym() * 1e-39f;  // subnormal
    return rnd_sym() * powf(10.0f, -(float)(rnd_u32() % 9));
}

typedef struct {
    std::vector<float> p, m, v, g;
} State;

static State random_state(size_t n) {
    State st;
    st.p.resize(n); st.m.resize(n); st.v.resize(n); st.g.resize(n);
    for (size_t i = 0; i < n; i++) {
        st.p[i] = rnd_sym() * 0.1f;
        if (i % 7 == 3) st.p[i] = 0.0f;          // zero weights (sign of zero matters)
        st.m[i] = rnd_sym() * 1e-3f;
        st.v[i] = rnd_uniform() * 1e-6f;
        if (i % 11 == 5) st.m[i] = st.v[i] = 0.0f;  // fresh moments
        st.g[i] = rnd_grad();
    }
    return st;
}

static bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

static bool same_state(const State& a, const State& b) {
    return same_bits(a.p, b.p) && same_bits(a.m, b.m) && same_bits(a.v, b.v);
}

// Index of the first differing element, for failure messages.
static long first_diff(const State& a, const State& b) {
    for (size_t i = 0; i < a.p.size(); i++)
        if (memcmp(&a.p[i], &b.p[i], 4) || memcmp(&a.m[i], &b.m[i], 4) || memcmp(&a.v[i], &b.v[i], 4))
            return (long)i;
    return -1;
}

static ZfAdamHyper hyper(float wd) {
    ZfAdamHyper h;
    h.lr = 6e-4f; h.beta1 = 0.9f; h.beta2 = 0.95f; h.eps = 1e-8f; h.weight_decay = wd;
    return h;
}

static const size_t k_sizes[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 65535, 65536, 65537, 1000003};

// zf_cpu_adam_step against the reference: several steps, every thread count, with and
// without weight decay, aligned and misaligned (offset by one float) arrays.
static void test_adam_step() {
    const int steps[] = {1, 2, 3, 1000};  // 1000: bias corrections ~1
    for (size_t n : k_sizes)
        for (float wd : {0.0f, 0.1f})
            for (int off : {0, 1}) {
                State init = random_state(n + off);
                ZfAdamHyper h = hyper(wd);
                for (int nt = 1; nt <= max_test_threads(); nt++) {
                    set_threads(nt);
                    State ref = init, got = init;
                    bool ok = true;
                    long bad = -1;
                    for (int s : steps) {
                        for (size_t i = 0; i < n + off; i++) ref.g[i] = got.g[i] = rnd_grad();
                        ref_adam(ref.p.data() + off, ref.m.data() + off, ref.v.data() + off,
                                 ref.g.data() + off, NULL, 0, n, h, s);
                        zf_cpu_adam_step(got.p.data() + off, got.m.data() + off, got.v.data() + off,
                                         got.g.data() + off, 1, n, h, s);
                        if (!same_state(ref, got)) { ok = false; bad = first_diff(ref, got); break; }
                    }
                    if (!ok || nt == 1 || n == 1000003)  // keep the output short
                        check(ok, "adam_step n=%zu wd=%g offset=%d threads=%d%s%ld", n, wd, off, nt,
                              ok ? "" : " first differing element ", ok ? 0L : bad);
                    else
                        g_passed++;
                }
            }
    set_threads(max_test_threads());
}

// The window mean: g = acc / count by a true division.
static void test_adam_mean() {
    for (size_t n : {(size_t)0, (size_t)17, (size_t)1000, (size_t)1000003})
        for (int count : {1, 3, 4, 7})
            for (int nt = 1; nt <= max_test_threads(); nt++) {
                set_threads(nt);
                State init = random_state(n);
                std::vector<float> acc(n);
                for (size_t i = 0; i < n; i++) acc[i] = rnd_grad() * (float)count;
                State ref = init, got = init;
                ZfAdamHyper h = hyper(0.1f);
                ref_adam(ref.p.data(), ref.m.data(), ref.v.data(), NULL, acc.data(), count, n, h, 5);
                zf_cpu_adam_step(got.p.data(), got.m.data(), got.v.data(), acc.data(), count, n, h, 5);
                bool ok = same_state(ref, got);
                if (!ok || nt == 1) check(ok, "adam_step window mean n=%zu count=%d threads=%d", n, count, nt);
                else g_passed++;
            }
    set_threads(max_test_threads());

    // Power check: acc * (1/3) rounds differently from acc / 3 for some inputs, so the
    // comparison above really tells the two apart.
    size_t n = 100000, differ = 0;
    std::vector<float> acc(n);
    for (size_t i = 0; i < n; i++) acc[i] = rnd_sym();
    volatile float inv3 = 1.0f / 3.0f;
    for (size_t i = 0; i < n; i++) {
        volatile float a = acc[i] / 3.0f, b = acc[i] * inv3;
        if (a != b) differ++;
    }
    check(differ > 0, "acc/3 and acc*(1/3) differ on %zu of %zu inputs (the test can tell)", differ, n);
}

static void test_accumulate() {
    for (size_t n : k_sizes)
        for (int nt = 1; nt <= max_test_threads(); nt++) {
            set_threads(nt);
            std::vector<float> acc(n), g(n), ref;
            for (size_t i = 0; i < n; i++) acc[i] = rnd_grad();
            ref = acc;
            for (int rep = 0; rep < 3; rep++) {  // a window's first step (A = 0 + g), then two more
                for (size_t i = 0; i < n; i++) g[i] = rnd_grad();
                if (n > 0) g[n / 2] = -0.0f;  // 0 + -0 is +0: the first step is not a copy
                for (size_t i = 0; i < n; i++) {
                    volatile float s = (rep == 0 ? 0.0f : ref[i]) + g[i];
                    ref[i] = s;
                }
                zf_cpu_accumulate(acc.data(), g.data(), n, rep == 0);
            }
            bool ok = same_bits(acc, ref);
            if (!ok || nt == 1) check(ok, "accumulate n=%zu threads=%d", n, nt);
            else g_passed++;
        }
    set_threads(max_test_threads());
}

// ---------------------------------------------------------------------------------------
// Updater

// A job that appends its id to a log (only the updater thread writes the log; the main
// thread reads it after wait/drain, which orders the accesses).
typedef struct {
    std::vector<int>* log;
    int id;
    int status;                     // what the job returns
    int sleep_us;                   // work time
    std::atomic<bool>* gate;        // if set, spin until it is true
} LogJob;

static int log_job(void* arg) {
    LogJob* j = (LogJob*)arg;
    if (j->gate) while (!j->gate->load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (j->sleep_us) std::this_thread::sleep_for(std::chrono::microseconds(j->sleep_us));
    j->log->push_back(j->id);
    return j->status;
}

// n jobs that log the ids 0 .. n-1, each working sleep_us first
static std::vector<LogJob> log_jobs(std::vector<int>* log, int n, int sleep_us) {
    std::vector<LogJob> jobs(n);
    for (int i = 0; i < n; i++) jobs[i] = LogJob{log, i, 0, sleep_us, NULL};
    return jobs;
}

static bool log_is_range(const std::vector<int>& log, int lo, int hi) {
    if ((int)log.size() != hi - lo) return false;
    for (int i = lo; i < hi; i++) if (log[i - lo] != i) return false;
    return true;
}

static void test_updater_order() {
    ZfWorker* u = zf_worker_create(0);
    const int n = 2000;
    std::vector<int> log;
    std::vector<LogJob> jobs = log_jobs(&log, n, 0);
    bool tickets_ok = true;
    for (int i = 0; i < n; i++) {
        if (zf_worker_submit(u, log_job, &jobs[i]) != i) tickets_ok = false;
    }
    int rc = zf_worker_drain(u);
    check(tickets_ok, "updater: tickets are 0, 1, 2, ...");
    check(rc == 0 && log_is_range(log, 0, n), "updater: %d jobs ran in submission order", n);
    check(zf_worker_destroy(u) == 0, "updater: destroy returns 0 without errors");
}

static void test_updater_wait() {
    ZfWorker* u = zf_worker_create(0);
    std::vector<int> log;
    check(zf_worker_wait(u, -1) == 0, "updater: wait(-1) returns at once");
    check(zf_worker_idle(u) == 1 && zf_worker_idle(NULL) == 1 && zf_worker_drain(NULL) == 0,
          "updater: idle with no job yet, and NULL: idle, nothing to drain");
    std::atomic<bool> gate(false);
    LogJob a{&log, 0, 0, 20000, NULL}, b{&log, 1, 0, 0, NULL}, c{&log, 2, 0, 0, &gate};
    zf_worker_submit(u, log_job, &a);
    long tb = zf_worker_submit(u, log_job, &b);
    zf_worker_submit(u, log_job, &c);
    int rc = zf_worker_wait(u, tb);
    // job c cannot finish before the gate opens, so exactly jobs 0 and 1 are done
    check(rc == 0 && log_is_range(log, 0, 2), "updater: wait(1) returns after jobs 0 and 1, before 2");
    check(zf_worker_idle(u) == 0, "updater: not idle while job 2 waits at its gate");
    gate = true;
    rc = zf_worker_drain(u);
    check(rc == 0 && log_is_range(log, 0, 3), "updater: drain waits for all jobs");
    check(zf_worker_idle(u) == 1, "updater: idle after the drain");
    check(zf_worker_drain(u) == 0, "updater: drain with nothing pending returns");
    zf_worker_destroy(u);
}

static void test_updater_errors() {
    ZfWorker* u = zf_worker_create(0);
    std::vector<int> log;
    std::atomic<bool> gate(false);
    LogJob j0{&log, 0, 0, 0, NULL}, j1{&log, 1, 0, 0, NULL}, j2{&log, 2, 7, 0, &gate},
           j3{&log, 3, 9, 0, NULL}, j4{&log, 4, 0, 0, NULL}, j5{&log, 5, 0, 0, NULL};
    zf_worker_submit(u, log_job, &j0);
    long t1 = zf_worker_submit(u, log_job, &j1);
    long t2 = zf_worker_submit(u, log_job, &j2);
    zf_worker_submit(u, log_job, &j3);
    long t4 = zf_worker_submit(u, log_job, &j4);
    check(zf_worker_wait(u, t1) == 0, "updater errors: jobs before the failing one report 0");
    gate = true;
    check(zf_worker_wait(u, t2) == 7, "updater errors: wait on the failing job returns its status");
    check(zf_worker_wait(u, t4) == 7, "updater errors: a wait on a later job returns the first error (job 3, which "
                                      "would fail with 9, is skipped)");
    check(log_is_range(log, 0, 3), "updater errors: jobs after the failure are skipped (log has %zu entries)", log.size());
    long t5 = zf_worker_submit(u, log_job, &j5);
    check(zf_worker_wait(u, t5) == 7 && log.size() == 3, "updater errors: a job submitted after the error is skipped, error reported");
    check(zf_worker_drain(u) == 7, "updater errors: drain returns the error");
    check(zf_worker_destroy(u) == 7, "updater errors: destroy returns the error");

    // Nobody waits: destroy still reports it.
    u = zf_worker_create(0);
    std::vector<int> log2;
    LogJob k0{&log2, 0, 3, 0, NULL};
    zf_worker_submit(u, log_job, &k0);
    check(zf_worker_destroy(u) == 3, "updater errors: an error nobody waited for is returned by destroy");
}

static void test_updater_destroy_pending() {
    ZfWorker* u = zf_worker_create(0);
    std::vector<int> log;
    std::vector<LogJob> jobs = log_jobs(&log, 50, 500);
    for (int i = 0; i < 50; i++) zf_worker_submit(u, log_job, &jobs[i]);
    int rc = zf_worker_destroy(u);  // returns only once all 50 have run
    check(rc == 0 && log_is_range(log, 0, 50), "updater: destroy with 50 pending jobs runs them all, in order");
    check(zf_worker_destroy(NULL) == 0, "updater: destroy(NULL) is a no-op");
}

// A miniature of the overlap-on pipeline (spec 4.6): each window the main thread accumulates
// gradients into A, freezes G-input into the window's own buffer, waits for the previous
// window's job, "applies" it (copies the master p), and hands the new window to the updater.
// Run with and without random delays; the applied parameters must match bit for bit, and
// match a plain synchronous loop with the same one-window staleness.
typedef struct {
    float *p, *m, *v;
    const float* acc;  // frozen window sum, owned by this job until waited for
    int count, s;
    size_t n;
} AdamJob;

static int adam_job(void* arg) {
    AdamJob* j = (AdamJob*)arg;
    ZfAdamHyper h = hyper(0.1f);
    zf_cpu_adam_step(j->p, j->m, j->v, j->acc, j->count, j->n, h, j->s);
    return 0;
}

// Returns the sequence of "GPU copies" seen at every step, concatenated.
static std::vector<float> run_pipeline(bool background, size_t n, int windows, int U) {
    std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), gpu(n), out;
    for (size_t i = 0; i < n; i++) p[i] = 0.01f * (float)((i * 37) % 101) - 0.5f;
    gpu = p;
    std::vector<std::vector<float>> acc(2, std::vector<float>(n, 0.0f));  // double buffer
    std::vector<AdamJob> jobs(windows);
    ZfWorker* u = background ? zf_worker_create(2) : NULL;
    long pending = -1;
    int t = 0;
    for (int w = 0; w < windows; w++) {
        std::vector<float>& A = acc[w % 2];
        std::fill(A.begin(), A.end(), 0.0f);
        for (int k = 0; k < U; k++, t++) {
            std::vector<float> g(n);  // a "gradient" that depends on the stale copy
            for (size_t i = 0; i < n; i++) g[i] = gpu[i] * 0.5f + 0.001f * (float)((i + t) % 13) - 0.006f;
            zf_cpu_accumulate(A.data(), g.data(), n, 0);
            out.insert(out.end(), gpu.begin(), gpu.end());
        }
        jobs[w] = AdamJob{p.data(), m.data(), v.data(), A.data(), U, t, n};
        if (background) {
            if (zf_worker_wait(u, pending) != 0) return {};
            if (pending >= 0) gpu = p;  // apply window w-1 (only finished jobs wrote p)
            pending = zf_worker_submit(u, adam_job, &jobs[w]);
        } else {
            if (w > 0) gpu = p;         // same staleness, done synchronously
            adam_job(&jobs[w]);
        }
    }
    if (background) {
        if (zf_worker_destroy(u) != 0) return {};
    }
    gpu = p;
    out.insert(out.end(), gpu.begin(), gpu.end());
    return out;
}

static void test_updater_determinism() {
    const size_t n = 100003;
    std::vector<float> sync = run_pipeline(false, n, 40, 4);
    std::vector<float> plain = run_pipeline(true, n, 40, 4);
    check(!plain.empty() && same_bits(sync, plain), "updater pipeline: background == synchronous, bitwise");
    setenv("ZF_WORKER_DELAY_US", "2000", 1);
    bool all = true;
    for (int rep = 0; rep < 3; rep++) {
        std::vector<float> delayed = run_pipeline(true, n, 40, 4);
        all = all && !delayed.empty() && same_bits(sync, delayed);
    }
    check(all, "updater pipeline: 3 runs with ZF_WORKER_DELAY_US=2000 == synchronous, bitwise");

    // Many small jobs with delays: order kept.
    setenv("ZF_WORKER_DELAY_US", "50", 1);
    ZfWorker* u = zf_worker_create(0);
    std::vector<int> log;
    std::vector<LogJob> jobs = log_jobs(&log, 1000, 0);
    for (int i = 0; i < 1000; i++) {
        zf_worker_submit(u, log_job, &jobs[i]);
        if (i % 97 == 0) zf_worker_wait(u, i / 2);
    }
    int rc = zf_worker_destroy(u);
    unsetenv("ZF_WORKER_DELAY_US");
    check(rc == 0 && log_is_range(log, 0, 1000), "updater: 1000 jobs with random delays ran in order");
}

// The main thread runs OpenMP AdamW while a job does the same on other arrays: both teams
// coexist and both results stay exact.
static void test_updater_concurrent_openmp() {
    const size_t n = 2000003;
    State a0 = random_state(n), b0 = random_state(n);
    State a = a0, b = b0, ra = a0, rb = b0;
    ZfAdamHyper h = hyper(0.1f);
    ref_adam(ra.p.data(), ra.m.data(), ra.v.data(), ra.g.data(), NULL, 0, n, h, 3);
    ref_adam(rb.p.data(), rb.m.data(), rb.v.data(), rb.g.data(), NULL, 0, n, h, 3);
    typedef struct { State* st; size_t n; ZfAdamHyper h; } Arg;
    Arg arg{&b, n, h};
    ZfWorker* u = zf_worker_create(2);
    long tk = zf_worker_submit(u, [](void* p) -> int {
        Arg* x = (Arg*)p;
        zf_cpu_adam_step(x->st->p.data(), x->st->m.data(), x->st->v.data(), x->st->g.data(), 1, x->n, x->h, 3);
        return 0;
    }, &arg);
    set_threads(2);
    zf_cpu_adam_step(a.p.data(), a.m.data(), a.v.data(), a.g.data(), 1, n, h, 3);
    int rc = zf_worker_wait(u, tk);
    zf_worker_destroy(u);
    set_threads(max_test_threads());
    check(rc == 0 && same_state(a, ra) && same_state(b, rb),
          "updater: OpenMP AdamW on main thread and in a job at the same time, both exact");
}

int main(int argc, char** argv) {
    const char* only = argc > 1 ? argv[1] : "";
    bool adam = !*only || !strcmp(only, "adam"), upd = !*only || !strcmp(only, "updater");
    if (!adam && !upd) {
        fprintf(stderr, "test_cpu_adam: unknown group '%s' (hint: adam, updater, or nothing for both)\n", only);
        return 2;
    }
#ifdef _OPENMP
    printf("OpenMP on, max threads %d\n", omp_get_max_threads());
#else
    printf("OpenMP off (single-threaded build)\n");
#endif
    if (adam) {
        test_adam_step();
        test_adam_mean();
        test_accumulate();
    }
    if (upd) {
        test_updater_order();
        test_updater_wait();
        test_updater_errors();
        test_updater_destroy_pending();
        test_updater_determinism();
        test_updater_concurrent_openmp();
    }
    printf("cpu_adam: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed || g_passed == 0 ? 1 : 0;
}
