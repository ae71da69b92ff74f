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
  - launch rules: a grid or block of size 0, more than 1024 threads, grid.y/z > 65535 fail
    the launch as on a GPU (one line, and the error for cudaGetLastError, which every
    launcher checks); __syncthreads() or a full-mask shuffle that some threads of the
    block/warp skip (an early return before a reduction) stops the program with one line;
  - pointers: a kernel's pointer argument, and both ends of every cudaMemcpy/cudaMemset,
    must lie in a live allocation of the right side (device or host; a kernel may also use
    host memory from cudaHostAlloc(..., cudaHostAllocMapped)); device memory and
    cudaHostAlloc's start as NaN (0xFF bytes), so reading what nobody wrote shows up in the
    numbers; pinning a range that overlaps pinned memory, or cudaHostUnregister on
    cudaHostAlloc's, stops the program (a GPU returns an error);
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
  - EMU_NO_KERNEL_IMAGE=1: a GPU this binary has no code for (every launch fails as it would);
  - races, when built with -fsanitize=thread (build/emu/test_gpt2cu_tsan; run it with
    EMU_SCHEDULE=eager): ThreadSanitizer is told which work is ordered on a GPU and which is
    not, and reports any two accesses to the same memory, one a write, with no order between
    them. Each warp of a block is a TSan fiber, ordered with the other warps only by
    __syncthreads; the blocks of a grid run on two worker threads (block j on j % 2) with
    nothing between them; each stream's work runs as a fiber of its own, which sees what the
    host did before issuing it and another stream's work only through cudaStreamWaitEvent;
    the host sees device work only after cudaEventSynchronize/Query, a stream or device
    synchronization, or a synchronous copy. So a missing barrier, a block reading what
    another block writes, a copy racing a kernel on another stream, and a host thread
    touching a buffer a copy still uses are each reported where they happen, whatever the
    numbers. Like compute-sanitizer's racecheck it sees shared memory; unlike it, also
    global memory, streams and host buffers. Blind spots: the lanes of a warp count as one
    thread (intra-warp hazards without __syncwarp are not seen), blocks on the same worker
    are ordered, and cuBLASLt products are checked as whole ranges read and written.
Not modelled: timing (events read a host clock when they run), atomics, dynamic shared
memory, streams other than non-blocking ones.
Build with the headers of this folder first on the include path (the top-level Makefile's emu
targets, EMU_FLAGS).
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

// Built with -fsanitize=thread, the emulator is also a race detector (see "races" below).
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>

#include <condition_variable>
#include <thread>
#define EMU_TSAN 1
// exported by the TSan runtime: accesses between Begin and End are not checked
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
extern "C" void __tsan_read_range(void* addr, unsigned long size);   // one check for a whole range
extern "C" void __tsan_write_range(void* addr, unsigned long size);
// the emulator's own machinery (fiber switches, queues, events): not the program under test
#define EMU_UNCHECKED_BEGIN() (AnnotateIgnoreReadsBegin(__FILE__, __LINE__), AnnotateIgnoreWritesBegin(__FILE__, __LINE__))
#define EMU_UNCHECKED_END() (AnnotateIgnoreWritesEnd(__FILE__, __LINE__), AnnotateIgnoreReadsEnd(__FILE__, __LINE__))
#define EMU_NO_TSAN __attribute__((no_sanitize_thread, noinline))
#define emu_tsan_release(addr) __tsan_release((void*)(addr))
#define emu_tsan_acquire(addr) __tsan_acquire((void*)(addr))
#else
#define EMU_TSAN 0
#define EMU_UNCHECKED_BEGIN() ((void)0)
#define EMU_UNCHECKED_END() ((void)0)
#define EMU_NO_TSAN
#define emu_tsan_release(addr) ((void)0)
#define emu_tsan_acquire(addr) ((void)0)
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

static inline void __syncthreads(void);

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
    // EMU_TSAN: the TSan fiber of the scheduler (this OS thread's own) and one per warp (the
    // lanes of a warp share it: TSan sees a warp as one thread, see "races" at the top);
    // whether a warp ran yet in this block; two sync objects (their addresses)
    void* tsan_scheduler;
    void* tsan_warp[32];
    int tsan_warp_started[32];
    char barrier, block_end;
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

EMU_NO_TSAN static void emu_switch_to_fiber(EmuFiber* f) {
    emu_current = f;
#if EMU_TSAN
    // A warp's first switch in a block sees what the scheduler did before (the block's
    // start); no other switch, either way, orders anything: the warps of a block are
    // unordered for TSan except through barriers (emu_tsan_all_warps)
    int w = f->linear / 32;
    if (emu_runner.tsan_warp[w] == NULL) { emu_runner.tsan_warp[w] = __tsan_create_fiber(0); }
    __tsan_switch_to_fiber(emu_runner.tsan_warp[w], emu_runner.tsan_warp_started[w] ? __tsan_switch_to_fiber_no_sync : 0);
    emu_runner.tsan_warp_started[w] = 1;
#endif
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

EMU_NO_TSAN static void emu_switch_to_scheduler(EmuFiber* f) {
#if EMU_TSAN
    __tsan_switch_to_fiber(emu_runner.tsan_scheduler, __tsan_switch_to_fiber_no_sync);
#endif
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

EMU_NO_TSAN static void emu_yield(int state) {
    EmuFiber* f = emu_current;
    if (f == NULL) { emu_die("__syncthreads or a shuffle outside a kernel"); }
    f->state = state;
    emu_switch_to_scheduler(f);
}

static inline void __syncthreads(void) { emu_yield(EMU_AT_SYNCTHREADS); }

#if EMU_TSAN
// every warp of the block (all of them stopped) releases `sync` and then, with `acquire`,
// acquires it: at a barrier, what any warp did before happens before what all do after
EMU_NO_TSAN static void emu_tsan_all_warps(EmuBlockRunner* r, int num_warps, char* sync, int acquire) {
    for (int w = 0; w < num_warps; w++) {
        __tsan_switch_to_fiber(r->tsan_warp[w], __tsan_switch_to_fiber_no_sync);
        __tsan_release(sync);
    }
    for (int w = 0; acquire && w < num_warps; w++) {
        __tsan_switch_to_fiber(r->tsan_warp[w], __tsan_switch_to_fiber_no_sync);
        __tsan_acquire(sync);
    }
    __tsan_switch_to_fiber(r->tsan_scheduler, __tsan_switch_to_fiber_no_sync);
}
#endif

extern "C" EMU_NO_TSAN void emu_fiber_main(EmuFiber* f) {
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

#if defined(__x86_64__)
// a fresh stack whose first switch to (emu_switch_stack) calls fn(arg); fn must not return
EMU_NO_TSAN static void* emu_initial_frame(char* stack, size_t size, void (*fn)(void*), void* arg) {
    // the frame emu_switch_stack pops: FP control words, r15..r12, rbx, rbp, return address
    uintptr_t top = ((uintptr_t)(stack + size)) & ~(uintptr_t)15;
    uint64_t* sp = (uint64_t*)(top - 80);  // 16-byte aligned, so the callee's stack is too
    uint32_t csr[2];
    asm volatile("stmxcsr %0" : "=m"(csr[0]));
    asm volatile("fnstcw %0" : "=m"(csr[1]));
    memcpy(&sp[0], csr, 8);
    sp[1] = 0;                                // r15
    sp[2] = 0;                                // r14
    sp[3] = (uint64_t)(uintptr_t)fn;          // r13: what emu_fiber_entry calls
    sp[4] = (uint64_t)(uintptr_t)arg;         // r12: its argument
    sp[5] = 0;                                // rbx
    sp[6] = 0;                                // rbp
    sp[7] = (uint64_t)(uintptr_t)&emu_fiber_entry;
    sp[8] = 0;
    sp[9] = 0;
    return sp;
}
#endif

EMU_NO_TSAN static void emu_fiber_start(EmuFiber* f) {
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
    f->sp = emu_initial_frame(f->stack, f->stack_size, (void (*)(void*))&emu_fiber_main, f);
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

// 1 if the environment variable is set to a non-zero number
static int emu_env_flag(const char* name) {
    const char* s = getenv(name);
    return s != NULL && atoi(s) != 0;
}

static int emu_reverse_order(void) {
    static const int reverse = emu_env_flag("EMU_REVERSE");  // (read once, thread-safely)
    return reverse;
}

// runs every thread of the current block (blockIdx etc. already set) to its end
EMU_NO_TSAN static void emu_run_block(const std::function<void()>& body, const char* kernel) {
    EmuBlockRunner* r = &emu_runner;
#if EMU_TSAN
    r->tsan_scheduler = __tsan_get_current_fiber();
    memset(r->tsan_warp_started, 0, sizeof(r->tsan_warp_started));
#endif
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
        if (done == n) {
#if EMU_TSAN
            // the next block on this OS thread comes after this one (it reuses the shared memory)
            emu_tsan_all_warps(r, num_warps, &r->block_end, 0);
            __tsan_acquire(&r->block_end);
#endif
            break;
        }
        if (at_sync != n) {
            emu_die("%s: block (%u,%u,%u): __syncthreads reached by %d of %d threads (%d exited; the "
                    "barrier must be reached by every thread of the block)",
                    kernel, blockIdx.x, blockIdx.y, blockIdx.z, at_sync, n, done);
        }
#if EMU_TSAN
        emu_tsan_all_warps(r, num_warps, &r->barrier, 1);
#endif
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
#define cudaHostAllocDefault 0x00
#define cudaHostAllocMapped 0x02
#define cudaDeviceScheduleBlockingSync 0x04
#define cudaDeviceMapHost 0x08

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
    void* tsan;      // EMU_TSAN: the TSan fiber its operations run in (one "thread" per stream)
    char* stack;     // EMU_TSAN: ... and its stack
    char tsan_done;  // EMU_TSAN: released after each operation (stream synchronization)
} EmuStream;
typedef EmuStream* cudaStream_t;

typedef struct EmuEvent {
    EmuStream* stream;  // where it was last recorded (NULL: never)
    uint64_t seq;       // ... as the seq-th operation of that stream
    int timing;
    double time_ms;     // host clock when the record ran
    int has_time;
    char* token;        // EMU_TSAN: its last record releases this address
} EmuEvent;

// EMU_TSAN: a fresh sync object for each event record, so that a wait orders exactly what
// came before that record. Plain bytes of one array, not heap objects with reference counts:
// TSan takes an atomic count for an order, and would order a stream after the host that
// dropped a reference. (After 2^20 records the bytes are reused: more order, never less.)
#if EMU_TSAN
static char emu_tsan_tokens[1 << 20];
static size_t emu_tsan_token_count = 0;  // under the emulator's lock
static char* emu_new_token(void) { return &emu_tsan_tokens[emu_tsan_token_count++ % sizeof(emu_tsan_tokens)]; }
#else
static char* emu_new_token(void) { return NULL; }
#endif
typedef EmuEvent* cudaEvent_t;

typedef struct {
    std::recursive_mutex mu;     // every API call: the host may call from several threads
    std::map<uintptr_t, size_t> device;  // allocations: start -> bytes
    std::map<uintptr_t, size_t> pinned;  // cudaHostRegister'ed ranges and cudaHostAlloc'ed ones
    std::map<uintptr_t, size_t> host_alloc;  // cudaHostAlloc'ed ranges ...
    std::map<uintptr_t, size_t> mapped;      // ... of which kernels may use these (cudaHostAllocMapped)
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
// Every runtime call holds the emulator's lock. With EMU_TSAN its bookkeeping is not checked
// and the lock is invisible to TSan: two host threads calling the runtime are not ordered by
// that (they are not on a GPU). The work the call queues runs as its stream, checked.
#if EMU_TSAN
extern "C" void AnnotateIgnoreSyncBegin(const char* file, int line);
extern "C" void AnnotateIgnoreSyncEnd(const char* file, int line);
struct EmuApiScope {
    EmuApiScope() {
        AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
        emu_rt().mu.lock();
        AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
        EMU_UNCHECKED_BEGIN();
    }
    ~EmuApiScope() {
        EMU_UNCHECKED_END();
        AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
        emu_rt().mu.unlock();
        AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
    }
};
#define EMU_LOCK EmuApiScope emu_lock_
#else
#define EMU_LOCK std::lock_guard<std::recursive_mutex> emu_lock_(emu_rt().mu)
#endif

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
// whether [p, p + bytes) overlaps any range of `map`
static inline int emu_overlaps(const std::map<uintptr_t, size_t>& map, const void* p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    auto it = map.upper_bound(a + (bytes ? bytes - 1 : 0));
    if (it == map.begin()) { return 0; }
    --it;
    return it->first + it->second > a;
}
// any overlap with device memory (a host range must not)
static inline int emu_touches_device(const void* p, size_t bytes) { return emu_overlaps(emu_rt().device, p, bytes); }

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

// As the driver: 0 bytes is an invalid value, and a range that overlaps one already pinned
// (registered, or from cudaHostAlloc) fails (cudaErrorHostMemoryAlreadyRegistered); here
// that stops the program, since code that does it has lost track of its buffers. Ranges that
// only share a page are fine, on a GPU too.
static inline cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int) {
    EMU_LOCK;
    if (bytes == 0) { return emu_error(cudaErrorInvalidValue); }
    if (emu_touches_device(p, bytes)) { emu_die("cudaHostRegister(%p): device memory", p); }
    if (emu_overlaps(emu_rt().pinned, p, bytes)) {
        emu_die("cudaHostRegister(%p, %zu): overlaps memory that is pinned already (a GPU answers "
                "cudaErrorHostMemoryAlreadyRegistered)", p, bytes);
    }
    emu_rt().pinned[(uintptr_t)p] = bytes;
    return cudaSuccess;
}
static inline cudaError_t cudaHostUnregister(void* p) {
    EMU_LOCK;
    emu_force_all();
    if (emu_rt().host_alloc.count((uintptr_t)p)) {
        emu_die("cudaHostUnregister(%p): memory from cudaHostAlloc, which cudaFreeHost frees (a GPU "
                "answers invalid value)", p);
    }
    if (emu_rt().pinned.erase((uintptr_t)p) != 1) { emu_die("cudaHostUnregister(%p): not registered", p); }
    return cudaSuccess;
}

// pinned host memory; with cudaHostAllocMapped kernels may read and write it too, at the same
// address (as with UVA on a GPU). Starts as NaN like device memory: what nobody wrote shows.
static inline cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
    EMU_LOCK;
    *ptr = NULL;
    void* p = NULL;
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) { return emu_error(cudaErrorMemoryAllocation); }
    memset(p, 0xFF, bytes);
    emu_rt().pinned[(uintptr_t)p] = bytes;
    emu_rt().host_alloc[(uintptr_t)p] = bytes;
    if (flags & cudaHostAllocMapped) { emu_rt().mapped[(uintptr_t)p] = bytes; }
    *ptr = p;
    return cudaSuccess;
}
static inline cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int flags) {
    EMU_LOCK;
    if (flags != 0 || !emu_in(emu_rt().mapped, host, 0)) { return emu_error(cudaErrorInvalidValue); }
    *device = host;
    return cudaSuccess;
}
static inline cudaError_t cudaFreeHost(void* p) {
    EMU_LOCK;
    emu_force_all();  // as cudaFree
    if (emu_rt().host_alloc.erase((uintptr_t)p) != 1) { emu_die("cudaFreeHost(%p): not from cudaHostAlloc", p); }
    emu_rt().pinned.erase((uintptr_t)p);
    emu_rt().mapped.erase((uintptr_t)p);
    free(p);
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
    static const int missing = emu_env_flag("EMU_NO_KERNEL_IMAGE");
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

// runs one operation of stream s. With EMU_TSAN it runs as the stream's own TSan fiber,
// which sees what the issuing host thread did before (eager: the host state at issue), but
// nothing else: another stream's work only through an event (cudaStreamWaitEvent), and the
// host sees the stream's work only when it synchronizes (an event, the stream, the device).
// (The stream's fiber has a stack of its own, as TSan's fibers must: frames of the host's
// stack written by a stream would look like races with the host's own later frames.)
#if EMU_TSAN
#if !defined(__x86_64__)
#error "the emulator's race detection (-fsanitize=thread) needs x86-64"
#endif
static const size_t EMU_STREAM_STACK_BYTES = 1 << 20;
typedef struct {
    EmuStream* stream;
    std::function<void()>* op;
    void* caller_sp;    // where to switch back
    void* caller_tsan;  // ... and its TSan fiber
} EmuStreamCall;

extern "C" EMU_NO_TSAN void emu_stream_entry(void* arg) {
    EmuStreamCall* call = (EmuStreamCall*)arg;
    {
        std::function<void()> mine = std::move(*call->op);  // its captures are freed on the stream too
        mine();
    }
    emu_tsan_release(&call->stream->tsan_done);
    __tsan_switch_to_fiber(call->caller_tsan, __tsan_switch_to_fiber_no_sync);
    void* unused;
    emu_switch_stack(&unused, call->caller_sp);
    __builtin_unreachable();
}
#endif

static void emu_run_op(EmuStream* s, std::function<void()>& op) {
#if EMU_TSAN
    if (s->tsan == NULL) {
        s->tsan = __tsan_create_fiber(0);
        s->stack = (char*)malloc(EMU_STREAM_STACK_BYTES);
        if (s->stack == NULL) { emu_die("out of memory for a stream's stack"); }
    }
    EmuStreamCall call = {s, &op, NULL, __tsan_get_current_fiber()};
    void* sp = emu_initial_frame(s->stack, EMU_STREAM_STACK_BYTES, emu_stream_entry, &call);
    __tsan_switch_to_fiber(s->tsan, 0);
    emu_switch_stack(&call.caller_sp, sp);
#else
    op();
#endif
}

static void emu_force(EmuStream* s, uint64_t seq) {
    while (s->done < seq) {
        emu_run_op(s, s->pending.front());  // may force other streams (a cudaStreamWaitEvent)
        EMU_UNCHECKED_BEGIN();
        s->pending.pop_front();
        s->done++;
        EMU_UNCHECKED_END();
    }
}

// the host waited for all of stream s's work so far
static void emu_synchronized(EmuStream* s) {
    emu_force(s, s->issued);
    emu_tsan_acquire(&s->tsan_done);
}

static void emu_force_all(void) {
    EMU_LOCK;
    for (EmuStream* s : emu_rt().streams) { emu_synchronized(s); }
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
#if EMU_TSAN
    if (stream->tsan != NULL) { __tsan_destroy_fiber(stream->tsan); }
    free(stream->stack);
#endif
    delete stream;
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    EMU_LOCK;
    emu_synchronized(emu_stream(stream));
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
    char* token = emu_new_token();
    event->token = token;
    emu_enqueue(stream, [event, seq, token]() {
        EMU_UNCHECKED_BEGIN();
        if (event->seq == seq) {  // not re-recorded since
            event->time_ms = emu_clock_ms();
            event->has_time = 1;
        }
        EMU_UNCHECKED_END();
        emu_tsan_release(token);  // everything before it on this stream
    });
    return cudaSuccess;
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    EMU_LOCK;
    if (event->stream != NULL) {
        emu_force(event->stream, event->seq);
        emu_tsan_acquire(event->token);
    }
    return cudaSuccess;
}
static inline cudaError_t cudaEventQuery(cudaEvent_t event) {
    EMU_LOCK;
    // "not ready" also becomes the last error, as the real runtime may keep it: a caller
    // that does not clear it fails at its next launch check, here as on a GPU
    if (event->stream == NULL) { return cudaSuccess; }
    if (event->stream->done < event->seq) { return emu_error(cudaErrorNotReady); }
    emu_tsan_acquire(event->token);
    return cudaSuccess;
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
    char* token = event->token;
    emu_enqueue(stream, [on, seq, token]() {
        emu_force(on, seq);
        emu_tsan_acquire(token);
    });
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

// a pointer argument must point into device memory or mapped host memory (or be NULL)
template <typename T>
static inline void emu_check_arg(T* p, const char* kernel, int index) {
    if (p != NULL && !emu_in(emu_rt().device, p, 0) && !emu_in(emu_rt().mapped, p, 0)) {
        emu_die("%s: argument %d (%p) does not point into device memory (nor mapped host memory)", kernel, index,
                (const void*)p);
    }
}
template <typename T>
static inline void emu_check_arg(const T&, const char*, int) {}

// the j-th block of the grid in run order
static void emu_run_block_number(EmuConfig c, const std::function<void()>& body, const char* kernel, long long j) {
    long long blocks = (long long)c.grid.x * c.grid.y * c.grid.z;
    long long b = emu_reverse_order() ? blocks - 1 - j : j;
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

#if EMU_TSAN
// Races between blocks: the blocks of a grid run on EMU_TSAN_WORKERS threads of their own,
// block j on thread j % EMU_TSAN_WORKERS, and nothing orders two threads' blocks but the
// grid's start and end (as on a GPU). So TSan reports a global-memory access of one block
// that conflicts with one of a neighbour (a block on another worker). Blocks on the same
// worker are ordered, each after the last: that is how their shared memory is reused.
static const int EMU_TSAN_WORKERS = 2;
typedef struct {
    std::mutex mu;
    std::condition_variable cv;
    const std::function<void()>* body;
    EmuConfig config;
    const char* kernel;
    uint64_t generation;  // grids started
    int finished;         // workers done with the current grid
} EmuTsanWorkers;
static EmuTsanWorkers& emu_tsan_workers = *new EmuTsanWorkers();  // never destroyed: its threads outlive main

static void emu_tsan_worker(int w) {
    EmuTsanWorkers& ws = emu_tsan_workers;
    uint64_t seen = 0;
    for (;;) {
        std::unique_lock<std::mutex> lock(ws.mu);
        ws.cv.wait(lock, [&]() { return ws.generation != seen; });
        seen = ws.generation;
        EmuConfig c = ws.config;
        const std::function<void()>* body = ws.body;
        const char* kernel = ws.kernel;
        lock.unlock();
        long long blocks = (long long)c.grid.x * c.grid.y * c.grid.z;
        for (long long j = w; j < blocks; j += EMU_TSAN_WORKERS) { emu_run_block_number(c, *body, kernel, j); }
        lock.lock();
        ws.finished++;
        ws.cv.notify_all();
    }
}

static void emu_run_grid(EmuConfig c, const std::function<void()>& body, const char* kernel) {
    EmuTsanWorkers& ws = emu_tsan_workers;
    static const int started = []() {  // the workers, at the first launch
        for (int w = 0; w < EMU_TSAN_WORKERS; w++) { std::thread(emu_tsan_worker, w).detach(); }
        return 1;
    }();
    (void)started;
    std::unique_lock<std::mutex> lock(ws.mu);
    ws.body = &body;
    ws.config = c;
    ws.kernel = kernel;
    ws.finished = 0;
    ws.generation++;
    ws.cv.notify_all();
    ws.cv.wait(lock, [&]() { return ws.finished == EMU_TSAN_WORKERS; });
}
#else
static void emu_run_grid(EmuConfig c, const std::function<void()>& body, const char* kernel) {
    long long blocks = (long long)c.grid.x * c.grid.y * c.grid.z;
#pragma omp parallel for schedule(dynamic, 1)
    for (long long j = 0; j < blocks; j++) { emu_run_block_number(c, body, kernel, j); }
}
#endif

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
