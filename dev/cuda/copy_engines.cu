/*
Copy engines and a step's small transfers: why the trainer moves its token ids (in), its
losses (out) and auto U's sums (out) through mapped host memory instead of cudaMemcpy
(mapped_alloc in llmc/cuda_kernels.cuh).

Copies between host and device run on the GPU's copy engines, and by default the driver
gives each direction one engine, so copies of one direction run one after another whatever
their stream. ZenFlow keeps both directions busy with gigabytes: gradient columns to the
host every step (-za cpu), the CPU's updated columns back once a window. A 64 KiB copy
issued on the default stream meanwhile would wait behind them, and so would every kernel
queued after it. A kernel that reads or writes mapped host memory moves the same bytes with
its own loads and stores over PCIe, and queues behind no copy.

That is NVIDIA's description, not yet a measurement of ours: this program is the
measurement. For each direction it times, from issue to completion, a 64 KiB transfer on
the default stream three ways (cudaMemcpy from pageable memory, as the trainer did before;
cudaMemcpyAsync from pinned memory; a kernel through mapped memory), alone and while a
1 GiB copy of the same direction runs on another stream; and, as controls, a kernel on
device memory and a cudaMemsetAsync while copies run both ways. It prints one table and a
summary line that puts the small transfers' times beside the copy's (one that waited takes
about as long as the copy); there is no pass or fail in the timings.

Validation (on the CPU emulator too): both mapped paths move the right bytes.

  make -C dev/cuda && ./build/cuda/copy_engines
*/
#include <algorithm>

#include "common.h"

static const size_t SMALL_INTS = 16384;         // 64 KiB: about the token ids of B = 4, T = 1024
static const size_t BULK_BYTES = (size_t)1 << 30;  // 1 GiB: a few layers' gradient columns at d48

// ----------------------------------------------------------------------------
// validation: up through mapped memory (the trainer's token ids), down through it (its losses)

static void check(int ok, const char* what) {
    printf("  %-60s %s\n", what, ok ? "ok" : "FAIL");
    g_checks++;
    g_failures += !ok;
}

static void validate(size_t n, uint64_t* rng) {
    printf("N=%zu ints\n", n);
    int* expect = random_ints(n, 50257, rng);
    int *up_mapped = NULL, *down_mapped = NULL;
    int* up_host = (int*)mapped_alloc(n * sizeof(int), &up_mapped, "the upload test");
    int* down_host = (int*)mapped_alloc(n * sizeof(int), &down_mapped, "the download test");
    int* dev = (int*)cuda_malloc(n * sizeof(int), "test data");
    int* got = (int*)mallocCheck(n * sizeof(int));

    memcpy(up_host, expect, n * sizeof(int));
    copy_ints(dev, up_mapped, n);  // host -> device, by a kernel
    cudaCheck(cudaMemcpy(got, dev, n * sizeof(int), cudaMemcpyDeviceToHost));
    check(memcmp(got, expect, n * sizeof(int)) == 0, "upload: a kernel reads mapped host memory");

    int* dev_src = to_device_ints(expect, n);
    copy_ints(down_mapped, dev_src, n);  // device -> host, by a kernel
    cudaCheck(cudaStreamSynchronize(0));  // only then may the host read what the kernel wrote
    check(memcmp(down_host, expect, n * sizeof(int)) == 0, "download: a kernel writes mapped host memory");

    free(expect);
    free(got);
    mapped_free(up_host);
    mapped_free(down_host);
    cudaCheck(cudaFree(dev));
    cudaCheck(cudaFree(dev_src));
}

// ----------------------------------------------------------------------------
// benchmark

typedef struct {
    void* bulk_host;  // BULK_BYTES pinned
    void* bulk_dev;   // BULK_BYTES device
    cudaStream_t side_d2h, side_h2d;  // where the bulk copies run (as ZenFlow's d2h and h2d)
    int* small_dev;
    int* small_pageable;
    int* small_pinned;
    int* small_host;  // mapped ...
    int* small_mapped;  // ... its address for kernels
} Buffers;

typedef enum { BULK_NONE = 0, BULK_D2H = 1, BULK_H2D = 2, BULK_BOTH = 3 } Bulk;

// the small operations, each issued on the default stream and waited for
typedef enum { OP_MEMCPY_PAGEABLE, OP_MEMCPY_PINNED, OP_MAPPED_KERNEL, OP_DEVICE_KERNEL, OP_MEMSET } SmallOp;

static void small_op(const Buffers* b, SmallOp op, int to_host) {
    const size_t bytes = SMALL_INTS * sizeof(int);
    switch (op) {
        case OP_MEMCPY_PAGEABLE:
            if (to_host) {
                cudaCheck(cudaMemcpy(b->small_pageable, b->small_dev, bytes, cudaMemcpyDeviceToHost));
            } else {
                cudaCheck(cudaMemcpy(b->small_dev, b->small_pageable, bytes, cudaMemcpyHostToDevice));
            }
            break;
        case OP_MEMCPY_PINNED:
            cudaCheck(cudaMemcpyAsync(to_host ? (void*)b->small_pinned : (void*)b->small_dev,
                                      to_host ? (const void*)b->small_dev : (const void*)b->small_pinned, bytes,
                                      to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, 0));
            break;
        case OP_MAPPED_KERNEL:
            if (to_host) {
                copy_ints(b->small_mapped, b->small_dev, SMALL_INTS);
            } else {
                copy_ints(b->small_dev, b->small_mapped, SMALL_INTS);
            }
            break;
        case OP_DEVICE_KERNEL: copy_ints(b->small_dev + SMALL_INTS / 2, b->small_dev, SMALL_INTS / 2); break;
        case OP_MEMSET: cudaCheck(cudaMemsetAsync(b->small_dev, 0, bytes, 0)); break;
    }
    cudaCheck(cudaStreamSynchronize(0));
}

// median over `repeats` of the small operation's time from issue to completion (ms), with
// the bulk copies issued just before it; *bulk_ms: their median time (0 without)
static double time_small(const Buffers* b, SmallOp op, int to_host, Bulk bulk, double* bulk_ms) {
    const int repeats = 5;
    double small[repeats], whole[repeats];
    small_op(b, op, to_host);  // warm-up: first-use costs are not timed
    for (int r = 0; r < repeats; r++) {
        double t0 = now_ms();
        if (bulk & BULK_D2H) {
            cudaCheck(cudaMemcpyAsync(b->bulk_host, b->bulk_dev, BULK_BYTES, cudaMemcpyDeviceToHost, b->side_d2h));
        }
        if (bulk & BULK_H2D) {
            cudaCheck(cudaMemcpyAsync(b->bulk_dev, b->bulk_host, BULK_BYTES, cudaMemcpyHostToDevice, b->side_h2d));
        }
        double t1 = now_ms();
        small_op(b, op, to_host);
        small[r] = now_ms() - t1;
        cudaCheck(cudaDeviceSynchronize());
        whole[r] = now_ms() - t0;
    }
    std::sort(small, small + repeats);
    std::sort(whole, whole + repeats);
    *bulk_ms = bulk == BULK_NONE ? 0.0 : whole[repeats / 2];
    return small[repeats / 2];
}

// per direction [host->device, device->host]: what the summary line reports
typedef struct {
    double memcpy_ms[2], mapped_ms[2], copy_ms[2];
} Findings;

static int benchmark(Findings* f) {
    if (!benchmarks_wanted()) { return 0; }
    Buffers b;
    const size_t bytes = SMALL_INTS * sizeof(int);
    cudaCheck(cudaHostAlloc(&b.bulk_host, BULK_BYTES, cudaHostAllocDefault));
    b.bulk_dev = cuda_malloc(BULK_BYTES, "the bulk copy");
    cudaCheck(cudaMemset(b.bulk_dev, 0, BULK_BYTES));
    memset(b.bulk_host, 0, BULK_BYTES);
    cudaCheck(cudaStreamCreateWithFlags(&b.side_d2h, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&b.side_h2d, cudaStreamNonBlocking));
    b.small_dev = (int*)cuda_malloc(bytes, "the small transfer");
    cudaCheck(cudaMemset(b.small_dev, 0, bytes));
    b.small_pageable = (int*)callocCheck(SMALL_INTS, sizeof(int));
    cudaCheck(cudaHostAlloc((void**)&b.small_pinned, bytes, cudaHostAllocDefault));
    b.small_host = (int*)mapped_alloc(bytes, &b.small_mapped, "the small transfer");
    memset(b.small_host, 0, bytes);

    printf("benchmark: a %zu KiB transfer on the default stream, issue to completion (median of 5),\n"
           "alone and while a %zu MiB copy runs on another stream\n", bytes / 1024, BULK_BYTES >> 20);
    printf("  %-54s %9s %13s %12s\n", "on the default stream", "alone ms", "with copy ms", "the copy ms");
    struct Row {
        const char* name;
        SmallOp op;
        int to_host;
        Bulk bulk;
    } rows[] = {
        {"device->host  cudaMemcpy, pageable", OP_MEMCPY_PAGEABLE, 1, BULK_D2H},
        {"device->host  cudaMemcpyAsync, pinned", OP_MEMCPY_PINNED, 1, BULK_D2H},
        {"device->host  kernel writes mapped memory", OP_MAPPED_KERNEL, 1, BULK_D2H},
        {"host->device  cudaMemcpy, pageable", OP_MEMCPY_PAGEABLE, 0, BULK_H2D},
        {"host->device  cudaMemcpyAsync, pinned", OP_MEMCPY_PINNED, 0, BULK_H2D},
        {"host->device  kernel reads mapped memory", OP_MAPPED_KERNEL, 0, BULK_H2D},
        {"control: a kernel on device memory (copies both ways)", OP_DEVICE_KERNEL, 0, BULK_BOTH},
        {"control: cudaMemsetAsync (copies both ways)", OP_MEMSET, 0, BULK_BOTH},
    };
    for (const Row& r : rows) {
        double unused, copy_ms;
        double alone = time_small(&b, r.op, r.to_host, BULK_NONE, &unused);
        double with = time_small(&b, r.op, r.to_host, r.bulk, &copy_ms);
        printf("  %-54s %9.3f %13.3f %12.1f\n", r.name, alone, with, copy_ms);
        if (r.op == OP_MEMCPY_PAGEABLE) {
            f->memcpy_ms[r.to_host] = with;
            f->copy_ms[r.to_host] = copy_ms;
        }
        if (r.op == OP_MAPPED_KERNEL) { f->mapped_ms[r.to_host] = with; }
    }
    printf("  (a small transfer that waited for the copy takes about as long as the copy itself)\n");

    cudaCheck(cudaFreeHost(b.bulk_host));
    cudaCheck(cudaFree(b.bulk_dev));
    cudaCheck(cudaStreamDestroy(b.side_d2h));
    cudaCheck(cudaStreamDestroy(b.side_h2d));
    cudaCheck(cudaFree(b.small_dev));
    free(b.small_pageable);
    cudaCheck(cudaFreeHost(b.small_pinned));
    mapped_free(b.small_host);
    return 1;
}

int main(void) {
    setup_device("copy_engines");
    uint64_t rng = 1337;
    validate(1, &rng);
    validate(SMALL_INTS + 3, &rng);
    Findings f;
    if (!benchmark(&f)) { return finish("copy_engines"); }
    // the line gpu_check.sh puts in its summary
    printf("copy_engines: %d checks, %d failed; 64 KiB beside a 1 GiB copy (%.1f ms down, %.1f ms up): "
           "cudaMemcpy %.3f / %.3f ms, mapped memory %.3f / %.3f ms\n",
           g_checks, g_failures, f.copy_ms[1], f.copy_ms[0], f.memcpy_ms[1], f.memcpy_ms[0], f.mapped_ms[1],
           f.mapped_ms[0]);
    return g_failures == 0 ? 0 : 1;
}
