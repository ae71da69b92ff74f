/*
AdamW for one element, exactly docs/zenflow_spec.md section 3.1: the one formula the GPU
kernels and the CPU's scalar path run, so that they agree bit for bit by construction (the
AVX path in cpu_adam.cpp is a copy, which the tests pin). Build with -ffp-contract=off (g++)
and -fmad=false (nvcc): a fused multiply-add would round once where the spec rounds twice.
*/
#ifndef LLMC_ADAMW_H
#define LLMC_ADAMW_H

#include <math.h>

#ifdef __CUDACC__
#define ADAMW_HOST_DEVICE __host__ __device__
#else
#define ADAMW_HOST_DEVICE
#endif

// the constants of one step, all fp32
typedef struct {
    float lr, b1, b2, omb1, omb2, bc1, bc2, eps, wd;
} AdamWConsts;

// the constants of step s (1-based): 1 - b in fp32, bias corrections in double then rounded
static inline AdamWConsts adamw_consts(float lr, float beta1, float beta2, float eps, float weight_decay, int s) {
    AdamWConsts c;
    c.lr = lr;
    c.b1 = beta1;
    c.b2 = beta2;
    c.omb1 = 1.0f - beta1;  // fp32 subtractions
    c.omb2 = 1.0f - beta2;
    c.bc1 = (float)(1.0 - pow((double)beta1, (double)s));  // double, then one rounding
    c.bc2 = (float)(1.0 - pow((double)beta2, (double)s));
    c.eps = eps;
    c.wd = weight_decay;
    return c;
}

// one element with gradient g, in the order of spec 3.1
ADAMW_HOST_DEVICE static inline void adamw_one(float* p, float* m, float* v, float g, const AdamWConsts& c) {
    float mi = c.b1 * *m + c.omb1 * g;
    float vi = c.b2 * *v + (c.omb2 * g) * g;
    float mhat = mi / c.bc1;
    float vhat = vi / c.bc2;
    float pi = *p;
    // wd*p is computed even when wd == 0, as spec 3.1 writes it (for a finite p, skipping it
    // changes no bit: at most a zero update's sign, which p - lr * update does not show)
    *p = pi - c.lr * (mhat / (sqrtf(vhat) + c.eps) + c.wd * pi);
    *m = mi;
    *v = vi;
}

#endif  // LLMC_ADAMW_H
