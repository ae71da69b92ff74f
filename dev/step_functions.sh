#!/usr/bin/env bash
# The functions of ZenFlow that one default training step runs, measured rather than counted
# by hand: the CUDA trainer on the CPU emulator, built with -finstrument-functions and
# dev/step_functions.cpp's hooks, trains a small model; every function of zenflow.h,
# zenflow.cuh, cpu_adam.cpp and llmc/adamw.h entered during one step (from its
# zf_before_backward to the next step's; on the CPU's worker threads, whose jobs run in the
# background, to the end of the run) is listed in the order of its first entry, with its
# thread. docs/teaching.md, section 5.2, is this list.
#
#   bash dev/step_functions.sh [--step T] [ZenFlow flags ...]
#
#   --step T   the 0-based step (default 7: U = 4, so step 7 closes the second window and
#              applies the first one's update; step 0 selects)
# Kernels and the device functions they call are left out (they run on the emulator's
# threads), but for llmc/adamw.h's, the formula the CPU runs too; so are the trainer's own
# functions and llmc's plumbing (timing, tracing, checks).
set -euo pipefail
cd "$(dirname "$0")/.."
STEP=7
if [ "${1:-}" = --step ]; then STEP=$2; shift 2; fi
make -s build/emu/src/.stamp refs  # the emulated CUDA source; the tiny case's token shard
mkdir -p build/step_functions
BIN=build/step_functions/train_gpt2cu
# -O0 and no inlining, so that every function is a function; the emulator and the system
# headers are not instrumented (the emulator's own calls are not ZenFlow's)
g++ -O0 -g -march=native -no-pie -finstrument-functions \
    -finstrument-functions-exclude-file-list=dev/cuda/emu,/usr/ \
    -std=c++17 -fopenmp -ffp-contract=off -w -I dev/cuda/emu -iquote . -iquote llmc \
    -x c++ build/emu/src/train_gpt2.cu -x none cpu_adam.cpp dev/step_functions.cpp -o "$BIN" -lpthread -lm
nm "$BIN" > build/step_functions/symbols.txt
MARK=$(awk '$3 ~ /zf_before_backward/ { print "0x" $1 }' build/step_functions/symbols.txt | head -1)
OUT=build/step_functions/entered.txt
STEP_FUNCS_MARK=$MARK STEP_FUNCS_STEP=$((STEP + 1)) STEP_FUNCS_OUT=$OUT OMP_NUM_THREADS=1 \
    "$BIN" -e d2c64h2 -i dev/test/ref/tiny/train.bin -j dev/test/ref/tiny/train.bin -b 2 -t 16 \
    -x $((STEP + 5)) -v 0 -s 0 "$@" > build/step_functions/run.log
# address -> function and file; keep ZenFlow's own files, and not the kernels' device code
awk '{ print $1 }' "$OUT" | addr2line -f -C -e "$BIN" | paste - - > build/step_functions/names.txt
paste build/step_functions/names.txt "$OUT" | awk -F'\t' '
    { split($2, where, ":"); file = where[1]; sub(".*/build/emu/src/", "", file); sub(".*/work/[^/]*/", "", file)
      split($3, a, " "); thread = a[2]; name = $1; sub(/\(.*/, "", name)
      if (file !~ /(zenflow\.h|zenflow\.cuh|cpu_adam\.cpp|llmc\/adamw\.h)$/) next
      if (name ~ /_kernel$|^zf_find_set$|^zf_chunk_|^zf_tile_of_block$/) next
      if (seen[name]++) next  # (a header function has a copy in each file that includes it)
      n++; printf "%3d  thread %d  %-34s %s\n", n, thread, name, file }'
echo "(step $STEP; thread 0 is the main thread, 1 and 2 the CPU's worker threads in order of first use)"
