#!/usr/bin/env bash
# Runs the libFuzzer targets of dev/fuzz for a bounded time each (`make fuzz` builds them
# into build/fuzz and calls this). Every input in dev/fuzz/regressions/<target>/ (crashes
# found earlier, kept as regression tests) runs first; then the fuzzer explores from a seed
# corpus of valid files: a tiny model and its checkpoint written by the CPU trainer, a shard
# and a tokenizer written here. An input that runs longer than 10 s is a hang: a finding.
#
#   bash dev/fuzz/run_fuzzers.sh [seconds per target, default 15]
#
# Leak detection is off: a rejected file makes the reader jump out of the middle of its
# work (fatal -> longjmp), which leaks by design; the trainers exit at that point.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_EACH=${1:-15}
B=build/fuzz
mkdir -p "$B/seeds"/{model,shard,tokenizer,checkpoint}
rm -f "$B"/crash_*  # an earlier run's findings: once fixed they live in dev/fuzz/regressions/

# seeds: a tiny model and its checkpoint (written by the CPU trainer), a shard, a tokenizer
tmp=$(mktemp -d)
/usr/bin/python3 - "$tmp" "$B/seeds" <<'PY'
import struct, sys
tmp, seeds = sys.argv[1], sys.argv[2]
header = lambda *ints: struct.pack("<256i", *(list(ints) + [0] * (256 - len(ints))))
tokens = [i % 97 for i in range(200)]
with open(f"{tmp}/shard.bin", "wb") as f:
    f.write(header(20240520, 1, len(tokens)) + struct.pack(f"<{len(tokens)}H", *tokens))
with open(f"{seeds}/shard/shard.bin", "wb") as f:
    f.write(header(20240520, 1, 12) + struct.pack("<12H", *range(12)))
pieces = [b"a", b"bc", b" the", b"\xe2\x82", b"<|endoftext|>"]
with open(f"{seeds}/tokenizer/tokenizer.bin", "wb") as f:
    f.write(header(20240328, 2, len(pieces), len(pieces) - 1))
    for p in pieces:
        f.write(bytes([len(p)]) + p)
PY
./train_gpt2cpu -e d1c8h2v97t32 -i "$tmp/shard.bin" -j "$tmp/shard.bin" -b 4 -t 16 -x 6 -n 6 \
    -v 0 -s 0 -zk 0.25 -zu 3 -o "$tmp/run" > /dev/null
cp "$tmp/run/model_00000006.bin" "$B/seeds/model/tiny.bin"
cp "$tmp/run/state_00000006.bin" "$B/seeds/checkpoint/state.bin"
cp "$tmp/run/manifest_00000006.txt" "$B/seeds/checkpoint/manifest.txt"
rm -rf "$tmp"

export ASAN_OPTIONS=detect_leaks=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
status=0
for target in model shard tokenizer checkpoint; do
    bin=$B/fuzz_$target
    regressions=dev/fuzz/regressions/$target
    if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
        echo "== fuzz_$target: regression inputs"
        if ! "$bin" -timeout=10 -close_fd_mask=2 "$regressions"/* > "$B/${target}_regressions.log" 2>&1; then
            echo "fuzz: FAILED: an input of $regressions crashes again (report: $B/${target}_regressions.log)"
            status=1
        fi
    fi
    corpus=$B/corpus/$target
    mkdir -p "$corpus"
    cp -n "$B/seeds/$target"/* "$corpus/" 2>/dev/null || true
    echo "== fuzz_$target: ${SECONDS_EACH} s"
    # -close_fd_mask=2: the readers' one-line rejections would flood the output
    "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -close_fd_mask=2 -rss_limit_mb=2048 \
        -artifact_prefix="$B/crash_${target}_" "$corpus" > "$B/$target.log" 2>&1 || status=1
    tail -n 2 "$B/$target.log"
done
found=$(find "$B" -maxdepth 1 -name 'crash_*' | wc -l)
if [ "$status" -ne 0 ] || [ "$found" -ne 0 ]; then
    echo "fuzz: FAILED: $found new crashing inputs in $B (logs: $B/<target>.log; move each input into dev/fuzz/regressions/<target>/ once fixed)"
    exit 1
fi
echo "fuzz: 4 targets ran ${SECONDS_EACH} s each, no crash"
