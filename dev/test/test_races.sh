#!/usr/bin/env bash
# Races in the CUDA code, found without a GPU: the CUDA test and the CUDA trainer built with
# ThreadSanitizer on the emulator (build/emu/*_tsan; dev/cuda/emu/cuda_runtime.h says what
# TSan is told, under "races"). Any two accesses to the same memory with no order between
# them on a GPU, one a write, fail the run: between the warps of a block, between blocks,
# between a kernel and a copy on another stream, between the host and a copy it did not
# wait for. Eager schedule: every operation runs when issued, so the numbers cannot hide a
# missing wait, and TSan must see it by itself.
#
#   bash dev/test/test_races.sh            (make builds the two binaries: make emu)
#
# 1. test_gpt2cu on the tiny case: every kernel of the trainer, forward and backward, and
#    the AdamW trajectory;
# 2. train_gpt2cu, 8 steps on the tiny model in offload and zenflow (both accumulations, auto
#    U, windows of 2, reselection every 3 steps, overlap, transfers per layer and whole,
#    warm-up, checkpoints inside windows): every copy, event and host wait of zenflow.cuh,
#    with the CPU threads running.
# About a minute and a half on 2 cores (TSan and the emulator: ~12x slower than the plain
# emulator).
set -u
cd "$(dirname "$0")/../.."
# random delays around the CPU threads' jobs (0..3 ms): a job still running when the main thread
# goes on shows its missing wait, where without them it would often have finished first
export EMU_SCHEDULE=eager TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" ZF_WORKER_DELAY_US=3000
T=dev/test/ref/tiny
runs=0 failed=0
run() {  # run NAME COMMAND...
    local name=$1
    shift
    runs=$((runs + 1))
    if "$@" > build/emu/races_$name.log 2>&1; then
        echo "ok    $name: $(grep -v '^\s*$' build/emu/races_$name.log | tail -n 1)"
    else
        echo "FAIL  $name (exit $?): $(grep -m1 -A3 'WARNING: ThreadSanitizer' build/emu/races_$name.log | tr '\n' ' ')"
        echo "      log: build/emu/races_$name.log"
        failed=$((failed + 1))
    fi
}
run test_gpt2cu ./build/emu/test_gpt2cu_tsan $T
rm -rf build/emu/races_checkpoints
for mode in "offload:-zo offload" \
            "zenflow_cpu:-zo zenflow -za cpu -zu 2 -n 3 -o build/emu/races_checkpoints" \
            "zenflow_gpu_auto:-zo zenflow -za gpu -zu auto" \
            "zenflow_whole_warmup:-zo zenflow -za cpu -zu 2 -zp 0 -zw 3"; do
    run "train_${mode%%:*}" ./build/emu/train_gpt2cu_tsan -e $T/model.bin -i $T/train.bin -j $T/train.bin -b 4 -t 16 \
        -x 8 -v 4 -m 2 -s 0 -zs 3 ${mode#*:}
done
echo "races: $((runs - failed)) passed, $failed failed"
[ $failed -eq 0 ]
