/*
Tests the CPU trainer against the PyTorch reference (scripts/gpt2_reference.py).

  ./test_gpt2cpu <case dir> [<case dir> ...]

Each case directory is written by dev/test/make_refs.sh and holds:
  model.bin   the model (llm.c v3 file)          state.bin   one batch: x, y, logits, loss, grads
  train.bin   the token shard to train on        losses.txt  the reference loss of every step
  case.txt    "B T steps lr wd" of the run

Checks, each printed with its numbers:
  1. logits, loss and all 16 gradient tensors of the debug batch;
  2. the AdamW loss trajectory over `steps` steps on consecutive batches of train.bin;
  3. the data loader on synthetic shards (order, targets, wrap-around, several shards);
  4. the random init (-e d2c64h4) follows GPT-2's recipe, and GPT-2's four sizes;
     tokenizer files of version 2 and llm.c's version 1, and one of another vocabulary;
  5. the loss and gradients do not depend on the number of threads.

Tolerances (fp32 against fp32; the two sides sum in different orders, so they agree to a
few ulps times the depth of the sums, not bitwise). Errors are "relative to the tensor":
max |ours - ref| / max |ref|, so tiny entries of a tensor do not dominate.
  logits 1e-5, gradients 1e-5 (relative to the tensor);
  loss 1e-5 and every step of the trajectory 2e-5 (absolute, on losses of 4 to 11).
What we measure is about 30x smaller for the logits (3e-7) and 11x for the gradients (<= 9e-7):
a few fp32 ulps, and a few ulps of the loss (<= 4e-6 on 10.8, where one ulp is 1e-6). The
bounds leave room for another compiler's rounding, while a real bug (a wrong constant, a
missed term) shows up as 1e-3 or more.
Any failure makes the exit code 1.
*/
#define TESTING
#include "../../train_gpt2.cpp"

#include "test_common.h"

static void test_case(const char* dir) {
    char path[4096];
    CaseSettings s = read_case(dir);
    printf("== case %s (B=%d T=%d, %d steps, lr %g, wd %g)\n", dir, s.B, s.T, s.steps, s.lr, s.wd);
    GPT2 model;
    DataLoader loader;
    case_open(dir, &s, &model, &loader);
    const GPT2Config* c = &model.config;
    printf("  model L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, %zu parameters\n", c->num_layers,
           c->channels, c->num_heads, c->vocab_size, c->padded_vocab_size, c->max_seq_len,
           model.num_parameters);

    // 1. one batch: logits, loss, gradients
    snprintf(path, sizeof(path), "%s/state.bin", dir);
    GPT2DebugState st = gpt2_read_debug_state(path, c);
    int B = st.B, T = st.T, V = c->vocab_size, Vp = c->padded_vocab_size;
    gpt2_forward(&model, st.inputs, st.targets, B, T);
    float* logits = (float*)mallocCheck((size_t)B * T * V * sizeof(float));
    for (size_t bt = 0; bt < (size_t)B * T; bt++) {  // drop the padded columns
        memcpy(logits + bt * V, model.acts.logits + bt * Vp, V * sizeof(float));
    }
    compare_tensor("logits", logits, st.logits, (size_t)B * T * V, 1e-5);
    gpt2_zero_grad(&model);
    gpt2_backward(&model);
    check_debug_batch(&st, c, model.mean_loss, model.grads_memory);
    free(logits);
    gpt2_free_debug_state(&st);

    // 2. the AdamW trajectory on consecutive batches
    // plain AdamW is ZenFlow's adamw mode (k = 1: the "GPU" owns every column)
    ZenFlow zf;
    CpuDevice device;
    zf_cpu_init(&zf, &device, &model, zf_mode_config(ZF_MODE_ADAMW));
    std::vector<float> losses;
    for (int t = 0; t < s.steps; t++) {
        dataloader_next_batch(&loader);
        gpt2_forward(&model, loader.inputs, loader.targets, s.B, s.T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model);
        zf_step(&zf, t, case_hyper(&s));
        losses.push_back(model.mean_loss);
    }
    check_losses(dir, losses, INT_MAX, 1, "  ");
    zf_cpu_free(&zf, &device);
    dataloader_free(&loader);
    gpt2_free(&model);
}

// ----------------------------------------------------------------------------
// data loader on synthetic shards

static void write_shard(const char* path, const uint16_t* tokens, int n) {
    int header[256] = {0};
    header[0] = SHARD_MAGIC;
    header[1] = SHARD_VERSION;
    header[2] = n;
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(int), 256, fp, path);
    fwriteCheck(tokens, sizeof(uint16_t), n, fp, path);
    fclose(fp);
}

static void test_dataloader(void) {
    printf("== data loader on synthetic shards\n");
    char dir[] = "/tmp/zf_loader_XXXXXX";
    if (mkdtemp(dir) == NULL) { fatal("mkdtemp failed"); }
    char a[4200], b[4200], pattern[4200];
    snprintf(a, sizeof(a), "%s/shard_000.bin", dir);
    snprintf(b, sizeof(b), "%s/shard_001.bin", dir);
    snprintf(pattern, sizeof(pattern), "%s/shard_*.bin", dir);
    // shard a holds 0..24, shard b holds 100..116: token = its own position + offset
    uint16_t ta[25], tb[17];
    for (int i = 0; i < 25; i++) { ta[i] = (uint16_t)i; }
    for (int i = 0; i < 17; i++) { tb[i] = (uint16_t)(100 + i); }
    write_shard(b, tb, 17);  // written first: order must come from the names, not the disk
    write_shard(a, ta, 25);
    DataLoader loader;
    const int B = 2, T = 4;  // 8 tokens a batch, 9 read
    dataloader_init(&loader, pattern, B, T, 200);
    // expected first inputs of consecutive batches: a at 0, 8 and (16+9 = 25 fits) 16, then
    // (24+9 > 25: next shard) b at 0, (8+9 = 17 fits) b at 8
    int expected_first[5] = {0, 8, 16, 100, 108};
    int ok = 1;
    for (int k = 0; k < 5; k++) {
        dataloader_next_batch(&loader);
        for (int i = 0; i < B * T; i++) {
            int want = expected_first[k] + i;
            if (loader.inputs[i] != want || loader.targets[i] != want + 1) { ok = 0; }
        }
        printf("  batch %d starts at token %d (want %d)\n", k, loader.inputs[0], expected_first[k]);
    }
    dataloader_next_batch(&loader);
    ok = ok && loader.inputs[0] == 0;
    printf("  batch 5 wraps to token %d (want 0)\n", loader.inputs[0]);
    dataloader_reset(&loader);
    dataloader_next_batch(&loader);
    ok = ok && loader.inputs[0] == 0 && loader.targets[B * T - 1] == B * T;
    printf("  after reset: starts at %d (want 0)  %s\n", loader.inputs[0], ok ? "ok" : "FAIL");
    check(ok, "data loader batches are not the documented walk");
    dataloader_free(&loader);
    remove(a);
    remove(b);
    rmdir(dir);
}

// ----------------------------------------------------------------------------
// tokenizer files (llmc/tokenizer.h): version 2, llm.c's version 1, and one that does not
// belong to the model

static void write_tokenizer(const char* path, int version, int vocab, int eot) {
    int header[256] = {0};
    header[0] = TOKENIZER_MAGIC;
    header[1] = version;
    header[2] = vocab;
    header[3] = eot;  // (version 1 has no such field: llm.c left it 0)
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(int), 256, fp, path);
    for (int i = 0; i < vocab; i++) {
        char piece[16];
        unsigned char len = (unsigned char)snprintf(piece, sizeof(piece), "<%d>", i);
        fwriteCheck(&len, 1, 1, fp, path);
        fwriteCheck(piece, 1, len, fp, path);
    }
    fclose(fp);
}

static void test_tokenizer_files(void) {
    printf("== tokenizer files\n");
    char dir[] = "/tmp/zf_tokenizer_XXXXXX";
    if (mkdtemp(dir) == NULL) { fatal("mkdtemp failed"); }
    char v1[4200], v2[4200];
    snprintf(v1, sizeof(v1), "%s/v1.bin", dir);
    snprintf(v2, sizeof(v2), "%s/v2.bin", dir);
    write_tokenizer(v1, 1, 50257, 0);
    write_tokenizer(v2, 2, 97, 42);
    Tokenizer a, b;
    tokenizer_init(&a, v1);
    tokenizer_init(&b, v2);
    const char *a_eot = tokenizer_decode(&a, 50256), *b_last = tokenizer_decode(&b, 96);
    int ok1 = a.init_ok && a.vocab_size == 50257 && a.eot_token == 50256 && a_eot && strcmp(a_eot, "<50256>") == 0;
    int ok2 = b.init_ok && b.vocab_size == 97 && b.eot_token == 42 && b_last && strcmp(b_last, "<96>") == 0 &&
              tokenizer_decode(&b, 97) == NULL;
    printf("  version 1: %d tokens, <|endoftext|> %d (want 50257, 50256)  %s\n", a.vocab_size, a.eot_token,
           ok1 ? "ok" : "FAIL");
    printf("  version 2: %d tokens, <|endoftext|> %d (want 97, 42), id 97 decodes to nothing  %s\n", b.vocab_size,
           b.eot_token, ok2 ? "ok" : "FAIL");
    tokenizer_match_model(&b, v2, 97);   // the model's own: kept
    int kept = b.init_ok;
    tokenizer_match_model(&a, v1, 97);   // GPT-2's beside a 97-token model: put aside
    int aside = !a.init_ok && tokenizer_decode(&a, 0) == NULL;
    printf("  beside a 97-token model: the 97-token one kept %s, GPT-2's put aside %s\n", kept ? "yes" : "NO",
           aside ? "yes" : "NO");
    check(ok1 && ok2 && kept && aside, "tokenizer files are not read as llmc/tokenizer.h says");
    tokenizer_free(&a);
    tokenizer_free(&b);
    remove(v1);
    remove(v2);
    rmdir(dir);
}

// ----------------------------------------------------------------------------
// the random init of `-e d<L>...` (llmc/gpt2_file.h), which both trainers use. It draws other
// numbers than the PyTorch reference, so the check is of the recipe: exact values where it
// says so, and for every matrix the sample mean, standard deviation and the share within one
// and two standard deviations, each within 5 standard errors of the normal law's (the seed
// is fixed, so this is as deterministic as every other check: the 5 says how far a correct
// init may lie, and a wrong std by 5% or a uniform law lies far outside).

static void test_random_init(void) {
    printf("== random init of d2c64h4 (GPT-2's recipe)\n");
    GPT2Config c;
    gpt2_parse_model_spec("d2c64h4", &c);
    float* params = gpt2_random_init(&c, 1337);
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_param_sizes(&c, sizes);
    const double residual_std = 0.02 / sqrt(2.0 * c.num_layers);
    int ok = 1;
    const float* p = params;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const char* name = gpt2_tensor_names[i];
        if (gpt2_tensor_shape(&c, i).is_matrix) {
            // wte: its V rows are drawn, the padding rows up to Vp are 0
            size_t n = i == 0 ? (size_t)c.vocab_size * c.channels : sizes[i];
            int pad_ok = 1;
            for (size_t j = n; j < sizes[i]; j++) { pad_ok = pad_ok && p[j] == 0.0f; }
            double want = (i == 6 || i == 12) ? residual_std : 0.02;  // attprojw, fcprojw
            double sum = 0.0, sq = 0.0;
            size_t in1 = 0, in2 = 0;
            for (size_t j = 0; j < n; j++) {
                sum += p[j];
                sq += (double)p[j] * p[j];
                in1 += fabs(p[j]) < want;
                in2 += fabs(p[j]) < 2.0 * want;
            }
            double mean = sum / n, sd = sqrt(sq / n - mean * mean);
            double f1 = (double)in1 / n, f2 = (double)in2 / n, p1 = 0.682689, p2 = 0.954500;
            int good = pad_ok && fabs(mean) <= 5.0 * want / sqrt((double)n) &&
                       fabs(sd / want - 1.0) <= 5.0 / sqrt(2.0 * n) &&
                       fabs(f1 - p1) <= 5.0 * sqrt(p1 * (1 - p1) / n) && fabs(f2 - p2) <= 5.0 * sqrt(p2 * (1 - p2) / n);
            printf("  %-8s n %8zu  mean %+.2e  std %.5f (want %.5f)  within 1 std %.4f, 2 std %.4f%s  %s\n", name, n,
                   mean, sd, want, f1, f2, i == 0 ? (pad_ok ? "  padding rows 0" : "  PADDING ROWS NOT 0") : "",
                   good ? "ok" : "FAIL");
            ok = ok && good;
        } else {
            float want = (i == 2 || i == 8 || i == 14) ? 1.0f : 0.0f;  // LayerNorm gains, else biases
            int good = 1;
            for (size_t j = 0; j < sizes[i]; j++) { good = good && p[j] == want; }
            printf("  %-8s n %8zu  all %g  %s\n", name, sizes[i], want, good ? "ok" : "FAIL");
            ok = ok && good;
        }
        p += sizes[i];
    }
    size_t bytes = gpt2_num_params(&c) * sizeof(float);
    float* again = gpt2_random_init(&c, 1337);
    float* other = gpt2_random_init(&c, 1338);
    int same = memcmp(params, again, bytes) == 0, differs = memcmp(params, other, bytes) != 0;
    printf("  seed 1337 twice: %s; seed 1338: %s\n", same ? "bitwise equal" : "DIFFERENT",
           differs ? "other numbers" : "THE SAME NUMBERS");
    check(ok && same && differs, "the random init is not GPT-2's recipe, or not a function of the seed");
    free(params);
    free(again);
    free(other);
    // GPT-2's four sizes: the shapes, and the parameter count from them (d12's is llm.c's
    // 124475904, with wte padded to 50304 rows), counted here tensor by tensor
    const char* specs[4] = {"d12", "d24", "d36", "d48"};
    const int want_c[4] = {768, 1024, 1280, 1600}, want_nh[4] = {12, 16, 20, 25};
    int sizes_ok = 1;
    for (int k = 0; k < 4; k++) {
        GPT2Config g;
        gpt2_parse_model_spec(specs[k], &g);
        size_t L = g.num_layers, C = g.channels;
        size_t count = 50304 * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C;
        int good = g.channels == want_c[k] && g.num_heads == want_nh[k] && g.vocab_size == 50257 &&
                   g.padded_vocab_size == 50304 && g.max_seq_len == 1024 && gpt2_num_params(&g) == count &&
                   (k != 0 || count == 124475904);
        printf("  %s: L %d C %d NH %d, %zu parameters  %s\n", specs[k], g.num_layers, g.channels, g.num_heads,
               gpt2_num_params(&g), good ? "ok" : "FAIL");
        sizes_ok = sizes_ok && good;
    }
    check(sizes_ok, "GPT-2's sizes d12..d48 have the wrong shape or parameter count");
}

// the CPU kernels must not depend on the thread count (the trainer's determinism promise)
static void test_thread_independence(const char* dir) {
    printf("== bitwise independence of the thread count\n");
#ifndef _OPENMP
    printf("  SKIPPED (built without OpenMP: one thread only)\n");
    return;
#endif
    char path[4096];
    GPT2 model;
    case_model(dir, &model);
    snprintf(path, sizeof(path), "%s/state.bin", dir);
    GPT2DebugState st = gpt2_read_debug_state(path, &model.config);
    float* first = (float*)mallocCheck(model.num_parameters * sizeof(float));
    float loss1 = 0.0f;
    int max_threads = omp_get_max_threads(), ok = 1;
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        gpt2_forward(&model, st.inputs, st.targets, st.B, st.T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model);
        if (threads == 1) {
            memcpy(first, model.grads_memory, model.num_parameters * sizeof(float));
            loss1 = model.mean_loss;
        } else {
            int same = memcmp(first, model.grads_memory, model.num_parameters * sizeof(float)) == 0 &&
                       loss1 == model.mean_loss;
            printf("  %d threads vs 1: loss and gradients %s\n", threads,
                   same ? "bitwise equal" : "DIFFER");
            ok = ok && same;
        }
    }
    omp_set_num_threads(max_threads);
    check(ok, "results depend on the number of threads");
    free(first);
    gpt2_free_debug_state(&st);
    gpt2_free(&model);
}

// the checkers themselves: a nan anywhere is the largest error, not only in the last place
static void test_checker_nan(void) {
    printf("== the tensor checker and a nan\n");
    const float ours[3] = {NAN, 0.5f, 0.25f}, ref[3] = {0.0f, 0.5f, 0.0f};
    double max_abs, max_ref;
    max_errors(ours, ref, 3, &max_abs, &max_ref);
    printf("  max |err| of {nan, 0, 0.25}: %g  %s\n", max_abs, isnan(max_abs) ? "ok" : "FAIL");
    check(isnan(max_abs), "max_errors forgets a nan that a later finite error follows");
}

// the loss stays finite however far below the max the target's logit is
static void test_far_loss(void) {
    printf("== the loss of a target far below the max\n");
    float probs[8], loss;
    int target = 1;
    softmax_crossentropy_forward(probs, &loss, FAR_LOGITS, &target, 1, 1, 4, 8);
    check_far_loss(loss);
}

int main(int argc, char* argv[]) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <case dir> [<case dir> ...] (see dev/test/make_refs.sh)\n",
                argv[0]);
        return 2;
    }
    test_dataloader();
    test_random_init();
    test_tokenizer_files();
    test_far_loss();
    test_checker_nan();
    for (int i = 1; i < argc; i++) { test_case(argv[i]); }
    test_thread_independence(argv[1]);
    return test_summary("test_gpt2cpu");
}
