#!/usr/bin/env bash
# ZenFlow's numbers: the CUDA trainer in its three optimizer modes, side by side,
# on GPT-2 d12 / d24 / d36 / d48 (124M .. 1.5B), B = 4, T = 1024, TF32 on:
#
#   bash scripts/bench_zenflow.sh [--quick] [--bin PATH] [--out DIR] [--budget SECONDS]
#                                 [--models "d12 d48"] [--modes "adamw offload"] [--warmup N] [--steps N]
#
#   --quick     d48 and d12 only, the four main modes, 8 measured steps (what
#               dev/gpu_check.sh runs); d48 first, where the speed-up target is measured,
#               and zenflow-gpu, which the targets rest on, before zenflow-cpu, so that a
#               --budget that runs out cuts the others
#   --modes     which modes (default: all seven below)
#   --bin       the trainer (default ./train_gpt2cu)
#   --out       logs, models, data, results (default build/bench_zenflow)
#   --budget    start no new run after this many seconds (default: none)
#   --warmup    steps not measured (default 4: the first selection and the first window)
#   --steps     measured steps (default 24; a multiple of U = 4, so that every measured
#               window's H2D is counted once)
#   --batch, --seq  B and T (default 4 and 1024; smaller ones to try the script on a stand-in)
#   --no-gpu-check  run even where nvidia-smi finds no GPU (to test this script with a stand-in,
#               e.g. the CPU emulator's build/emu/train_gpt2cu on a small model: its PCIe bytes
#               are counted by the same code, its times mean nothing)
#
# Modes: adamw (everything on the GPU), offload (every matrix on the CPU, synchronous),
# zenflow-cpu (k = 0.1, U = 4, overlap; the paper's accumulation: every step's CPU-owned
# gradients go down), zenflow-gpu (the same, accumulating in the gradient buffer: one copy
# down and one up per window); offload-whole and zenflow-cpu-whole: the same with -zp 0, each
# transfer in one piece after the backward pass instead of layer by layer (what per-layer
# pipelining buys); zenflow-auto: -zu auto -za gpu (spec 6; windows of varying length, so no
# PCIe formula). The numbers come from the trainer's per-step measurements
# (-zm): ms/step (host clock), compute and stall ms (CUDA events on the default stream),
# CPU optimizer work per step, PCIe bytes each way; averages over the measured steps.
#
# Output: one table (also $OUT/bench_zenflow.md) and $OUT/bench_zenflow.csv with the columns
#   device,model,mode,ms_per_step,compute_ms,stall_ms,cpu_update_ms,pcie_mb_d2h,pcie_mb_h2d
# (MB = 1e6 bytes; scripts/plot_step_time.py draws it). The table adds tok/s, stall %, the
# GPU's optimizer state, PCIe per step against spec section 7's formula, and zenflow's
# speed-up over offload.
#
# Models are written once into $OUT/models by dev/bench_model.cpp: GPT-2's init recipe,
# uniform instead of normal (same standard deviation) and in parallel, so seconds instead of
# the trainer's minute for d48; the speed of a step does not depend on the weights. Data:
# tinyshakespeare if data/tinyshakespeare/*.bin exist, else a synthetic shard of random
# tokens (no network needed). Host memory: offload and zenflow on d48 allocate 40-50 GB of
# CPU-side state (master, moments, accumulators, staging, migration; some of it pinned; the
# [memory] lines say how much); a run that needs more than Linux's MemAvailable stops at start
# and says so, and is then tried once more with ZF_HOST_MEMORY_MB (some virtual machines
# grow their memory as it is used: MemAvailable is far below what they can have); the table
# names such runs and gives the host memory at start and at the end.
set -u
CALLER=$PWD  # paths on the command line are relative to where the script was started
in_caller() { case $1 in /*) echo "$1" ;; *) echo "$CALLER/$1" ;; esac; }
cd "$(dirname "$0")/.." || exit 2
export ZF_REQUIRE_PINNED=1  # a benchmark run whose copies could not be pinned overlaps nothing: it stops
ARGS="$*"

BIN=./train_gpt2cu
OUT=build/bench_zenflow
MODELS="d12 d24 d36 d48"
MODES="adamw offload offload-whole zenflow-cpu zenflow-cpu-whole zenflow-gpu zenflow-auto"
WARMUP=4
STEPS=24
BUDGET=0
NO_GPU_CHECK=0
B=4
T=1024
U=4
K=0.1

# the trainer's flags of each mode the table can hold (--modes)
mode_flags() {
    case $1 in
        adamw) echo "-zo adamw" ;;
        offload) echo "-zo offload" ;;
        offload-whole) echo "-zo offload -zp 0" ;;
        zenflow-cpu) echo "-zo zenflow -zk $K -zu $U -za cpu" ;;
        zenflow-cpu-whole) echo "-zo zenflow -zk $K -zu $U -za cpu -zp 0" ;;
        zenflow-gpu) echo "-zo zenflow -zk $K -zu $U -za gpu" ;;
        zenflow-auto) echo "-zo zenflow -zk $K -zu auto -za gpu" ;;
        *) echo "bench_zenflow.sh: unknown mode $1" >&2; exit 2 ;;
    esac
}

while [ $# -gt 0 ]; do
    case $1 in
        --quick) MODELS="d48 d12"; MODES="adamw offload zenflow-gpu zenflow-cpu"; STEPS=8; shift ;;
        --modes) MODES=$2; shift 2 ;;
        --bin) BIN=$(in_caller "$2"); shift 2 ;;
        --out) OUT=$(in_caller "$2"); shift 2 ;;
        --budget) BUDGET=$2; shift 2 ;;
        --models) MODELS=$2; shift 2 ;;
        --warmup) WARMUP=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --batch) B=$2; shift 2 ;;
        --seq) T=$2; shift 2 ;;
        --no-gpu-check) NO_GPU_CHECK=1; shift ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;  # the comment on top
        *) echo "bench_zenflow.sh: unknown argument $1 (hint: --help)" >&2; exit 2 ;;
    esac
done
for mode in $MODES; do mode_flags "$mode" >/dev/null || exit 2; done  # a typo stops here, before any run
START=$(date +%s)
mkdir -p "$OUT/models" "$OUT/logs" || exit 2
if [ ! -x "$BIN" ]; then
    echo "bench_zenflow.sh: $BIN not found (hint: make train_gpt2cu, or --bin PATH)" >&2
    exit 2
fi
if [ $NO_GPU_CHECK -eq 0 ] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "bench_zenflow.sh: SKIPPED (no GPU: nvidia-smi finds none)"
    exit 0
fi
CXX=${CXX:-g++}
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
DEVICE=${DEVICE:-unknown GPU}

# ----------------------------------------------------------------------------
# data and models

TRAIN=data/tinyshakespeare/tiny_shakespeare_train.bin
VAL=data/tinyshakespeare/tiny_shakespeare_val.bin
DATA_NOTE=tinyshakespeare
if [ ! -f "$TRAIN" ] || [ ! -f "$VAL" ]; then
    TRAIN="$OUT/synthetic_train.bin"
    VAL="$OUT/synthetic_val.bin"
    DATA_NOTE="synthetic random tokens"
    if [ ! -f "$TRAIN" ] || [ ! -f "$VAL" ]; then
        if ! { $CXX -O2 -std=c++17 dev/synthetic_shard.cpp -o "$OUT/synthetic_shard" \
               && "$OUT/synthetic_shard" "$TRAIN" 400000 1 && "$OUT/synthetic_shard" "$VAL" 40000 2; }; then
            echo "bench_zenflow.sh: could not write synthetic data" >&2
            exit 1
        fi
    fi
fi

if ! $CXX -O2 -std=c++17 -fopenmp -I. dev/bench_model.cpp -o "$OUT/bench_model" 2>"$OUT/logs/bench_model_build.log"; then
    echo "bench_zenflow.sh: could not build the model writer (see $OUT/logs/bench_model_build.log)" >&2
    exit 1
fi

# ----------------------------------------------------------------------------
# runs

out_of_time() { [ "$BUDGET" -gt 0 ] && [ $(( $(date +%s) - START )) -gt "$BUDGET" ]; }

# one line per run: model mode ms compute stall cpu d2h h2d (ms and MB per step) opt_bytes M n
# d2h_bytes h2d_bytes (the n measured steps' totals), or model mode SKIPPED/FAILED note
RESULTS="$OUT/results.txt"
: >"$RESULTS"
LIFTED=""  # model/mode of the runs retried past the host-memory check

mem_available_mib() { awk '/^MemAvailable:/ { printf "%d", $2 / 1024 }' /proc/meminfo 2>/dev/null; }
MEM_AT_START="MemTotal $(awk '/^MemTotal:/ { printf "%d", $2 / 1024 }' /proc/meminfo 2>/dev/null) MiB, MemAvailable $(mem_available_mib) MiB"

# run_trainer MODEL_FILE MODE CSV LOG
# -zs 0: zenflow selects once, at its first step (one of the --warmup steps, not measured),
# and never reselects, so it needs no migration buffers (zenflow.h would write 11 GB of them
# at start on d48); what a reselection costs is measured apart (docs/results/README.md, item 11)
run_trainer() {
    # shellcheck disable=SC2046
    timeout --kill-after=10 600 "$BIN" -e "$1" -i "$TRAIN" -j "$VAL" -b $B -t $T -x $((WARMUP + STEPS)) \
        -v 0 -s 0 -zs 0 $(mode_flags "$2") -zm "$3" >"$4" 2>&1
}

# ----------------------------------------------------------------------------
# the table, rewritten before every run, so that a run killed at the time limit leaves the
# table of every run before it

CSV="$OUT/bench_zenflow.csv"
MD="$OUT/bench_zenflow.md"
write_table() {
    echo "device,model,mode,ms_per_step,compute_ms,stall_ms,cpu_update_ms,pcie_mb_d2h,pcie_mb_h2d" >"$CSV"
    awk -v dev="$DEVICE" '$3 != "SKIPPED" && $3 != "FAILED" {
        printf "%s,%s,%s,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", dev, $1, $2, $3, $4, $5, $6, $7, $8 }' "$RESULTS" >>"$CSV"

    {
        echo "# ZenFlow benchmark: $DEVICE"
        echo
        echo "GPT-2 at B=$B, T=$T, TF32 on; zenflow: k=$K, U=$U, overlap on; $STEPS measured steps after $WARMUP;"
        echo "data: $DATA_NOTE; $(date -u '+%Y-%m-%d %H:%M UTC'); command: bash scripts/bench_zenflow.sh $ARGS"
        echo
        echo "PCIe formula (spec 7), M = matrix elements: offload 2 x 4M, zenflow-cpu (1-k) 4M (1 + 1/U),"
        echo "zenflow-gpu 2 (1-k) 4M / U bytes per step; 'vs formula' = measured / formula."
        echo "opt state = GPU memory for AdamW moments; vs adamw = this mode's ms / adamw's ms;"
        echo "speed-up = offload ms / this mode's ms (targets: zenflow <= 1.10x adamw, >= 3x offload at d48)."
        echo
        printf '| %-5s | %-17s | %9s | %8s | %8s | %7s | %8s | %9s | %9s | %10s | %12s | %8s | %8s |\n' \
            model mode "ms/step" "tok/s" "stall ms" "stall %" "CPU ms" "D2H MB" "H2D MB" "vs formula" "opt state" \
            "vs adamw" speed-up
        printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' -------  ------------------- ----------- ---------- ---------- \
            --------- ---------- ----------- ----------- ------------ -------------- ---------- ----------
        awk -v B=$B -v T=$T -v k=$K -v U=$U '
            {
                line[NR] = $0
                if ($3 != "SKIPPED" && $3 != "FAILED") {
                    if ($2 == "offload") off[$1] = $3
                    if ($2 == "adamw") base[$1] = $3
                }
            }
            END {
                for (i = 1; i <= NR; i++) {
                    split(line[i], f, " ")
                    model = f[1]; mode = f[2]
                    if (f[3] == "SKIPPED" || f[3] == "FAILED") {
                        printf "| %-5s | %-17s | %s %s\n", model, mode, f[3], f[4]; continue
                    }
                    ms = f[3]; stall = f[5]; cpu = f[6]; d2h = f[7]; h2d = f[8]; opt = f[9] / 1048576; M = f[10]
                    bytes = 4.0 * M
                    kind = mode; sub(/-whole$/, "", kind)  # -zp 0 moves the same bytes
                    if (kind == "offload") formula = 2 * bytes
                    else if (kind == "zenflow-cpu") formula = (1 - k) * bytes * (1 + 1.0 / U)
                    else if (kind == "zenflow-gpu") formula = 2 * (1 - k) * bytes / U
                    else formula = 0
                    vs = formula > 0 ? sprintf("%.3f", (d2h + h2d) * 1e6 / formula) : "-"
                    sp = (model in off && mode != "offload" && mode != "adamw") ? sprintf("%.2fx", off[model] / ms) : "-"
                    va = (model in base && mode != "adamw") ? sprintf("%.2fx", ms / base[model]) : "-"
                    printf "| %-5s | %-17s | %9.1f | %8.0f | %8.1f | %6.1f%% | %8.1f | %9.1f | %9.1f | %10s | %8.0f MiB | %8s | %8s |\n",
                           model, mode, ms, B * T / (ms / 1e3), stall, 100 * stall / ms, cpu, d2h, h2d, vs, opt, va, sp
                }
            }' "$RESULTS"
        echo
        echo "host memory at start: $MEM_AT_START; at the end: MemAvailable $(mem_available_mib) MiB"
        if [ -n "$LIFTED" ]; then
            echo "retried past the host-memory check (each needed more than MemAvailable; the first try's log"
            echo "is <model>_<mode>_refused.log):$LIFTED"
        fi
        echo "total time: $(( $(date +%s) - START )) s; logs and per-step CSVs in $OUT/logs"
    } >"$MD"
}

for model in $MODELS; do
    mfile="$OUT/models/$model.bin"
    if [ ! -s "$mfile" ]; then
        if out_of_time; then
            for mode in $MODES; do echo "$model $mode SKIPPED out-of-time" >>"$RESULTS"; done
            continue
        fi
        echo "writing $mfile"
        if ! "$OUT/bench_model" "$model" "$mfile"; then
            for mode in $MODES; do echo "$model $mode FAILED model-file" >>"$RESULTS"; done
            continue
        fi
    fi
    for mode in $MODES; do
        if out_of_time; then
            echo "$model $mode SKIPPED out-of-time" >>"$RESULTS"
            continue
        fi
        log="$OUT/logs/${model}_$mode.log"
        csv="$OUT/logs/${model}_$mode.csv"
        write_table
        echo "run $model $mode ($(( $(date +%s) - START ))s)"
        run_trainer "$mfile" "$mode" "$csv" "$log"
        rc=$?
        # The trainer stops at start when its CPU side needs more than Linux's MemAvailable.
        # A virtual machine whose memory grows as it is used reports far less than it can
        # have, so the run is tried once more, told that the memory it needs is there
        # (ZF_HOST_MEMORY_MB); if it really is not, the kernel ends the run and the row says so.
        need=""
        [ $rc -ne 0 ] && need=$(sed -n 's/.*needs \([0-9.]*\) MiB of host memory and .*/\1/p' "$log" | head -1)
        if [ -n "$need" ]; then
            mv "$log" "${log%.log}_refused.log"
            echo "  refused: $(tail -1 "${log%.log}_refused.log" | cut -c1-160)..."
            echo "  again with ZF_HOST_MEMORY_MB"
            ZF_HOST_MEMORY_MB=$(awk -v n="$need" 'BEGIN { printf "%d", n + 1 }') run_trainer "$mfile" "$mode" "$csv" "$log"
            rc=$?
            LIFTED="$LIFTED $model/$mode"
        fi
        if [ $rc -ne 0 ]; then
            echo "$model $mode FAILED exit-$rc:$(tail -1 "$log" | tr ' ' '_' | cut -c1-120)" >>"$RESULTS"
            continue
        fi
        # averages over the measured steps, and their byte totals; the optimizer state and M from the log
        opt_bytes=$(sed -n 's/^\[memory\] GPU moments (m, v) .*(\([0-9]*\) bytes)$/\1/p' "$log" | head -1)
        M=$(sed -n 's/^\[optimizer\] matrix elements M = \([0-9]*\):.*/\1/p' "$log" | head -1)
        awk -F, -v w="$WARMUP" -v model="$model" -v mode="$mode" -v opt="${opt_bytes:-nan}" -v M="${M:-0}" '
            NR > 1 && $1 > w { n++; ms += $3; comp += $5; stall += $6; cpu += $7; d2h += $8; h2d += $9 }
            END {
                if (n == 0) { print model, mode, "FAILED no-measured-steps"; exit }
                printf "%s %s %.3f %.3f %.3f %.3f %.3f %.3f %s %s %d %.0f %.0f\n", model, mode, ms / n, comp / n,
                       stall / n, cpu / n, d2h / n / 1e6, h2d / n / 1e6, opt, M, n, d2h, h2d
            }' "$csv" >>"$RESULTS"
    done
done

write_table
cat "$MD"
echo "wrote $CSV and $MD"
grep -q " FAILED " "$RESULTS" && exit 1
exit 0
