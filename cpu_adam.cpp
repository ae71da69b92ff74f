// cpu_adam.cpp: CPU AdamW (spec 3.1) and the worker thread (ZfWorker). See cpu_adam.h.
//
// Bitwise reproducibility, in short:
//  - every element goes through the same sequence of fp32 operations as the scalar loop of
//    spec 3.1: mul, add, div and sqrt are correctly rounded IEEE operations (default
//    rounding, no flush-to-zero) whether done one at a time or 8 at a time (AVX), so the
//    vector body and the scalar tail agree bit for bit;
//  - no fused multiply-add anywhere: GCC would otherwise contract even _mm256_mul_ps +
//    _mm256_add_ps into one vfmadd (one rounding instead of two). -ffp-contract=off stops
//    that; the test compares against a reference that cannot be contracted, so a build
//    without the flag fails it;
//  - elements are independent, so how they are split over threads cannot change a result.
//    Threads still get pieces of whole 64-byte cache lines (ZF_PIECE floats) so that two
//    threads never write the same line (when the arrays are 64-byte aligned).
#include "cpu_adam.h"

#include "llmc/adamw.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <thread>

#ifdef __AVX__
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

// ---------------------------------------------------------------------------------------
// AdamW

#ifdef __AVX__
typedef struct {
    __m256 b1, b2, omb1, omb2, bc1, bc2, eps, lr, wd;
} ZfAdamVec;

// llmc/adamw.h's adamw_one on 8 lanes: the same operations in the same order, on registers.
static inline void zf_adam8(const ZfAdamVec* c, __m256 g, __m256* p, __m256* m, __m256* v) {
    __m256 mi = _mm256_add_ps(_mm256_mul_ps(c->b1, *m), _mm256_mul_ps(c->omb1, g));
    __m256 vi = _mm256_add_ps(_mm256_mul_ps(c->b2, *v), _mm256_mul_ps(_mm256_mul_ps(c->omb2, g), g));
    __m256 mhat = _mm256_div_ps(mi, c->bc1);
    __m256 vhat = _mm256_div_ps(vi, c->bc2);
    __m256 q = _mm256_div_ps(mhat, _mm256_add_ps(_mm256_sqrt_ps(vhat), c->eps));
    __m256 upd = _mm256_add_ps(q, _mm256_mul_ps(c->wd, *p));
    *p = _mm256_sub_ps(*p, _mm256_mul_ps(c->lr, upd));
    *m = mi;
    *v = vi;
}

#endif

// Threads take contiguous runs of pieces of ZF_PIECE floats (16 KiB: two threads share at most
// the cache line where their runs meet); below ZF_MIN_PARALLEL elements one thread does it all,
// because starting a team costs more than the work. Neither changes a result.
#define ZF_PIECE 4096
#define ZF_MIN_PARALLEL (1 << 16)

// One AdamW step over n elements with the gradient g[i] / steps: steps 1 for one step's
// gradient, else the number of steps g sums (4.6, the mean). A true division: x / 1 is x.
void zf_cpu_adam_step(float* p, float* m, float* v, const float* g, int steps, size_t n,
                      ZfAdamHyper h, int s) {
    const AdamWConsts c = adamw_consts(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, s);
    const float n_steps = (float)steps;
#ifdef __AVX__
    const ZfAdamVec cv = {_mm256_set1_ps(c.b1), _mm256_set1_ps(c.b2), _mm256_set1_ps(c.omb1),
                          _mm256_set1_ps(c.omb2), _mm256_set1_ps(c.bc1), _mm256_set1_ps(c.bc2),
                          _mm256_set1_ps(c.eps), _mm256_set1_ps(c.lr), _mm256_set1_ps(c.wd)};
    const __m256 cnt = _mm256_set1_ps(n_steps);
#endif
    const long pieces = (long)((n + ZF_PIECE - 1) / ZF_PIECE);
#pragma omp parallel for schedule(static) if (n >= ZF_MIN_PARALLEL)
    for (long k = 0; k < pieces; k++) {
        size_t i = (size_t)k * ZF_PIECE;
        const size_t hi = std::min(n, i + ZF_PIECE);
#ifdef __AVX__
        // 16 floats (64 bytes) of each array per iteration, all loads before any store: on AMD
        // Zen, where lines of p, m, v, g can evict each other (arrays a large power of two
        // apart), touching each line twice instead of four times measured 1.6x faster
        for (; i + 16 <= hi; i += 16) {
            __m256 g0 = _mm256_div_ps(_mm256_loadu_ps(g + i), cnt);
            __m256 g1 = _mm256_div_ps(_mm256_loadu_ps(g + i + 8), cnt);
            __m256 m0 = _mm256_loadu_ps(m + i), m1 = _mm256_loadu_ps(m + i + 8);
            __m256 v0 = _mm256_loadu_ps(v + i), v1 = _mm256_loadu_ps(v + i + 8);
            __m256 p0 = _mm256_loadu_ps(p + i), p1 = _mm256_loadu_ps(p + i + 8);
            zf_adam8(&cv, g0, &p0, &m0, &v0);
            zf_adam8(&cv, g1, &p1, &m1, &v1);
            _mm256_storeu_ps(p + i, p0);
            _mm256_storeu_ps(p + i + 8, p1);
            _mm256_storeu_ps(m + i, m0);
            _mm256_storeu_ps(m + i + 8, m1);
            _mm256_storeu_ps(v + i, v0);
            _mm256_storeu_ps(v + i + 8, v1);
        }
#endif
        for (; i < hi; i++) {  // the scalar formula: the tail, and builds without AVX
            adamw_one(p + i, m + i, v + i, g[i] / n_steps, c);
        }
    }
}

// One addition per element; the compiler vectorises these plain loops by itself. The first
// step of a window is A = 0 + g: bitwise "A = 0, then A += g" (0 + -0 is +0, which a copy
// would not give), in one pass instead of two.
void zf_cpu_accumulate(float* acc, const float* g, size_t n, int first) {
    const long pieces = (long)((n + ZF_PIECE - 1) / ZF_PIECE);
#pragma omp parallel for schedule(static) if (n >= ZF_MIN_PARALLEL)
    for (long k = 0; k < pieces; k++) {
        const size_t lo = (size_t)k * ZF_PIECE, hi = std::min(n, lo + ZF_PIECE);
        if (first) {
            for (size_t i = lo; i < hi; i++) acc[i] = 0.0f + g[i];
        } else {
            for (size_t i = lo; i < hi; i++) acc[i] += g[i];
        }
    }
}

// ---------------------------------------------------------------------------------------
// The worker: one thread that runs jobs in submission order

typedef struct {
    ZfJobFn fn;
    void* arg;
} ZfJob;

struct ZfWorker {
    std::mutex mu;                  // guards everything below except the thread's own
    std::condition_variable work;   // signalled: a job was queued, or stop was set
    std::condition_variable done;   // signalled: a job finished
    std::deque<ZfJob> queue;        // submitted, not yet started
    long submitted = 0;             // tickets handed out so far
    long finished = 0;              // jobs finished or skipped: ticket t is done iff t < finished
    int error = 0;                  // first non-zero job status, sticky
    bool stop = false;              // set by destroy once the queue should end
    // set before the thread starts, then the worker's alone (thread: create's and destroy's):
    int omp_threads = 0;
    long delay_max_us = 0;
    uint64_t rng = 0;
    std::thread thread;
};

// Debug delay: a random 0..max microseconds (splitmix64; only the worker thread uses it).
static void zf_worker_random_sleep(ZfWorker* u) {
    uint64_t z = (u->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::this_thread::sleep_for(std::chrono::microseconds(z % (uint64_t)(u->delay_max_us + 1)));
}

static void zf_worker_main(ZfWorker* u) {
#ifdef _OPENMP
    // The thread count is per thread in OpenMP: this sets it for the team this thread
    // starts, and leaves the main thread's setting alone.
    if (u->omp_threads > 0) omp_set_num_threads(u->omp_threads);
#endif
    for (;;) {
        ZfJob job;
        bool skip;
        {
            std::unique_lock<std::mutex> lk(u->mu);
            u->work.wait(lk, [u] { return u->stop || !u->queue.empty(); });
            if (u->queue.empty()) return;  // stop was set and everything has run
            job = u->queue.front();
            u->queue.pop_front();
            skip = u->error != 0;  // after an error the state is suspect: don't run more
        }
        if (u->delay_max_us > 0) zf_worker_random_sleep(u);  // the tests' debug delays
        int status = skip ? 0 : job.fn(job.arg);
        if (u->delay_max_us > 0) zf_worker_random_sleep(u);
        {
            std::lock_guard<std::mutex> lk(u->mu);
            // the first error sticks: later jobs are skipped, and the main thread reports it
            // (one line, with the step) at its next check: every step and after every wait
            if (status != 0 && u->error == 0) { u->error = status; }
            u->finished++;
        }
        u->done.notify_all();
    }
}

ZfWorker* zf_worker_create(int omp_threads) {
    ZfWorker* u = new ZfWorker;
    u->omp_threads = omp_threads;
    const char* env = getenv("ZF_WORKER_DELAY_US");
    if (env && *env) {
        char* end = NULL;
        u->delay_max_us = strtol(env, &end, 10);
        if (*end != '\0' || u->delay_max_us < 0 || u->delay_max_us > 10000000) {
            fprintf(stderr, "error: ZF_WORKER_DELAY_US=%s is not a number of microseconds from 0 to 10000000 "
                            "(hint: it is the tests' debug delay; unset it to train)\n", env);
            exit(1);
        }
        u->rng = (uint64_t)std::chrono::steady_clock::now().time_since_epoch().count();
        fprintf(stderr, "zf_worker: debug delays of 0..%ld us around every job\n", u->delay_max_us);
    }
    try {
        u->thread = std::thread(zf_worker_main, u);
    } catch (...) {
        delete u;
        return NULL;
    }
    return u;
}

int zf_cpu_cores(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

long zf_worker_submit(ZfWorker* u, ZfJobFn fn, void* arg) {
    long ticket;
    {
        std::lock_guard<std::mutex> lk(u->mu);
        u->queue.push_back(ZfJob{fn, arg});
        ticket = u->submitted++;
    }
    u->work.notify_one();
    return ticket;
}

int zf_worker_wait(ZfWorker* u, long ticket) {
    std::unique_lock<std::mutex> lk(u->mu);
    if (ticket >= u->submitted) {
        // It would never finish: a bug in the caller, so stop loudly instead of hanging.
        fprintf(stderr, "zf_worker_wait: ticket %ld was never submitted (%ld so far)\n",
                ticket, u->submitted);
        abort();
    }
    u->done.wait(lk, [u, ticket] { return ticket < u->finished; });
    return u->error;
}

int zf_worker_error(ZfWorker* u) {
    if (!u) return 0;
    std::lock_guard<std::mutex> lk(u->mu);
    return u->error;
}

int zf_worker_finished(ZfWorker* u, long ticket) {
    if (ticket < 0) { return 1; }
    std::lock_guard<std::mutex> lk(u->mu);
    return ticket < u->finished;
}

int zf_worker_idle(ZfWorker* u) {
    if (!u) { return 1; }
    std::lock_guard<std::mutex> lk(u->mu);
    return u->finished == u->submitted;
}

int zf_worker_drain(ZfWorker* u) {
    if (!u) { return 0; }
    std::unique_lock<std::mutex> lk(u->mu);
    u->done.wait(lk, [u] { return u->finished == u->submitted; });
    return u->error;
}

int zf_worker_destroy(ZfWorker* u) {
    if (!u) return 0;
    {
        std::lock_guard<std::mutex> lk(u->mu);
        u->stop = true;
    }
    u->work.notify_one();
    u->thread.join();  // the thread runs the rest of the queue before it sees stop
    int err = u->error;
    delete u;
    return err;
}
