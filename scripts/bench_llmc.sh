#!/usr/bin/env bash
# The CUDA trainer's speed target, measured side by side in one run: our CUDA trainer (train_gpt2cu,
# -zo adamw) against llm.c's fp32 trainer (train_gpt2_fp32.cu, which scripts/get_llmc.sh
# fetches into build/llmc_ref) on the same GPU, the same model file (the GPT-2 124M shape,
# d12, random init by dev/bench_model.cpp), the same data, T = 1024, B = 4 and 16, TF32 on
# in both (llm.c turns it on for every GPU from sm_80; ours by default).
#
#   bash scripts/bench_llmc.sh [--bin PATH] [--out DIR] [--batch "4 16"] [--train FILE] [--val FILE]
#                              [--llmc-bin PATH] [--model d12] [--seq 1024] [--no-gpu-check]
#
#   --bin       our trainer (default ./train_gpt2cu)
#   --out       logs, model, results (default build/bench_llmc)
#   --train/--val  token shards (default tinyshakespeare in data/)
#   --llmc-bin  an llm.c fp32 trainer already built (default: build it from build/llmc_ref)
#   --model, --seq, --no-gpu-check  a smaller model, T, and no GPU needed: to try this script
#               with stand-ins (make test runs it so, on the CPU emulator); times mean nothing then
#
# Each trainer is built the way its own project builds it: llm.c with its Makefile's flags
# (--use_fast_math), ours with -fmad=false and exact math (the Makefile's; AdamW bitwise the
# spec's). Both time a whole step, data loading included, up to a device synchronization;
# ms/step is the median of steps 3 and later (llm.c trains one epoch of the data, ours 20
# steps; the first two steps are warm-up). The val loss at step 0 (one batch, the same in
# both) shows that llm.c read the same model file; it is not a test (TF32 and different
# cuBLAS algorithms and kernels: close, never bit for bit).
#
# Output: a table (also $OUT/bench_llmc.md) and $OUT/results.txt, one line per batch size:
#   B ours_ms llmc_ms ours_val0 llmc_val0      or      B FAILED note
# Without build/llmc_ref (and no --llmc-bin), or without a GPU, it says SKIPPED and exits 0.
set -u
CALLER=$PWD  # paths on the command line are relative to where the script was started
in_caller() { case $1 in /*) echo "$1" ;; *) echo "$CALLER/$1" ;; esac; }
cd "$(dirname "$0")/.." || exit 2
export ZF_REQUIRE_PINNED=1  # a benchmark run whose copies could not be pinned overlaps nothing: it stops

BIN=./train_gpt2cu
OUT=build/bench_llmc
BATCHES="4 16"
TRAIN=data/tinyshakespeare/tiny_shakespeare_train.bin
VAL=data/tinyshakespeare/tiny_shakespeare_val.bin
LLMC_BIN=""
MODEL=d12
T=1024
STEPS=20
NO_GPU_CHECK=0
while [ $# -gt 0 ]; do
    case $1 in
        --model) MODEL=$2; shift 2 ;;  # a stand-in's settings (make test's run)
        --seq) T=$2; shift 2 ;;
        --no-gpu-check) NO_GPU_CHECK=1; shift ;;
        --bin) BIN=$(in_caller "$2"); shift 2 ;;
        --out) OUT=$(in_caller "$2"); shift 2 ;;
        --batch) BATCHES=$2; shift 2 ;;
        --train) TRAIN=$(in_caller "$2"); shift 2 ;;
        --val) VAL=$(in_caller "$2"); shift 2 ;;
        --llmc-bin) LLMC_BIN=$(in_caller "$2"); shift 2 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;  # the comment on top
        *) echo "bench_llmc.sh: unknown argument $1 (hint: --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$LLMC_BIN" ] && [ ! -f build/llmc_ref/train_gpt2_fp32.cu ]; then
    echo "bench_llmc.sh: SKIPPED (no build/llmc_ref: bash scripts/get_llmc.sh fetches llm.c)"
    exit 0
fi
for f in "$BIN" "$TRAIN" "$VAL"; do
    [ -e "$f" ] || { echo "bench_llmc.sh: $f not found (hint: make; make data)" >&2; exit 2; }
done
mkdir -p "$OUT/logs" || exit 2
OUT=$(cd "$OUT" && pwd)
abspath() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
TRAIN=$(abspath "$TRAIN")
VAL=$(abspath "$VAL")
CXX=${CXX:-g++}
NVCC=${NVCC:-nvcc}

# llm.c, built as its Makefile builds it, for the local GPU (or LLMC_ARCH)
if [ -z "$LLMC_BIN" ]; then
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
    case $cap in ''|*[!0-9]*) cap=90 ;; esac
    ARCH=${LLMC_ARCH:-"--generate-code arch=compute_$cap,code=[compute_$cap,sm_$cap]"}
    LLMC_BIN="$OUT/train_gpt2fp32cu"
    # shellcheck disable=SC2086
    if ! (cd build/llmc_ref && "$NVCC" --threads=0 -t=0 --use_fast_math -std=c++17 -O3 $ARCH \
            train_gpt2_fp32.cu -lcublas -lcublasLt -o "$LLMC_BIN") >"$OUT/logs/build_llmc.log" 2>&1; then
        echo "bench_llmc.sh: could not build llm.c's train_gpt2_fp32.cu (see $OUT/logs/build_llmc.log)" >&2
        exit 1
    fi
fi
LLMC_BIN=$(abspath "$LLMC_BIN")
if [ $NO_GPU_CHECK -eq 0 ] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "bench_llmc.sh: SKIPPED (no GPU: nvidia-smi finds none; llm.c built: $LLMC_BIN)"
    exit 0
fi

# the model file both read (llm.c reads gpt2_124M.bin from its working directory)
if ! { $CXX -O2 -std=c++17 -fopenmp -I. dev/bench_model.cpp -o "$OUT/bench_model" \
       && "$OUT/bench_model" "$MODEL" "$OUT/$MODEL.bin"; } >"$OUT/logs/bench_model.log" 2>&1; then
    echo "bench_llmc.sh: could not write the model file (see $OUT/logs/bench_model.log)" >&2
    exit 1
fi
mkdir -p "$OUT/llmc_run" && ln -sf "$OUT/$MODEL.bin" "$OUT/llmc_run/gpt2_124M.bin" || exit 1
[ -f data/gpt2_tokenizer.bin ] && ln -sf "$(abspath data/gpt2_tokenizer.bin)" "$OUT/llmc_run/gpt2_tokenizer.bin"

# "<step> <ms>" pairs on stdin -> the median ms of steps >= 3, or nan
median_ms() {
    awk '$1 >= 3 { print $2 }' | sort -g \
        | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else printf "%.3f\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# the table of what has run so far: written after each B, so that a run cut short keeps it
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
BASELINE="llm.c's train_gpt2_fp32.cu at $(cut -c1-7 build/llmc_ref/COMMIT 2>/dev/null)"
[ "$LLMC_BIN" = "$OUT/train_gpt2fp32cu" ] || BASELINE="$LLMC_BIN"
write_table() {
    {
        echo "### train_gpt2cu vs $BASELINE, ${DEVICE:-no GPU}"
        echo
        echo "$MODEL, T=$T, TF32, the same model file and data; ms/step = median of steps >= 3"
        echo
        echo "| B | train_gpt2cu ms/step | tok/s | llm.c fp32 ms/step | tok/s | ours / llm.c (target <= 1.00) | val loss at step 0: ours, llm.c |"
        echo "| --- | --- | --- | --- | --- | --- | --- |"
        awk -v T="$T" '
            $2 == "FAILED" { printf "| %s | FAILED: %s | | | | | |\n", $1, $3; next }
            { printf "| %s | %.1f | %.0f | %.1f | %.0f | %.3f | %s, %s |\n", $1, $2, $1 * T / ($2 / 1e3), $3, $1 * T / ($3 / 1e3), $2 / $3, $4, $5 }
        ' "$RESULTS"
    } >"$OUT/bench_llmc.md"
}

# runs both trainers at batch size $1 and prints its line of results.txt: "B ms_ours ms_llmc
# val_ours val_llmc", or "B FAILED why"
measure() {
    local B=$1 ours="$OUT/logs/train_gpt2cu_B$1.log" llmc="$OUT/logs/llmc_fp32_B$1.log"
    local rc_ours rc_llmc ms_ours ms_llmc val_ours val_llmc
    echo "run B=$B: train_gpt2cu, then llm.c" >&2
    timeout --kill-after=10 300 "$BIN" -e "$OUT/$MODEL.bin" -i "$TRAIN" -j "$VAL" -b "$B" -t "$T" -x $STEPS \
        -v 1000000 -m 1 -s 0 -zo adamw >"$ours" 2>&1
    rc_ours=$?
    # one epoch; val (one batch) at step 0 and at the end; a sample of one token at the end
    (cd "$OUT/llmc_run" && timeout --kill-after=10 300 "$LLMC_BIN" -i "$TRAIN" -j "$VAL" -b "$B" -t "$T" \
        -v 1000000 -m 1 -s 1000000 -g 2) >"$llmc" 2>&1
    rc_llmc=$?
    if [ $rc_ours -ne 0 ] || [ $rc_llmc -ne 0 ]; then
        echo "$B FAILED train_gpt2cu-exit-$rc_ours,llm.c-exit-$rc_llmc"
        return
    fi
    # ours:  step 3/20 | loss 10.9 | 45.1 ms | ...       llm.c:  step    3/74: train loss 10.9 (45.1 ms, 90000 tok/s)
    ms_ours=$(sed -n 's/^step \([0-9]*\)\/[0-9]* | loss [^|]*| \([0-9.]*\) ms .*/\1 \2/p' "$ours" | median_ms)
    ms_llmc=$(sed -n 's/^step *\([0-9]*\)\/[0-9]*: train loss [^ ]* (\([0-9.]*\) ms.*/\1 \2/p' "$llmc" | median_ms)
    val_ours=$(sed -n 's/^step 0\/[0-9]* | val loss \([0-9.]*\).*/\1/p' "$ours" | head -1)
    val_llmc=$(sed -n 's/^val loss \([0-9.]*\).*/\1/p' "$llmc" | head -1)
    if [ "$ms_ours" = nan ] || [ "$ms_llmc" = nan ]; then
        echo "$B FAILED no-step-times-in-the-logs"
        return
    fi
    echo "$B $ms_ours $ms_llmc ${val_ours:-nan} ${val_llmc:-nan}"
}

RESULTS="$OUT/results.txt"
: >"$RESULTS"
for B in $BATCHES; do
    measure "$B" >>"$RESULTS"
    write_table
done

cat "$OUT/bench_llmc.md"
! grep -q " FAILED " "$RESULTS"
