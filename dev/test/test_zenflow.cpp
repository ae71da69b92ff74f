/*
Tests ZenFlow's orchestration (zenflow.h) in the CPU trainer against the PyTorch reference
of the spec (scripts/zenflow_reference.py), and the invariants that must hold exactly.

  ./test_zenflow <zenflow case dir> [...]       (written by dev/test/make_refs.sh)

A zenflow case directory holds model.bin, train.bin, case.txt ("B T steps lr wd"),
zenflow.txt ("mode k U S W overlap"), and the reference's losses.txt, selections.txt and
final.bin (the model after the last step and the drain, spec 4.7).

Every run trains as the trainer's main loop does, with its defaults: zf_before_backward
zeroes the gradients, and the passes call the per-layer hooks (-zp 1, transfers per layer).
1. Against the reference, per case (zenflow: in both accumulations, -za cpu and -za gpu): the
   columns chosen at every selection (every matrix), the loss of every step (2e-5
   absolute, the bound of test_gpt2cpu, for the same reason: the forward/backward sums
   differ in order, a few ulps), and the parameters after the drain (final.bin).
   Column scores come from two different summation orders, so where two scores sit within
   rounding of each other at the selection boundary the two sides may legitimately pick
   different columns. That case is detected and reported as NEAR-TIE with the scores; the
   runs then follow different paths, so losses are compared only up to that step. Any
   other difference in the selection is a failure. Since every ZenFlow test shares this
   checker (test_common.h), it is first tried on made-up selections that it must reject:
   a column twice, the right columns out of order, one far from the boundary or past it.
2. Exact invariants (bitwise, the losses and the parameters after the drain, on the first
   case's model and data):
   - zenflow with U = 1 and overlap off equals adamw for k = 0.05, 0.1, 0.5 (and with S = 2
     the moments migrate at every other step, so this also proves no moment is lost);
   - offload equals adamw;
   - two identical zenflow runs are identical, also with random delays injected into the
     updater thread (ZF_WORKER_DELAY_US), and with whole transfers (-zp 0).
3. The stall intervals (spec 8) where their count is known: no wait, no interval; nested, one.
*/
#define TESTING
#include "../../train_gpt2.cpp"

#include <string>

#include "test_common.h"

// trains `steps` steps of the case's run with the given ZenFlow settings, as the trainer's
// main loop does (pipeline: -zp); returns the losses; writes the selection log to sel_path
// if not NULL
static std::vector<float> run(const char* dir, const ZfCase* c, ZfConfig z, const char* sel_path,
                              int pipeline = 1, std::vector<float>* final_params = NULL) {
    GPT2 model;
    DataLoader loader;
    case_open(dir, &c->s, &model, &loader);
    ZenFlow zf;
    CpuDevice device;
    z.pipeline = pipeline;
    z.selection_log = sel_path;
    zf_cpu_init(&zf, &device, &model, z);
    model.zf = &zf;
    std::vector<float> losses;
    for (int t = 0; t < c->s.steps; t++) {
        losses.push_back(zf_train_step(&model, &loader, &zf, t, case_hyper(&c->s)));
    }
    zf_drain(&zf);
    if (final_params != NULL) { final_params->assign(model.params_memory, model.params_memory + model.num_parameters); }
    zf_cpu_free(&zf, &device);
    dataloader_free(&loader);
    gpt2_free(&model);
    return losses;
}

static void test_against_reference(const char* dir) {
    ZfCase c = read_zf_case(dir);
    print_zf_case(dir, &c);
    // zenflow in both accumulations (spec 7; the CPU trainer has -za gpu too), each against the
    // reference; adamw and offload have no window to accumulate
    int accumulations = c.z.mode == ZF_MODE_ZENFLOW ? 2 : 1;
    for (int tr = 0; tr < accumulations; tr++) {
        ZfConfig z = c.z;
        z.accumulate = tr;
        if (accumulations == 2) { printf("  -za %s\n", zf_accumulate_names[tr]); }
        char sel_path[] = "/tmp/zf_selections_XXXXXX";
        make_temp_file(sel_path);
        std::vector<float> final_params;
        std::vector<float> ours = run(dir, &c, z, sel_path, 1, &final_params);
        // near-ties: reference scores within 1e-5 of the boundary score (see the top of this file)
        check_zf_against_reference(dir, sel_path, ours, final_params, 1e-5, accumulations == 2 ? "    " : "  ");
    }
}

// a run's losses, then its parameters after the drain: what the exact invariants compare
static std::vector<float> run_whole(const char* dir, const ZfCase* c, ZfConfig z, int pipeline = 1) {
    std::vector<float> params;
    std::vector<float> out = run(dir, c, z, NULL, pipeline, &params);
    out.insert(out.end(), params.begin(), params.end());
    return out;
}

static void test_invariants(const char* dir) {
    printf("== exact invariants on %s (losses and final parameters)\n", dir);
    ZfCase c = read_zf_case(dir);
    std::vector<float> ref = run_whole(dir, &c, zf_mode_config(ZF_MODE_ADAMW));
    char what[256];
    for (double k : {0.05, 0.1, 0.5}) {
        int same = bitwise_equal(run_whole(dir, &c, zf_settings(k, 1, 2, 0, 0, ZF_ACCUMULATE_CPU)), ref);
        printf("  zenflow k=%.2f U=1 S=2 overlap off == adamw: %s\n", k, same ? "bitwise" : "DIFFERS");
        snprintf(what, sizeof(what), "zenflow k=%g U=1 without overlap differs from adamw", k);
        check(same, what);
    }
    int same = bitwise_equal(run_whole(dir, &c, zf_mode_config(ZF_MODE_OFFLOAD)), ref);
    printf("  offload == adamw: %s\n", same ? "bitwise" : "DIFFERS");
    check(same, "offload differs from adamw");

    // determinism of the threaded path; it must also really differ from adamw
    ZfConfig z = zf_settings(0.1, 3, 6, 0, 1, ZF_ACCUMULATE_CPU);
    std::vector<float> first = run_whole(dir, &c, z), second = run_whole(dir, &c, z);
    setenv("ZF_WORKER_DELAY_US", "3000", 1);
    std::vector<float> delayed = run_whole(dir, &c, z);
    unsetenv("ZF_WORKER_DELAY_US");
    std::vector<float> whole = run_whole(dir, &c, z, 0);
    printf("  zenflow overlap run twice: %s; with random updater delays: %s; with whole transfers: %s; "
           "differs from adamw: %s\n",
           bitwise_equal(first, second) ? "bitwise equal" : "DIFFERENT",
           bitwise_equal(first, delayed) ? "bitwise equal" : "DIFFERENT",
           bitwise_equal(first, whole) ? "bitwise equal" : "DIFFERENT",
           bitwise_equal(first, ref) ? "NO" : "yes");
    check(bitwise_equal(first, second), "two identical zenflow runs differ");
    check(bitwise_equal(first, delayed), "random updater delays change the run");
    check(bitwise_equal(first, whole), "transfers per layer (-zp 1) and whole (-zp 0) differ");
    check(!bitwise_equal(first, ref), "zenflow with U=3 and overlap equals adamw: is the CPU side doing anything?");
}

// The checker of part 1 (test_common.h's compare_selections, which test_gpt2cu and the
// random cases use too) on made-up selections: it must accept identical columns and a swap
// at a near-tie, and reject everything else, since any selection it accepts wrongly also
// cuts the loss comparison short. One matrix of 6 columns picks 3; the reference's scores
// have its boundary (3rd largest, 4.0) within 1e-5 of the 4th (3.99999).
static void test_selection_checker(void) {
    printf("== the selection checker on made-up selections\n");
    std::vector<double> scores = {9.0, 1.0, 4.0, 3.99999, 8.0, 2.0};
    auto sel = [&](std::vector<int> cols) { return std::vector<Selection>{{5, 0, cols, scores}}; };
    std::vector<Selection> ref = sel({0, 2, 4});
    struct {
        std::vector<int> ours;
        int accepted, tie;
        const char* what;
    } cases[] = {
        {{0, 2, 4}, 1, 0, "the reference's columns"},
        {{0, 3, 4}, 1, 1, "a swap at the boundary (a near-tie)"},
        {{0, 1, 4}, 0, 0, "a column far below the boundary"},
        {{0, 4, 2}, 0, 0, "the right columns in another order"},
        {{0, 4, 4}, 0, 0, "a column twice (the boundary one missing)"},
        {{0, 4}, 0, 0, "a column too few"},
        {{0, 4, 6}, 0, 0, "a column past the matrix"},
    };
    for (const auto& k : cases) {
        int tie, events;
        int ok = compare_selections(sel(k.ours), ref, 1e-5, "    ", &tie, &events);
        int right = ok == k.accepted && (tie == 5) == k.tie && events == 1;
        printf("  %-44s %s %s\n", k.what, ok ? (tie == 5 ? "accepted as a near-tie" : "accepted") : "rejected",
               right ? "ok" : "WRONG");
        check(right, "the selection checker judged a made-up selection wrongly");
    }
}

// Spec 8's stall is the main thread blocked on the CPU side, and only that: a wait for a job
// that has finished already is no stall interval. After zf_wait_idle every job has finished,
// so a second zf_wait_idle and the next step (t = 5: k 0.1, U 4, S 8, no boundary) record no
// interval at all; a selection (t = 8), which drains the CPU side inside its own interval,
// records that one only. Intervals nest: one inside another is part of it. The case's model
// and data, these settings.
static int g_stalls_begun = 0, g_stalls_ended = 0;
static void count_stalls(void* ctx, int begin) {
    (void)ctx;
    g_stalls_begun += begin;
    g_stalls_ended += !begin;
}

static void test_stall_intervals(const char* dir) {
    printf("== stall intervals (spec 8) on %s\n", dir);
    ZfCase c = read_zf_case(dir);
    GPT2 model;
    DataLoader loader;
    case_open(dir, &c.s, &model, &loader);
    ZenFlow zf;
    CpuDevice device;
    zf_cpu_init(&zf, &device, &model, zf_settings(0.1, 4, 8, 0, 1, ZF_ACCUMULATE_CPU));
    zf.backend.host_blocks = count_stalls;
    model.zf = &zf;
    int idle_again = -1, after_idle = -1, at_selection = -1;
    for (int t = 0; t <= 8; t++) {
        if (t == 5) {
            zf_wait_idle(&zf);
            g_stalls_begun = 0;
            zf_wait_idle(&zf);  // nothing left to wait for
            idle_again = g_stalls_begun;
        }
        g_stalls_begun = 0;
        zf_train_step(&model, &loader, &zf, t, case_hyper(&c.s));
        if (t == 5) { after_idle = g_stalls_begun; }
        if (t == 8) { at_selection = g_stalls_begun; }
    }
    // nested intervals (a selection's drain, while a job still runs, inside the selection's
    // own): one interval, which the outer end closes
    g_stalls_begun = g_stalls_ended = 0;
    double outer = zf_stall_begin(&zf), inner = zf_stall_begin(&zf);
    zf_stall_end(&zf, inner, "test: inner");
    const int ended_inside = g_stalls_ended;
    zf_stall_end(&zf, outer, "test: outer");
    printf("  nested intervals: %d begun, %d ended inside, %d in all (1, 0, 1)\n", g_stalls_begun, ended_inside,
           g_stalls_ended);
    check(g_stalls_begun == 1 && ended_inside == 0 && g_stalls_ended == 1,
          "a stall interval inside another ended the outer one, or was counted apart");
    zf_drain(&zf);
    zf_cpu_free(&zf, &device);
    dataloader_free(&loader);
    gpt2_free(&model);
    printf("  a drain of idle threads: %d intervals (0); the step after: %d (0); a selection step: %d (1)\n",
           idle_again, after_idle, at_selection);
    check(idle_again == 0, "a drain of idle CPU threads recorded a stall interval");
    check(after_idle == 0, "a step whose jobs had all finished recorded a stall interval");
    check(at_selection == 1, "a selection step recorded other stall intervals than its own");
}

// The CPU threads' team sizes (zenflow.h's zf_team_sizes): from 4 cores on, together one
// core fewer than the host has, both threads at least 1; below 4, each thread every core.
static void test_team_sizes(void) {
    printf("== the CPU threads' team sizes\n");
    int right = 1;
    for (int cores = 1; cores <= 64; cores++) {
        for (int both = 0; both <= 1; both++) {
            int u, a;
            zf_team_sizes(cores, both, &u, &a);
            int want = cores < 4 ? u == cores && a == (both ? cores : 0)
                                 : u + a == cores - 1 && u >= 1 && (both ? a >= 1 && u - a <= 1 : a == 0);
            if (!want) { printf("  %d cores, %s: updater %d, accumulator %d  WRONG\n", cores, both ? "both" : "updater only", u, a); }
            right = right && want;
        }
    }
    int u, a;
    zf_team_sizes(16, 1, &u, &a);
    printf("  1..64 cores %s; e.g. 16 cores: updater %d, accumulator %d\n", right ? "ok" : "WRONG", u, a);
    check(right && u == 8 && a == 7, "the CPU threads' team sizes");
}

int main(int argc, char* argv[]) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <zenflow case dir> [...] (see dev/test/make_refs.sh)\n", argv[0]);
        return 2;
    }
    test_selection_checker();
    test_team_sizes();
    for (int i = 1; i < argc; i++) { test_against_reference(argv[i]); }
    test_invariants(argv[1]);
    test_stall_intervals(argv[1]);
    return test_summary("test_zenflow");
}
