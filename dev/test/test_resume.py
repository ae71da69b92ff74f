#!/usr/bin/env python3
"""
Checkpoints must never change a run: a resumed run ends bit for bit where an uninterrupted
one ends, in every mode, with overlap on, and also when the checkpoint falls in the middle
of a window with the CPU's update still in flight.

    /usr/bin/python3 dev/test/test_resume.py ./train_gpt2cpu <case dir> [--kills N]

1. resume: for each mode, an uninterrupted run of STEPS steps writing checkpoints every
   CKPT steps, against a run resumed from its first checkpoint (the others deleted). The
   final model files must be byte-identical and the logged losses equal.
2. kill: the trainer is killed with SIGKILL at random moments (some of them while it is
   writing a checkpoint) and resumed with -y 1 until it finishes; the final model must be
   byte-identical to the uninterrupted run's. The kill times are seeded (reproducible).
3. kill inside a write, for certain (the random kills rarely hit one: the tiny model's files
   take microseconds to write): the trainer's switch DEBUG_KILL_IN_WRITE=n kills it in its n-th
   file write, in the second checkpoint's model file, then in its state file, then in its
   manifest; only a temporary file may be left, and the resumed run removes it, starts from the
   first checkpoint (naming the second as skipped) and ends byte-identical. Killed in the first
   checkpoint's state file or manifest, the run has no checkpoint yet: the resume starts from
   scratch, naming the unfinished one, and ends byte-identical. Before each resume, a run
   without -y is refused, and offers -y 1 as a way to continue only where a checkpoint is whole.

The case dir is a test reference (dev/test/ref/tiny: model.bin, train.bin). Prints one line
per check and `resume: N passed, M failed`; exit 1 on failure.
"""
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

STEPS, CKPT = 20, 7
# U = 3 windows close after steps 3, 6, 9 (1-based): the checkpoint after step 7 holds the
# update of the window closed at step 6, which overlap applies only at step 9
MODES = {
    "adamw": ["-zo", "adamw"],
    "offload": ["-zo", "offload"],
    "zenflow": ["-zo", "zenflow", "-zk", "0.2", "-zu", "3", "-zs", "6", "-zv", "1"],
    "zenflow-sync": ["-zo", "zenflow", "-zk", "0.1", "-zu", "2", "-zs", "4", "-zw", "2", "-zv", "0"],
    # auto U (spec 6): the state file's auto block (U_max, decision, c sums); one warm-up step
    # puts the windows at steps 2-5, 6-9, so the checkpoint after step 7 is inside one, with A
    # in the gradient buffer (-za gpu)
    "zenflow-auto": ["-zo", "zenflow", "-zk", "0.1", "-zu", "auto", "-zs", "8", "-zw", "1", "-za", "gpu"],
    # every column on the GPU: the CPU owns nothing, but the windows still count (U_max 3:
    # steps 1-3, 4-6, 7-9), so the checkpoint after step 7 saves an open window that holds
    # no element (a resume that mislaid it would still train the same numbers; this checks
    # that such a file is written and read back at all)
    "zenflow-all-gpu": ["-zo", "zenflow", "-zk", "1", "-zu", "auto", "-zx", "3", "-zs", "4", "-za", "gpu"],
}


def trainer_args(trainer, case, outdir, extra):
    return [trainer, "-e", f"{case}/model.bin", "-i", f"{case}/train.bin", "-j", f"{case}/train.bin",
            "-b", "4", "-t", "16", "-x", str(STEPS), "-v", "0", "-s", "0", "-l", "1e-3", "-c", "0.1",
            "-n", str(CKPT), "-o", outdir] + extra


def losses(outdir):
    """step -> loss text from main.log, which holds each step once (a resume cuts it back)"""
    out = {}
    with open(os.path.join(outdir, "main.log")) as f:
        for line in f:
            if " trl:" in line:
                step, loss = line.split()
                if int(step[2:]) in out:
                    raise ValueError(f"{outdir}/main.log: step {step[2:]} twice")
                out[int(step[2:])] = loss[4:]
    return out


def final_model(outdir):
    with open(os.path.join(outdir, f"model_{STEPS:08d}.bin"), "rb") as f:
        return f.read()


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    trainer, case = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    kills = int(sys.argv[sys.argv.index("--kills") + 1]) if "--kills" in sys.argv else 8
    passed = failed = 0

    def report(ok, text):
        nonlocal passed, failed
        passed += ok
        failed += not ok
        print(("ok    " if ok else "FAIL  ") + text)

    with tempfile.TemporaryDirectory() as tmp:
        for mode, extra in MODES.items():
            full = os.path.join(tmp, f"{mode}_full")
            subprocess.run(trainer_args(trainer, case, full, extra), check=True, capture_output=True)
            # resume from the first checkpoint alone
            part = os.path.join(tmp, f"{mode}_part")
            os.mkdir(part)
            for name in (f"model_{CKPT:08d}.bin", f"state_{CKPT:08d}.bin", f"manifest_{CKPT:08d}.txt"):
                shutil.copy(os.path.join(full, name), part)
            with open(os.path.join(full, "main.log")) as f, open(os.path.join(part, "main.log"), "w") as g:
                g.writelines(l for l in f if int(l.split()[0][2:]) <= CKPT)
            r = subprocess.run(trainer_args(trainer, case, part, extra + ["-y", "1"]),
                               capture_output=True, text=True)
            resumed = f"resumed from the checkpoint of step {CKPT}" in r.stdout
            same_model = r.returncode == 0 and final_model(part) == final_model(full)
            same_losses = r.returncode == 0 and losses(part) == losses(full)
            report(resumed and same_model and same_losses,
                   f"{mode}: resumed at step {CKPT} of {STEPS}: final model "
                   f"{'byte-identical' if same_model else 'DIFFERENT'}, losses "
                   f"{'equal' if same_losses else 'DIFFERENT'}")

        # auto U with another -zx: the checkpoint of step 14 holds an open window of 2 steps,
        # longer than -zx 1 allows; refused with one line that names -zx, the files untouched
        mode, ck = "zenflow-all-gpu", 2 * CKPT
        part = os.path.join(tmp, "other_zx")
        os.mkdir(part)
        for name in (f"model_{ck:08d}.bin", f"state_{ck:08d}.bin", f"manifest_{ck:08d}.txt", "main.log"):
            shutil.copy(os.path.join(tmp, f"{mode}_full", name), part)
        before = {n: open(os.path.join(part, n), "rb").read() for n in os.listdir(part)}
        at = MODES[mode].index("-zx") + 1  # its value, 3
        other = MODES[mode][:at] + ["1"] + MODES[mode][at + 1:]
        r = subprocess.run(trainer_args(trainer, case, part, other + ["-y", "1"]), capture_output=True, text=True)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        named = len(lines) == 1 and "written with -zx 3, but this run uses -zx 1" in lines[0]
        after = {n: open(os.path.join(part, n), "rb").read() for n in os.listdir(part) if n != "lock"}
        report(r.returncode > 0 and named and after == before,
               f"{mode}: resumed at step {ck} with -zx 1: exit {r.returncode}, "
               f"{lines[0] if named else 'error line: ' + repr(lines[:2])}, "
               f"files {'untouched' if after == before else 'CHANGED'}")

        # kill at random moments, resume until done
        mode, extra = "zenflow", MODES["zenflow"]
        full = final_model(os.path.join(tmp, f"{mode}_full"))
        outdir = os.path.join(tmp, "killed")
        rng = random.Random(1234)
        restarts, missed = 0, 0
        for attempt in range(3 * kills + 20):
            # at the lowest priority, so that on a busy machine this reader keeps up with it
            args = ["nice", "-n", "19"] + trainer_args(trainer, case, outdir, extra + ["-y", "1"])
            p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if restarts < kills:
                # kill a little after a random step line: sometimes mid-step, sometimes while
                # the checkpoint after it is being written (every other kill aims at a
                # checkpoint step, whose files are written next). The wait is at most two of
                # the step's own times (its step line says how long it took; the tiny case's
                # steps take about a millisecond on a CPU) and the last target leaves 5 steps
                # to run, so the kill lands before the run ends (checked below).
                target = rng.choice([CKPT, 2 * CKPT]) if restarts % 2 else rng.randint(1, STEPS - 5)
                for line in p.stdout:
                    if line.startswith("step ") and "val" not in line and \
                            int(line.split()[1].split("/")[0]) >= target:
                        step_s = float(line.split("|")[2].split()[0]) / 1e3
                        time.sleep(rng.uniform(0.0, (1 if restarts % 2 else 2) * step_s))
                        break
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    restarts += 1
            _, err = p.communicate(timeout=600)
            if p.returncode == 0 and restarts < kills and missed < 2:
                # the run ended before its kill: this reader fell more than the 5 steps
                # behind the trainer (a busy machine). Start over, in an empty directory.
                missed += 1
                restarts = 0
                shutil.rmtree(outdir)
                continue
            if p.returncode == 0:
                break
            if p.returncode != -signal.SIGKILL:
                report(False, f"kill test: a resumed run failed: {err.strip()}")
                break
        done = os.path.exists(os.path.join(outdir, f"model_{STEPS:08d}.bin"))
        same = done and final_model(outdir) == full
        report(same and restarts == kills,
               f"kill test: {restarts} SIGKILLs (of {kills} asked for) at random moments, resumed with -y 1: "
               f"final model {'byte-identical' if same else 'DIFFERENT or missing'}"
               + (f" (started over {missed} times: a run ended before its kill)" if missed else ""))
        same_log = done and losses(outdir) == losses(os.path.join(tmp, f"{mode}_full"))
        report(same_log, f"kill test: main.log {'holds each step once, the losses equal' if same_log else 'DIFFERS'}")
        # a kill during a write leaves a .tmp, which the next run removes at its start
        leftovers = [n for n in os.listdir(outdir) if n.endswith(".tmp")] if os.path.isdir(outdir) else []
        report(done and leftovers == [], f"kill test: temporary files left at the end: {leftovers}"
               + ("" if done else " (FAIL: the run did not finish)"))

        # kill inside a write: writes 1, 2 and 3 are the first checkpoint's model, state and
        # manifest, 4, 5 and 6 the second's. Killed in the second, the resume starts from the
        # first (a checkpoint 14 with its model or state renamed into place but no manifest is
        # named as skipped); killed in the first's state or manifest, the run has no checkpoint
        # yet: it starts from scratch, naming step 7 as not finished.
        for n, name in ((2, f"state_{CKPT:08d}.bin"), (3, f"manifest_{CKPT:08d}.txt"),
                        (4, f"model_{2 * CKPT:08d}.bin"), (5, f"state_{2 * CKPT:08d}.bin"),
                        (6, f"manifest_{2 * CKPT:08d}.txt")):
            outdir = os.path.join(tmp, f"kill_in_write_{n}")
            env = dict(os.environ, DEBUG_KILL_IN_WRITE=str(n))
            first = subprocess.run(trainer_args(trainer, case, outdir, extra), env=env, capture_output=True)
            killed = first.returncode == -signal.SIGKILL
            left = sorted(f for f in os.listdir(outdir) if f.endswith(".tmp"))
            # a run without -y is refused; with no finished checkpoint, its hint must not offer
            # -y 1 as a way to continue
            plain = subprocess.run(trainer_args(trainer, case, outdir, extra), capture_output=True, text=True)
            hint_ok = plain.returncode != 0 and (("did not finish: -y 1 starts it again from scratch" in plain.stderr)
                                                 if n <= 3 else ("continue it with -y 1" in plain.stderr))
            r = subprocess.run(trainer_args(trainer, case, outdir, extra + ["-y", "1"]), capture_output=True,
                               text=True)
            if n <= 3:
                start_ok = f"no checkpoint in {outdir} yet; not finished: {CKPT} (no manifest" in r.stdout
                said = f"started from scratch, naming step {CKPT} as not finished: {'yes' if start_ok else 'NO'}"
            else:
                skipped = (f"skipped newer checkpoints: {2 * CKPT} (no manifest" in r.stdout) == (n > 4)
                start_ok = f"resumed from the checkpoint of step {CKPT}" in r.stdout and skipped
                said = (f"resumed from step {CKPT}{'' if n == 4 else ', the newer one named as skipped'}: "
                        f"{'yes' if start_ok else 'NO'}")
            same = r.returncode == 0 and final_model(outdir) == full
            report(killed and left == [name + ".tmp"] and hint_ok and start_ok and same,
                   f"kill inside the write of {name}: {'killed' if killed else 'NOT KILLED'}, left {left}, "
                   f"without -y refused{' offering to start again' if n <= 3 else ', offering -y 1'}: "
                   f"{'yes' if hint_ok else 'NO: ' + plain.stderr.strip()[-200:]}, {said}, "
                   f"final model {'byte-identical' if same else 'DIFFERENT or missing: ' + r.stderr.strip()[:200]}")
    print(f"resume: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
