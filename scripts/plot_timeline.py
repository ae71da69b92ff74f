#!/usr/bin/python3
"""Draws a timeline trace (the trainer's -tr file, Chrome trace-event JSON) as a picture: one
row per track (compute, device->host, host->device, CPU accumulator, CPU updater, waits,
top to bottom), one box per event, a faint line and label at the start of every step.
Several traces (e.g. offload and zenflow) become panels one above the other on the same
time scale, so the step lengths compare directly. Times are ms from the start of the first drawn step of each trace.

How to read it: in `offload` every step ends with a red "wait for CPU (synchronous)" box (the
loop waits while the CPU runs AdamW over every matrix); in `zenflow` the CPU's "window
update" sits on the CPU-updater row once per U steps, in parallel with the next steps'
forward/backward, and the waits row stays (nearly) empty. Events shorter than a pixel are
still drawn as a hairline. (On the CPU trainer both rows run on the same cores, so the
background update slows the compute it overlaps; on a GPU it would not.)

Usage: /usr/bin/python3 scripts/plot_timeline.py --trace offload=build/bench/trace_d2c128h4_offload.json
           --trace zenflow=build/bench/trace_d2c128h4_zenflow.json [--steps 3-10]
           --out docs/images/timeline.png [--title "..."]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # data_files, beside this script
import data_files  # noqa: E402

TRACKS = [(1, "compute"), (2, "device->host"), (3, "host->device"), (6, "CPU accumulator"),
          (4, "CPU updater"), (5, "waits")]
BACKGROUND = (4, 6)  # the CPU side's threads
COLORS = {"forward": "#4c72b0", "backward": "#55a0d8", "GPU-side AdamW": "#2ca02c",
          "select + migrate": "#9467bd", "gradients": "#8c564b", "apply": "#e377c2",
          "window update": "#dd8452", "accumulate": "#f2c48d", "wait for CPU": "#c44e52",
          "wait for CPU (synchronous)": "#8b0000"}
EXTRA_COLORS = ["#17becf", "#bcbd22", "#7f7f7f", "#ff9896", "#98df8a"]


def load(path):
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # a trace cut short by a killed run
        data = json.loads(text.rstrip().rstrip(",") + "\n]}")
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {}
    out = []
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[int(e["tid"])] = e["args"]["name"]
        elif e.get("ph") == "X":
            out.append({"tid": int(e["tid"]), "name": e["name"], "ts": float(e["ts"]) / 1e3,
                        "dur": float(e["dur"]) / 1e3,
                        "step": int(e.get("args", {}).get("step", -1))})
    return names, out


def parse_steps(spec):
    if not spec:
        return None
    a, _, b = spec.partition("-")
    try:
        return int(a), int(b or a)
    except ValueError:
        raise SystemExit(f"error: --steps {spec}: not a step or first-last (hint: e.g. --steps 5-7)")


def select(events, steps):
    """The events of the chosen steps (all if None); the background threads' events may
    carry a later step number, so they are kept by time instead."""
    if steps is None:
        return events
    lo, hi = steps
    main = [e for e in events if lo <= e["step"] <= hi and e["tid"] not in BACKGROUND]
    if not main:
        return []
    t0 = min(e["ts"] for e in main)
    t1 = max(e["ts"] + e["dur"] for e in main)
    return main + [e for e in events if e["tid"] in BACKGROUND and t0 <= e["ts"] < t1]


def plot(traces, out, steps=None, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(traces), 1, figsize=(14, 1.0 + 2.3 * len(traces)),
                             sharex=True, squeeze=False)
    seen = []
    span = 0.0
    for ax, (label, path, (names, events)) in zip(axes[:, 0], traces):
        events = select(events, steps)
        if not events:
            where = f" in steps {steps[0]}-{steps[1]}" if steps else ""
            raise SystemExit(f"error: {path}: no events{where} (hint: the trace holds the steps -tf and -tn "
                             f"named)")
        t0 = min(e["ts"] for e in events)
        span = max(span, max(e["ts"] + e["dur"] for e in events) - t0)
        ypos = {tid: len(TRACKS) - 1 - i for i, (tid, _) in enumerate(TRACKS)}
        for e in events:
            if e["tid"] not in ypos:
                ypos[e["tid"]] = -1 - (len(ypos) - len(TRACKS))
            if e["name"] not in COLORS:
                COLORS[e["name"]] = EXTRA_COLORS[len(seen) % len(EXTRA_COLORS)]
            if e["name"] not in seen:
                seen.append(e["name"])
            c = COLORS[e["name"]]
            ax.broken_barh([(e["ts"] - t0, e["dur"])], (ypos[e["tid"]] - 0.38, 0.76),
                           facecolors=c, edgecolors=c, linewidth=0.6)
        # step starts: the forward of each step
        for e in events:
            if e["tid"] == 1 and e["name"] == "forward":
                x = e["ts"] - t0
                ax.axvline(x, color="black", alpha=0.25, linewidth=0.8, linestyle="--")
                ax.text(x, len(TRACKS) - 0.45, f" step {e['step']}", fontsize=7, va="bottom",
                        ha="left", color="#444444")
        rows = sorted(ypos.items(), key=lambda kv: kv[1])
        ax.set_yticks([y for _, y in rows])
        ax.set_yticklabels([names.get(tid, dict(TRACKS).get(tid, f"track {tid}"))
                            for tid, _ in rows], fontsize=8)
        ax.set_ylim(min(ypos.values()) - 0.6, len(TRACKS) - 0.1)
        ax.set_title(label, loc="left", fontsize=10, fontweight="bold")
        ax.grid(axis="x", alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_xlim(0, span * 1.01)
    axes[-1, 0].set_xlabel("ms from the start of the first drawn step")
    handles = [Patch(color=COLORS[n], label=n) for n in seen]
    fig.legend(handles=handles, loc="lower center", ncol=min(5, len(handles)), fontsize=8,
               frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    rows_of_legend = (len(handles) + 4) // 5
    fig.tight_layout(rect=(0, (0.2 + 0.22 * rows_of_legend) / fig.get_figheight(), 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", required=True,
                    help="[label=]trace.json (repeat for several panels)")
    ap.add_argument("--steps", help="first-last step to draw (1-based, as in the trace)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title")
    args = ap.parse_args()
    traces = []
    for item in args.trace:
        label, path = data_files.split_label(item, os.path.basename(item))
        with data_files.one_line_errors(path, "a trace file (-tr)"):
            traces.append((label, path, load(path)))
    steps = parse_steps(args.steps)
    with data_files.one_line_errors(args.out, "a picture", "--out must be a path that can be written"):
        plot(traces, args.out, steps, args.title)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
