/*
The part of cuBLASLt that llmc/cuda_kernels.cuh uses, for the CPU emulator
(dev/cuda/emu/cuda_runtime.h): fp32 matmuls, column-major, optional transposes, strided
batches, the BIAS epilogue, beta. It follows cuBLASLt's documented contract, checked here
strictly so that a wrong call fails instead of computing something else:
  D = alpha * op(A) op(B) + beta * C (+ bias[i] on every row i of column j, EPILOGUE_BIAS)
  op(A) is m x k: A is stored rows x cols = (m, k) for OP_N or (k, m) for OP_T, with a
  leading dimension >= rows; op(B) is k x n likewise; C and D are m x n. Every layout of a
  batched call has the same batch count.
Each output element sums its k products in order in fp32. CUBLAS_COMPUTE_32F_FAST_TF32
rounds A and B to TF32 first (10 mantissa bits, to nearest), roughly what tensor cores do.
EMU_NO_ALGORITHM=bias|tf32|all makes the heuristic find no algorithm for matmuls with the
bias epilogue, for TF32, or for any matmul, as the real library may for some shapes.
*/
#ifndef EMU_CUBLASLT_H
#define EMU_CUBLASLT_H

#include "cuda_runtime.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUDA_R_32F = 0 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;
typedef enum { CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4 } cublasLtEpilogue_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
} cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,
} cublasLtMatrixLayoutAttribute_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

typedef struct { int dummy; } EmuLtContext;
typedef EmuLtContext* cublasLtHandle_t;
typedef struct {
    cublasComputeType_t compute;
    cublasOperation_t trans_a, trans_b;
    cublasLtEpilogue_t epilogue;
    const float* bias;
} EmuLtDesc;
typedef EmuLtDesc* cublasLtMatmulDesc_t;
typedef struct {
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
} EmuLtLayout;
typedef EmuLtLayout* cublasLtMatrixLayout_t;
typedef struct { uint64_t max_workspace; } EmuLtPreference;
typedef EmuLtPreference* cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

static inline const char* cublasLtGetStatusString(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
           : s == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
           : s == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED"
                                              : "CUBLAS_STATUS_NOT_INITIALIZED";
}

static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { *h = new EmuLtContext(); return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }

static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                                      cudaDataType_t scale) {
    if (scale != CUDA_R_32F) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    *d = new EmuLtDesc{compute, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                            const void* buf, size_t size) {
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA:
        case CUBLASLT_MATMUL_DESC_TRANSB:
            if (size != sizeof(cublasOperation_t)) { return CUBLAS_STATUS_INVALID_VALUE; }
            memcpy(attr == CUBLASLT_MATMUL_DESC_TRANSA ? &d->trans_a : &d->trans_b, buf, size);
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_EPILOGUE:
            if (size != sizeof(cublasLtEpilogue_t)) { return CUBLAS_STATUS_INVALID_VALUE; }
            memcpy(&d->epilogue, buf, size);
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
            if (size != sizeof(void*)) { return CUBLAS_STATUS_INVALID_VALUE; }
            memcpy(&d->bias, buf, size);
            return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows,
                                                        uint64_t cols, int64_t ld) {
    if (type != CUDA_R_32F || ld < (int64_t)rows || ld < 1) { return CUBLAS_STATUS_INVALID_VALUE; }
    *l = new EmuLtLayout{rows, cols, ld, 1, 0};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                              const void* buf, size_t size) {
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof(int32_t)) {
        memcpy(&l->batch, buf, size);
        return l->batch >= 1 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    }
    if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof(int64_t)) {
        memcpy(&l->stride, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
    *p = new EmuLtPreference{0};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete p; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                                  cublasLtMatmulPreferenceAttributes_t attr,
                                                                  const void* buf, size_t size) {
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != sizeof(uint64_t)) { return CUBLAS_STATUS_INVALID_VALUE; }
        memcpy(&p->max_workspace, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        return size == sizeof(uint32_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

// the shapes must agree: op(A) m x k, op(B) k x n, C and D m x n, batch counts equal
static inline cublasStatus_t emu_lt_check(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                          cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl) {
    uint64_t m = d->trans_a == CUBLAS_OP_N ? a->rows : a->cols;
    uint64_t k = d->trans_a == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t kb = d->trans_b == CUBLAS_OP_N ? b->rows : b->cols;
    uint64_t n = d->trans_b == CUBLAS_OP_N ? b->cols : b->rows;
    if (kb != k || c->rows != m || c->cols != n || dl->rows != m || dl->cols != n) {
        fprintf(stderr, "cuBLASLt emulator: shapes do not agree: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu\n",
                (unsigned long long)m, (unsigned long long)k, (unsigned long long)kb, (unsigned long long)n,
                (unsigned long long)c->rows, (unsigned long long)c->cols, (unsigned long long)dl->rows,
                (unsigned long long)dl->cols);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (a->batch != dl->batch || b->batch != dl->batch || c->batch != dl->batch) {
        fprintf(stderr, "cuBLASLt emulator: batch counts differ (%d %d %d %d)\n", a->batch, b->batch, c->batch, dl->batch);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                                            cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                                            cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t,
                                                            int requested, cublasLtMatmulHeuristicResult_t* results,
                                                            int* found) {
    cublasStatus_t s = emu_lt_check(d, a, b, c, dl);
    *found = 0;
    if (s != CUBLAS_STATUS_SUCCESS) { return s; }
    if (requested < 1) { return CUBLAS_STATUS_INVALID_VALUE; }
    const char* none = getenv("EMU_NO_ALGORITHM");
    if (none != NULL && (strcmp(none, "all") == 0 || (strcmp(none, "bias") == 0 && d->epilogue == CUBLASLT_EPILOGUE_BIAS) ||
                         (strcmp(none, "tf32") == 0 && d->compute == CUBLAS_COMPUTE_32F_FAST_TF32))) {
        return CUBLAS_STATUS_SUCCESS;  // (found = 0)
    }
    memset(&results[0], 0, sizeof(results[0]));
    results[0].algo.data[0] = 1;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static inline float emu_tf32(float x) {  // to the nearest value with 10 mantissa bits
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) { u = (u + 0x1000u) & 0xffffe000u; }
    memcpy(&x, &u, 4);
    return x;
}

// element (i, j) of a stored column-major matrix, or of its transpose
static inline const float* emu_lt_at(const float* base, const EmuLtLayout* l, int trans, int64_t i, int64_t j) {
    return trans ? base + j + i * l->ld : base + i + j * l->ld;
}

static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha_p,
                                            const void* A, cublasLtMatrixLayout_t la, const void* B,
                                            cublasLtMatrixLayout_t lb, const void* beta_p, const void* C,
                                            cublasLtMatrixLayout_t lc, void* D, cublasLtMatrixLayout_t ld,
                                            const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                                            cudaStream_t stream) {
    EMU_LOCK;
    cublasStatus_t s = emu_lt_check(desc, la, lb, lc, ld);
    if (s != CUBLAS_STATUS_SUCCESS) { return s; }
    if (algo == NULL || (workspace_bytes > 0 && !emu_is_device(workspace, workspace_bytes))) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    EmuLtDesc d = *desc;
    EmuLtLayout a = *la, b = *lb, c = *lc, dd = *ld;
    int ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T;
    int64_t m = dd.rows, n = dd.cols, k = ta ? a.rows : a.cols;
    float alpha = *(const float*)alpha_p, beta = *(const float*)beta_p;
    // every matrix, and the bias, must lie in device memory
    const struct { const void* p; const EmuLtLayout* l; const char* name; } mats[4] = {
        {A, &a, "A"}, {B, &b, "B"}, {C, &c, "C"}, {D, &dd, "D"}};
    size_t extent[4];  // floats from the start to the last element, every batch
    for (int i = 0; i < 4; i++) {
        const EmuLtLayout* l = mats[i].l;
        size_t last = (size_t)((l->batch - 1) * l->stride + (int64_t)(l->cols - 1) * l->ld + l->rows);
        if (!emu_is_device(mats[i].p, last * sizeof(float))) {
            emu_die("cublasLtMatmul: matrix %s [%p, +%zu floats) is not inside one device allocation", mats[i].name,
                    mats[i].p, last);
        }
        extent[i] = last;
    }
    (void)extent;  // (read by the race check only)
    if (d.epilogue == CUBLASLT_EPILOGUE_BIAS && !emu_is_device(d.bias, (size_t)m * sizeof(float))) {
        emu_die("cublasLtMatmul: the bias [%p, +%lld floats) is not inside one device allocation", (const void*)d.bias,
                (long long)m);
    }
    int tf32 = d.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    const float* Ap = (const float*)A;
    const float* Bp = (const float*)B;
    const float* Cp = (const float*)C;
    float* Dp = (float*)D;
    emu_enqueue(stream, [=]() {
#if EMU_TSAN
        // for the race check: what the product reads and writes, checked once as ranges; the
        // arithmetic below is not checked element by element (that would be 100x slower)
        __tsan_read_range((void*)Ap, extent[0] * sizeof(float));
        __tsan_read_range((void*)Bp, extent[1] * sizeof(float));
        if (beta != 0.0f) { __tsan_read_range((void*)Cp, extent[2] * sizeof(float)); }
        if (d.epilogue == CUBLASLT_EPILOGUE_BIAS) { __tsan_read_range((void*)d.bias, m * sizeof(float)); }
        __tsan_write_range(Dp, extent[3] * sizeof(float));
        EMU_UNCHECKED_BEGIN();
#endif
        // op(A) row by row and op(B) column by column, contiguous (and rounded to TF32 if
        // asked); then each output is a dot product over k in order, 8 outputs at a time
        // (independent sums: the same result as one at a time, several times faster)
        std::vector<float> at((size_t)m * k), bt((size_t)n * k);
        for (int32_t batch = 0; batch < dd.batch; batch++) {
            const float* Ab = Ap + batch * a.stride;
            const float* Bb = Bp + batch * b.stride;
            const float* Cb = Cp + batch * c.stride;
            float* Db = Dp + batch * dd.stride;
            for (int64_t i = 0; i < m; i++) {
                for (int64_t p = 0; p < k; p++) {
                    float x = *emu_lt_at(Ab, &a, ta, i, p);
                    at[i * k + p] = tf32 ? emu_tf32(x) : x;
                }
            }
            for (int64_t j = 0; j < n; j++) {
                for (int64_t p = 0; p < k; p++) {
                    float y = *emu_lt_at(Bb, &b, tb, p, j);
                    bt[j * k + p] = tf32 ? emu_tf32(y) : y;
                }
            }
#pragma omp parallel for schedule(static)
            for (int64_t j = 0; j < n; j++) {
                const float* y = &bt[j * k];
                for (int64_t i0 = 0; i0 < m; i0 += 8) {
                    int64_t count = std::min<int64_t>(8, m - i0);
                    float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                    for (int64_t p = 0; p < k; p++) {
                        for (int64_t q = 0; q < count; q++) { sum[q] += at[(i0 + q) * k + p] * y[p]; }
                    }
                    for (int64_t q = 0; q < count; q++) {
                        int64_t i = i0 + q;
                        float out = alpha * sum[q];
                        if (beta != 0.0f) { out += beta * Cb[i + j * c.ld]; }  // beta = 0: C is not read
                        if (d.epilogue == CUBLASLT_EPILOGUE_BIAS) { out += d.bias[i]; }
                        Db[i + j * dd.ld] = out;
                    }
                }
            }
        }
#if EMU_TSAN
        EMU_UNCHECKED_END();
#endif
    });
    return CUBLAS_STATUS_SUCCESS;
}

#endif  // EMU_CUBLASLT_H
