#!/usr/bin/env bash
# Rehearses dev/gpu_check.sh on the CPU emulator, every stage in the order of its plan (the
# two that a GPU run leaves to --only too), so that a broken stage is found before a GPU
# machine runs it (make test's dry run, row gpu_check_script, skips every stage that needs a
# device, and a GPU machine's minutes are few):
#
#   make gpu_rehearsal, or: make emu refs && bash dev/cuda/emu/rehearse_gpu_check.sh [<logdir>]
#   (25 to 45 minutes on 2 cores)
#
# (<logdir> defaults to /tmp/gpu_check_rehearsal; gpu_check.sh's --out goes to <logdir>.out)
#
# Stand-ins come first on the PATH:
#   nvidia-smi  names one GPU, "CPU emulator rehearsal";
#   nvcc        gives train_gpt2.cu, test_gpt2.cu and dev/cuda's programs their emulated builds
#               (build/emu); llm.c's trainer becomes a program that exits 1 (llm.c's kernels
#               are not emulated: its rows FAIL, as expected); other sources go to the real nvcc.
# The trainer's stand-in shrinks the GPT-2-sized runs: d12..d36 (by name, or bench_zenflow.sh's
# model files) become d2c64h2, d48 becomes d3c96h3, and every argument 1024 (T) becomes 32.
# So every stage runs through the script's own code, its commands, timeouts, the parsing of
# logs into rows, the tables, progress.md and the --out archive; the numbers mean nothing
# (emulated times). The emulator is slower than a GPU: GPU_CHECK_SLOWDOWN makes every stage's
# limit 16 times longer (--plan shows a GPU machine's; under a busy
# host's load the emulated test_gpt2cu and test_resume.py took 5 minutes each).
# Exit status 0 when the stages ran in the plan's order and every row of the summary is PASS
# except: device and host memory (INFO), compute-sanitizer (SKIPPED where it is not
# installed), bench vs llm.c (FAIL "llm.c-exit-1" rows, or SKIPPED without build/llmc_ref),
# test refs vocab (absent: the rehearsal's cases have none).
set -u
cd "$(dirname "$0")/../../.." || exit 2
ROOT=$PWD
LOGDIR=${1:-/tmp/gpu_check_rehearsal}
for b in train_gpt2cu test_gpt2cu dev_cuda/zenflow; do
    [ -x "build/emu/$b" ] || { echo "rehearse_gpu_check.sh: no build/emu/$b (hint: make emu refs)" >&2; exit 2; }
done
REAL_NVCC=$(command -v nvcc) || { echo "rehearse_gpu_check.sh: no nvcc (gpu_check.sh builds host code with it)" >&2; exit 2; }

BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
cat >"$BIN/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in
    -L) echo "GPU 0: CPU emulator rehearsal (UUID: none)" ;;
    *--query-gpu=name,*) echo "name, driver_version, memory.total [MiB], clocks.max.sm [MHz]"
                         echo "CPU emulator rehearsal, none, 0 MiB, 0 MHz" ;;
    *--query-gpu=name*) echo "CPU emulator rehearsal" ;;
esac
EOF
cat >"$BIN/nvcc" <<EOF
#!/usr/bin/env bash
out="" src=""
args=("\$@")
for ((i = 0; i < \${#args[@]}; i++)); do
    [ "\${args[i]}" = -o ] && out=\${args[i + 1]}
    case \${args[i]} in *.cu) src=\${args[i]} ;; esac
done
name=\$(basename "\$src" .cu)
if [ "\$src" = train_gpt2.cu ]; then
    cat >"\$out" <<'EOS'
#!/usr/bin/env bash
a=()
for x in "\$@"; do
    case \$x in d12|d24|d36|*/d12.bin|*/d24.bin|*/d36.bin) x=d2c64h2 ;; d48|*/d48.bin) x=d3c96h3 ;; 1024) x=32 ;; esac
    a+=("\$x")
done
exec $ROOT/build/emu/train_gpt2cu "\${a[@]}"
EOS
    chmod +x "\$out"
elif [ "\$src" = test_gpt2.cu ]; then
    cp $ROOT/build/emu/test_gpt2cu "\$out"
elif [ "\$name" = train_gpt2_fp32 ]; then
    printf '#!/bin/sh\necho "llm.c stand-in: llm.c runs only on a GPU"\nexit 1\n' >"\$out" && chmod +x "\$out"
elif [ -n "\$src" ] && [ -x "$ROOT/build/emu/dev_cuda/\$name" ]; then
    cp "$ROOT/build/emu/dev_cuda/\$name" "\$out"
else
    exec "$REAL_NVCC" "\$@"
fi
EOF
chmod +x "$BIN/nvidia-smi" "$BIN/nvcc"

# builds of its own (the stand-ins' output must never pass for nvcc's in build/gpu_check, nor
# an earlier nvcc build for a stand-in's: dev/cuda's Makefile keeps what is up to date)
BUILD_DIR=build/gpu_check_rehearsal
rm -rf "$BUILD_DIR"
# (of <logdir> only what is checked below goes first, so that no stale copy can pass for it)
rm -f "$LOGDIR/summary.md" "$LOGDIR.out/summary.md" "$LOGDIR.out/gpu_check_logs.tar.gz" "$LOGDIR.out/progress.md"
# every stage, in the plan's order: the stage names from --plan (build always runs)
ORDER=$(bash dev/gpu_check.sh --plan | awk '$2 ~ /^[0-9]+$/ && $3 == "s" { print $1 }' | tr '\n' ' ')
# Four reference cases, not all: the plain one and ZenFlow with overlap, warm-up and auto U
# (make test's emu_test_gpt2cu takes every case through the emulator, some 10 minutes of CPU;
# here the script's handling of the test is rehearsed, and the vocab case's making is make
# test's dry run's)
mkdir -p "$BIN/refs"
for c in tiny zf_a zf_c zf_f; do ln -s "$ROOT/dev/test/ref/$c" "$BIN/refs/$c"; done
# ZF_SKIP_BENCHMARKS: dev/cuda's programs validate only (emulated timings mean nothing)
PATH="$BIN:$PATH" NVCC=nvcc GPU_CHECK_BUILD=$BUILD_DIR GPU_CHECK_REFS="$BIN/refs" ZF_SKIP_BENCHMARKS=1 \
    GPU_CHECK_SLOWDOWN=16 bash dev/gpu_check.sh "$LOGDIR" --out "$LOGDIR.out" --only "${ORDER#build }"
echo
ran=$(sed -n 's/^== stage \([a-z0-9]*\) .*/\1/p' "$LOGDIR.out/progress.md" 2>/dev/null | tr '\n' ' ')
if [ "$ran" = "$ORDER" ]; then
    echo "stages in the plan's order: $ran"
else
    echo "REHEARSAL FAIL: the stages ran as '$ran', the plan says '$ORDER'"
    order_bad=1
fi
# the rows that are not PASS, each either expected here or a failure of the rehearsal
awk -F'|' '
    /^\| stage / { table = 1; next }   # the stage table: from its header to the first blank line
    /^ *$/ { table = 0 }
    table && $2 !~ /^-+$/ {
        row = $2; st = $3; gsub(/^ +| +$/, "", row); gsub(/ /, "", st)
        if (st == "PASS") { next }
        if (((row == "device" || row == "host memory") && st == "INFO") ||
            (row ~ /^compute-sanitizer/ && st == "SKIPPED") ||
            (row ~ /^bench vs llm.c B=/ && st == "FAIL" && $4 ~ /llm.c-exit-1/) ||
            (row == "bench vs llm.c" && st == "SKIPPED" && $4 ~ /no build\/llmc_ref/)) {
            printf "expected here: %s %s\n", row, st; next
        }
        printf "REHEARSAL FAIL: %s %s:%s\n", row, st, $4; bad++
    }
    END { exit bad > 0 }' "$LOGDIR/summary.md"
rc=$?
[ -z "${order_bad:-}" ] || rc=1
[ -s "$LOGDIR.out/summary.md" ] && [ -s "$LOGDIR.out/gpu_check_logs.tar.gz" ] && [ -s "$LOGDIR.out/progress.md" ] \
    || { echo "REHEARSAL FAIL: --out has no summary.md, progress.md and archive"; rc=1; }
echo "rehearsal of gpu_check.sh: $([ $rc -eq 0 ] && echo "every stage ran as expected" || echo FAILED) (logs in $LOGDIR)"
exit $rc
