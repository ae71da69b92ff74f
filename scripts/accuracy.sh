#!/usr/bin/env bash
# Does ZenFlow keep AdamW's accuracy? Trains the same small GPT-2 (4 layers, 256 channels,
# GPT-2's vocabulary, random init) on tinyshakespeare in each mode with the CPU trainer and
# prints train and val loss side by side. The paper's claim, checked here: ZenFlow's final
# val loss within 2% of AdamW's.
#
#   bash scripts/accuracy.sh [steps]        (default 200; about 0.3 s a step on 2 cores)
#
# Modes: adamw, offload, zenflow (k 0.1, U 4) and zenflow-auto (-zu auto, spec 6). Logs go to
# build/accuracy/<mode>.log; RUN="zenflow-auto" trains only the modes named (the table is
# made from every log there of the same number of steps), SUMMARY_ONLY=1 none. A mode that
# fails is named at the end (exit 1), after the others have trained.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-200}
OUT=build/accuracy
mkdir -p "$OUT"
make -s data train_gpt2cpu >/dev/null  # data first: it installs xxhash.h, which the build needs
COMMON=(-e d4c256h4 -b 4 -t 64 -x "$STEPS" -l 1e-3 -c 0.1 -v "$STEPS" -m 32 -s 0)
MODES="adamw offload zenflow zenflow-auto"
flags() {
    case $1 in
        zenflow-auto) echo "-zo zenflow -zu auto" ;;
        *) echo "-zo $1" ;;
    esac
}
failed=""
if [ "${SUMMARY_ONLY:-0}" != 1 ]; then
    for mode in ${RUN:-$MODES}; do
        echo "training $mode ($STEPS steps)..." >&2
        # shellcheck disable=SC2046
        if ! ./train_gpt2cpu "${COMMON[@]}" $(flags "$mode") > "$OUT/$mode.log"; then
            echo "error: $mode failed (its error is above; log: $OUT/$mode.failed.log)" >&2
            failed="$failed $mode"
            mv "$OUT/$mode.log" "$OUT/$mode.failed.log"  # not in the table
        fi
    done
fi

# final val loss: the last "val loss" line; train loss: the mean of the last 20 steps
summary() {
    awk -v mode="$1" '
        index($0, "| loss ") { split($0, a, "[|] loss "); split(a[2], b, " "); loss[n++] = b[1] }
        index($0, "val loss") { val = $NF }
        END { s = 0; k = 0; for (i = n - 20; i < n; i++) if (i >= 0) { s += loss[i]; k++ }
              printf "%s %.4f %.4f\n", mode, s / k, val }' "$OUT/$1.log"
}
echo
echo "accuracy: d4c256h4 on tinyshakespeare, B=4 T=64, $STEPS steps, lr 1e-3, wd 0.1"
echo "(zenflow: k 0.1, U 4, S 100, overlap on; zenflow-auto: the same with U = auto, at most 16)"
printf "| %-12s | %-26s | %-14s | %-16s |\n" mode "train loss (last 20 steps)" "final val loss" "val vs adamw"
printf "| %-12s | %-26s | %-14s | %-16s |\n" ------------ -------------------------- -------------- ----------------
base=""
for mode in $MODES; do
    [ -f "$OUT/$mode.log" ] || continue
    # a log of another run length (an earlier call's) would compare other things
    n=$(grep -c '| loss ' "$OUT/$mode.log" || true)
    if [ "$n" != "$STEPS" ]; then
        echo "note: $OUT/$mode.log has $n steps, not $STEPS: left out (RUN=$mode to train it again)" >&2
        continue
    fi
    read -r _ train val < <(summary "$mode")
    [ "$mode" = adamw ] && base=$val
    rel="n/a (no adamw)"
    [ -n "$base" ] && rel=$(awk -v a="$val" -v b="$base" 'BEGIN { printf "%+.2f%%", 100 * (a - b) / b }')
    printf "| %-12s | %-26s | %-14s | %-16s |\n" "$mode" "$train" "$val" "$rel"
done
[ -z "$failed" ] || { echo "error: failed:$failed" >&2; exit 1; }
