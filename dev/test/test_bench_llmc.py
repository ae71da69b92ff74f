#!/usr/bin/python3
"""
scripts/bench_llmc.sh without a GPU: the side-by-side benchmark against llm.c's fp32 trainer
runs only on a GPU machine, whose minutes are too scarce to find a broken script there. So
this runs it with stand-ins, and checks what it does with them:
  - our trainer: the CPU emulator's build/emu/train_gpt2cu on a small model (its times mean
    nothing; the script must find them: the median of steps >= 3 of its log, computed here
    independently, and its val loss at step 0);
  - llm.c's trainer: a stand-in that first checks what llm.c needs (gpt2_124M.bin in its
    working directory, an llm.c v3 model file; the token shards of -i and -j; -b and -t as
    asked) and then prints llm.c's own lines (the printf formats of train_gpt2_fp32.cu at the
    commit scripts/get_llmc.sh pins) with step times whose median of steps >= 3 is 105 ms.

    /usr/bin/python3 dev/test/test_bench_llmc.py build/emu/train_gpt2cu
"""
import os
import re
import stat
import subprocess
import sys
import tempfile

B, T = 2, 32

# llm.c's lines: "val loss %f\n" and "step %4d/%d: train loss %f (%f ms, %d tok/s)\n"
STAND_IN = r"""#!/usr/bin/env bash
set -u
die() { echo "stand-in for llm.c: $*"; exit 3; }
[ -f gpt2_124M.bin ] || die "no gpt2_124M.bin in $PWD"
magic=$(od -An -t d4 -N 8 gpt2_124M.bin | tr -s ' ')
[ "$magic" = " 20240326 3" ] || die "gpt2_124M.bin is not an llm.c v3 model file (header:$magic)"
declare -A flag
while [ $# -gt 1 ]; do flag[$1]=$2; shift 2; done
[ $# -eq 0 ] || die "an odd argument: $1"
[ "${flag[-b]}" = %(B)d ] && [ "${flag[-t]}" = %(T)d ] || die "-b ${flag[-b]} -t ${flag[-t]}"
for f in "${flag[-i]}" "${flag[-j]}"; do [ -f "$f" ] || die "no token shard $f"; done
echo "val loss 10.987654"
for s in 1 2 3 4 5 6; do
    printf 'step %%4d/%%d: train loss %%f (%%f ms, %%d tok/s)\n' $s 6 10.9 $(( 100 + s )).5 1000
done
""" % {"B": B, "T": T}
STAND_IN_MS = 105.0  # steps 3..6: 103.5 104.5 105.5 106.5


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    trainer = sys.argv[1]
    failed = 0

    def check(ok, what):
        nonlocal failed
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}")

    with tempfile.TemporaryDirectory() as tmp:
        fake = os.path.join(tmp, "llmc_stand_in")
        with open(fake, "w") as f:
            f.write(STAND_IN)
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
        out = os.path.join(tmp, "out")
        argv = ["bash", "scripts/bench_llmc.sh", "--bin", trainer, "--llmc-bin", fake, "--out", out,
                "--model", "d2c64h2", "--seq", str(T), "--batch", str(B), "--no-gpu-check"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        print(r.stdout[-3000:], r.stderr[-3000:])
        check(r.returncode == 0, f"bench_llmc.sh exits 0 (got {r.returncode})")
        with open(os.path.join(out, "results.txt")) as f:
            rows = [line.split() for line in f]
        check(len(rows) == 1 and len(rows[0]) == 5 and rows[0][0] == str(B), f"one result line for B={B}: {rows}")
        if failed:
            return 1
        _, ms_ours, ms_llmc, val_ours, val_llmc = rows[0]
        with open(os.path.join(out, "logs", f"train_gpt2cu_B{B}.log")) as f:
            log = f.read()
        steps = [(int(s), float(ms)) for s, ms in re.findall(r"^step (\d+)/\d+ \| loss [^|]*\| ([0-9.]+) ms", log, re.M)]
        want_ours = median([ms for s, ms in steps if s >= 3])
        want_val = re.search(r"^step 0/\d+ \| val loss ([0-9.]+)", log, re.M).group(1)
        check(len(steps) == 20 and abs(float(ms_ours) - want_ours) < 1e-9,
              f"our median ms of steps >= 3: {ms_ours}, from the log {want_ours} ({len(steps)} steps)")
        check(float(ms_llmc) == STAND_IN_MS, f"llm.c's median ms of steps >= 3: {ms_llmc}, want {STAND_IN_MS}")
        check(val_ours == want_val and val_llmc == "10.987654", f"val loss at step 0: {val_ours}, {val_llmc}")
        with open(os.path.join(out, "bench_llmc.md")) as f:
            table = f.read()
        ratio = f"{float(ms_ours) / STAND_IN_MS:.3f}"
        check(f"| {B} | {float(ms_ours):.1f} |" in table and ratio in table, f"the table has our row and the ratio {ratio}")
    print(f"bench_llmc: {'FAILED' if failed else 'all checks passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
