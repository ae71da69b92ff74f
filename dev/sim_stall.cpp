/*
A simulated GPU next to ZenFlow's real CPU side: how short may a GPU step be before the
training loop has to wait for the CPU?

The GPU's part of each training step (forward, backward, the GPU-side AdamW) is simulated
by the main thread sleeping for a given time. Everything on the host is the real thing:
zenflow.h's step, with its two CPU threads (the accumulator's A += g and the updater's
window AdamW, cpu_adam.cpp), over the CPU-owned elements of a real GPT-2 size. The time the
main thread then spends blocked on the CPU side (zenflow.h's host_blocks, which the CUDA
backend brackets with timing events) is the stall a GPU with that step time would see
(spec 8). scripts/bench_cpu_adam.py predicts from one window's CPU work where the stall
starts (step < window / U); this program checks that prediction against the orchestration
itself, whose waits (a staging buffer still being read, the window update still running)
are what decides.

Not simulated: the copies. They land at once, so their traffic through host memory (with
-za cpu every step's CPU-owned gradients are written there) is missing, and so is any wait
for PCIe: this is the host's side of the stall alone. The staging buffers are written once
at start, so that the accumulations read real memory.

  ./sim_stall [model] [U] [GPU step ms ...]     (defaults: d12, 4, 10 20 30 45 60 90 120)
  (make sim_stall builds it; make bench runs it after bench_cpu_adam)
*/
#include <time.h>

#include <vector>

#include "../zenflow.h"

// the device: does nothing (its work is the main thread's sleep), but counts the stall
typedef struct {
    double blocked_ms;  // total time the main thread waited for the CPU side
    double since;       // when the current wait began
} SimDevice;

static void sim_column_scores(void*, const ZfMatrix* mat, float* scores) {
    for (int j = 0; j < mat->cols; j++) { scores[j] = (float)((j * 2654435761u) % 1000); }  // any fixed order
}
static void sim_selection_changed(void*, const ZenFlow*) {}
static void sim_zero_grads(void*, const ZenFlow*, int) {}
static void sim_gpu_adam(void*, const ZenFlow*, ZfAdamHyper, int) {}
static void sim_grads_to_host(void*, const ZenFlow*, float*, int) {}
static void sim_grads_from_host(void*, const ZenFlow*, const float*) {}
static void sim_params_to_host(void*, const ZenFlow*, float*) {}
static void sim_params_from_host(void*, const ZenFlow*, const float*, int) {}
static void sim_moments_to_host(void*, const ZenFlow*, float*, float*) {}
static void sim_moments_from_host(void*, const ZenFlow*, const float*, const float*) {}
static void sim_host_blocks(void* ctx, int begin) {
    SimDevice* dev = (SimDevice*)ctx;
    if (begin) {
        dev->since = now_ms();
    } else {
        dev->blocked_ms += now_ms() - dev->since;
    }
}

static void sleep_ms(double ms) {
    struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
    nanosleep(&ts, NULL);
}

typedef struct {
    double step_ms, stall_ms;  // means over the measured steps
} SimResult;

// runs one accumulation choice at every GPU step time: 2 windows of warm-up, then 4 measured, each
static std::vector<SimResult> simulate(const GPT2Config* model, int U, int accumulate, const std::vector<double>& gpu_ms,
                                       size_t* cpu_elems) {
    SimDevice dev = {0.0, 0.0};
    ZfBackend be;
    memset(&be, 0, sizeof(be));
    be.ctx = &dev;
    be.column_scores = sim_column_scores;
    be.selection_changed = sim_selection_changed;
    be.zero_grads = sim_zero_grads;
    be.gpu_adam = sim_gpu_adam;
    be.grads_to_host = sim_grads_to_host;
    be.grads_from_host = sim_grads_from_host;
    be.params_to_host = sim_params_to_host;
    be.params_from_host = sim_params_from_host;
    be.moments_to_host = sim_moments_to_host;
    be.moments_from_host = sim_moments_from_host;
    be.host_blocks = sim_host_blocks;
    ZfConfig cfg = ZF_DEFAULTS;  // zenflow, k = 0.1, overlap on
    cfg.update_interval = U;
    cfg.select_interval = 0;  // one selection, at the start
    cfg.accumulate = accumulate;
    ZenFlow zf;
    zf_init(&zf, cfg, model, be);
    for (int i = 0; i < 2; i++) {  // what the copies would have written (calloc'ed pages read as one zero page)
        if (zf.grad_stage[i] != NULL) {
            for (size_t j = 0; j < zf.cpu_capacity; j++) { zf.grad_stage[i][j] = 1e-3f; }
        }
    }
    ZfAdamHyper hyper = {3e-4f, 0.9f, 0.95f, 1e-8f, 0.0f};
    std::vector<SimResult> out;
    int t = 0;
    for (double ms : gpu_ms) {
        double t0 = 0.0, blocked0 = 0.0;
        for (int i = 0; i < 6 * U; i++, t++) {
            if (i == 2 * U) {
                t0 = now_ms();
                blocked0 = dev.blocked_ms;
            }
            zf_before_backward(&zf, t);
            sleep_ms(ms);  // the GPU's forward and backward
            zf_step(&zf, t, hyper);
        }
        SimResult r = {(now_ms() - t0) / (4 * U), (dev.blocked_ms - blocked0) / (4 * U)};
        out.push_back(r);
    }
    *cpu_elems = zf.cpu_elems;
    zf_drain(&zf);
    zf_free(&zf);
    return out;
}

int main(int argc, char** argv) {
    const char* spec = argc > 1 ? argv[1] : "d12";
    int U = argc > 2 ? atoi(argv[2]) : 4;
    std::vector<double> gpu_ms;
    for (int i = 3; i < argc; i++) { gpu_ms.push_back(atof(argv[i])); }
    if (gpu_ms.empty()) { gpu_ms = {10, 20, 30, 45, 60, 90, 120}; }
    GPT2Config model;
    if (!gpt2_parse_model_spec(spec, &model)) { fatal("sim_stall: '%s' is not a model spec such as d12", spec); }
    if (U < 1) { fatal("sim_stall: U must be >= 1"); }
    for (double ms : gpu_ms) {
        if (!(ms > 0.0 && ms < 1e5)) { fatal("sim_stall: a GPU step of %g ms makes no sense", ms); }
    }
    size_t cpu_elems = 0;
    std::vector<SimResult> cpu = simulate(&model, U, ZF_ACCUMULATE_CPU, gpu_ms, &cpu_elems);
    std::vector<SimResult> gpu = simulate(&model, U, ZF_ACCUMULATE_GPU, gpu_ms, &cpu_elems);
    printf("A simulated GPU (the main thread sleeps for its step) beside ZenFlow's real CPU side, %s:\n"
           "k = 0.1, U = %d, %.1f M CPU-owned elements, overlap on; per GPU step time, the mean step and the\n"
           "training loop's wait for the CPU (the stall) over 4 windows after 2:\n",
           spec, U, cpu_elems / 1e6);
    printf("| GPU step | -za cpu: step | stall | stall %% | -za gpu: step | stall | stall %% |\n");
    printf("|---------:|--------------:|------:|--------:|--------------:|------:|--------:|\n");
    for (size_t i = 0; i < gpu_ms.size(); i++) {
        printf("| %5.0f ms | %10.1f ms | %5.1f | %6.1f%% | %10.1f ms | %5.1f | %6.1f%% |\n", gpu_ms[i], cpu[i].step_ms,
               cpu[i].stall_ms, 100.0 * cpu[i].stall_ms / cpu[i].step_ms, gpu[i].step_ms, gpu[i].stall_ms,
               100.0 * gpu[i].stall_ms / gpu[i].step_ms);
    }
    return 0;
}
