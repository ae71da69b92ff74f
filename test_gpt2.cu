/*
Tests the CUDA trainer against the PyTorch reference (scripts/gpt2_reference.py), with the
same case directories and the same checks as the CPU test (dev/test_gpt2.cpp):

  ./test_gpt2cu <case dir> [<case dir> ...]

Each case directory is written by scripts/make_test_refs.sh and holds:
  model.bin   the model (llm.c v3 file)          state.bin   one batch: x, y, logits, loss, grads
  train.bin   the token shard to train on        losses.txt  the reference loss of every step
  case.txt    "B T steps lr wd" of the run

Checks, each printed with its numbers:
  1. logits, loss and all 16 gradient tensors of the debug batch (and that the padded rows
     of the wte gradient are exactly 0);
  2. the AdamW loss trajectory over `steps` steps on consecutive batches of train.bin;
  3. determinism: two runs of 3 steps from the same start give bitwise-equal losses and
     parameters (no atomics, one cuBLASLt algorithm per shape).
TF32 is OFF for all of them (plain fp32 matmuls); the TF32 errors are printed for
information only, since TF32 is the trainer's default.

Tolerances: the CPU test's, unchanged (errors are "relative to the tensor": max |ours - ref|
/ max |ref|): logits 1e-5, loss 1e-5 (absolute), gradients 1e-4, trajectory 1e-4 (absolute,
per step). A GPU does not need more. With TF32 off, cuBLAS rounds every product and sum in
fp32 like the CPU; only the order of the sums differs (tiles, split-K), which gives errors
of the same size as the CPU's own differences to PyTorch. expf/logf/tanhf/sqrtf on the GPU
(without --use_fast_math) are within 2 ulp, about 1e-7 relative, far below 1e-5. AdamW
is bitwise spec 3.1 (built with -fmad=false). If the test fails by a small factor, look for
a bug before widening a tolerance: the CPU test passes with the same numbers.

Without a CUDA device the test prints "test_gpt2cu: SKIPPED (...)" and exits 0.
Any failure makes the exit code 1. The last line is "test_gpt2cu: N passed, M failed".
*/
#define TESTING
#include "train_gpt2.cu"

static int g_passed = 0, g_failed = 0;

static void check(int ok, const char* what) {
    if (ok) {
        g_passed++;
    } else {
        g_failed++;
        printf("  FAIL: %s\n", what);
    }
}

// max |a - b| and max |b| over n elements
static void max_errors(const float* a, const float* b, size_t n, double* max_abs, double* max_ref) {
    *max_abs = 0.0;
    *max_ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= *max_abs)) { *max_abs = d; }  // also catches nan
        double r = fabs((double)b[i]);
        if (r > *max_ref) { *max_ref = r; }
    }
}

static double relative_error(const float* ours, const float* ref, size_t n) {
    double max_abs, max_ref;
    max_errors(ours, ref, n, &max_abs, &max_ref);
    return max_ref > 0.0 ? max_abs / max_ref : max_abs;
}

static int compare_tensor(const char* name, const float* ours, const float* ref, size_t n, double tol) {
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

typedef struct {
    int B, T, steps;
    float lr, wd;
} CaseSettings;

static CaseSettings read_case(const char* dir) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/case.txt", dir);
    FILE* fp = fopen_check(path, "r");
    CaseSettings s;
    if (fscanf(fp, "%d %d %d %f %f", &s.B, &s.T, &s.steps, &s.lr, &s.wd) != 5) {
        zf_fail("%s: expected 'B T steps lr wd'", path);
    }
    fclose(fp);
    return s;
}

// reads the reference losses: lines "<t> <loss>", '#' lines are comments
static int read_losses(const char* path, float* losses, int max_steps) {
    FILE* fp = fopen_check(path, "r");
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof(line), fp) != NULL) {
        if (line[0] == '#' || line[0] == '\n') { continue; }
        int t;
        double loss;
        if (sscanf(line, "%d %lf", &t, &loss) != 2 || t != n || n >= max_steps) {
            zf_fail("%s: bad line '%s' (expected step %d)", path, line, n);
        }
        losses[n++] = (float)loss;
    }
    fclose(fp);
    return n;
}

static void test_case(const char* dir) {
    char path[4096];
    CaseSettings s = read_case(dir);
    printf("== case %s (B=%d T=%d, %d steps, lr %g, wd %g)\n", dir, s.B, s.T, s.steps, s.lr, s.wd);
    snprintf(path, sizeof(path), "%s/model.bin", dir);
    GPT2 model;
    gpt2_build(&model, path, 0);
    const GPT2Config* c = &model.config;
    printf("  model L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, %zu parameters\n", c->num_layers, c->channels,
           c->num_heads, c->vocab_size, c->padded_vocab_size, c->max_seq_len, model.num_parameters);

    // 1. one batch: logits (a forward without targets keeps them), loss, gradients
    snprintf(path, sizeof(path), "%s/state.bin", dir);
    GPT2DebugState st = gpt2_read_debug_state(path, c);
    int B = st.B, T = st.T, V = c->vocab_size;
    size_t n_logits = (size_t)B * T * V;
    float* logits = (float*)malloc_check(n_logits * sizeof(float));
    gpt2_forward(&model, st.inputs, NULL, B, T);
    gpt2_copy_logits_to_host(&model, logits);
    compare_tensor("logits", logits, st.logits, n_logits, 1e-5);
    gpt2_forward(&model, st.inputs, st.targets, B, T);
    double dloss = fabs((double)model.mean_loss - st.loss);
    printf("  loss      ours %.7f  ref %.7f  |err| %.3e  %s\n", model.mean_loss, st.loss, dloss,
           dloss <= 1e-5 ? "ok" : "FAIL");
    check(dloss <= 1e-5, "loss differs by more than 1e-5");
    gpt2_zero_grad(&model);
    gpt2_backward(&model);
    float* grads = (float*)malloc_check(model.num_parameters * sizeof(float));
    gpt2_copy_grads_to_host(&model, grads);
    size_t sizes[NUM_PARAMETER_TENSORS], offset = 0;
    gpt2_param_sizes(c, sizes);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        compare_tensor(gpt2_tensor_names[i], grads + offset, st.grads + offset, sizes[i], 1e-4);
        offset += sizes[i];
    }
    // the padded vocabulary rows take no part in the loss: their gradient is exactly 0
    int pad_zero = 1;
    for (size_t i = (size_t)V * c->channels; i < sizes[0]; i++) { pad_zero = pad_zero && grads[i] == 0.0f; }
    printf("  wte rows %d..%d (padding): gradient %s\n", V, c->padded_vocab_size - 1,
           pad_zero ? "exactly 0  ok" : "NOT 0  FAIL");
    check(pad_zero, "the padded rows of the wte gradient are not 0");

    // for information: the same batch with TF32 matmuls (the trainer's default)
    zf_cublas_set_tf32(1);
    gpt2_forward(&model, st.inputs, NULL, B, T);
    gpt2_copy_logits_to_host(&model, logits);
    double tf32_logits = relative_error(logits, st.logits, n_logits);
    gpt2_forward(&model, st.inputs, st.targets, B, T);
    printf("  (info) with TF32: logits rel %.3e, loss |err| %.3e (not checked)\n", tf32_logits,
           fabs((double)model.mean_loss - st.loss));
    zf_cublas_set_tf32(0);
    free(grads);
    free(logits);
    gpt2_free_debug_state(&st);

    // 2. the AdamW trajectory on consecutive batches (the model is still the file's: no
    // update ran above; its AdamW moments are still 0)
    float* ref = (float*)malloc_check((size_t)s.steps * sizeof(float));
    snprintf(path, sizeof(path), "%s/losses.txt", dir);
    int n = read_losses(path, ref, s.steps);
    check(n == s.steps, "losses.txt has fewer steps than case.txt says");
    snprintf(path, sizeof(path), "%s/train.bin", dir);
    DataLoader loader;
    dataloader_init(&loader, path, s.B, s.T, V);
    ZfAdamHyper hyper = {s.lr, 0.9f, 0.95f, 1e-8f, s.wd};
    double worst = 0.0;
    for (int t = 0; t < n; t++) {
        dataloader_next_batch(&loader);
        gpt2_forward(&model, loader.inputs, loader.targets, s.B, s.T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model);
        gpt2_update(&model, hyper, t + 1);
        double err = fabs((double)model.mean_loss - ref[t]);
        if (!(err <= worst)) { worst = err; }
        printf("  step %2d  loss ours %.6f  ref %.6f  |err| %.2e\n", t, model.mean_loss, ref[t], err);
    }
    printf("  trajectory: %d steps, max |err| %.3e  %s\n", n, worst, worst <= 1e-4 ? "ok" : "FAIL");
    check(worst <= 1e-4, "loss trajectory differs by more than 1e-4");
    free(ref);
    dataloader_free(&loader);
    gpt2_free(&model);
}

// ----------------------------------------------------------------------------
// determinism: the same run twice gives the same bits

// `steps` training steps from the case's model on its train.bin; losses (steps) and the
// final parameters (num_parameters) to the host
static void run_steps(const char* dir, int steps, float* losses, float** params_out, size_t* n_params) {
    char path[4096];
    CaseSettings s = read_case(dir);
    snprintf(path, sizeof(path), "%s/model.bin", dir);
    GPT2 model;
    gpt2_build(&model, path, 0);
    snprintf(path, sizeof(path), "%s/train.bin", dir);
    DataLoader loader;
    dataloader_init(&loader, path, s.B, s.T, model.config.vocab_size);
    ZfAdamHyper hyper = {s.lr, 0.9f, 0.95f, 1e-8f, s.wd};
    for (int t = 0; t < steps; t++) {
        dataloader_next_batch(&loader);
        gpt2_forward(&model, loader.inputs, loader.targets, s.B, s.T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model);
        gpt2_update(&model, hyper, t + 1);
        losses[t] = model.mean_loss;
    }
    *n_params = model.num_parameters;
    *params_out = (float*)malloc_check(model.num_parameters * sizeof(float));
    gpt2_copy_params_to_host(&model, *params_out);
    dataloader_free(&loader);
    gpt2_free(&model);
}

static void test_determinism(const char* dir) {
    printf("== determinism: two runs of 3 steps on %s\n", dir);
    const int steps = 3;
    float losses1[steps], losses2[steps];
    float *params1 = NULL, *params2 = NULL;
    size_t n1 = 0, n2 = 0;
    run_steps(dir, steps, losses1, &params1, &n1);
    run_steps(dir, steps, losses2, &params2, &n2);
    int same_losses = memcmp(losses1, losses2, sizeof(losses1)) == 0;
    size_t first_diff = n1;
    for (size_t i = 0; i < n1 && n1 == n2; i++) {
        if (memcmp(&params1[i], &params2[i], sizeof(float)) != 0) {
            first_diff = i;
            break;
        }
    }
    int same_params = n1 == n2 && first_diff == n1;
    printf("  losses %.7f %.7f %.7f: %s\n", losses1[0], losses1[1], losses1[2],
           same_losses ? "bitwise equal" : "DIFFER");
    if (same_params) {
        printf("  parameters (%zu): bitwise equal\n", n1);
    } else {
        printf("  parameters DIFFER, first at element %zu\n", first_diff);
    }
    check(same_losses && same_params, "two identical runs differ (a non-deterministic kernel?)");
    free(params1);
    free(params2);
}

int main(int argc, char* argv[]) {
    char reason[256];
    if (!zf_cuda_device_available(reason, sizeof(reason))) {
        printf("test_gpt2cu: SKIPPED (no CUDA device: %s)\n", reason);
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: %s <case dir> [<case dir> ...] (see scripts/make_test_refs.sh)\n", argv[0]);
        return 2;
    }
    cudaDeviceProp prop = zf_cuda_init_device();
    printf("device: %s, compute capability %d.%d, %d SMs\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
    zf_cublas_init(0);  // TF32 off: plain fp32 matmuls
    for (int i = 1; i < argc; i++) { test_case(argv[i]); }
    test_determinism(argv[1]);
    zf_cublas_free();
    printf("test_gpt2cu: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
