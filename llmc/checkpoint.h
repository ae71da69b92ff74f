/*
Checkpoints (-n, -y), shared by both trainers: the model file (llm.c-compatible: the working
copy of the parameters) plus a state file with everything else a run needs to continue bit
for bit: the step, the data position, the sampling RNG, and the optimizer's state (the
trainers pass ZenFlow's, zenflow.h). Both files are written to a temporary name, synced and
renamed, model first, so a kill at any moment leaves the previous checkpoint intact.
*/
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <dirent.h>
#include <signal.h>

#include "dataloader.h"
#include "gpt2_file.h"

#define STATE_MAGIC 20241130
#define STATE_VERSION 1

// the optimizer's part of the state file, written after the header and read back in order
typedef struct {
    void* ctx;
    void (*save)(void* ctx, FILE* fp, const char* path);
    void (*load)(void* ctx, FILE* fp, const char* path);
} OptimizerState;

// params: the working copy of the parameters, on the host
static inline void write_checkpoint(const char* dir, int step, const GPT2Config* config,
                                    const float* params, OptimizerState opt, const DataLoader* loader,
                                    uint64_t rng) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof(path), "%s/model_%08d.bin", dir, step);
    gpt2_write_model(path, config, params);
    snprintf(path, sizeof(path), "%s/state_%08d.bin", dir, step);
    FILE* fp = atomic_write_open(path, tmp, sizeof(tmp));
    int header[256] = {0};
    header[0] = STATE_MAGIC;
    header[1] = STATE_VERSION;
    header[2] = step;
    header[3] = loader->B;
    header[4] = loader->T;
    header[5] = (int)loader->shard_index;
    fwriteCheck(header, sizeof(int), 256, fp, tmp);
    uint64_t words[2] = {(uint64_t)loader->position, rng};
    fwriteCheck(words, sizeof(uint64_t), 2, fp, tmp);
    opt.save(opt.ctx, fp, tmp);
    atomic_write_commit(fp, tmp, path);
    printf("wrote checkpoint %s/{model,state}_%08d.bin\n", dir, step);
}

// the step of the newest complete checkpoint in dir (state and model file), or -1
static inline int newest_checkpoint(const char* dir) {
    DIR* d = opendir(dir);
    if (d == NULL) { return -1; }
    int best = -1;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int step;
        char tail;
        if (sscanf(e->d_name, "state_%8d.bi%c", &step, &tail) == 2 && tail == 'n' &&
            strlen(e->d_name) == 18 && step > best) {
            char model_path[4096];
            snprintf(model_path, sizeof(model_path), "%s/model_%08d.bin", dir, step);
            if (file_size_bytes(model_path) > 0) { best = step; }
        }
    }
    closedir(d);
    return best;
}

// restores what write_checkpoint wrote (the model was already built from its model file)
static inline void read_checkpoint_state(const char* dir, int step, OptimizerState opt,
                                         DataLoader* loader, uint64_t* rng) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/state_%08d.bin", dir, step);
    FILE* fp = fopenCheck(path, "rb");
    int header[256];
    freadCheck(header, sizeof(int), 256, fp, path);
    if (header[0] != STATE_MAGIC || header[1] != STATE_VERSION) {
        fatal("%s: not a training state file (magic %d version %d)", path, header[0], header[1]);
    }
    if (header[2] != step || header[3] != loader->B || header[4] != loader->T) {
        fatal("%s: written with B=%d T=%d, this run has B=%d T=%d (hint: resume with the same "
                "-b and -t)", path, header[3], header[4], loader->B, loader->T);
    }
    uint64_t words[2];
    freadCheck(words, sizeof(uint64_t), 2, fp, path);
    if (header[5] < 0 || (size_t)header[5] >= loader->glob_result.gl_pathc) {
        fatal("%s: data position refers to shard %d, but -i matches %zu shards", path,
                header[5], loader->glob_result.gl_pathc);
    }
    dataloader_load_shard(loader, (size_t)header[5]);
    if (words[0] + (size_t)loader->B * loader->T + 1 > loader->num_tokens) {
        fatal("%s: data position %llu is past the shard's end", path, (unsigned long long)words[0]);
    }
    loader->position = (size_t)words[0];
    *rng = words[1];
    opt.load(opt.ctx, fp, path);
    if (fgetc(fp) != EOF) { fatal("%s: trailing bytes (corrupt file?)", path); }
    fclose(fp);
}

// Ctrl-C (SIGINT), the same in both trainers: the handler only sets a flag; the training loop
// checks it at each step boundary, lets the optimizer's threads finish, and calls
// exit_interrupted, which writes a checkpoint if -n asked for them (`params`: the working
// copy on the host) and exits 130 with one line.
static volatile sig_atomic_t g_interrupted = 0;
static void on_sigint(int) { g_interrupted = 1; }
static inline void catch_sigint(void) { signal(SIGINT, on_sigint); }

static inline void exit_interrupted(const char* dir, int step, int checkpoint_every, const GPT2Config* config,
                                    const float* params, OptimizerState opt, const DataLoader* loader, uint64_t rng) {
    if (checkpoint_every > 0) { write_checkpoint(dir, step, config, params, opt, loader, rng); }
    fprintf(stderr, "error: interrupted (SIGINT) before step %d%s\n", step + 1,
            checkpoint_every > 0 ? "; resume with -y 1" : "");
    exit(130);
}

#endif  // LLMC_CHECKPOINT_H
