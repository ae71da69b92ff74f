/*
GPT-2's parameter layout and its files, shared by the CPU and CUDA trainers.

The 16 parameter tensors live in ONE contiguous fp32 buffer, in llm.c's order (see
docs/formats.md). Gradients and optimizer moments mirror that layout, so "the k-th
element of the model" means the same thing in every buffer, on every device and in every
file. That is what makes offloading and checkpointing simple: a range of elements is a
range of bytes.

Model files are llm.c's version 3 (fp32): a 256-int header, then the buffer as it is.
The model may also start from a random init: gpt2_parse_model_spec understands "d12" etc.
*/
#ifndef LLMC_GPT2_FILE_H
#define LLMC_GPT2_FILE_H

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "hashed_file.h"
#include "utils.h"

#define GPT2_MODEL_MAGIC 20240326
#define GPT2_MODEL_VERSION_FP32 3
#define GPT2_STATE_MAGIC 20240327
#define GPT2_STATE_VERSION 2
#define NUM_PARAMETER_TENSORS 16

typedef struct {
    int max_seq_len;        // maxT, e.g. 1024
    int vocab_size;         // V, e.g. 50257
    int padded_vocab_size;  // Vp, V rounded up to a multiple of 128, e.g. 50304
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
} GPT2Config;

static const char* const gpt2_tensor_names[NUM_PARAMETER_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

// The shape of tensor i as (count, OC, IC): `count` stacked matrices of OC rows and IC
// columns for weight matrices (count = L for per-layer tensors, 1 for wte and wpe), or
// (count, 1, n) for vectors. ZenFlow's column selection works per matrix (spec section 1).
typedef struct {
    size_t count, rows, cols;
    int is_matrix;
} GPT2TensorShape;

static inline GPT2TensorShape gpt2_tensor_shape(const GPT2Config* c, int i) {
    size_t L = c->num_layers, C = c->channels;
    switch (i) {
        case 0: return {1, (size_t)c->padded_vocab_size, C, 1};  // wte (Vp, C)
        case 1: return {1, (size_t)c->max_seq_len, C, 1};        // wpe (maxT, C)
        case 2: case 3: case 8: case 9: case 7: case 13:
            return {L, 1, C, 0};                                   // (L, C)
        case 4: return {L, 3 * C, C, 1};                           // qkvw (L, 3C, C)
        case 5: return {L, 1, 3 * C, 0};                           // qkvb (L, 3C)
        case 6: return {L, C, C, 1};                               // attprojw (L, C, C)
        case 10: return {L, 4 * C, C, 1};                          // fcw (L, 4C, C)
        case 11: return {L, 1, 4 * C, 0};                          // fcb (L, 4C)
        case 12: return {L, C, 4 * C, 1};                          // fcprojw (L, C, 4C)
        default: return {1, 1, C, 0};                              // lnfw, lnfb (C)
    }
}

static inline void gpt2_param_sizes(const GPT2Config* c, size_t sizes[NUM_PARAMETER_TENSORS]) {
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        GPT2TensorShape s = gpt2_tensor_shape(c, i);
        sizes[i] = s.count * s.rows * s.cols;
    }
}

// the first parameter tensor holding a nan or inf (NULL if none): for the message that stops
// a run whose loss went non-finite. `params` is the whole parameter array, on the host.
static inline const char* gpt2_first_nonfinite_tensor(const GPT2Config* c, const float* params) {
    size_t sizes[NUM_PARAMETER_TENSORS], offset = 0;
    gpt2_param_sizes(c, sizes);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        for (size_t j = 0; j < sizes[i]; j++) {
            if (!isfinite(params[offset + j])) { return gpt2_tensor_names[i]; }
        }
        offset += sizes[i];
    }
    return NULL;
}

// the 16 parameter tensors (or their gradients) as pointers into one buffer in file order,
// as both trainers and llm.c keep them
typedef struct {
    float* wte;       // (Vp, C)
    float* wpe;       // (maxT, C)
    float* ln1w;      // (L, C)
    float* ln1b;      // (L, C)
    float* qkvw;      // (L, 3C, C)
    float* qkvb;      // (L, 3C)
    float* attprojw;  // (L, C, C)
    float* attprojb;  // (L, C)
    float* ln2w;      // (L, C)
    float* ln2b;      // (L, C)
    float* fcw;       // (L, 4C, C)
    float* fcb;       // (L, 4C)
    float* fcprojw;   // (L, C, 4C)
    float* fcprojb;   // (L, C)
    float* lnfw;      // (C)
    float* lnfb;      // (C)
} ParameterTensors;

// points the 16 tensors into one buffer, in file order
static inline void point_parameters(ParameterTensors* p, const GPT2Config* c, float* memory) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_param_sizes(c, sizes);
    float** ptrs[NUM_PARAMETER_TENSORS] = {
        &p->wte,  &p->wpe,  &p->ln1w, &p->ln1b, &p->qkvw,    &p->qkvb,    &p->attprojw, &p->attprojb,
        &p->ln2w, &p->ln2b, &p->fcw,  &p->fcb,  &p->fcprojw, &p->fcprojb, &p->lnfw,     &p->lnfb};
    point_tensors(ptrs, sizes, NUM_PARAMETER_TENSORS, memory);
}

// A non-finite training loss stops the run, naming the first non-finite parameter tensor
// (or saying that all are finite: the forward pass overflowed)
static inline void gpt2_fatal_loss(int step, float loss, const GPT2Config* c, const float* params) {
    const char* bad = gpt2_first_nonfinite_tensor(c, params);
    fatal("step %d: the loss is %f; %s%s (hint: lower the learning rate -l)", step, loss,
          bad ? "first non-finite parameter tensor: " : "all parameters are finite, the forward pass overflowed",
          bad ? bad : "");
}

// One warning line, the first time the loss is above 2 ln(V), twice the loss of a uniform guess
// over the vocabulary: the run is diverging, though it may stay finite for long (-l 10)
static inline void gpt2_warn_high_loss(int step, float loss, int vocab_size) {
    static int warned = 0;
    float uniform = logf((float)vocab_size);
    if (!warned && loss > 2.0f * uniform) {
        warned = 1;
        fprintf(stderr, "warning: step %d: the loss %g is above twice a uniform guess's, 2 ln(V) = %.2f: training is "
                "diverging (hint: lower the learning rate -l)\n", step, loss, 2.0f * uniform);
    }
}

static inline size_t gpt2_num_params(const GPT2Config* c) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_param_sizes(c, sizes);
    size_t n = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { n += sizes[i]; }
    return n;
}

static inline int gpt2_pad_vocab(int V) { return (V + 127) / 128 * 128; }

// checks that a config makes sense before anything is allocated for it
static inline void gpt2_validate_config(const GPT2Config* c, const char* where) {
    if (c->num_layers < 1 || c->num_layers > 1024 || c->channels < 1 || c->channels > 65536 ||
        c->num_heads < 1 || c->max_seq_len < 1 || c->max_seq_len > 1048576 || c->vocab_size < 1 ||
        c->vocab_size > 65536) {
        fatal("%s: implausible model shape L=%d C=%d NH=%d V=%d maxT=%d (hint: the bounds are L <= 1024, "
                "C <= 65536, V <= 65536 as token ids are uint16, maxT <= 1048576, each at least 1)", where,
                c->num_layers, c->channels, c->num_heads, c->vocab_size, c->max_seq_len);
    }
    if (c->channels % c->num_heads != 0) {
        fatal("%s: channels C=%d is not divisible by heads NH=%d", where, c->channels,
                c->num_heads);
    }
    if (c->padded_vocab_size != gpt2_pad_vocab(c->vocab_size)) {
        fatal("%s: padded vocab %d is not V=%d rounded up to a multiple of 128 (%d)", where,
                c->padded_vocab_size, c->vocab_size, gpt2_pad_vocab(c->vocab_size));
    }
}

// ----------------------------------------------------------------------------
// model checkpoint files (llm.c v3, fp32)

// reads the header of a model file and checks it against the file's size
static inline GPT2Config gpt2_read_model_header(FILE* fp, const char* path) {
    int header[256];
    long long file_size = file_size_bytes(path);
    if (file_size < (long long)sizeof(header)) {
        fatal("%s: too short to be a model file (%lld bytes, the header alone is 1024)", path,
                file_size);
    }
    freadCheck(header, sizeof(int), 256, fp, path);
    check_magic(path, header[0], GPT2_MODEL_MAGIC, "not an llm.c model file; make one with scripts/gpt2_reference.py init");
    if (header[1] != GPT2_MODEL_VERSION_FP32) {
        fatal("%s: model version %d, expected %d (fp32) (hint: version 5 is llm.c's bf16 file; "
                "use the fp32 gpt2_124M.bin)",
                path, header[1], GPT2_MODEL_VERSION_FP32);
    }
    GPT2Config c;
    c.max_seq_len = header[2];
    c.vocab_size = header[3];
    c.num_layers = header[4];
    c.num_heads = header[5];
    c.channels = header[6];
    c.padded_vocab_size = header[7];
    gpt2_validate_config(&c, path);
    long long expected = (long long)sizeof(header) + (long long)gpt2_num_params(&c) * 4;
    if (file_size != expected) {
        fatal("%s: size %lld bytes, but the header's shape needs %lld (hint: truncated or "
                "corrupt file)",
                path, file_size, expected);
    }
    return c;
}

// The last model file gpt2_read_model read: its size and checksum as it was read, so that a
// resume compares them with the checkpoint's manifest (llmc/checkpoint.h) without a second pass
// over the file. A resume says first which file it expects (expect_path, expected); if that file
// reads otherwise, it is marked damaged and returned unchecked, and the resume falls back to an
// older checkpoint. Every file not marked damaged, the expected one included, must hold finite
// values only.
typedef struct {
    char expect_path[4096];
    FileDigest expected;
    FileDigest got;
    int damaged;
} GPT2ModelRead;
static GPT2ModelRead gpt2_model_read;

// reads a whole model file; returns the parameters (malloc'ed, caller frees)
static inline float* gpt2_read_model(const char* path, GPT2Config* config) {
    HashedFile* file = hashed_open(path, 1024);  // (a buffer of the header alone: the rest is read direct)
    *config = gpt2_read_model_header(file->fp, path);
    size_t n = gpt2_num_params(config);
    float* params = (float*)mallocCheck(n * sizeof(float));
    hashed_read_direct(file, params, n * sizeof(float));
    gpt2_model_read.got = hashed_close(file);
    gpt2_model_read.damaged = strcmp(gpt2_model_read.expect_path, path) == 0 &&
                              !file_digest_equal(gpt2_model_read.got, gpt2_model_read.expected);
    const char* bad = gpt2_model_read.damaged ? NULL : gpt2_first_nonfinite_tensor(config, params);
    if (bad != NULL) {
        fatal("%s: tensor %s holds a nan or an inf (hint: no learning rate trains such a model: the file is "
                "damaged, or was written after training diverged; take another model file or checkpoint)",
                path, bad);
    }
    return params;
}

// writes a model file atomically (tmp + fsync + rename); returns its size and checksum
static inline FileDigest gpt2_write_model(const char* path, const GPT2Config* c, const float* params) {
    int header[256] = {0};
    header[0] = GPT2_MODEL_MAGIC;
    header[1] = GPT2_MODEL_VERSION_FP32;
    header[2] = c->max_seq_len;
    header[3] = c->vocab_size;
    header[4] = c->num_layers;
    header[5] = c->num_heads;
    header[6] = c->channels;
    header[7] = c->padded_vocab_size;
    HashedFile* file = hashed_create(path);
    fwriteCheck(header, sizeof(int), 256, file->fp, file->tmp);
    fwriteCheck(params, sizeof(float), gpt2_num_params(c), file->fp, file->tmp);
    return hashed_commit(file);
}

// ----------------------------------------------------------------------------
// random init: "d12", "d24", "d36", "d48" are GPT-2's four sizes (llm.c's names); a small
// model is "d<L>c<C>h<NH>" (e.g. d4c256h4), optionally with "v<V>" and "t<maxT>".
// Returns 0 if `spec` is not a run of letter-number pairs from d, c, h, v, t (then it is a file
// path); such a run that is incomplete or out of range is fatal.

static inline int gpt2_parse_model_spec(const char* spec, GPT2Config* c) {
    if (spec[0] != 'd') { return 0; }
    int L = 0, C = 0, NH = 0, V = 50257, T = 1024;
    char bad = 0;  // the first letter whose number is out of range, named once the form is known
    const char* s = spec;
    while (*s) {
        char key = *s++;
        if (!isdigit((unsigned char)*s)) { return 0; }
        char* end = NULL;
        long value = strtol(s, &end, 10);
        s = end;
        if ((value <= 0 || value > 1048576) && bad == 0) { bad = key; }
        switch (key) {
            case 'd': L = (int)value; break;
            case 'c': C = (int)value; break;
            case 'h': NH = (int)value; break;
            case 'v': V = (int)value; break;
            case 't': T = (int)value; break;
            default: return 0;
        }
    }
    if (bad != 0) { fatal("model shape %s: the number after '%c' must be 1 to 1048576", spec, bad); }
    if (C == 0 && NH == 0) {  // the GPT-2 family
        switch (L) {
            case 12: C = 768; NH = 12; break;
            case 24: C = 1024; NH = 16; break;
            case 36: C = 1280; NH = 20; break;
            case 48: C = 1600; NH = 25; break;
            default:
                fatal("model shape %s: unknown GPT-2 size (hint: d12, d24, d36, d48, or a shape such as "
                        "d4c256h4)", spec);
        }
    }
    if (L == 0 || C == 0 || NH == 0) {
        fatal("model shape %s: a custom shape needs d<L>c<C>h<NH>, e.g. d4c256h4", spec);
    }
    c->num_layers = L;
    c->channels = C;
    c->num_heads = NH;
    c->vocab_size = V;
    c->padded_vocab_size = gpt2_pad_vocab(V);
    c->max_seq_len = T;
    gpt2_validate_config(c, spec);
    return 1;
}

// standard normal from two uniforms (Box-Muller); deterministic for a given state
static inline float random_normal(uint64_t* state) {
    float u1 = random_f32(state), u2 = random_f32(state);
    return sqrtf(-2.0f * logf(1.0f - u1)) * cosf(6.2831853f * u2);
}

// GPT-2's init: weights ~ N(0, 0.02), the two residual projections ~ N(0, 0.02/sqrt(2L)),
// biases 0, LayerNorm gains 1; padded wte rows 0. Same recipe as the PyTorch reference, but
// not the same random numbers (compare against the reference through a written file).
static inline float* gpt2_random_init(const GPT2Config* c, uint64_t seed) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_param_sizes(c, sizes);
    float* params = (float*)callocCheck(gpt2_num_params(c), sizeof(float));
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    float residual_std = 0.02f / sqrtf(2.0f * c->num_layers);
    float* p = params;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (i == 2 || i == 8 || i == 14) {  // LayerNorm gains
            for (size_t j = 0; j < sizes[i]; j++) { p[j] = 1.0f; }
        } else if (gpt2_tensor_shape(c, i).is_matrix) {
            float std = (i == 6 || i == 12) ? residual_std : 0.02f;
            size_t n = (i == 0) ? (size_t)c->vocab_size * c->channels : sizes[i];
            for (size_t j = 0; j < n; j++) { p[j] = std * random_normal(&state); }
        }
        p += sizes[i];
    }
    return params;
}

// a model from a file or from a spec such as "d12"
static inline float* gpt2_load_or_init(const char* spec_or_path, GPT2Config* c, uint64_t seed) {
    if (gpt2_parse_model_spec(spec_or_path, c)) { return gpt2_random_init(c, seed); }
    return gpt2_read_model(spec_or_path, c);
}

// ----------------------------------------------------------------------------
// debug state files (tests): header, x, y, logits (B,T,V), loss, grads (model layout)

typedef struct {
    int B, T;
    int* inputs;     // (B, T)
    int* targets;    // (B, T)
    float* logits;   // (B, T, V)
    float loss;
    float* grads;    // (num_params) in the model layout
} GPT2DebugState;

static inline GPT2DebugState gpt2_read_debug_state(const char* path, const GPT2Config* c) {
    GPT2DebugState s;
    int header[256];
    FILE* fp = fopenCheck(path, "rb");
    freadCheck(header, sizeof(int), 256, fp, path);
    if (header[0] != GPT2_STATE_MAGIC || header[1] != GPT2_STATE_VERSION) {
        fatal("%s: not a debug state file (magic %d version %d, expected %d version %d)", path,
                header[0], header[1], GPT2_STATE_MAGIC, GPT2_STATE_VERSION);
    }
    s.B = header[2];
    s.T = header[3];
    if (s.B < 1 || s.T < 1 || s.T > c->max_seq_len) {
        fatal("%s: bad batch shape B=%d T=%d for maxT=%d", path, s.B, s.T, c->max_seq_len);
    }
    // the size: the header, B*T inputs, B*T targets and B*T*V logits (8 + 4V bytes a position),
    // the loss, the gradients. A division, not B * T * V: B comes from the file and could overflow.
    size_t BT = (size_t)s.B * s.T, n = gpt2_num_params(c);
    long long rows_bytes = file_size_bytes(path) - 1024 - 4 - (long long)n * 4, row_bytes = 8 + 4LL * c->vocab_size;
    if (rows_bytes < 0 || rows_bytes % row_bytes != 0 || (size_t)(rows_bytes / row_bytes) != BT) {
        fatal("%s: size %lld bytes, not what B=%d T=%d and this model need (hint: was it written for "
                "another model?)", path, file_size_bytes(path), s.B, s.T);
    }
    s.inputs = (int*)mallocCheck(BT * sizeof(int));
    s.targets = (int*)mallocCheck(BT * sizeof(int));
    s.logits = (float*)mallocCheck(BT * c->vocab_size * sizeof(float));
    s.grads = (float*)mallocCheck(n * sizeof(float));
    freadCheck(s.inputs, sizeof(int), BT, fp, path);
    freadCheck(s.targets, sizeof(int), BT, fp, path);
    freadCheck(s.logits, sizeof(float), BT * c->vocab_size, fp, path);
    freadCheck(&s.loss, sizeof(float), 1, fp, path);
    freadCheck(s.grads, sizeof(float), n, fp, path);
    fclose(fp);
    return s;
}

static inline void gpt2_free_debug_state(GPT2DebugState* s) {
    free(s->inputs);
    free(s->targets);
    free(s->logits);
    free(s->grads);
}

#endif  // LLMC_GPT2_FILE_H
