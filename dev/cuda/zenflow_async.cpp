/*
zenflow.h's side of the GPU backend, checked on the CPU (no GPU needed): the asynchronous copies of
the CUDA backend and the GPU accumulation (-za gpu), run by the CPU trainer.

The CUDA backend's copies between host and device are still in flight when a primitive
returns; zenflow.h must call host_wait on a host buffer before the CPU reads what a copy
brings (grads_to_host) or writes what a copy takes away (params_prefetch, params_from_host).
If it forgot one, a GPU run would depend on timing, and a test on a GPU might not notice.
So this program runs the CPU trainer with a backend, LazyDevice, that wraps the CPU trainer's
own backend (train_gpt2.cpp) and makes every copy happen at an extreme moment:
  late:  a copy to the host lands only at host_wait (until then the buffer holds NaN); a copy
         to the device reads the host buffer as late as it may (at the apply, or when
         host_wait is called on it), and counts as still reading it until host_wait: the
         buffer must not change until then (checked: a change is a protocol error);
  early: every copy happens at once.
A missing host_wait makes "late" read NaN or a newer master, or trips the check, so late and
early differ, and differ from the plain CPU backend. Checks:
  1. -za cpu: late == early == the CPU trainer's own backend, bitwise, on every zenflow case
     (the CPU trainer itself is checked against the reference by test_zenflow);
  2. -za gpu: late == early bitwise, and both match the PyTorch reference of the spec
     (selections, losses within 2e-5 as test_zenflow; near-ties reported);
  3. -za gpu, exact invariants: U = 1 without overlap (S = 2) == adamw; a checkpoint in the
     middle of a window (A still in the gradient buffer) resumes bit for bit; random updater
     delays change nothing;
  4. for information: the largest loss difference between -za cpu and -za gpu (spec 7: the
     backward's += rounds A differently from A += g);
  5. stall-freedom inside a window (both accumulations, fixed U and auto U): a window update held
     back until the next boundary never makes the training loop wait before it (with -za cpu
     the per-step accumulations run on their own thread, never queued behind the update),
     and the run stays bitwise the same.

  ./build/cuda/zenflow_async dev/test/ref/zf_a [more zf case dirs]   (make -C dev/cuda builds it)
*/
#define TESTING
#include "../../train_gpt2.cpp"

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "../test/test_common.h"

// ----------------------------------------------------------------------------
// a CPU device whose copies land late (or early)

typedef struct {
    CpuDevice cpu;  // does the actual work
    int late;
    std::mutex mu;  // the updater thread calls params_prefetch and host_wait too
    // copies to the host not landed yet: per host buffer, (offset, values) of each part
    std::map<const float*, std::vector<std::pair<size_t, std::vector<float>>>> to_host;
    int prefetched;            // params_prefetch started an upload that no apply has used yet
    const float* upload_host;  // the host buffer the last upload reads (NULL: none)
    int upload_read;           // ... whether it has read it (into upload) ...
    int upload_done;           // ... and whether a host_wait has seen it finish
    std::vector<float> upload;
    size_t cpu_elems;
} LazyDevice;

static int g_protocol_errors = 0;  // a host buffer changed while a copy could still read it

// an upload that has read its buffer but may still be "in flight": the buffer must be as read
static void lazy_check_upload(LazyDevice* dev, const char* where) {
    if (dev->upload_host == NULL || !dev->upload_read || dev->upload_done) { return; }
    if (memcmp(dev->upload_host, dev->upload.data(), dev->upload.size() * sizeof(float)) != 0) {
        printf("  PROTOCOL ERROR (%s): the master changed while its copy to the device could still be "
               "reading it (a missing host_wait)\n", where);
        g_protocol_errors++;
    }
}

static void lazy_column_scores(void* ctx, const ZenFlow* zf, float* scores) {
    cpu_column_scores(&((LazyDevice*)ctx)->cpu, zf, scores);
}
static void lazy_selection_changed(void* ctx, const ZenFlow* zf) { cpu_selection_changed(&((LazyDevice*)ctx)->cpu, zf); }
static void lazy_zero_grads(void* ctx, const ZenFlow* zf, int all) { cpu_zero_grads(&((LazyDevice*)ctx)->cpu, zf, all); }
static void lazy_abs_sums(void* ctx, const ZenFlow* zf, double* sel, double* cpu) {
    cpu_abs_sums(&((LazyDevice*)ctx)->cpu, zf, sel, cpu);
}
static void lazy_gpu_adam(void* ctx, const ZenFlow* zf, ZfAdamHyper h, int step) {
    cpu_gpu_adam(&((LazyDevice*)ctx)->cpu, zf, h, step);
}
static void lazy_grads_from_host(void* ctx, const ZenFlow* zf, const float* host) {
    cpu_grads_from_host(&((LazyDevice*)ctx)->cpu, zf, host);
}
static void lazy_params_to_host(void* ctx, const ZenFlow* zf, float* host) {
    cpu_params_to_host(&((LazyDevice*)ctx)->cpu, zf, host);
}
static void lazy_moments_to_host(void* ctx, const ZenFlow* zf, float* m, float* v) {
    cpu_moments_to_host(&((LazyDevice*)ctx)->cpu, zf, m, v);
}
static void lazy_moments_from_host(void* ctx, const ZenFlow* zf, const float* m, const float* v) {
    cpu_moments_from_host(&((LazyDevice*)ctx)->cpu, zf, m, v);
}

// the gradient columns (all, or one layer's) leave now (the device's state of now), and
// land at host_wait
static void lazy_grads_to_host(void* ctx, const ZenFlow* zf, float* host, int group) {
    LazyDevice* dev = (LazyDevice*)ctx;
    std::vector<float> data(zf->own.cpu_elems);
    cpu_grads_to_host(&dev->cpu, zf, data.data(), group);
    std::lock_guard<std::mutex> lock(dev->mu);
    int count;
    const int* mats = zf_group(zf, group, &count);
    for (int k = 0; k < count; k++) {
        const ZfMatrix* mat = &zf->own.matrices[mats[k]];
        size_t at = mat->cpu_offset, n = (size_t)(mat->cols - mat->n_sel) * mat->rows;
        if (dev->late) {
            dev->to_host[host].push_back({at, std::vector<float>(data.begin() + at, data.begin() + at + n)});
            for (size_t i = at; i < at + n; i++) { host[i] = NAN; }  // not there yet
        } else {
            memcpy(host + at, data.data() + at, n * sizeof(float));
        }
    }
}

// Holding a window update back (test_never_waits_inside_a_window): the update with index
// g_hold_index (0 = the first window's) does not finish until the training loop has returned
// from g_hold_until zf_step calls, or until a timeout, which is then counted. params_prefetch
// is the update's last act, so the hold lengthens the update as a slow CPU would.
static std::atomic<int> g_steps_done{0};  // zf_step calls that have returned in this run
static int g_hold_index = -1;             // -1: no hold
static int g_hold_until = 0;
static int g_prefetches = 0;              // window updates so far (updater thread only)
static int g_hold_timeouts = 0;
static int g_holds = 0;                   // holds that took place (1 per held run)

static void hold_window_update(void) {
    if (g_hold_index < 0 || g_prefetches++ != g_hold_index) { return; }
    g_holds++;
    for (int ms = 0; g_steps_done.load() < g_hold_until; ms++) {
        if (ms == 5000) {
            g_hold_timeouts++;
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

// the upload starts: late, it reads the host buffer only when it must
static void lazy_params_prefetch(void* ctx, const ZenFlow* zf, const float* host) {
    LazyDevice* dev = (LazyDevice*)ctx;
    hold_window_update();
    std::lock_guard<std::mutex> lock(dev->mu);
    lazy_check_upload(dev, "a new upload starts");
    dev->prefetched = 1;
    dev->upload_host = host;
    dev->upload_read = 0;
    dev->upload_done = 0;
    dev->cpu_elems = zf->own.cpu_elems;
    if (!dev->late) {
        dev->upload.assign(host, host + zf->own.cpu_elems);
        dev->upload_read = dev->upload_done = 1;
    }
}

static void lazy_host_wait(void* ctx, const float* host) {
    LazyDevice* dev = (LazyDevice*)ctx;
    std::lock_guard<std::mutex> lock(dev->mu);
    auto it = dev->to_host.find(host);
    if (it != dev->to_host.end()) {  // the copies to the host land
        for (auto& part : it->second) {
            memcpy((float*)host + part.first, part.second.data(), part.second.size() * sizeof(float));
        }
        dev->to_host.erase(it);
    }
    if (dev->upload_host == host) {  // the upload reads it now if it has not, and finishes
        lazy_check_upload(dev, "host_wait");
        if (!dev->upload_read) { dev->upload.assign(host, host + dev->cpu_elems); }
        dev->upload_read = dev->upload_done = 1;
    }
}

// an apply, all at once or (pipelining) one layer at a time: the upload's first part (-1 or
// group 0) reads the host buffer, unless a prefetch has; the later parts use what it read
static void lazy_params_from_host(void* ctx, const ZenFlow* zf, const float* host, int group) {
    LazyDevice* dev = (LazyDevice*)ctx;
    std::vector<float> data;
    {
        std::lock_guard<std::mutex> lock(dev->mu);
        if (group > 0) {
            if (dev->upload_host != host || !dev->upload_read) {
                printf("  PROTOCOL ERROR: layer group %d applied before the upload's first part\n", group);
                g_protocol_errors++;
            }
            lazy_check_upload(dev, "apply of a layer");
            data = dev->upload;
        } else if (dev->prefetched && dev->upload_host == host && dev->upload_read) {
            lazy_check_upload(dev, "apply");
            data = dev->upload;  // prefetched (early, or read at a host_wait)
        } else {
            lazy_check_upload(dev, "apply of a new upload");
            data.assign(host, host + zf->own.cpu_elems);  // read now: the latest moment
            dev->upload_host = host;
            dev->upload = data;
            dev->upload_read = 1;
            dev->upload_done = !dev->late;  // late: still reading until a host_wait
            dev->cpu_elems = zf->own.cpu_elems;
        }
        if (group < 0 || group == zf->own.num_groups - 1) { dev->prefetched = 0; }  // its last part
    }
    cpu_params_from_host(&dev->cpu, zf, data.data(), group);
}

static void lazy_init(ZenFlow* zf, LazyDevice* dev, GPT2* model, ZfConfig cfg, int late) {
    zf_cpu_init(zf, &dev->cpu, model, cfg);  // zf_init and the CPU device's buffers
    dev->late = late;
    dev->prefetched = 0;
    dev->upload_host = NULL;
    dev->upload_read = dev->upload_done = 0;
    ZfBackend be;
    memset(&be, 0, sizeof(be));
    be.ctx = dev;
    be.column_scores = lazy_column_scores;
    be.selection_changed = lazy_selection_changed;
    be.zero_grads = lazy_zero_grads;
    be.gpu_adam = lazy_gpu_adam;
    be.grads_to_host = lazy_grads_to_host;
    be.grads_from_host = lazy_grads_from_host;
    be.params_to_host = lazy_params_to_host;
    be.params_prefetch = lazy_params_prefetch;
    be.params_from_host = lazy_params_from_host;
    be.moments_to_host = lazy_moments_to_host;
    be.moments_from_host = lazy_moments_from_host;
    be.abs_sums = lazy_abs_sums;
    be.host_wait = lazy_host_wait;
    zf->backend = be;  // nothing has called the backend yet
}

// ----------------------------------------------------------------------------
// runs

enum { PLAIN = 0, LATE = 1, EARLY = 2 };
static const char* const device_names[3] = {"CPU backend", "late copies", "early copies"};

typedef struct {
    std::vector<float> losses, params;
    long groups_out, groups_in;  // transfer groups zenflow.h moved layer by layer
} Run;

// the case's run with settings z on a device kind; selections to sel_path if not NULL; with
// save_at > 0 a checkpoint after that many steps, then a fresh model and ZenFlow resume it;
// with `pipeline` the passes call zenflow.h's per-layer hooks (transfers layer by layer)
static Run run(const char* dir, const ZfCase* c, ZfConfig z, int kind, const char* sel_path, int save_at = 0,
               int pipeline = 0) {
    GPT2 model;
    DataLoader loader;
    case_open(dir, &c->s, &model, &loader);
    ZenFlow zf;
    LazyDevice* dev = new LazyDevice;
    z.pipeline = pipeline;
    z.selection_log = sel_path;
    if (kind == PLAIN) {
        zf_cpu_init(&zf, &dev->cpu, &model, z);
    } else {
        lazy_init(&zf, dev, &model, z, kind == LATE);
    }
    z.selection_log = NULL;  // (a resumed ZenFlow goes on with this one's log)
    model.zf = pipeline ? &zf : NULL;
    Run out;
    g_steps_done.store(0);
    g_prefetches = 0;
    for (int t = 0; t < c->s.steps; t++) {
        if (save_at > 0 && t == save_at) {
            FILE* fp = tmpfile();
            zf_save_state(&zf, fp, "checkpoint test");
            std::vector<float> params(model.params_memory, model.params_memory + model.num_parameters);
            FILE* log = zf.stats.selection_log;
            zf.stats.selection_log = NULL;
            zf_wait_idle(&zf);
            lazy_check_upload(dev, "checkpoint");
            zf_cpu_free(&zf, &dev->cpu);
            delete dev;
            dev = new LazyDevice;
            memcpy(model.params_memory, params.data(), params.size() * sizeof(float));
            memset(model.grads_memory, 0, model.num_parameters * sizeof(float));  // as a new process
            if (kind == PLAIN) {
                zf_cpu_init(&zf, &dev->cpu, &model, z);
            } else {
                lazy_init(&zf, dev, &model, z, kind == LATE);
            }
            zf.stats.selection_log = log;
            rewind(fp);
            zf_load_state(&zf, fp, "checkpoint test");
            fclose(fp);
        }
        out.losses.push_back(zf_train_step(&model, &loader, &zf, t, case_hyper(&c->s)));
        g_steps_done.store(t + 1);
    }
    zf_drain(&zf);
    out.params.assign(model.params_memory, model.params_memory + model.num_parameters);
    out.groups_out = zf.stats.groups_out;
    out.groups_in = zf.stats.groups_in;
    zf_wait_idle(&zf);
    lazy_check_upload(dev, "end of the run");
    zf_cpu_free(&zf, &dev->cpu);
    delete dev;
    dataloader_free(&loader);
    gpt2_free(&model);
    return out;
}

// ----------------------------------------------------------------------------
// the checks

#define REPORT_WIDTH 66  // report_same pads its label to this width

static void test_case(const char* dir) {
    ZfCase c = read_zf_case(dir);
    print_zf_case(dir, &c);
    char what[256];
    Run plain = run(dir, &c, c.z, PLAIN, NULL);
    for (int kind = LATE; kind <= EARLY; kind++) {
        snprintf(what, sizeof(what), "-za cpu, %s == CPU backend", device_names[kind]);
        report_same(same_run(run(dir, &c, c.z, kind, NULL), plain), what, REPORT_WIDTH);
        snprintf(what, sizeof(what), "-za cpu, %s, per-layer transfers == CPU backend", device_names[kind]);
        report_same(same_run(run(dir, &c, c.z, kind, NULL, 0, 1), plain), what, REPORT_WIDTH);
    }
    if (c.z.mode != ZF_MODE_ZENFLOW) { return; }  // adamw and offload ignore -za
    ZfConfig z = c.z;
    z.accumulate = ZF_ACCUMULATE_GPU;
    char sel_path[] = "/tmp/zf_async_selections_XXXXXX";
    make_temp_file(sel_path);
    Run late = run(dir, &c, z, LATE, sel_path);
    Run early = run(dir, &c, z, EARLY, NULL);
    report_same(same_run(late, early), "-za gpu, late copies == early copies", REPORT_WIDTH);
    report_same(same_run(run(dir, &c, z, LATE, NULL, 0, 1), late), "-za gpu, late copies, per-layer transfers == whole",
                REPORT_WIDTH);
    // against the reference as dev/test/test_zenflow.cpp compares (near-ties within 1e-5)
    printf("  -za gpu, late copies, against the reference:\n");
    check_zf_against_reference(dir, sel_path, late.losses, late.params, 1e-5, "    ");
    double accumulations = 0.0;
    for (size_t t = 0; t < late.losses.size() && t < plain.losses.size(); t++) {
        accumulations = std::max(accumulations, fabs((double)late.losses[t] - plain.losses[t]));
    }
    printf("  %-66s %.3e  (info: spec 7)\n", "-za gpu vs -za cpu, max |loss difference|", accumulations);
}

static void test_invariants(const char* dir) {
    ZfCase c = read_zf_case(dir);
    printf("== more settings on %s: late copies == early copies (and == the CPU backend with -za cpu)\n", dir);
    struct { double k; int U, S, W, overlap; } more[] = {
        {0.1, 1, 4, 0, 1}, {0.2, 2, 4, 1, 1}, {0.0, 2, 4, 0, 1}, {0.3, 5, 0, 0, 1}, {0.1, 3, 3, 2, 0},
        {0.1, ZF_AUTO, 6, 0, 1}, {0.2, ZF_AUTO, 4, 1, 0}};  // (U = 0: auto, spec 6)
    for (auto& m : more) {
        for (int tr = 0; tr < 2; tr++) {
            ZfConfig z = zf_settings(m.k, m.U, m.S, m.W, m.overlap, tr);
            char what[256];
            Run late = run(dir, &c, z, LATE, NULL);
            snprintf(what, sizeof(what), "k=%.1f U=%d S=%d W=%d overlap %s -za %s: late == early", m.k, m.U, m.S,
                     m.W, m.overlap ? "on" : "off", zf_accumulate_names[tr]);
            report_same(same_run(late, run(dir, &c, z, EARLY, NULL)), what, REPORT_WIDTH);
            snprintf(what, sizeof(what), "k=%.1f U=%d S=%d W=%d overlap %s -za %s: late, per layer == whole", m.k,
                     m.U, m.S, m.W, m.overlap ? "on" : "off", zf_accumulate_names[tr]);
            Run piped = run(dir, &c, z, LATE, NULL, 0, 1);
            report_same(same_run(late, piped), what, REPORT_WIDTH);
            // and the layers did move one by one: gradients on every step that keeps its
            // ownership (-za gpu: every boundary), applies wherever one is synchronous
            int want_in = !m.overlap || m.W > 0;
            int ok = piped.groups_out > 0 && (piped.groups_in > 0) == want_in;
            printf("  %-66s %ld out, %ld in  %s\n", "... transfer groups moved layer by layer", piped.groups_out,
                   piped.groups_in, ok ? "ok" : "FAIL");
            check(ok, "per-layer transfers did not happen where they should");
            if (tr == ZF_ACCUMULATE_CPU) {
                snprintf(what, sizeof(what), "k=%.1f U=%d S=%d W=%d overlap %s -za cpu: late == CPU backend", m.k,
                         m.U, m.S, m.W, m.overlap ? "on" : "off");
                report_same(same_run(late, run(dir, &c, z, PLAIN, NULL)), what, REPORT_WIDTH);
            }
        }
    }
    printf("== exact invariants of -za gpu on %s (late copies)\n", dir);
    Run ref = run(dir, &c, zf_mode_config(ZF_MODE_ADAMW), PLAIN, NULL);
    char what[256];
    for (double k : {0.05, 0.1, 0.5}) {
        ZfConfig z = zf_settings(k, 1, 2, 0, 0, ZF_ACCUMULATE_GPU);
        snprintf(what, sizeof(what), "zenflow k=%.2f U=1 S=2 overlap off -za gpu == adamw", k);
        report_same(same_run(run(dir, &c, z, LATE, NULL), ref), what, REPORT_WIDTH);
    }
    for (int tr = 0; tr < 2; tr++) {
        ZfConfig z = zf_settings(0.1, 3, 6, 0, 1, tr);
        Run first = run(dir, &c, z, LATE, NULL);
        setenv("ZF_WORKER_DELAY_US", "2000", 1);
        Run delayed = run(dir, &c, z, LATE, NULL);
        unsetenv("ZF_WORKER_DELAY_US");
        snprintf(what, sizeof(what), "zenflow U=3 S=6 overlap -za %s, with random updater delays", zf_accumulate_names[tr]);
        report_same(same_run(first, delayed), what, REPORT_WIDTH);
        for (int save_at : {5, 7}) {
            snprintf(what, sizeof(what), "zenflow U=3 S=6 overlap -za %s, checkpoint after step %d, resumed",
                     zf_accumulate_names[tr], save_at);
            report_same(same_run(first, run(dir, &c, z, LATE, NULL, save_at)), what, REPORT_WIDTH);
        }
        setenv("ZF_WORKER_DELAY_US", "2000", 1);
        snprintf(what, sizeof(what), "... per-layer transfers, random updater delays");
        report_same(same_run(first, run(dir, &c, z, LATE, NULL, 0, 1)), what, REPORT_WIDTH);
        unsetenv("ZF_WORKER_DELAY_US");
        z.overlap = 0;
        z.warmup = 2;
        Run sync = run(dir, &c, z, LATE, NULL);
        snprintf(what, sizeof(what), "zenflow U=3 W=2 overlap off -za %s, checkpoint after step 4, resumed",
                 zf_accumulate_names[tr]);
        report_same(same_run(sync, run(dir, &c, z, LATE, NULL, 4)), what, REPORT_WIDTH);
        snprintf(what, sizeof(what), "... per-layer transfers, checkpoint after step 4 (mid-apply), resumed");
        report_same(same_run(sync, run(dir, &c, z, LATE, NULL, 4, 1)), what, REPORT_WIDTH);
        // auto U (spec 6): the decision of the step before a checkpoint, and the window's c
        // sums, are part of the state
        z = zf_settings(0.1, ZF_AUTO, 6, 0, 1, tr);
        char win_path[] = "/tmp/zf_async_windows_XXXXXX";
        make_temp_file(win_path);
        Run autou = run(dir, &c, z, LATE, win_path, 0, 1);
        std::vector<std::pair<int, int>> windows = read_windows(win_path);
        remove(win_path);
        check(windows.size() >= 2, "auto U closed fewer than 2 windows: the checkpoint test needs more steps");
        // resume right after a closing decision (the saved decision is "close"), and inside
        // the longest window after its first and second steps (there the window's c sums
        // carry the decision)
        std::pair<int, int> longest = longest_window(windows);
        int start = longest.first - longest.second + 1;
        for (int save_at : {windows.empty() ? 1 : windows[0].first, start + 1, start + 2}) {
            snprintf(what, sizeof(what), "zenflow U=auto S=6 overlap -za %s, checkpoint after step %d, resumed",
                     zf_accumulate_names[tr], save_at);
            report_same(same_run(autou, run(dir, &c, z, LATE, NULL, save_at, 1)), what, REPORT_WIDTH);
        }
    }
}

// Stall-freedom of the CPU side (spec 5, -za cpu): between two boundaries the training loop
// waits only for its own steps' accumulations, never for a job queued behind a window update.
// The update handed over at one boundary is held back until the loop has finished every step
// before the next boundary (where it must wait for it). Had the loop waited for the update
// earlier, directly or through a job queued after it, the hold would end only at its timeout.
// Fixed U = 4 (with -za cpu the loop reuses a staging buffer after 2 steps: its job must not
// queue behind the update) and auto U (with -za cpu each step's decision needs the step
// before's accumulation); -za gpu has no per-step CPU job at all.
static void test_never_waits_inside_a_window(const char* dir) {
    ZfCase c = read_zf_case(dir);
    printf("== a window update held back until the next boundary stalls no step inside the window\n");
    for (int run_i = 0; run_i < 4; run_i++) {
        int auto_u = run_i % 2, tr = run_i / 2;
        // S = 0: one selection, at t = 0, so no drain inside a window
        ZfConfig z = zf_settings(0.1, auto_u ? ZF_AUTO : 4, 0, 0, 1, tr);
        char win_path[] = "/tmp/zf_async_windows_XXXXXX";
        make_temp_file(win_path);
        Run free = run(dir, &c, z, LATE, win_path, 0, 1);
        std::vector<std::pair<int, int>> windows = read_windows(win_path);
        remove(win_path);
        if (!auto_u) {
            for (int t = z.update_interval - 1; t < c.s.steps; t += z.update_interval) { windows.push_back({t, 4}); }
        }
        // hold the update of the first window followed by one of at least 3 steps (with auto U
        // the decision inside a window of 2 steps has nothing to wait for)
        size_t i = 0;
        while (i + 1 < windows.size() && windows[i + 1].second < 3) { i++; }
        check(i + 1 < windows.size(), "no window of 3 steps or more to test with: the case needs more steps");
        if (i + 1 >= windows.size()) { continue; }
        g_hold_index = (int)i;
        g_hold_until = windows[i + 1].first;  // zf_step of every step before the next boundary returned
        g_hold_timeouts = 0;
        g_holds = 0;
        Run held = run(dir, &c, z, LATE, NULL, 0, 1);
        g_hold_index = -1;
        char what[256];
        snprintf(what, sizeof(what), "-za %s U=%s: update of the window closed at step %d held until %d",
                 zf_accumulate_names[tr], auto_u ? "auto" : "4", windows[i].first, windows[i + 1].first);
        const char* verdict = g_holds != 1 ? "FAIL (the update never reached its prefetch: no hold)"
                              : g_hold_timeouts == 0 ? "no wait" : "FAIL (the loop waited for it)";
        printf("  %-66s %s\n", what, verdict);
        check(g_holds == 1, "the held window update never called params_prefetch, so nothing was held");
        check(g_hold_timeouts == 0, "the training loop waited inside a window for a held-back window update");
        report_same(same_run(held, free), "... and the run is the same as without the hold", REPORT_WIDTH);
    }
}

int main(int argc, char* argv[]) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <zenflow case dir> [...] (dev/test/ref/zf_*, see dev/test/make_refs.sh)\n",
                argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) { test_case(argv[i]); }
    test_invariants(argv[1]);
    test_never_waits_inside_a_window(argv[1]);
    printf("  %-66s %d  %s\n", "protocol errors (a copy's host buffer changed too early)", g_protocol_errors,
           g_protocol_errors == 0 ? "ok" : "FAIL");
    check(g_protocol_errors == 0, "zenflow.h wrote a host buffer that a copy could still be reading");
    return test_summary("zenflow_async");
}
