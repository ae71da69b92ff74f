/*
ZenFlow's GPU backend (zenflow.cuh), primitive by primitive, against CPU references, then
timed. The primitives are called the way zenflow.h calls them, on a real model layout with
random ownership, random parameters and random gradients.

Validation (tolerance 0 = bitwise unless said):
  - column scores (spec 4.2.2) vs a double-precision sum: 1e-5 relative (fp32 sums in
    another order), and bitwise equal on a second call (deterministic);
  - AdamW on the GPU-owned elements (spec 3.1), 3 steps: parameters bitwise vs the scalar
    CPU loop, the moments bitwise after moments_to_host (zenflow.h's layout), every
    CPU-owned element untouched;
  - grads_to_host (gather + copy down) vs a gather written here (gather_cpu_owned); also layer by
    layer (zenflow.h's transfer groups, in the backward's order);
  - params_from_host (copy up + scatter) vs a scatter written here, GPU-owned columns untouched;
    also layer by layer (in the forward's order);
  - zero_grads(all = 0): the vectors and GPU-owned columns 0, the CPU-owned columns kept;
  - moments_from_host then moments_to_host, grads_from_host: round trips;
  - abs_sums (auto U, spec 6): per matrix sum |g| over its GPU- and CPU-owned elements vs
    double sums on the CPU, 1e-12 relative (double sums in another order).
Timing (GPT-2 124M layout, k = 0.1 and k = 1): gather, scatter, selective AdamW against
plain AdamW over the same elements, zeroing, and the copies over PCIe (pinned host memory).

  make -C dev/cuda && ./build/cuda/zenflow
*/
#include <vector>

#include "common.h"
#include "../../zenflow.cuh"

// random ownership as zf_select leaves it (k of each matrix's columns, ascending, then the rest)
static void random_ownership(ZenFlow* zf, uint64_t* rng) {
    for (int i = 0; i < zf->own.num_matrices; i++) {
        ZfMatrix* mat = &zf->own.matrices[i];
        int* order = mat->cols_by_owner;
        for (int j = 0; j < mat->cols; j++) { order[j] = j; }
        for (int j = mat->cols - 1; j > 0; j--) {
            int r = (int)(random_u32(rng) % (uint32_t)(j + 1));
            int tmp = order[j];
            order[j] = order[r];
            order[r] = tmp;
        }
        mat->n_sel = zf_n_sel(zf->cfg.topk, mat->cols);
        std::sort(order, order + mat->n_sel);
        std::sort(order + mat->n_sel, order + mat->cols);
    }
    zf_layout(zf);
    zf->backend.selection_changed(zf->backend.ctx, zf);
}

// the CPU backend's gather: packed[cpu_offset + r * rows + o] = full[o, col_r] (CPU-owned)
static void gather_cpu_owned(const ZenFlow* zf, const float* full, float* packed) {
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        for (int o = 0; o < mat->rows; o++) {
            for (int r = 0; r < mat->cols - mat->n_sel; r++) {
                packed[mat->cpu_offset + (size_t)r * mat->rows + o] =
                    full[mat->offset + (size_t)o * mat->cols + mat->cols_by_owner[mat->n_sel + r]];
            }
        }
    }
}

static void scatter_cpu_owned(const ZenFlow* zf, float* full, const float* packed) {
    for (int i = 0; i < zf->own.num_matrices; i++) {
        const ZfMatrix* mat = &zf->own.matrices[i];
        for (int o = 0; o < mat->rows; o++) {
            for (int r = 0; r < mat->cols - mat->n_sel; r++) {
                full[mat->offset + (size_t)o * mat->cols + mat->cols_by_owner[mat->n_sel + r]] =
                    packed[mat->cpu_offset + (size_t)r * mat->rows + o];
            }
        }
    }
}

// spec 3.1, one element (cpu_adam.cpp's scalar loop)
static void adam_cpu(float* p, float* m, float* v, float g, ZfAdamHyper h, int s) {
    float omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;
    float bc1 = (float)(1.0 - pow((double)h.beta1, (double)s)), bc2 = (float)(1.0 - pow((double)h.beta2, (double)s));
    float mi = h.beta1 * *m + omb1 * g;
    float vi = h.beta2 * *v + (omb2 * g) * g;
    float mhat = mi / bc1, vhat = vi / bc2;
    float pi = *p;
    *p = pi - h.lr * (mhat / (sqrtf(vhat) + h.eps) + h.weight_decay * pi);
    *m = mi;
    *v = vi;
}

static int bitwise(const float* a, const float* b, size_t n, const char* what) {
    int ok = memcmp(a, b, n * sizeof(float)) == 0;
    size_t first = n;
    for (size_t i = 0; i < n && !ok; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            first = i;
            break;
        }
    }
    printf("  %-44s %10zu values  %s", what, n, ok ? "bitwise ok\n" : "FAIL");
    if (!ok) { printf(" (first at %zu: gpu %.9g cpu %.9g)\n", first, a[first], b[first]); }
    g_checks++;
    g_failures += !ok;
    return ok;
}

static void validate(const char* spec, double k, uint64_t* rng) {
    GPT2Config c;
    if (!gpt2_parse_model_spec(spec, &c)) { fatal("bad spec %s", spec); }
    size_t N = gpt2_num_params(&c);
    printf("model %s (%zu parameters), k = %g, random ownership\n", spec, N, k);
    float* h_params = random_floats(N, -1.0f, 1.0f, rng);
    float* h_grads = random_floats(N, -1e-2f, 1e-2f, rng);
    float* d_params = to_device(h_params, N);
    float* d_grads = to_device(h_grads, N);
    ZfConfig cfg = ZF_DEFAULTS;
    cfg.topk = k;
    cfg.overlap = 0;
    cfg.update_interval = ZF_AUTO;  // (so that abs_sums has its buffers)
    ZenFlow zf;
    ZfCudaDevice dev;
    zf_cuda_init(&zf, &dev, d_params, d_grads, &c, cfg);
    const ZfBackend* be = &zf.backend;
    random_ownership(&zf, rng);
    const size_t g = zf.own.vector_elems + zf.own.gpu_sel_elems, ce = zf.own.cpu_elems;

    // spec 6 sums, before anything changes the gradients
    {
        std::vector<double> sel(zf.own.num_matrices, -1.0), cpu(zf.own.num_matrices, -1.0);
        be->abs_sums(be->ctx, &zf, sel.data(), cpu.data());
        be->abs_sums_wait(be->ctx, &zf);
        double worst = 0.0;
        for (int i = 0; i < zf.own.num_matrices; i++) {
            const ZfMatrix* mat = &zf.own.matrices[i];
            double want_sel = 0.0, want_cpu = 0.0;
            for (int o = 0; o < mat->rows; o++) {
                for (int r = 0; r < mat->cols; r++) {
                    double x = fabs((double)h_grads[mat->offset + (size_t)o * mat->cols + mat->cols_by_owner[r]]);
                    (r < mat->n_sel ? want_sel : want_cpu) += x;
                }
            }
            double err_sel = fabs(sel[i] - want_sel) / std::max(want_sel, 1e-300);
            double err_cpu = fabs(cpu[i] - want_cpu) / std::max(want_cpu, 1e-300);
            if (worse(err_sel, worst)) { worst = err_sel; }
            if (worse(err_cpu, worst)) { worst = err_cpu; }
        }
        printf("  %-44s max rel err %.2e (tol 1e-12)  %s\n", "abs_sums (auto U) vs double sums", worst,
               worst <= 1e-12 ? "ok" : "FAIL");
        g_checks++;
        g_failures += !(worst <= 1e-12);
    }

    // 4.2.2 column scores
    double worst = 0.0;
    int deterministic = 1;
    std::vector<float> all_scores(zf.own.total_cols), again(zf.own.total_cols);
    be->column_scores(be->ctx, &zf, all_scores.data());
    be->column_scores(be->ctx, &zf, again.data());
    deterministic = memcmp(all_scores.data(), again.data(), all_scores.size() * sizeof(float)) == 0;
    for (int i = 0; i < zf.own.num_matrices; i++) {
        const ZfMatrix* mat = &zf.own.matrices[i];
        const float* scores = all_scores.data() + mat->first_col;
        for (int j = 0; j < mat->cols; j++) {
            double ref = 0.0;
            for (int o = 0; o < mat->rows; o++) {
                double x = h_grads[mat->offset + (size_t)o * mat->cols + j];
                ref += x * x;
            }
            double err = fabs(scores[j] - ref) / ref;
            if (worse(err, worst)) { worst = err; }
        }
    }
    printf("  %-44s max rel err %.2e (tol 1e-5)  %s, repeat %s\n", "column scores vs double sums", worst,
           worst <= 1e-5 ? "ok" : "FAIL", deterministic ? "bitwise equal" : "DIFFERS");
    g_checks += 2;
    g_failures += !(worst <= 1e-5) + !deterministic;

    // 4.3 the GPU's AdamW, 3 steps, against the scalar loop on the GPU-owned elements
    ZfAdamHyper h = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    std::vector<float> p_ref(h_params, h_params + N), m_ref(g, 0.0f), v_ref(g, 0.0f);
    for (int s = 1; s <= 3; s++) {
        be->gpu_adam(be->ctx, &zf, h, s);
        ZfAdamHyper hv = h;
        hv.weight_decay = 0.0f;
        size_t at = 0;
        for (int i = 0; i < zf.own.num_vectors; i++) {
            for (size_t j = 0; j < zf.own.vectors[i].n; j++, at++) {
                size_t e = zf.own.vectors[i].offset + j;
                adam_cpu(&p_ref[e], &m_ref[at], &v_ref[at], h_grads[e], hv, s);
            }
        }
        for (int i = 0; i < zf.own.num_matrices; i++) {  // zenflow.h's GPU layout: column by column
            const ZfMatrix* mat = &zf.own.matrices[i];
            for (int r = 0; r < mat->n_sel; r++) {
                for (int o = 0; o < mat->rows; o++) {
                    size_t e = mat->offset + (size_t)o * mat->cols + mat->cols_by_owner[r];
                    size_t q = zf.own.vector_elems + mat->gpu_offset + (size_t)r * mat->rows + o;
                    adam_cpu(&p_ref[e], &m_ref[q], &v_ref[q], h_grads[e], h, s);
                }
            }
        }
    }
    std::vector<float> got(N), m_got(g), v_got(g);
    cudaCheck(cudaMemcpy(got.data(), d_params, N * sizeof(float), cudaMemcpyDeviceToHost));
    bitwise(got.data(), p_ref.data(), N, "AdamW: parameters (CPU-owned untouched)");
    be->moments_to_host(be->ctx, &zf, m_got.data(), v_got.data());
    bitwise(m_got.data(), m_ref.data(), g, "AdamW: m via moments_to_host");
    bitwise(v_got.data(), v_ref.data(), g, "AdamW: v via moments_to_host");

    // 4.4 gradients to the host
    std::vector<float> packed(ce + 1, -1.0f), want(ce + 1, -1.0f);
    be->grads_to_host(be->ctx, &zf, packed.data(), -1);
    be->host_wait(be->ctx, packed.data());
    gather_cpu_owned(&zf, h_grads, want.data());
    bitwise(packed.data(), want.data(), ce + 1, "grads_to_host vs gather_cpu_owned");
    std::fill(packed.begin(), packed.end(), -1.0f);
    for (int gr = zf.own.num_groups - 1; gr >= 0; gr--) { be->grads_to_host(be->ctx, &zf, packed.data(), gr); }
    be->host_wait(be->ctx, packed.data());
    bitwise(packed.data(), want.data(), ce + 1, "grads_to_host layer by layer");

    // 4.6 apply
    float* fresh = random_floats(ce + 2, -2.0f, 2.0f, rng);
    be->params_from_host(be->ctx, &zf, fresh, -1);
    scatter_cpu_owned(&zf, p_ref.data(), fresh);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(got.data(), d_params, N * sizeof(float), cudaMemcpyDeviceToHost));
    bitwise(got.data(), p_ref.data(), N, "params_from_host vs scatter_cpu_owned");
    for (int gr = 0; gr < zf.own.num_groups; gr++) { be->params_from_host(be->ctx, &zf, fresh + 2, gr); }
    scatter_cpu_owned(&zf, p_ref.data(), fresh + 2);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(got.data(), d_params, N * sizeof(float), cudaMemcpyDeviceToHost));
    bitwise(got.data(), p_ref.data(), N, "params_from_host layer by layer");
    // and the prefetched path: upload first (as the updater thread does), then apply
    be->params_prefetch(be->ctx, &zf, fresh + 1);
    be->host_wait(be->ctx, fresh + 1);  // not one of zenflow.h's buffers: waits for all copies
    be->params_from_host(be->ctx, &zf, fresh + 1, -1);
    scatter_cpu_owned(&zf, p_ref.data(), fresh + 1);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(got.data(), d_params, N * sizeof(float), cudaMemcpyDeviceToHost));
    bitwise(got.data(), p_ref.data(), N, "params_prefetch + params_from_host");

    // spec 7 zeroing inside a window
    be->zero_grads(be->ctx, &zf, 0);
    std::vector<float> g_ref(h_grads, h_grads + N);
    for (int i = 0; i < zf.own.num_vectors; i++) {
        for (size_t j = 0; j < zf.own.vectors[i].n; j++) { g_ref[zf.own.vectors[i].offset + j] = 0.0f; }
    }
    for (int i = 0; i < zf.own.num_matrices; i++) {
        const ZfMatrix* mat = &zf.own.matrices[i];
        for (int o = 0; o < mat->rows; o++) {
            for (int r = 0; r < mat->n_sel; r++) { g_ref[mat->offset + (size_t)o * mat->cols + mat->cols_by_owner[r]] = 0.0f; }
        }
    }
    cudaCheck(cudaMemcpy(got.data(), d_grads, N * sizeof(float), cudaMemcpyDeviceToHost));
    bitwise(got.data(), g_ref.data(), N, "zero_grads(all = 0)");
    // A back into the gradient buffer (resuming with GPU accumulation)
    be->grads_from_host(be->ctx, &zf, fresh);
    scatter_cpu_owned(&zf, g_ref.data(), fresh);
    cudaCheck(cudaMemcpy(got.data(), d_grads, N * sizeof(float), cudaMemcpyDeviceToHost));
    bitwise(got.data(), g_ref.data(), N, "grads_from_host");
    // moments round trip
    float* mm = random_floats(g, 0.0f, 1.0f, rng);
    float* vv = random_floats(g, 0.0f, 1.0f, rng);
    be->moments_from_host(be->ctx, &zf, mm, vv);
    be->moments_to_host(be->ctx, &zf, m_got.data(), v_got.data());
    bitwise(m_got.data(), mm, g, "moments_from_host + moments_to_host: m");
    bitwise(v_got.data(), vv, g, "moments_from_host + moments_to_host: v");

    free(mm);
    free(vv);
    free(fresh);
    zf_cuda_free(&zf, &dev);
    free(h_params);
    free(h_grads);
    cudaCheck(cudaFree(d_params));
    cudaCheck(cudaFree(d_grads));
}

static void benchmark(const char* spec, double k, uint64_t* rng) {
    if (!benchmarks_wanted()) { return; }
    GPT2Config c;
    if (!gpt2_parse_model_spec(spec, &c)) { fatal("bad spec %s", spec); }
    size_t N = gpt2_num_params(&c);
    float* h = random_floats(N, -1.0f, 1.0f, rng);
    float* d_params = to_device(h, N);
    float* d_grads = to_device(h, N);
    ZfConfig cfg = ZF_DEFAULTS;
    cfg.topk = k;
    cfg.overlap = 1;
    ZenFlow zf;
    ZfCudaDevice dev;
    zf_cuda_init(&zf, &dev, d_params, d_grads, &c, cfg);
    const ZfBackend* be = &zf.backend;
    random_ownership(&zf, rng);
    printf("benchmark %s k=%g: %zu CPU-owned, %zu GPU-owned elements (+ %zu in vectors)\n", spec, k, zf.own.cpu_elems,
           zf.own.gpu_sel_elems, zf.own.vector_elems);
    const double ce = (double)zf.own.cpu_elems, ge = (double)zf.own.gpu_sel_elems + zf.own.vector_elems;
    float us;
    if (zf.own.cpu_elems > 0) {
        long long tiles = dev.cpu_tiles.h_start[dev.cpu_tiles.num_sets];
        us = benchmark_us(10, [&] {
            zf_gather_columns_kernel<<<(unsigned)tiles, dim3(ZF_TILE, ZF_TILE_ROWS)>>>(dev.grads_stage->buf, d_grads,
                                                                                     dev.cpu_tiles, 0);
            cudaCheck(cudaGetLastError());
        });
        report_bandwidth("gather CPU-owned columns (read+write)", us, 2.0 * ce * 4);
        us = benchmark_us(10, [&] {
            zf_scatter_columns_kernel<<<(unsigned)tiles, dim3(ZF_TILE, ZF_TILE_ROWS)>>>(d_params, dev.grads_stage->buf,
                                                                                      dev.cpu_tiles, 0);
            cudaCheck(cudaGetLastError());
        });
        report_bandwidth("scatter CPU-owned columns", us, 2.0 * ce * 4);
    }
    int s = 1;
    ZfAdamHyper hy = {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
    us = benchmark_us(10, [&] { be->gpu_adam(be->ctx, &zf, hy, s++); });
    report_bandwidth("AdamW on GPU-owned elements (7 x 4 B each)", us, 7.0 * ge * 4);
    float *pm = NULL, *pv = NULL;
    cudaCheck(cudaMalloc(&pm, (size_t)ge * sizeof(float)));
    cudaCheck(cudaMalloc(&pv, (size_t)ge * sizeof(float)));
    cudaCheck(cudaMemset(pm, 0, (size_t)ge * sizeof(float)));
    cudaCheck(cudaMemset(pv, 0, (size_t)ge * sizeof(float)));
    us = benchmark_us(10, [&] { adamw_update(d_params, pm, pv, d_grads, (size_t)ge, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, s++); });
    report_bandwidth("  for scale: contiguous AdamW, same count", us, 7.0 * ge * 4);
    us = benchmark_us(10, [&] { be->zero_grads(be->ctx, &zf, 0); });
    report_bandwidth("zero_grads(all = 0) (write)", us, ge * 4);
    if (zf.own.cpu_elems > 0) {  // PCIe: the pinned master, both directions, host clock; all at
        // once, and layer by layer (the per-layer pipeline's launches and copies, back to back)
        const char* names[4] = {"grads_to_host (D2H)", "params_from_host (H2D)", "grads_to_host, per layer",
                                "params_from_host, per layer"};
        for (int way = 0; way < 4; way++) {
            double best = 1e30;
            for (int i = 0; i < 5; i++) {
                cudaCheck(cudaDeviceSynchronize());
                double t0 = now_ms();
                for (int part = 0; part < (way < 2 ? 1 : zf.own.num_groups); part++) {
                    int gr = way < 2 ? -1 : way == 2 ? zf.own.num_groups - 1 - part : part;
                    if (way % 2 == 0) {
                        be->grads_to_host(be->ctx, &zf, zf.cpu.master, gr);
                    } else {
                        be->params_from_host(be->ctx, &zf, zf.cpu.master, gr);
                    }
                }
                be->host_wait(be->ctx, zf.cpu.master);
                cudaCheck(cudaDeviceSynchronize());
                best = std::min(best, now_ms() - t0);
            }
            double gbs = ce * 4 / (best * 1e-3) / 1e9;
            printf("  %-34s %9.1f us  %8.1f GB/s  (%.0f MB, incl. gather/scatter)\n", names[way], best * 1e3, gbs,
                   ce * 4 / 1e6);
        }
    }
    cudaCheck(cudaFree(pm));
    cudaCheck(cudaFree(pv));
    zf_cuda_free(&zf, &dev);
    free(h);
    cudaCheck(cudaFree(d_params));
    cudaCheck(cudaFree(d_grads));
}

int main(void) {
    setup_device("zenflow");
    cublas_init(0);
    uint64_t rng = 1337;
    validate("d2c48h4v97t32", 0.1, &rng);
    validate("d1c40h5v50t20", 0.37, &rng);
    validate("d2c64h4v301t70", 1.0, &rng);
    validate("d2c64h4v301t70", 0.0, &rng);
    benchmark("d12", 0.1, &rng);
    benchmark("d12", 1.0, &rng);
    cublas_free();
    return finish("zenflow");
}
