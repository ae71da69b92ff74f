/*
Helpers shared by the test programs: dev/test/test_gpt2.cpp, dev/test/test_zenflow.cpp,
dev/cuda/zenflow_async.cpp (CPU trainer) and test_gpt2.cu (CUDA trainer).

  - check() and the g_passed / g_failed counters behind each program's summary line
    (test_summary, which also counts the runs compared only up to a near-tie);
  - max_errors / compare_tensor: a tensor against its reference, error relative to the tensor;
  - the case directories of dev/test/make_refs.sh: read_case (case.txt "B T steps lr wd"),
    read_zf_case (+ zenflow.txt "mode k U S W overlap [U_max]", U = 0: auto), read_losses
    (losses.txt), read_selections (selections.txt, or a trainer's selection log);
  - a case's run: case_open (its model and batches), case_hyper (its AdamW settings),
    zf_train_step (one step of a ZenFlow run, as the trainers' main loops take it);
  - against the reference: check_debug_batch (state.bin's loss and gradients), check_losses
    (losses.txt), compare_selections / check_selections (ZenFlow's column selections, with
    the NEAR-TIE detection), check_zf_against_reference (a whole ZenFlow run);
  - bitwise_equal / same_run / report_same: the exact (bitwise) invariants.

Plain C++17, host code only. Include it AFTER the trainer (train_gpt2.cpp or
train_gpt2.cu): it uses the trainer's GPT2, gpt2_build, gpt2_forward, fopenCheck and fatal,
the data loader, and ZenFlow's ZfConfig and zf_step.
*/
#pragma once

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <set>
#include <vector>

static int g_passed = 0, g_failed = 0;
static int g_near_ties = 0;  // runs whose later losses and final parameters went unchecked

static inline void check(int ok, const char* what) {
    if (ok) {
        g_passed++;
    } else {
        g_failed++;
        printf("  FAIL: %s\n", what);
    }
}

// the program's last line; its exit code (1 also when no check ran)
static inline int test_summary(const char* program) {
    printf("%s: %d passed, %d failed", program, g_passed, g_failed);
    if (g_near_ties > 0) { printf(", %d run(s) compared only up to a NEAR-TIE", g_near_ties); }
    printf("\n");
    return g_failed == 0 && g_passed > 0 ? 0 : 1;
}

// A row of logits (V = 4 of Vp = 8) whose target, 1, lies 201 below the max: as
// -log(exp(x_t - max) / sum) the loss would be -log(0) = inf in fp32 (from about 104 below);
// as log(sum) - (x_t - max), both trainers' formula, it is finite.
static const float FAR_LOGITS[8] = {0.0f, -200.0f, 1.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f};

static inline void check_far_loss(float loss) {
    double sum = 0.0;
    for (int i = 0; i < 4; i++) { sum += exp((double)FAR_LOGITS[i] - 1.0); }
    double want = log(sum) - (-200.0 - 1.0);
    int ok = isfinite(loss) && fabs(loss - want) < 1e-4;  // fp32 at 200: steps of 1.5e-5
    printf("  loss of a target 201 below the max: %.6f (float64 %.6f)  %s\n", loss, want, ok ? "ok" : "FAIL");
    check(ok, "the loss of a target far below the max is not log(sum) - (x_target - max)");
}

// err is worse than the worst so far: larger, or nan (a nan, once there, stays: nothing is
// larger than nan, and the first nan's place is kept); every checker's largest error
static inline int worse_error(double err, double worst) { return !isnan(worst) && (isnan(err) || err > worst); }

// max |a - b| and max |b| over n elements
static inline void max_errors(const float* a, const float* b, size_t n, double* max_abs, double* max_ref) {
    *max_abs = 0.0;
    *max_ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (worse_error(d, *max_abs)) { *max_abs = d; }
        double r = fabs((double)b[i]);
        if (r > *max_ref) { *max_ref = r; }
    }
}

// prints and checks max |ours - ref| / max |ref| <= tol (the error relative to the tensor)
static inline int compare_tensor(const char* name, const float* ours, const float* ref, size_t n, double tol) {
    double max_abs, max_ref;
    max_errors(ours, ref, n, &max_abs, &max_ref);
    double rel = max_ref > 0.0 ? max_abs / max_ref : max_abs;
    int ok = rel <= tol;  // false for nan
    printf("  %-9s %10zu values  max|err| %.3e  max|ref| %.3e  rel %.3e  %s\n", name, n, max_abs, max_ref,
           rel, ok ? "ok" : "FAIL");
    char what[128];
    snprintf(what, sizeof(what), "%s: rel error %.3e > %.0e", name, rel, tol);
    check(ok, what);
    return ok;
}

// ----------------------------------------------------------------------------
// case directories (dev/test/make_refs.sh)

typedef struct {
    int B, T, steps;
    float lr, wd;
} CaseSettings;

static inline CaseSettings read_case(const char* dir) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/case.txt", dir);
    FILE* fp = fopenCheck(path, "r");
    CaseSettings s;
    if (fscanf(fp, "%d %d %d %f %f", &s.B, &s.T, &s.steps, &s.lr, &s.wd) != 5) {
        fatal("%s: expected 'B T steps lr wd'", path);
    }
    fclose(fp);
    return s;
}

// a zenflow case: case.txt and zenflow.txt ("mode k U S W overlap")
typedef struct {
    CaseSettings s;
    ZfConfig z;
} ZfCase;

static inline ZfCase read_zf_case(const char* dir) {
    ZfCase c;
    c.s = read_case(dir);
    char path[4096], mode[32];
    snprintf(path, sizeof(path), "%s/zenflow.txt", dir);
    FILE* fp = fopenCheck(path, "r");
    c.z = ZF_DEFAULTS;
    int got = fscanf(fp, "%31s %lf %d %d %d %d %d", mode, &c.z.topk, &c.z.update_interval, &c.z.select_interval,
                     &c.z.warmup, &c.z.overlap, &c.z.max_update_interval);
    if (got != 6 && got != 7) { fatal("%s: expected 'mode k U S W overlap [U_max]' (U = 0: auto)", path); }
    fclose(fp);
    if (strcmp(mode, "adamw") == 0) { c.z.mode = ZF_MODE_ADAMW; }
    else if (strcmp(mode, "offload") == 0) { c.z.mode = ZF_MODE_OFFLOAD; }
    else if (strcmp(mode, "zenflow") == 0) { c.z.mode = ZF_MODE_ZENFLOW; }
    else { fatal("%s: unknown mode '%s' (hint: adamw, offload or zenflow)", path, mode); }
    return c;
}

// the line that opens the checks of a zenflow case
static inline void print_zf_case(const char* dir, const ZfCase* c) {
    printf("== zenflow case %s: %s k=%g U=%d S=%d W=%d overlap=%d, %d steps\n", dir, zf_mode_names[c->z.mode],
           c->z.topk, c->z.update_interval, c->z.select_interval, c->z.warmup, c->z.overlap, c->s.steps);
}

// reads the reference losses: lines "<t> <loss>", '#' lines are comments; strict: the steps
// must be 0, 1, 2, ...
static inline std::vector<float> read_losses(const char* path) {
    std::vector<float> losses;
    FILE* fp = fopenCheck(path, "r");
    char line[1024];
    while (fgets(line, sizeof(line), fp) != NULL) {
        if (line[0] == '#' || line[0] == '\n') { continue; }
        int t;
        double loss;
        if (sscanf(line, "%d %lf", &t, &loss) != 2 || t != (int)losses.size()) {
            fatal("%s: bad line '%s' (expected step %zu)", path, line, losses.size());
        }
        losses.push_back((float)loss);
    }
    fclose(fp);
    return losses;
}

// ----------------------------------------------------------------------------
// a case's run

// the case's model (model.bin)
static inline void case_model(const char* dir, GPT2* model) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/model.bin", dir);
    gpt2_build(model, path, 0);
}

// the case's model and a loader of its batches (train.bin, B x T of case.txt)
static inline void case_open(const char* dir, const CaseSettings* s, GPT2* model, DataLoader* loader) {
    case_model(dir, model);
    char path[4096];
    snprintf(path, sizeof(path), "%s/train.bin", dir);
    dataloader_init(loader, path, s->B, s->T, model->config.vocab_size);
}

// ZenFlow's settings for a test run: the trainers' defaults (ZF_DEFAULTS) but for these;
// U = ZF_AUTO: auto U (spec 6)
static inline ZfConfig zf_settings(double k, int U, int S, int W, int overlap, int accumulate) {
    ZfConfig z = ZF_DEFAULTS;
    z.topk = k;
    z.update_interval = U;
    z.select_interval = S;
    z.warmup = W;
    z.overlap = overlap;
    z.accumulate = accumulate;
    return z;
}

// ZenFlow's other modes, ZF_MODE_ADAMW and ZF_MODE_OFFLOAD, with the defaults
static inline ZfConfig zf_mode_config(ZfMode mode) {
    ZfConfig z = ZF_DEFAULTS;
    z.mode = mode;
    return z;
}

// the case's AdamW settings (betas and eps as the reference's and the trainers' defaults)
static inline ZfAdamHyper case_hyper(const CaseSettings* s) { return ZfAdamHyper{s->lr, 0.9f, 0.95f, 1e-8f, s->wd}; }

// step t of a ZenFlow run, in the order of the trainers' main loops; returns its loss
static inline float zf_train_step(GPT2* model, DataLoader* loader, ZenFlow* zf, int t, ZfAdamHyper h) {
    dataloader_next_batch(loader);
    gpt2_forward(model, loader->inputs, loader->targets, loader->B, loader->T);
    zf_before_backward(zf, t);
    gpt2_backward(model);
    zf_step(zf, t, h);
    return model->mean_loss;
}

// ----------------------------------------------------------------------------
// against the reference

// The debug batch (state.bin) against the reference: our loss within 1e-5 (absolute), and
// each of the 16 gradient tensors within 1e-5 relative to the tensor. `grads`: ours, every
// parameter's, in file order.
static inline void check_debug_batch(const GPT2DebugState* st, const GPT2Config* c, float loss, const float* grads) {
    double dloss = fabs((double)loss - st->loss);
    printf("  loss      ours %.7f  ref %.7f  |err| %.3e  %s\n", loss, st->loss, dloss, dloss <= 1e-5 ? "ok" : "FAIL");
    check(dloss <= 1e-5, "loss differs by more than 1e-5");
    size_t sizes[NUM_PARAMETER_TENSORS], offset = 0;
    gpt2_param_sizes(c, sizes);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        compare_tensor(gpt2_tensor_names[i], grads + offset, st->grads + offset, sizes[i], 1e-5);
        offset += sizes[i];
    }
}

// Our loss of every step against the case's losses.txt: as many steps, each within 2e-5
// (absolute: both sides sum in fp32, in different orders, so they differ by a few ulps of
// losses of 4 to 11), up to step `up_to` (the first near-tie, see compare_selections; INT_MAX:
// every step). Prints every step with `verbose`, then one line with `indent`.
static inline void check_losses(const char* dir, const std::vector<float>& ours, int up_to, int verbose,
                                const char* indent) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/losses.txt", dir);
    std::vector<float> ref = read_losses(path);
    check(ref.size() == ours.size(), "the reference has a different number of steps");
    double worst = 0.0;
    int compared = 0;
    for (size_t t = 0; t < ref.size() && t < ours.size() && (int)t <= up_to; t++) {
        double err = fabs((double)ours[t] - ref[t]);
        if (worse_error(err, worst)) { worst = err; }
        if (verbose) { printf("%sstep %2zu  loss ours %.6f  ref %.6f  |err| %.2e\n", indent, t, ours[t], ref[t], err); }
        compared++;
    }
    printf("%slosses: %d of %zu steps compared, max |err| vs reference %.3e  %s\n", indent, compared, ref.size(),
           worst, worst <= 2e-5 ? "ok" : "FAIL");
    check(worst <= 2e-5, "the losses differ from the reference by more than 2e-5");
}

// ----------------------------------------------------------------------------
// ZenFlow's selections

// one selection of one matrix: its columns and (reference only) all column scores
typedef struct {
    int t, matrix;
    std::vector<int> cols;
    std::vector<double> scores;
} Selection;

static inline std::vector<Selection> read_selections(const char* path) {
    std::vector<Selection> out;
    FILE* fp = fopenCheck(path, "r");
    static char line[1 << 20];
    while (fgets(line, sizeof(line), fp) != NULL) {
        char* colon = strchr(line, ':');
        if (colon == NULL || line[0] == '#') { continue; }
        if (strncmp(line, "sel ", 4) == 0) {
            Selection s;
            char name[64];
            int n;
            if (sscanf(line, "sel %d %d %63s %d", &s.t, &s.matrix, name, &n) != 4) {
                fatal("%s: bad line %s", path, line);
            }
            char* p = colon + 1;
            for (int i = 0; i < n; i++) { s.cols.push_back((int)strtol(p, &p, 10)); }
            out.push_back(s);
        } else if (strncmp(line, "scores ", 7) == 0 && !out.empty()) {
            char* p = colon + 1;
            char* end;
            for (double x = strtod(p, &end); end != p; x = strtod(p, &end)) {
                out.back().scores.push_back(x);
                p = end;
            }
        }
    }
    fclose(fp);
    return out;
}

// a new empty file named after a mkstemp template such as "/tmp/zf_XXXXXX" (filled in place)
static inline void make_temp_file(char* path_template) {
    int fd = mkstemp(path_template);
    if (fd < 0) { fatal("mkstemp %s failed", path_template); }
    close(fd);
}

// auto U (spec 6): the windows a run closed, from the "win <t> <n>" lines of a selections file
// or a trainer's selection log: (t, n) in step order
static inline std::vector<std::pair<int, int>> read_windows(const char* path) {
    std::vector<std::pair<int, int>> out;
    FILE* fp = fopenCheck(path, "r");
    static char line[1 << 20];
    while (fgets(line, sizeof(line), fp) != NULL) {
        int t, n;
        if (strncmp(line, "win ", 4) == 0) {
            if (sscanf(line, "win %d %d", &t, &n) != 2) { fatal("%s: bad line %s", path, line); }
            out.push_back({t, n});
        }
    }
    fclose(fp);
    return out;
}

// auto U: (t, n) of the longest window in `windows` (the first of equal ones; {1, 1} if none)
static inline std::pair<int, int> longest_window(const std::vector<std::pair<int, int>>& windows) {
    std::pair<int, int> longest = {1, 1};
    for (auto& w : windows) { longest = w.second > longest.second ? w : longest; }
    return longest;
}

// auto U: the windows of our log against the reference's, those that closed up to step
// `up_to` (a selection near-tie sends the runs different ways after it). Checks and prints
// one line when the reference has any.
static inline void check_windows(const char* ours_path, const char* ref_path, int up_to, const char* indent) {
    std::vector<std::pair<int, int>> ours = read_windows(ours_path), ref = read_windows(ref_path);
    if (ref.empty()) {  // the reference closed no auto U window (fixed U logs none): nor may we
        check(ours.empty(), "our run logged auto U windows where the reference closed none");
        return;
    }
    auto upto = [up_to](std::vector<std::pair<int, int>> w) {
        w.erase(std::remove_if(w.begin(), w.end(), [up_to](std::pair<int, int> x) { return x.first > up_to; }), w.end());
        return w;
    };
    ours = upto(ours);
    ref = upto(ref);
    int same = ours == ref;
    printf("%sauto U windows: %zu closed (", indent, ref.size());
    for (size_t i = 0; i < ref.size(); i++) { printf("%s%d", i ? " " : "", ref[i].second); }
    printf(" steps)  %s\n", same ? "identical" : "DIFFER");
    if (!same) {
        printf("%s  ours:", indent);
        for (auto& w : ours) { printf(" %d:%d", w.first, w.second); }
        printf("\n%s  reference:", indent);
        for (auto& w : ref) { printf(" %d:%d", w.first, w.second); }
        printf("\n");
    }
    check(same, "auto U closed other windows than the reference");
}

// Compares our selections with the reference's (which holds every column's score).
// Column scores come from two different summation orders, so where two scores sit within
// rounding of each other at the selection boundary the two sides may legitimately pick
// different columns. That case (the columns differ only where the reference scores are
// within near_tie, relative, of the boundary score) is detected and reported as NEAR-TIE
// with the scores; the runs then follow different paths, so losses are comparable only up to
// that step. Any other difference in the selection is a failure (printed, and the comparison
// stops): a column past the matrix or far from the boundary, a column listed twice (the
// reference's boundary column would be missing, and it is always "within" the band), and the
// right columns in another order (both sides list them ascending, spec 4.2). test_zenflow
// checks this checker on made-up selections. Lines are printed with `indent`. Returns 1 if
// identical or near-ties only; *first_tie = the first near-tie's step, else INT_MAX;
// *events = the selection events compared (entries of matrix 0).
static inline int compare_selections(const std::vector<Selection>& ours, const std::vector<Selection>& ref,
                                     double near_tie, const char* indent, int* first_tie, int* events) {
    int ok = ours.size() == ref.size();
    *first_tie = INT_MAX;
    *events = 0;
    if (!ok) { printf("%sselections: %zu ours vs %zu reference\n", indent, ours.size(), ref.size()); }
    for (size_t i = 0; ok && i < ref.size(); i++) {
        const Selection &a = ours[i], &r = ref[i];
        if (a.t != r.t || a.matrix != r.matrix) {
            ok = 0;
            break;
        }
        *events += r.matrix == 0;
        if (a.cols == r.cols) { continue; }
        // which columns differ, and is each within rounding of the boundary score?
        std::vector<double> sorted = r.scores;
        std::sort(sorted.begin(), sorted.end(), std::greater<double>());
        size_t n = r.cols.size();
        double boundary = n > 0 && n <= sorted.size() ? sorted[n - 1] : 0.0;
        std::set<int> sa(a.cols.begin(), a.cols.end()), sr(r.cols.begin(), r.cols.end());
        // the same number of distinct columns, and not merely the same ones in another order
        int near = a.cols.size() == n && sa.size() == n && sa != sr && r.scores.size() > 0;
        // (a column past the matrix is never a near-tie: it is a bug)
        auto within = [&](int j) {
            return j >= 0 && (size_t)j < r.scores.size() && fabs(r.scores[j] - boundary) <= near_tie * boundary;
        };
        for (int j : sa) {
            if (!sr.count(j)) { near = near && within(j); }
        }
        for (int j : sr) {
            if (!sa.count(j)) { near = near && within(j); }
        }
        if (near) {
            printf("%sNEAR-TIE at step %d, matrix %d: the columns differ only where reference scores are "
                   "within %.0e of the boundary score %.9g; losses compared up to this step\n",
                   indent, r.t, r.matrix, near_tie, boundary);
            *first_tie = std::min(*first_tie, r.t);
        } else {
            printf("%sselection differs at step %d, matrix %d (not a near-tie)\n", indent, r.t, r.matrix);
            ok = 0;
        }
    }
    return ok;
}

// compare_selections, then its summary line and one check (failing with `what`); returns the
// first near-tie's step (losses after it are not comparable), or INT_MAX
static inline int check_selections(const std::vector<Selection>& ours, const std::vector<Selection>& ref,
                                   double near_tie, const char* indent, const char* what) {
    int first_tie, events;
    int ok = compare_selections(ours, ref, near_tie, indent, &first_tie, &events);
    printf("%sselections: %d events x %d matrices  %s\n", indent, events,
           events > 0 ? (int)ref.size() / events : 0, ok ? "identical" : "DIFFER");
    check(ok, what);
    return first_tie;
}

// The parameters at the end of the run, after the drain (spec 4.7: the window update still
// pending is applied), against the reference's final.bin: the largest |ours - ref| of every
// tensor within lr / 10. Absolute, in units of lr, because AdamW moves each element by about
// lr per step whatever its gradient's size: where a gradient is rounding noise (the key bias,
// whose gradient is 0 in exact arithmetic, since the softmax does not see a constant added to
// every key), the two sides' steps differ by a fraction of lr (measured: up to lr / 74 in the
// fixed cases, each time in qkvb, and lr / 35 over 124 random cases), while a window update
// left out moves the CPU's columns by about lr. Not after a near-tie: the runs went apart.
#define ZF_FINAL_TOL_LR 0.1
static inline void check_final_params(const char* dir, const std::vector<float>& ours, int tie_step,
                                      const char* indent) {
    if (tie_step != INT_MAX) {
        printf("%sfinal parameters: not compared (NEAR-TIE at step %d)\n", indent, tie_step);
        g_near_ties++;
        return;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/final.bin", dir);
    GPT2Config c;
    float* ref = gpt2_read_model(path, &c);
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_param_sizes(&c, sizes);
    check(gpt2_num_params(&c) == ours.size(), "the reference's final model has another size");
    double worst = 0.0, lr = read_zf_case(dir).s.lr;
    int worst_tensor = 0;
    size_t at = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS && at + sizes[i] <= ours.size(); at += sizes[i], i++) {
        double max_abs, max_ref;
        max_errors(ours.data() + at, ref + at, sizes[i], &max_abs, &max_ref);
        if (worse_error(max_abs, worst)) { worst = max_abs, worst_tensor = i; }
    }
    free(ref);
    int ok = worst <= ZF_FINAL_TOL_LR * lr;
    printf("%sfinal parameters (after the drain): max |err| %.2e = lr / %.0f (%s)  %s\n", indent, worst,
           lr / worst, gpt2_tensor_names[worst_tensor], ok ? "ok" : "FAIL");
    check(ok, "the parameters after the drain differ from the reference's by more than lr / 10");
}

// A ZenFlow run against its case's reference (case dir `dir`): the selections of our log at
// sel_path against selections.txt (near-ties within near_tie, see compare_selections), auto
// U's windows, the loss of every step up to the first near-tie (check_losses), and the
// parameters after the drain (check_final_params). Prints with `indent`; removes sel_path.
static inline void check_zf_against_reference(const char* dir, const char* sel_path, const std::vector<float>& ours,
                                              const std::vector<float>& final_params, double near_tie,
                                              const char* indent) {
    char ref_sel[4096];
    snprintf(ref_sel, sizeof(ref_sel), "%s/selections.txt", dir);
    int tie_step = check_selections(read_selections(sel_path), read_selections(ref_sel), near_tie, indent,
                                    "ZenFlow selections differ from the reference");
    check_windows(sel_path, ref_sel, tie_step, indent);
    remove(sel_path);
    check_losses(dir, ours, tie_step, 0, indent);
    check_final_params(dir, final_params, tie_step, indent);
}

// ----------------------------------------------------------------------------
// exact invariants

static inline int bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// a run with .losses and .params (std::vector<float>): both bitwise equal
template <typename Run>
static inline int same_run(const Run& a, const Run& b) {
    return bitwise_equal(a.losses, b.losses) && bitwise_equal(a.params, b.params);
}

// prints "what ... bitwise|DIFFERS" (what padded to `width`) and checks it
static inline void report_same(int same, const char* what, int width) {
    printf("  %-*s %s\n", width, what, same ? "bitwise" : "DIFFERS");
    char msg[320];
    snprintf(msg, sizeof(msg), "%s: not bitwise equal", what);
    check(same, msg);
}
