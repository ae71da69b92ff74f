/*
The data loader: token shards (llm.c's format, uint16 ids) read in order, B*T+1 tokens at
a time. The exact walk is in docs/formats.md and is the same in the PyTorch reference,
so that both see the same batches:

  inputs  = tokens[p     : p+B*T]       (B, T)
  targets = tokens[p + 1 : p+B*T+1]     (B, T), the next token of each input
  p += B*T; when the next batch would not fit, move to the next shard (wrapping), p = 0.

A shard is loaded whole and checked each time it is loaded (every shard once at the start):
header, size, and every id < V. Bad data is caught when it is read, not when it produces a
nan three hours later.
*/
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <glob.h>
#include <stdint.h>

#include "utils.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1

typedef struct {
    int B, T, vocab_size;
    glob_t glob_result;    // the shard paths, sorted
    size_t shard_index;    // which shard is loaded
    size_t position;       // p: index of the first token of the next batch
    uint16_t* tokens;      // (num_tokens) of the loaded shard
    size_t num_tokens;
    int* inputs;           // (B, T)
    int* targets;          // (B, T)
} DataLoader;

// reads and validates a shard into loader->tokens
static inline void dataloader_load_shard(DataLoader* loader, size_t index) {
    const char* path = loader->glob_result.gl_pathv[index];
    FILE* fp = fopenCheck(path, "rb");  // first: it names a directory or a path that cannot be read
    long long file_size = file_size_bytes(path);
    if (file_size < 1024) {
        fatal("%s: too short to be a token shard (%lld bytes, the header alone is 1024)", path,
                file_size);
    }
    int header[256];
    freadCheck(header, sizeof(int), 256, fp, path);
    check_magic(path, header[0], SHARD_MAGIC, "not a token shard; make one with scripts/prepare_tinyshakespeare.py");
    if (header[1] != SHARD_VERSION) {
        fatal("%s: shard version %d, expected %d (hint: make it again with "
                "scripts/prepare_tinyshakespeare.py or scripts/prepare_text.py)", path, header[1], SHARD_VERSION);
    }
    long long n = header[2];
    if (n < 0 || file_size != 1024 + 2 * n) {
        fatal("%s: header says %lld tokens but the file holds %lld bytes of tokens (hint: "
                "truncated or corrupt file)",
                path, n, file_size - 1024);
    }
    size_t need = (size_t)loader->B * loader->T + 1;
    if ((size_t)n < need) {
        fatal("%s: %lld tokens, but one batch needs B*T+1 = %zu (hint: lower -b or -t, or give the "
                "split more text)", path, n, need);
    }
    free(loader->tokens);
    loader->tokens = (uint16_t*)mallocCheck((size_t)n * sizeof(uint16_t));
    freadCheck(loader->tokens, sizeof(uint16_t), (size_t)n, fp, path);
    fclose(fp);
    for (long long i = 0; i < n; i++) {
        if (loader->tokens[i] >= loader->vocab_size) {
            fatal("%s: token %lld has id %d, but the model's vocabulary has %d ids (hint: the "
                    "data was tokenized for another vocabulary)",
                    path, i, loader->tokens[i], loader->vocab_size);
        }
    }
    loader->num_tokens = (size_t)n;
    loader->shard_index = index;
    loader->position = 0;
}

static inline void dataloader_init(DataLoader* loader, const char* pattern, int B, int T,
                                   int vocab_size) {
    memset(loader, 0, sizeof(*loader));
    loader->B = B;
    loader->T = T;
    loader->vocab_size = vocab_size;
    int status = glob(pattern, 0, NULL, &loader->glob_result);
    if (status != 0 || loader->glob_result.gl_pathc == 0) {
        fatal("%s: no token shard matches this path (hint: check the path; `make data` prepares "
                "tinyshakespeare, scripts/prepare_text.py your own text)",
                pattern);
    }
    // check every shard up front, so a bad one fails now rather than mid-run
    for (size_t i = loader->glob_result.gl_pathc; i-- > 0;) { dataloader_load_shard(loader, i); }
    loader->inputs = (int*)mallocCheck((size_t)B * T * sizeof(int));
    loader->targets = (int*)mallocCheck((size_t)B * T * sizeof(int));
}

static inline void dataloader_reset(DataLoader* loader) {
    if (loader->shard_index != 0) { dataloader_load_shard(loader, 0); }
    loader->position = 0;
}

// fills loader->inputs and loader->targets with the next batch
static inline void dataloader_next_batch(DataLoader* loader) {
    size_t BT = (size_t)loader->B * loader->T;
    const uint16_t* tok = loader->tokens + loader->position;
    for (size_t i = 0; i < BT; i++) {
        loader->inputs[i] = tok[i];
        loader->targets[i] = tok[i + 1];
    }
    loader->position += BT;
    if (loader->position + BT + 1 > loader->num_tokens) {
        size_t next = (loader->shard_index + 1) % loader->glob_result.gl_pathc;
        if (next != loader->shard_index) {
            dataloader_load_shard(loader, next);
        } else {
            loader->position = 0;
        }
    }
}

// how many batches one pass over all the shards gives (a shard of N tokens gives (N - 1) / (B*T))
static inline size_t dataloader_batches(const DataLoader* loader) {
    size_t n = 0, BT = (size_t)loader->B * loader->T;
    for (size_t i = 0; i < loader->glob_result.gl_pathc; i++) {
        long long tokens = (file_size_bytes(loader->glob_result.gl_pathv[i]) - 1024) / 2;
        n += tokens > 0 ? (size_t)(tokens - 1) / BT : 0;
    }
    return n;
}

static inline void dataloader_free(DataLoader* loader) {
    free(loader->tokens);
    free(loader->inputs);
    free(loader->targets);
    globfree(&loader->glob_result);
}

#endif  // LLMC_DATALOADER_H
