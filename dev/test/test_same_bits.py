#!/usr/bin/env python3
"""
The CPU trainer must train to the same bits on every x86-64 machine: the same source built
for 4-float vectors (x86-64-v2, SSE), 8 (x86-64-v3, AVX2) and whatever this machine has
(-march=native: 16 with AVX-512) must log the same losses and write byte-identical models.
What could break it is a sum whose order the compiler picks by the vector width (an
`omp simd reduction`); train_gpt2.cpp's dot_fixed gives every long sum its own order.

    /usr/bin/python3 dev/test/test_same_bits.py <case dir> <native trainer> <other trainer>...

Each trainer trains two models for 8 steps in three modes: the case's model (C = 48, B*T =
64: whole blocks of 8 rows and 8 lanes) and a random init d2c36h3 with B*T = 21 (36 = 4 * 8
+ 4 and 21 = 2 * 8 + 5: the last products and the last rows, which take other paths). Every
other trainer's main.log and final model must equal the first one's, byte for byte.
A build this CPU cannot run (no AVX2 for v3) is SKIPPED by name, and the test says which
vector widths it compared. Prints one line per check and `same_bits: N passed, M failed`;
where fewer than two vector widths could run (a CPU without AVX2 runs the native build 4
floats wide, as v2), the last line says SKIPPED: the runs still compared prove nothing
about the width.
"""
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile

STEPS = 8
SHAPES = {
    "case model, C 48, B*T 64": lambda case: ["-e", f"{case}/model.bin", "-b", "4", "-t", "16"],
    "d2c36h3, C 36, B*T 21": lambda case: ["-e", "d2c36h3v97t32", "-b", "3", "-t", "7"],
}
MODES = {
    "adamw": ["-zo", "adamw"],
    "zenflow": ["-zo", "zenflow", "-zk", "0.2", "-zu", "3", "-zs", "4", "-zv", "1"],
    "zenflow auto U, -za gpu": ["-zo", "zenflow", "-zk", "0.2", "-zu", "auto", "-zs", "4", "-za", "gpu"],
}


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def can_run(trainer, flags):
    """x86-64-v3 needs AVX2 (and FMA, BMI2); the others run on any x86-64 we build on"""
    if trainer.endswith("x86-64-v3"):
        return {"avx2", "fma", "bmi2"} <= flags
    return True


def train(trainer, case, outdir, shape, mode):
    argv = [trainer] + SHAPES[shape](case) + ["-i", f"{case}/train.bin", "-j", f"{case}/train.bin",
            "-x", str(STEPS), "-v", "4", "-m", "2", "-s", "0", "-l", "1e-3", "-c", "0.1", "-n", str(STEPS),
            "-o", outdir] + MODES[mode]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {result.returncode}: "
                           f"{(result.stderr.strip().splitlines() or ['(no output)'])[-1]}")


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: test_same_bits.py <case dir> <native trainer> <other trainer>...")
    case, native, others = sys.argv[1], sys.argv[2], sys.argv[3:]
    flags = cpu_flags()
    width = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    print(f"this CPU: {width} floats a vector for the native build")
    runnable, widths = [], {width}
    for t in others:
        if can_run(t, flags):
            runnable.append(t)
            widths.add(8 if t.endswith("x86-64-v3") else 4 if t.endswith("x86-64-v2") else width)
        else:
            print(f"SKIPPED for {t}: this CPU has no AVX2")
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="zf_same_bits_") as tmp:
        for shape in SHAPES:
            for mode in MODES:
                base = os.path.join(tmp, "native")
                shutil.rmtree(base, ignore_errors=True)  # (an -o that holds a run is refused)
                try:
                    train(native, case, base, shape, mode)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"FAIL {shape}, {mode}: {e}")
                    failed += 1
                    continue
                for t in runnable:
                    out = os.path.join(tmp, "other")
                    try:
                        train(t, case, out, shape, mode)
                        same = all(filecmp.cmp(os.path.join(base, n), os.path.join(out, n), shallow=False)
                                   for n in ("main.log", f"model_{STEPS:08d}.bin"))
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        print(f"FAIL {shape}, {mode}: {e}")
                        same = False
                    print(f"{'ok  ' if same else 'FAIL'} {shape}, {mode}: {os.path.basename(t)} "
                          f"{'trains to the same bits as' if same else 'DIFFERS from'} the native build")
                    passed, failed = passed + same, failed + (not same)
                    shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(base, ignore_errors=True)
    print(f"vector widths compared: {', '.join(str(w) for w in sorted(widths))} floats")
    if len(widths) < 2 and not failed:
        print(f"same_bits: SKIPPED ({passed} runs equal, but all {width} floats wide: this CPU "
              "cannot run two vector widths)")
        sys.exit(0)
    print(f"same_bits: {passed} passed, {failed} failed")
    sys.exit(1 if failed or passed == 0 else 0)


if __name__ == "__main__":
    main()
