/*
zenflow.cuh's index math, run on the CPU: no GPU needed (and none is touched).

The kernels of zenflow.cuh are thin shells around host-and-device functions (which block
works on which tile or chunk, and what each thread reads and writes). This program runs
exactly those functions for every block and thread of each launch, on small models with
random ownership, and checks the result against zenflow.h's layouts as the CPU trainer's
backend implements them (dev/train_gpt2.cpp: gather_columns / scatter_columns):
  - gather: packed[cpu_offset + r * rows + o] = W[o, col_r] for the CPU-owned columns, every
    packed element written exactly once;
  - scatter: the inverse, and the GPU-owned columns untouched;
  - the GPU's AdamW / zeroing: every GPU-owned element visited exactly once, and its moment
    index, converted by zf_moments_rows_to_columns, lands where zenflow.h's packed GPU layout
    puts it (and the conversion round-trips);
  - zf_find_set against a linear search, with empty sets.
What it cannot check: shared-memory races and __syncthreads placement, launch limits, and
anything about speed. dev/cuda/zenflow.cu checks the kernels themselves on a GPU.

  nvcc -O2 -std=c++17 dev/cuda/zenflow_host.cu -o build/cuda/zenflow_host && build/cuda/zenflow_host
  (make -C dev/cuda builds it; it needs only the CUDA headers, not a device)
*/
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "../../zenflow.cuh"

static int g_checks = 0, g_failures = 0;

static void expect(int ok, const char* fmt, ...) {
    g_checks++;
    if (ok) { return; }
    g_failures++;
    va_list args;
    va_start(args, fmt);
    printf("  FAIL: ");
    vprintf(fmt, args);
    printf("\n");
    va_end(args);
}

// a ZenFlow over a model shape, without a backend (only the layouts are used)
static void layouts_init(ZenFlow* zf, const char* spec, double k, int warmup) {
    GPT2Config c;
    if (!gpt2_parse_model_spec(spec, &c)) { fatal("bad model spec %s", spec); }
    ZfConfig cfg = zf_default_config();
    cfg.topk = k;
    cfg.overlap = 0;  // no updater thread
    cfg.warmup = warmup;
    ZfBackend none;
    memset(&none, 0, sizeof(none));
    zf_init(zf, cfg, &c, none);
}

// random ownership as zf_select leaves it: n_sel columns (all CPU during warm-up), chosen at
// random, ascending, then the rest ascending
static void random_ownership(ZenFlow* zf, int all_cpu, uint64_t* rng) {
    for (int i = 0; i < zf->num_matrices; i++) {
        ZfMatrix* mat = &zf->matrices[i];
        int* order = mat->cols_by_owner;
        for (int j = 0; j < mat->cols; j++) { order[j] = j; }
        for (int j = mat->cols - 1; j > 0; j--) {  // Fisher-Yates
            int r = (int)(random_u32(rng) % (uint32_t)(j + 1));
            int tmp = order[j];
            order[j] = order[r];
            order[r] = tmp;
        }
        mat->n_sel = all_cpu ? 0 : zf_n_sel(zf->cfg.topk, mat->cols);
        std::sort(order, order + mat->n_sel);
        std::sort(order + mat->n_sel, order + mat->cols);
    }
    zf_layout(zf);
}

typedef struct {
    std::vector<ZfColumnSet> cpu, gpu;
    std::vector<long long> tiles, chunks;
    std::vector<int> order;
} Sets;

static Sets build_sets(const ZenFlow* zf) {
    Sets s;
    int total = 0;
    for (int i = 0; i < zf->num_matrices; i++) { total += zf->matrices[i].cols; }
    s.cpu.resize(zf->num_matrices);
    s.gpu.resize(zf->num_matrices);
    s.tiles.resize(zf->num_matrices + 1);
    s.chunks.resize(zf->num_matrices + 1);
    s.order.resize(total);
    zf_build_column_sets(zf, s.cpu.data(), s.gpu.data(), s.tiles.data(), s.chunks.data(), s.order.data());
    return s;
}

// the CPU backend's gather_columns / scatter_columns (dev/train_gpt2.cpp), for every matrix
static void reference_gather(const ZenFlow* zf, const float* full, float* packed) {
    for (int i = 0; i < zf->num_matrices; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        const int* cols = mat->cols_by_owner + mat->n_sel;
        for (int o = 0; o < mat->rows; o++) {
            for (int r = 0; r < mat->cols - mat->n_sel; r++) {
                packed[mat->cpu_offset + (size_t)r * mat->rows + o] = full[mat->offset + (size_t)o * mat->cols + cols[r]];
            }
        }
    }
}

// the launches of zf_gather_columns_kernel / zf_scatter_columns_kernel, block by block,
// each part for all 32 x 8 threads before the next (what __syncthreads guarantees)
static void emulate_gather(const Sets& s, const float* full, float* packed, int num_sets) {
    float tile[ZF_TILE][ZF_TILE + 1];
    for (long long block = 0; block < s.tiles[num_sets]; block++) {
        ZfTileRef t = zf_tile_of_block(s.cpu.data(), s.tiles.data(), num_sets, block);
        for (int ty = 0; ty < ZF_TILE_ROWS; ty++) {
            for (int tx = 0; tx < ZF_TILE; tx++) { zf_gather_load(t, s.order.data(), full, tx, ty, tile); }
        }
        for (int ty = 0; ty < ZF_TILE_ROWS; ty++) {
            for (int tx = 0; tx < ZF_TILE; tx++) { zf_gather_store(t, packed, tx, ty, tile); }
        }
    }
}

static void emulate_scatter(const Sets& s, const float* packed, float* full, int num_sets) {
    float tile[ZF_TILE][ZF_TILE + 1];
    for (long long block = 0; block < s.tiles[num_sets]; block++) {
        ZfTileRef t = zf_tile_of_block(s.cpu.data(), s.tiles.data(), num_sets, block);
        for (int ty = 0; ty < ZF_TILE_ROWS; ty++) {
            for (int tx = 0; tx < ZF_TILE; tx++) { zf_scatter_load(t, packed, tx, ty, tile); }
        }
        for (int ty = 0; ty < ZF_TILE_ROWS; ty++) {
            for (int tx = 0; tx < ZF_TILE; tx++) { zf_scatter_store(t, s.order.data(), full, tx, ty, tile); }
        }
    }
}

// the element loop of zf_adam_columns_kernel / zf_zero_columns_kernel: calls f(at, k)
template <typename F>
static void emulate_gpu_elements(const Sets& s, int num_sets, F f) {
    for (long long block = 0; block < s.chunks[num_sets]; block++) {
        int set_index = zf_find_set(s.chunks.data(), num_sets, block);
        const ZfColumnSet& set = s.gpu[set_index];
        int n = set.count * set.rows;
        int base = (int)(block - s.chunks[set_index]) * ZF_CHUNK;
        for (int tx = 0; tx < ZF_BLOCK; tx++) {
            for (int j = tx; j < ZF_CHUNK; j += ZF_BLOCK) {
                int i = base + j;
                if (i < n) {
                    size_t at, k;
                    zf_gpu_element(set, s.order.data(), i, &at, &k);
                    f(at, k);
                }
            }
        }
    }
}

static void check_ownership(ZenFlow* zf, const char* what) {
    const int S = zf->num_matrices;
    Sets s = build_sets(zf);
    size_t N = 0;
    for (int i = 0; i < zf->num_vectors; i++) { N = std::max(N, zf->vectors[i].offset + zf->vectors[i].n); }
    for (int i = 0; i < S; i++) {
        const ZfMatrix* m = &zf->matrices[i];
        N = std::max(N, m->offset + (size_t)m->rows * m->cols);
    }
    expect(s.tiles[S] >= 0 && s.chunks[S] >= 0, "%s: negative totals", what);
    // element ids: exactly representable as floats (the test models are small)
    std::vector<float> full(N);
    for (size_t i = 0; i < N; i++) { full[i] = (float)(i + 1); }

    // gather
    std::vector<float> got(zf->cpu_elems + 1, NAN), want(zf->cpu_elems + 1, NAN);
    got[zf->cpu_elems] = want[zf->cpu_elems] = -7.0f;  // a guard after the end
    reference_gather(zf, full.data(), want.data());
    emulate_gather(s, full.data(), got.data(), S);
    int same = memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
    expect(same, "%s: gather differs from the CPU backend's gather_columns", what);
    // each packed element written once: gather from a buffer of ones into zeros, twice = 2
    std::vector<float> ones(N, 1.0f), counts(zf->cpu_elems, 0.0f);
    {
        std::vector<float> tmp(zf->cpu_elems, 0.0f);
        emulate_gather(s, ones.data(), tmp.data(), S);
        for (size_t i = 0; i < zf->cpu_elems; i++) { counts[i] = tmp[i]; }
    }
    int once = 1;
    for (float c : counts) { once = once && c == 1.0f; }
    expect(once, "%s: gather leaves a packed element unwritten", what);

    // scatter: a packed buffer of fresh ids into a copy of W
    std::vector<float> packed(zf->cpu_elems);
    for (size_t i = 0; i < zf->cpu_elems; i++) { packed[i] = -(float)(i + 1); }
    std::vector<float> w_got = full, w_want = full;
    emulate_scatter(s, packed.data(), w_got.data(), S);
    for (int i = 0; i < S; i++) {  // the CPU backend's scatter_columns
        const ZfMatrix* mat = &zf->matrices[i];
        const int* cols = mat->cols_by_owner + mat->n_sel;
        for (int o = 0; o < mat->rows; o++) {
            for (int r = 0; r < mat->cols - mat->n_sel; r++) {
                w_want[mat->offset + (size_t)o * mat->cols + cols[r]] = packed[mat->cpu_offset + (size_t)r * mat->rows + o];
            }
        }
    }
    expect(memcmp(w_got.data(), w_want.data(), N * sizeof(float)) == 0,
           "%s: scatter differs from the CPU backend's scatter_columns", what);

    // the GPU's elements: each GPU-owned (o, col) once, nothing else
    std::vector<int> visits(N, 0);
    size_t g = zf->vector_elems + zf->gpu_sel_elems;
    std::vector<float> rows_layout(g, NAN);
    for (size_t i = 0; i < zf->vector_elems; i++) { rows_layout[i] = (float)(1000000 + i); }
    int k_in_range = 1;
    emulate_gpu_elements(s, S, [&](size_t at, size_t k) {
        visits[at]++;
        if (zf->vector_elems + k < g) {
            rows_layout[zf->vector_elems + k] = full[at];
        } else {
            k_in_range = 0;
        }
    });
    expect(k_in_range, "%s: a GPU moment index is out of range", what);
    int exact = 1;
    for (int i = 0; i < S; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        for (int o = 0; o < mat->rows; o++) {
            for (int r = 0; r < mat->cols; r++) {
                int expected = r < mat->n_sel;  // cols_by_owner[r] is GPU-owned iff r < n_sel
                exact = exact && visits[mat->offset + (size_t)o * mat->cols + mat->cols_by_owner[r]] == expected;
            }
        }
    }
    for (int i = 0; i < zf->num_vectors; i++) {  // vectors are adamw_update's, not this kernel's
        for (size_t j = 0; j < zf->vectors[i].n; j++) { exact = exact && visits[zf->vectors[i].offset + j] == 0; }
    }
    expect(exact, "%s: the GPU's AdamW does not visit exactly the GPU-owned elements once each", what);

    // the moments, converted to zenflow.h's layout, sit where the CPU backend keeps them
    std::vector<float> cols_layout(g, NAN), back(g, NAN);
    zf_moments_rows_to_columns(zf, rows_layout.data(), cols_layout.data());
    int placed = 1;
    for (size_t i = 0; i < zf->vector_elems; i++) { placed = placed && cols_layout[i] == rows_layout[i]; }
    for (int i = 0; i < S; i++) {
        const ZfMatrix* mat = &zf->matrices[i];
        for (int r = 0; r < mat->n_sel; r++) {
            for (int o = 0; o < mat->rows; o++) {
                float id = full[mat->offset + (size_t)o * mat->cols + mat->cols_by_owner[r]];
                placed = placed && cols_layout[zf->vector_elems + mat->gpu_offset + (size_t)r * mat->rows + o] == id;
            }
        }
    }
    expect(placed, "%s: GPU moments are not where zenflow.h's packed GPU layout expects them", what);
    zf_moments_columns_to_rows(zf, cols_layout.data(), back.data());
    expect(memcmp(back.data(), rows_layout.data(), g * sizeof(float)) == 0,
           "%s: the moment layout conversion does not round-trip", what);
    printf("  %-44s %7zu CPU-owned, %6zu GPU-owned, %5lld tiles, %4lld chunks\n", what, zf->cpu_elems,
           zf->gpu_sel_elems, s.tiles[S], s.chunks[S]);
}

static void check_find_set(uint64_t* rng) {
    int bad = 0;
    for (int trial = 0; trial < 200; trial++) {
        int n = 1 + (int)(random_u32(rng) % 12);
        std::vector<long long> start(n + 1, 0);
        for (int s = 0; s < n; s++) {
            int units = random_u32(rng) % 3 == 0 ? 0 : (int)(random_u32(rng) % 5);  // empty sets too
            start[s + 1] = start[s] + units;
        }
        for (long long u = 0; u < start[n]; u++) {
            int linear = -1;
            for (int s = 0; s < n; s++) {
                if (start[s] <= u && u < start[s + 1]) { linear = s; }
            }
            bad += zf_find_set(start.data(), n, u) != linear;
        }
    }
    expect(bad == 0, "zf_find_set disagrees with a linear search %d times", bad);
    printf("  zf_find_set vs a linear search, 200 random tables with empty sets: %s\n", bad ? "FAIL" : "ok");
}

int main(void) {
    uint64_t rng = 20241201;
    check_find_set(&rng);
    // shapes: the test models, and sizes that are not multiples of the 32 x 32 tiles
    const char* specs[] = {"d2c48h4v97t32", "d1c40h5v50t20", "d3c64h4v301t70"};
    double ks[] = {0.0, 0.05, 0.1, 0.37, 0.5, 1.0};
    for (const char* spec : specs) {
        printf("model %s\n", spec);
        for (double k : ks) {
            ZenFlow zf;
            layouts_init(&zf, spec, k, 0);
            random_ownership(&zf, 0, &rng);
            char what[64];
            snprintf(what, sizeof(what), "k=%.2f random columns", k);
            check_ownership(&zf, what);
            zf_free(&zf);
        }
        ZenFlow zf;  // warm-up: the CPU owns everything
        layouts_init(&zf, spec, 0.1, 2);
        random_ownership(&zf, 1, &rng);
        check_ownership(&zf, "warm-up (every column CPU-owned)");
        zf_free(&zf);
    }
    printf("zenflow_host: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
