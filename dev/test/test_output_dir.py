#!/usr/bin/env python3
"""
A run's output directory (-o) never loses or mixes work (llmc/checkpoint.h): every fault below,
and what must be on disk afterwards.

    /usr/bin/python3 dev/test/test_output_dir.py <trainer> <case dir> [--steps N]

<trainer> is ./train_gpt2cpu or the CUDA trainer (without a GPU: build/emu/train_gpt2cu); the
case dir a test reference (dev/test/ref/tiny). ZenFlow with overlap, so that checkpoints fall
inside windows. Each case checks the trainer's exit code and its one line, and then the files:
either every file that was there is unchanged (sha256), or the run, resumed with -y 1, ends in
a final model byte-identical to an uninterrupted run's (and, where it says so, main.log too).

 1. a second run into the same -o without -y: refused, nothing changed (where the first wrote no
    checkpoint, the hint offers -y 2, not -y 1; a -zl file in -o is not emptied); -y 2 with a
    -tr file that cannot be written: refused before anything is removed; -tr and -zl in an -o
    that does not exist yet: written there; a resume that selects nothing: its -zl file created
    anew, empty; -tr or -zl naming a file the run reads (-i, -e), the other's (also in a new
    -o), main.log (also through a link) or a checkpoint in -o: refused, nothing changed; -y 2
    replaces the run
 2. 4 KB of garbage in the newest state file; a damaged model payload (finite values): resume
    skips that checkpoint, naming it, and ends byte-identical with the same main.log (also with
    an -x at the damaged one's step: -x is checked against the checkpoint resumed); every
    checkpoint damaged: a clear error, nothing changed (a -tr file there is not emptied)
 3. two runs at once: one runs, the other stops at once naming its pid; after a kill -9 the lock
    is free again; a run that writes a checkpoint between a -y 1's choice and its lock (no lock
    file yet): the -y 1 stops, the other run's work kept
 4. SIGTERM and SIGINT during training (no -n): a checkpoint, exit 143 or 130, the resume line;
    SIGINT during validation and during the final sample: stopped there (no val line, the
    sample cut short), and the resume redoes that step's evaluation and sample (the same tokens),
    while -x at the step of a checkpoint taken on the way is refused; a second SIGINT exits at
    once; the timeline (-tr) is valid JSON; the resume line leaves out -e; SIGINT while a -y 2
    starts: the run it would replace is kept
 5. resume with another model shape, another -b, or an -x at or below the checkpoint: refused,
    nothing changed (nor a -tr file in -o); other changes are named in one line
 6. main.log holds each step once after a resume (the same file as the uninterrupted run's)
 7. disk full (a checkpoint's temporary file on /dev/full): one line, its .tmp removed, the
    earlier checkpoints unchanged, and a resume from them ends byte-identical
 8. stale .tmp files of an unfinished write are removed at start, with a note; other files kept
Prints one line per check and `output_dir: N passed, M failed`; exit 1 on failure.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runner  # noqa: E402  dev/test/runner.py

ZENFLOW = ["-zo", "zenflow", "-zk", "0.2", "-zu", "3", "-zs", "6", "-zv", "1"]
SAMPLER = "d1c8h2v97t4096"  # a random model with a long maxT, so a sample of 4000 tokens takes a while


def digests(d):
    """name -> sha256 of every file in d (but the lock, whose pid changes)"""
    out = {}
    for name in sorted(os.listdir(d)):
        if name != "lock":
            with open(os.path.join(d, name), "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def read(path):
    with open(path, "rb") as f:
        return f.read()


def err_lines(text):
    return [l for l in text.splitlines() if l.strip()]


def main():
    trainer, case, steps = runner.trainer_case_steps(__doc__, 200)
    check = runner.Checks()

    tmp = tempfile.mkdtemp(prefix="zf_outdir_")

    def argv(outdir, x, *more, model=None, opt=ZENFLOW):
        return [trainer, "-e", model or f"{case}/model.bin", "-i", f"{case}/train.bin", "-j", f"{case}/train.bin",
                "-k", os.path.join(tmp, "no_tokenizer.bin"), "-b", "4", "-t", "16", "-x", str(x), "-v", "0",
                "-s", "0", "-l", "1e-3", "-c", "0.1"] + opt + (["-o", outdir] if outdir else []) + list(more)

    def run(a, env=None):
        return subprocess.run(a, capture_output=True, text=True, timeout=1200, env=env)

    def start(a, env=None):
        return subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def d(name):
        return os.path.join(tmp, name)

    def refused(name, r, needles, before, outdir):
        """a run that must fail with one line holding every needle and change nothing"""
        problems, lines = runner.one_line_error(r, needles)
        if digests(outdir) != before:
            problems.append("files in -o changed")
        check(name, problems, f"'{lines[0] if lines else ''}', every file unchanged")

    def wait_for(cond, p, limit=600):
        t0 = time.time()
        while not cond() and p.poll() is None and time.time() - t0 < limit:
            time.sleep(0.002)

    def logged(outdir):
        try:
            return sum(1 for l in open(os.path.join(outdir, "main.log")) if " trl:" in l)
        except FileNotFoundError:
            return 0

    def resumed_same(name, outdir, ref, x, *more, same_log=False, detail="", model=None):
        """resume with -y 1 to step x; the final model (and main.log) as the reference run's"""
        r = run(argv(outdir, x, *more, "-y", "1", model=model))
        problems = []
        final = f"model_{x:08d}.bin"
        if r.returncode != 0:
            problems.append(f"resume exit {r.returncode}: {err_lines(r.stderr)[-1:]}")
        elif read(os.path.join(outdir, final)) != read(os.path.join(ref, final)):
            problems.append("final model differs from the uninterrupted run's")
        elif same_log and read(os.path.join(outdir, "main.log")) != read(os.path.join(ref, "main.log")):
            problems.append("main.log differs from the uninterrupted run's")
        check(name, problems, f"{detail}resumed to step {x}: final model byte-identical"
              + (", main.log identical" if same_log else ""))
        return r

    try:
        # the uninterrupted runs every case compares with
        ref14, base, ref_n = d("ref14"), d("base"), d("ref_n")
        r = run(argv(ref14, 14, "-n", "2"))
        r.check_returncode()
        run(argv(base, 10, "-n", "2")).check_returncode()
        run(argv(ref_n, steps, "-n", str(steps))).check_returncode()
        step_ms = [float(m) for m in re.findall(r"^step \d+/\d+ \| loss \S+ \| (\S+) ms", r.stdout, re.M)]
        # a validation pass of at least about 8 s (a forward is about a third of a step; the
        # fastest step, so that a run timed on a busy machine does not make it short)
        val_batches = max(20, int(8000 / max(1e-3, min(step_ms) / 3)))

        def copy_of(src, name):
            shutil.copytree(src, d(name))
            return d(name)

        def drop(outdir, *steps):  # (a run's last checkpoint is after its drain, spec 4.7: resume before it)
            for s in steps:
                for kind in ("model", "state", "manifest"):
                    os.remove(os.path.join(outdir, f"{kind}_{s:08d}.{'txt' if kind == 'manifest' else 'bin'}"))

        # 1. a second run without -y; then -y 2
        first = copy_of(base, "rerun")
        before = digests(first)
        refused("a second run into the same -o without -y", run(argv(first, 4, "-r", "7")),
                ["holds a run", "main.log up to step 10", "-y 1", "-y 2"], before, first)
        plain = d("plain")  # a run without checkpoints (no -n): there is nothing to continue from
        run(argv(plain, 4)).check_returncode()
        before = digests(plain)
        r = run(argv(plain, 4))
        refused("a second run where the first wrote no checkpoint", r,
                ["holds a run", "main.log up to step 4", "no checkpoint to continue from", "-y 2"], before, plain)
        check("  ... its hint does not offer -y 1", ["the hint offers -y 1"] if "-y 1" in r.stderr else [],
              "(-y 1 would start it again)")
        # the files other flags name are written only once the run's checks have passed
        logs = copy_of(base, "side_files")
        with open(os.path.join(logs, "sel.txt"), "w") as f:
            f.write("the selections of an earlier run\n")
        before = digests(logs)
        refused("a refused run with -zl into -o", run(argv(logs, 4, "-zl", os.path.join(logs, "sel.txt"))),
                ["holds a run"], before, logs)
        refused("-y 2 with a -tr that cannot be written", run(argv(logs, 4, "-y", "2", "-tr", d("none/t.json"))),
                ["flag -tr", "none/t.json"], before, logs)
        new = d("new_o")  # ... and they may be in an -o the run has yet to create
        r = run(argv(new, 4, "-zs", "2", "-tr", os.path.join(new, "t.json"), "-zl", os.path.join(new, "sel.txt")))
        problems = [] if r.returncode == 0 else [f"exit {r.returncode}: {err_lines(r.stderr)[-1:]}"]
        problems += [f"no {n}" for n in ("t.json", "sel.txt") if not problems and not os.path.exists(os.path.join(new, n))]
        check("-tr and -zl in a new -o", problems, "the run creates -o, then writes them there")
        again = copy_of(logs, "zl_resumed")  # ... and a resumed run writes them anew, selecting or not
        drop(again, 10)
        r = run(argv(again, 10, "-y", "1", "-zl", os.path.join(again, "sel.txt")))  # steps 8, 9: no selection
        problems = [] if r.returncode == 0 else [f"exit {r.returncode}: {err_lines(r.stderr)[-1:]}"]
        if not problems and read(os.path.join(again, "sel.txt")) != b"":
            problems.append("sel.txt still holds the earlier run's lines")
        check("-zl of a resumed run that selects nothing", problems, "created anew, empty")
        # ... and each is a file of its own: not one the run reads, another flag's, or one of -o's
        own = copy_of(base, "own_files")
        shard, model = os.path.join(own, "shard.bin"), os.path.join(own, "model.bin")
        shutil.copy(f"{case}/train.bin", shard)
        shutil.copy(f"{case}/model.bin", model)
        os.symlink(os.path.join(own, "main.log"), d("link.log"))
        before = digests(own)
        for name, more, needles in [
                ("-tr naming the -i shard", ["-i", shard, "-tr", shard], ["flag -tr", shard, "-i's file"]),
                ("-zl naming the -e model", ["-zl", model], ["flag -zl", "-e's file"]),
                ("-tr and -zl naming one file", ["-tr", os.path.join(own, "t.txt"), "-zl", os.path.join(own, "t.txt")],
                 ["flag -zl", "-tr's file"]),
                ("-zl naming -o's main.log", ["-zl", os.path.join(own, "main.log")], ["flag -zl", "-o's run"]),
                ("-tr naming the checkpoint -y 1 resumes", ["-tr", os.path.join(own, ".", "model_00000010.bin")],
                 ["flag -tr", "-o's run"]),
                ("-tr through a link to -o's main.log", ["-tr", d("link.log")], ["flag -tr", "-o's run"])]:
            refused(name, run(argv(own, 12, "-y", "1", *more, model=model)), needles, before, own)
        later = d("later")  # (an -o the run has yet to create)
        problems, _ = runner.one_line_error(run(argv(later, 4, "-tr", os.path.join(later, "t.json"), "-zl",
                                                     os.path.join(later, "t.json"))), ["flag -zl", "-tr's file"])
        check("-tr and -zl naming one file in a new -o", problems + (["-o created"] if os.path.exists(later) else []),
              "refused, -o not created")
        fresh4 = d("fresh4")
        run(argv(fresh4, 4, "-n", "2")).check_returncode()
        r = run(argv(first, 4, "-n", "2", "-y", "2"))
        names = sorted(n for n in os.listdir(first) if n != "lock")
        want = sorted(["main.log"] + [f"{k}_{s:08d}.{'txt' if k == 'manifest' else 'bin'}" for s in (2, 4)
                                      for k in ("manifest", "model", "state")])
        problems = [] if r.returncode == 0 else [f"exit {r.returncode}: {err_lines(r.stderr)[-1:]}"]
        if not problems and names != want:
            problems.append(f"left {names}")
        if not problems and (read(os.path.join(first, "model_00000004.bin")) != read(os.path.join(fresh4, "model_00000004.bin"))
                             or read(os.path.join(first, "main.log")) != read(os.path.join(fresh4, "main.log"))):
            problems.append("model or main.log differ from a new run's")
        check("-y 2 replaces the run", problems, "only the new run's files, model and main.log as a new run's")

        # 2. damaged checkpoints
        garbage = copy_of(base, "garbage_state")
        with open(os.path.join(garbage, "state_00000010.bin"), "r+b") as f:
            f.seek(4096)
            f.write(os.urandom(4096))
        def named_skip(r):
            """checkpoint 10 skipped, with its reason in one line, and the run resumed from 8"""
            skip = [l for l in r.stdout.splitlines() if l.startswith("skipped newer checkpoints")]
            want = "skipped newer checkpoints: 10 (state_00000010.bin does not match its checksum)"
            ok = skip == [want] and "resumed from the checkpoint of step 8" in r.stdout
            check("  ... named in one line", [] if ok else [f"stdout lines {skip}"], skip[0] if skip else "")

        named_skip(resumed_same("garbage in the newest state file", garbage, ref14, 14, "-n", "2", same_log=True))
        # -x at its step: told against the one resumed. (Its model and main.log are base's before the
        # resume too: the line that names the skip shows that it ran.)
        garbage_x = copy_of(base, "garbage_state_x")
        with open(os.path.join(garbage_x, "state_00000010.bin"), "r+b") as f:
            f.seek(4096)
            f.write(os.urandom(4096))
        named_skip(resumed_same("-x 10 where the newest checkpoint, 10, is damaged", garbage_x, base, 10, "-n", "2",
                                same_log=True))
        payload = copy_of(base, "damaged_model")
        with open(os.path.join(payload, "model_00000010.bin"), "r+b") as f:
            f.seek(1024 + 4 * 100)
            value = f.read(4)
            f.seek(1024 + 4 * 100)
            f.write(bytes([value[0] ^ 1]) + value[1:])  # the lowest mantissa bit: still finite
        r = resumed_same("a damaged model payload (finite values)", payload, ref14, 14, "-n", "2", same_log=True)
        check("  ... named in one line", [] if "skipped newer checkpoints: 10 (model_00000010.bin does not match its "
                                               "checksum)" in r.stdout else ["no skip line naming model_00000010.bin"],
              "skipped 10, resumed from 8")
        ruined = copy_of(base, "all_damaged")
        for s in range(2, 12, 2):
            with open(os.path.join(ruined, f"state_{s:08d}.bin"), "r+b") as f:
                f.seek(2048)
                f.write(b"\xff" * 64)
        with open(os.path.join(ruined, "t.json"), "w") as f:
            f.write("an earlier run's timeline\n")
        before = digests(ruined)
        refused("every checkpoint damaged (and -tr in -o)", run(argv(ruined, 14, "-n", "2", "-y", "1", "-tr",
                                                                      os.path.join(ruined, "t.json"))),
                ["no checkpoint in", "verifies", "10 (state_00000010.bin does not match", "2 (state_00000002.bin"],
                before, ruined)

        # 3. two runs at once; kill -9 leaves no lock
        both = d("both")
        a, b = start(argv(both, 10**6, "-n", "1000")), start(argv(both, 10**6, "-n", "1000"))
        t0 = time.time()
        while a.poll() is None and b.poll() is None and time.time() - t0 < 300:
            time.sleep(0.01)
        loser, winner = (a, b) if a.poll() is not None else (b, a)
        _, err = loser.communicate(timeout=60)
        lines = err_lines(err)
        problems = []
        if loser.returncode != 1 or len(lines) != 1 or f"another run is using this directory (pid {winner.pid}" not in lines[0]:
            problems.append(f"the second exited {loser.returncode}: {lines[-2:]}")
        wait_for(lambda: logged(both) >= 3, winner)
        winner.send_signal(signal.SIGTERM)
        _, err = winner.communicate(timeout=300)
        if winner.returncode != 143:
            problems.append(f"the first, on SIGTERM: exit {winner.returncode}: {err_lines(err)[-1:]}")
        stopped = logged(both)
        r = run(argv(both, stopped + 2, "-y", "1"))
        if not problems and (r.returncode != 0 or f"resumed from the checkpoint of step {stopped}" not in r.stdout):
            problems.append(f"resume of the first's checkpoint: exit {r.returncode} {err_lines(r.stderr)[-1:]}")
        check("two runs at once", problems, f"'{lines[0] if lines else ''}'; the first's checkpoint {stopped} resumes")
        killed = d("killed")
        p = start(argv(killed, 10**6))
        wait_for(lambda: logged(killed) >= 2, p)
        p.kill()
        p.communicate()
        r = run(argv(killed, 4, "-y", "1"))
        check("kill -9 leaves no stale lock", [] if r.returncode == 0 else [f"exit {r.returncode}: {err_lines(r.stderr)}"],
              "the next run takes the directory")
        # a -y 1 chooses its checkpoint before it takes the lock; where there is no lock file yet,
        # another run may write one in between. The tokenizer read from a fifo holds the first
        # run there (it is read after the choice, before the lock) while the other runs.
        raced = copy_of(base, "raced")
        os.remove(os.path.join(raced, "lock"))
        fifo = d("tokenizer.fifo")
        os.mkfifo(fifo)
        a = argv(raced, 14, "-n", "2", "-y", "1")
        a[a.index("-k") + 1] = fifo
        p = start(a)
        fd, before = -1, None
        while fd < 0 and p.poll() is None:  # (the open succeeds once the first run has the fifo open)
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.01)
        if fd >= 0:
            run(argv(raced, 12, "-n", "2", "-y", "1", "-l", "2e-3")).check_returncode()
            before = digests(raced)
            os.set_blocking(fd, True)
            tokens = b"".join(bytes([1, 33 + i % 90]) for i in range(97))  # a tokenizer of 97 one-byte tokens
            os.write(fd, b"".join(v.to_bytes(4, "little") for v in [20240328, 2, 97, 96] + [0] * 252) + tokens)
            os.close(fd)
        _, err = p.communicate(timeout=300)
        lines = err_lines(err)
        problems = [] if p.returncode == 1 and len(lines) == 1 and "checkpoints changed while this run started" in lines[0] \
            else [f"exit {p.returncode}: {lines[-2:]}"]
        check("a run written between a -y 1's choice and its lock", problems + (
            ["files in -o changed"] if not problems and digests(raced) != before else []),
            f"'{lines[0] if lines else ''}', the other run's checkpoint 12 kept")

        # 4. signals
        for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
            name = signal.Signals(sig).name
            out = d(f"{name}_training")
            trace = os.path.join(tmp, f"{name}.json")
            p = start(argv(out, steps, "-tr", trace, "-tf", "1", "-tn", "1000"))
            wait_for(lambda: logged(out) >= 3, p)
            p.send_signal(sig)
            _, err = p.communicate(timeout=300)
            lines = err_lines(err)
            stopped = logged(out)
            problems = []
            if p.returncode != code:
                problems.append(f"exit {p.returncode} (want {code}{', it finished first: raise --steps' if p.returncode == 0 else ''})")
            if len(lines) != 1 or f"interrupted ({name})" not in lines[0] or "-y 1" not in lines[0]:
                problems.append(f"stderr {lines[-2:]}")
            elif " -e " in lines[0].split("resume with:")[-1]:  # (the model is the checkpoint's)
                problems.append("the resume command names -e")
            if not os.path.exists(os.path.join(out, f"manifest_{stopped:08d}.txt")):
                problems.append(f"no checkpoint {stopped} (without -n)")
            try:
                json.load(open(trace))
            except (OSError, ValueError) as e:
                problems.append(f"the trace is not valid JSON: {e}")
            check(f"{name} during training", problems, f"'{lines[0][:90] if lines else ''}...', trace valid JSON")
            if not problems:
                resumed_same(f"  ... resumed", out, ref_n, steps, "-n", str(steps))

        # a stop while a -y 2 starts (its signal handler is in place; the model still to build):
        # the run it would replace is kept
        def catches_sigint(pid):
            try:
                caught = [l for l in open(f"/proc/{pid}/status") if l.startswith("SigCgt:")]
            except OSError:
                return False
            return bool(caught) and int(caught[0].split()[1], 16) & (1 << (signal.SIGINT - 1)) != 0

        kept = copy_of(base, "y2_stopped")
        before = digests(kept)
        p = start(argv(kept, 4, "-y", "2", model="d4c256h4"))
        wait_for(lambda: catches_sigint(p.pid), p)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=300)
        lines = err_lines(err)
        problems = [] if p.returncode == 130 else [f"exit {p.returncode} (want 130)"]
        if len(lines) != 1 or "before -y 2 replaced the run" not in lines[0]:
            problems.append(f"stderr {lines[-2:]}")
        if digests(kept) != before:
            problems.append("files in -o changed")
        check("SIGINT while a -y 2 starts", problems, f"'{lines[0][:70] if lines else ''}...', every file unchanged")

        # (from a checkpoint of step 4, so that the first validation is the one of step 5)
        out = copy_of(base, "SIGINT_validation")
        drop(out, 6, 8, 10)
        # a validation far longer than any wait here: the signal must stop it within a batch
        p = start(argv(out, steps, "-v", "5", "-m", str(1 << 20), "-y", "1"))
        for line in p.stdout:  # (main.log still holds the steps up to 10 until the resume cuts it back)
            if line.startswith(f"step 5/{steps} | loss"):
                break
        time.sleep(0.3)
        t0 = time.time()
        p.send_signal(signal.SIGINT)
        try:
            _, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # (it would validate for many minutes)
            p.kill()
            _, err = p.communicate()
        took = time.time() - t0
        text = open(os.path.join(out, "main.log")).read()
        problems = [] if p.returncode == 130 else [f"exit {p.returncode} {took:.0f} s after the signal: {err_lines(err)[-1:]}"]
        if " tel:" in text or "s:5 trl:" in text:  # (main.log's s: counts from 0: s:5 is step 6)
            problems.append(f"the interrupted validation was logged or training went on: {text.split()[-2:]}")
        manifest = os.path.join(out, "manifest_00000005.txt")
        if not os.path.exists(manifest) or "evaluated 0" not in open(manifest).read():
            problems.append("no checkpoint 5 that says its evaluation is still to do")
        check("SIGINT during validation", problems, f"stopped {took:.1f} s after the signal in a validation of "
              f"{1 << 20} batches, before its val line; checkpoint 5")
        if not problems:  # that checkpoint was taken on the way: -x 5 would finish a run it did not end
            before = digests(out)
            refused("  ... resume with -x 5 on it", run(argv(out, 5, "-n", str(steps), "-v", "5", "-m", "2", "-y", "1")),
                    ["-x 5", "step 5", "already there"], before, out)
            resumed_same("  ... resumed (the validation redone)", out, ref_n, steps, "-n", str(steps), "-v", "5",
                         "-m", "2")
            text = open(os.path.join(out, "main.log")).read()
            vals = list(range(5, steps + 1, 5)) + ([steps] if steps % 5 else [])
            check("  ... main.log", [] if all(text.count(f"s:{s} trl:") == 1 for s in range(steps)) and
                  all(text.count(f"s:{s} tel:") == 1 for s in vals) and text.count(" tel:") == len(vals)
                  else ["some step logged twice or not at all"], "each step once, the val of step 5 among them")

        out, ref_s = d("SIGINT_sampling"), d("ref_sampling")
        sample_args = ["-s", "2", "-n", "2"]
        r_ref = run(argv(ref_s, 2, *sample_args, "-g", "8", model=SAMPLER))
        p = start(argv(out, 2, *sample_args, "-g", "4000", model=SAMPLER))
        got = ""
        for line in p.stdout:
            got += line
            if line.startswith("generating"):
                break
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=300)
        tokens = len(re.findall(r"<\d+>", rest))
        problems = [] if p.returncode == 130 else [f"exit {p.returncode}: {err_lines(err)[-1:]}"]
        if tokens >= 4000:
            problems.append("the sample was not cut short")
        if "evaluated 0" not in open(os.path.join(out, "manifest_00000002.txt")).read():
            problems.append("checkpoint 2 does not say its sample is still to do")
        check("SIGINT during the final sample", problems, f"stopped after {tokens} of 4000 tokens; checkpoint 2")
        if not problems:
            r = resumed_same("  ... resumed (-x 2, the sample redone)", out, ref_s, 2, *sample_args, "-g", "8",
                             model=SAMPLER)
            sample = lambda text: re.findall(r"generating:\n---\n(.*?)\n---", text, re.S)
            check("  ... the same sample", [] if sample(r.stdout) == sample(r_ref.stdout) != [] else
                  [f"{sample(r.stdout)} != {sample(r_ref.stdout)}"], "the uninterrupted run's tokens")

        # a random init of 40 M parameters takes a while: the first SIGINT comes before it (once the resume
        # has said there is no checkpoint yet), the second during it
        out = d("second_SIGINT")
        p = start(argv(out, 10, "-y", "1", model="d2c768h12", opt=["-zo", "adamw"]))
        for line in p.stdout:
            if line.startswith("no checkpoint in"):
                break
        p.send_signal(signal.SIGINT)
        time.sleep(0.05)
        t0 = time.time()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=300)
        took = time.time() - t0
        problems = [] if p.returncode == 130 and "second signal" in err else [f"exit {p.returncode}: {err_lines(err)}"]
        if took > 1.0:
            problems.append(f"exited {took:.1f} s after the second signal")
        check("a second SIGINT", problems, f"exited {took:.2f} s after it, while the first waited for a step boundary")

        # 5. resume told something else
        told = copy_of(base, "told")
        with open(os.path.join(told, "t.json"), "w") as f:
            f.write("an earlier run's timeline\n")
        before = digests(told)
        refused("resume with another model shape", run(argv(told, 14, "-n", "2", "-y", "1", model="d4c256h4")),
                ["-e d4c256h4", "step 10", "holds L=2"], before, told)
        refused("resume with another -b", run(argv(told, 14, "-n", "2", "-y", "1", "-b", "2")),
                ["state_00000010.bin", "written with B=4 T=16, this run has B=2 T=16"], before, told)
        refused("resume with another -t", run(argv(told, 14, "-n", "2", "-y", "1", "-t", "8")),
                ["state_00000010.bin", "written with B=4 T=16, this run has B=4 T=8"], before, told)
        for flag, value in (("-zo", "offload"), ("-zk", "0.3"), ("-zs", "4"), ("-zw", "2"), ("-zv", "0"),
                            ("-za", "gpu")):
            refused(f"resume with another {flag}", run(argv(told, 14, "-n", "2", "-y", "1", flag, value)),
                    ["state_00000010.bin", "this run uses", f"{flag} {value}", "resume with the same flags"],
                    before, told)
        auto_u = ["-zo", "zenflow", "-zk", "0.2", "-zu", "auto", "-zs", "6", "-zv", "1"]
        refused("resume with another -zu", run(argv(told, 14, "-n", "2", "-y", "1", opt=auto_u)),
                ["written with -zo zenflow -zk 0.2 -zu 3 -zs 6", "this run uses -zo zenflow -zk 0.2 -zu auto -zs 6",
                 "resume with the same flags"], before, told)
        for x in (10, 6):
            refused(f"resume with -x {x} on a checkpoint of step 10", run(argv(told, x, "-n", "2", "-y", "1", "-tr",
                                                                               os.path.join(told, "t.json"))),
                    [f"-x {x}", "step 10", "already there"], before, told)
        r = run(argv(told, 12, "-n", "2", "-y", "1", "-l", "2e-3"))
        changed = [l for l in r.stdout.splitlines() if l.startswith("resuming with changed settings")]
        check("resume with other settings", [] if r.returncode == 0 and changed == [
            "resuming with changed settings: -x 12 (was 10), -l 0.002 (was 0.001)"] else [f"exit {r.returncode}, {changed}"],
            changed[0] if changed else "")

        # 7. disk full: checkpoint 6's model goes to /dev/full
        full = d("disk_full")
        p = start(argv(full, 14, "-n", "2", "-v", "6", "-m", str(val_batches)))
        saved = None
        for line in p.stdout:
            if line.startswith("step 6/14 | loss"):  # the validation of step 6 comes before its checkpoint
                saved = digests(full)
                os.symlink("/dev/full", os.path.join(full, "model_00000006.bin.tmp"))
                break
        _, err = p.communicate(timeout=600)
        lines = err_lines(err)
        problems = []
        if p.returncode != 1 or len(lines) != 1 or "No space left on device" not in lines[0]:
            problems.append(f"exit {p.returncode}, stderr {lines[-2:]}")
        now = digests(full)
        if saved is None or any(n.endswith(".tmp") for n in os.listdir(full)):
            problems.append(f"a .tmp is left: {sorted(os.listdir(full))}")
        elif {k: v for k, v in now.items() if k != "main.log"} != {k: v for k, v in saved.items() if k != "main.log"}:
            problems.append("the earlier checkpoints changed")
        check("disk full", problems, f"'{lines[0] if lines else ''}', no .tmp left, checkpoints 2 and 4 unchanged")
        if not problems:
            resumed_same("  ... resumed from checkpoint 4", full, ref14, 14, "-n", "2", "-v", "6", "-m", "2")

        # 8. stale temporary files
        stale = copy_of(base, "stale")
        drop(stale, 10)
        junk = ["model_00000012.bin.tmp", "state_00000012.bin.tmp", "manifest_00000012.txt.tmp"]
        for name in junk + ["notes.tmp"]:
            with open(os.path.join(stale, name), "wb") as f:
                f.write(b"x" * 1000)
        r = resumed_same("stale .tmp files", stale, ref14, 14, "-n", "2", same_log=True)
        note = [l for l in r.stdout.splitlines() if l.startswith("removed the temporary files")]
        left = sorted(n for n in os.listdir(stale) if n.endswith(".tmp"))
        check("  ... removed with a note, other files kept", [] if len(note) == 1 and all(j in note[0] for j in junk)
              and left == ["notes.tmp"] else [f"note {note}, left {left}"], note[0] if note else "")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return check.summary("output_dir")


if __name__ == "__main__":
    sys.exit(main())
