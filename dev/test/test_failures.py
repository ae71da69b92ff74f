#!/usr/bin/env python3
"""
Clean failure: a trainer that must stop, stops with one line that says why, a
non-zero exit, and nothing lost.

    /usr/bin/python3 dev/test/test_failures.py <trainer> <case dir> [--steps N]

<trainer> is ./train_gpt2cpu or a CUDA trainer (without a GPU: build/emu/train_gpt2cu, the
CUDA source on the CPU emulator). The case dir is a test reference (dev/test/ref/tiny).
1. Ctrl-C: SIGINT once a few steps are logged (zenflow with overlap and -n): exit 130, the
   last stderr line says "interrupted (SIGINT)", a checkpoint of the step it stopped at
   exists, and resuming it with -y 1 ends byte-identical to an uninterrupted run.
2. a failing CPU update (ZF_FAIL_AT_STEP=6, the debug switch of zenflow.h), with overlap on
   and off: exit 1, one line naming the updater and the step; a failing accumulation
   (ZF_FAIL_ACCUMULATE_AT_STEP=5, inside a window) likewise, naming the accumulator with
   overlap on; either way training stops within a step (at most one more step line).
3. a non-finite parameter (a nan planted in lnfw of the model file): refused when the file is
   loaded, before any step: exit 1, one line naming the file and the tensor lnfw, with the hint
   that no learning rate trains it (not "lower -l").
4. a loss that is not finite during training (lnfw set to 3e38, finite: the forward pass
   overflows at step 1): exit 1, one line with the step, the loss and that every parameter is
   finite, before any step line.
Prints one line per check and `failures: N passed, M failed`; exit 1 on failure.
"""
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runner  # noqa: E402  dev/test/runner.py

ZENFLOW = ["-zo", "zenflow", "-zk", "0.2", "-zu", "3", "-zs", "6", "-zv", "1"]


def base_args(trainer, case, steps, outdir=None):
    args = [trainer, "-e", f"{case}/model.bin", "-i", f"{case}/train.bin", "-j", f"{case}/train.bin",
            "-b", "4", "-t", "16", "-x", str(steps), "-v", "0", "-s", "0", "-l", "1e-3", "-c", "0.1"]
    return args + (["-o", outdir] if outdir else [])


def logged_steps(outdir):
    try:
        with open(os.path.join(outdir, "main.log")) as f:
            return sum(1 for line in f if " trl:" in line)
    except FileNotFoundError:
        return 0


def stderr_lines(text):
    return [l for l in text.splitlines() if l.strip()]


def planted_lnfw(trainer, case, tmp, name, value, count):
    """the arguments of a 5-step run on a copy of the case's model whose first `count` lnfw
    weights (None: all C) are `value` (lnfw is the second-to-last tensor: the last 2C floats
    are lnfw, lnfb)"""
    with open(f"{case}/model.bin", "rb") as f:
        data = bytearray(f.read())
    C = struct.unpack_from("<i", data, 4 * 6)[0]
    for k in range(C if count is None else count):
        struct.pack_into("<f", data, len(data) - 4 * 2 * C + 4 * k, value)
    path = os.path.join(tmp, name)
    with open(path, "wb") as f:
        f.write(data)
    argv = base_args(trainer, case, 5)
    argv[argv.index("-e") + 1] = path
    return argv


def one_line_failure(argv, needles, env=None, max_step=None, no_steps=False):
    """runs argv; the problems if it did not exit 1 with one stderr line holding every needle
    (and, with max_step, if it printed a training step line after step max_step; with no_steps,
    if it printed any)"""
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    problems, lines = runner.one_line_error(r, needles)
    steps = [int(m.group(1)) for m in re.finditer(r"^step (\d+)/\d+ \| loss", r.stdout, re.M)]
    if max_step is not None and not steps:
        problems.append("no step line before the failure (want the steps up to it)")
    elif max_step is not None and steps[-1] > max_step:
        problems.append(f"trained on to step {steps[-1]} (want at most {max_step})")
    if no_steps and steps:
        problems.append(f"printed step lines up to step {steps[-1]} (want none)")
    return problems, f"'{lines[0] if lines else ''}'"


def main():
    trainer, case, steps = runner.trainer_case_steps(__doc__, 300)
    check = runner.Checks()

    with tempfile.TemporaryDirectory() as tmp:
        # 1. SIGINT, then resume
        ref_dir, int_dir = os.path.join(tmp, "ref"), os.path.join(tmp, "int")
        ckpt = ["-n", "2"] + ZENFLOW
        subprocess.run(base_args(trainer, case, steps, ref_dir) + ckpt, check=True, capture_output=True)
        p = subprocess.Popen(base_args(trainer, case, steps, int_dir) + ckpt, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        while p.poll() is None and logged_steps(int_dir) < 3:
            time.sleep(0.001)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=300)
        lines = stderr_lines(err)
        problems = []
        if p.returncode != 130:
            problems.append(f"exit code {p.returncode} (want 130{'; it finished first: raise --steps' if p.returncode == 0 else ''})")
        if len(lines) != 1 or "interrupted (SIGINT)" not in lines[0]:
            problems.append(f"stderr {lines[-3:]}")
        stopped = logged_steps(int_dir)
        state = os.path.join(int_dir, f"state_{stopped:08d}.bin")
        if not problems and not os.path.exists(state):
            problems.append(f"no checkpoint of step {stopped} ({os.path.basename(state)})")
        if not problems:
            r = subprocess.run(base_args(trainer, case, steps, int_dir) + ckpt + ["-y", "1"], capture_output=True)
            final = f"model_{steps:08d}.bin"
            if r.returncode != 0:
                problems.append(f"resume exited {r.returncode}")
            elif open(os.path.join(int_dir, final), "rb").read() != open(os.path.join(ref_dir, final), "rb").read():
                problems.append("resumed final model differs from the uninterrupted run's")
        check("SIGINT", problems, f"stopped before step {stopped + 1}: '{lines[0] if lines else ''}'; "
              f"resumed to step {steps}, final model byte-identical")

        # 2. the CPU update fails (U = 3: a window closes at step 6), or an accumulation
        # inside a window (step 5); either stops training at the next step (7 or 6)
        fails = [("updater failure", "ZF_FAIL_AT_STEP", "6", ["CPU update", "step 6"], ["CPU update", "step 6"]),
                 ("accumulator failure", "ZF_FAIL_ACCUMULATE_AT_STEP", "5", ["CPU accumulator", "step 5"],
                  ["CPU accumulation", "step 5"])]
        for name, var, step, needles_on, needles_off in fails:
            for overlap in ("1", "0"):
                env = dict(os.environ, **{var: step})
                argv = base_args(trainer, case, 20) + ZENFLOW[:-1] + [overlap]
                # (the failed job is seen at the next step's start, or, should it not have run
                # yet, a step later: at most one more step line)
                check(f"{name}, overlap {'on' if overlap == '1' else 'off'}",
                      *one_line_failure(argv, needles_on if overlap == "1" else needles_off, env, int(step) + 1))

        # 3. a nan in lnfw (the second-to-last tensor: the last 2C floats are lnfw, lnfb)
        argv = planted_lnfw(trainer, case, tmp, "nan_model.bin", float("nan"), 1)
        problems, detail = one_line_failure(argv, ["nan_model.bin", "lnfw", "no learning rate"], no_steps=True)
        check("nan parameter", problems + (["blamed on the learning rate"] if "lower the learning rate" in detail else []),
              detail)

        # 4. finite but huge lnfw: the logits overflow, the loss is nan at step 1 (gpt2_fatal_loss)
        argv = planted_lnfw(trainer, case, tmp, "huge_model.bin", 3e38, None)
        problems, detail = one_line_failure(argv, ["step 1:", "the loss is", "all parameters are finite"],
                                            no_steps=True)
        check("non-finite loss", problems, detail)

    return check.summary("failures")


if __name__ == "__main__":
    sys.exit(main())
