#!/usr/bin/env python3
"""
The two trainers must tell the same story: train_gpt2cpu (train_gpt2.cpp) and the CUDA
trainer train_gpt2cu, run with the same flags on the same case, log the same losses, step
by step and in every mode. (Each trainer's numbers are checked against PyTorch by its own
test; this checks the parts those tests do not run: the main loop, the data loader, the
validation and the main.log of the real binaries.)

    /usr/bin/python3 dev/test/test_trainers_agree.py ./train_gpt2cpu <cuda trainer> <case dir>

Without a GPU the CUDA trainer is build/emu/train_gpt2cu, the CUDA source on the CPU
emulator (dev/cuda/emu). TF32 is off (-f 0). Tolerance: 2e-5 absolute per logged loss, the
CPU test's trajectory tolerance: both trainers sum in different orders (cuBLAS tiles vs the
CPU's loops), which moves the losses by a few 1e-7 per step. Prints one line per mode and
`trainers_agree: N passed, M failed`.
"""
import os
import subprocess
import sys
import tempfile

from runner import nan_first  # a nan is the largest error

STEPS = 12
TOL = 2e-5
MODES = {
    "adamw": ["-zo", "adamw"],
    "offload": ["-zo", "offload"],
    "zenflow -za cpu": ["-zo", "zenflow", "-zk", "0.2", "-zu", "3", "-zs", "6", "-zv", "1", "-za", "cpu"],
    "zenflow -za gpu": ["-zo", "zenflow", "-zk", "0.2", "-zu", "3", "-zs", "6", "-zv", "1", "-za", "gpu"],
    "zenflow warm-up, no overlap": ["-zo", "zenflow", "-zk", "0.1", "-zu", "2", "-zs", "4", "-zw", "2", "-zv", "0"],
    "offload, transfers whole (-zp 0)": ["-zo", "offload", "-zp", "0"],
    "zenflow auto U": ["-zo", "zenflow", "-zk", "0.2", "-zu", "auto", "-zs", "6", "-za", "gpu"],
}


def run(trainer, case, outdir, extra):
    argv = [trainer, "-e", f"{case}/model.bin", "-i", f"{case}/train.bin", "-j", f"{case}/train.bin",
            "-b", "4", "-t", "16", "-x", str(STEPS), "-v", "4", "-m", "2", "-s", "0", "-l", "1e-3",
            "-c", "0.1", "-o", outdir] + extra
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()[-300:]}")
    losses = {}
    with open(os.path.join(outdir, "main.log")) as f:
        for line in f:
            step, value = line.split()
            losses[f"{step} {value.split(':')[0]}"] = float(value.split(":")[1])
    return losses


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    cpu, gpu, case = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in MODES.items():
            a_dir, b_dir = os.path.join(tmp, "a"), os.path.join(tmp, "b")
            for d in (a_dir, b_dir):
                os.makedirs(d, exist_ok=True)
                for f in os.listdir(d):
                    os.remove(os.path.join(d, f))
            try:
                a = run(cpu, case, a_dir, extra)
                b = run(gpu, case, b_dir, extra + ["-f", "0"])
            except RuntimeError as e:
                failed += 1
                print(f"FAIL  {name}: {e}")
                continue
            problems = []
            if sorted(a) != sorted(b):
                problems.append(f"different log lines: {sorted(set(a) ^ set(b))[:4]}")
            worst = max((abs(a[k] - b[k]) for k in a if k in b), default=0.0, key=nan_first)
            if not worst <= TOL:
                problems.append(f"max |loss diff| {worst:.3e} > {TOL:g}")
            trl = sum(1 for k in a if k.endswith("trl"))
            if trl != STEPS or len(a) - trl != STEPS // 4 + 1:  # -v 4: at steps 0, 4, ..., STEPS
                problems.append(f"{trl} training and {len(a) - trl} val losses logged, want {STEPS} and {STEPS // 4 + 1}")
            if problems:
                failed += 1
                print(f"FAIL  {name}: {'; '.join(problems)}")
            else:
                passed += 1
                print(f"ok    {name}: {len(a)} logged losses ({trl} train, {len(a) - trl} val), "
                      f"max |diff| {worst:.2e}")
    print(f"trainers_agree: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
