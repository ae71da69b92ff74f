# ZenFlow GPT-2: build, test, run.
#
#   make            build what this machine can build (CPU trainer always, CUDA if nvcc exists)
#   make test       every test this machine can run; skipped ones are named with the reason
#   make run        prepare tinyshakespeare, build, train (GPU if there is one, else CPU)
#   make deps       install the Debian packages the Python scripts and the build need (python3-torch,
#                   libxxhash-dev, ...); make run installs only what it needs (python3-numpy,
#                   python3-regex, libxxhash-dev)
#
# Python scripts run with Debian's interpreter, which is where python3-torch installs.
PYTHON ?= /usr/bin/python3
CXX ?= g++
NVCC ?= nvcc

# -ffp-contract=off: no fused multiply-add, so the AdamW step is bitwise the spec's
# (docs/zenflow_spec.md 3.1) and the CPU trainer is reproducible; never -ffast-math.
# `make CXXFLAGS="-O2 -march=x86-64-v3"` replaces the first line only: `override` keeps the
# second (a variable set on make's command line would otherwise ignore the +=). A CXXFLAGS in
# the environment (conda's compilers export one) does not: the build is the same everywhere.
ifneq ($(origin CXXFLAGS),command line)
CXXFLAGS = -O3 -march=native
endif
override CXXFLAGS += -std=c++17 -fopenmp -ffp-contract=off -Wall -Wextra -Wno-unused-function
LDLIBS = -lpthread -lm

# CUDA: machine code for sm_80 (A100, and every 8.x GPU) and sm_90 (H100/H200), PTX of
# compute_90 that the driver of a newer GPU compiles at first launch, and machine code for
# this machine's GPU when nvidia-smi names one of another major version (a T4 is 7.5: PTX
# cannot run on an older GPU than it was written for) that this nvcc can build (else a line
# says what that means). Set CUDA_ARCH to choose yourself.
# -fmad=false for the same reason as above, with IEEE division and square root (nvcc's
# defaults, pinned): `make NVCCFLAGS=...` replaces the first line only, as with CXXFLAGS.
NVCC_FOUND := $(shell command -v $(NVCC) 2>/dev/null)
LOCAL_GPU_ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | \
                    grep -E '^[0-9]+\.[0-9]+$$' | head -1 | tr -d .)
CUDA_ARCH_DEFAULT = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
ifneq ($(and $(NVCC_FOUND),$(filter-out 8% 9%,$(LOCAL_GPU_ARCH))),)
ifneq ($(filter sm_$(LOCAL_GPU_ARCH),$(shell $(NVCC) --list-gpu-code 2>/dev/null)),)
CUDA_ARCH_DEFAULT += -gencode arch=compute_$(LOCAL_GPU_ARCH),code=sm_$(LOCAL_GPU_ARCH)
else ifeq ($(shell [ $(LOCAL_GPU_ARCH) -gt 90 ] && echo newer),newer)
$(info note: this nvcc cannot build for this GPU (sm_$(LOCAL_GPU_ARCH)): its driver compiles the compute_90 PTX at the first launch)
else
$(info warning: this nvcc cannot build for this GPU (sm_$(LOCAL_GPU_ARCH)), and newer code does not run on it: train_gpt2cu will not start (hint: a CUDA toolkit that supports sm_$(LOCAL_GPU_ARCH), or the CPU trainer))
endif
endif
CUDA_ARCH ?= $(CUDA_ARCH_DEFAULT)
NVCCFLAGS ?= -O3 $(CUDA_ARCH)
override NVCCFLAGS += -std=c++17 -fmad=false -prec-div=true -prec-sqrt=true -Xcompiler -Wall,-fopenmp,-ffp-contract=off
NVCC_LDLIBS = -lcublasLt -lgomp -lpthread

CPU_BINS = train_gpt2cpu test_gpt2cpu forward_gpt2cpu test_zenflow test_cpu_adam zenflow_async sim_stall
TSAN_BINS = test_cpu_adam_tsan test_zenflow_tsan train_gpt2cpu_tsan
ASAN_BINS = test_gpt2cpu_asan test_zenflow_asan train_gpt2cpu_asan
ifneq ($(NVCC_FOUND),)
CUDA_BINS = train_gpt2cu test_gpt2cu cuda_dev
else
CUDA_BINS =
$(info nvcc not found: skipping train_gpt2cu, test_gpt2cu and dev/cuda's programs (install the CUDA toolkit to build them))
endif

HEADERS = $(wildcard llmc/*.h) cpu_adam.h zenflow.h

.PHONY: all xxhash_h test run data deps deps_run refs gpu_refs gpu_rehearsal walkthrough clean bench bench_zenflow bench_llmc llmc_cpu bench_llmc_cpu bench_checkpoint cuda_dev fuzz emu
all: xxhash_h $(CPU_BINS) $(CUDA_BINS)

# llmc/hashed_file.h includes xxhash.h (the checkpoints' checksums): Debian's libxxhash-dev,
# which make run, make data and make test install (scripts/install_deps.sh)
xxhash_h:
	@echo '#include <xxhash.h>' | $(CXX) -E -x c++ - >/dev/null 2>&1 || { echo "error: xxhash.h not found (hint: bash scripts/install_deps.sh run, or apt-get install libxxhash-dev)" >&2; exit 1; }

cpu_adam.o: cpu_adam.cpp cpu_adam.h
	$(CXX) $(CXXFLAGS) -c $< -o $@

train_gpt2cpu: train_gpt2.cpp cpu_adam.o $(HEADERS)
	$(CXX) $(CXXFLAGS) $< cpu_adam.o -o $@ $(LDLIBS)

test_gpt2cpu: dev/test/test_gpt2.cpp dev/test/test_common.h train_gpt2.cpp cpu_adam.o $(HEADERS)
	$(CXX) $(CXXFLAGS) $< cpu_adam.o -o $@ $(LDLIBS)

# the forward pass on one batch, logits and loss to a file (dev/test/test_hf.py against transformers)
forward_gpt2cpu: dev/test/forward_gpt2.cpp train_gpt2.cpp cpu_adam.o $(HEADERS)
	$(CXX) $(CXXFLAGS) $< cpu_adam.o -o $@ $(LDLIBS)

test_zenflow: dev/test/test_zenflow.cpp dev/test/test_common.h train_gpt2.cpp cpu_adam.o $(HEADERS)
	$(CXX) $(CXXFLAGS) $< cpu_adam.o -o $@ $(LDLIBS)

# the GPU backend's copy/wait protocol, on the CPU: a stand-in device whose copies land as
# late or as early as CUDA allows (dev/cuda/zenflow_async.cpp)
zenflow_async: dev/cuda/zenflow_async.cpp dev/test/test_common.h train_gpt2.cpp cpu_adam.o $(HEADERS)
	$(CXX) $(CXXFLAGS) $< cpu_adam.o -o $@ $(LDLIBS)

# the CPU trainer for two other x86-64 levels: v2 (SSE, 4 floats a vector) and v3 (AVX2, 8);
# dev/test/test_same_bits.py checks that they train to the native build's bits
ifeq ($(shell uname -m),x86_64)
ARCH_BINS = build/arch/train_gpt2cpu_x86-64-v2 build/arch/train_gpt2cpu_x86-64-v3
endif
build/arch/train_gpt2cpu_%: train_gpt2.cpp cpu_adam.cpp cpu_adam.h $(HEADERS)
	@mkdir -p build/arch
	$(CXX) -O3 -march=$* $(filter-out -O3 -march=native,$(CXXFLAGS)) $< cpu_adam.cpp -o $@ $(LDLIBS)

bench_cpu_adam: dev/bench_cpu_adam.cpp cpu_adam.o $(HEADERS)
	$(CXX) $(CXXFLAGS) $< cpu_adam.o -o $@ $(LDLIBS)

# what the checkpoints' checksums cost at d12, write and read, against plain I/O (up to about
# 4 GB on disk: a state file and its next write's .tmp)
build/bench_checkpoint: dev/bench_checkpoint.cpp $(HEADERS)
	@mkdir -p build
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)
bench_checkpoint: build/bench_checkpoint
	./build/bench_checkpoint build

# the modes (zenflow with either accumulation) on a simulated GPU and PCIe link beside ZenFlow's
# real CPU side (make bench)
sim_stall: dev/sim_stall.cpp cpu_adam.o $(HEADERS)
	$(CXX) $(CXXFLAGS) $< cpu_adam.o -o $@ $(LDLIBS)

test_cpu_adam: dev/test/test_cpu_adam.cpp cpu_adam.o cpu_adam.h
	$(CXX) $(CXXFLAGS) $< cpu_adam.o -o $@ $(LDLIBS)

# ThreadSanitizer builds of the updater and orchestration tests, without OpenMP (libgomp
# is not instrumented and would report false races); everything runs single-threaded then,
# except the updater thread itself, which is what TSan watches.
TSAN_FLAGS = -std=c++17 -O1 -g -ffp-contract=off -fsanitize=thread -Wall -Wno-unknown-pragmas -Wno-unused-function
test_cpu_adam_tsan: dev/test/test_cpu_adam.cpp cpu_adam.cpp cpu_adam.h
	$(CXX) $(TSAN_FLAGS) $< cpu_adam.cpp -o $@ $(LDLIBS)

test_zenflow_tsan: dev/test/test_zenflow.cpp dev/test/test_common.h train_gpt2.cpp cpu_adam.cpp $(HEADERS)
	$(CXX) $(TSAN_FLAGS) $< cpu_adam.cpp -o $@ $(LDLIBS)

# the whole CPU trainer: its end (drain, trace close, free) next to the CPU threads
train_gpt2cpu_tsan: train_gpt2.cpp cpu_adam.cpp $(HEADERS)
	$(CXX) $(TSAN_FLAGS) $< cpu_adam.cpp -o $@ $(LDLIBS)

train_gpt2cu: train_gpt2.cu cpu_adam.o $(HEADERS) zenflow.cuh $(wildcard llmc/*.cuh)
	$(NVCC) $(NVCCFLAGS) $< cpu_adam.o -o $@ $(NVCC_LDLIBS)

test_gpt2cu: test_gpt2.cu dev/test/test_common.h train_gpt2.cu cpu_adam.o $(HEADERS) zenflow.cuh $(wildcard llmc/*.cuh)
	$(NVCC) $(NVCCFLAGS) $< cpu_adam.o -o $@ $(NVCC_LDLIBS)

# dev/cuda: one validation + benchmark program per kernel family (built into build/cuda)
cuda_dev:
	$(MAKE) -s -C dev/cuda ARCH="$(CUDA_ARCH)"

# The CUDA programs on the CPU emulator (dev/cuda/emu/cuda_runtime.h says what it checks):
# the same sources, their launches rewritten line for line by cu2cpp.py, compiled by g++
# with the emulator's cuda_runtime.h and cublasLt.h first on the include path. Needs neither
# nvcc nor a GPU. The _asan build adds AddressSanitizer (out-of-bounds device accesses).
EMU_SRC = train_gpt2.cu test_gpt2.cu zenflow.cuh $(wildcard llmc/*.cuh) $(wildcard dev/cuda/*.cu) $(wildcard dev/cuda/*.h) \
          train_gpt2.cpp $(HEADERS) dev/test/test_common.h
# dev/cuda's validations too (ZF_SKIP_BENCHMARKS=1 in make test: emulated timings mean nothing)
EMU_DEV_CUDA = $(patsubst dev/cuda/%.cu,build/emu/dev_cuda/%,$(wildcard dev/cuda/*.cu))
EMU_DEPS = build/emu/src/.stamp $(HEADERS) dev/test/test_common.h dev/cuda/emu/cuda_runtime.h dev/cuda/emu/cublasLt.h
EMU_FLAGS = -std=c++17 -fopenmp -ffp-contract=off -Wall -Wno-unused-function -Wno-unknown-pragmas \
            -I dev/cuda/emu -iquote . -iquote llmc
EMU_BINS = build/emu/train_gpt2cu build/emu/test_gpt2cu build/emu/test_gpt2cu_asan build/emu/test_gpt2cu_tsan build/emu/train_gpt2cu_tsan $(EMU_DEV_CUDA)
emu: $(EMU_BINS)
build/emu/src/.stamp: $(EMU_SRC) dev/cuda/emu/cu2cpp.py
	$(PYTHON) dev/cuda/emu/cu2cpp.py build/emu/src $(EMU_SRC)
	touch $@
build/emu/train_gpt2cu: $(EMU_DEPS) cpu_adam.o
	$(CXX) -O2 $(EMU_FLAGS) -x c++ build/emu/src/train_gpt2.cu -x none cpu_adam.o -o $@ $(LDLIBS)
build/emu/test_gpt2cu: $(EMU_DEPS) cpu_adam.o
	$(CXX) -O2 $(EMU_FLAGS) -x c++ build/emu/src/test_gpt2.cu -x none cpu_adam.o -o $@ $(LDLIBS)
build/emu/dev_cuda/%: $(EMU_DEPS) cpu_adam.o
	@mkdir -p build/emu/dev_cuda
	$(CXX) -O2 $(EMU_FLAGS) -x c++ build/emu/src/dev/cuda/$*.cu -x none cpu_adam.o -o $@ $(LDLIBS)
build/emu/test_gpt2cu_asan: $(EMU_DEPS) cpu_adam.cpp
	$(CXX) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
	    $(EMU_FLAGS) -x c++ build/emu/src/test_gpt2.cu -x none cpu_adam.cpp -o $@ $(LDLIBS)
# ThreadSanitizer build: the emulator then also reports races (its comment says which), the
# CUDA analogue of compute-sanitizer's racecheck plus the streams. Without OpenMP (libgomp is
# not instrumented); the blocks of a grid run on the emulator's own worker threads.
build/emu/%_tsan: $(EMU_DEPS) cpu_adam.cpp
	$(CXX) -O1 -g -fsanitize=thread $(filter-out -fopenmp,$(EMU_FLAGS)) -x c++ build/emu/src/$(subst gpt2cu,gpt2,$*).cu \
	    -x none cpu_adam.cpp -o $@ $(LDLIBS)

# AddressSanitizer + UndefinedBehaviorSanitizer builds of the CPU programs (make test runs
# the tests and the bad-input checks with them)
ASAN_FLAGS = -std=c++17 -O1 -g -fopenmp -ffp-contract=off -fsanitize=address,undefined \
             -fno-sanitize-recover=undefined -fno-omit-frame-pointer -Wall -Wno-unused-function
%_asan: dev/test/%.cpp dev/test/test_common.h train_gpt2.cpp cpu_adam.cpp $(HEADERS)
	$(CXX) $(ASAN_FLAGS) $< cpu_adam.cpp -o $@ $(LDLIBS)
test_gpt2cpu_asan: dev/test/test_gpt2.cpp dev/test/test_common.h train_gpt2.cpp cpu_adam.cpp $(HEADERS)
	$(CXX) $(ASAN_FLAGS) $< cpu_adam.cpp -o $@ $(LDLIBS)
train_gpt2cpu_asan: train_gpt2.cpp cpu_adam.cpp $(HEADERS)
	$(CXX) $(ASAN_FLAGS) $< cpu_adam.cpp -o $@ $(LDLIBS)

# libFuzzer targets for the file readers (clang), run for a bounded time by `make fuzz`
CLANGXX ?= clang++
FUZZ_FLAGS = -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
             -ffp-contract=off -Wno-unknown-pragmas
FUZZ_BINS = $(addprefix build/fuzz/fuzz_,model shard tokenizer checkpoint)
build/fuzz/fuzz_%: dev/fuzz/fuzz_%.cpp dev/fuzz/fuzz_common.h $(HEADERS) train_gpt2.cpp cpu_adam.cpp
	@mkdir -p build/fuzz
	$(CLANGXX) $(FUZZ_FLAGS) $< cpu_adam.cpp -o $@ -lpthread -lm
FUZZ_SECONDS ?= 15
fuzz: train_gpt2cpu $(FUZZ_BINS)
	bash dev/fuzz/run_fuzzers.sh $(FUZZ_SECONDS)

deps:
	@bash scripts/install_deps.sh

deps_run:
	@bash scripts/install_deps.sh run

data: deps_run
	$(PYTHON) scripts/prepare_tinyshakespeare.py

# PyTorch reference outputs for the tests; regenerated when the scripts change
REF_DIR = dev/test/ref
refs: $(REF_DIR)/.stamp
# the reference cases a GPU machine needs, in one small folder to copy along: all but
# the 50 MB vocab case, of which only train.bin goes (gpu_check.sh makes the rest there with
# PyTorch); COMMIT says which source it was packed from (the machine gets no .git)
gpu_refs: refs
	rm -rf build/gpu_refs && mkdir -p build/gpu_refs/vocab
	cp -r $(REF_DIR)/tiny $(REF_DIR)/zf_* build/gpu_refs/
	cp $(REF_DIR)/vocab/train.bin build/gpu_refs/vocab/
	mkdir -p build/gpu_refs/include && cp /usr/include/xxhash.h build/gpu_refs/include/
	(git describe --always --dirty --abbrev=7 2>/dev/null || echo "unknown (no git)") > build/gpu_refs/COMMIT
# dev/gpu_check.sh run through every stage on the CPU emulator, before a GPU machine runs it
# (dev/cuda/emu/rehearse_gpu_check.sh: every stage in the plan's order; needs nvcc for the host
# code, 25 to 45 minutes)
gpu_rehearsal: emu refs
	bash dev/cuda/emu/rehearse_gpu_check.sh
# docs/teaching.md's fine-tuning walk-through, run as written (5 to 10 minutes)
walkthrough: deps train_gpt2cpu data
	bash dev/test/test_walkthrough.sh
$(REF_DIR)/.stamp: dev/test/make_refs.sh scripts/gpt2_reference.py scripts/zenflow_reference.py
	bash dev/test/make_refs.sh $(REF_DIR)
	touch $@

test: deps all $(TSAN_BINS) $(ASAN_BINS) $(FUZZ_BINS) $(EMU_BINS) $(ARCH_BINS) refs
	@bash dev/test/run_tests.sh

# only the trainer it runs: the CUDA one where a GPU answers (and nvcc exists), else the CPU one
RUN_BIN := $(if $(and $(NVCC_FOUND),$(shell nvidia-smi -L >/dev/null 2>&1 && echo y)),train_gpt2cu,train_gpt2cpu)
run: deps_run data $(RUN_BIN)
	@bash scripts/run.sh $(ARGS)

# the GPU benchmark of the three modes (scripts/bench_zenflow.sh; needs a GPU)
bench_zenflow: train_gpt2cu
	bash scripts/bench_zenflow.sh

# ours against llm.c's fp32 trainer, side by side (needs a GPU; llm.c is fetched into build/)
bench_llmc: train_gpt2cu
	@[ -f build/llmc_ref/train_gpt2_fp32.cu ] || bash scripts/get_llmc.sh $(LLMC_GIT)
	bash scripts/bench_llmc.sh

# llm.c's own CPU programs on our files and against our trainer (no GPU; llm.c is fetched
# into build/, or taken from a local clone: make llmc_cpu LLMC_GIT=path; also a row of
# make test when it is there)
llmc_cpu: deps data refs train_gpt2cpu
	@[ -f build/llmc_ref/train_gpt2.c ] || bash scripts/get_llmc.sh $(LLMC_GIT)
	$(PYTHON) dev/test/test_llmc_cpu.py

# our CPU trainer against llm.c's train_gpt2.c, ms/step side by side (no GPU; llm.c as above)
bench_llmc_cpu: deps data train_gpt2cpu
	@[ -f build/llmc_ref/train_gpt2.c ] || bash scripts/get_llmc.sh $(LLMC_GIT)
	$(PYTHON) scripts/bench_llmc_cpu.py

# cpu_adam vs torch.optim.AdamW vs the memory-bandwidth limit, the shortest GPU step this
# host's CPU side keeps up with, and the modes on a simulated H200 and PCIe link with
# this host's real CPU side (dev/sim_stall.cpp; its table, and its picture drawn from the CSV)
bench: deps bench_cpu_adam sim_stall
	$(PYTHON) scripts/bench_cpu_adam.py --bin ./bench_cpu_adam
	@mkdir -p build/bench
	./sim_stall -o build/bench/sim_step_time.csv
	$(PYTHON) scripts/plot_step_time.py --csv build/bench/sim_step_time.csv --out build/bench/sim_step_time.png \
	    --title "simulated GPU and PCIe, real CPU side on this host"

clean:
	rm -f $(CPU_BINS) $(TSAN_BINS) $(ASAN_BINS) bench_cpu_adam train_gpt2cu test_gpt2cu *.o
	rm -rf $(REF_DIR) build/cuda build/fuzz build/emu build/arch build/bench_checkpoint
