/*
A timeline of training as a Chrome trace-event file (open it in https://ui.perfetto.dev or
chrome://tracing): one track per kind of work, so you can SEE whether the CPU's update hides
behind the GPU's compute or the GPU waits for it.

  tracks:  compute (forward, backward, GPU-side AdamW, the column moves) | device->host |
           host->device | CPU updater (window updates) | waits (the training loop blocked on
           the CPU; on a GPU also the GPU waiting for a copy) | CPU accumulator (A += g every
           step, CPU accumulation; auto U's sums)

Usage: trace_open(path, first_step, last_step) once; trace_set_step(t) at the top of every
step; then trace_event(track, name, t0_ms, t1_ms) with times from now_ms(). Events
outside the chosen steps are dropped. Safe to call from the CPU side's threads. The CUDA
trainer times its GPU work with CUDA events instead (llmc/cuda_trace.cuh).
*/
#ifndef LLMC_TRACE_H
#define LLMC_TRACE_H

#include <atomic>
#include <mutex>

#include "utils.h"

typedef enum {
    TRACE_COMPUTE = 1,
    TRACE_D2H = 2,
    TRACE_H2D = 3,
    TRACE_CPU_UPDATE = 4,
    TRACE_WAIT = 5,
    TRACE_CPU_ACCUMULATE = 6
} TraceTrack;

typedef struct {
    FILE* fp;
    std::mutex mu;
    double origin_ms;
    int first_step, last_step;
    std::atomic<int> step;  // set by the training loop, read by the CPU side's threads too
    int num_events;
} Trace;

static Trace g_trace;  // zero-initialised: tracing off

static inline void trace_open(const char* path, int first_step, int last_step) {
    static const char* const names[] = {"", "compute", "device->host", "host->device",
                                        "CPU updater", "waits", "CPU accumulator"};
    g_trace.fp = fopenCheck(path, "w");
    g_trace.origin_ms = now_ms();
    g_trace.first_step = first_step;
    g_trace.last_step = last_step;
    fprintf(g_trace.fp, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    for (int tid = 1; tid <= 6; tid++) {
        fprintf(g_trace.fp,
                "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, "
                "\"args\": {\"name\": \"%s\"}}",
                tid == 1 ? "" : ",\n", tid, names[tid]);
    }
}

static inline void trace_set_step(int step) { g_trace.step.store(step); }

static inline int trace_active(void) {
    if (g_trace.fp == NULL) { return 0; }
    int step = g_trace.step.load();
    return step >= g_trace.first_step && step <= g_trace.last_step;
}

// an event of a given step: the CUDA trainer writes its GPU work once the events that timed
// it have completed, which can be a step later (llmc/cuda_trace.cuh)
static inline void trace_event_at(TraceTrack track, const char* name, double t0_ms, double t1_ms, int step) {
    std::lock_guard<std::mutex> lock(g_trace.mu);  // (fp too: trace_close may run meanwhile)
    if (g_trace.fp == NULL || step < g_trace.first_step || step > g_trace.last_step) { return; }
    fprintf(g_trace.fp,
            ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"ts\": %.1f, "
            "\"dur\": %.1f, \"args\": {\"step\": %d}}",
            name, (int)track, (t0_ms - g_trace.origin_ms) * 1e3, (t1_ms - t0_ms) * 1e3, step);
    g_trace.num_events++;
}

static inline void trace_event(TraceTrack track, const char* name, double t0_ms, double t1_ms) {
    trace_event_at(track, name, t0_ms, t1_ms, g_trace.step.load());
}

static inline void trace_close(void) {
    std::lock_guard<std::mutex> lock(g_trace.mu);
    if (g_trace.fp == NULL) { return; }
    fprintf(g_trace.fp, "\n]}\n");
    FILE* fp = g_trace.fp;
    g_trace.fp = NULL;
    fcloseCheck(fp, "the trace file (-tr)");
}

#endif  // LLMC_TRACE_H
