#!/usr/bin/env bash
# Runs the fine-tuning walk-through of docs/teaching.md (section 6, "On the CPU, end to end")
# exactly as written there: its first ```bash block, with bash -e, from the repository root.
# Then checks what the text promises: the val loss transformers prints for the exported model
# is the trainer's last val loss, to 1e-4: two fp32 forward passes, transformers' and ours, that
# sum in other orders (test_hf.py holds them to 1e-5 relative), of a loss below 10.
#
#   make walkthrough, or: bash dev/test/test_walkthrough.sh   (5 to 10 minutes on two cores)
#
# Not in make test (too long); run it after changing the trainer's flags, convert_hf.py or
# prepare_text.py. Output in build/walk/ (removed first) and build/walk.log.
set -u
cd "$(dirname "$0")/../.." || exit 2
rm -rf build/walk
mkdir -p build
script=$(awk '/^### On the CPU, end to end/ {on = 1} on && /^```bash$/ {inside = 1; next}
              inside && /^```$/ {exit} inside {print}' docs/teaching.md)
if [ -z "$script" ]; then
    echo "walkthrough: FAIL: no bash block under \"### On the CPU, end to end\" in docs/teaching.md"
    exit 1
fi
bash -e -c "$script" >build/walk.log 2>&1
rc=$?
if [ $rc -ne 0 ]; then
    tail -20 build/walk.log
    echo "walkthrough: FAIL: the commands exited $rc (log: build/walk.log)"
    exit 1
fi
trainer=$(grep -E '^step [0-9]+/[0-9]+ \| val loss' build/walk.log | tail -1 | sed 's/.*val loss //')
hf=$(grep '^transformers: val loss' build/walk.log | sed 's/.*val loss //')
sample=$(grep '^transformers, greedy:' build/walk.log)
if [ -z "$trainer" ] || [ -z "$hf" ] || [ -z "$sample" ]; then
    echo "walkthrough: FAIL: the log lacks the trainer's val loss, transformers' val loss or the sample"
    exit 1
fi
if ! python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-4)" "$trainer" "$hf"; then
    echo "walkthrough: FAIL: transformers' val loss $hf is not the trainer's last val loss $trainer (to 1e-4)"
    exit 1
fi
echo "walkthrough: PASS: every command ran; val loss: trainer $trainer, transformers $hf; $sample"
