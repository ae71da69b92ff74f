// Which functions one training step runs, measured: linked into a trainer built with
// -finstrument-functions (dev/step_functions.sh does both), these hooks note every function
// entered from the STEP_FUNCS_STEP-th call of the function at address STEP_FUNCS_MARK
// (zf_before_backward: the start of a step's backward) up to the next one (on the worker
// threads up to the end of the run), each function once, in the order of its first entry. At
// exit the addresses go to STEP_FUNCS_OUT, one line each: "<address> <thread>" (thread 0: the
// main thread; then in order of appearance).
// Plain arrays and a pthread mutex: the hooks run before any constructor does (static
// initialization calls instrumented functions too).
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define NO_HOOK __attribute__((no_instrument_function))
#define MAX_SEEN 4096
#define MAX_THREADS 64

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static void* g_mark;
static long g_step, g_marks;
static void* g_seen[MAX_SEEN];    // in order of first entry
static int g_thread[MAX_SEEN];    // ... and the thread that entered it first
static int g_num_seen;
static pthread_t g_threads[MAX_THREADS];
static int g_num_threads;

NO_HOOK static int thread_index() {
    pthread_t me = pthread_self();
    for (int i = 0; i < g_num_threads; i++) {
        if (pthread_equal(g_threads[i], me)) { return i; }
    }
    if (g_num_threads == MAX_THREADS) { return -1; }
    g_threads[g_num_threads] = me;
    return g_num_threads++;
}

NO_HOOK static void dump() {
    const char* path = getenv("STEP_FUNCS_OUT");
    FILE* f = path != NULL ? fopen(path, "w") : NULL;
    if (f == NULL) { return; }
    for (int i = 0; i < g_num_seen; i++) { fprintf(f, "%p %d\n", g_seen[i], g_thread[i]); }
    fclose(f);
}

NO_HOOK static void note(void* fn) {
    if (g_mark == NULL) {  // the first call, on the main thread
        const char* mark = getenv("STEP_FUNCS_MARK");
        const char* step = getenv("STEP_FUNCS_STEP");
        if (mark == NULL || step == NULL) { return; }
        g_mark = (void*)strtoull(mark, NULL, 16);
        g_step = atol(step);
        thread_index();  // the main thread is 0
        atexit(dump);
    }
    if (fn == g_mark) { g_marks++; }
    // the main thread: this step; the worker threads: to the end of the run, since a window
    // update handed over in this step runs in the background for as long as the host takes
    // (a cut after a fixed number of steps lost its AdamW on a busy host). Later steps hand
    // them the same two jobs, so nothing enters the list that this step's jobs do not run.
    const int thread = thread_index();
    if (g_marks < g_step || (thread == 0 && g_marks > g_step) || g_num_seen == MAX_SEEN) { return; }
    for (int i = 0; i < g_num_seen; i++) {
        if (g_seen[i] == fn) { return; }
    }
    g_seen[g_num_seen] = fn;
    g_thread[g_num_seen++] = thread;
}

extern "C" NO_HOOK void __cyg_profile_func_enter(void* fn, void*) {
    pthread_mutex_lock(&g_mu);
    note(fn);
    pthread_mutex_unlock(&g_mu);
}

extern "C" NO_HOOK void __cyg_profile_func_exit(void*, void*) {}
