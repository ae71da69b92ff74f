/*
The GPU's work on the timeline of llmc/trace.h (-tr), for the CUDA trainer.

The host clock cannot time GPU work: a launch or an asynchronous copy returns at once. So
each span of GPU work is a pair of CUDA events recorded on the stream that does the work.
Their times are read once the end event has completed, relative to an anchor event that was
recorded and waited for at the start, whose host time is therefore known: that puts GPU
spans on the same clock as the CPU updater's jobs and the host's waits (now_ms). A copy
of one step can still be in flight when the step ends, so spans are written when they have
completed (gpu_trace_step_done, without waiting), and all of them at gpu_trace_close.
Reading a picture: CUDA says the time between events recorded on streams other than the
default one "may be greater than expected" (an event is timed when the stream reaches it,
which a busy GPU can delay), so a copy's box can be longer than the copy itself; the bytes
per step (the step line's pcie) are exact.

  gpu_trace_open();  int s = gpu_trace_begin(stream);  <queue work on stream>
  gpu_trace_end(s, stream, TRACE_D2H, "gradients");  ...  gpu_trace_close();
*/
#ifndef LLMC_CUDA_TRACE_CUH
#define LLMC_CUDA_TRACE_CUH

#include <cuda_runtime.h>

#include <mutex>

#include "cuda_kernels.cuh"
#include "trace.h"

#define GPU_TRACE_SPANS 1024  // spans not yet written; when full, every ended one is waited for and written

typedef struct {
    cudaEvent_t begin, end;
    TraceTrack track;
    const char* name;
    int step;
    int state;  // 0 free, 1 begun, 2 ended (to be written once `end` has completed)
} GpuTraceSpan;

typedef struct {
    std::mutex mu;  // the updater thread starts copies too (params_prefetch)
    GpuTraceSpan spans[GPU_TRACE_SPANS];
    cudaEvent_t anchor;
    double anchor_ms;  // the host time at which `anchor` completed
    int on;
} GpuTrace;

static GpuTrace g_gpu_trace;

// after trace_open: nothing to do unless -tr asked for a trace
static inline void gpu_trace_open(void) {
    if (g_trace.fp == NULL) { return; }
    for (int i = 0; i < GPU_TRACE_SPANS; i++) {
        cudaCheck(cudaEventCreateWithFlags(&g_gpu_trace.spans[i].begin, cudaEventBlockingSync));
        cudaCheck(cudaEventCreateWithFlags(&g_gpu_trace.spans[i].end, cudaEventBlockingSync));
        g_gpu_trace.spans[i].state = 0;
    }
    cudaCheck(cudaEventCreateWithFlags(&g_gpu_trace.anchor, cudaEventBlockingSync));
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaEventRecord(g_gpu_trace.anchor, 0));
    cudaCheck(cudaEventSynchronize(g_gpu_trace.anchor));
    g_gpu_trace.anchor_ms = now_ms();
    g_gpu_trace.on = 1;
}

// writes the ended spans that have completed (every ended span, waiting for it, if `wait`)
static inline void gpu_trace_flush_locked(int wait) {
    for (int i = 0; i < GPU_TRACE_SPANS; i++) {
        GpuTraceSpan* s = &g_gpu_trace.spans[i];
        if (s->state != 2) { continue; }
        if (wait) {
            cudaCheck(cudaEventSynchronize(s->end));
        } else {
            cudaError_t status = cudaEventQuery(s->end);
            if (status == cudaErrorNotReady) {  // not an error, just still running; but the
                cudaGetLastError();             // runtime may keep it as the last error, and the
                continue;                       // next launch's check would then fail on it
            }
            cudaCheck(status);
        }
        float t0 = 0.0f, t1 = 0.0f;
        cudaCheck(cudaEventElapsedTime(&t0, g_gpu_trace.anchor, s->begin));
        cudaCheck(cudaEventElapsedTime(&t1, g_gpu_trace.anchor, s->end));
        trace_event_at(s->track, s->name, g_gpu_trace.anchor_ms + t0, g_gpu_trace.anchor_ms + t1, s->step);
        s->state = 0;
    }
}

// starts a span on `stream`; -1 when the step is not traced or no slot is free
static inline int gpu_trace_begin(cudaStream_t stream) {
    if (!g_gpu_trace.on || !trace_active()) { return -1; }
    std::lock_guard<std::mutex> lock(g_gpu_trace.mu);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < GPU_TRACE_SPANS; i++) {
            GpuTraceSpan* s = &g_gpu_trace.spans[i];
            if (s->state != 0) { continue; }
            cudaCheck(cudaEventRecord(s->begin, stream));
            s->state = 1;
            s->step = g_trace.step.load();
            return i;
        }
        gpu_trace_flush_locked(1);  // every slot is taken: wait for the ended ones
    }
    return -1;  // every span is begun and none ended: drop this one
}

// ends span `id` (from gpu_trace_begin) on the same stream
static inline void gpu_trace_end(int id, cudaStream_t stream, TraceTrack track, const char* name) {
    if (id < 0) { return; }
    std::lock_guard<std::mutex> lock(g_gpu_trace.mu);
    GpuTraceSpan* s = &g_gpu_trace.spans[id];
    cudaCheck(cudaEventRecord(s->end, stream));
    s->track = track;
    s->name = name;
    s->state = 2;
}

// at the end of a step: writes what has completed, without waiting
static inline void gpu_trace_step_done(void) {
    if (!g_gpu_trace.on) { return; }
    std::lock_guard<std::mutex> lock(g_gpu_trace.mu);
    gpu_trace_flush_locked(0);
}

// writes every span, frees the events, and closes the trace file
static inline void gpu_trace_close(void) {
    if (g_gpu_trace.on) {
        std::lock_guard<std::mutex> lock(g_gpu_trace.mu);
        gpu_trace_flush_locked(1);
        for (int i = 0; i < GPU_TRACE_SPANS; i++) {
            cudaCheck(cudaEventDestroy(g_gpu_trace.spans[i].begin));
            cudaCheck(cudaEventDestroy(g_gpu_trace.spans[i].end));
        }
        cudaCheck(cudaEventDestroy(g_gpu_trace.anchor));
        g_gpu_trace.on = 0;
    }
    trace_close();
}

#endif  // LLMC_CUDA_TRACE_CUH
