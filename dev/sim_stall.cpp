/*
ZenFlow against ZeRO-Offload on a SIMULATED GPU and PCIe link, with the REAL CPU side: the
project's prediction of what the CUDA trainer will measure on a GPU machine.

Simulated: the GPU and the link. The main thread stands for the GPU: it sleeps for each part
of a step (forward and backward layer by layer, the GPU-side AdamW, gathers and scatters),
from a stated model:
    compute      = 6 x parameters x tokens / (MFU x peak), 1/3 forward, 2/3 backward, split
                   over the layers and the classifier by their parameters
    GPU AdamW    = 28 bytes (p, g, m, v read; p, m, v written) per GPU-owned element / HBM
    gather, scatter, zeroing = their bytes / HBM
Each direction of PCIe is a link of its own: a copy starts when its link is free and takes
bytes / bandwidth; whoever needs it (the GPU, or a CPU job through host_wait) sleeps until
it has landed. The bytes are spec 7's, moved in the trainers' per-layer groups.
Real: everything on the host. zenflow.h's step, its two worker threads, cpu_adam.cpp's AdamW
and accumulation over the CPU-owned elements of the model, and every wait of the loop.

The main thread is also the thread that launches the GPU's work: during each compute part
it does real busy CPU work (-l ms a step when the host is idle, measured at start) before it
sleeps. The "launch +%" column is how much longer that work took beside the CPU side: the
launch thread's slowdown (the GPU runs dry when it lags).

Stall (spec 8) = the simulated GPU waiting for a copy, plus the main thread blocked on the
CPU side. Left out: the copy engines' traffic through host memory (it competes with the
CPU's AdamW for the memory bus) and contention between the two links. Models whose CPU side does not
fit in this host's memory run as a model of the same depth and half (or a quarter) the width,
their times multiplied by the ratio of the parameter counts: those rows say "scaled".

  ./sim_stall [-m d12,d24,d36,d48] [-b 4] [-t 1024] [-u 4] [-k 0.1] [-p 50] [-f 495] [-e 0.35]
              [-w 4800] [-l 5] [-o step_time.csv]
  (make bench runs it; scripts/plot_step_time.py draws its CSV)
*/
#include <time.h>

#include <mutex>
#include <string>
#include <vector>

#include "../zenflow.h"

// The simulated machine; the defaults are an H200 SXM host
typedef struct {
    double peak_tflops;  // -f dense TF32 tensor-core peak: 495 (NVIDIA's H200 datasheet: 989 with sparsity)
    double mfu;          // -e the share of that peak the matmuls reach: 0.35, the project's target
    double hbm_gbs;      // -w HBM bandwidth: 4800 GB/s (the datasheet's HBM3e figure)
    double pcie_gbs;     // -p per direction: 50 GB/s. PCIe 5.0 x16 is 63 GB/s raw (32 GT/s x 16
                         //    lanes, 128b/130b); pinned cudaMemcpy reaches about 80% of that
    double launch_ms;    // -l the launch thread's CPU work a step, on an idle host: 5 ms (the
                         //    several hundred launches of a d12 step, ~220 of them matmuls)
    int B, T;
} SimMachine;

typedef struct {
    SimMachine hw;
    const ZenFlow* zf;
    std::mutex mu;          // the copies' state: the updater thread starts the prefetch
    double link_free[2];    // when the device->host (0) and host->device (1) links are free
    double d2h_done[2], h2d_done[2];  // staging buffer i's last copy out and in
    int params_stage;       // 1 with overlap (a result waits in one while gradients leave)
    int prefetched;
    const float* fence_host[8];  // zenflow.h's host buffers and when their last copy lands
    double fence_done[8];
    int num_fences;
    long long uploaded;     // host->device bytes not yet counted in a step (the prefetch)
    std::vector<double> group_done;  // a synchronous apply: when each layer's copy lands
    double gpu_free;        // when the simulated GPU is done with the work it has been given
    double launch_per_ms;   // busy-loop iterations of launch work per ms of compute
    // this step's numbers (main thread)
    double compute_ms, stall_ms, d2h_bytes, h2d_bytes, blocked_since, launch_ms;
    int blocking;
} SimDevice;

static void sleep_until(double t_ms) {
    double ms = t_ms - now_ms();
    if (ms <= 0.0) { return; }
    struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
    nanosleep(&ts, NULL);
}

// The launch thread's work: a fixed number of dependent multiply-adds (it starts from and
// ends in a volatile, so the compiler can neither fold nor drop the loop)
static volatile double launch_sink = 1.0;
static void launch_work(double iters) {
    double x = launch_sink;
    for (long i = 0; i < (long)iters; i++) { x = x * 0.999999 + 1e-6; }
    launch_sink = x;
}

// iterations per ms on the host as it is now: the best of five 20 ms runs
static double launch_iters_per_ms(void) {
    double best = 0.0, iters = 1e6;
    for (int i = 0; i < 5; i++) {
        double t0 = now_ms();
        launch_work(iters);
        double ms = now_ms() - t0;
        best = std::max(best, iters / ms);
        iters = 20.0 * best;
    }
    return best;
}

// The GPU computes for ms, after what it has been given (on its own clock: the sleeps'
// overshoots do not add up), while the host launches what comes next (launches = 0: work
// with no launches of its own to speak of, such as a copy's gather)
static void gpu_work_launched(SimDevice* dev, double ms, int launches) {
    dev->gpu_free = std::max(dev->gpu_free, now_ms()) + ms;
    if (launches) {
        double t0 = now_ms();
        launch_work(dev->launch_per_ms * ms);
        dev->launch_ms += now_ms() - t0;
    }
    sleep_until(dev->gpu_free);
    dev->compute_ms += ms;
}

static void gpu_work(SimDevice* dev, double ms) { gpu_work_launched(dev, ms, 0); }

static double hbm_ms(const SimDevice* dev, double bytes) { return bytes / (dev->hw.hbm_gbs * 1e6); }

// the GPU waits until a copy has landed: a stall, unless the host is blocked anyway
static void gpu_waits(SimDevice* dev, double done) {
    double t0 = now_ms();
    sleep_until(done);
    if (!dev->blocking) { dev->stall_ms += now_ms() - t0; }
}

static double* fence(SimDevice* dev, const float* host) {
    for (int i = 0; i < dev->num_fences; i++) {
        if (dev->fence_host[i] == host) { return &dev->fence_done[i]; }
    }
    if (dev->num_fences == 8) { fatal("sim_stall: too many host buffers"); }
    dev->fence_host[dev->num_fences] = host;
    dev->fence_done[dev->num_fences] = 0.0;
    return &dev->fence_done[dev->num_fences++];
}

// a copy on one link, after `after`; returns when it lands
static double copy(SimDevice* dev, int dir, double bytes, double after, const float* host) {
    std::lock_guard<std::mutex> lock(dev->mu);
    double start = std::max(std::max(now_ms(), after), dev->link_free[dir]);
    double done = start + bytes / (dev->hw.pcie_gbs * 1e6);
    dev->link_free[dir] = done;
    *fence(dev, host) = done;
    return done;
}

// the CPU-owned bytes of transfer group g (-1: all)
static double group_bytes(const ZenFlow* zf, int group) {
    int count;
    const int* mats = zf_group(zf, group, &count);
    double n = 0.0;
    for (int k = 0; k < count; k++) {
        const ZfMatrix* mat = &zf->own.matrices[mats[k]];
        n += (double)(mat->cols - mat->n_sel) * mat->rows;
    }
    return 4.0 * n;
}

// ----------------------------------------------------------------------------
// the backend (zenflow.h's ZfBackend), as zenflow.cuh orders its copies

static void sim_column_scores(void*, const ZenFlow* zf, float* scores) {
    for (int j = 0; j < zf->own.total_cols; j++) { scores[j] = (float)((j * 2654435761u) % 1000); }  // any fixed order
}
static void sim_nothing(void*, const ZenFlow*) {}
static void sim_moments(void*, const ZenFlow*, const float*, const float*) {}
static void sim_moments_out(void*, const ZenFlow*, float*, float*) {}

static void sim_zero_grads(void* ctx, const ZenFlow* zf, int all) {
    SimDevice* dev = (SimDevice*)ctx;
    double n = all ? (double)(zf->own.matrix_elems + zf->own.vector_elems) : (double)(zf->own.vector_elems + zf->own.gpu_sel_elems);
    gpu_work(dev, hbm_ms(dev, 4.0 * n));
}

static void sim_gpu_adam(void* ctx, const ZenFlow* zf, ZfAdamHyper, int) {
    SimDevice* dev = (SimDevice*)ctx;
    gpu_work(dev, hbm_ms(dev, 28.0 * (double)(zf->own.vector_elems + zf->own.gpu_sel_elems)));
}

static void columns_to_host(SimDevice* dev, const ZenFlow* zf, int stage, float* host, int group) {
    double bytes = group_bytes(zf, group);
    if (bytes == 0.0) { return; }
    if (group < 0 || group == zf->own.num_groups - 1) {  // the staging buffer is free again
        gpu_waits(dev, dev->d2h_done[stage]);
        gpu_waits(dev, dev->h2d_done[stage]);
    }
    if (stage == dev->params_stage) { dev->prefetched = 0; }
    gpu_work(dev, hbm_ms(dev, 2.0 * bytes));  // the gather
    dev->d2h_done[stage] = copy(dev, 0, bytes, now_ms(), host);
    dev->d2h_bytes += bytes;
}

static void sim_grads_to_host(void* ctx, const ZenFlow* zf, float* host, int group) {
    columns_to_host((SimDevice*)ctx, zf, 0, host, group);
}

static void sim_params_to_host(void* ctx, const ZenFlow* zf, float* host) {
    SimDevice* dev = (SimDevice*)ctx;
    columns_to_host(dev, zf, dev->params_stage, host, -1);
    gpu_waits(dev, dev->d2h_done[dev->params_stage]);
}

static void upload(SimDevice* dev, const ZenFlow* zf, const float* host, int group) {
    double bytes = group_bytes(zf, group);
    int st = dev->params_stage;
    dev->h2d_done[st] = copy(dev, 1, bytes, group <= 0 ? dev->d2h_done[st] : 0.0, host);
    __atomic_add_fetch(&dev->uploaded, (long long)bytes, __ATOMIC_RELAXED);
}

static void sim_params_prefetch(void* ctx, const ZenFlow* zf, const float* host) {  // the updater thread
    SimDevice* dev = (SimDevice*)ctx;
    upload(dev, zf, host, -1);
    dev->prefetched = 1;
}

// A synchronous apply layer by layer: the trainer's host runs ahead of its GPU, so every
// layer's copy is queued at once, when the first is (group 0); each layer then waits only for
// its own. (Here the main thread is the GPU, and cannot run ahead by itself.)
static void sim_params_from_host(void* ctx, const ZenFlow* zf, const float* host, int group) {
    SimDevice* dev = (SimDevice*)ctx;
    if (zf->own.cpu_elems == 0) { return; }
    if (!dev->prefetched && group <= 0) {
        dev->group_done.assign(zf->own.num_groups, 0.0);
        for (int g = (group < 0 ? -1 : 0); g < (group < 0 ? 0 : zf->own.num_groups); g++) {
            upload(dev, zf, host, g);
            if (g >= 0) { dev->group_done[g] = dev->h2d_done[dev->params_stage]; }
        }
    }
    double landed = group >= 0 && !dev->prefetched ? dev->group_done[group] : dev->h2d_done[dev->params_stage];
    if (group < 0 || group == zf->own.num_groups - 1) { dev->prefetched = 0; }
    gpu_waits(dev, landed);
    gpu_work(dev, hbm_ms(dev, 2.0 * group_bytes(zf, group)));  // the scatter
    dev->h2d_bytes += (double)__atomic_exchange_n(&dev->uploaded, 0LL, __ATOMIC_RELAXED);
}

static void sim_host_wait(void* ctx, const float* host) {  // any thread
    SimDevice* dev = (SimDevice*)ctx;
    double done;
    {
        std::lock_guard<std::mutex> lock(dev->mu);
        done = *fence(dev, host);
    }
    sleep_until(done);
}

static void sim_host_blocks(void* ctx, int begin) {
    SimDevice* dev = (SimDevice*)ctx;
    if (begin) {
        dev->blocking = 1;
        dev->blocked_since = now_ms();
    } else {
        dev->blocking = 0;
        dev->stall_ms += now_ms() - dev->blocked_since;
    }
}

// ----------------------------------------------------------------------------
// one mode on one model

typedef struct {
    std::string mode;
    double step_ms, compute_ms, stall_ms, cpu_ms, d2h_mb, h2d_mb;  // means over the measured steps
    double launch_ms;  // the launch work's wall time a step (-l ms on an idle host)
} SimRow;

static double num_params(const GPT2Config* m) { return (double)gpt2_num_params(m); }

// the first max(8, 2U) steps settle (the first selection, the first windows), then whole windows of
// at least 12 steps in all are measured (12 at U = 4, 15 at U = 5)
static SimRow simulate(const GPT2Config* model, const SimMachine* hw, ZfConfig cfg, const char* name,
                       double iters_per_ms) {
    SimDevice* dev = new SimDevice();
    dev->hw = *hw;
    ZfBackend be;
    memset(&be, 0, sizeof(be));
    be.ctx = dev;
    be.column_scores = sim_column_scores;
    be.selection_changed = sim_nothing;
    be.moments_to_host = sim_moments_out;
    be.moments_from_host = sim_moments;
    be.params_to_host = sim_params_to_host;
    be.zero_grads = sim_zero_grads;
    be.gpu_adam = sim_gpu_adam;
    be.grads_to_host = sim_grads_to_host;
    be.params_prefetch = sim_params_prefetch;
    be.params_from_host = sim_params_from_host;
    be.host_wait = sim_host_wait;
    be.host_blocks = sim_host_blocks;
    ZenFlow zf;
    zf_init(&zf, cfg, model, be);
    dev->zf = &zf;
    dev->params_stage = zf.cfg.overlap ? 1 : 0;
    for (int i = 0; i < 2; i++) {  // what the copies would have written (calloc'ed pages read as one zero page)
        if (zf.landing.buf[i] != NULL) {
            for (size_t j = 0; j < zf.own.cpu_capacity; j++) { zf.landing.buf[i][j] = 1e-3f; }
        }
    }
    // the GPU's time: the layers and the classifier share compute by their parameters
    const int L = model->num_layers;
    const double C = model->channels, N = num_params(model);
    const double compute = 6.0 * N * hw->B * hw->T / (hw->mfu * hw->peak_tflops * 1e12) * 1e3;
    const double layer = compute * 12.0 * C * C / N, head = compute - L * layer;
    dev->launch_per_ms = hw->launch_ms * iters_per_ms / compute;
    ZfAdamHyper hyper = {3e-4f, 0.9f, 0.95f, 1e-8f, 0.0f};
    SimRow row = {name, 0, 0, 0, 0, 0, 0, 0};
    const int U = zf.cfg.update_interval;  // whole windows: settle 2 or more, measure about 12 steps
    const int settle = std::max(8, 2 * U), measured = U * ((12 + U - 1) / U);
    for (int t = 0; t < settle + measured; t++) {
        dev->compute_ms = dev->stall_ms = dev->d2h_bytes = dev->h2d_bytes = dev->launch_ms = 0.0;
        double t0 = now_ms(), cpu0 = zf_cpu_work_ms(&zf);
        zf_forward_layer(&zf, -1);
        for (int l = 0; l < L; l++) {
            zf_forward_layer(&zf, l);
            gpu_work_launched(dev, layer / 3.0, 1);
        }
        gpu_work_launched(dev, head / 3.0, 1);
        zf_before_backward(&zf, t);
        gpu_work_launched(dev, 2.0 * head / 3.0, 1);
        for (int l = L - 1; l >= 0; l--) {
            gpu_work_launched(dev, 2.0 * layer / 3.0, 1);
            zf_backward_layer_done(&zf, l);
        }
        zf_step(&zf, t, hyper);
        if (t >= settle) {
            row.step_ms += (now_ms() - t0) / measured;
            row.compute_ms += dev->compute_ms / measured;
            row.stall_ms += dev->stall_ms / measured;
            row.cpu_ms += (zf_cpu_work_ms(&zf) - cpu0) / measured;
            row.d2h_mb += dev->d2h_bytes / 1e6 / measured;
            row.h2d_mb += dev->h2d_bytes / 1e6 / measured;
            row.launch_ms += dev->launch_ms / measured;
        }
    }
    zf_drain(&zf);
    zf_free(&zf);
    delete dev;
    return row;
}

// the matrix elements the CPU owns at topk ratio k (spec 2)
static double cpu_owned(const GPT2Config* model, double k) {
    double c = 0.0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        GPT2TensorShape s = gpt2_tensor_shape(model, i);
        if (s.is_matrix) { c += (double)s.count * s.rows * (s.cols - zf_n_sel(k, (int)s.cols)); }
    }
    return c;
}

// the most host memory zenflow's CPU side takes for this model (zenflow mode needs the most)
static double host_need(const GPT2Config* model, ZfConfig cfg) {
    double c = cpu_owned(model, cfg.topk);
    return zf_host_bytes(&cfg, (size_t)c, (size_t)(num_params(model) - c), 1);  // (zenflow.cuh keeps one copy)
}

int main(int argc, char** argv) {
    SimMachine hw = {495.0, 0.35, 4800.0, 50.0, 5.0, 4, 1024};
    const char* models = "d12,d24,d36,d48";
    const char* csv_path = NULL;
    ZfConfig base = ZF_DEFAULTS;  // zenflow: k 0.1, U 4, overlap, accumulation on the CPU
    base.select_interval = 0;     // one selection, at the start: a reselection's cost is not in here
    for (int i = 1; i < argc; i += 2) {
        const char* flag = argv[i];
        if (strcmp(flag, "-h") == 0) {
            printf("usage: ./sim_stall [-m d12,d24] [-b B] [-t T] [-u U] [-k topk] [-p PCIe GB/s] [-f TFLOPS]\n"
                   "       [-e MFU] [-w HBM GB/s] [-l launch ms] [-o csv]   (the comment on top of dev/sim_stall.cpp says more)\n");
            return 0;
        }
        if (flag[0] != '-' || flag[1] == 0 || flag[2] != 0 || strchr("mbtukpfewlo", flag[1]) == NULL) {
            fatal("sim_stall: unknown flag %s (hint: -h)", flag);
        }
        if (i + 1 >= argc) { fatal("sim_stall: flag %s needs a value", flag); }
        const char* val = argv[i + 1];
        if (strcmp(flag, "-m") == 0) { models = val; }
        else if (strcmp(flag, "-b") == 0) { hw.B = (int)parse_int(flag, val, 1, 1 << 16); }
        else if (strcmp(flag, "-t") == 0) { hw.T = (int)parse_int(flag, val, 1, 1 << 20); }
        else if (strcmp(flag, "-u") == 0) { base.update_interval = (int)parse_int(flag, val, 1, 64); }
        else if (strcmp(flag, "-k") == 0) { base.topk = parse_double(flag, val, 0.01, 0.99); }
        else if (strcmp(flag, "-p") == 0) { hw.pcie_gbs = parse_double(flag, val, 0.1, 1e4); }
        else if (strcmp(flag, "-f") == 0) { hw.peak_tflops = parse_double(flag, val, 1.0, 1e5); }
        else if (strcmp(flag, "-e") == 0) { hw.mfu = parse_double(flag, val, 0.01, 1.0); }
        else if (strcmp(flag, "-w") == 0) { hw.hbm_gbs = parse_double(flag, val, 1.0, 1e6); }
        else if (strcmp(flag, "-l") == 0) { hw.launch_ms = parse_double(flag, val, 0.0, 1e4); }
        else if (strcmp(flag, "-o") == 0) { csv_path = val; }
        else { fatal("sim_stall: unknown flag %s (hint: -h)", flag); }
    }
    const SimMachine h200 = {495.0, 0.35, 4800.0, 50.0, hw.launch_ms, hw.B, hw.T};
    const char* device = memcmp(&hw, &h200, sizeof(hw)) == 0 ? "simulated H200" : "simulated GPU";
    FILE* csv = csv_path != NULL ? fopenCheck(csv_path, "w") : NULL;
    if (csv) {
        fprintf(csv, "device,model,mode,ms_per_step,compute_ms,stall_ms,cpu_update_ms,pcie_mb_d2h,pcie_mb_h2d,"
                     "launch_ms\n");
    }
    const double iters_per_ms = launch_iters_per_ms();  // before any CPU side runs
    printf("Simulated GPU and PCIe, real CPU side on this host: B=%d T=%d, peak %.0f TFLOPS x MFU %.2f, HBM %.0f GB/s,\n"
           "PCIe %.0f GB/s each way, launch work %.1f ms a step; zenflow k %g, U %d, overlap. Means over whole\n"
           "windows after two or more.\n\n",
           hw.B, hw.T, hw.peak_tflops, hw.mfu, hw.hbm_gbs, hw.pcie_gbs, hw.launch_ms, base.topk, base.update_interval);
    printf("| model | mode | step ms | compute ms | stall ms | stall %% | PCIe MB down | up | CPU work ms | launch +%% "
           "| vs offload |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    const char* source;
    const double available = zf_host_memory_available(&source);
    std::string list = models;
    for (size_t at = 0; at < list.size();) {
        size_t end = list.find(',', at);
        std::string spec = list.substr(at, end == std::string::npos ? std::string::npos : end - at);
        at = end == std::string::npos ? list.size() : end + 1;
        GPT2Config target;
        if (!gpt2_parse_model_spec(spec.c_str(), &target)) { fatal("sim_stall: '%s' is not a model spec such as d12", spec.c_str()); }
        // too large for this host: the same depth, half the width, until it fits in 60% of it
        GPT2Config model = target;
        while (available > 0 && host_need(&model, base) > 0.6 * available && model.channels >= 2 * model.num_heads) {
            model.channels /= 2;
        }
        const double scale = num_params(&target) / num_params(&model);
        std::string label = spec + (scale > 1.0 ? " (scaled)" : "");
        ZfConfig modes[4] = {base, base, base, base};
        modes[0].mode = ZF_MODE_ADAMW;
        modes[1].mode = ZF_MODE_OFFLOAD;
        modes[3].accumulate = ZF_ACCUMULATE_GPU;
        const char* names[4] = {"adamw", "offload", "zenflow", "zenflow-gpu"};
        double offload_ms = 0.0;
        for (int i = 0; i < 4; i++) {
            SimRow r = simulate(&model, &hw, modes[i], names[i], iters_per_ms);
            // scaled: every time by the parameter ratio; the bytes are the target's own
            double ms = r.step_ms * scale, comp = r.compute_ms * scale, stall = r.stall_ms * scale, cpu = r.cpu_ms * scale;
            double k = zf_effective_config(modes[i]).topk, owned = cpu_owned(&model, k);
            double bytes_scale = owned > 0.0 ? cpu_owned(&target, k) / owned : 1.0;
            double d2h = r.d2h_mb * bytes_scale, h2d = r.h2d_mb * bytes_scale;
            if (i == 1) { offload_ms = ms; }
            char speedup[32] = "";
            if (i >= 2) { snprintf(speedup, sizeof(speedup), "%.2fx", offload_ms / ms); }
            // the launch work is the target's own (-l a step), not scaled
            double launch = hw.launch_ms > 0.0 ? 100.0 * (r.launch_ms / hw.launch_ms - 1.0) : 0.0;
            printf("| %s | %s | %.1f | %.1f | %.1f | %.0f%% | %.0f | %.0f | %.1f | %+.0f%% | %s |\n", label.c_str(), names[i],
                   ms, comp, stall, 100.0 * stall / ms, d2h, h2d, cpu, launch, speedup);
            fflush(stdout);
            if (csv) {
                fprintf(csv, "%s,%s,%s,%.3f,%.3f,%.3f,%.3f,%.6f,%.6f,%.3f\n", device, label.c_str(), names[i], ms, comp,
                        stall, cpu, d2h, h2d, r.launch_ms);
            }
        }
    }
    if (csv) { fclose(csv); }
    return 0;
}
