#!/usr/bin/env bash
# The one script a GPU machine (an H200) runs for the CUDA trainer and ZenFlow on the GPU,
# in one command of at most 10 minutes:
#
#   bash dev/gpu_check.sh <logdir> [--out <dir>] [--only "<stages>"] [--host-memory-gib <GiB>]
#   bash dev/gpu_check.sh --plan     the stages with their time limits, and what must travel
#   bash dev/gpu_check.sh --ready    the same, and it fails unless everything that must travel
#                                    is there (the files the stages read: READY_FILES, llm.c at
#                                    its pinned commit) and build/gpu_refs was packed from this tree
#
# The stages run in this order, each cut short at its time limit (every command in it gets
# at most what is left of it), so a run takes at most the sum of the limits. What only a GPU
# can tell and what the README needs comes first:
#   build      train_gpt2cu, test_gpt2cu and dev/cuda for sm_90, llm.c's fp32 trainer (from
#              build/llmc_ref) and the CPU side, in parallel, into build/gpu_check; meanwhile
#              the 50 MB `vocab` reference case is made here with PyTorch (build/gpu_refs
#              brings only its train.bin)
#   tests      test_gpt2cu on every reference case (TF32 off, strict fp32 tolerances,
#              determinism; ZenFlow in every mode and both accumulations against the
#              reference, its exact invariants)
#   llmc       ours against llm.c's fp32 trainer, side by side: scripts/bench_llmc.sh (d12,
#              B = 4 and 16, T = 1024; SKIPPED without build/llmc_ref)
#   zenflow    scripts/bench_zenflow.sh --quick: adamw, offload and zenflow with both
#              accumulations at d48 and d12: ms/step, stall, PCIe bytes, optimizer memory
#   timeline   the d12 timelines of offload and zenflow (-tr, steps 4..7), for the teaching pictures
#   devcuda    every dev/cuda program: the kernels against their CPU references, then timings
#   sanitizer  compute-sanitizer memcheck and racecheck over test_gpt2cu on the ZenFlow case
#              zf_a, the first launches of this project's kernels only (SKIPPED where the tool
#              or the device support is missing)
#   host       the host's CPU side: scripts/bench_cpu_adam.py, one ZenFlow window's CPU work on
#              these cores, and so the shortest GPU step at which the CPU keeps up
#   resume     dev/test/test_resume.py (checkpoints, resume, SIGKILLs) and dev/test/test_eval.py
#              (val loss and samples against PyTorch) on train_gpt2cu
# and two stages that run only when --only names them (a second run):
#   d12        GPT-2 124M alone (random init, -zo adamw, T = 1024): B = 4 and 16 with TF32,
#              B = 4 in fp32, 12 steps each
#   random     dev/test/test_random_cases.py: 12 model shapes and ZenFlow settings drawn at
#              random (C 4..48, odd ones too, T down to 1: shapes no fixed case gives
#              cuBLASLt), their references made here with PyTorch
# The limits are STAGE_TABLE's below. --plan prints them and fails if they add up to more
# than PLAN_TOTAL_S (540 s: a command may run 600) or the benchmarks could end after
# PLAN_BENCH_S (300 s), and it adds up what travels to the GPU machine (CARRY, below; the
# device tool takes the working tree and at most 8 such paths, 64 MiB in all).
#
# The build needs xxhash.h (Debian's libxxhash-dev, header-only: the checkpoints' checksums);
# `make gpu_refs` copies it into build/gpu_refs/include, which this script puts on CPATH (g++,
# and so nvcc's host compiler, read it) where the machine has none.
#
# --out: also write into <dir> the files a remote run must bring back: progress.md, each
# row as it is recorded and each benchmark table as its stage ends, and gpu_check_logs.tar.gz
# (every log of <logdir>), made again as each stage begins (both are there even if the command
# is killed), then summary.md.
# On a GPU machine:
#   bash dev/gpu_check.sh /tmp/gpu_check --out $OUT --host-memory-gib 128
# --only: run just these stages after the builds, e.g. --only "sanitizer timeline" (a second
# run for what the first left out or cut short), or --only "d12 random".
# --host-memory-gib: the host memory the machine is stated to have. Some virtual machines
# grow their memory as it is used, and MemAvailable reads far below what they can have;
# where it is under 3/4 of the stated size, the script sets ZF_HOST_MEMORY_MB to the stated
# size less what is in use now, for every run (the trainer's host-memory check reads it).
#
# Reference cases: dev/test/ref/*/state.bin (and the ZenFlow cases dev/test/ref/zf_*/zenflow.txt);
# on a GPU machine they come as build/gpu_refs, from `make gpu_refs`; with none at all, the
# tests stage tries dev/test/make_refs.sh (needs a python with torch).
# Benchmarks run on tinyshakespeare if data/tinyshakespeare/*.bin exist, else on a synthetic
# shard of random tokens written here (no network needed).
# The d12 rows' numbers (bench_llmc.sh and bench_zenflow.sh say how they average theirs):
# ms/step = median of steps 3..12 (steps 1-2 are warm-up: cuBLASLt
# heuristics, first touches); tok/s = B*T / that; achieved TFLOP/s = flops per step / that,
#   flops per step = 6 * N * B*T  +  12 * L * C * T * B*T
# with N = all parameters (the usual 6N: 2N forward, 4N backward) and the attention matmuls
# (q.k and att.v, 2*T*C flops each per token and layer forward, x3 for the backward), full
# T x T since the kernels compute the masked half too.
# Prints a summary table LAST (also $LOGDIR/summary.md); every log is under <logdir>.
# Exit status: 0 if no stage FAILed.
set -u
[ -f /usr/include/xxhash.h ] || export CPATH="$(cd "$(dirname "$0")/.." && pwd)/build/gpu_refs/include${CPATH:+:$CPATH}"

# name, time limit in seconds, what it runs: the order in which the stages run. d12 and
# random only with --only. (A GPU machine's times; the guesses behind them: build 10-12 s of
# nvcc per program on a 2-core host, all at once on 16 cores there; tests ~10 s; llmc 4 trainer runs of 5-10 s
# and a model file; zenflow 8 runs, d48's with 40 GB of host memory to allocate and pin.)
STAGE_TABLE="
build      50  the builds, in parallel, and the vocab case made with PyTorch
tests      40  test_gpt2cu on every reference case
llmc       60  the d12 table: ours against llm.c's fp32 trainer, B = 4 and 16
zenflow   140  adamw, offload, zenflow at d48 and d12: stall, PCIe bytes
timeline   30  d12 traces of offload and zenflow
devcuda    50  every dev/cuda program: validation, then timings
sanitizer  90  compute-sanitizer memcheck, then racecheck, on the ZenFlow case zf_a
host       30  the host's CPU side (bench_cpu_adam.py)
resume     50  checkpoints, SIGKILLs and eval on train_gpt2cu
d12        45  (only with --only) d12 alone: B = 4, 16 TF32, B = 4 fp32
random    120  (only with --only) 12 random shapes and ZenFlow settings
"
PLAN_TOTAL_S=540
PLAN_BENCH_S=300
BENCH_STAGES="llmc zenflow"
EXTRA_STAGES="d12 random"
# what must travel to the GPU machine besides the working tree (git-ignored, so never copied
# by default): the device tool's `carry` list, made by docs/results/README.md's preparation
CARRY="build/gpu_refs build/llmc_ref data"
CARRY_MAX_MIB=64

stage_names() { awk 'NF { print $1 }' <<<"$STAGE_TABLE"; }
stage_limit() { awk -v s="$1" '$1 == s { print $2 }' <<<"$STAGE_TABLE"; }
is_extra() { [[ " $EXTRA_STAGES " == *" $1 "* ]]; }
ALL_STAGES=$(stage_names | tr '\n' ' ')
usage() {  # usage [STATUS]: 2 (the default) to stderr, 0 (-h) to stdout
    local status=${1:-2}
    { echo "usage: $0 <logdir> [--out <dir>] [--only \"<stages>\"] [--host-memory-gib <GiB>]   or   $0 --plan|--ready"
      echo "  stages: $ALL_STAGES"
    } >&$(( status == 0 ? 1 : 2 ))
    exit "$status"
}

# --plan: every stage with its limit and the time by which it has ended at the latest, then
# the size of what travels; exit status 1 if the limits break PLAN_TOTAL_S or PLAN_BENCH_S,
# or what travels is over CARRY_MAX_MIB. --ready (plan --ready): also if a carry path is
# missing, or build/gpu_refs/COMMIT is not this tree's (the summary names that commit)
plan() {
    local t=0 bench_end=0 bad=0 name limit what ready=0
    [ "$1" = --ready ] && ready=1
    echo "gpu_check.sh --plan: the stages in the order they run, each cut short at its limit"
    printf '  %-10s %6s %9s  %s\n' stage limit "ends by" what
    while read -r name limit what; do
        [ -n "$name" ] || continue
        if is_extra "$name"; then
            printf '  %-10s %4s s %9s  %s\n' "$name" "$limit" "" "$what"
            continue
        fi
        t=$(( t + limit ))
        [[ " $BENCH_STAGES " == *" $name "* ]] && bench_end=$t
        printf '  %-10s %4s s %7s s  %s\n' "$name" "$limit" "$t" "$what"
    done <<<"$STAGE_TABLE"
    echo "  a run: at most $t s (limit $PLAN_TOTAL_S); the benchmarks ($BENCH_STAGES) end by $bench_end s (limit $PLAN_BENCH_S)"
    [ $t -le $PLAN_TOTAL_S ] || { echo "gpu_check.sh --plan: FAIL: the stages add up to more than $PLAN_TOTAL_S s"; bad=1; }
    [ $bench_end -le $PLAN_BENCH_S ] || { echo "gpu_check.sh --plan: FAIL: the benchmarks may end after $PLAN_BENCH_S s"; bad=1; }
    # what travels: the working tree (tracked files, and untracked ones git does not ignore)
    # and the carry list (docs/results/README.md makes it)
    local line total=0 bytes p
    bytes=$(git ls-files -z --cached --others --exclude-standard 2>/dev/null | xargs -0 -r stat -c %s -- 2>/dev/null \
            | awk '{ s += $1 } END { print s + 0 }')
    total=$bytes
    line="the working tree $(mib "$bytes")"
    for p in $CARRY; do
        if [ -e "$p" ]; then
            bytes=$(du -sb "$p" | cut -f1)
            total=$(( total + bytes ))
            line="$line, $p $(mib "$bytes")"
        else
            line="$line, $p MISSING (docs/results/README.md: the preparation)"
            [ $ready = 0 ] || bad=1
        fi
    done
    echo "  travels (carry: $CARRY): $line; $(mib "$total") of $CARRY_MAX_MIB MiB"
    [ "$total" -le $(( CARRY_MAX_MIB << 20 )) ] || { echo "gpu_check.sh --plan: FAIL: more than $CARRY_MAX_MIB MiB would travel"; bad=1; }
    if [ $ready = 1 ]; then
        ready_files || bad=1
        ready_commit || bad=1
        [ $bad -ne 0 ] || echo "gpu_check.sh --ready: ready to travel"
    fi
    return $bad
}
# the files in the carry paths that the stages read (a folder that is there but empty passes
# the size check), and build/llmc_ref at the commit scripts/get_llmc.sh pins
READY_FILES="build/gpu_refs/tiny/state.bin build/gpu_refs/zf_a/zenflow.txt build/gpu_refs/vocab/train.bin
build/llmc_ref/train_gpt2_fp32.cu build/llmc_ref/COMMIT data/tinyshakespeare/tiny_shakespeare_train.bin
data/tinyshakespeare/tiny_shakespeare_val.bin"
ready_files() {
    local f bad=0 pinned missing=""
    for f in $READY_FILES; do
        [ -s "$f" ] || missing="$missing $f"
    done
    if [ -n "$missing" ]; then
        echo "gpu_check.sh --ready: FAIL: missing or empty:$missing (docs/results/README.md: the preparation)"
        bad=1
    fi
    pinned=$(sed -n 's/^COMMIT=\([0-9a-f]*\).*/\1/p' scripts/get_llmc.sh)
    if [ -s build/llmc_ref/COMMIT ] && [ "$(cat build/llmc_ref/COMMIT)" != "$pinned" ]; then
        echo "gpu_check.sh --ready: FAIL: build/llmc_ref is llm.c at $(cut -c1-7 build/llmc_ref/COMMIT), not the pinned ${pinned:0:7} (hint: bash scripts/get_llmc.sh)"
        bad=1
    fi
    return $bad
}
# build/gpu_refs/COMMIT (make gpu_refs) against the tree as it is now
ready_commit() {
    local packed now
    packed=$(cat build/gpu_refs/COMMIT 2>/dev/null) || { echo "gpu_check.sh --ready: FAIL: no build/gpu_refs (hint: make gpu_refs)"; return 1; }
    now=$(git describe --always --dirty --abbrev=7 2>/dev/null) || now="unknown (no git)"
    [ "$packed" = "$now" ] && [[ "$now" != *-dirty ]] && return 0
    echo "gpu_check.sh --ready: FAIL: build/gpu_refs was packed from $packed, the tree is $now (hint: commit, then make gpu_refs)"
    return 1
}
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

[ $# -ge 1 ] || usage
[ "$1" = -h ] || [ "$1" = --help ] && usage 0
if [ "$1" = --plan ] || [ "$1" = --ready ]; then
    [ $# -eq 1 ] || usage
    cd "$(dirname "$0")/.." || exit 2
    plan "$1"
    exit $?
fi
PACK_DIR=""
ONLY=""
HOST_MEMORY_GIB=""
LOGDIR_ARG=$1
[[ $LOGDIR_ARG != -* ]] || usage  # an option where the log folder goes
shift
while [ $# -gt 0 ]; do
    case $1 in
        --out) [ $# -ge 2 ] || usage; mkdir -p "$2" || exit 2; PACK_DIR=$(cd "$2" && pwd); shift 2 ;;
        --only) [ $# -ge 2 ] || usage; ONLY=$2; shift 2 ;;
        --host-memory-gib) [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] || usage; HOST_MEMORY_GIB=$2; shift 2 ;;
        *) usage ;;
    esac
done
for stage in $ONLY; do
    [[ " $ALL_STAGES " == *" $stage "* ]] || { echo "gpu_check.sh: --only: no stage '$stage'" >&2; usage; }
done
mkdir -p "$LOGDIR_ARG" || exit 2
LOGDIR=$(cd "$LOGDIR_ARG" && pwd)
if [ -n "$PACK_DIR" ] && [[ "$LOGDIR/" == "$PACK_DIR"/* ]]; then
    echo "gpu_check.sh: <logdir> must not lie inside the --out directory (its logs would come back file by file)" >&2
    exit 2
fi
cd "$(dirname "$0")/.." || exit 2
START=$(date +%s)
# Only machines slower than a GPU machine set GPU_CHECK_SLOWDOWN=<n>, every limit n times
# longer: the CPU emulator's rehearsal and make test's dry run on a small CI host (there
# every stage must run or say SKIPPED, whatever it takes; those times mean nothing)
SLOWDOWN=${GPU_CHECK_SLOWDOWN:-1}
TOTAL_S=$(( PLAN_TOTAL_S * SLOWDOWN ))

NVCC=${NVCC:-nvcc}
if ! command -v "$NVCC" >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
# a GPU that nvidia-smi lists: a program that then finds "no CUDA device" failed (a driver
# older than the CUDA runtime, say), and its row says FAIL, not SKIPPED
HAS_GPU=0
timeout 10 nvidia-smi -L >/dev/null 2>&1 && HAS_GPU=1
ARCH="-gencode arch=compute_90,code=sm_90"
# -fmad=false / -ffp-contract=off: no fused multiply-add (AdamW is spec 3.1 to the bit);
# never --use_fast_math
NVCCFLAGS="-O3 -std=c++17 -fmad=false -prec-div=true -prec-sqrt=true $ARCH -Xcompiler -Wall -Xcompiler -ffp-contract=off -Xcompiler -fopenmp"
LIBS="-lcublasLt -lgomp -lpthread"
CXX=${CXX:-g++}
BUILD=${GPU_CHECK_BUILD:-build/gpu_check}  # dev/cuda/emu/rehearse_gpu_check.sh points this elsewhere
mkdir -p "$BUILD"
# the dev/cuda programs that need a GPU, in the order they run (zenflow_async is CPU only:
# make test runs it). matmul early: cuBLASLt's TF32 determinism is checked only there, and its
# CPU references (about 4e9 multiply-adds) make it the slowest, so that last it would be the
# one a stage running out of time cuts short
DEV_CUDA="copy_engines zenflow matmul encoder layernorm attention gelu residual classifier adamw"

# ----------------------------------------------------------------------------
# the summary table: one row per check; progress.md gets each row as it is recorded

ROW_NAMES=()
ROW_STATUS=()
ROW_NOTES=()
PROGRESS=("$LOGDIR/progress.md")
[ -n "$PACK_DIR" ] && PROGRESS+=("$PACK_DIR/progress.md")
: | tee "${PROGRESS[@]}"
progress() {  # progress LINE...: to stdout and every progress file, at once
    printf '%s\n' "$@" | tee -a "${PROGRESS[@]}"
}
progress_file() {  # progress_file FILE: a table, into the progress files
    [ -s "$1" ] || return 0
    { echo; cat "$1"; echo; } | tee -a "${PROGRESS[@]}" >/dev/null
}
record() {  # record NAME STATUS NOTE
    ROW_NAMES+=("$1")
    ROW_STATUS+=("$2")
    ROW_NOTES+=("$3")
    progress "$(printf '[%4ds] %-28s %-8s %s' "$(( $(date +%s) - START ))" "$1" "$2" "$3")"
}

in_only() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }  # in_only STAGE: not left out by --only
chosen() {  # chosen STAGE: the stage runs in this run (the builds always; extra stages only when --only names them)
    if [ "$1" = build ]; then return 0; fi
    if is_extra "$1"; then [[ " $ONLY " == *" $1 "* ]]; else in_only "$1"; fi
}

# --out: every log so far in one archive, made again as each stage begins, so that a command
# killed during a stage still brings back the logs of the stages before it. A log over 4 MiB (a
# sanitizer reporting every access, say) keeps its first and last MiB, so the archive stays far
# below the 16 MiB a remote run brings back per file
pack_logs() {
    [ -n "$PACK_DIR" ] || return 0
    local staging
    staging=$(mktemp -d)
    cp -r "$LOGDIR" "$staging/gpu_check"
    find "$staging/gpu_check" -type f -size +4M -print0 | while IFS= read -r -d '' f; do
        { head -c 1048576 "$f"
          printf '\n[... gpu_check.sh cut this log of %s bytes to its first and last MiB ...]\n' "$(stat -c %s "$f")"
          tail -c 1048576 "$f"; } >"$f.cut" && mv "$f.cut" "$f"
    done
    # the last archive stays whole until the new one is
    if tar czf "$PACK_DIR/gpu_check_logs.part" -C "$staging" gpu_check; then
        mv -f "$PACK_DIR/gpu_check_logs.part" "$PACK_DIR/gpu_check_logs.tar.gz"
    else
        echo "gpu_check.sh: could not write $PACK_DIR/gpu_check_logs.tar.gz" >&2
    fi
    rm -rf "$staging"
}

# STAGE_END: the time by which the stage running now must have ended. begin_stage NAME starts
# it (its limit, cut to what is left of the run's); then every row of it asks skip_stage
STAGE_END=0
begin_stage() {
    local now limit
    now=$(date +%s)
    STAGE_END=$now
    chosen "$1" || return 0
    pack_logs
    # make test's dry run: the command is killed here, as the device tool would at its limit
    [ "${GPU_CHECK_KILL_AT:-}" != "$1" ] || kill -KILL $$
    now=$(date +%s)  # (the packing's time counts)
    limit=$(( $(stage_limit "$1") * SLOWDOWN ))
    [ $limit -gt $(( TOTAL_S - (now - START) )) ] && limit=$(( TOTAL_S - (now - START) ))
    if [ $limit -le 0 ]; then
        progress "== stage $1: the run's time is used up"
        return 0
    fi
    STAGE_END=$(( now + limit ))
    progress "== stage $1 (at $(( now - START )) s, limit $limit s)"
}
stage_left() { echo $(( STAGE_END - $(date +%s) )); }  # seconds left to the stage
# skip_stage STAGE ROW: records ROW as SKIPPED, and succeeds, when STAGE does not run: --only
# leaves it out (an extra stage not asked for leaves no row), or its time is used up
skip_stage() {
    if ! chosen "$1"; then
        is_extra "$1" || record "$2" SKIPPED "not in --only"
    elif [ "$(stage_left)" -le 0 ]; then
        record "$2" SKIPPED "out of time (stage $1's limit)"
    else
        return 1
    fi
}
# record_run ROW LOG RC: ROW from a program's log and exit status: SKIPPED when its last line
# says so (no device) and nvidia-smi lists no GPU, FAIL when it lists one (CUDA could not use
# it: a driver older than the toolkit, say), else PASS or FAIL by the status, with that last line
record_run() {
    local last
    last=$(tail -1 "$2")
    if grep -q "SKIPPED" <<<"$last" && [ "$HAS_GPU" -eq 0 ]; then
        record "$1" SKIPPED "$last"
    elif grep -q "SKIPPED" <<<"$last"; then
        record "$1" FAIL "$last (but nvidia-smi lists a GPU)"
    else
        record "$1" "$(status_word "$3")" "$last $(timeout_note "$3")"
    fi
}
# no_trainer ROW: records ROW as SKIPPED, and succeeds, when train_gpt2cu did not build
no_trainer() {
    [ $rc_train -ne 0 ] || return 1
    record "$1" SKIPPED "build failed"
}

# run_logged LOG TIMEOUT CMD...: runs with a timeout (TIMEOUT times the slowdown, cut to what
# is left of the stage), all output to LOG; returns the status, 124 when the time ran out.
# Then the command and every process below it end: the benchmark scripts run each trainer
# under a `timeout` of their own, in a process group of its own, which a plain `timeout` of
# the script would leave running into the next stage. The tests' timeouts are several times
# what they should need on a GPU (test_gpt2cu: the CPU trainer's tests of the same cases take
# 4 s on 2 cores; a dev/cuda program: seconds), so a hang costs a GPU machine's few minutes little
run_logged() {
    local log=$1 limit=$(( $2 * SLOWDOWN ))
    shift 2
    local left pid deadline
    left=$(stage_left)
    [ "$limit" -gt "$left" ] && limit=$(( left > 1 ? left : 1 ))
    deadline=$(( $(date +%s) + limit ))
    "$@" >"$log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$(date +%s)" -ge $deadline ]; then
            end_tree "$pid"
            printf '\ngpu_check.sh: cut short after %s s\n' "$limit" >>"$log"
            return 124
        fi
        sleep 0.2
    done
    wait "$pid"
}
descendants() {  # descendants PID: every process below PID
    local p
    for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        echo "$p"
        descendants "$p"
    done
}
end_tree() {  # end_tree PID: TERM to PID and everything below it, KILL 5 s later
    local all
    all="$1 $(descendants "$1")"
    # shellcheck disable=SC2086
    kill -TERM $all 2>/dev/null
    sleep 5
    # shellcheck disable=SC2086
    kill -KILL $all 2>/dev/null
    wait "$1" 2>/dev/null
}

status_word() {  # 0 -> PASS, else FAIL
    case $1 in
        0) echo PASS ;;
        *) echo FAIL ;;
    esac
}

timeout_note() {  # a note for a status
    case $1 in
        124|137) echo "timed out" ;;
        0) echo "" ;;
        *) echo "exit $1" ;;
    esac
}

mem_mib() { awk -v k="$1:" '$1 == k { printf "%d", $2 / 1024 }' /proc/meminfo 2>/dev/null; }  # mem_mib MemTotal

# ----------------------------------------------------------------------------
# the machine

# host memory: a machine whose memory grows as it is used reads far less than it has
MEM_TOTAL=$(mem_mib MemTotal)
MEM_AVAILABLE=$(mem_mib MemAvailable)
HOST_MEMORY_NOTE="MemTotal ${MEM_TOTAL:-?} MiB, MemAvailable ${MEM_AVAILABLE:-?} MiB"
if [ -n "$HOST_MEMORY_GIB" ] && [ -n "$MEM_AVAILABLE" ] && [ -n "$MEM_TOTAL" ]; then
    stated=$(( HOST_MEMORY_GIB * 1024 ))
    if [ $(( MEM_AVAILABLE * 4 )) -lt $(( stated * 3 )) ]; then
        export ZF_HOST_MEMORY_MB=$(( stated - (MEM_TOTAL - MEM_AVAILABLE) ))
        HOST_MEMORY_NOTE="$HOST_MEMORY_NOTE, under 3/4 of the stated $HOST_MEMORY_GIB GiB: ZF_HOST_MEMORY_MB=$ZF_HOST_MEMORY_MB for every run"
    else
        HOST_MEMORY_NOTE="$HOST_MEMORY_NOTE (stated: $HOST_MEMORY_GIB GiB; no override)"
    fi
fi
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    if commit=$(git rev-parse --short HEAD 2>/dev/null); then
        git diff --quiet HEAD 2>/dev/null || commit="$commit (+ uncommitted changes)"
    elif [ -f build/gpu_refs/COMMIT ]; then  # a GPU machine gets the tree without .git
        commit="$(cat build/gpu_refs/COMMIT) (no git here: build/gpu_refs/COMMIT, written by make gpu_refs)"
    else
        commit="unknown (no git here)"
    fi
    echo "commit: $commit"
    echo "host: $(hostname), kernel $(uname -r)"
    if command -v nvidia-smi >/dev/null 2>&1; then
        timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
        # the link ZenFlow's transfers take (a query of its own: an unknown field fails the query)
        timeout 10 nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max \
            --format=csv 2>&1
    else
        echo "nvidia-smi: not installed (no GPU driver here)"
    fi
    [ -r /proc/driver/nvidia/version ] && echo "driver: $(head -1 /proc/driver/nvidia/version)"
    "$NVCC" --version 2>&1 | tail -2
    # the host, whose cores and memory run ZenFlow's CPU side
    echo "host CPU: $(nproc) cores online, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)"
    echo "host memory: $HOST_MEMORY_NOTE"
} >"$LOGDIR/env.log" 2>&1
DEVICE=$(timeout 10 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
DEVICE=${DEVICE:-"no GPU found by nvidia-smi"}
DRIVER=$(timeout 10 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
record "device" INFO "$DEVICE${DRIVER:+, driver $DRIVER}, kernel $(uname -r)"
record "host memory" INFO "$HOST_MEMORY_NOTE"

# the reference cases a GPU machine got: `make gpu_refs` packs every case into build/gpu_refs,
# one small folder to carry along, but of the 50 MB `vocab` case (GPT-2's real vocabulary)
# only its train.bin; the rest of it is made here with PyTorch (some 15 s of one core), while
# the builds run
REFS=${GPU_CHECK_REFS:-dev/test/ref}  # make test points this elsewhere
if [ -d build/gpu_refs ] && [ ! -e "$REFS/tiny" ]; then
    mkdir -p "$REFS" && cp -r build/gpu_refs/. "$REFS/"
fi
# torch_python: prints the first of $PYTHON (default /usr/bin/python3) and python3 that has
# torch and numpy (GPU images often have torch only in the python3 on the PATH)
torch_python() {
    local candidate
    for candidate in "${PYTHON:-/usr/bin/python3}" python3; do
        "$candidate" -c "import torch, numpy" >/dev/null 2>&1 && { echo "$candidate"; return 0; }
    done
    return 1
}

# ----------------------------------------------------------------------------
# build: everything at once (and meanwhile, the vocab case)

begin_stage build
build_started=$(date +%s)
vocab_pid=""
if [ -f "$REFS/vocab/train.bin" ] && [ ! -f "$REFS/vocab/case.txt" ] && in_only tests; then
    # beside the builds, from the search for a python with torch on (importing torch takes
    # seconds); no limit of its own: the tests stage waits for it, within its own time.
    # Exit status 3: no such python.
    (vocab_py=$(torch_python) || exit 3
     PYTHON=$vocab_py exec bash dev/test/make_refs.sh "$REFS" --only vocab) >"$LOGDIR/make_vocab_case.log" 2>&1 &
    vocab_pid=$!
fi

BUILD_ABS=$(cd "$BUILD" && pwd)
# the CPU side of ZenFlow (cpu_adam.cpp: AdamW and the updater thread), as the Makefile builds it
run_logged "$LOGDIR/build_cpu_adam.log" 60 \
    "$CXX" -O3 -march=native -std=c++17 -fopenmp -ffp-contract=off -Wall -c cpu_adam.cpp -o "$BUILD/cpu_adam.o"
rc_cpu_adam=$?
run_logged "$LOGDIR/build_bench_cpu_adam.log" 60 \
    "$CXX" -O3 -march=native -std=c++17 -fopenmp -ffp-contract=off -Wall dev/bench_cpu_adam.cpp "$BUILD/cpu_adam.o" \
    -o "$BUILD/bench_cpu_adam" -lpthread -lm &
pid_bench_cpu_adam=$!
run_logged "$LOGDIR/build_train_gpt2cu.log" 60 \
    "$NVCC" $NVCCFLAGS train_gpt2.cu "$BUILD/cpu_adam.o" -o "$BUILD/train_gpt2cu" $LIBS &
pid_train=$!
run_logged "$LOGDIR/build_test_gpt2cu.log" 60 \
    "$NVCC" $NVCCFLAGS test_gpt2.cu "$BUILD/cpu_adam.o" -o "$BUILD/test_gpt2cu" $LIBS &
pid_test=$!
build_dev_cuda() {  # with dev/cuda/Makefile, or nvcc directly where there is no make
    local p targets=() pids=() rc=0
    if command -v make >/dev/null; then
        for p in $DEV_CUDA; do targets+=("$BUILD_ABS/cuda/$p"); done
        make -C dev/cuda -j8 ARCH="$ARCH" BUILD="$BUILD_ABS/cuda" "${targets[@]}"
    else
        mkdir -p "$BUILD/cuda"
        # (cpu_adam.cpp: for zenflow.cu, and the programs whose CPU references come from the CPU trainer)
        for p in $DEV_CUDA; do
            "$NVCC" $NVCCFLAGS "dev/cuda/$p.cu" cpu_adam.cpp -o "$BUILD/cuda/$p" $LIBS &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || rc=1; done
        return $rc
    fi
}
export -f build_dev_cuda  # so that timeout can run it through bash
export NVCC NVCCFLAGS LIBS BUILD BUILD_ABS ARCH CXX DEV_CUDA
run_logged "$LOGDIR/build_dev_cuda.log" 60 bash -c build_dev_cuda &
pid_dev=$!
# llm.c's fp32 trainer, built as scripts/bench_llmc.sh builds it (its Makefile's flags, for
# this GPU) and where bench_llmc.sh builds it, so that its table names llm.c's commit
pid_llmc=""
LLMC_BIN=""
if [ -f build/llmc_ref/train_gpt2_fp32.cu ] && in_only llmc; then
    cap=$(timeout 10 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
    case $cap in ''|*[!0-9]*) cap=90 ;; esac
    LLMC_BIN="$BUILD_ABS/bench_llmc/train_gpt2fp32cu"
    mkdir -p "$BUILD/bench_llmc"
    # shellcheck disable=SC2086
    (cd build/llmc_ref && run_logged "$LOGDIR/build_llmc.log" 60 "$NVCC" --threads=0 -t=0 --use_fast_math \
        -std=c++17 -O3 --generate-code "arch=compute_$cap,code=[compute_$cap,sm_$cap]" train_gpt2_fp32.cu \
        -lcublas -lcublasLt -o "$LLMC_BIN") &
    pid_llmc=$!
fi
wait $pid_train; rc_train=$?
wait $pid_test; rc_test=$?
wait $pid_dev; rc_dev=$?
wait $pid_bench_cpu_adam; rc_bench_cpu_adam=$?
build_s=$(( $(date +%s) - build_started ))
[ $rc_cpu_adam -ne 0 ] && rc_train=$rc_cpu_adam && rc_test=$rc_cpu_adam  # they link it
record "build train_gpt2cu" "$(status_word $rc_train)" "$(timeout_note $rc_train) (${build_s}s for all builds)"
record "build test_gpt2cu" "$(status_word $rc_test)" "$(timeout_note $rc_test)"
record "build dev/cuda" "$(status_word $rc_dev)" "$(timeout_note $rc_dev)"
if [ -n "$pid_llmc" ]; then
    wait $pid_llmc; rc=$?
    record "build llm.c fp32" "$(status_word $rc)" "$(timeout_note $rc) (build/llmc_ref: $(cut -c1-7 build/llmc_ref/COMMIT 2>/dev/null))"
    [ $rc -eq 0 ] || LLMC_BIN=""  # bench_llmc.sh then tries once more, and says why it fails
fi

# the benchmarks' data
TRAIN=data/tinyshakespeare/tiny_shakespeare_train.bin
VAL=data/tinyshakespeare/tiny_shakespeare_val.bin
DATA_NOTE="tinyshakespeare"
if [ ! -f "$TRAIN" ] || [ ! -f "$VAL" ]; then
    # a synthetic shard of uniformly random token ids < 50257 (llm.c's shard format)
    TRAIN="$BUILD/synthetic_train.bin"
    VAL="$BUILD/synthetic_val.bin"
    DATA_NOTE="synthetic random tokens"
    if ! { "$CXX" -O2 -std=c++17 dev/synthetic_shard.cpp -o "$BUILD/synthetic_shard" \
           && "$BUILD/synthetic_shard" "$TRAIN" 400000 1 && "$BUILD/synthetic_shard" "$VAL" 40000 2; } \
         >"$LOGDIR/synthetic_data.log" 2>&1; then
        DATA_NOTE="synthetic data FAILED, see synthetic_data.log"
    fi
fi

# tiny_case_row ROW: records ROW as SKIPPED, and fails, when the CUDA trainer cannot run on
# the tiny case here
tiny_case_row() {
    if [ $rc_train -ne 0 ]; then
        record "$1" SKIPPED "build failed"
    elif [ "$HAS_GPU" -eq 0 ]; then
        record "$1" SKIPPED "no CUDA device (nvidia-smi found none)"
    elif [ ! -f "$REFS/tiny/model.bin" ]; then
        record "$1" SKIPPED "no $REFS/tiny"
    else
        return 0
    fi
    return 1
}

# ----------------------------------------------------------------------------
# tests: the reference cases (directories with state.bin and case.txt; the ZenFlow cases
# have no state.bin and belong to another test), then test_gpt2cu on all of them

begin_stage tests
if [ -n "$vocab_pid" ]; then
    # made while the builds ran; waited for within this stage's time, less the 25 s that
    # test_gpt2cu needs on the shipped cases (a vocab case not done by then is left out)
    while kill -0 "$vocab_pid" 2>/dev/null && [ "$(stage_left)" -gt 25 ]; do sleep 0.2; done
    if kill -0 "$vocab_pid" 2>/dev/null; then
        end_tree "$vocab_pid"
        rc=124
    else
        wait "$vocab_pid"
        rc=$?
    fi
    if [ $rc -eq 3 ]; then
        record "test refs vocab" SKIPPED "no python with torch+numpy here to make it"
    else
        record "test refs vocab" "$(status_word $rc)" \
            "made here: $(head -1 "$REFS/vocab/losses.txt" 2>/dev/null | grep -o 'torch=[^ ]*') $(timeout_note $rc)"
    fi
fi

find_cases() {
    CASES=()
    ZF_CASES=()  # ZenFlow cases: zenflow.txt and selections.txt instead of state.bin
    local d
    for d in "$REFS"/*/; do
        d=${d%/}
        if [ -f "$d/state.bin" ] && [ -f "$d/case.txt" ] && [ -f "$d/model.bin" ] && [ -f "$d/train.bin" ] \
           && [ -f "$d/losses.txt" ]; then
            CASES+=("$d")
        elif [ -f "$d/zenflow.txt" ] && [ -f "$d/selections.txt" ] && [ -f "$d/case.txt" ] \
             && [ -f "$d/model.bin" ] && [ -f "$d/train.bin" ] && [ -f "$d/losses.txt" ]; then
            ZF_CASES+=("$d")
        fi
    done
}
find_cases
if [ ${#CASES[@]} -gt 0 ]; then
    record "test refs" PASS "found: ${CASES[*]} ${ZF_CASES[*]:-(no zenflow cases)}"
elif skip_stage tests "test refs"; then
    :
elif [ ! -f dev/test/make_refs.sh ]; then
    record "test refs" FAIL "none in $REFS and no dev/test/make_refs.sh"
elif ! PY=$(torch_python); then
    record "test refs" FAIL "none shipped and no python with torch+numpy here (hint: make gpu_refs here, and carry build/gpu_refs along)"
else
    PYTHON=$PY run_logged "$LOGDIR/make_refs.log" 600 bash dev/test/make_refs.sh "$REFS"
    rc=$?
    find_cases
    if [ $rc -eq 0 ] && [ ${#CASES[@]} -gt 0 ]; then
        record "test refs" PASS "generated here with $PY: ${CASES[*]} ${ZF_CASES[*]:-}"
    else
        record "test refs" FAIL "make_refs.sh with $PY: $(timeout_note $rc); cases written: ${CASES[*]:-none}"
    fi
fi

if skip_stage tests "test_gpt2cu"; then
    :
elif [ $rc_test -ne 0 ]; then
    record "test_gpt2cu" SKIPPED "build failed"
elif [ ${#CASES[@]} -eq 0 ]; then
    record "test_gpt2cu" SKIPPED "no reference cases"
else
    run_logged "$LOGDIR/test_gpt2cu.log" 600 "$BUILD/test_gpt2cu" "${CASES[@]}" "${ZF_CASES[@]}"
    record_run "test_gpt2cu" "$LOGDIR/test_gpt2cu.log" $?
fi

# ----------------------------------------------------------------------------
# llmc: the CUDA trainer's speed target, side by side: ours against llm.c's fp32 trainer,
# d12, B = 4 and 16 (scripts/bench_llmc.sh; llm.c's source is build/llmc_ref, which
# scripts/get_llmc.sh fetches and a remote run carries along; without it this says SKIPPED)

begin_stage llmc
LLMC_BENCH_MD=""
if ! skip_stage llmc "bench vs llm.c" && ! no_trainer "bench vs llm.c"; then
    rm -f "$BUILD/bench_llmc/results.txt"  # never a stale one from an earlier run
    run_logged "$LOGDIR/bench_llmc.log" 600 bash scripts/bench_llmc.sh --bin "$BUILD/train_gpt2cu" \
        --out "$BUILD/bench_llmc" --train "$TRAIN" --val "$VAL" ${LLMC_BIN:+--llmc-bin "$LLMC_BIN"}
    rc=$?
    mkdir -p "$LOGDIR/bench_llmc_logs" && cp "$BUILD"/bench_llmc/logs/* "$LOGDIR/bench_llmc_logs/" 2>/dev/null
    skipped=$(grep "^bench_llmc.sh: SKIPPED" "$LOGDIR/bench_llmc.log" | tail -1)  # the script's own word only
    if [ -n "$skipped" ]; then
        record "bench vs llm.c" SKIPPED "$skipped"
    elif [ ! -s "$BUILD/bench_llmc/results.txt" ]; then
        record "bench vs llm.c" FAIL "$(timeout_note $rc): $(tail -1 "$LOGDIR/bench_llmc.log")"
    else
        cp "$BUILD/bench_llmc/bench_llmc.md" "$LOGDIR/" 2>/dev/null && LLMC_BENCH_MD="$LOGDIR/bench_llmc.md"
        while read -r B ours llmc _; do
            if [ "$ours" = FAILED ]; then
                record "bench vs llm.c B=$B" FAIL "$llmc (see bench_llmc_logs)"
            else
                record "bench vs llm.c B=$B" PASS "$(awk -v o="$ours" -v l="$llmc" \
                    'BEGIN { printf "ours %.1f ms/step, llm.c fp32 %.1f ms/step: ours / llm.c = %.3f (target <= 1.00)", o, l, o / l }')"
            fi
        done <"$BUILD/bench_llmc/results.txt"
        [ $rc -eq 124 ] || [ $rc -eq 137 ] && record "bench vs llm.c" FAIL "timed out before every batch size ran"
        progress_file "$LLMC_BENCH_MD"
    fi
fi

# ----------------------------------------------------------------------------
# zenflow: the modes side by side, d48 (first: the speed-up target) and d12; bench_zenflow.sh
# starts no new run in the stage's last 35 s, so that the run under way can end within it (35 s
# rests on no GPU measurement yet: a d48 run pins about 40 GB of host memory before its steps)

begin_stage zenflow
ZF_BENCH_MD=""
if ! skip_stage zenflow "bench zenflow" && ! no_trainer "bench zenflow"; then
    left=$(stage_left)
    rm -f "$BUILD/bench_zenflow/results.txt"
    run_logged "$LOGDIR/bench_zenflow.log" 600 bash scripts/bench_zenflow.sh --quick \
        --bin "$BUILD/train_gpt2cu" --out "$BUILD/bench_zenflow" \
        --budget $(( left > 70 * SLOWDOWN ? left - 35 * SLOWDOWN : left / 2 + 1 ))
    rc=$?
    cp "$BUILD/bench_zenflow/bench_zenflow.csv" "$BUILD/bench_zenflow/bench_zenflow.md" "$LOGDIR/" 2>/dev/null
    mkdir -p "$LOGDIR/bench_zenflow_logs" && cp "$BUILD"/bench_zenflow/logs/* "$LOGDIR/bench_zenflow_logs/" 2>/dev/null
    if [ -f "$BUILD/bench_zenflow/results.txt" ]; then
        while read -r model mode rest; do
            set -- $rest
            if [ "$1" = SKIPPED ]; then
                record "bench zenflow $model $mode" SKIPPED "${2:-}"
            elif [ "$1" = FAILED ]; then
                record "bench zenflow $model $mode" FAIL "${2:-}"
            elif [[ ! "$7" =~ ^[0-9]+$ ]]; then  # fields: ms compute stall cpu d2h h2d opt_bytes M n d2h_bytes h2d_bytes
                record "bench zenflow $model $mode" FAIL "no GPU optimizer state ([memory] GPU moments) in its log"
            else
                record "bench zenflow $model $mode" PASS "$(awk -v ms="$1" -v st="$3" -v d="$5" -v h="$6" -v o="$7" \
                    'BEGIN { printf "%.1f ms/step, stall %.1f ms (%.1f%%), PCIe %.0f MB down %.0f MB up, opt state %.0f MiB", ms, st, 100 * st / ms, d, h, o / 1048576 }')"
            fi
        done <"$BUILD/bench_zenflow/results.txt"
    fi
    # the script's own SKIPPED (no GPU), not a table row of a run left out of time
    skipped=$(grep "^bench_zenflow.sh: SKIPPED" "$LOGDIR/bench_zenflow.log" | tail -1)
    if [ -n "$skipped" ]; then
        record "bench zenflow" SKIPPED "$skipped"
    elif [ $rc -ne 0 ]; then
        record "bench zenflow" FAIL "$(timeout_note $rc) (see bench_zenflow.log)"
    fi
    [ -s "$LOGDIR/bench_zenflow.md" ] && ZF_BENCH_MD="$LOGDIR/bench_zenflow.md" && progress_file "$ZF_BENCH_MD"
fi

# ----------------------------------------------------------------------------
# timeline: the teaching pictures, d12, B=4, T=1024, offload and zenflow, steps 4..7 traced
# (-tr); draw them with scripts/plot_timeline.py --trace offload=... --trace zenflow=...

begin_stage timeline
for mode in offload zenflow; do
    skip_stage timeline "timeline $mode" && continue
    no_trainer "timeline $mode" && continue
    run_logged "$LOGDIR/timeline_$mode.log" 25 "$BUILD/train_gpt2cu" -e d12 -b 4 -t 1024 -x 8 -v 0 -s 0 \
        -i "$TRAIN" -j "$VAL" -zo $mode -tr "$LOGDIR/trace_d12_$mode.json" -tf 4 -tn 4
    rc=$?
    events=$(grep -c '"ph": "X"' "$LOGDIR/trace_d12_$mode.json" 2>/dev/null)
    if [ $rc -eq 0 ] && [ "${events:-0}" -gt 0 ]; then
        record "timeline $mode" PASS "trace_d12_$mode.json ($events events)"
    elif [ $rc -eq 0 ]; then
        record "timeline $mode" FAIL "exit 0, but no events in trace_d12_$mode.json"
    elif [ "$HAS_GPU" -eq 0 ] && grep -q "no CUDA device" "$LOGDIR/timeline_$mode.log"; then
        record "timeline $mode" SKIPPED "$(tail -1 "$LOGDIR/timeline_$mode.log")"
    else
        record "timeline $mode" FAIL "$(timeout_note $rc): $(tail -1 "$LOGDIR/timeline_$mode.log")"
    fi
done

# ----------------------------------------------------------------------------
# devcuda: one row per program

begin_stage devcuda
for p in $DEV_CUDA; do
    skip_stage devcuda "dev/cuda $p" && continue
    if [ $rc_dev -ne 0 ] && [ ! -x "$BUILD/cuda/$p" ]; then
        record "dev/cuda $p" SKIPPED "build failed"
        continue
    fi
    run_logged "$LOGDIR/dev_cuda_$p.log" 25 "$BUILD/cuda/$p"
    record_run "dev/cuda $p" "$LOGDIR/dev_cuda_$p.log" $?
done

# ----------------------------------------------------------------------------
# sanitizer: compute-sanitizer's memcheck and racecheck over test_gpt2cu on the ZenFlow case
# zf_a (the model's kernels and ZenFlow's gather, scatter and column AdamW). Only this
# project's kernels are checked (cuBLASLt's are not ours, and many): every one's name ends in
# _kernel, which --kernel-name matches as a substring (kns=); and only the first
# SANITIZER_LAUNCHES of their launches: the case's first steps, every kernel of a training
# step at least once, so that each tool ends within its 45 s here.

begin_stage sanitizer
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
# test_gpt2cu on zf_a (counted on the CPU emulator, whose launches are the GPU's, in order):
# launch 79 of our kernels is the last to bring a new one of a -za cpu step but the scatter,
# which comes at 509 (the first window's update, applied a window later); -za gpu's zeroing
# comes at 1632, the plain adamw_kernel (k = 1) at 3100. A second run may check further:
# GPU_CHECK_SANITIZER_LAUNCHES=600 (the scatter) or 3200 (all), --only sanitizer
SANITIZER_LAUNCHES=${GPU_CHECK_SANITIZER_LAUNCHES:-300}
SANITIZER_CASE="$REFS/zf_a"
for tool in memcheck racecheck; do
    if skip_stage sanitizer "compute-sanitizer $tool"; then
        :
    elif [ -z "$SANITIZER" ]; then
        record "compute-sanitizer $tool" SKIPPED "compute-sanitizer not found"
    elif [ ! -x "$BUILD/test_gpt2cu" ] || [ ! -d "$SANITIZER_CASE" ]; then
        record "compute-sanitizer $tool" SKIPPED "no test_gpt2cu or no case zf_a"
    else
        log="$LOGDIR/sanitizer_$tool.log"
        run_logged "$log" 45 "$SANITIZER" --tool "$tool" --error-exitcode 9 --kernel-name kns=_kernel \
            --launch-count $SANITIZER_LAUNCHES "$BUILD/test_gpt2cu" "$SANITIZER_CASE"
        rc=$?
        # the tool's own refusal (a device it does not support, as under some virtual
        # machines, or a part of it missing) is no finding about this code
        # (memcheck's reports of a CUDA API call that failed, "Program hit ...", are findings)
        refused=$(grep -v "Program hit" "$log" | grep -m1 -i -E '^=+ .*(not supported|unsupported|could not (find|load)|cannot (find|load)|not found)')
        if [ $rc -ne 0 ] && [ -n "$refused" ]; then
            record "compute-sanitizer $tool" SKIPPED "${refused#*= }"
        else
            record "compute-sanitizer $tool" "$(status_word $rc)" \
                "$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log") (first $SANITIZER_LAUNCHES launches of our kernels) $(timeout_note $rc)"
        fi
    fi
done

# ----------------------------------------------------------------------------
# host: ZenFlow's CPU side on this host: a window's accumulations and AdamW on the
# trainer's two threads, scaled to d12 .. d48; whether the host can keep up with the GPU's
# steps at all decides the stall before any copy does (scripts/bench_cpu_adam.py)

begin_stage host
HOST_MD=""
if skip_stage host "host CPU side"; then
    :
elif [ $rc_bench_cpu_adam -ne 0 ] || [ $rc_cpu_adam -ne 0 ]; then
    record "host CPU side" FAIL "build failed (see build_bench_cpu_adam.log)"
else
    run_logged "$LOGDIR/bench_cpu_adam.log" 30 python3 scripts/bench_cpu_adam.py --bin "$BUILD/bench_cpu_adam" \
        --no-torch --reps 3
    rc=$?
    sed -n "/^ZenFlow's CPU side on this host/,/shares the bus/p" "$LOGDIR/bench_cpu_adam.log" >"$LOGDIR/host_side.md"
    d48=$(awk -F'|' '$2 ~ /^ *d48 *$/ { gsub(/^ +| +$/, "", $5); gsub(/^ +| +$/, "", $7); print $5 "/" $7 }' \
          "$LOGDIR/host_side.md")
    if [ $rc -ne 0 ] || [ -z "$d48" ]; then
        record "host CPU side" FAIL "$(timeout_note $rc): $(tail -1 "$LOGDIR/bench_cpu_adam.log")"
    else
        HOST_MD="$LOGDIR/host_side.md"
        record "host CPU side" PASS "$(nproc) cores; d48 k=0.1 U=4: the CPU keeps up with steps >= ${d48%/*} (-za cpu), >= ${d48#*/} (-za gpu)"
        progress_file "$HOST_MD"
    fi
fi

# ----------------------------------------------------------------------------
# resume: checkpoints of the CUDA trainer (model + ZenFlow state, shared with the CPU
# trainer): resumed runs, and SIGKILLs at random moments, must end bit for bit where a
# straight run ends; then its val loss and samples against PyTorch (TF32 off)

begin_stage resume
if skip_stage resume "resume train_gpt2cu" || ! tiny_case_row "resume train_gpt2cu"; then
    :
elif ! command -v python3 >/dev/null; then
    record "resume train_gpt2cu" SKIPPED "no python3"
else
    run_logged "$LOGDIR/resume_train_gpt2cu.log" 35 python3 dev/test/test_resume.py "$BUILD/train_gpt2cu" \
        "$REFS/tiny" --kills 3
    rc=$?
    record "resume train_gpt2cu" "$(status_word $rc)" "$(tail -1 "$LOGDIR/resume_train_gpt2cu.log") $(timeout_note $rc)"
fi
if skip_stage resume "eval train_gpt2cu" || ! tiny_case_row "eval train_gpt2cu"; then
    :
elif ! eval_py=$(torch_python); then
    record "eval train_gpt2cu" SKIPPED "no python with torch+numpy here"
else
    run_logged "$LOGDIR/eval_train_gpt2cu.log" 15 "$eval_py" dev/test/test_eval.py "$BUILD/train_gpt2cu" "$REFS/tiny"
    rc=$?
    record "eval train_gpt2cu" "$(status_word $rc)" "$(tail -1 "$LOGDIR/eval_train_gpt2cu.log") $(timeout_note $rc)"
fi

# ----------------------------------------------------------------------------
# d12 (only with --only): the CUDA trainer's kernels alone, GPT-2 124M, random init, adamw

bench() {  # bench NAME SLUG B TF32 (SLUG names the log file)
    local name=$1 slug=$2 B=$3 tf32=$4 T=1024 steps=12
    local log="$LOGDIR/bench_$slug.log"
    skip_stage d12 "bench $name" && return
    no_trainer "bench $name" && return
    run_logged "$log" 20 "$BUILD/train_gpt2cu" -e d12 -b "$B" -t "$T" -x $steps -v 0 -s 0 -f "$tf32" \
        -i "$TRAIN" -j "$VAL" -zo adamw
    local rc=$?
    if [ $rc -ne 0 ] && [ "$HAS_GPU" -eq 0 ] && grep -q "no CUDA device" "$log"; then
        record "bench $name" SKIPPED "$(tail -1 "$log")"
        return
    elif [ $rc -ne 0 ]; then
        record "bench $name" FAIL "$(timeout_note $rc): $(tail -1 "$log")"
        return
    fi
    # median ms of steps 3..12; N, L, C from the [GPT-2] line
    local ms N L C
    ms=$(awk -F'|' '/^step [0-9]+\/[0-9]+ \| loss/ { split($1, a, /[ \/]/); if (a[2] > 2) { gsub(/ ms/, "", $3); print $3 + 0 } }' "$log" \
         | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    N=$(sed -n 's/^\[GPT-2\].*, \([0-9]*\) parameters.*/\1/p' "$log" | head -1)
    L=$(sed -n 's/^\[GPT-2\] L=\([0-9]*\) .*/\1/p' "$log" | head -1)
    C=$(sed -n 's/^\[GPT-2\] .* C=\([0-9]*\) .*/\1/p' "$log" | head -1)
    local loss
    loss=$(awk -F'|' '/^step [0-9]+\/[0-9]+ \| loss/ { l = $2 } END { gsub(/ loss /, "", l); print l + 0 }' "$log")
    local line
    line=$(awk -v ms="$ms" -v B="$B" -v T="$T" -v N="$N" -v L="$L" -v C="$C" 'BEGIN {
        if (ms == "nan" || ms <= 0 || N == "") { print "no step times"; exit }
        tok = B * T; flops = 6 * N * tok + 12 * L * C * T * tok
        printf "%.1f ms/step  %.0f tok/s  %.1f TFLOP/s", ms, tok / (ms / 1e3), flops / (ms / 1e3) / 1e12 }')
    if [ "$line" = "no step times" ]; then
        record "bench $name" FAIL "exit 0, but no step times in $(basename "$log")"
    else
        record "bench $name" PASS "$line (final loss $loss)"
    fi
}
begin_stage d12
bench "d12 B=4 TF32" d12_B4_tf32 4 1
bench "d12 B=16 TF32" d12_B16_tf32 16 1
bench "d12 B=4 fp32" d12_B4_fp32 4 0

# ----------------------------------------------------------------------------
# random (only with --only): random shapes and settings, after the fixed cases

begin_stage random
if skip_stage random "random cases" || ! tiny_case_row "random cases"; then
    :
elif [ $rc_test -ne 0 ]; then
    record "random cases" SKIPPED "test_gpt2cu: build failed"
elif ! random_py=$(torch_python); then
    record "random cases" SKIPPED "no python with torch+numpy here"
else
    run_logged "$LOGDIR/random_cases.log" 600 "$random_py" dev/test/test_random_cases.py --count 12 --seed 1 \
        --no-cpu-tests --cuda-test "$BUILD/test_gpt2cu" --trainer "$BUILD/train_gpt2cu" --logs "$LOGDIR/random_cases"
    rc=$?
    record "random cases" "$(status_word $rc)" "$(tail -1 "$LOGDIR/random_cases.log") $(timeout_note $rc)"
fi

# ----------------------------------------------------------------------------
# summary (last)

failed=0
{
    echo "# GPU check (the CUDA trainer, ZenFlow on the GPU)"
    echo
    sed 's/^/    /' "$LOGDIR/env.log"
    echo
    echo "benchmark data: $DATA_NOTE"
    if chosen d12; then
        echo "d12 = GPT-2 124M shape, random init, T=1024, 12 steps"
        echo "flops per step = 6*N*B*T + 12*L*C*T*B*T; ms/step = median of steps 3..12"
        echo "(for scale: llm.c reported ~78 ms/iter for GPT-2 124M at B=4, T=1024 on an A100 40GB, TF32)"
    fi
    echo
    printf '| %-28s | %-7s | %s\n' "stage" "status" "details"
    printf '|%s|%s|%s\n' "------------------------------" "---------" "---------"
    for i in "${!ROW_NAMES[@]}"; do
        printf '| %-28s | %-7s | %s\n' "${ROW_NAMES[$i]}" "${ROW_STATUS[$i]}" "${ROW_NOTES[$i]}"
        [ "${ROW_STATUS[$i]}" = FAIL ] && failed=$((failed + 1))
    done
    echo
    for table in "$LLMC_BENCH_MD" "$ZF_BENCH_MD" "$HOST_MD"; do
        if [ -n "$table" ] && [ -f "$table" ]; then
            echo
            cat "$table"
        fi
    done
    echo
    echo "total time: $(( $(date +%s) - START )) s; logs in $LOGDIR; $failed stage(s) failed"
} >"$LOGDIR/summary.md"

if [ -n "$PACK_DIR" ]; then
    cp "$LOGDIR/summary.md" "$PACK_DIR/summary.md"
    pack_logs
fi
echo
echo "================================ summary ================================"
cat "$LOGDIR/summary.md"
[ $failed -eq 0 ]
