/*
The parts of the training loop both trainers share: the run's data and first lines, and what
happens between two training steps, in this order: the val loss (-v, -m), a sample (-s, -g),
the checkpoint of a stop (SIGINT, SIGTERM), the checkpoint (-n into -o). The trainer hands
over its model as a few small functions (TrainerModel), ZenFlow as the OptimizerState of
llmc/checkpoint.h.

  train_print_run(cfg, num_parameters, &args, "threads=2");
  TrainData data;  train_data_open(&data, &args, cfg);
  for (step = 0; step <= steps; step++) {
      between_steps(&run, &args, step, &data, model, opt, cfg, &rng);
      if (step == steps) { break; }
      <the training step>
  }
*/
#ifndef LLMC_TRAIN_LOOP_H
#define LLMC_TRAIN_LOOP_H

#include "checkpoint.h"
#include "tokenizer.h"

// the run's data: the token shards (-i, -j) and the tokenizer the samples print with (-k)
typedef struct {
    DataLoader train, val;
    Tokenizer tokenizer;
} TrainData;

// a trainer's model, as the work between steps uses it (ctx: the trainer's GPT2)
typedef struct {
    void* ctx;
    // a forward pass over inputs and targets (B, T): its mean loss
    float (*loss)(void* ctx, const int* inputs, const int* targets, int B, int T);
    // a forward pass over tokens (1, t): the (V) probabilities of token t, on the host
    // (scratch: V floats the trainer may write them to)
    const float* (*next_probs)(void* ctx, const int* tokens, int t, float* scratch);
    // (num_parameters) the parameters on the host, every update applied that is due
    const float* (*params)(void* ctx);
    // before a stop exits: no CPU job is still running and every span is in the trace
    void (*stop)(void* ctx);
    // before the last step's evaluation and checkpoint: every update handed to the CPU in the
    // parameters (spec 4.7: a window still open is not applied)
    void (*finish)(void* ctx);
} TrainerModel;

// the model's line and the run's (device: what the trainer adds, e.g. "threads=2")
static inline void train_print_run(const GPT2Config* c, size_t num_parameters, const TrainArgs* a,
                                   const char* device) {
    printf("[GPT-2] L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, %zu parameters (%.1f M)\n", c->num_layers, c->channels,
           c->num_heads, c->vocab_size, c->padded_vocab_size, c->max_seq_len, num_parameters, num_parameters / 1e6);
    printf("[run] B=%d T=%d steps=%d lr=%g wd=%g %s\n", a->B, a->T, a->steps, a->lr, a->weight_decay, device);
}

// The files the flags name for writing (-tr, -zl, -zd, -zm) are the run's own: not a file it reads
// (-e, -i, -j, -k), not another flag's, not one of -o's (main.log, lock, the checkpoints). A slip
// there would write over data, a model or a checkpoint; it is refused before anything is written.
static inline void train_check_outputs(const TrainArgs* a, const TrainData* d) {
    const char* const flags[4] = {"-tr", "-zl", "-zd", "-zm"};
    const char* const paths[4] = {a->trace_path, train_args_zflag(a, 'l'), train_args_zflag(a, 'd'),
                                  train_args_zflag(a, 'm')};
    std::vector<std::pair<const char*, const char*>> taken;  // (flag, file): what the run reads, then writes
    GPT2Config shape;
    if (!gpt2_parse_model_spec(a->model_spec, &shape)) { taken.push_back({"-e", a->model_spec}); }  // (else a shape)
    if (access(a->tokenizer_path, F_OK) == 0) { taken.push_back({"-k", a->tokenizer_path}); }  // (else not read)
    for (size_t i = 0; i < d->train.glob_result.gl_pathc; i++) { taken.push_back({"-i", d->train.glob_result.gl_pathv[i]}); }
    for (size_t i = 0; i < d->val.glob_result.gl_pathc; i++) { taken.push_back({"-j", d->val.glob_result.gl_pathv[i]}); }
    for (int i = 0; i < 4; i++) {
        if (paths[i] == NULL) { continue; }
        for (const auto& other : taken) {
            if (same_file(paths[i], other.second)) {
                fatal("flag %s: %s is also %s's file (hint: name a file of its own)", flags[i], paths[i], other.first);
            }
        }
        char dir[PATH_MAX];  // where it is written: a link's target
        if (realpath(paths[i], dir) == NULL) { snprintf(dir, sizeof(dir), "%s", paths[i]); }
        const char* slash = strrchr(dir, '/');
        char name[PATH_MAX];
        snprintf(name, sizeof(name), "%s", slash != NULL ? slash + 1 : dir);
        if (a->output_dir != NULL && same_file(dirname(dir), a->output_dir) && run_dir_owns(name)) {
            fatal("flag %s: %s is a file of -o's run (hint: name a file of its own)", flags[i], paths[i]);
        }
        taken.push_back({flags[i], paths[i]});
    }
}

// opens -i, -j and -k for this model (its vocabulary; T no longer than its maxT). With -v 0
// the val data is never read, so -j need not name any.
static inline void train_data_open(TrainData* d, const TrainArgs* a, const GPT2Config* c) {
    if (a->T > c->max_seq_len) { fatal("flag -t: T=%d exceeds the model's maxT=%d", a->T, c->max_seq_len); }
    dataloader_init(&d->train, a->train_pattern, a->B, a->T, c->vocab_size);
    memset(&d->val, 0, sizeof(d->val));
    if (a->val_every > 0) { dataloader_init(&d->val, a->val_pattern, a->B, a->T, c->vocab_size); }
    tokenizer_init(&d->tokenizer, a->tokenizer_path);
    tokenizer_match_model(&d->tokenizer, a->tokenizer_path, c->vocab_size);
    train_args_notes(a, c->max_seq_len, dataloader_batches(&d->val));
    train_check_outputs(a, d);
}

static inline void train_data_free(TrainData* d) {
    tokenizer_free(&d->tokenizer);
    dataloader_free(&d->train);
    dataloader_free(&d->val);
}

// the mean loss of the first n val batches, printed and logged (main.log's tel: line); a
// signal stops it at the next batch, and nothing is printed
static inline void train_evaluate(const RunDir* run, DataLoader* val, int n, int step, int steps, TrainerModel m) {
    dataloader_reset(val);
    float val_loss = 0.0f;
    for (int i = 0; i < n; i++) {
        if (stop_requested()) { return; }
        dataloader_next_batch(val);
        val_loss += m.loss(m.ctx, val->inputs, val->targets, val->B, val->T);
    }
    val_loss /= n;
    printf("step %d/%d | val loss %f\n", step, steps, val_loss);
    if (run->log != NULL) {
        fprintf(run->log, "s:%d tel:%f\n", step, val_loss);
        fflush(run->log);
    }
}

// prints n tokens drawn after <|endoftext|> (at most maxT - 1), one coin each from *rng as
// llm.c draws them; a signal stops it at the next token (one before it starts: nothing is printed;
// a resume draws the whole sample)
static inline void train_sample(const Tokenizer* tok, const GPT2Config* c, int n, uint64_t* rng, TrainerModel m) {
    if (stop_requested()) { return; }
    int eot = tok->init_ok ? tok->eot_token : c->vocab_size - 1;
    int len = n + 1 < c->max_seq_len ? n + 1 : c->max_seq_len;
    int* tokens = (int*)mallocCheck(len * sizeof(int));
    float* scratch = (float*)mallocCheck(c->vocab_size * sizeof(float));
    tokens[0] = eot;
    printf("generating:\n---\n");
    for (int t = 1; t < len && !stop_requested(); t++) {
        const float* probs = m.next_probs(m.ctx, tokens, t, scratch);
        tokens[t] = sample_mult(probs, c->vocab_size, random_f32(rng));
        tokenizer_print(tok, tokens[t]);
        fflush(stdout);
    }
    printf("\n---\n");
    free(scratch);
    free(tokens);
}

// every `every` steps, and at the last one (every 0: never)
static inline int train_due(int every, int step, int last) { return every > 0 && (step % every == 0 || last); }

// Before step `step` + 1 (and after the last): what -v, -s and -n ask for this step, and a
// stop's checkpoint. A resumed run continues with the step after its checkpoint, whose
// evaluation, sample and checkpoint came before it was written (unless a stop wrote it
// before them: then they are done now, run_dir_fresh).
static inline void between_steps(RunDir* run, const TrainArgs* a, int step, TrainData* d, TrainerModel m,
                                 OptimizerState opt, const GPT2Config* c, uint64_t* rng) {
    int last = step == a->steps, fresh = run_dir_fresh(run, step);
    if (last) { m.finish(m.ctx); }
    uint64_t rng_at_step = *rng;  // what a stop saves: the sample of this step is then redone
    if (fresh && train_due(a->val_every, step, last)) {
        train_evaluate(run, &d->val, a->val_batches, step, a->steps, m);
    }
    if (fresh && (step > 0 || last) && train_due(a->sample_every, step, last)) {  // (as llm.c: -x 0 samples)
        train_sample(&d->tokenizer, c, a->gen_tokens, rng, m);
    }
    if (stop_requested()) {  // checkpoint, exit 128 + signal
        const float* params = run->dir != NULL ? m.params(m.ctx) : NULL;
        m.stop(m.ctx);
        run_dir_stop(run, step, c, params, opt, &d->train, rng_at_step);
    }
    // -n's checkpoint; at the step of a stop's checkpoint this run resumed from, that one stays
    // (a resume from it does the same evaluation and sample again)
    if (fresh && run_dir_writes_at(run, step) && train_due(a->checkpoint_every, step, last)) {
        write_checkpoint(run, step, 1, c, m.params(m.ctx), opt, &d->train, *rng);
    }
}

#endif  // LLMC_TRAIN_LOOP_H
