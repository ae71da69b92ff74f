#!/usr/bin/python3
"""Loss curves of several runs (typically the three optimizer modes) on one chart: the
training loss of every step as a line, the val loss as points joined by a dashed line.

Reads either the trainer's main.log (`-o DIR` writes `s:<step> trl:<loss>` and
`s:<step> tel:<val loss>` lines, llm.c's format: s is the number of updates before the loss)
or the trainer's printed output (`step 12/30 | loss 7.50 ...`, main.log's s:11, and
`step 20/30 | val loss 7.1`), e.g. the logs that scripts/accuracy.sh keeps in
build/accuracy/<mode>.log.

Usage: /usr/bin/python3 scripts/plot_loss.py --log adamw=DIR1/main.log --log offload=DIR2/main.log
           --log zenflow=DIR3/main.log --out docs/images/loss.png [--smooth 10] [--title "..."]
--smooth N also draws the mean of the last N steps' training loss (the raw curve of a small
batch is noisy); the summary printed at the end gives the last-N train mean and the final
val loss of every run.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # data_files, beside this script
import data_files  # noqa: E402

TRAIN_LOG = re.compile(r"^s:(\d+)\s+trl:([-+0-9.eEnaif]+)")
VAL_LOG = re.compile(r"^s:(\d+)\s+tel:([-+0-9.eEnaif]+)")
TRAIN_OUT = re.compile(r"^step\s+(\d+)/\d+\s+\|\s+loss\s+([-+0-9.eEnaif]+)")
VAL_OUT = re.compile(r"^step\s+(\d+)/\d+\s+\|\s+val loss\s+([-+0-9.eEnaif]+)")


def read_log(path):
    """(train [(step, loss)], val [(step, loss)]) from a main.log or the trainer's output."""
    train, val = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            for rx, dst in ((TRAIN_LOG, train), (VAL_LOG, val), (TRAIN_OUT, train),
                            (VAL_OUT, val)):
                m = rx.match(line)
                if m:
                    step = int(m.group(1)) - (rx is TRAIN_OUT)  # the step line counts from 1
                    dst.append((step, float(m.group(2))))
                    break
    if not train and not val:
        raise ValueError("no loss lines (s:<step> trl:<loss>, or the trainer's step lines)")
    return train, val


def running_mean(ys, n):
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= n:
            acc -= ys[i - n]
        out.append(acc / min(i + 1, n))
    return out


def plot(runs, out, smooth=0, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, (train, val)) in enumerate(runs):
        c = colors[i % len(colors)]
        # a run identical to an earlier one (offload and adamw are, bit for bit) would hide
        # it: say so, and draw it dotted on top
        same = [l for l, (tr, va) in runs[:i] if tr == train and va == val]
        style = ":" if same else "-"
        if same:
            label += f" (identical to {same[0]})"
        if train:
            xs, ys = zip(*train)
            ax.plot(xs, ys, color=c, linewidth=0.8, alpha=0.35 if smooth else 0.9,
                    linestyle=style, label=f"{label} train" if not smooth else None)
            if smooth:
                ax.plot(xs, running_mean(list(ys), smooth), color=c, linewidth=1.8,
                        linestyle=style, label=f"{label} train (mean of {smooth} steps)")
        if val:
            xs, ys = zip(*val)
            ax.plot(xs, ys, color=c, linestyle="--" if len(val) > 2 else "none", marker="o",
                    markersize=6 - 1.5 * len(same), markeredgecolor="black",
                    markeredgewidth=0.5, linewidth=1, label=f"{label} val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def default_label(path):
    """a run's main.log is named by its folder (-o), any other log by its own name"""
    name = os.path.basename(path)
    if name == "main.log":
        return os.path.basename(os.path.dirname(os.path.abspath(path)))
    return os.path.splitext(name)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", action="append", required=True,
                    help="[label=]path (repeat; no label: a main.log is named by its folder, another log by its name)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smooth", type=int, default=0)
    ap.add_argument("--title")
    args = ap.parse_args()
    runs = []
    for item in args.log:
        label, path = data_files.split_label(item, default_label(item))
        with data_files.one_line_errors(path, "a main.log or a trainer's output"):
            runs.append((label, read_log(path)))
    with data_files.one_line_errors(args.out, "a picture", "--out must be a path that can be written"):
        plot(runs, args.out, args.smooth, args.title)
    n = args.smooth or 20
    print(f"| run | steps trained | train loss (mean of last {n}) | final val loss |")
    print("| --- | --- | --- | --- |")
    for label, (train, val) in runs:
        last = [y for _, y in train[-n:]]
        tr = f"{sum(last) / len(last):.4f}" if last else "-"
        va = f"{val[-1][1]:.4f} (step {val[-1][0]})" if val else "-"
        print(f"| {label} | {train[-1][0] + 1 if train else 0} | {tr} | {va} |")  # s: counts from 0
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
