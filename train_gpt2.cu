/*
GPT-2 training on one GPU in fp32: the analogue of llm.c's train_gpt2_fp32.cu.

It computes the same model as the CPU reference trainer (train_gpt2.cpp), takes the same
flags and prints the same step lines (but -f, -zm and the step line's stall and pcie are this
trainer's, -zd the CPU trainer's), so the two can be compared line by line. The kernels
are in llmc/cuda_kernels.cuh (each tested and timed on its own in dev/cuda/); this file holds
the model, the passes, the optimizer step and main. Parameters, gradients and activations
are fp32 on the GPU, one buffer each; parameters and gradients use the file layout of
llmc/gpt2_file.h, so "element k of the model" is the same number in every buffer and file.

The optimizer is ZenFlow's orchestration (zenflow.h, the same code as the CPU trainer's) with
the CUDA backend in zenflow.cuh: -zo adamw keeps every moment on the GPU, -zo offload runs
AdamW for every matrix on the CPU, -zo zenflow splits each matrix by columns
(docs/zenflow_spec.md). gpt2_update below is plain AdamW on every parameter, kept as an
independent check (test_gpt2cu compares -zo adamw with it bit for bit).

What differs from the CPU trainer, and why:
- The activations keep only what the backward pass reads; one buffer carries the gradient of
  the residual stream down the layers (dresidual) instead of one per layer.
- A forward pass with targets turns the logits into dlogits in place (fused classifier), so
  the (B, T, Vp) probabilities are never stored. Read logits after a forward WITHOUT targets.
- Matmuls go through cuBLASLt, TF32 by default (-f 0 for plain fp32; the test uses fp32).
- Model kernels run on the default stream, ZenFlow's copies on two more (zenflow.cuh). The
  step's own small transfers (token ids in, losses out) go through mapped pinned host memory
  that kernels read and write, so that they never queue behind ZenFlow's gigabytes. The host
  reads a step's losses once its backward pass is queued (gpt2_read_loss): the GPU does not wait for it.

Build (see the Makefile): nvcc -O3 -fmad=false ... -lcublasLt. -fmad=false is required:
without it nvcc fuses multiply-adds and AdamW is no longer spec 3.1 to the bit.
*/
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu_adam.h"
#include "llmc/args.h"
#include "llmc/train_loop.h"
#include "llmc/cuda_kernels.cuh"
#include "llmc/dataloader.h"
#include "llmc/gpt2_file.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"
#include "zenflow.cuh"

// ----------------------------------------------------------------------------
// activations: what the forward pass keeps for the backward pass (one buffer)

#define NUM_ACTIVATION_TENSORS 18
typedef struct {
    float* encoded;                    // (B, T, C)
    float *ln1, *ln1_mean, *ln1_rstd;  // (L, B, T, C), (L, B, T), (L, B, T): LayerNorm's output, mean, 1/std
    float* qkvr;                       // (L, 3, B, NH, T, hs)  q, k, v in head layout
    float* atty;                       // (L, B, T, C)
    float* att;                        // (L, B, NH, T, T)      causal softmax, zero above the diagonal
    float* residual2;                  // (L, B, T, C)
    float *ln2, *ln2_mean, *ln2_rstd;  // (L, B, T, C), (L, B, T), (L, B, T)
    float *fch, *fch_gelu;             // (L, B, T, 4C) each: the MLP's first matmul, then GELU
    float* residual3;                  // (L, B, T, C)
    float *lnf, *lnf_mean, *lnf_rstd;  // (B, T, C), (B, T), (B, T)
    float* logits;                     // (B, T, Vp)            dlogits after a forward pass with targets
} ActivationTensors;  // (the losses (B, T) go straight to the host: GPT2.losses_host)

static void activation_sizes(size_t sizes[NUM_ACTIVATION_TENSORS], const GPT2Config* c, int B, int T) {
    size_t L = c->num_layers, C = c->channels, NH = c->num_heads, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T;
    size_t s[NUM_ACTIVATION_TENSORS] = {
        BT * C,          L * BT * C,     L * BT,     L * BT,         L * 3 * BT * C,
        L * BT * C,      L * B * NH * T * T,         L * BT * C,     L * BT * C,
        L * BT,          L * BT,         L * BT * 4 * C,             L * BT * 4 * C,
        L * BT * C,      BT * C,         BT,         BT,             BT * Vp};
    memcpy(sizes, s, sizeof(s));
}

static float* point_activations(ActivationTensors* a, const size_t sizes[NUM_ACTIVATION_TENSORS],
                                float* memory) {
    float** ptrs[NUM_ACTIVATION_TENSORS] = {
        &a->encoded,   &a->ln1,      &a->ln1_mean, &a->ln1_rstd,  &a->qkvr,     &a->atty,
        &a->att,       &a->residual2, &a->ln2,     &a->ln2_mean,  &a->ln2_rstd, &a->fch,
        &a->fch_gelu,  &a->residual3, &a->lnf,     &a->lnf_mean,  &a->lnf_rstd, &a->logits};
    return point_tensors(ptrs, sizes, NUM_ACTIVATION_TENSORS, memory);
}

// scratch: buffers every layer reuses, in the forward pass or the backward pass
#define NUM_SCRATCH_TENSORS 6
typedef struct {
    float* qkv;        // (B, T, 3C)     forward: qkv matmul output;  backward: dqkv
    float* att;        // (B, NH, T, T)  forward: preatt;             backward: datt, then dpreatt
    float* btc;        // (B, T, C)      forward: vaccum, attproj and fcproj outputs
    float* dresidual;  // (B, T, C)      backward: gradient of the residual stream
    float* dbtc;       // (B, T, C)      backward: dlnf, dln2, datty, dln1
    float* d4c;        // (B, T, 4C)     backward: dfch_gelu -> dfch; then dq, dk, dv, dvaccum
} ScratchTensors;

static void scratch_sizes(size_t sizes[NUM_SCRATCH_TENSORS], const GPT2Config* c, int B, int T) {
    size_t C = c->channels, NH = c->num_heads, BT = (size_t)B * T;
    size_t s[NUM_SCRATCH_TENSORS] = {BT * 3 * C, (size_t)B * NH * T * T, BT * C, BT * C, BT * C, BT * 4 * C};
    memcpy(sizes, s, sizeof(s));
}

static float* point_scratch(ScratchTensors* s, const size_t sizes[NUM_SCRATCH_TENSORS], float* memory) {
    float** ptrs[NUM_SCRATCH_TENSORS] = {&s->qkv, &s->att, &s->btc, &s->dresidual, &s->dbtc, &s->d4c};
    return point_tensors(ptrs, sizes, NUM_SCRATCH_TENSORS, memory);
}

typedef struct {
    GPT2Config config;
    size_t num_parameters;
    ParameterTensors params, grads;  // device pointers into the two buffers below (llmc/gpt2_file.h)
    float* params_memory;            // (num_parameters) device
    float* grads_memory;             // (num_parameters) device
    float* adam_m;                   // (num_parameters) device, gpt2_update's first moment
    float* adam_v;                   // (num_parameters) device, allocated at its first call
    // activations and scratch, allocated for the largest batch (B, T) seen
    ActivationTensors acts;
    ScratchTensors scratch;
    float* acts_memory;
    float* scratch_memory;
    size_t num_activations, num_scratch;
    int batch_size, seq_len;  // what they were allocated for
    // token ids of the last forward, and the embedding-gradient buckets (encoder_backward):
    // [inputs (BT) | targets (BT) | positions (BT) | tokens (BT) | starts (BT + 1)]
    // They are written on the host into mapped pinned memory and a kernel copies them to
    // the device; the losses are written by the classifier kernel straight into mapped
    // memory. No cudaMemcpy in a step: see mapped_alloc in llmc/cuda_kernels.cuh.
    int* ids;           // device
    int* ids_host;      // mapped pinned host memory ...
    int* ids_mapped;    // ... and the address kernels read it at
    cudaEvent_t ids_read;  // the copy kernel has read ids_host (it may be rewritten)
    int* counts_host;   // (V) scratch of the bucketing, kept zero
    float* losses_host;    // (B, T) mapped pinned host memory ...
    float* losses_mapped;  // ... and the address the classifier writes it at
    cudaEvent_t losses_written;  // the classifier has written them
    int loss_pending;            // ... and gpt2_read_loss has not read them yet
    int num_buckets;
    int B, T;          // of the last forward
    float mean_loss;   // of the last forward with targets (gpt2_read_loss), else -1
    int logits_valid;  // 1 if acts.logits holds logits (forward without targets)
    ZenFlow* zf;       // if set, the passes call its per-layer hooks (zenflow.h, spec 7)
    float* params_host;  // (num_parameters) host, for checkpoints: allocated by the first model_params
} GPT2;

// ----------------------------------------------------------------------------
// build, allocate, free

// builds the model from a model file or a spec such as "d12" (random init on the host)
void gpt2_build(GPT2* model, const char* spec_or_path, uint64_t seed) {
    memset(model, 0, sizeof(*model));
    float* host_params = gpt2_load_or_init(spec_or_path, &model->config, seed);
    size_t n = gpt2_num_params(&model->config);
    model->num_parameters = n;
    model->params_memory = cuda_malloc(n * sizeof(float), "parameters");
    model->grads_memory = cuda_malloc(n * sizeof(float), "gradients");
    cudaCheck(cudaMemcpy(model->params_memory, host_params, n * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(model->grads_memory, 0, n * sizeof(float)));
    free(host_params);
    point_parameters(&model->params, &model->config, model->params_memory);
    point_parameters(&model->grads, &model->config, model->grads_memory);
    model->counts_host = (int*)callocCheck((size_t)model->config.vocab_size, sizeof(int));
    cudaCheck(cudaEventCreateWithFlags(&model->ids_read, cudaEventDisableTiming | cudaEventBlockingSync));
    cudaCheck(cudaEventCreateWithFlags(&model->losses_written, cudaEventDisableTiming | cudaEventBlockingSync));
    model->mean_loss = -1.0f;
}

// (re)allocates activations and scratch unless those of a batch at least this big exist.
// Growing takes the larger B and the larger T seen, so that sampling (B = 1, T up to maxT)
// and training (B, T) do not take turns reallocating.
void gpt2_allocate(GPT2* model, int B, int T) {
    if ((size_t)B * T <= (size_t)model->batch_size * model->seq_len && T <= model->seq_len) { return; }
    B = B > model->batch_size ? B : model->batch_size;
    T = T > model->seq_len ? T : model->seq_len;
    cudaCheck(cudaFree(model->acts_memory));
    cudaCheck(cudaFree(model->scratch_memory));
    cudaCheck(cudaFree(model->ids));
    mapped_free(model->ids_host);
    mapped_free(model->losses_host);
    size_t sizes[NUM_ACTIVATION_TENSORS], ssizes[NUM_SCRATCH_TENSORS];
    activation_sizes(sizes, &model->config, B, T);
    scratch_sizes(ssizes, &model->config, B, T);
    model->num_activations = 0;
    model->num_scratch = 0;
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) { model->num_activations += sizes[i]; }
    for (int i = 0; i < NUM_SCRATCH_TENSORS; i++) { model->num_scratch += ssizes[i]; }
    model->acts_memory = cuda_malloc(model->num_activations * sizeof(float), "activations");
    model->scratch_memory = cuda_malloc(model->num_scratch * sizeof(float), "scratch buffers");
    size_t BT = (size_t)B * T;
    model->ids = (int*)cuda_malloc((5 * BT + 1) * sizeof(int), "token ids");
    model->ids_host = (int*)mapped_alloc((5 * BT + 1) * sizeof(int), &model->ids_mapped, "token ids");
    model->losses_host = (float*)mapped_alloc(BT * sizeof(float), &model->losses_mapped, "losses");
    model->batch_size = B;
    model->seq_len = T;
}

void gpt2_free(GPT2* model) {
    cudaCheck(cudaFree(model->params_memory));
    cudaCheck(cudaFree(model->grads_memory));
    cudaCheck(cudaFree(model->adam_m));
    cudaCheck(cudaFree(model->adam_v));
    cudaCheck(cudaFree(model->acts_memory));
    cudaCheck(cudaFree(model->scratch_memory));
    cudaCheck(cudaFree(model->ids));
    mapped_free(model->ids_host);
    mapped_free(model->losses_host);
    cudaCheck(cudaEventDestroy(model->ids_read));
    cudaCheck(cudaEventDestroy(model->losses_written));
    free(model->counts_host);
    free(model->params_host);
    memset(model, 0, sizeof(*model));
}

// ----------------------------------------------------------------------------
// forward pass

// Forward pass over inputs (B, T) (host memory). With targets (B, T) it also computes the
// losses (read by gpt2_read_loss: the host does not wait for them here) and leaves dlogits
// in acts.logits for gpt2_backward; without targets acts.logits holds the logits.
void gpt2_forward(GPT2* model, const int* inputs, const int* targets, int B, int T) {
    const GPT2Config* cfg = &model->config;
    const int L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    if (T > cfg->max_seq_len) {
        fatal("sequence length T=%d exceeds the model's maxT=%d (hint: lower -t)", T, cfg->max_seq_len);
    }
    const int BT = B * T;
    for (int i = 0; i < BT; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || (targets != NULL && (targets[i] < 0 || targets[i] >= V))) {
            fatal("token id out of range at position %d (vocabulary %d)", i, V);
        }
    }
    gpt2_allocate(model, B, T);
    size_t sizes[NUM_ACTIVATION_TENSORS], ssizes[NUM_SCRATCH_TENSORS];
    activation_sizes(sizes, cfg, B, T);
    scratch_sizes(ssizes, cfg, B, T);
    point_activations(&model->acts, sizes, model->acts_memory);
    point_scratch(&model->scratch, ssizes, model->scratch_memory);

    // token ids to the device; for training also the positions of each token, so that the
    // embedding gradient can add them up in a fixed order without atomics. The host buffer
    // is the one the last forward's copy kernel read: wait until it has (long ago, in training).
    cudaCheck(cudaEventSynchronize(model->ids_read));
    int* ids = model->ids_host;
    memcpy(ids, inputs, BT * sizeof(int));
    size_t id_count = 2 * (size_t)BT;
    if (targets != NULL) {
        memcpy(ids + BT, targets, BT * sizeof(int));
        model->num_buckets = encoder_backward_buckets(inputs, BT, V, ids + 2 * BT, ids + 3 * BT,
                                                      ids + 4 * BT, model->counts_host);
        id_count = 5 * (size_t)BT + 1;
    } else {
        memset(ids + BT, 0, BT * sizeof(int));
    }
    copy_ints(model->ids, model->ids_mapped, id_count);
    cudaCheck(cudaEventRecord(model->ids_read, 0));
    const int* inputs_d = model->ids;
    const int* targets_d = model->ids + BT;

    ParameterTensors p = model->params;
    ActivationTensors a = model->acts;
    ScratchTensors s = model->scratch;
    const size_t BTC = (size_t)BT * C;
    const size_t att_size = (size_t)B * NH * T * T;
    if (model->zf != NULL) { zf_forward_layer(model->zf, -1); }  // wte, wpe in place (or on their way)
    encoder_forward(a.encoded, inputs_d, p.wte, p.wpe, B, T, C);  // (B, T, C)
    for (int l = 0; l < L; l++) {
        if (model->zf != NULL) { zf_forward_layer(model->zf, l); }  // layer l's weights in place
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BTC;  // (B, T, C)
        float* ln1 = a.ln1 + l * BTC;                      // (B, T, C)
        float* ln1_mean = a.ln1_mean + (size_t)l * BT;     // (B, T)
        float* ln1_rstd = a.ln1_rstd + (size_t)l * BT;     // (B, T)
        float* qkvr = a.qkvr + l * 3 * BTC;                // (3, B, NH, T, hs)
        float* atty = a.atty + l * BTC;                    // (B, T, C)
        float* att = a.att + l * att_size;                 // (B, NH, T, T)
        float* residual2 = a.residual2 + l * BTC;          // (B, T, C)
        float* ln2 = a.ln2 + l * BTC;                      // (B, T, C)
        float* ln2_mean = a.ln2_mean + (size_t)l * BT;     // (B, T)
        float* ln2_rstd = a.ln2_rstd + (size_t)l * BT;     // (B, T)
        float* fch = a.fch + l * 4 * BTC;                  // (B, T, 4C)
        float* fch_gelu = a.fch_gelu + l * 4 * BTC;        // (B, T, 4C)
        float* residual3 = a.residual3 + l * BTC;          // (B, T, C)
        // attention block
        layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p.ln1w + l * C, p.ln1b + l * C, BT, C);
        matmul_forward(s.qkv, ln1, p.qkvw + (size_t)l * 3 * C * C, p.qkvb + l * 3 * C, BT, C, 3 * C);
        attention_forward(atty, qkvr, att, s.att, s.btc, s.qkv, B, T, C, NH);
        matmul_forward(s.btc, atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, BT, C, C);
        residual_forward(residual2, residual, s.btc, BTC);
        // MLP block
        layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p.ln2w + l * C, p.ln2b + l * C, BT, C);
        matmul_forward(fch, ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, BT, C, 4 * C);
        gelu_forward(fch_gelu, fch, 4 * BTC);
        matmul_forward(s.btc, fch_gelu, p.fcprojw + (size_t)l * 4 * C * C, p.fcprojb + l * C, BT, 4 * C, C);
        residual_forward(residual3, residual2, s.btc, BTC);
    }
    const float* last = a.residual3 + (L - 1) * BTC;  // (B, T, C)
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, p.lnfw, p.lnfb, BT, C);
    matmul_forward(a.logits, a.lnf, p.wte, NULL, BT, C, Vp);  // (B, T, Vp), tied output projection

    model->B = B;
    model->T = T;
    if (targets != NULL) {
        fused_classifier(a.logits, model->losses_mapped, targets_d, 1.0f / (B * T), BT, V, Vp);
        cudaCheck(cudaEventRecord(model->losses_written, 0));
        model->loss_pending = 1;
        model->logits_valid = 0;
    } else {
        model->mean_loss = -1.0f;
        model->loss_pending = 0;
        model->logits_valid = 1;
    }
}

// The mean loss of the last forward with targets. The first call waits for the classifier;
// gpt2_backward makes it once the backward pass is queued, so that the GPU goes on from the
// forward to the backward pass while the host waits.
float gpt2_read_loss(GPT2* model) {
    if (model->loss_pending) {
        cudaCheck(cudaEventSynchronize(model->losses_written));
        const int BT = model->B * model->T;
        float sum = 0.0f;  // in row order on the host, as the CPU trainer does
        for (int i = 0; i < BT; i++) { sum += model->losses_host[i]; }
        model->mean_loss = sum / BT;
        model->loss_pending = 0;
    }
    return model->mean_loss;
}

// ----------------------------------------------------------------------------
// backward pass

void gpt2_zero_grad(GPT2* model) {
    cudaCheck(cudaMemset(model->grads_memory, 0, model->num_parameters * sizeof(float)));
}

// backward pass of the last forward (which must have had targets); ADDS into the gradients,
// so call gpt2_zero_grad first unless accumulating
void gpt2_backward(GPT2* model) {
    if (!model->loss_pending && model->mean_loss < 0.0f) { fatal("gpt2_backward: the forward pass had no targets"); }
    const GPT2Config* cfg = &model->config;
    const int B = model->B, T = model->T, BT = B * T;
    const int L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads, Vp = cfg->padded_vocab_size;
    const size_t BTC = (size_t)BT * C;
    const size_t att_size = (size_t)B * NH * T * T;
    ParameterTensors p = model->params, g = model->grads;
    ActivationTensors a = model->acts;
    ScratchTensors s = model->scratch;
    float* dres = s.dresidual;  // (B, T, C): d loss / d (residual stream at the current depth)

    // classifier: a.logits already holds dlogits (fused classifier)
    matmul_backward(s.dbtc, g.wte, NULL, a.logits, a.lnf, p.wte, BT, C, Vp);  // dlnf
    cudaCheck(cudaMemset(dres, 0, BTC * sizeof(float)));
    layernorm_backward(dres, g.lnfw, g.lnfb, s.dbtc, a.residual3 + (L - 1) * BTC, p.lnfw,
                       a.lnf_mean, a.lnf_rstd, BT, C);
    for (int l = L - 1; l >= 0; l--) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BTC;
        const size_t lbt = (size_t)l * BT;
        // MLP block, in reverse. d residual3 = dres; it flows unchanged into fcproj and
        // residual2 (residual add), and the LayerNorm adds its part to it.
        matmul_backward(s.d4c, g.fcprojw + (size_t)l * 4 * C * C, g.fcprojb + l * C, dres,
                        a.fch_gelu + l * 4 * BTC, p.fcprojw + (size_t)l * 4 * C * C, BT, 4 * C, C);  // dfch_gelu
        gelu_backward_inplace(s.d4c, a.fch + l * 4 * BTC, 4 * BTC);  // dfch
        matmul_backward(s.dbtc, g.fcw + (size_t)l * 4 * C * C, g.fcb + l * 4 * C, s.d4c,
                        a.ln2 + l * BTC, p.fcw + (size_t)l * 4 * C * C, BT, C, 4 * C);  // dln2
        layernorm_backward(dres, g.ln2w + l * C, g.ln2b + l * C, s.dbtc, a.residual2 + l * BTC,
                           p.ln2w + l * C, a.ln2_mean + lbt, a.ln2_rstd + lbt, BT, C);  // dres = d residual2
        // attention block, in reverse
        matmul_backward(s.dbtc, g.attprojw + (size_t)l * C * C, g.attprojb + l * C, dres,
                        a.atty + l * BTC, p.attprojw + (size_t)l * C * C, BT, C, C);  // datty
        attention_backward(s.qkv, s.att, s.d4c, s.dbtc, a.qkvr + l * 3 * BTC, a.att + l * att_size, B, T,
                           C, NH);  // dqkv
        matmul_backward(s.dbtc, g.qkvw + (size_t)l * 3 * C * C, g.qkvb + l * 3 * C, s.qkv,
                        a.ln1 + l * BTC, p.qkvw + (size_t)l * 3 * C * C, BT, C, 3 * C);  // dln1
        layernorm_backward(dres, g.ln1w + l * C, g.ln1b + l * C, s.dbtc, residual,
                           p.ln1w + l * C, a.ln1_mean + lbt, a.ln1_rstd + lbt, BT, C);  // dres = d residual
        if (model->zf != NULL) { zf_backward_layer_done(model->zf, l); }  // its gradients may leave now
    }
    const int* ids = model->ids;
    encoder_backward(g.wte, g.wpe, dres, ids + 2 * BT, ids + 3 * BT, ids + 4 * BT, model->num_buckets, B,
                     T, C);
    gpt2_read_loss(model);  // the whole backward pass is queued: now the host may wait
}

// ----------------------------------------------------------------------------
// plain AdamW on every parameter (spec 3.1), weight decay on matrices only: the training
// loop uses ZenFlow (zf_step); this is the independent version the test compares it with

void gpt2_update(GPT2* model, ZfAdamHyper h, int step) {
    if (model->adam_m == NULL) {  // moments start at 0
        size_t bytes = model->num_parameters * sizeof(float);
        model->adam_m = cuda_malloc(bytes, "AdamW m");
        model->adam_v = cuda_malloc(bytes, "AdamW v");
        cudaCheck(cudaMemset(model->adam_m, 0, bytes));
        cudaCheck(cudaMemset(model->adam_v, 0, bytes));
    }
    size_t sizes[NUM_PARAMETER_TENSORS], offset = 0;
    gpt2_param_sizes(&model->config, sizes);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        float wd = gpt2_tensor_shape(&model->config, i).is_matrix ? h.weight_decay : 0.0f;
        adamw_update(model->params_memory + offset, model->adam_m + offset, model->adam_v + offset,
                     model->grads_memory + offset, sizes[i], h.lr, h.beta1, h.beta2, h.eps, wd, step);
        offset += sizes[i];
    }
}

// ----------------------------------------------------------------------------
// copies to the host (they wait for the GPU)

// the logits of the last forward without targets, padding dropped: out (B, T, V)
void gpt2_copy_logits_to_host(const GPT2* model, float* out) {
    if (!model->logits_valid) {
        fatal("gpt2_copy_logits_to_host: the last forward had targets, so the logits were replaced "
                "by dlogits (hint: run gpt2_forward with targets = NULL first)");
    }
    const int V = model->config.vocab_size, Vp = model->config.padded_vocab_size;
    cudaCheck(cudaMemcpy2D(out, V * sizeof(float), model->acts.logits, Vp * sizeof(float), V * sizeof(float),
                           (size_t)model->B * model->T, cudaMemcpyDeviceToHost));
}

void gpt2_copy_grads_to_host(const GPT2* model, float* out) {
    cudaCheck(cudaMemcpy(out, model->grads_memory, model->num_parameters * sizeof(float),
                         cudaMemcpyDeviceToHost));
}

void gpt2_copy_params_to_host(const GPT2* model, float* out) {
    cudaCheck(cudaMemcpy(out, model->params_memory, model->num_parameters * sizeof(float),
                         cudaMemcpyDeviceToHost));
}

// ----------------------------------------------------------------------------
// main training loop
#ifndef TESTING

// the GPU memory of each part, as cuda_malloc counted it (llmc/gpu_memory.h), and ZenFlow's host side
static void print_memory_table(const GPT2* model, const ZenFlow* zf) {
    char heading[160];
    snprintf(heading, sizeof(heading), "GPU memory in %s mode at B=%d T=%d, counted at each cudaMalloc:",
             zf_mode_names[zf->cfg.mode], model->batch_size, model->seq_len);
    gpu_memory_print(cuda_malloc_bytes, heading);
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    printf("[memory] device in use %.1f MiB (%zu bytes, with the CUDA context's), free %.1f MiB of %.1f\n",
           (total_bytes - free_bytes) / 1048576.0, total_bytes - free_bytes, free_bytes / 1048576.0,
           total_bytes / 1048576.0);
    zf_print_host_memory(zf);
}

// After step s: the step line, main.log's trl: line (s - 1, as llm.c numbers it: the updates the
// model had), and -zm's CSV row
static void report_step(int s, int steps, float loss, double ms, int tokens, const ZfStepStats* st, ZenFlow* zf,
                        FILE* logfile, FILE* metrics) {
    printf("step %d/%d | loss %f | %.1f ms | %.0f tok/s | stall %.1f ms | pcie %.1f MB", s, steps, loss, ms,
           tokens / (ms / 1e3), st->stall_ms, (st->d2h_bytes + st->h2d_bytes) / 1e6);
    zf_print_step_stats(zf);  // | cpu | moved | select | window, where they are new
    printf("\n");
    if (logfile) {
        fprintf(logfile, "s:%d trl:%f\n", s - 1, loss);
        fflush(logfile);
    }
    if (metrics) {
        fprintf(metrics, "%d,%.6f,%.3f,%.3f,%.3f,%.3f,%.3f,%.0f,%.0f,%.3f,%.3f\n", s, loss, ms, st->gpu_ms,
                st->compute_ms, st->stall_ms, st->cpu_ms, st->d2h_bytes, st->h2d_bytes, zf->stats.cpu_update_ms,
                zf->stats.select_ms);
        fflush(metrics);
    }
}

// the model as the work between steps uses it (llmc/train_loop.h)
static float model_loss(void* ctx, const int* inputs, const int* targets, int B, int T) {
    gpt2_forward((GPT2*)ctx, inputs, targets, B, T);
    return gpt2_read_loss((GPT2*)ctx);
}

// the softmax of the one row the sampler needs is done on the host (as the CPU trainer computes it)
static const float* model_next_probs(void* ctx, const int* tokens, int t, float* probs) {
    GPT2* model = (GPT2*)ctx;
    int V = model->config.vocab_size;
    gpt2_forward(model, tokens, NULL, 1, t);
    cudaCheck(cudaMemcpy(probs, model->acts.logits + (size_t)(t - 1) * model->config.padded_vocab_size,
                         V * sizeof(float), cudaMemcpyDeviceToHost));
    float maxval = -INFINITY, sum = 0.0f;
    for (int i = 0; i < V; i++) { maxval = probs[i] > maxval ? probs[i] : maxval; }
    for (int i = 0; i < V; i++) {
        probs[i] = expf(probs[i] - maxval);
        sum += probs[i];
    }
    for (int i = 0; i < V; i++) { probs[i] = probs[i] / sum; }
    return probs;
}

// the working copy of the parameters in a host buffer, allocated at the first call (a
// checkpoint, or the message of a non-finite loss)
static const float* model_params(void* ctx) {
    GPT2* model = (GPT2*)ctx;
    if (model->zf != NULL) { zf_apply_pending(model->zf); }  // an apply still under way (pipelining)
    if (model->params_host == NULL) {
        model->params_host = (float*)mallocCheck(model->num_parameters * sizeof(float));
    }
    gpt2_copy_params_to_host(model, model->params_host);
    return model->params_host;
}

static void model_stop(void* ctx) {
    zf_wait_idle(((GPT2*)ctx)->zf);
    gpu_trace_close();  // the GPU's spans into the trace, before run_dir_stop closes it
}

static void model_finish(void* ctx) { zf_drain(((GPT2*)ctx)->zf); }  // spec 4.7

// a resume that falls back to an older checkpoint puts its parameters in (llmc/checkpoint.h)
static void set_params(void* model, const float* params) {
    GPT2* m = (GPT2*)model;
    cudaCheck(cudaMemcpy(m->params_memory, params, m->num_parameters * sizeof(float), cudaMemcpyHostToDevice));
}

int main(int argc, char* argv[]) {
    TrainArgs args;
    train_args_parse(&args, argc, argv, ZF_USAGE);
    train_args_refuse(train_args_zflag(&args, 'd') != NULL, "-zd", "the CPU trainer has it");
    ZfConfig zcfg = zf_parse_flags(args.zflags, "dm", args.output_dir);  // -zd, -zm: the trainers' own
    const char* metrics_path = train_args_zflag(&args, 'm');
    if (metrics_path != NULL) { check_output_file("-zm", metrics_path, args.output_dir); }
    RunDir run;  // -o, -y: llmc/checkpoint.h
    const char* model_spec = run_dir_begin(&run, &args, argc, argv);  // with -y 1, the checkpoint's model

    cudaDeviceProp prop = cuda_init_device();
    printf("[device] %s, compute capability %d.%d, %d SMs, %.1f GiB\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    cublas_init(args.use_tf32);

    GPT2 model;
    gpt2_build(&model, model_spec, (uint64_t)args.seed);
    const GPT2Config* cfg = &model.config;
    train_print_run(cfg, model.num_parameters, &args, args.use_tf32 ? "tf32=on" : "tf32=off");
    const int B = args.B, T = args.T, steps = args.steps;
    TrainData data;  // -i, -j, -k (llmc/train_loop.h)
    train_data_open(&data, &args, cfg);

    ZenFlow zf;
    ZfCudaDevice device;
    zf_cuda_init(&zf, &device, model.params_memory, model.grads_memory, cfg, zcfg);
    zcfg = zf.cfg;  // as the mode sets it
    model.zf = &zf;
    zf_print_config(&zf);
    printf("[optimizer] matrix elements M = %zu: the CPU owns %zu after the first selection, the GPU %zu\n",
           zf.own.matrix_elems, zf.own.matrix_elems - zf.own.gpu_capacity, zf.own.gpu_capacity);
    gpt2_allocate(&model, B, T);
    print_memory_table(&model, &zf);

    run_dir_open(&run);  // once the checks before it have passed: the lock, and a run already there

    ZfAdamHyper hyper = {args.lr, 0.9f, 0.95f, 1e-8f, args.weight_decay};
    uint64_t rng = (uint64_t)args.seed;  // the sampler's state, as in llm.c (train_gpt2.cpp says why)
    const OptimizerState zf_state = {&zf, zf_save_state, zf_load_state};  // llmc/checkpoint.h
    const TrainerModel hooks = {&model, model_loss, model_next_probs, model_params, model_stop, model_finish};
    int start_step = run_dir_resume(&run, zf_state, &data.train, &rng, {&model, set_params}, cfg);

    // the files the run writes beside -o's are opened once the resume's checks have passed
    if (args.trace_path != NULL) {
        trace_open(args.trace_path, args.trace_first, args.trace_first + args.trace_steps - 1);
        gpu_trace_open();
    }
    if (zf.cfg.selection_log != NULL) { zf_selection_log(&zf); }  // -zl's, written at each selection
    FILE* metrics = NULL;
    if (metrics_path != NULL) {
        metrics = fopenCheck(metrics_path, "w");
        fprintf(metrics, "step,loss,ms,gpu_ms,compute_ms,stall_ms,cpu_ms,d2h_bytes,h2d_bytes,window_update_ms,select_ms\n");
    }

    for (int step = start_step >= 0 ? start_step : 0; step <= steps; step++) {
        between_steps(&run, &args, step, &data, hooks, zf_state, cfg, &rng);  // -v, -s, -n, a stop
        if (step == steps) { break; }

        trace_set_step(step + 1);
        double t0 = now_ms();
        zf_cuda_step_begin(&device, &zf);
        dataloader_next_batch(&data.train);
        int span = gpu_trace_begin(0);
        gpt2_forward(&model, data.train.inputs, data.train.targets, B, T);
        gpu_trace_end(span, 0, TRACE_COMPUTE, "forward");
        span = gpu_trace_begin(0);
        zf_before_backward(&zf, step);  // zero the gradients (with -za gpu inside a window only the GPU's part)
        gpt2_backward(&model);          // queued; it then waits for the loss
        gpu_trace_end(span, 0, TRACE_COMPUTE, "backward");
        if (!isfinite(model.mean_loss)) {  // the parameters are still those of the forward pass
            gpt2_fatal_loss(step + 1, model.mean_loss, cfg, model_params(&model));
        }
        gpt2_warn_high_loss(step + 1, model.mean_loss, cfg->vocab_size);
        zf_step(&zf, step, hyper);
        ZfStepStats st = zf_cuda_step_end(&device, &zf);  // waits for the default stream
        gpu_trace_step_done();
        report_step(step + 1, steps, model.mean_loss, now_ms() - t0, B * T, &st, &zf, run.log, metrics);
    }

    gpu_trace_close();
    if (run.log) { fcloseCheck(run.log, "main.log"); }
    if (metrics) { fcloseCheck(metrics, metrics_path); }
    zf_cuda_free(&zf, &device);
    train_data_free(&data);
    gpt2_free(&model);
    cublas_free();
    return 0;
}
#endif
