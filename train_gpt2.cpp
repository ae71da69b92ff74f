/*
GPT-2 training on the CPU: the reference trainer (C++17 + OpenMP).

This is the analogue of llm.c's train_gpt2.c. It is the oracle the CUDA trainer is checked
against, so it favours clarity and exact, deterministic arithmetic over speed:
- every output element is computed by one thread in a fixed order, so results do not
  depend on the number of OpenMP threads (bitwise);
- it is built with -ffp-contract=off (no fused multiply-add), like the optimizer, so the
  AdamW step is bitwise the one in docs/zenflow_spec.md section 3.1.

Layout conventions (as in llm.c): B batch, T time, C channels, NH heads, hs = C/NH head
size, L layers, V vocabulary, Vp padded vocabulary. All parameters live in one buffer
(llmc/gpt2_file.h), gradients mirror it, and the activations live in a second buffer.

The optimizer is not here: the step ends by handing the gradients to ZenFlow's
orchestration (zenflow.h), whose device side this file provides (the CPU backend below).
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu_adam.h"
#include "zenflow.h"
#include "llmc/args.h"
#include "llmc/train_loop.h"
#include "llmc/dataloader.h"
#include "llmc/gpt2_file.h"
#include "llmc/gpu_memory.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

#ifdef _OPENMP
#include <omp.h>
#else
// built without OpenMP (the ThreadSanitizer test build, see the Makefile): one thread
static inline int omp_get_max_threads(void) { return 1; }
static inline void omp_set_num_threads(int) {}
#endif

// ----------------------------------------------------------------------------
// forward and backward passes of each layer type

// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
void encoder_forward(float* out,                          // (B, T, C)
                     const int* inp,                      // (B, T)
                     const float* wte, const float* wpe,  // (Vp, C), (maxT, C)
                     int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float* o = out + ((size_t)b * T + t) * C;
            const float* we = wte + (size_t)inp[b * T + t] * C;
            const float* pe = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) { o[c] = we[c] + pe[c]; }
        }
    }
}

// serial on purpose: two positions may hold the same token, and a fixed order keeps the
// sum deterministic
void encoder_backward(float* dwte, float* dwpe,  // (Vp, C), (maxT, C)
                      const float* dout,         // (B, T, C)
                      const int* inp,            // (B, T)
                      int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float* d = dout + ((size_t)b * T + t) * C;
            float* dwe = dwte + (size_t)inp[b * T + t] * C;
            float* dpe = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) {
                dwe[c] += d[c];
                dpe[c] += d[c];
            }
        }
    }
}

// normalizes each (b,t) row over C, then scales and shifts; keeps mean and 1/std for backward
void layernorm_forward(float* out, float* mean, float* rstd,  // (B,T,C), (B,T), (B,T)
                       const float* inp,                      // (B, T, C)
                       const float* weight, const float* bias,  // (C), (C)
                       int B, int T, int C) {
    const float eps = 1e-5f;
#pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        const float* x = inp + (size_t)bt * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) { m += x[c]; }
        m = m / C;
        float var = 0.0f;
        for (int c = 0; c < C; c++) {
            float diff = x[c] - m;
            var += diff * diff;
        }
        var = var / C;
        float s = 1.0f / sqrtf(var + eps);
        float* o = out + (size_t)bt * C;
        for (int c = 0; c < C; c++) { o[c] = (x[c] - m) * s * weight[c] + bias[c]; }
        mean[bt] = m;
        rstd[bt] = s;
    }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias,  // (B,T,C), (C), (C)
                        const float* dout, const float* inp,        // (B,T,C), (B,T,C)
                        const float* weight, const float* mean, const float* rstd,  // (C), (B,T), (B,T)
                        int B, int T, int C) {
    // input gradient, row by row:
    // dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = weight * dout
#pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        const float* d = dout + (size_t)bt * C;
        const float* x = inp + (size_t)bt * C;
        float m = mean[bt], s = rstd[bt];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            float dnorm = weight[c] * d[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean = dnorm_mean / C;
        dnorm_norm_mean = dnorm_norm_mean / C;
        float* dx = dinp + (size_t)bt * C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            float dnorm = weight[c] * d[c];
            dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
    // parameter gradients: sums over all rows, in row order
    for (int bt = 0; bt < B * T; bt++) {
        const float* d = dout + (size_t)bt * C;
        const float* x = inp + (size_t)bt * C;
        float m = mean[bt], s = rstd[bt];
        for (int c = 0; c < C; c++) {
            dbias[c] += d[c];
            dweight[c] += (x[c] - m) * s * d[c];
        }
    }
}

// A dot product whose rounding does not depend on the machine: 8 lanes, lane l adding the
// products i = l, l+8, l+16, ... in order, the C % 8 last products added to lane 0, then the
// lanes added in order. `#pragma omp simd reduction` would leave the lanes to the compiler:
// 8 with AVX2, 16 with AVX-512, so the same source trained to other last digits on another
// machine. (This order is what GCC makes of that pragma with AVX2, so the numbers quoted in
// the README, made on an AVX2 machine, did not move when it was written down here.)
#define DOT_LANES 8

// the end of a dot product: the C % 8 last products into lane 0, then the lanes in order
static inline float dot_lanes_sum(float* lane, const float* x, const float* w, int C8, int C) {
    for (int i = C8; i < C; i++) { lane[0] += x[i] * w[i]; }
    float s = 0.0f;
    for (int l = 0; l < DOT_LANES; l++) { s += lane[l]; }
    return s;
}

static inline float dot_fixed(const float* x, const float* w, int C) {
    float lane[DOT_LANES] = {0};
    int C8 = C / DOT_LANES * DOT_LANES;
    for (int i = 0; i < C8; i += DOT_LANES) {
#pragma omp simd
        for (int l = 0; l < DOT_LANES; l++) { lane[l] += x[i + l] * w[i + l]; }
    }
    return dot_lanes_sum(lane, x, w, C8, C);
}

// out = inp @ weight^T + bias, i.e. out[r,o] = sum_i inp[r,i] * weight[o,i] + bias[o].
// Rows are processed in blocks of 8 so each weight row is read once per block, not per row;
// each of the 8 dot products is dot_fixed's, operation for operation.
void matmul_forward(float* out,                                // (B, T, OC)
                    const float* inp,                          // (B, T, C)
                    const float* weight, const float* bias,    // (OC, C), (OC) or NULL
                    int B, int T, int C, int OC) {
    const int R = B * T, C8 = C / DOT_LANES * DOT_LANES;
#pragma omp parallel for schedule(static)
    for (int r0 = 0; r0 < R; r0 += 8) {
        int nr = R - r0 < 8 ? R - r0 : 8;
        const float* x = inp + (size_t)r0 * C;
        for (int o = 0; o < OC; o++) {
            const float* w = weight + (size_t)o * C;
            float acc[8];
            if (nr == 8) {
                float lane[8][DOT_LANES] = {{0}};  // [row][lane]
                for (int i = 0; i < C8; i += DOT_LANES) {
                    for (int r = 0; r < 8; r++) {
#pragma omp simd
                        for (int l = 0; l < DOT_LANES; l++) { lane[r][l] += x[(size_t)r * C + i + l] * w[i + l]; }
                    }
                }
                for (int r = 0; r < 8; r++) { acc[r] = dot_lanes_sum(lane[r], x + (size_t)r * C, w, C8, C); }
            } else {
                for (int r = 0; r < nr; r++) { acc[r] = dot_fixed(x + (size_t)r * C, w, C); }
            }
            for (int r = 0; r < nr; r++) {
                out[(size_t)(r0 + r) * OC + o] = acc[r] + (bias != NULL ? bias[o] : 0.0f);
            }
        }
    }
}

// The backward pass in tiles of 8 rows x 16 columns held in registers: each tile is loaded
// once, takes all its products, and is stored once, instead of a load and a store per
// product. Every element still adds its products one at a time in the order of the plain
// loops (o in order for dinp, r in order for dweight), so the tiles change the speed, not
// the bits. A full tile calls its function with the constant sizes, so that the compiler
// keeps it in registers; the tiles at the edges (fewer rows or columns) take the same path.
#define TILE_ROWS 8
#define TILE_COLS 16
// the weight rows of one dinp pass: a block of 64 rows (768 KiB at GPT-2 124M's widest, 4C = 3072)
// stays in cache while every column tile of the 8 rows takes its products from it
#define DINP_WEIGHT_ROWS 64

// dinp[r0 + r, i0 + l] += sum over o in [o0, o1), in order, of dout[r0 + r, o] * weight[o, i0 + l]
static inline __attribute__((always_inline)) void dinp_tile(float* dinp, const float* dout, const float* weight,
                                                             int C, int OC, int r0, int nr, int i0, int ni,
                                                             int o0, int o1) {
    float acc[TILE_ROWS][TILE_COLS];
    for (int r = 0; r < nr; r++) {
        for (int l = 0; l < ni; l++) { acc[r][l] = dinp[(size_t)(r0 + r) * C + i0 + l]; }
    }
    for (int o = o0; o < o1; o++) {
        const float* w = weight + (size_t)o * C + i0;
        for (int r = 0; r < nr; r++) {
            float d = dout[(size_t)(r0 + r) * OC + o];
#pragma omp simd
            for (int l = 0; l < ni; l++) { acc[r][l] += d * w[l]; }
        }
    }
    for (int r = 0; r < nr; r++) {
        for (int l = 0; l < ni; l++) { dinp[(size_t)(r0 + r) * C + i0 + l] = acc[r][l]; }
    }
}

// dweight[o0 + j, i0 + l] += sum over r in [0, R), in order, of dout[r, o0 + j] * inp[r, i0 + l]
static inline __attribute__((always_inline)) void dweight_tile(float* dweight, const float* dout, const float* inp,
                                                                int C, int OC, int R, int o0, int no, int i0,
                                                                int ni) {
    float acc[TILE_ROWS][TILE_COLS];
    for (int j = 0; j < no; j++) {
        for (int l = 0; l < ni; l++) { acc[j][l] = dweight[(size_t)(o0 + j) * C + i0 + l]; }
    }
    for (int r = 0; r < R; r++) {
        const float* x = inp + (size_t)r * C + i0;
        const float* d = dout + (size_t)r * OC + o0;
        for (int j = 0; j < no; j++) {
#pragma omp simd
            for (int l = 0; l < ni; l++) { acc[j][l] += d[j] * x[l]; }
        }
    }
    for (int j = 0; j < no; j++) {
        for (int l = 0; l < ni; l++) { dweight[(size_t)(o0 + j) * C + i0 + l] = acc[j][l]; }
    }
}

void matmul_backward(float* dinp, float* dweight, float* dbias,  // (B,T,C), (OC,C), (OC)|NULL
                     const float* dout, const float* inp,        // (B,T,OC), (B,T,C)
                     const float* weight,                        // (OC, C)
                     int B, int T, int C, int OC) {
    const int R = B * T;
    // dinp[r,:] += sum_o dout[r,o] * weight[o,:]   (rows in blocks of 8, o in order)
#pragma omp parallel for schedule(static)
    for (int r0 = 0; r0 < R; r0 += TILE_ROWS) {
        int nr = R - r0 < TILE_ROWS ? R - r0 : TILE_ROWS;
        for (int o0 = 0; o0 < OC; o0 += DINP_WEIGHT_ROWS) {
            int o1 = OC - o0 < DINP_WEIGHT_ROWS ? OC : o0 + DINP_WEIGHT_ROWS;
            for (int i0 = 0; i0 < C; i0 += TILE_COLS) {
                int ni = C - i0 < TILE_COLS ? C - i0 : TILE_COLS;
                if (nr == TILE_ROWS && ni == TILE_COLS) {
                    dinp_tile(dinp, dout, weight, C, OC, r0, TILE_ROWS, i0, TILE_COLS, o0, o1);
                } else {
                    dinp_tile(dinp, dout, weight, C, OC, r0, nr, i0, ni, o0, o1);
                }
            }
        }
    }
    // dweight[o,:] += sum_r dout[r,o] * inp[r,:]   (o in blocks of 8, r in order)
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += TILE_ROWS) {
        int no = OC - o0 < TILE_ROWS ? OC - o0 : TILE_ROWS;
        for (int i0 = 0; i0 < C; i0 += TILE_COLS) {
            int ni = C - i0 < TILE_COLS ? C - i0 : TILE_COLS;
            if (no == TILE_ROWS && ni == TILE_COLS) {
                dweight_tile(dweight, dout, inp, C, OC, R, o0, TILE_ROWS, i0, TILE_COLS);
            } else {
                dweight_tile(dweight, dout, inp, C, OC, R, o0, no, i0, ni);
            }
        }
        if (dbias != NULL) {
            for (int j = 0; j < no; j++) {
                float s = 0.0f;
                for (int r = 0; r < R; r++) { s += dout[(size_t)r * OC + o0 + j]; }
                dbias[o0 + j] += s;
            }
        }
    }
}

// causal multi-head self-attention. qkv holds q, k, v side by side for each position.
// preatt = q.k / sqrt(hs) for t2 <= t; att = softmax(preatt); out = att @ v
void attention_forward(float* out, float* preatt, float* att,  // (B,T,C), (B,NH,T,T) x2
                       const float* qkv,                       // (B, T, 3C)
                       int B, int T, int C, int NH) {
    const int C3 = 3 * C, hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const float* q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float* pre = preatt + (((size_t)b * NH + h) * T + t) * T;
                float* a = att + (((size_t)b * NH + h) * T + t) * T;
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + ((size_t)b * T + t2) * C3 + h * hs + C;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) { s += q[i] * k[i]; }
                    s = s * scale;
                    pre[t2] = s;
                    if (s > maxval) { maxval = s; }
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    float e = expf(pre[t2] - maxval);
                    a[t2] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 < T; t2++) { a[t2] = t2 <= t ? a[t2] * inv : 0.0f; }
                float* o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) { o[i] = 0.0f; }
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* v = qkv + ((size_t)b * T + t2) * C3 + h * hs + 2 * C;
                    for (int i = 0; i < hs; i++) { o[i] += a[t2] * v[i]; }
                }
            }
        }
    }
}

// one thread per (b, h): dk and dv of a head collect from every t, so a head is never split
void attention_backward(float* dqkv, float* dpreatt, float* datt,  // (B,T,3C), (B,NH,T,T) x2
                        const float* dout, const float* qkv, const float* att,  // (B,T,C), (B,T,3C), (B,NH,T,T)
                        int B, int T, int C, int NH) {
    const int C3 = 3 * C, hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        for (int t = 0; t < T; t++) {
            const float* a = att + (((size_t)b * NH + h) * T + t) * T;
            float* da = datt + (((size_t)b * NH + h) * T + t) * T;
            float* dpre = dpreatt + (((size_t)b * NH + h) * T + t) * T;
            const float* d = dout + ((size_t)b * T + t) * C + h * hs;
            // out = att @ v
            for (int t2 = 0; t2 <= t; t2++) {
                const float* v = qkv + ((size_t)b * T + t2) * C3 + h * hs + 2 * C;
                float* dv = dqkv + ((size_t)b * T + t2) * C3 + h * hs + 2 * C;
                float s = 0.0f;
                for (int i = 0; i < hs; i++) {
                    s += v[i] * d[i];
                    dv[i] += a[t2] * d[i];
                }
                da[t2] += s;
            }
            // softmax: dpre = att * (datt - sum(att * datt))
            float dot = 0.0f;
            for (int t2 = 0; t2 <= t; t2++) { dot += a[t2] * da[t2]; }
            for (int t2 = 0; t2 <= t; t2++) { dpre[t2] += a[t2] * (da[t2] - dot); }
            // preatt = q.k * scale
            const float* q = qkv + ((size_t)b * T + t) * C3 + h * hs;
            float* dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
            for (int t2 = 0; t2 <= t; t2++) {
                const float* k = qkv + ((size_t)b * T + t2) * C3 + h * hs + C;
                float* dk = dqkv + ((size_t)b * T + t2) * C3 + h * hs + C;
                float g = dpre[t2] * scale;
                for (int i = 0; i < hs; i++) {
                    dq[i] += k[i] * g;
                    dk[i] += q[i] * g;
                }
            }
        }
    }
}

// GELU, tanh approximation (as GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
#define GELU_SCALE 0.7978845608028654f  // sqrt(2/pi)

void gelu_forward(float* out, const float* inp, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
    }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        float th = tanhf(GELU_SCALE * (x + cube));
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) +
                     0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += grad * dout[i];
    }
}

void residual_forward(float* out, const float* a, const float* b, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) { out[i] = a[i] + b[i]; }
}

void residual_backward(float* da, float* db, const float* dout, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

// softmax over the first V of Vp logits (the padded ones are not part of the vocabulary),
// then the loss -log p[target] of each position, as log(sum) - (x[target] - max): finite
// however far below the max the target's logit is (exp of it would be 0, and -log 0 is inf)
void softmax_crossentropy_forward(float* probs, float* losses,  // (B,T,Vp), (B,T)
                                  const float* logits, const int* targets,  // (B,T,Vp), (B,T)
                                  int B, int T, int V, int Vp) {
#pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        const float* x = logits + (size_t)bt * Vp;
        float* p = probs + (size_t)bt * Vp;
        float maxval = -INFINITY;
        for (int i = 0; i < V; i++) { maxval = x[i] > maxval ? x[i] : maxval; }
        float sum = 0.0f;
        for (int i = 0; i < V; i++) {
            p[i] = expf(x[i] - maxval);
            sum += p[i];
        }
        for (int i = 0; i < V; i++) { p[i] = p[i] / sum; }
        for (int i = V; i < Vp; i++) { p[i] = 0.0f; }
        if (targets != NULL) { losses[bt] = logf(sum) - (x[targets[bt]] - maxval); }
    }
}

// d(mean loss)/dlogits = (probs - onehot(target)) / (B*T); zero on the padded columns
void softmax_crossentropy_backward(float* dlogits,                        // (B, T, Vp)
                                   const float* probs, const int* targets,  // (B,T,Vp), (B,T)
                                   int B, int T, int V, int Vp) {
    const float dloss = 1.0f / (B * T);
#pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        float* d = dlogits + (size_t)bt * Vp;
        const float* p = probs + (size_t)bt * Vp;
        for (int i = 0; i < V; i++) {
            float indicator = i == targets[bt] ? 1.0f : 0.0f;
            d[i] = (p[i] - indicator) * dloss;
        }
        for (int i = V; i < Vp; i++) { d[i] = 0.0f; }
    }
}

// ----------------------------------------------------------------------------
// the model: parameters, gradients, activations

#define NUM_ACTIVATION_TENSORS 23
typedef struct {
    float* encoded;    // (B, T, C)
    float* ln1;        // (L, B, T, C)
    float* ln1_mean;   // (L, B, T)
    float* ln1_rstd;   // (L, B, T)
    float* qkv;        // (L, B, T, 3C)
    float* atty;       // (L, B, T, C)
    float* preatt;     // (L, B, NH, T, T)
    float* att;        // (L, B, NH, T, T)
    float* attproj;    // (L, B, T, C)
    float* residual2;  // (L, B, T, C)
    float* ln2;        // (L, B, T, C)
    float* ln2_mean;   // (L, B, T)
    float* ln2_rstd;   // (L, B, T)
    float* fch;        // (L, B, T, 4C)
    float* fch_gelu;   // (L, B, T, 4C)
    float* fcproj;     // (L, B, T, C)
    float* residual3;  // (L, B, T, C)
    float* lnf;        // (B, T, C)
    float* lnf_mean;   // (B, T)
    float* lnf_rstd;   // (B, T)
    float* logits;     // (B, T, Vp)
    float* probs;      // (B, T, Vp)
    float* losses;     // (B, T)
} ActivationTensors;

void activation_sizes(size_t sizes[NUM_ACTIVATION_TENSORS], const GPT2Config* c, int B, int T) {
    size_t L = c->num_layers, C = c->channels, NH = c->num_heads, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T;
    size_t s[NUM_ACTIVATION_TENSORS] = {
        BT * C,      L * BT * C, L * BT,      L * BT,          L * BT * 3 * C, L * BT * C,
        L * B * NH * T * T,      L * B * NH * T * T,           L * BT * C,     L * BT * C,
        L * BT * C,  L * BT,     L * BT,      L * BT * 4 * C,  L * BT * 4 * C, L * BT * C,
        L * BT * C,  BT * C,     BT,          BT,              BT * Vp,        BT * Vp,
        BT};
    memcpy(sizes, s, sizeof(s));
}

float* point_activations(ActivationTensors* a, const size_t sizes[NUM_ACTIVATION_TENSORS],
                         float* memory) {
    float** ptrs[NUM_ACTIVATION_TENSORS] = {
        &a->encoded, &a->ln1,      &a->ln1_mean,  &a->ln1_rstd, &a->qkv,      &a->atty,
        &a->preatt,  &a->att,      &a->attproj,   &a->residual2, &a->ln2,     &a->ln2_mean,
        &a->ln2_rstd, &a->fch,     &a->fch_gelu,  &a->fcproj,   &a->residual3, &a->lnf,
        &a->lnf_mean, &a->lnf_rstd, &a->logits,   &a->probs,    &a->losses};
    return point_tensors(ptrs, sizes, NUM_ACTIVATION_TENSORS, memory);
}

typedef struct {
    GPT2Config config;
    ParameterTensors params;
    float* params_memory;
    size_t num_parameters;
    ParameterTensors grads;
    float* grads_memory;
    // activations and their gradients, allocated for the last (B, T) that did not fit
    ActivationTensors acts, grads_acts;
    float* acts_memory;
    float* grads_acts_memory;
    size_t num_activations;
    int batch_size, seq_len;  // what the activations were allocated for
    int B, T;                 // of the last forward
    int* inputs;              // (B, T) of the last forward
    int* targets;             // (B, T) of the last forward
    float mean_loss;          // of the last forward with targets, else -1
    ZenFlow* zf;              // if set, the passes call its per-layer hooks (zenflow.h)
} GPT2;

// builds the model from a model file or a spec such as "d12" (random init)
void gpt2_build(GPT2* model, const char* spec_or_path, uint64_t seed) {
    memset(model, 0, sizeof(*model));
    model->params_memory = gpt2_load_or_init(spec_or_path, &model->config, seed);
    model->num_parameters = gpt2_num_params(&model->config);
    point_parameters(&model->params, &model->config, model->params_memory);
    model->grads_memory = (float*)callocCheck(model->num_parameters, sizeof(float));
    point_parameters(&model->grads, &model->config, model->grads_memory);
    model->mean_loss = -1.0f;
}

static void gpt2_ensure_activations(GPT2* model, int B, int T) {
    if (B * T <= model->batch_size * model->seq_len && T <= model->seq_len) { return; }
    free(model->acts_memory);
    free(model->grads_acts_memory);
    free(model->inputs);
    free(model->targets);
    size_t sizes[NUM_ACTIVATION_TENSORS], total = 0;
    activation_sizes(sizes, &model->config, B, T);
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) { total += sizes[i]; }
    model->num_activations = total;
    model->acts_memory = (float*)mallocCheck(total * sizeof(float));
    model->grads_acts_memory = (float*)mallocCheck(total * sizeof(float));
    model->inputs = (int*)mallocCheck((size_t)B * T * sizeof(int));
    model->targets = (int*)mallocCheck((size_t)B * T * sizeof(int));
    model->batch_size = B;
    model->seq_len = T;
}

// forward pass; with targets it also computes the mean loss (model->mean_loss)
void gpt2_forward(GPT2* model, const int* inputs, const int* targets, int B, int T) {
    const GPT2Config* cfg = &model->config;
    const int L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    if (T > cfg->max_seq_len) {
        fatal("sequence length T=%d exceeds the model's maxT=%d (hint: lower -t)", T,
                cfg->max_seq_len);
    }
    for (int i = 0; i < B * T; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || (targets != NULL && (targets[i] < 0 || targets[i] >= V))) {
            fatal("token id out of range at position %d (vocabulary %d)", i, V);
        }
    }
    gpt2_ensure_activations(model, B, T);
    // point the activations for this (B, T); the buffer is big enough for it
    size_t sizes[NUM_ACTIVATION_TENSORS];
    activation_sizes(sizes, cfg, B, T);
    point_activations(&model->acts, sizes, model->acts_memory);
    model->B = B;
    model->T = T;
    memcpy(model->inputs, inputs, (size_t)B * T * sizeof(int));
    if (targets != NULL) { memcpy(model->targets, targets, (size_t)B * T * sizeof(int)); }

    ParameterTensors p = model->params;
    ActivationTensors a = model->acts;
    size_t BTC = (size_t)B * T * C;
    if (model->zf != NULL) { zf_forward_layer(model->zf, -1); }  // wte, wpe in place
    encoder_forward(a.encoded, inputs, p.wte, p.wpe, B, T, C);
    for (int l = 0; l < L; l++) {
        if (model->zf != NULL) { zf_forward_layer(model->zf, l); }  // layer l's weights in place
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BTC;
        float* ln1 = a.ln1 + l * BTC;
        float* qkv = a.qkv + l * BTC * 3;
        float* atty = a.atty + l * BTC;
        float* preatt = a.preatt + (size_t)l * B * NH * T * T;
        float* att = a.att + (size_t)l * B * NH * T * T;
        float* attproj = a.attproj + l * BTC;
        float* residual2 = a.residual2 + l * BTC;
        float* ln2 = a.ln2 + l * BTC;
        float* fch = a.fch + l * BTC * 4;
        float* fch_gelu = a.fch_gelu + l * BTC * 4;
        float* fcproj = a.fcproj + l * BTC;
        float* residual3 = a.residual3 + l * BTC;
        size_t lbt = (size_t)l * B * T;
        layernorm_forward(ln1, a.ln1_mean + lbt, a.ln1_rstd + lbt, residual, p.ln1w + l * C,
                          p.ln1b + l * C, B, T, C);
        matmul_forward(qkv, ln1, p.qkvw + (size_t)l * 3 * C * C, p.qkvb + l * 3 * C, B, T, C, 3 * C);
        attention_forward(atty, preatt, att, qkv, B, T, C, NH);
        matmul_forward(attproj, atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, B, T, C, C);
        residual_forward(residual2, residual, attproj, BTC);
        layernorm_forward(ln2, a.ln2_mean + lbt, a.ln2_rstd + lbt, residual2, p.ln2w + l * C,
                          p.ln2b + l * C, B, T, C);
        matmul_forward(fch, ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, B, T, C, 4 * C);
        gelu_forward(fch_gelu, fch, BTC * 4);
        matmul_forward(fcproj, fch_gelu, p.fcprojw + (size_t)l * 4 * C * C, p.fcprojb + l * C, B, T,
                       4 * C, C);
        residual_forward(residual3, residual2, fcproj, BTC);
    }
    const float* last = a.residual3 + (L - 1) * BTC;  // (B, T, C)
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, p.lnfw, p.lnfb, B, T, C);
    matmul_forward(a.logits, a.lnf, p.wte, NULL, B, T, C, Vp);  // tied output projection
    softmax_crossentropy_forward(a.probs, a.losses, a.logits, targets, B, T, V, Vp);
    if (targets != NULL) {
        float sum = 0.0f;
        for (int i = 0; i < B * T; i++) { sum += a.losses[i]; }
        model->mean_loss = sum / (B * T);
    } else {
        model->mean_loss = -1.0f;
    }
}

void gpt2_zero_grad(GPT2* model) {
    memset(model->grads_memory, 0, model->num_parameters * sizeof(float));
}

// backward pass of the last forward (which must have had targets); ADDS into the gradients,
// so call gpt2_zero_grad first unless accumulating
void gpt2_backward(GPT2* model) {
    if (model->mean_loss < 0.0f) { fatal("gpt2_backward: the forward pass had no targets"); }
    const GPT2Config* cfg = &model->config;
    const int B = model->B, T = model->T;
    const int L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    size_t sizes[NUM_ACTIVATION_TENSORS];
    activation_sizes(sizes, cfg, B, T);
    float* end = point_activations(&model->grads_acts, sizes, model->grads_acts_memory);
    memset(model->grads_acts_memory, 0, (end - model->grads_acts_memory) * sizeof(float));

    ParameterTensors p = model->params, g = model->grads;
    ActivationTensors a = model->acts, da = model->grads_acts;
    size_t BTC = (size_t)B * T * C;
    softmax_crossentropy_backward(da.logits, a.probs, model->targets, B, T, V, Vp);
    matmul_backward(da.lnf, g.wte, NULL, da.logits, a.lnf, p.wte, B, T, C, Vp);
    const float* last = a.residual3 + (L - 1) * BTC;
    float* dlast = da.residual3 + (L - 1) * BTC;
    layernorm_backward(dlast, g.lnfw, g.lnfb, da.lnf, last, p.lnfw, a.lnf_mean, a.lnf_rstd, B, T, C);
    for (int l = L - 1; l >= 0; l--) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BTC;
        float* dresidual = l == 0 ? da.encoded : da.residual3 + (l - 1) * BTC;
        size_t lbt = (size_t)l * B * T, lnh = (size_t)l * B * NH * T * T;
        // MLP block, in reverse
        residual_backward(da.residual2 + l * BTC, da.fcproj + l * BTC, da.residual3 + l * BTC, BTC);
        matmul_backward(da.fch_gelu + l * BTC * 4, g.fcprojw + (size_t)l * 4 * C * C,
                        g.fcprojb + l * C, da.fcproj + l * BTC, a.fch_gelu + l * BTC * 4,
                        p.fcprojw + (size_t)l * 4 * C * C, B, T, 4 * C, C);
        gelu_backward(da.fch + l * BTC * 4, a.fch + l * BTC * 4, da.fch_gelu + l * BTC * 4, BTC * 4);
        matmul_backward(da.ln2 + l * BTC, g.fcw + (size_t)l * 4 * C * C, g.fcb + l * 4 * C,
                        da.fch + l * BTC * 4, a.ln2 + l * BTC, p.fcw + (size_t)l * 4 * C * C, B, T,
                        C, 4 * C);
        layernorm_backward(da.residual2 + l * BTC, g.ln2w + l * C, g.ln2b + l * C, da.ln2 + l * BTC,
                           a.residual2 + l * BTC, p.ln2w + l * C, a.ln2_mean + lbt,
                           a.ln2_rstd + lbt, B, T, C);
        // attention block, in reverse
        residual_backward(dresidual, da.attproj + l * BTC, da.residual2 + l * BTC, BTC);
        matmul_backward(da.atty + l * BTC, g.attprojw + (size_t)l * C * C, g.attprojb + l * C,
                        da.attproj + l * BTC, a.atty + l * BTC, p.attprojw + (size_t)l * C * C, B,
                        T, C, C);
        attention_backward(da.qkv + l * BTC * 3, da.preatt + lnh, da.att + lnh, da.atty + l * BTC,
                           a.qkv + l * BTC * 3, a.att + lnh, B, T, C, NH);
        matmul_backward(da.ln1 + l * BTC, g.qkvw + (size_t)l * 3 * C * C, g.qkvb + l * 3 * C,
                        da.qkv + l * BTC * 3, a.ln1 + l * BTC, p.qkvw + (size_t)l * 3 * C * C, B, T,
                        C, 3 * C);
        layernorm_backward(dresidual, g.ln1w + l * C, g.ln1b + l * C, da.ln1 + l * BTC, residual,
                           p.ln1w + l * C, a.ln1_mean + lbt, a.ln1_rstd + lbt, B, T, C);
        if (model->zf != NULL) { zf_backward_layer_done(model->zf, l); }  // its gradients may leave
    }
    encoder_backward(g.wte, g.wpe, da.encoded, model->inputs, B, T, C);
}

void gpt2_free(GPT2* model) {
    free(model->params_memory);
    free(model->grads_memory);
    free(model->acts_memory);
    free(model->grads_acts_memory);
    free(model->inputs);
    free(model->targets);
}

// ----------------------------------------------------------------------------
// ZenFlow's device primitives for the CPU trainer (zenflow.h calls them; the CUDA
// trainer's versions are in zenflow.cuh). Here the "GPU" is simply the model's own
// buffers. The GPU-side moments live in the model's layout (one m and v per parameter,
// meaningful where the "GPU" owns the element), so in adamw mode the GPU-side AdamW is one
// flat pass per tensor, with no gather; they are packed into zenflow.h's layout only when
// ownership moves and at a checkpoint. AdamW is elementwise, so the layout cannot change a bit.

typedef struct {
    GPT2* model;
    float* gpu_m;    // (num_parameters) in the model's layout
    float* gpu_v;    // (num_parameters) in the model's layout
} CpuDevice;

// packed[r * rows + o] = full[mat->offset + o * cols + order[r]] for the columns order[0..count): a
// transpose. Element by element, every write to packed (or read, in scatter) would touch its own
// cache line, one row's length apart. So the rows go in blocks of COPY_ROWS: a block writes
// COPY_ROWS consecutive floats of each packed column (one 64-byte line) and reads its COPY_ROWS
// rows' cache lines once for all the columns they hold. Offload's transfer time ("other" in
// scripts/bench_modes_cpu.py; d4c256h4, B=1 T=16): 59 -> 13 ms a step. Only copies: the bits cannot
// change.
#define COPY_ROWS 16
static void gather_columns(const float* full, const ZfMatrix* mat, const int* order, int count,
                           float* packed) {
    const float* w = full + mat->offset;
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < mat->rows; o0 += COPY_ROWS) {
        int o1 = o0 + COPY_ROWS < mat->rows ? o0 + COPY_ROWS : mat->rows;
        for (int r = 0; r < count; r++) {
            const float* column = w + order[r];
            float* out = packed + (size_t)r * mat->rows;
            for (int o = o0; o < o1; o++) { out[o] = column[(size_t)o * mat->cols]; }
        }
    }
}

static void scatter_columns(float* full, const ZfMatrix* mat, const int* order, int count,
                            const float* packed) {
    float* w = full + mat->offset;
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < mat->rows; o0 += COPY_ROWS) {
        int o1 = o0 + COPY_ROWS < mat->rows ? o0 + COPY_ROWS : mat->rows;
        for (int r = 0; r < count; r++) {
            float* column = w + order[r];
            const float* in = packed + (size_t)r * mat->rows;
            for (int o = o0; o < o1; o++) { column[(size_t)o * mat->cols] = in[o]; }
        }
    }
}

// 4.2.2 every matrix's column scores into scores[first_col ..]
static void cpu_column_scores(void* ctx, const ZenFlow* zf, float* scores) {
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        const float* g = ((CpuDevice*)ctx)->model->grads_memory + mat->offset;
        float* score = scores + mat->first_col;
        for (int j = 0; j < mat->cols; j++) { score[j] = 0.0f; }
        for (int o = 0; o < mat->rows; o++) {  // rows in order: each column sums o = 0, 1, ...
            const float* row = g + (size_t)o * mat->cols;
            for (int j = 0; j < mat->cols; j++) { score[j] += row[j] * row[j]; }
        }
    }
}

static void cpu_selection_changed(void* ctx, const ZenFlow* zf) { (void)ctx; (void)zf; }

// all = 0 (GPU accumulation, inside a window): only the vectors and the selected columns
static void cpu_zero_grads(void* ctx, const ZenFlow* zf, int all) {
    GPT2* model = ((CpuDevice*)ctx)->model;
    float* grads = model->grads_memory;
    if (all) {
        memset(grads, 0, model->num_parameters * sizeof(float));
        return;
    }
    for (int i = 0; i < zf->own.num_vectors; i++) {
        memset(grads + zf->own.vectors[i].offset, 0, zf->own.vectors[i].n * sizeof(float));
    }
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        float* w = grads + mat->offset;
        for (int o = 0; o < mat->rows; o++) {
            for (int r = 0; r < mat->n_sel; r++) { w[(size_t)o * mat->cols + mat->cols_by_owner[r]] = 0.0f; }
        }
    }
}

#define ADAM_ROWS 16  // rows per block of the GPU-side AdamW over selected columns
static void cpu_gpu_adam(void* ctx, const ZenFlow* zf, ZfAdamHyper h, int step) {
    CpuDevice* dev = (CpuDevice*)ctx;
    double t0 = now_ms();
    float *params = dev->model->params_memory, *grads = dev->model->grads_memory;
    ZfAdamHyper vector_hyper = h;
    vector_hyper.weight_decay = 0.0f;  // spec 1: no decay on vectors
    for (int i = 0; i < zf->own.num_vectors; i++) {
        size_t at = zf->own.vectors[i].offset;
        zf_cpu_adam_step(params + at, dev->gpu_m + at, dev->gpu_v + at, grads + at, 1,
                         zf->own.vectors[i].n, vector_hyper, step);
    }
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        if (mat->n_sel == mat->cols) {  // the whole matrix (adamw mode): one flat pass
            size_t at = mat->offset;
            zf_cpu_adam_step(params + at, dev->gpu_m + at, dev->gpu_v + at, grads + at, 1,
                             (size_t)mat->rows * mat->cols, h, step);
            continue;
        }
        // some columns, ADAM_ROWS rows at a time: copy the block's selected elements of p,
        // g, m, v into four small arrays, one AdamW pass, copy p, m, v back (AdamW is
        // elementwise: the order is free). A block at a time, not the whole matrix, so every
        // row comes from memory once: wte's selected columns lie in nearly all of its cache
        // lines, and whole-matrix copies would read them seven times (2x slower at d4c256h4).
        // The four arrays share one loop: gather_columns on each, per block, took 1.35x as long.
        const int* sel = mat->cols_by_owner;  // the first n_sel entries, ascending
        int ns = mat->n_sel;
#pragma omp parallel
        {
            std::vector<float> block(4 * (size_t)ADAM_ROWS * ns);
#pragma omp for schedule(static)
            for (int o0 = 0; o0 < mat->rows; o0 += ADAM_ROWS) {
                int nr = mat->rows - o0 < ADAM_ROWS ? mat->rows - o0 : ADAM_ROWS;
                size_t n = (size_t)nr * ns, first = mat->offset + (size_t)o0 * mat->cols;
                float *p = block.data(), *g = p + n, *m = g + n, *v = m + n;
                for (int o = 0; o < nr; o++) {
                    for (int r = 0; r < ns; r++) {
                        size_t at = first + (size_t)o * mat->cols + sel[r], k = (size_t)o * ns + r;
                        p[k] = params[at];
                        g[k] = grads[at];
                        m[k] = dev->gpu_m[at];
                        v[k] = dev->gpu_v[at];
                    }
                }
                zf_cpu_adam_step(p, m, v, g, 1, n, h, step);
                for (int o = 0; o < nr; o++) {
                    for (int r = 0; r < ns; r++) {
                        size_t at = first + (size_t)o * mat->cols + sel[r], k = (size_t)o * ns + r;
                        params[at] = p[k];
                        dev->gpu_m[at] = m[k];
                        dev->gpu_v[at] = v[k];
                    }
                }
            }
        }
    }
    trace_event(TRACE_COMPUTE, "GPU-side AdamW", t0, now_ms());  // (the CUDA backend times its own)
}

// the CPU-owned columns of transfer group `group` (-1: all) between `full` (the model's
// parameters or gradients) and the packed host buffer: to_host = 1 gathers, 0 scatters
static void cpu_move_columns(float* full, const ZenFlow* zf, float* host, int group, int to_host) {
    int count;
    const int* mats = zf_group(zf, group, &count);
    for (int k = 0; k < count; k++) {
        const ZfMatrix* mat = &zf->own.matrices[mats[k]];
        const int* order = mat->cols_by_owner + mat->n_sel;
        if (to_host) {
            gather_columns(full, mat, order, mat->cols - mat->n_sel, host + mat->cpu_offset);
        } else {
            scatter_columns(full, mat, order, mat->cols - mat->n_sel, host + mat->cpu_offset);
        }
    }
}

static void cpu_grads_to_host(void* ctx, const ZenFlow* zf, float* host, int group) {
    double t0 = now_ms();
    cpu_move_columns(((CpuDevice*)ctx)->model->grads_memory, zf, host, group, 1);
    trace_event(TRACE_D2H, group < 0 ? "gradients" : "gradients (layer)", t0, now_ms());
}

static void cpu_grads_from_host(void* ctx, const ZenFlow* zf, const float* host) {
    cpu_move_columns(((CpuDevice*)ctx)->model->grads_memory, zf, (float*)host, -1, 0);  // (only read)
}

static void cpu_params_to_host(void* ctx, const ZenFlow* zf, float* host) {
    cpu_move_columns(((CpuDevice*)ctx)->model->params_memory, zf, host, -1, 1);
}

static void cpu_params_from_host(void* ctx, const ZenFlow* zf, const float* host, int group) {
    double t0 = now_ms();
    cpu_move_columns(((CpuDevice*)ctx)->model->params_memory, zf, (float*)host, group, 0);  // (only read)
    trace_event(TRACE_H2D, group < 0 ? "apply" : "apply (layer)", t0, now_ms());
}

// auto U (spec 6): per matrix, the sum of |g| over its GPU-owned elements, and over its
// CPU-owned ones (with -za gpu: A), in double: per row, then the rows in order, so the sums do
// not depend on the thread count
static void cpu_abs_sums(void* ctx, const ZenFlow* zf, double* sel, double* cpu) {
    const float* grads = ((CpuDevice*)ctx)->model->grads_memory;
    std::vector<double> row_sel, row_cpu;
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        const int* order = mat->cols_by_owner;
        row_sel.assign(mat->rows, 0.0);
        row_cpu.assign(mat->rows, 0.0);
#pragma omp parallel for schedule(static)
        for (int o = 0; o < mat->rows; o++) {
            const float* row = grads + mat->offset + (size_t)o * mat->cols;
            for (int r = 0; r < mat->n_sel; r++) { row_sel[o] += fabs((double)row[order[r]]); }
            for (int r = mat->n_sel; r < mat->cols; r++) { row_cpu[o] += fabs((double)row[order[r]]); }
        }
        double s = 0.0, c = 0.0;
        for (int o = 0; o < mat->rows; o++) {
            s += row_sel[o];
            c += row_cpu[o];
        }
        sel[i] = s;
        if (cpu != NULL) { cpu[i] = c; }
    }
}

// all GPU-side moments <-> zenflow.h's packed GPU layout (vectors, then selected columns)
static void cpu_moments_to_host(void* ctx, const ZenFlow* zf, float* m, float* v) {
    CpuDevice* dev = (CpuDevice*)ctx;
    size_t at = 0;
    for (int i = 0; i < zf->own.num_vectors; i++) {
        memcpy(m + at, dev->gpu_m + zf->own.vectors[i].offset, zf->own.vectors[i].n * sizeof(float));
        memcpy(v + at, dev->gpu_v + zf->own.vectors[i].offset, zf->own.vectors[i].n * sizeof(float));
        at += zf->own.vectors[i].n;
    }
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        gather_columns(dev->gpu_m, mat, mat->cols_by_owner, mat->n_sel, m + at + mat->gpu_offset);
        gather_columns(dev->gpu_v, mat, mat->cols_by_owner, mat->n_sel, v + at + mat->gpu_offset);
    }
}

static void cpu_moments_from_host(void* ctx, const ZenFlow* zf, const float* m, const float* v) {
    CpuDevice* dev = (CpuDevice*)ctx;
    size_t at = 0;
    for (int i = 0; i < zf->own.num_vectors; i++) {
        memcpy(dev->gpu_m + zf->own.vectors[i].offset, m + at, zf->own.vectors[i].n * sizeof(float));
        memcpy(dev->gpu_v + zf->own.vectors[i].offset, v + at, zf->own.vectors[i].n * sizeof(float));
        at += zf->own.vectors[i].n;
    }
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        scatter_columns(dev->gpu_m, mat, mat->cols_by_owner, mat->n_sel, m + at + mat->gpu_offset);
        scatter_columns(dev->gpu_v, mat, mat->cols_by_owner, mat->n_sel, v + at + mat->gpu_offset);
    }
}

// every copy here is done when its call returns: nothing to wait for
static void cpu_host_wait(void* ctx, const float* host) { (void)ctx; (void)host; }

// ZenFlow over the CPU trainer's model; free with zf_cpu_free
void zf_cpu_init(ZenFlow* zf, CpuDevice* dev, GPT2* model, ZfConfig cfg) {
    ZfBackend be;
    memset(&be, 0, sizeof(be));  // no asynchronous copies here: no prefetch
    be.ctx = dev;
    be.host_wait = cpu_host_wait;
    be.column_scores = cpu_column_scores;
    be.selection_changed = cpu_selection_changed;
    be.zero_grads = cpu_zero_grads;
    be.gpu_adam = cpu_gpu_adam;
    be.grads_to_host = cpu_grads_to_host;
    be.grads_from_host = cpu_grads_from_host;
    be.params_to_host = cpu_params_to_host;
    be.params_from_host = cpu_params_from_host;
    be.moments_to_host = cpu_moments_to_host;
    be.moments_from_host = cpu_moments_from_host;
    be.abs_sums = cpu_abs_sums;
    zf_init(zf, cfg, &model->config, be);
    dev->model = model;
    // they stand for cudaMalloc'ed memory, which has its pages from the start: in zenflow
    // mode the first GPU-side AdamW (or a migration) scatters columns over nearly every page
    // of them, and would otherwise count Linux's first-write page faults as its time (d12: 1-2 s).
    // zf_init's host-memory check leaves them out, as it leaves out the model's own buffers.
    size_t n = model->num_parameters;
    int zenflow = zf->cfg.mode == ZF_MODE_ZENFLOW;
    dev->gpu_m = zf_host_zeros(n, zenflow);
    dev->gpu_v = zf_host_zeros(n, zenflow);
}

void zf_cpu_free(ZenFlow* zf, CpuDevice* dev) {
    zf_free(zf);
    free(dev->gpu_m);
    free(dev->gpu_v);
}

// ----------------------------------------------------------------------------
// column scores of every step, for the importance-locality study (scripts/locality_study.py)
// File: int32 magic 20241129, version 1, number of matrices; per matrix int32 rows, cols and
// a 32-byte name; then per step: int32 step, and every matrix's cols fp32 scores in order.

FILE* scores_open(const char* path, const ZenFlow* zf) {
    FILE* fp = fopenCheck(path, "wb");
    int header[3] = {20241129, 1, zf->own.num_matrices};
    fwriteCheck(header, sizeof(int), 3, fp, path);
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        int shape[2] = {mat->rows, mat->cols};
        fwriteCheck(shape, sizeof(int), 2, fp, path);
        fwriteCheck(mat->name, 1, sizeof(mat->name), fp, path);
    }
    return fp;
}

void scores_write(FILE* fp, ZenFlow* zf, int step) {
    fwriteCheck(&step, sizeof(int), 1, fp, "scores file");
    std::vector<float> scores(zf->own.total_cols);  // every matrix's, one after another
    zf->backend.column_scores(zf->backend.ctx, zf, scores.data());
    fwriteCheck(scores.data(), sizeof(float), scores.size(), fp, "scores file");
}


// ----------------------------------------------------------------------------
// main training loop
#ifndef TESTING

// the model as the work between steps uses it (llmc/train_loop.h)
static float model_loss(void* ctx, const int* inputs, const int* targets, int B, int T) {
    GPT2* model = (GPT2*)ctx;
    gpt2_forward(model, inputs, targets, B, T);
    return model->mean_loss;
}

static const float* model_next_probs(void* ctx, const int* tokens, int t, float* scratch) {
    GPT2* model = (GPT2*)ctx;
    (void)scratch;  // the forward's softmax is on the host already
    gpt2_forward(model, tokens, NULL, 1, t);
    return model->acts.probs + (size_t)(t - 1) * model->config.padded_vocab_size;
}

static const float* model_params(void* ctx) {
    GPT2* model = (GPT2*)ctx;
    zf_apply_pending(model->zf);  // (pipelining) the parameters complete before they are saved
    return model->params_memory;
}

static void model_stop(void* ctx) {
    GPT2* model = (GPT2*)ctx;
    zf_apply_pending(model->zf);
    zf_wait_idle(model->zf);
}

static void model_finish(void* ctx) { zf_drain(((GPT2*)ctx)->zf); }  // spec 4.7

// a resume that falls back to an older checkpoint puts its parameters in (llmc/checkpoint.h)
static void set_params(void* model, const float* params) {
    GPT2* m = (GPT2*)model;
    memcpy(m->params_memory, params, m->num_parameters * sizeof(float));
}

int main(int argc, char* argv[]) {
    TrainArgs args;
    train_args_parse(&args, argc, argv, ZF_USAGE);
    train_args_refuse(train_args_zflag(&args, 'm') != NULL, "-zm", "the CUDA trainer has it; -tr traces");
    ZfConfig zcfg = zf_parse_flags(args.zflags, "dm", args.output_dir);  // -zd, -zm: the trainers' own
    const char* scores_path = train_args_zflag(&args, 'd');
    if (scores_path != NULL) { check_output_file("-zd", scores_path, args.output_dir); }
    if (scores_path != NULL && zf_effective_config(zcfg).accumulate == ZF_ACCUMULATE_GPU) {
        fatal("-zd scores every step's gradient, but with -za gpu the CPU-owned columns hold the window's sum "
              "(hint: -za cpu)");
    }
    RunDir run;  // -o, -y: llmc/checkpoint.h
    const char* model_spec = run_dir_begin(&run, &args, argc, argv);  // with -y 1, the checkpoint's model

    GPT2 model;
    gpt2_build(&model, model_spec, (uint64_t)args.seed);
    const GPT2Config* cfg = &model.config;
    char threads[32];
    snprintf(threads, sizeof(threads), "threads=%d", omp_get_max_threads());
    train_print_run(cfg, model.num_parameters, &args, threads);
    const int B = args.B, T = args.T, steps = args.steps;
    TrainData data;  // -i, -j, -k (llmc/train_loop.h)
    train_data_open(&data, &args, cfg);

    ZenFlow zf;
    CpuDevice device;
    zf_cpu_init(&zf, &device, &model, zcfg);
    zcfg = zf.cfg;  // as the mode sets it

    run_dir_open(&run);  // once the checks before it have passed: the lock, and a run already there

    model.zf = &zf;
    zf_print_config(&zf);
    zf_print_host_memory(&zf);
    // what the CUDA trainer would allocate on a GPU in this mode (llmc/gpu_memory.h)
    GpuMemorySplit split = {zf.own.vector_elems, zf.own.gpu_capacity, zf.own.cpu_capacity, zcfg.overlap,
                            zcfg.update_interval == ZF_AUTO};
    size_t gpu_bytes[GPU_MEM_PARTS];
    gpu_memory_formula(cfg, B, T, split, gpu_bytes);
    char heading[160];
    snprintf(heading, sizeof(heading), "GPU memory the CUDA trainer would take in %s mode at B=%d T=%d:",
             zf_mode_names[zcfg.mode], B, T);
    gpu_memory_print(gpu_bytes, heading);
    ZfAdamHyper hyper = {args.lr, 0.9f, 0.95f, 1e-8f, args.weight_decay};
    // the sampler's xorshift state is the seed itself, as in llm.c (whose trainers start it at
    // 1337): samples of a model draw the same coins here and there (dev/test/test_llmc_cpu.py)
    uint64_t rng = (uint64_t)args.seed;
    const OptimizerState zf_state = {&zf, zf_save_state, zf_load_state};  // llmc/checkpoint.h
    const TrainerModel hooks = {&model, model_loss, model_next_probs, model_params, model_stop, model_finish};
    int start_step = run_dir_resume(&run, zf_state, &data.train, &rng, {&model, set_params}, cfg);
    // the files the run writes beside -o's are opened once the resume's checks have passed
    if (args.trace_path != NULL) {
        trace_open(args.trace_path, args.trace_first, args.trace_first + args.trace_steps - 1);
    }
    if (zf.cfg.selection_log != NULL) { zf_selection_log(&zf); }  // -zl's, written at each selection
    FILE* scores_file = scores_path != NULL ? scores_open(scores_path, &zf) : NULL;

    for (int step = start_step >= 0 ? start_step : 0; step <= steps; step++) {
        between_steps(&run, &args, step, &data, hooks, zf_state, cfg, &rng);  // -v, -s, -n, a stop
        if (step == steps) { break; }

        trace_set_step(step + 1);
        double t0 = now_ms();
        dataloader_next_batch(&data.train);
        gpt2_forward(&model, data.train.inputs, data.train.targets, B, T);
        if (!isfinite(model.mean_loss)) { gpt2_fatal_loss(step + 1, model.mean_loss, cfg, model.params_memory); }
        gpt2_warn_high_loss(step + 1, model.mean_loss, cfg->vocab_size);
        double t1 = now_ms();
        trace_event(TRACE_COMPUTE, "forward", t0, t1);
        zf_before_backward(&zf, step);  // zero the gradients (with -za gpu: what the window does not accumulate)
        gpt2_backward(&model);
        trace_event(TRACE_COMPUTE, "backward", t1, now_ms());
        if (scores_file != NULL) { scores_write(scores_file, &zf, step); }
        zf_step(&zf, step, hyper);
        double ms = now_ms() - t0;
        printf("step %d/%d | loss %f | %.1f ms | %.0f tok/s", step + 1, steps, model.mean_loss, ms,
               B * T / (ms / 1e3));
        zf_print_step_stats(&zf);  // | cpu | moved | select | window, where they are new
        printf("\n");
        if (run.log) { fprintf(run.log, "s:%d trl:%f\n", step, model.mean_loss); fflush(run.log); }  // llm.c: s = updates before it
    }

    if (run.log) { fcloseCheck(run.log, "main.log"); }
    if (scores_file != NULL) { fcloseCheck(scores_file, scores_path); }
    trace_close();
    zf_cpu_free(&zf, &device);
    train_data_free(&data);
    gpt2_free(&model);
    return 0;
}
#endif
