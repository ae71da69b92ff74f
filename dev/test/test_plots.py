#!/usr/bin/python3
"""Fast check of the teaching scripts (no training, well under a minute): builds tiny
synthetic inputs (a trace, main.log files, a -zd scores file, a fake trainer that writes
them), runs every script, checks that each writes a non-empty PNG / CSV, and checks the
numbers on constructed examples whose answers are known:
  - locality: one column holding half the norm -> top-1% share 0.5; equal scores -> shares
    n/IC and overlap 1 (ties go to the lower index); the same top-k every step -> overlap 1
    and stale share = fresh share = interval mean; two disjoint top-k sets alternating ->
    overlap 0 at odd S and 1 at even S, and the interval mean of S ages known; random
    baseline n/IC; a cut-off last record is ignored;
  - bench: a trace with known durations -> exact compute / stall / CPU-update / step ms;
    the modelled PCIe bytes of offload, zenflow and adamw.
Prints `plots: N passed, M failed` and exits 1 on a failure.

Usage: /usr/bin/python3 dev/test/test_plots.py [-v]
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(ROOT, "scripts")  # the scripts under test
VERBOSE = "-v" in sys.argv


def module(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_script(name, *args):
    cmd = [sys.executable, os.path.join(SCRIPTS, name)] + [str(a) for a in args]
    res = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=120)
    if VERBOSE:
        print(res.stdout)
    if res.returncode != 0:
        raise AssertionError(f"{name} exited {res.returncode}:\n{res.stdout[-2000:]}")
    return res.stdout


def check_png(path):
    assert os.path.isfile(path), f"{path} not written"
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert os.path.getsize(path) > 5000, f"{path} is suspiciously small"


def check_csv(path, header_starts):
    assert os.path.isfile(path), f"{path} not written"
    with open(path) as f:
        lines = f.read().strip().splitlines()
    assert lines[0].startswith(header_starts), f"{path}: header {lines[0]!r}"
    assert len(lines) > 1, f"{path}: no rows"
    return lines


def close(a, b, tol=1e-9):
    assert math.isclose(a, b, rel_tol=tol, abs_tol=tol), f"{a} != {b}"


# ----------------------------------------------------------------------------
# synthetic inputs

def fake_trace(path, mode, steps=6):
    """A trace with known durations (ms): forward 100, backward 200, GPU-side AdamW 10;
    offload adds gradients 5, accumulate 7, a synchronous window update of 30 (waited for),
    apply 3; zenflow adds gradients 4 and accumulate 6 every step, and every 2nd step hands
    a 50 ms window update to the background and waits 2 ms for the previous one, with a 1 ms
    wait nested inside that (as a selection's drain is inside it: counted once)."""
    ev = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": t, "args": {"name": n}}
          for t, n in [(1, "compute"), (2, "device->host"), (3, "host->device"),
                       (4, "CPU updater"), (5, "waits"), (6, "CPU accumulator")]]
    t = 0.0

    def add(tid, name, dur, step, at=None):
        nonlocal t
        start = t if at is None else at
        ev.append({"name": name, "ph": "X", "pid": 1, "tid": tid, "ts": start * 1e3,
                   "dur": dur * 1e3, "args": {"step": step}})
        if at is None:
            t += dur

    for s in range(1, steps + 1):
        add(1, "forward", 100, s)
        add(1, "backward", 200, s)
        add(1, "GPU-side AdamW", 10, s)
        if mode == "offload":
            add(2, "gradients", 5, s)
            add(6, "accumulate", 7, s)
            add(4, "window update", 30, s, at=t)
            add(5, "wait for CPU (synchronous)", 30, s)
            add(3, "apply", 3, s)
        elif mode == "zenflow":
            add(2, "gradients", 4, s)
            add(6, "accumulate", 6, s)
            if s % 2 == 0:
                add(5, "wait for CPU", 2, s)
                add(5, "wait for CPU", 1, s, at=t - 1.5)  # nested: no more stall
                add(3, "apply", 1, s)
                # background: starts now, ends in the next step (so it carries step s+1)
                add(4, "window update", 50, s + 1, at=t)
    with open(path, "w") as f:
        json.dump({"displayTimeUnit": "ms", "traceEvents": ev}, f)


FAKE_TRAINER = r'''#!/usr/bin/python3
# a stand-in for ./train_gpt2cpu: writes -zd scores, -o main.log and -tr traces instantly
import json, os, sys
import numpy as np
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
steps = int(a.get("-x", "20"))
if "-zd" in a:
    sys.path.insert(0, os.environ["SCRIPTS"])
    import locality_study as ls
    rng = np.random.default_rng(0)
    names = ["wte", "wpe", "qkvw.0", "attprojw.0", "fcw.0", "fcprojw.0"]
    shapes = [(64, 16), (32, 16), (48, 16), (16, 16), (64, 16), (16, 64)]
    ls.write_scores(a["-zd"], names, shapes, list(range(steps)),
                    [rng.random((steps, c)) for _, c in shapes])
if "-o" in a:
    os.makedirs(a["-o"], exist_ok=True)
    with open(os.path.join(a["-o"], "main.log"), "w") as f:
        for s in range(1, steps + 1):
            f.write(f"s:{s - 1} trl:{10 - s * 0.01:f}\n")
if "-tr" in a:
    sys.path.insert(0, os.environ["TESTS"])
    import test_plots
    test_plots.fake_trace(a["-tr"], a.get("-zo", "zenflow"), steps)
for s in range(1, steps + 1):
    print(f"step {s}/{steps} | loss {10 - s * 0.01:f} | 1.0 ms | 1 tok/s")
'''


# ----------------------------------------------------------------------------
# tests

def test_locality_numbers(tmp):
    ls = module("locality_study")
    T = 12
    names = ["wte", "qkvw.0", "qkvw.1", "fcw.0", "fcprojw.0"]
    shapes = [(8, 100), (8, 100), (8, 100), (8, 100), (8, 400)]
    # wte: column 3 holds half the norm every step, the rest is spread evenly
    wte = np.full((T, 100), 50.0 / 99)
    wte[:, 3] = 50.0
    # qkvw.0: all scores equal (ties -> the lowest indices, the same set every step)
    q0 = np.ones((T, 100))
    # qkvw.1: the same top-10 set every step (columns 90..99 large), varying values
    q1 = np.ones((T, 100)) + np.arange(T)[:, None] * 0.01
    q1[:, 90:] = 100.0 + np.arange(T)[:, None]
    # fcw.0: two disjoint top-10 sets alternating (0..9 on even steps, 10..19 on odd ones)
    fc = np.ones((T, 100))
    fc[0::2, 0:10] = 100.0
    fc[1::2, 10:20] = 100.0
    # fcprojw.0: random (only checks the random baseline k/IC = 40/400)
    fp = np.random.default_rng(1).random((T, 400))
    scores = [wte, q0, q1, fc, fp]
    path = os.path.join(tmp, "known.bin")
    ls.write_scores(path, names, shapes, list(range(T)), scores)
    with open(path, "ab") as f:  # a cut-off record: must be ignored
        f.write(b"\x07\x00\x00\x00" + b"\x00" * 40)

    rn, rs, steps, rsc = ls.read_scores(path)
    assert rn == names and rs == shapes, (rn, rs)
    assert list(steps) == list(range(T)), steps
    for a, b in zip(rsc, scores):
        assert np.array_equal(a, b.astype(np.float32)), "scores do not round-trip"  # float32 both ways

    res = ls.analyse(rn, rs, rsc, topk=0.1, intervals=[1, 2, 3, 4, 11, 12])
    assert res["intervals"] == [1, 2, 3, 4, 11], res["intervals"]  # S < nsteps only
    sh = res["share"]
    close(sh["wte"][1][0], 0.5, 1e-6)                                   # top 1% = column 3
    close(sh["wte"][1][1], 0.01)
    close(sh["wte"][10][0], (50 + 9 * 50 / 99) / 100, 1e-6)
    close(sh["wte"][5][1], 0.05)
    close(res["overlap"]["wte"][1][0], 1.0)
    # qkvw mean of q0 (equal scores: share n/IC) and q1
    q1_top10 = np.mean([(10 * (100 + t)) / (10 * (100 + t) + 90 * (1 + 0.01 * t))
                        for t in range(T)])
    close(sh["qkvw"][10][0], (0.10 + q1_top10) / 2, 1e-6)
    for S in res["intervals"]:
        close(res["overlap"]["qkvw"][S][0], 1.0)
        st, fr, rnd, iv = res["stale"]["qkvw"][S]
        close(st, fr, 1e-9)
        close(iv, fr, 1e-9)
        close(rnd, 0.1)
    for S in res["intervals"]:
        close(res["overlap"]["fcw"][S][0], 1.0 if S % 2 == 0 else 0.0)
        st, fr, _, iv = res["stale"]["fcw"][S]
        want = 1000 / 1090
        close(st, want if S % 2 == 0 else 10 / 1090, 1e-6)
        close(fr, want, 1e-6)
        # used at ages 0 .. S-1: the even ages catch 1000/1090, the odd ones 10/1090
        ages = range(S)
        close(iv, sum(1000 if d % 2 == 0 else 10 for d in ages) / S / 1090, 1e-6)
    close(res["overlap"]["fcprojw"][1][1], 40 / 400)
    assert res["count"]["qkvw"] == 2 and res["count"]["all"] == 5
    # helpers directly
    assert ls.n_of(0.01, 128) == 1 and ls.n_of(0.1, 128) == 13 and ls.n_of(0.1, 512) == 51
    assert ls.default_intervals(300) == [1, 2, 4, 8, 16, 32, 64, 100, 200, 290]


def test_locality_cli(tmp):
    ls = module("locality_study")
    rng = np.random.default_rng(0)
    names = ["wte", "wpe", "qkvw.0", "attprojw.0", "fcw.0", "fcprojw.0"]
    shapes = [(64, 32), (16, 32), (96, 32), (32, 32), (128, 32), (32, 128)]
    path = os.path.join(tmp, "scores.bin")
    ls.write_scores(path, names, shapes, list(range(40)),
                    [rng.random((40, c)) ** 4 for _, c in shapes])
    png, csv = os.path.join(tmp, "loc.png"), os.path.join(tmp, "loc.csv")
    out = run_script("locality_study.py", "--scores", path, "--png", png, "--csv", csv)
    assert "(a)" in out and "(b)" in out and "(c)" in out, out
    check_png(png)
    lines = check_csv(csv, "table,kind,x,value,baseline")
    assert any(l.startswith("overlap,all,1,") for l in lines)
    assert any(l.startswith("topshare,fcprojw,10%,") for l in lines)


def test_locality_runs_trainer(tmp, trainer):
    work = os.path.join(tmp, "locrun")
    out = run_script("locality_study.py", "--trainer", trainer, "--steps", "30",
                     "--workdir", work, "--png", os.path.join(tmp, "locrun.png"))
    assert os.path.isfile(os.path.join(work, "scores.bin"))
    assert os.path.isfile(os.path.join(work, "main.log"))
    check_csv(os.path.join(work, "locality.csv"), "table,")
    check_png(os.path.join(tmp, "locrun.png"))
    assert "30 steps" in out, out


def test_bench_numbers(tmp):
    bm = module("bench_modes_cpu")
    p = os.path.join(tmp, "off.json")
    fake_trace(p, "offload", 6)
    rows = bm.step_breakdown(bm.load_trace(p), skip=2)
    assert [r["step"] for r in rows] == [3, 4, 5], rows  # step 6 has no successor
    s = bm.summarize(rows)
    close(s["step_ms"], 355.0, 1e-9)
    close(s["compute_ms"], 310.0, 1e-9)
    close(s["stall_ms"], 30.0, 1e-9)
    close(s["other_ms"], 15.0, 1e-9)
    close(s["cpu_update_ms"], 37.0, 1e-9)
    p = os.path.join(tmp, "zen.json")
    fake_trace(p, "zenflow", 7)
    s = bm.summarize(bm.step_breakdown(bm.load_trace(p), skip=2))  # steps 3..6
    close(s["step_ms"], 310 + 10 + (2 + 1) / 2, 1e-9)
    close(s["stall_ms"], 1.0, 1e-9)
    close(s["cpu_update_ms"], 6 + 50 / 2, 1e-9)
    # a trace cut short (no closing brackets) still parses
    with open(p) as f:
        text = f.read()
    with open(p, "w") as f:
        f.write(text[:text.rfind("]")].rstrip() + ",\n")
    assert len(bm.load_trace(p)) > 10
    # modelled PCIe bytes: d1c64h4
    M = 50304 * 64 + 1024 * 64 + (3 * 64 * 64 + 64 * 64 + 4 * 64 * 64 + 64 * 256)
    d2h, h2d = bm.pcie_mb("d1c64h4", "offload")
    close(d2h, M * 4 / 1e6)
    close(h2d, M * 4 / 1e6)
    assert bm.pcie_mb("d1c64h4", "adamw") == (0.0, 0.0)
    d2h, h2d = bm.pcie_mb("d1c64h4", "zenflow", 0.1, 4)
    cpu = (50304 + 1024 + 3 * 64 + 64 + 4 * 64) * (64 - 6) + 64 * (256 - 26)
    close(d2h, cpu * 4 / 1e6)
    close(h2d, cpu * 4 / 4 / 1e6)
    assert bm.pcie_mb("mystery.bin", "offload") == (None, None)


def test_bench_cli(tmp, trainer):
    csv = os.path.join(tmp, "bench.csv")
    out = run_script("bench_modes_cpu.py", "--trainer", trainer, "--model", "d1c64h4",
                     "--model", "d2c64h4", "--workdir", os.path.join(tmp, "bench"),
                     "--csv", csv, "--steps", "4", "--skip", "1")
    assert "share the same cores" in out, out
    lines = check_csv(csv, "device,model,mode,ms_per_step,compute_ms,stall_ms,cpu_update_ms,"
                      "pcie_mb_d2h,pcie_mb_h2d")
    assert len(lines) == 7, lines
    # parse-only mode with an unknown model: empty pcie cells
    fake_trace(os.path.join(tmp, "a.json"), "adamw", 5)
    csv2 = os.path.join(tmp, "bench2.csv")
    run_script("bench_modes_cpu.py", "--trace", "adamw=" + os.path.join(tmp, "a.json"),
               "--model", "custom.bin", "--skip", "2", "--csv", csv2)
    lines = check_csv(csv2, "device,")
    assert lines[1].startswith("cpu,custom.bin,adamw,310.000,310.000,0.000,0.000,,"), lines
    return csv, csv2


def test_plot_step_time(tmp, csvs):
    # its own CSV too (so this test does not depend on the bench test): two devices, an
    # unknown mode, empty cells
    own = os.path.join(tmp, "own.csv")
    with open(own, "w") as f:
        f.write("device,model,mode,ms_per_step,compute_ms,stall_ms,cpu_update_ms,"
                "pcie_mb_d2h,pcie_mb_h2d\n"
                "cpu,d4c256h4,adamw,850,849,0,0,0,0\n"
                "cpu,d4c256h4,offload,840,745,14,20,65,65\n"
                "h200,d12,zenflow,120,100,2,,,\n"
                "h200,d12,offload,600,100,480,470,500,500\n"
                "h200,d12,custom,130,110,,,,\n")
    csvs = [c for c in csvs if c] + [own]
    out = os.path.join(tmp, "step_time.png")
    run_script("plot_step_time.py", *sum((["--csv", c] for c in csvs), []), "--out", out,
               "--title", "test")
    check_png(out)


def test_plot_timeline(tmp):
    a, b = os.path.join(tmp, "t_off.json"), os.path.join(tmp, "t_zen.json")
    fake_trace(a, "offload", 5)
    fake_trace(b, "zenflow", 5)
    out = os.path.join(tmp, "timeline.png")
    run_script("plot_timeline.py", "--trace", "offload=" + a, "--trace", "zenflow=" + b,
               "--steps", "2-4", "--out", out)
    check_png(out)
    out2 = os.path.join(tmp, "timeline1.png")
    run_script("plot_timeline.py", "--trace", b, "--out", out2)
    check_png(out2)


def test_plot_loss(tmp):
    pl = module("plot_loss")
    logs = []
    for i, mode in enumerate(["adamw", "offload", "zenflow"]):
        p = os.path.join(tmp, f"{mode}.log")
        with open(p, "w") as f:
            f.write("s:0 tel:10.9\n")
            for s in range(1, 41):
                f.write(f"s:{s - 1} trl:{10 - 0.1 * s + 0.01 * i:f}\n")
                if s % 20 == 0:
                    f.write(f"s:{s} tel:{10.2 - 0.1 * s:f}\n")
        logs.append(f"{mode}={p}")
    train, val = pl.read_log(p)
    assert len(train) == 40 and [s for s, _ in val] == [0, 20, 40], val
    close(train[-1][1], 10 - 4.0 + 0.02, 1e-9)
    # the trainer's printed output works too, its steps numbered as main.log's (the train loss of
    # `step s/n` is main.log's s - 1)
    p2 = os.path.join(tmp, "stdout.log")
    with open(p2, "w") as f:
        f.write("step 0/2 | val loss 10.950000\nstep 1/2 | loss 10.9 | 2100.0 ms | 122 tok/s\n"
                "step 2/2 | loss 10.5 | 2100.0 ms | 122 tok/s | cpu 0.0 ms | moved 3\n"
                "step 2/2 | val loss 10.400000\n")
    train, val = pl.read_log(p2)
    assert train == [(0, 10.9), (1, 10.5)] and val == [(0, 10.95), (2, 10.4)], (train, val)
    out = os.path.join(tmp, "loss.png")
    run_script("plot_loss.py", *sum((["--log", l] for l in logs), []), "--out", out,
               "--smooth", "5")
    check_png(out)
    # a label only before the first "=" of a path that does not exist, and not after a "/"
    df = module("data_files")
    named = os.path.join(tmp, "lr=1e-3", "main.log")
    os.makedirs(os.path.dirname(named))
    with open(named, "w") as f:
        f.write("s:0 trl:10.0\n")
    assert df.split_label(named, "d") == ("d", named), df.split_label(named, "d")
    assert df.split_label("runs/lr=1e-3/main.log", "d") == ("d", "runs/lr=1e-3/main.log")
    assert df.split_label("fast=runs/lr=1e-3/main.log", "d") == ("fast", "runs/lr=1e-3/main.log")
    # without a label: a main.log is named by its folder (-o), any other log by its own name
    assert [pl.default_label(x) for x in (named, os.path.join(tmp, "zenflow.log"))] == ["lr=1e-3", "zenflow"]
    run_script("plot_loss.py", "--log", named, "--out", out)
    check_png(out)


def test_path_errors(tmp):
    """a missing or binary input, plot_timeline.py's --steps not a range or not in the trace, and
    prepare_tinyshakespeare.py's --out at a file or where no folder can be made, end in one line
    on stderr naming the path (or the flag), and exit 1"""
    binary = os.path.join(tmp, "binary.dat")
    with open(binary, "wb") as f:
        f.write(bytes(range(256)) * 8)
    missing = os.path.join(tmp, "missing.file")
    png = os.path.join(tmp, "e.png")
    cases = []
    for script, flag in (("plot_loss.py", "--log"), ("plot_step_time.py", "--csv"), ("plot_timeline.py", "--trace")):
        cases += [(script, [flag, path, "--out", png], path) for path in (missing, binary)]
    trace = os.path.join(tmp, "good_trace.json")  # a good trace, asked for what it does not hold
    fake_trace(trace, "zenflow", 3)
    cases += [("plot_timeline.py", ["--trace", trace, "--steps", "x", "--out", png], "--steps x"),
              ("plot_timeline.py", ["--trace", trace, "--steps", "90-95", "--out", png], "no events in steps 90-95")]
    cases += [("prepare_tinyshakespeare.py", ["--out", binary], binary),
              ("prepare_tinyshakespeare.py", ["--out", os.path.join(binary, "sub")], "binary.dat")]
    for script, args, needle in cases:
        res = subprocess.run([sys.executable, os.path.join(SCRIPTS, script)] + args, cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        lines = [l for l in res.stderr.splitlines() if l.strip()]
        assert res.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], \
            f"{script} {' '.join(args)}: exit {res.returncode}, stderr {lines[-3:]}"


def main():
    t_start = time.time()
    passed, failed = 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        trainer = os.path.join(tmp, "fake_trainer.py")
        with open(trainer, "w") as f:
            f.write(FAKE_TRAINER)
        os.chmod(trainer, 0o755)
        os.environ["SCRIPTS"] = SCRIPTS
        os.environ["TESTS"] = HERE
        csvs = []
        tests = [
            ("locality: known answers", lambda: test_locality_numbers(tmp)),
            ("locality: --scores CLI writes table, CSV, PNG", lambda: test_locality_cli(tmp)),
            ("locality: runs the trainer", lambda: test_locality_runs_trainer(tmp, trainer)),
            ("bench: trace breakdown and PCIe bytes", lambda: test_bench_numbers(tmp)),
            ("bench: CLI runs modes, writes CSV", lambda: csvs.extend(test_bench_cli(tmp, trainer))),
            ("plot_step_time", lambda: test_plot_step_time(tmp, csvs)),
            ("plot_timeline", lambda: test_plot_timeline(tmp)),
            ("plot_loss", lambda: test_plot_loss(tmp)),
            ("path errors: one line, no traceback", lambda: test_path_errors(tmp)),
        ]
        for name, fn in tests:
            t0 = time.time()
            try:
                fn()
                passed += 1
                print(f"ok    {name} ({time.time() - t0:.1f} s)")
            except Exception:
                failed += 1
                print(f"FAIL  {name}")
                traceback.print_exc()
    print(f"plots: {passed} passed, {failed} failed ({time.time() - t_start:.1f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
