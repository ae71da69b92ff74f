#!/usr/bin/python3
"""Where does a training step's time go in each optimizer mode? (CPU trainer)

Runs ./train_gpt2cpu in the three modes (adamw, offload, zenflow) for a few steps with the
timeline trace (-tr), and splits every traced step from its trace:
  compute    track 1: forward, backward, GPU-side AdamW
  stall      track 5: the training loop waiting for the CPU ("wait for CPU", "wait for CPU
             (synchronous)", and a selection's "select + migrate", spec 8); nested waits
             (a selection's drain) count once
  other      the rest of the step: the transfer stand-ins (track 2 "gradients", track 3
             "apply"), bookkeeping
  CPU update the CPU's optimizer work per step: "window update" (track 4, the updater) +
             "accumulate" (track 6, the accumulator), whether it ran in the background or
             the loop waited for it
Step time = from one step's forward to the next step's forward (so the run traces one step
more than it measures). The first --skip steps (default 8: two windows at U = 4) are
warm-up and not measured: they pay one-time costs (the first selection, the first touch of
the trainer's own moments), and skipping whole windows makes the measured steps whole
windows too, so that each window's boundary work is counted once per window.

Prints one table and writes a CSV (--csv) with the columns
  device,model,mode,ms_per_step,compute_ms,stall_ms,cpu_update_ms,pcie_mb_d2h,pcie_mb_h2d
which scripts/plot_step_time.py draws; the GPU benchmark writes the same columns. The pcie
columns here are not measured: they are the bytes a GPU would move per step for this mode,
computed from the model's matrix element counts (spec section 7, CPU accumulation;
MB = 1e6 bytes; reselections not counted), left empty when the model's shape is unknown.

READ THE NUMBERS WITH THIS IN MIND: on the CPU trainer the "GPU" (forward/backward) and the
CPU updater share the same cores, so overlapping the CPU update with training cannot hide
its cost the way it does on a GPU machine; the background update just competes with compute.
The table teaches the structure (who waits for whom), not ZenFlow's speed-up.

Usage:
  /usr/bin/python3 scripts/bench_modes_cpu.py [--model d2c128h4 [--model d4c256h4]]
      [--steps 8] [--skip 8] [--batch 4] [--seq 64] [--modes adamw,offload,zenflow]
      [--workdir build/bench] [--csv build/bench/step_time_cpu.csv] [--tag "B=1 T=16"]
  /usr/bin/python3 scripts/bench_modes_cpu.py --trace adamw=a.json --trace zenflow=z.json
      (only parse existing traces: give the traced runs' --model, --batch and --seq, which
      label the table and give its pcie columns; the CSV goes to --csv, by default over the
      benchmark's own build/bench/step_time_cpu.csv)
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

CSV_COLUMNS = ["device", "model", "mode", "ms_per_step", "compute_ms", "stall_ms",
               "cpu_update_ms", "pcie_mb_d2h", "pcie_mb_h2d"]
MODES = ["adamw", "offload", "zenflow"]
NOTE = ("note: on the CPU trainer the \"GPU\" and the CPU updater share the same cores, so "
        "overlap cannot hide the CPU's work as on a GPU machine;\n"
        "      this table teaches the structure (who waits for whom), not the speed-up.")


# ----------------------------------------------------------------------------
# the trace

def load_trace(path):
    """The trace's complete ('X') events as dicts with tid, name, ts, dur (us), step."""
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # a run killed mid-way leaves no closing brackets; the events are still usable
        data = json.loads(text.rstrip().rstrip(",") + "\n]}")
    events = data["traceEvents"] if isinstance(data, dict) else data
    out = []
    for e in events:
        if e.get("ph") != "X":
            continue
        out.append({"tid": int(e["tid"]), "name": e["name"], "ts": float(e["ts"]),
                    "dur": float(e["dur"]), "step": int(e.get("args", {}).get("step", -1))})
    return out


def union_us(intervals):
    """the total length of a set of (start, end) intervals, overlaps counted once"""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def step_breakdown(events, skip):
    """Per measured step: dict(step, step_ms, compute_ms, stall_ms, other_ms, cpu_update_ms).
    Measured steps: those after the first `skip` traced steps that have a successor."""
    starts = {}
    for e in events:
        if e["tid"] == 1 and e["name"] == "forward":
            starts[e["step"]] = e["ts"]
    steps = sorted(starts)
    if not steps:
        raise ValueError("no forward events in the trace")
    measured = [s for s in steps[skip:] if s + 1 in starts]
    if not measured:
        raise ValueError(f"the trace has {len(steps)} steps: too few to skip {skip} and "
                         "measure one (each measured step needs the next one traced)")
    rows = []
    for s in measured:
        t0, t1 = starts[s], starts[s + 1]
        mine = [e for e in events if e["step"] == s]
        compute = sum(e["dur"] for e in mine if e["tid"] == 1)
        stall = union_us([(e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == 5])
        accumulate = sum(e["dur"] for e in mine if e["name"] == "accumulate")
        # window updates: counted for the step in which they START (the background thread's
        # event carries the step in which it ended)
        window = sum(e["dur"] for e in events if e["tid"] == 4 and e["name"] != "accumulate"
                     and t0 <= e["ts"] < t1)
        step_ms = (t1 - t0) / 1e3
        rows.append({"step": s, "step_ms": step_ms, "compute_ms": compute / 1e3,
                     "stall_ms": stall / 1e3, "other_ms": step_ms - (compute + stall) / 1e3,
                     "cpu_update_ms": (accumulate + window) / 1e3})
    return rows


def summarize(rows):
    keys = ["step_ms", "compute_ms", "stall_ms", "other_ms", "cpu_update_ms"]
    return {k: sum(r[k] for r in rows) / len(rows) for k in keys} | {"steps": len(rows)}


# ----------------------------------------------------------------------------
# bytes a GPU would move (spec 7, CPU accumulation)

def model_shape(model):
    """(L, C, maxT, Vp) of a model spec d<L>c<C>h<NH>, d12/d24/d36/d48, or an llm.c .bin
    file; None if unknown."""
    presets = {"d12": (12, 768), "d24": (24, 1024), "d36": (36, 1280), "d48": (48, 1600)}
    if model in presets:
        return presets[model] + (1024, 50304)
    m = re.fullmatch(r"d(\d+)c(\d+)h(\d+)", model)
    if m:
        return int(m.group(1)), int(m.group(2)), 1024, 50304
    if os.path.isfile(model):
        import numpy as np
        head = np.fromfile(model, dtype="<i4", count=256)
        if len(head) == 256 and head[0] == 20240326:
            maxT, V, L, NH, C, Vp = (int(x) for x in head[2:8])
            return L, C, maxT, Vp
    return None


def cpu_owned_elems(model, topk):
    """The matrix elements the CPU owns at topk ratio k (spec 2: each matrix keeps its
    n_sel = floor(k IC + 0.5) top columns on the GPU), or None if the shape is unknown."""
    shape = model_shape(model)
    if shape is None:
        return None
    L, C, maxT, Vp = shape
    mats = [(Vp, C), (maxT, C)] + [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)] * L  # (OC, IC)
    return sum(rows * (cols - int(topk * cols + 0.5)) for rows, cols in mats)


def pcie_mb(model, mode, topk=0.1, update_interval=4):
    """(d2h, h2d) MB per step for the mode, or (None, None) if the shape is unknown."""
    if model_shape(model) is None:
        return None, None
    if mode == "adamw":
        return 0.0, 0.0
    if mode == "offload":
        k, U = 0.0, 1
    else:
        k, U = topk, update_interval
    cpu_elems = cpu_owned_elems(model, k)
    return cpu_elems * 4 / 1e6, cpu_elems * 4 / U / 1e6


# ----------------------------------------------------------------------------

def busy_cpu_seconds():
    """CPU-seconds all processes of this machine have run (from /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None


def run_mode(args, model, mode, trace_path):
    """Runs the trainer; returns the CPU cores other processes used meanwhile (or None)."""
    total = args.skip + args.steps + 1
    cmd = [args.trainer, "-e", model, "-b", str(args.batch), "-t", str(args.seq),
           "-x", str(total), "-zo", mode, "-v", "0", "-s", "0",
           "-tr", trace_path, "-tf", "1", "-tn", str(total)]
    # -zp 0: each transfer in one piece after the backward. On the CPU trainer a "transfer" is
    # a memcpy on the same cores, so doing it layer by layer inside the passes buys nothing,
    # and it would hide the copies inside the forward and backward boxes of the table.
    cmd += ["-zp", "0"] + args.extra
    print("running: " + " ".join(cmd), file=sys.stderr)
    t0, busy0, mine0 = time.time(), busy_cpu_seconds(), os.times()
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall, busy1, mine1 = time.time() - t0, busy_cpu_seconds(), os.times()
    if res.returncode != 0:
        sys.stderr.write(res.stdout[-3000:])
        sys.exit(f"the trainer failed in mode {mode} (exit {res.returncode})")
    others = None
    if busy0 is not None and busy1 is not None and wall > 0:
        mine = sum(mine1[:4]) - sum(mine0[:4])  # this script and the trainer
        others = max(0.0, (busy1 - busy0 - mine) / wall)
    print(f"  {total} steps in {wall:.1f} s" + (f"; other processes used {others:.2f} "
          "cores meanwhile" if others is not None else ""), file=sys.stderr)
    return others


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", default="./train_gpt2cpu")
    ap.add_argument("--model", action="append", help="model(s) to run (default d2c128h4)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--steps", type=int, default=8, help="measured steps (default 8: two "
                    "whole windows at U = 4)")
    ap.add_argument("--skip", type=int, default=8, help="warm-up steps not measured (default"
                    " 8: two whole windows at U = 4)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--topk", type=float, default=0.1, help="zenflow k (for the pcie columns;"
                    " pass -zk to the trainer with --extra)")
    ap.add_argument("--update-interval", type=int, default=4, help="zenflow U (likewise)")
    ap.add_argument("--extra", default="", help="more trainer flags, e.g. \"-zu 8\"")
    ap.add_argument("--workdir", default="build/bench")
    ap.add_argument("--trace", action="append", default=[],
                    help="mode=trace.json: parse an existing trace instead of running")
    ap.add_argument("--device", default="cpu", help="the CSV's device column")
    ap.add_argument("--tag", default="", help="appended to the model column and the trace "
                    "names, e.g. \"B=1 T=16\" for a run with other -b/-t")
    ap.add_argument("--csv", help="CSV path (default <workdir>/step_time_cpu.csv)")
    args = ap.parse_args()
    args.extra = args.extra.split()
    models = args.model or ["d2c128h4"]

    jobs = []  # (model, mode, trace path)
    others = []  # cores other processes used during each run
    if args.trace:
        for item in args.trace:
            mode, _, path = item.partition("=")
            jobs.append((models[0], mode, path))
    else:
        os.makedirs(args.workdir, exist_ok=True)
        for model in models:
            for mode in args.modes.split(","):
                tag = re.sub(r"[^A-Za-z0-9]+", "", args.tag)
                path = os.path.join(args.workdir, f"trace_{os.path.basename(model)}"
                                    f"{'_' + tag if tag else ''}_{mode}.json")
                others.append(run_mode(args, model, mode, path))
                jobs.append((model, mode, path))

    results = []
    for model, mode, path in jobs:
        summ = summarize(step_breakdown(load_trace(path), args.skip))
        d2h, h2d = pcie_mb(model, mode, args.topk, args.update_interval)
        label = os.path.basename(model) + (" " + args.tag if args.tag else "")
        results.append((label, mode, summ, d2h, h2d))

    print()
    print(f"step time by mode, CPU trainer, B={args.batch} T={args.seq}, mean of the measured "
          f"steps (first {args.skip} skipped)")
    width = max(10, max(len(r[0]) for r in results))
    head = (f"| {'model':<{width}} | {'mode':<8} | {'ms/step':>8} | {'compute':>8} | {'stall':>8} | "
            f"{'stall %':>7} | {'other':>7} | {'CPU update':>10} | {'steps':>5} |")
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    for model, mode, s, _, _ in results:
        print(f"| {model:<{width}} | {mode:<8} | {s['step_ms']:>8.1f} | "
              f"{s['compute_ms']:>8.1f} | {s['stall_ms']:>8.1f} | "
              f"{100 * s['stall_ms'] / s['step_ms']:>6.1f}% | {s['other_ms']:>7.1f} | "
              f"{s['cpu_update_ms']:>10.1f} | {s['steps']:>5} |")
    print("(ms; compute = forward + backward + GPU-side AdamW; stall = waits for the CPU, a "
          "selection included;\n other = transfers, bookkeeping; CPU update = the CPU's optimizer "
          "work per step, hidden or not)")
    print(NOTE)
    busy = [o for o in others if o is not None and o > 0.25]
    if busy:
        print(f"WARNING: other processes used up to {max(busy):.2f} CPU cores during the "
              "runs; these timings are disturbed, run again on an idle machine.")

    csv = args.csv or os.path.join(args.workdir, "step_time_cpu.csv")
    os.makedirs(os.path.dirname(os.path.abspath(csv)), exist_ok=True)
    fmt = lambda x: "" if x is None else f"{x:.3f}"
    with open(csv, "w") as f:
        f.write(",".join(CSV_COLUMNS) + "\n")
        for model, mode, s, d2h, h2d in results:
            f.write(",".join([args.device, model, mode,
                              fmt(s["step_ms"]), fmt(s["compute_ms"]), fmt(s["stall_ms"]),
                              fmt(s["cpu_update_ms"]), fmt(d2h), fmt(h2d)]) + "\n")
    print(f"wrote {csv}")


if __name__ == "__main__":
    main()
