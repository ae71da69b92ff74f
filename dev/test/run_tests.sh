#!/usr/bin/env bash
# Runs every test this machine can run (`make test` builds first, then calls this).
# Each test prints its own detail; this script prints one line per test, PASS / FAIL /
# SKIPPED with the reason, and closes with "tests: N passed, M failed, K skipped".
# A test counts as SKIPPED only when it says so itself (its last line contains SKIPPED)
# and exits 0, or when this script cannot run it at all (and says why).
set -u
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-/usr/bin/python3}
unset PYTHONOPTIMIZE  # some tests check with assert, which -O would strip
LOG_DIR=${LOG_DIR:-build/test_logs}
mkdir -p "$LOG_DIR"
passed=0 failed=0 skipped=0
summary=()

# dev/gpu_check.sh without a device, with --out as docs/results/README.md runs it. Its plan
# first: the stages' limits fit one command. GPU_CHECK_SLOWDOWN: a small CI host builds and
# runs the stages that need no device several times slower than a GPU machine's 16 cores.
gpu_check_dry_run() {
    local out="$LOG_DIR/gpu_check_out" refs="$LOG_DIR/gpu_check_refs" archive f
    bash dev/gpu_check.sh --plan || return 1
    rm -rf "$out" "$refs"
    # as on a GPU machine: the reference cases from `make gpu_refs`, the vocab case made there
    make -s gpu_refs || return 1
    GPU_CHECK_SLOWDOWN=4 GPU_CHECK_REFS=$refs bash dev/gpu_check.sh "$LOG_DIR/gpu_check" --out "$out" || return 1
    if ! grep -q '^| test refs vocab  *| PASS ' "$out/summary.md"; then
        echo "FAIL: the summary has no PASS row 'test refs vocab' (log: $LOG_DIR/gpu_check/make_vocab_case.log)"
        return 1
    fi
    # the same PyTorch here: the same bits (but for losses.txt's first line, naming the paths)
    for f in model.bin state.bin case.txt losses.txt; do
        if ! cmp <(sed '1{/^# /d}' "$refs/vocab/$f") <(sed '1{/^# /d}' "dev/test/ref/vocab/$f"); then
            echo "FAIL: the vocab case gpu_check.sh made, $refs/vocab/$f, differs from dev/test/ref/vocab/$f"
            return 1
        fi
    done
    archive="$out/gpu_check_logs.tar.gz"
    if [ "$(ls "$out")" != "$(printf 'gpu_check_logs.tar.gz\nprogress.md\nsummary.md')" ]; then
        echo "FAIL: --out should hold gpu_check_logs.tar.gz, progress.md and summary.md, holds: $(ls "$out" | tr '\n' ' ')"
        return 1
    fi
    if ! tar -xzOf "$archive" gpu_check/summary.md | cmp -s - "$out/summary.md"; then
        echo "FAIL: $archive has no gpu_check/summary.md equal to $out/summary.md"
        return 1
    fi
    # a second run on the same GPU machine runs only what the first left out: --only. This one
    # is killed as its last stage, d12, begins: --out must hold the logs of the stages before
    local only="$LOG_DIR/gpu_check_only" only_out="$LOG_DIR/gpu_check_only_out" ran
    rm -rf "$only" "$only_out"
    GPU_CHECK_SLOWDOWN=4 GPU_CHECK_KILL_AT=d12 bash dev/gpu_check.sh "$only" --out "$only_out" \
        --only "resume timeline d12"
    ran=$(grep '^\[' "$only_out/progress.md" | grep -v 'not in --only' | cut -c9-36 | sed 's/ *$//' \
          | grep -v -E '^(device|host memory|build|test refs)' | tr '\n' ',')
    if [ "$ran" != "timeline offload,timeline zenflow,resume train_gpt2cu,eval train_gpt2cu," ]; then
        echo "FAIL: --only \"resume timeline d12\" recorded these rows: $ran"
        return 1
    fi
    if [ "$(ls "$only_out")" != "$(printf 'gpu_check_logs.tar.gz\nprogress.md')" ] \
        || ! tar -tzf "$only_out/gpu_check_logs.tar.gz" | grep -q '^gpu_check/timeline_offload.log$'; then
        echo "FAIL: a run killed as stage d12 begins should leave progress.md and an archive with the timeline stage's log in $only_out: $(ls "$only_out" | tr '\n' ' ')"
        return 1
    fi
    echo "gpu_check.sh --out: summary.md and an archive of $(tar -tzf "$archive" | grep -c -v '/$') logs;" \
         "--only ran just the stages asked for; a killed run's --out holds the logs of the stages before"
}

# run_test NAME COMMAND...: runs it, shows its output, records the verdict
run_test() {
    local name=$1
    shift
    local log="$LOG_DIR/$name.log"
    echo "=== $name: $*"
    local start=$SECONDS
    "$@" > "$log" 2>&1
    local rc=$?
    cat "$log"
    local last
    last=$(grep -v '^\s*$' "$log" | tail -n 1)
    local verdict
    if [ $rc -eq 0 ] && [[ "$last" == *SKIPPED* ]]; then
        verdict="SKIPPED  $name: ${last#*SKIPPED}"
        skipped=$((skipped + 1))
    elif [ $rc -eq 0 ]; then
        verdict="PASS     $name ($((SECONDS - start)) s)"
        passed=$((passed + 1))
    else
        verdict="FAIL     $name (exit $rc; log $log)"
        failed=$((failed + 1))
    fi
    echo "--- $verdict"
    summary+=("$verdict")
}

skip_test() {
    echo "=== $1: SKIPPED: $2"
    summary+=("SKIPPED  $1: $2")
    skipped=$((skipped + 1))
}

REFS="dev/test/ref/tiny dev/test/ref/vocab"
ZF_REFS="dev/test/ref/zf_a dev/test/ref/zf_b dev/test/ref/zf_c dev/test/ref/zf_d dev/test/ref/zf_e dev/test/ref/zf_v dev/test/ref/zf_f dev/test/ref/zf_g dev/test/ref/zf_h"

# the README's reading path: its stated line counts are the ones its ranges cover
run_test reading_path "$PYTHON" dev/reading_path.py --check
run_test tokenizer "$PYTHON" dev/test/test_tokenizer.py
run_test prepare_text "$PYTHON" dev/test/test_prepare_text.py
run_test reference "$PYTHON" dev/test/test_reference.py
run_test zenflow_reference "$PYTHON" dev/test/test_zenflow_reference.py
run_test test_gpt2cpu ./test_gpt2cpu $REFS
# Hugging Face GPT-2 in and out (scripts/convert_hf.py) against transformers, offline
run_test hf "$PYTHON" dev/test/test_hf.py ./forward_gpt2cpu ./train_gpt2cpu
run_test test_zenflow ./test_zenflow $ZF_REFS
# zenflow.cuh's copy/wait protocol with a stand-in device (no GPU needed)
run_test zenflow_async ./zenflow_async $ZF_REFS
run_test cpu_adam ./test_cpu_adam
run_test cpu_adam_tsan ./test_cpu_adam_tsan
# the orchestration under ThreadSanitizer: the overlap cases, where the updater thread works
run_test zenflow_tsan ./test_zenflow_tsan dev/test/ref/zf_a
# the trainer under ThreadSanitizer, traced (-tr), its CPU threads slowed down at random so
# that jobs are still running when training ends (ThreadSanitizer exits 66 on a report)
run_test trainer_tsan env ZF_WORKER_DELAY_US=100000 ./train_gpt2cpu_tsan -e dev/test/ref/tiny/model.bin \
    -i dev/test/ref/tiny/train.bin -j dev/test/ref/tiny/train.bin -b 4 -t 16 -x 6 -v 0 -s 0 -zo zenflow -zu 4 \
    -tr "$LOG_DIR/trainer_tsan_trace.json" -tf 1 -tn 10
# the same bits from builds for 4-, 8- and (here) the native vector width
if [ -x build/arch/train_gpt2cpu_x86-64-v2 ]; then
    run_test same_bits "$PYTHON" dev/test/test_same_bits.py dev/test/ref/tiny ./train_gpt2cpu \
        build/arch/train_gpt2cpu_x86-64-v2 build/arch/train_gpt2cpu_x86-64-v3
else
    skip_test same_bits "no build/arch/train_gpt2cpu_x86-64-v2: make builds it on x86-64 machines only"
fi
# the simulated GPU and PCIe link beside the real CPU side: spec 7's bytes, offload's floor
run_test sim_stall "$PYTHON" dev/test/test_sim_stall.py ./sim_stall
run_test plots "$PYTHON" dev/test/test_plots.py
run_test bad_input_cpu "$PYTHON" dev/test/test_bad_input.py ./train_gpt2cpu

# sanitizers: AddressSanitizer + UndefinedBehaviorSanitizer over the CPU tests and the error
# paths (which exit early and leak by design, hence no leak check there), then the fuzzers
run_test asan_test_gpt2cpu ./test_gpt2cpu_asan $REFS
run_test asan_test_zenflow ./test_zenflow_asan dev/test/ref/zf_a dev/test/ref/zf_b
run_test asan_bad_input env ASAN_OPTIONS=detect_leaks=0 "$PYTHON" dev/test/test_bad_input.py ./train_gpt2cpu_asan
run_test fuzz bash dev/fuzz/run_fuzzers.sh "${FUZZ_SECONDS:-15}"
run_test resume "$PYTHON" dev/test/test_resume.py ./train_gpt2cpu dev/test/ref/tiny --kills 6
# the CUDA trainer's call sequence (cuBLASLt layouts, offsets, buffer reuse), emulated in numpy
run_test cuda_emulation "$PYTHON" dev/cuda/emulate_trainer.py

# The CUDA code on the CPU emulator (dev/cuda/emu; no GPU, no nvcc): the same train_gpt2.cu,
# zenflow.cuh and kernels, every thread of every block run as a fiber. It checks results,
# barriers, launch rules, pointers and stream order (not speed, not the real cuBLASLt).
# lazy: queued GPU work runs only when the host waits for it, so a missing event/wait shows.
run_test emu_test_gpt2cu env EMU_SCHEDULE=lazy ./build/emu/test_gpt2cu $REFS $ZF_REFS
# threads and blocks in the opposite order (a missing __syncthreads shows), copies eager
run_test emu_test_gpt2cu_reverse env EMU_SCHEDULE=eager EMU_REVERSE=1 ./build/emu/test_gpt2cu dev/test/ref/tiny dev/test/ref/zf_a
# the copy streams lazy, the default stream eager: the opposite race of the lazy run
run_test emu_test_gpt2cu_copies env EMU_SCHEDULE=lazy_copies ./build/emu/test_gpt2cu dev/test/ref/zf_c
# cuBLASLt offering no algorithm (as the real one may for some shapes): the matmuls fall back
# (no bias epilogue, then plain fp32) and still match the references; with none at all the
# run stops with one line naming the shape (exit 1, fatal's: a crash after the line is no pass)
run_test emu_no_algorithm_bias env EMU_NO_ALGORITHM=bias EMU_SCHEDULE=eager ./build/emu/test_gpt2cu dev/test/ref/tiny
run_test emu_no_algorithm_tf32 env EMU_NO_ALGORITHM=tf32 EMU_SCHEDULE=eager ./build/emu/test_gpt2cu dev/test/ref/tiny
run_test emu_no_algorithm_all bash -c 'out=$(EMU_NO_ALGORITHM=all EMU_SCHEDULE=eager ./build/emu/test_gpt2cu \
    dev/test/ref/tiny 2>&1); rc=$?; echo "$out" | grep "^error:"; [ $rc -eq 1 ] && \
    [ "$(echo "$out" | grep -c "^error: cuBLASLt has no algorithm for m=")" = 1 ] && echo "stopped, one line naming the shape"'
# AddressSanitizer: a kernel or copy outside its allocation (compute-sanitizer's memcheck, roughly);
# the tiny case only: with the ZenFlow cases (tiny zf_a: 44 checks, passed) it takes 5 minutes
run_test emu_asan ./build/emu/test_gpt2cu_asan dev/test/ref/tiny
# ThreadSanitizer: races between warps, blocks, streams and host threads, reported whatever
# the numbers (compute-sanitizer's racecheck, roughly, plus the streams); about a minute
run_test emu_races bash dev/test/test_races.sh
# shapes and ZenFlow settings drawn at random (the edges too), both trainers' code against
# the PyTorch references with the tests above; a longer hunt: see the script's header
run_test random_cases "$PYTHON" dev/test/test_random_cases.py --count 24 --seed 1 --cuda-test build/emu/test_gpt2cu \
    --trainer ./train_gpt2cpu --trainer build/emu/train_gpt2cu
# every dev/cuda kernel validation against its CPU reference (benchmarks skipped)
run_test emu_dev_cuda bash -c 'for p in build/emu/dev_cuda/*; do ZF_SKIP_BENCHMARKS=1 "$p" || exit 1; done'
run_test emu_trainers_agree "$PYTHON" dev/test/test_trainers_agree.py ./train_gpt2cpu build/emu/train_gpt2cu dev/test/ref/tiny
run_test emu_resume env EMU_SCHEDULE=lazy "$PYTHON" dev/test/test_resume.py build/emu/train_gpt2cu dev/test/ref/tiny --kills 3
run_test emu_bad_input "$PYTHON" dev/test/test_bad_input.py build/emu/train_gpt2cu --emulated-gpu
run_test emu_trace env EMU_SCHEDULE=lazy "$PYTHON" dev/test/test_trace.py build/emu/train_gpt2cu dev/test/ref/tiny
# the GPU memory both trainers print, part by part, against scripts/gpu_memory.py (docs/memory.md)
run_test emu_gpu_memory "$PYTHON" dev/test/test_gpu_memory.py build/emu/train_gpt2cu ./train_gpt2cpu --emulated-gpu
# PCIe bytes per step of every mode (bench_zenflow.sh on a small model) against the shapes
run_test emu_pcie_bytes "$PYTHON" dev/test/test_pcie_bytes.py build/emu/train_gpt2cu --emulated-gpu
# the side-by-side benchmark against llm.c's fp32 trainer, with stand-ins for both trainers
run_test emu_bench_llmc "$PYTHON" dev/test/test_bench_llmc.py build/emu/train_gpt2cu
run_test trace_cpu "$PYTHON" dev/test/test_trace.py ./train_gpt2cpu dev/test/ref/tiny
# the val loss and the generated tokens against PyTorch, from the checkpointed models, both trainers
run_test eval_cpu "$PYTHON" dev/test/test_eval.py ./train_gpt2cpu dev/test/ref/tiny
run_test emu_eval "$PYTHON" dev/test/test_eval.py build/emu/train_gpt2cu dev/test/ref/tiny
# llm.c's own test_gpt2.c and train_gpt2.c read our files and train as ours (SKIPPED without
# llm.c's source in build/llmc_ref, as in CI, which has no network; make llmc_cpu fetches it);
# the second with the CUDA trainer on the emulator
run_test llmc_cpu "$PYTHON" dev/test/test_llmc_cpu.py
run_test emu_llmc_cpu "$PYTHON" dev/test/test_llmc_cpu.py --ours build/emu/train_gpt2cu --cuda
run_test failures_cpu "$PYTHON" dev/test/test_failures.py ./train_gpt2cpu dev/test/ref/tiny
run_test emu_failures "$PYTHON" dev/test/test_failures.py build/emu/train_gpt2cu dev/test/ref/tiny --steps 30
# the output directory's faults (a second run, damaged checkpoints, two runs at once, signals,
# resume told otherwise, disk full, stale .tmp) and what is on disk after each, both trainers
run_test output_dir_cpu "$PYTHON" dev/test/test_output_dir.py ./train_gpt2cpu dev/test/ref/tiny
run_test emu_output_dir "$PYTHON" dev/test/test_output_dir.py build/emu/train_gpt2cu dev/test/ref/tiny --steps 30

if [ -x ./test_gpt2cu ]; then
    # without a GPU the binary itself reports SKIPPED with the CUDA runtime's reason
    run_test test_gpt2cu ./test_gpt2cu $REFS $ZF_REFS
    # every kernel's registers (ptxas) allow a block of 1024 threads on sm_80 and sm_90: a
    # launch failure no compile and no emulator shows
    run_test launch_resources "$PYTHON" dev/cuda/check_launch_resources.py --nvcc "${NVCC:-nvcc}"
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        run_test dev_cuda make -s -C dev/cuda run
    else
        skip_test dev_cuda "no CUDA device (the programs were compiled by make; they run in dev/gpu_check.sh)"
        # the GPU check script itself, without a device: it builds for sm_90, finds the
        # references, runs what needs no GPU, and every other stage must say SKIPPED (not
        # FAIL) and the summary table come out: a broken script is found here, not in a GPU
        # machine's scarce minutes. Run as on a GPU machine: logs outside, and only the summary
        # and one archive of the logs in --out (a remote run brings back only a few files)
        run_test gpu_check_script gpu_check_dry_run
    fi
else
    why="no ./test_gpt2cu: nvcc not found, or the CUDA build was not made (install the CUDA toolkit; make)"
    skip_test test_gpt2cu "$why"
    skip_test launch_resources "$why"
    skip_test dev_cuda "$why"
    skip_test gpu_check_script "$why"
fi

echo
echo "=== summary"
for line in "${summary[@]}"; do echo "$line"; done
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
