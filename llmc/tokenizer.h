/*
GPT-2 tokenizer, decode only (llm.c's gpt2_tokenizer.bin): enough to print samples.
Encoding happens once, in Python, when the data is prepared (scripts/bpe.py).

File: 256-int header (magic 20240328, version 2, vocab size, id of <|endoftext|>), then
for every id a length byte and that many bytes. A token is a byte string, not necessarily
valid UTF-8 on its own (a multi-byte character can be split across tokens). Version 1, llm.c's
first format, has no <|endoftext|> field: it is read as llm.c reads it, GPT-2's 50257 tokens
with <|endoftext|> = 50256.
*/
#ifndef LLMC_TOKENIZER_H
#define LLMC_TOKENIZER_H

#include <ctype.h>
#include <stdint.h>

#include "utils.h"

#define TOKENIZER_MAGIC 20240328
#define TOKENIZER_VERSION 2

typedef struct {
    int vocab_size;
    int eot_token;       // <|endoftext|>
    char** token_table;  // (vocab_size) NUL-terminated byte strings
    int init_ok;
} Tokenizer;

// loads the tokenizer; if the file cannot be opened, sampling prints ids instead (init_ok = 0)
static inline void tokenizer_init(Tokenizer* tok, const char* path) {
    memset(tok, 0, sizeof(*tok));
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) {
        printf("note: tokenizer %s %s, samples will be printed as token ids (hint: run `make data`, "
               "or name one with -k)\n", path, errno == ENOENT ? "not found" : strerror(errno));
        return;
    }
    check_not_directory(fileno(fp), path);
    int header[256];
    freadCheck(header, sizeof(int), 256, fp, path);
    check_magic(path, header[0], TOKENIZER_MAGIC, "not a tokenizer file");
    if (header[1] == 1) {  // GPT-2's tokens, the <|endoftext|> id implied
        if (header[2] != 50257) {
            fatal("%s: a version 1 tokenizer has GPT-2's 50257 tokens, this one %d (hint: write it "
                    "again as version 2, which names its <|endoftext|>)", path, header[2]);
        }
        header[3] = 50256;
    } else if (header[1] != TOKENIZER_VERSION) {
        fatal("%s: tokenizer version %d, expected 1 or %d (hint: -k takes llm.c's tokenizer file, "
                "such as data/gpt2_tokenizer.bin from `make data`)", path, header[1], TOKENIZER_VERSION);
    }
    if (header[2] < 1 || header[2] > 1 << 20 || header[3] < 0 || header[3] >= header[2]) {
        fatal("%s: implausible vocab size %d / eot id %d", path, header[2], header[3]);
    }
    tok->vocab_size = header[2];
    tok->eot_token = header[3];
    tok->token_table = (char**)callocCheck((size_t)tok->vocab_size, sizeof(char*));
    for (int i = 0; i < tok->vocab_size; i++) {
        unsigned char length;
        freadCheck(&length, 1, 1, fp, path);
        if (length == 0) { fatal("%s: token %d has length 0 (byte %ld; the file is damaged)", path, i, ftell(fp) - 1); }
        tok->token_table[i] = (char*)mallocCheck(length + 1);
        freadCheck(tok->token_table[i], 1, length, fp, path);
        tok->token_table[i][length] = '\0';
    }
    if (fgetc(fp) != EOF) {
        fatal("%s: trailing bytes after token %d, the last of the header's %d, at byte %ld (hint: the "
                "header's vocab size is wrong, or the file is damaged)", path, tok->vocab_size - 1,
                tok->vocab_size, ftell(fp) - 1);
    }
    fclose(fp);
    tok->init_ok = 1;
}

static inline const char* tokenizer_decode(const Tokenizer* tok, uint32_t id) {
    if (!tok->init_ok) { return NULL; }
    if (id >= (uint32_t)tok->vocab_size) { return NULL; }
    return tok->token_table[id];
}

// prints a token's bytes, skipping lone control bytes that would garble the terminal
static inline void tokenizer_print(const Tokenizer* tok, uint32_t id) {
    const char* piece = tokenizer_decode(tok, id);
    if (piece == NULL) {
        printf("<%u>", id);
        return;
    }
    if (piece[1] == '\0') {
        unsigned char byte = (unsigned char)piece[0];
        if (!(isprint(byte) || isspace(byte) || byte >= 0x80)) { return; }
    }
    printf("%s", piece);
}

static inline void tokenizer_free(Tokenizer* tok) {
    if (tok->init_ok) {
        for (int i = 0; i < tok->vocab_size; i++) { free(tok->token_table[i]); }
        free(tok->token_table);
    }
    tok->init_ok = 0;
}

// A tokenizer of another vocabulary does not belong to the model (GPT-2's, found at the
// default path, beside a model of 97 tokens): its ids would decode to the wrong text, and its
// <|endoftext|> may lie past the model's vocabulary, which would stop the run at its first
// sample, before the last checkpoint. Such a tokenizer is put aside: samples print token ids.
static inline void tokenizer_match_model(Tokenizer* tok, const char* path, int model_vocab) {
    if (!tok->init_ok || tok->vocab_size == model_vocab) { return; }
    printf("note: tokenizer %s has %d tokens, the model %d: samples will be printed as token ids "
           "(hint: -k names the tokenizer the training data was encoded with)\n",
           path, tok->vocab_size, model_vocab);
    tokenizer_free(tok);
}

#endif  // LLMC_TOKENIZER_H
