/*
A CUDA emulator on the CPU, for checking the CUDA code of this project where no GPU exists.

It is NOT a GPU and proves nothing about speed, but it runs the very source of
train_gpt2.cu, zenflow.cuh and llmc/cuda_kernels.cuh, compiled by g++ as C++ (the launches
`k<<<grid, block>>>(args)` are rewritten to `emu_launch(k, emu_config(grid, block))(args)`
by dev/cuda/emu/cu2cpp.py, line for line). What it checks that a compile cannot:
  - the kernels' results: every thread of every block runs, as a fiber; __syncthreads() and
    __shfl_xor_sync() switch fibers, so shared memory and warp reductions behave as on a GPU.
    Within a block, one warp runs as far as it can (its lanes one after the other, each up
    to its next shuffle or barrier) before the next warp starts: legal on a GPU, and the
    order in which a missing barrier changes the result. EMU_REVERSE=1 runs blocks, warps
    and lanes in the opposite order (the other side of a race);
  - launch rules: a grid or block of size 0, more than 1024 threads, grid.y/z > 65535;
    __syncthreads() or a full-mask shuffle that some threads of the block/warp skip
    (an early return before a reduction): each stops the program with one line;
  - pointers: a kernel's pointer argument, and both ends of every cudaMemcpy/cudaMemset,
    must lie in a live allocation of the right side (device or host); device memory starts
    as NaN (0xFF bytes), so reading what nobody wrote shows up in the numbers;
  - stream order: EMU_SCHEDULE chooses when queued work runs:
      eager        each operation runs when the host issues it;
      lazy         nothing runs until the host waits for it (an event or stream sync, a
                   synchronous cudaMemcpy); then exactly what it depends on runs, through
                   the cudaStreamWaitEvent edges;
      lazy_compute the default stream is lazy, the other streams eager;
      lazy_copies  the other streams are lazy, the default stream eager.
    A missing event or wait makes the schedules disagree. Also, a cudaMemcpyAsync to the
    host fills its destination with NaN until it has run, and one from the host checks,
    when it runs, that the host did not change the source since it was issued;
  - EMU_NO_KERNEL_IMAGE=1: a GPU this binary has no code for (every launch fails as it would).
Not modelled: timing (events read a host clock when they run), memory coherence races
between blocks, atomics, dynamic shared memory, streams other than non-blocking ones.
Build with the headers of this folder first on the include path (see dev/cuda/emu/Makefile).
*/
#ifndef EMU_CUDA_RUNTIME_H
#define EMU_CUDA_RUNTIME_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// ----------------------------------------------------------------------------
// the language: qualifiers, built-in variables, device functions

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local  // one copy per OS thread = per block running on it

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef dim3 uint3;

typedef struct EmuFiber {
    void* sp;  // saved stack pointer while switched out
    char* stack;
    size_t stack_size;
    uint3 tid;
    int linear;  // x + y * bx + z * bx * by
    int state;
    uint64_t shfl_value, shfl_result;
    int shfl_src;
#if !defined(__x86_64__)
    ucontext_t ctx;
#endif
} EmuFiber;

static thread_local EmuFiber* emu_current = NULL;  // the fiber running on this OS thread
static thread_local dim3 blockIdx, blockDim, gridDim;
#define threadIdx (emu_current->tid)
static const int warpSize = 32;

static inline void emu_die(const char* fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static inline void emu_die(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "CUDA emulator: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    fflush(stdout);
    exit(3);
}

static void emu_yield(int state);
enum { EMU_RUNNABLE, EMU_AT_SYNCTHREADS, EMU_AT_SHUFFLE, EMU_DONE };

static inline void __syncthreads(void) { emu_yield(EMU_AT_SYNCTHREADS); }

// the value of lane (this lane ^ lane_mask); all 32 lanes of the warp must take part
template <typename T>
static inline T __shfl_xor_sync(unsigned int mask, T value, int lane_mask, int width = 32) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type larger than 8 bytes");
    if (mask != 0xffffffffu || width != 32) { emu_die("__shfl_xor_sync: only the full mask and width 32 are emulated"); }
    EmuFiber* f = emu_current;
    memcpy(&f->shfl_value, &value, sizeof(T));
    f->shfl_src = (f->linear % 32) ^ (lane_mask & 31);
    emu_yield(EMU_AT_SHUFFLE);
    T result;
    memcpy(&result, &emu_current->shfl_result, sizeof(T));
    return result;
}

using std::max;
using std::min;

// ----------------------------------------------------------------------------
// fibers: switching stacks (x86-64: six callee-saved registers and the FP control words;
// elsewhere ucontext, slower)

#if defined(__x86_64__)
extern "C" void emu_switch_stack(void** save_sp, void* next_sp);
extern "C" void emu_fiber_entry(void);
asm(R"(
    .text
    .globl emu_switch_stack
    .hidden emu_switch_stack
    .type emu_switch_stack, @function
emu_switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_stack, .-emu_switch_stack
    .globl emu_fiber_entry
    .hidden emu_fiber_entry
    .type emu_fiber_entry, @function
emu_fiber_entry:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size emu_fiber_entry, .-emu_fiber_entry
)");
#endif

// one block's worth of fibers on one OS thread
typedef struct EmuBlockRunner {
    std::vector<EmuFiber> fibers;
    const std::function<void()>* body;
    void* scheduler_sp;
#if !defined(__x86_64__)
    ucontext_t scheduler_ctx;
#endif
#if defined(__SANITIZE_ADDRESS__)
    const void* scheduler_stack_bottom;
    size_t scheduler_stack_size;
#endif
    ~EmuBlockRunner() {  // the OS thread ends: its fiber stacks go
        for (EmuFiber& f : fibers) { free(f.stack); }
    }
} EmuBlockRunner;
static thread_local EmuBlockRunner emu_runner;

#if defined(__SANITIZE_ADDRESS__)
static const size_t EMU_STACK_BYTES = 256 << 10;
#else
static const size_t EMU_STACK_BYTES = 64 << 10;
#endif

static void emu_switch_to_fiber(EmuFiber* f) {
    emu_current = f;
#if defined(__SANITIZE_ADDRESS__)
    void* fake = NULL;
    __sanitizer_start_switch_fiber(&fake, f->stack, f->stack_size);
#endif
#if defined(__x86_64__)
    emu_switch_stack(&emu_runner.scheduler_sp, f->sp);
#else
    swapcontext(&emu_runner.scheduler_ctx, &f->ctx);
#endif
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
    emu_current = NULL;
}

static void emu_switch_to_scheduler(EmuFiber* f) {
#if defined(__SANITIZE_ADDRESS__)
    void* fake = NULL;
    __sanitizer_start_switch_fiber(f->state == EMU_DONE ? NULL : &fake, emu_runner.scheduler_stack_bottom,
                                   emu_runner.scheduler_stack_size);
#endif
#if defined(__x86_64__)
    emu_switch_stack(&f->sp, emu_runner.scheduler_sp);
#else
    swapcontext(&f->ctx, &emu_runner.scheduler_ctx);
#endif
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(fake, &emu_runner.scheduler_stack_bottom, &emu_runner.scheduler_stack_size);
#endif
}

static void emu_yield(int state) {
    EmuFiber* f = emu_current;
    if (f == NULL) { emu_die("__syncthreads or a shuffle outside a kernel"); }
    f->state = state;
    emu_switch_to_scheduler(f);
}

extern "C" void emu_fiber_main(EmuFiber* f) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(NULL, &emu_runner.scheduler_stack_bottom, &emu_runner.scheduler_stack_size);
#endif
    (*emu_runner.body)();
    f->state = EMU_DONE;
    emu_switch_to_scheduler(f);
    emu_die("a finished fiber was resumed");
}

#if !defined(__x86_64__)
static void emu_fiber_main_ucontext(unsigned int lo, unsigned int hi) {
    emu_fiber_main((EmuFiber*)(((uintptr_t)hi << 32) | lo));
}
#endif

static void emu_fiber_start(EmuFiber* f) {
    if (f->stack == NULL) {
        f->stack_size = EMU_STACK_BYTES;
        f->stack = (char*)malloc(f->stack_size);
        if (f->stack == NULL) { emu_die("out of memory for fiber stacks"); }
    }
    f->state = EMU_RUNNABLE;
#if defined(__SANITIZE_ADDRESS__)
    // a stack used before still carries the red zones of the frames its last fiber left
    // behind (a fiber never returns, it is switched away from)
    ASAN_UNPOISON_MEMORY_REGION(f->stack, f->stack_size);
#endif
#if defined(__x86_64__)
    // the frame emu_switch_stack pops: FP control words, r15..r12, rbx, rbp, return address
    uintptr_t top = ((uintptr_t)(f->stack + f->stack_size)) & ~(uintptr_t)15;
    uint64_t* sp = (uint64_t*)(top - 80);  // 16-byte aligned, so the callee's stack is too
    uint32_t csr[2];
    asm volatile("stmxcsr %0" : "=m"(csr[0]));
    asm volatile("fnstcw %0" : "=m"(csr[1]));
    memcpy(&sp[0], csr, 8);
    sp[1] = 0;                                // r15
    sp[2] = 0;                                // r14
    sp[3] = (uint64_t)(uintptr_t)&emu_fiber_main;  // r13: what emu_fiber_entry calls
    sp[4] = (uint64_t)(uintptr_t)f;           // r12: its argument
    sp[5] = 0;                                // rbx
    sp[6] = 0;                                // rbp
    sp[7] = (uint64_t)(uintptr_t)&emu_fiber_entry;
    sp[8] = 0;
    sp[9] = 0;
    f->sp = sp;
#else
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack;
    f->ctx.uc_stack.ss_size = f->stack_size;
    f->ctx.uc_link = NULL;
    uintptr_t p = (uintptr_t)f;
    makecontext(&f->ctx, (void (*)(void))emu_fiber_main_ucontext, 2, (unsigned int)(p & 0xffffffffu),
                (unsigned int)(p >> 32));
#endif
}

static int emu_reverse_order(void) {
    static int reverse = -1;
    if (reverse < 0) {
        const char* s = getenv("EMU_REVERSE");
        reverse = (s != NULL && atoi(s) != 0);
    }
    return reverse;
}

// runs every thread of the current block (blockIdx etc. already set) to its end
static void emu_run_block(const std::function<void()>& body, const char* kernel) {
    EmuBlockRunner* r = &emu_runner;
    int n = (int)(blockDim.x * blockDim.y * blockDim.z);
    if ((int)r->fibers.size() < n) { r->fibers.resize(n); }
    r->body = &body;
    for (int i = 0; i < n; i++) {
        EmuFiber* f = &r->fibers[i];
        f->linear = i;
        f->tid = uint3(i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y));
        emu_fiber_start(f);
    }
    int reverse = emu_reverse_order();
    int num_warps = (n + 31) / 32;
    for (;;) {
        // one warp at a time, as far as it can go: its lanes run until they block, its
        // shuffles exchange, until every lane waits at __syncthreads or has ended. Running
        // warps this far apart is legal on a GPU and exposes a missing barrier between warps.
        for (int jw = 0; jw < num_warps; jw++) {
            int w = reverse ? num_warps - 1 - jw : jw;
            int first = w * 32, last = std::min(n, first + 32);
            for (;;) {
                for (int j = first; j < last; j++) {
                    EmuFiber* f = &r->fibers[reverse ? first + last - 1 - j : j];
                    if (f->state == EMU_RUNNABLE) { emu_switch_to_fiber(f); }
                }
                int waiting = 0;
                for (int i = first; i < last; i++) { waiting += r->fibers[i].state == EMU_AT_SHUFFLE; }
                if (waiting == 0) { break; }
                if (waiting != 32) {
                    emu_die("%s: block (%u,%u,%u): __shfl_xor_sync with the full mask reached by %d of the 32 "
                            "lanes of warp %d (the others exited or wait at __syncthreads)",
                            kernel, blockIdx.x, blockIdx.y, blockIdx.z, waiting, w);
                }
                for (int i = first; i < last; i++) {
                    r->fibers[i].shfl_result = r->fibers[first + r->fibers[i].shfl_src].shfl_value;
                    r->fibers[i].state = EMU_RUNNABLE;
                }
            }
        }
        int done = 0, at_sync = 0;
        for (int i = 0; i < n; i++) {
            done += r->fibers[i].state == EMU_DONE;
            at_sync += r->fibers[i].state == EMU_AT_SYNCTHREADS;
        }
        if (done == n) { break; }
        if (at_sync != n) {
            emu_die("%s: block (%u,%u,%u): __syncthreads reached by %d of %d threads (%d exited; the "
                    "barrier must be reached by every thread of the block)",
                    kernel, blockIdx.x, blockIdx.y, blockIdx.z, at_sync, n, done);
        }
        for (int i = 0; i < n; i++) { r->fibers[i].state = EMU_RUNNABLE; }
    }
}

// ----------------------------------------------------------------------------
// the runtime: errors, memory, streams and events

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorUnsupportedPtxVersion = 222,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
} cudaError_t;
typedef cudaError_t cudaError;

typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

typedef enum { cudaDevAttrL2CacheSize = 89 } cudaDeviceAttr;

#define cudaStreamNonBlocking 0x01
#define cudaEventBlockingSync 0x01  // (a real host thread sleeps instead of spinning; here: nothing)
#define cudaEventDisableTiming 0x02
#define cudaHostRegisterDefault 0x00
#define cudaDeviceScheduleBlockingSync 0x04

typedef struct {
    char name[256];
    size_t totalGlobalMem;
    int major, minor;
    int multiProcessorCount;
    int maxThreadsPerBlock;
    int warpSize;
    size_t sharedMemPerBlock;
    int l2CacheSize;
} cudaDeviceProp;

typedef struct EmuStream {
    std::deque<std::function<void()>> pending;  // queued, not run yet (waits included)
    uint64_t issued, done;  // operations queued so far / run so far, in order
    int lazy;
} EmuStream;
typedef EmuStream* cudaStream_t;

typedef struct EmuEvent {
    EmuStream* stream;  // where it was last recorded (NULL: never)
    uint64_t seq;       // ... as the seq-th operation of that stream
    int timing;
    double time_ms;     // host clock when the record ran
    int has_time;
} EmuEvent;
typedef EmuEvent* cudaEvent_t;

typedef struct {
    std::recursive_mutex mu;     // every API call: the host may call from several threads
    std::map<uintptr_t, size_t> device;  // allocations: start -> bytes
    std::map<uintptr_t, size_t> pinned;  // cudaHostRegister'ed ranges
    size_t device_bytes, device_limit;
    EmuStream default_stream;
    std::vector<EmuStream*> streams;
    cudaError_t last_error;
    int schedule_read;
    const char* schedule;
    long long pageable_async_copies;
} EmuRuntime;

static EmuRuntime& emu_rt(void) {
    static EmuRuntime* rt = NULL;
    if (rt == NULL) {
        rt = new EmuRuntime();
        rt->device_bytes = 0;
        const char* limit = getenv("EMU_DEVICE_MEMORY_MB");
        rt->device_limit = (size_t)(limit ? atof(limit) : 143771.0) * 1048576.0;  // an H200's 140 GiB
        rt->default_stream.issued = rt->default_stream.done = 0;
        rt->last_error = cudaSuccess;
        const char* s = getenv("EMU_SCHEDULE");
        rt->schedule = s ? s : "eager";
        if (strcmp(rt->schedule, "eager") && strcmp(rt->schedule, "lazy") && strcmp(rt->schedule, "lazy_compute") &&
            strcmp(rt->schedule, "lazy_copies")) {
            emu_die("EMU_SCHEDULE=%s: expected eager, lazy, lazy_compute or lazy_copies", rt->schedule);
        }
        rt->default_stream.lazy = !strcmp(rt->schedule, "lazy") || !strcmp(rt->schedule, "lazy_compute");
        rt->streams.push_back(&rt->default_stream);
        rt->pageable_async_copies = 0;
    }
    return *rt;
}
#define EMU_LOCK std::lock_guard<std::recursive_mutex> emu_lock_(emu_rt().mu)

static inline cudaError_t emu_error(cudaError_t err) {
    if (err != cudaSuccess) { emu_rt().last_error = err; }
    return err;
}

static inline const char* cudaGetErrorString(cudaError_t err) {
    switch (err) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDeviceFunction: return "invalid device function";
        case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
        case cudaErrorUnsupportedPtxVersion: return "the provided PTX was compiled with an unsupported toolchain.";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorNotReady: return "device not ready";
    }
    return "unknown error";
}

static inline cudaError_t cudaGetLastError(void) {
    EMU_LOCK;
    cudaError_t err = emu_rt().last_error;
    emu_rt().last_error = cudaSuccess;
    return err;
}

// the allocation of `map` holding [p, p + bytes); 0 if none
static inline int emu_in(const std::map<uintptr_t, size_t>& map, const void* p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    auto it = map.upper_bound(a);
    if (it == map.begin()) { return 0; }
    --it;
    return a >= it->first && a + bytes <= it->first + it->second && a + bytes >= a;
}
static inline int emu_is_device(const void* p, size_t bytes) { return emu_in(emu_rt().device, p, bytes); }
static inline int emu_touches_device(const void* p, size_t bytes) {
    // any overlap with device memory (a host range must not)
    uintptr_t a = (uintptr_t)p;
    auto it = emu_rt().device.upper_bound(a + (bytes ? bytes - 1 : 0));
    if (it == emu_rt().device.begin()) { return 0; }
    --it;
    return it->first + it->second > a;
}

static inline cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    EMU_LOCK;
    EmuRuntime& rt = emu_rt();
    *ptr = NULL;
    if (rt.device_bytes + bytes > rt.device_limit) { return emu_error(cudaErrorMemoryAllocation); }
    void* p = NULL;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) { return emu_error(cudaErrorMemoryAllocation); }
    memset(p, 0xFF, bytes);  // NaN: reading memory nobody wrote shows in the numbers
    rt.device[(uintptr_t)p] = bytes;
    rt.device_bytes += bytes;
    *ptr = p;
    return cudaSuccess;
}
template <typename T>
static inline cudaError_t cudaMalloc(T** ptr, size_t bytes) { return cudaMalloc((void**)ptr, bytes); }

static void emu_force_all(void);

static inline cudaError_t cudaFree(void* p) {
    EMU_LOCK;
    if (p == NULL) { return cudaSuccess; }
    emu_force_all();  // cudaFree synchronizes the device
    EmuRuntime& rt = emu_rt();
    auto it = rt.device.find((uintptr_t)p);
    if (it == rt.device.end()) { emu_die("cudaFree(%p): not the start of a device allocation", p); }
    rt.device_bytes -= it->second;
    rt.device.erase(it);
    free(p);
    return cudaSuccess;
}

static inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    EMU_LOCK;
    *total_bytes = emu_rt().device_limit;
    *free_bytes = emu_rt().device_limit - emu_rt().device_bytes;
    return cudaSuccess;
}

static inline cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int) {
    EMU_LOCK;
    if (emu_touches_device(p, bytes)) { emu_die("cudaHostRegister(%p): device memory", p); }
    emu_rt().pinned[(uintptr_t)p] = bytes;
    return cudaSuccess;
}
static inline cudaError_t cudaHostUnregister(void* p) {
    EMU_LOCK;
    emu_force_all();
    if (emu_rt().pinned.erase((uintptr_t)p) != 1) { emu_die("cudaHostUnregister(%p): not registered", p); }
    return cudaSuccess;
}

static inline cudaError_t cudaGetDeviceCount(int* count) { *count = 1; return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : emu_error(cudaErrorInvalidValue); }
static inline cudaError_t cudaSetDeviceFlags(unsigned int) { return cudaSuccess; }
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "CPU emulator (dev/cuda/emu, not a GPU)");
    prop->totalGlobalMem = emu_rt().device_limit;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 1;
    prop->maxThreadsPerBlock = 1024;
    prop->warpSize = 32;
    prop->sharedMemPerBlock = 48 << 10;
    prop->l2CacheSize = 1 << 20;
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
    *value = attr == cudaDevAttrL2CacheSize ? (1 << 20) : 0;
    return cudaSuccess;
}

// EMU_NO_KERNEL_IMAGE=1 plays a GPU the binary was not built for: every kernel is missing
static int emu_no_kernel_image(void) {
    static int missing = -1;
    if (missing < 0) {
        const char* s = getenv("EMU_NO_KERNEL_IMAGE");
        missing = (s != NULL && atoi(s) != 0);
    }
    return missing;
}

typedef struct {
    int maxThreadsPerBlock, numRegs, ptxVersion, binaryVersion;
    size_t sharedSizeBytes;
} cudaFuncAttributes;

template <typename... P>
static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, void (*)(P...)) {
    if (emu_no_kernel_image()) { return emu_error(cudaErrorNoKernelImageForDevice); }
    memset(attr, 0, sizeof(*attr));
    attr->maxThreadsPerBlock = 1024;
    attr->ptxVersion = attr->binaryVersion = 90;
    return cudaSuccess;
}

// --- streams: a queue per stream; `lazy` streams run their queue only when something waits

static void emu_force(EmuStream* s, uint64_t seq) {
    while (s->done < seq) {
        std::function<void()> op = std::move(s->pending.front());
        s->pending.pop_front();
        op();  // may force other streams (a cudaStreamWaitEvent)
        s->done++;
    }
}

static void emu_force_all(void) {
    EMU_LOCK;
    for (EmuStream* s : emu_rt().streams) { emu_force(s, s->issued); }
}

static inline EmuStream* emu_stream(cudaStream_t s) { return s == NULL ? &emu_rt().default_stream : s; }

// queues `op` on stream s, and runs it now unless the stream is lazy
static void emu_enqueue(cudaStream_t stream, std::function<void()> op) {
    EMU_LOCK;
    EmuStream* s = emu_stream(stream);
    s->pending.push_back(std::move(op));
    s->issued++;
    if (!s->lazy) { emu_force(s, s->issued); }
}

static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
    EMU_LOCK;
    if (flags != cudaStreamNonBlocking) {
        emu_die("cudaStreamCreateWithFlags: only non-blocking streams are emulated (a blocking stream "
                "would synchronize with the default stream)");
    }
    EmuStream* s = new EmuStream();
    s->issued = s->done = 0;
    s->lazy = !strcmp(emu_rt().schedule, "lazy") || !strcmp(emu_rt().schedule, "lazy_copies");
    emu_rt().streams.push_back(s);
    *stream = s;
    return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    EMU_LOCK;
    emu_force(stream, stream->issued);
    auto& v = emu_rt().streams;
    v.erase(std::find(v.begin(), v.end(), stream));
    delete stream;
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    EMU_LOCK;
    EmuStream* s = emu_stream(stream);
    emu_force(s, s->issued);
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceSynchronize(void) {
    emu_force_all();
    return cudaSuccess;
}

static inline double emu_clock_ms(void) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
    EmuEvent* e = new EmuEvent();
    e->stream = NULL;
    e->seq = 0;
    e->timing = !(flags & cudaEventDisableTiming);
    e->has_time = 0;
    *event = e;
    return cudaSuccess;
}
static inline cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
static inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
    EMU_LOCK;
    if (event->stream != NULL) { emu_force(event->stream, event->seq); }  // a queued record writes to it
    delete event;
    return cudaSuccess;
}
static inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0) {
    EMU_LOCK;
    EmuStream* s = emu_stream(stream);
    event->stream = s;
    event->seq = s->issued + 1;
    event->has_time = 0;
    uint64_t seq = event->seq;
    emu_enqueue(stream, [event, seq]() {
        if (event->seq == seq) {  // not re-recorded since
            event->time_ms = emu_clock_ms();
            event->has_time = 1;
        }
    });
    return cudaSuccess;
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    EMU_LOCK;
    if (event->stream != NULL) { emu_force(event->stream, event->seq); }
    return cudaSuccess;
}
static inline cudaError_t cudaEventQuery(cudaEvent_t event) {
    EMU_LOCK;
    // "not ready" also becomes the last error, as the real runtime may keep it: a caller
    // that does not clear it fails at its next launch check, here as on a GPU
    return event->stream == NULL || event->stream->done >= event->seq ? cudaSuccess : emu_error(cudaErrorNotReady);
}
static inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    EMU_LOCK;
    if (!start->timing || !end->timing) { return emu_error(cudaErrorInvalidResourceHandle); }
    if (start->stream == NULL || end->stream == NULL) { return emu_error(cudaErrorInvalidResourceHandle); }
    if (start->stream->done < start->seq || end->stream->done < end->seq) { return emu_error(cudaErrorNotReady); }
    *ms = (float)(end->time_ms - start->time_ms);
    return cudaSuccess;
}
// later work on `stream` waits for the event's last record (as it is now)
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0) {
    EMU_LOCK;
    (void)flags;
    EmuStream* on = event->stream;
    uint64_t seq = event->seq;
    if (on == NULL) { return cudaSuccess; }  // never recorded: nothing to wait for
    emu_enqueue(stream, [on, seq]() { emu_force(on, seq); });
    return cudaSuccess;
}

// --- copies

static inline void emu_check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* call) {
    int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost) { emu_die("%s: kind %d is not emulated", call, (int)kind); }
    if (dst_dev ? !emu_is_device(dst, bytes) : emu_touches_device(dst, bytes)) {
        emu_die("%s: the destination [%p, +%zu bytes) is not %s memory", call, dst, bytes,
                dst_dev ? "inside one device allocation" : "host");
    }
    if (src_dev ? !emu_is_device(src, bytes) : emu_touches_device(src, bytes)) {
        emu_die("%s: the source [%p, +%zu bytes) is not %s memory", call, src, bytes,
                src_dev ? "inside one device allocation" : "host");
    }
}

static inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                          cudaStream_t stream = 0) {
    EMU_LOCK;
    if (bytes == 0) { return cudaSuccess; }
    emu_check_copy(dst, src, bytes, kind, "cudaMemcpyAsync");
    EmuStream* s = emu_stream(stream);
    const void* host = kind == cudaMemcpyHostToDevice ? src : kind == cudaMemcpyDeviceToHost ? dst : NULL;
    if (host != NULL && !emu_in(emu_rt().pinned, host, bytes)) { emu_rt().pageable_async_copies++; }
    if (!s->lazy) {
        emu_enqueue(stream, [dst, src, bytes]() { memcpy(dst, src, bytes); });
        return cudaSuccess;
    }
    if (kind == cudaMemcpyDeviceToHost) { memset(dst, 0xFF, bytes); }  // NaN until the copy has run
    std::shared_ptr<std::vector<char>> issued;
    if (kind == cudaMemcpyHostToDevice) { issued = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + bytes); }
    emu_enqueue(stream, [dst, src, bytes, issued]() {
        if (issued && memcmp(issued->data(), src, bytes) != 0) {
            emu_die("cudaMemcpyAsync host to device: the host changed the source [%p, +%zu bytes) after "
                    "issuing the copy and before it ran (wait for the copy's event first)", src, bytes);
        }
        memcpy(dst, src, bytes);
    });
    return cudaSuccess;
}

// synchronous: runs after the default stream's earlier work; returns when done
static inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    EMU_LOCK;
    if (bytes == 0) { return cudaSuccess; }
    emu_check_copy(dst, src, bytes, kind, "cudaMemcpy");
    emu_enqueue(0, [dst, src, bytes]() { memcpy(dst, src, bytes); });
    cudaStreamSynchronize(0);
    return cudaSuccess;
}

static inline cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                       size_t height, cudaMemcpyKind kind) {
    for (size_t r = 0; r < height; r++) {
        cudaError_t err = cudaMemcpy((char*)dst + r * dpitch, (const char*)src + r * spitch, width, kind);
        if (err != cudaSuccess) { return err; }
    }
    return cudaSuccess;
}

static inline cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = 0) {
    EMU_LOCK;
    if (bytes == 0) { return cudaSuccess; }
    if (!emu_is_device(dst, bytes)) { emu_die("cudaMemset: [%p, +%zu bytes) is not inside one device allocation", dst, bytes); }
    emu_enqueue(stream, [dst, value, bytes]() { memset(dst, value, bytes); });
    return cudaSuccess;
}
static inline cudaError_t cudaMemset(void* dst, int value, size_t bytes) { return cudaMemsetAsync(dst, value, bytes, 0); }

// ----------------------------------------------------------------------------
// launches: emu_launch(kernel, emu_config(grid, block[, shared, stream]))(args...)

typedef struct {
    dim3 grid, block;
    cudaStream_t stream;
} EmuConfig;

static inline EmuConfig emu_config(dim3 grid, dim3 block, size_t shared_bytes = 0, cudaStream_t stream = 0) {
    if (shared_bytes != 0) { emu_die("dynamic shared memory is not emulated"); }
    EmuConfig c = {grid, block, stream};
    return c;
}

// a pointer argument must point into device memory (or be NULL)
template <typename T>
static inline void emu_check_arg(T* p, const char* kernel, int index) {
    if (p != NULL && !emu_in(emu_rt().device, p, 0)) {
        emu_die("%s: argument %d (%p) does not point into device memory", kernel, index, (const void*)p);
    }
}
template <typename T>
static inline void emu_check_arg(const T&, const char*, int) {}

static void emu_run_grid(EmuConfig c, const std::function<void()>& body, const char* kernel) {
    long long blocks = (long long)c.grid.x * c.grid.y * c.grid.z;
    int reverse = emu_reverse_order();
#pragma omp parallel for schedule(dynamic, 1)
    for (long long j = 0; j < blocks; j++) {
        long long b = reverse ? blocks - 1 - j : j;
        blockIdx = dim3((unsigned)(b % c.grid.x), (unsigned)((b / c.grid.x) % c.grid.y),
                        (unsigned)(b / ((long long)c.grid.x * c.grid.y)));
        blockDim = c.block;
        gridDim = c.grid;
#if defined(__SANITIZE_ADDRESS__)
        emu_runner.scheduler_stack_bottom = NULL;
        emu_runner.scheduler_stack_size = 0;
#endif
        emu_run_block(body, kernel);
    }
}

template <typename... P>
struct EmuLaunch {
    void (*kernel)(P...);
    EmuConfig config;
    const char* name;
    template <typename... A>
    void operator()(A&&... args) const {
        static_assert(sizeof...(A) == sizeof...(P), "wrong number of kernel arguments");
        EMU_LOCK;
        if (emu_no_kernel_image()) {
            emu_error(cudaErrorNoKernelImageForDevice);
            return;
        }
        dim3 g = config.grid, b = config.block;
        if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0 || (size_t)b.x * b.y * b.z > 1024 ||
            b.z > 64 || g.y > 65535 || g.z > 65535 || g.x > 2147483647u) {
            fprintf(stderr, "CUDA emulator: %s<<<(%u,%u,%u), (%u,%u,%u)>>>: invalid configuration\n", name, g.x, g.y,
                    g.z, b.x, b.y, b.z);
            emu_error(cudaErrorInvalidConfiguration);
            return;
        }
        std::tuple<typename std::decay<P>::type...> values(std::forward<A>(args)...);
        check_args(values, std::index_sequence_for<P...>());
        void (*k)(P...) = kernel;
        EmuConfig c = config;
        const char* n = name;
        emu_enqueue(config.stream, [k, c, n, values]() {
            std::function<void()> body = [k, &values]() { std::apply(k, values); };
            emu_run_grid(c, body, n);
        });
    }
    template <typename Tuple, size_t... I>
    void check_args(const Tuple& t, std::index_sequence<I...>) const {
        (emu_check_arg(std::get<I>(t), name, (int)I), ...);
    }
};

template <typename... P>
static inline EmuLaunch<P...> emu_launch_(void (*kernel)(P...), EmuConfig config, const char* name) {
    return EmuLaunch<P...>{kernel, config, name};
}
#define emu_launch(kernel, config) emu_launch_(kernel, config, #kernel)

// at exit: a note if any asynchronous copy used pageable memory (it would not overlap on a GPU)
static void emu_report(void) {
    if (emu_rt().pageable_async_copies > 0) {
        fprintf(stderr, "CUDA emulator: note: %lld cudaMemcpyAsync calls used host memory that was not "
                "registered (on a GPU they are synchronous)\n", emu_rt().pageable_async_copies);
    }
}
static int emu_report_registered = (atexit(emu_report), 0);

#endif  // EMU_CUDA_RUNTIME_H
