#!/usr/bin/python3
"""The importance-locality study: ZenFlow's key observation, measured on our GPT-2.

ZenFlow (arXiv 2505.12242) rests on two claims about the gradient of a weight matrix,
split into columns (input channels, spec section 1):
  (a) CONCENTRATION: a few columns carry most of the gradient's squared norm, and
  (b) LOCALITY: which columns those are changes slowly, so a top-k set chosen once stays
      good for the next S steps (S = the select interval, default 100; k = 10% of columns).
If both hold, updating only the chosen 10% of columns on the GPU every step, and the rest
on the CPU from accumulated gradients, catches most of the gradient's "energy" immediately.

This script trains (or reads a run of) the CPU trainer with `-zd`, which dumps every step's
column scores score_j = sum_o g[o, j]^2 for every matrix, and reports:

  (a) for each kind of matrix (wte, wpe, qkvw, attprojw, fcw, fcprojw; mean over layers and
      steps) and overall (mean over all matrices and steps): the share of the squared norm
      in the top 1%, 5%, 10% of columns, next to what equal columns would give (the
      "uniform" column: n/IC, the same 1%, 5%, 10% up to rounding of n).
      READ: top10% = 0.30 vs uniform 0.10 means the best tenth of the columns holds 3x
      their "fair share" of the norm. Near the uniform value = no concentration.
  (b) the overlap |top-k(t) & top-k(t+S)| / k, k = 10% of columns, mean over all t, for S
      from 1 up to the run length, with the overlap two RANDOM k-sets would have (k/IC).
      READ: 1.0 = the same columns S steps later; at the random value = a selection made S
      steps ago is no better than a random pick (no locality left at that distance).
  (c) the share of the norm of g(t+S) that the STALE top-k set of step t captures, next to
      the fresh top-k share of g(t+S) (the best possible) and the random share (k/IC).
      This is what ZenFlow actually gets: the selection is made at step t and used until
      step t+S, so (c) at S = 100 is the share of the gradient the GPU updates promptly at
      the end of a select interval, and the "interval mean" (the mean over ages 0 .. S-1)
      is the share it updates promptly on average with select interval S.

Outputs: a table on stdout, a CSV (--csv; columns table,kind,x,value,baseline) and a PNG
(--png) with three panels, one per part.

Usage:
  /usr/bin/python3 scripts/locality_study.py                      # trains, then reports
  /usr/bin/python3 scripts/locality_study.py --scores FILE        # report an existing -zd dump
Options: --model d2c128h4 --steps 300 --batch 4 --seq 64 --lr 3e-4 --mode adamw
         --workdir build/locality (the run's scores.bin and main.log) --topk 0.1
         --intervals 1,4,16,64,100,... --skip 0 --csv build/locality/locality.csv (with
         --scores: locality.csv beside FILE)
         --png docs/images/locality.png
The default run (d2c128h4, 300 steps, AdamW so the selection cannot feed back into the
scores) takes about 2 minutes on an idle 2-core machine (7 with another run beside it).
"""
import argparse
import math
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # data_files, beside this script
import data_files  # noqa: E402

MAGIC, VERSION = 20241129, 1
KINDS = ["wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"]
TOP_PCTS = [1, 5, 10]


# ----------------------------------------------------------------------------
# the -zd file

def read_scores(path):
    """Returns (names, shapes [(rows, cols)], steps (nsteps,), scores: list of (nsteps, cols)
    float64 arrays, one per matrix in file order)."""
    with open(path, "rb") as f:
        data = f.read()
    head = np.frombuffer(data, dtype="<i4", count=3)
    if head[0] != MAGIC:
        raise ValueError(f"{path}: bad magic {head[0]} (expected {MAGIC})")
    if head[1] != VERSION:
        raise ValueError(f"{path}: unsupported version {head[1]}")
    nmat = int(head[2])
    off = 12
    names, shapes = [], []
    for _ in range(nmat):
        rows, cols = np.frombuffer(data, dtype="<i4", count=2, offset=off)
        off += 8
        names.append(data[off:off + 32].split(b"\0", 1)[0].decode())
        off += 32
        shapes.append((int(rows), int(cols)))
    total_cols = sum(c for _, c in shapes)
    rec_bytes = 4 + 4 * total_cols
    nsteps = (len(data) - off) // rec_bytes
    if nsteps == 0:
        raise ValueError(f"{path}: no steps recorded")
    # a run cut short can leave a partial last record: ignore it
    rec = np.frombuffer(data, dtype=np.uint8, count=nsteps * rec_bytes, offset=off)
    rec = rec.reshape(nsteps, rec_bytes)
    steps = rec[:, :4].copy().view("<i4").reshape(nsteps)
    vals = rec[:, 4:].copy().view("<f4").reshape(nsteps, total_cols).astype(np.float64)
    scores, c0 = [], 0
    for _, cols in shapes:
        scores.append(vals[:, c0:c0 + cols])
        c0 += cols
    return names, shapes, steps, scores


def write_scores(path, names, shapes, steps, scores):
    """Writes a -zd file (used by the tests to build known examples)."""
    with open(path, "wb") as f:
        f.write(np.array([MAGIC, VERSION, len(names)], dtype="<i4").tobytes())
        for name, (rows, cols) in zip(names, shapes):
            f.write(np.array([rows, cols], dtype="<i4").tobytes())
            f.write(name.encode()[:31].ljust(32, b"\0"))
        for t, step in enumerate(steps):
            f.write(np.array([step], dtype="<i4").tobytes())
            for sc in scores:
                f.write(np.asarray(sc[t], dtype="<f4").tobytes())


def kind_of(name):
    return name.split(".")[0]


# ----------------------------------------------------------------------------
# the measures

def n_of(frac, cols):
    """Columns in a top-frac set: the trainer's n_sel = floor(k * IC + 0.5), at least 1."""
    return max(1, int(math.floor(frac * cols + 0.5)))


def top_masks(sc, n):
    """(nsteps, cols) boolean: the n largest scores of each step; ties go to the lower index
    (the spec's rule), via a stable sort of the negated scores."""
    order = np.argsort(-sc, axis=1, kind="stable")[:, :n]
    mask = np.zeros(sc.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=1)
    return mask


def top_share(sc, n):
    """Per step: the share of the step's sum of scores in its n largest columns."""
    tot = sc.sum(axis=1)
    top = -np.sort(-sc, axis=1)[:, :n].sum(axis=1)
    ok = tot > 0
    return top[ok] / tot[ok]


def overlap(mask, n, S):
    """Mean over t of |top(t) & top(t+S)| / n."""
    if S >= mask.shape[0]:
        return float("nan")
    return float((mask[:-S] & mask[S:]).sum(axis=1).mean() / n)


def stale_share(sc, mask, S):
    """Mean over t of the share of g(t+S)'s norm in the columns of top(t)."""
    if S >= sc.shape[0]:
        return float("nan")
    later = sc[S:]
    tot = later.sum(axis=1)
    ok = tot > 0
    got = (later * mask[:-S]).sum(axis=1)
    return float((got[ok] / tot[ok]).mean())


def default_intervals(nsteps):
    base = [1, 2, 4, 8, 16, 32, 64, 100]
    more = list(range(200, nsteps, 100))
    out = [s for s in base + more if s < nsteps]
    last = nsteps - 10  # the longest distance with at least 10 pairs (t, t+S) to average
    if out and last - out[-1] >= 10:
        out.append(last)
    return out


def analyse(names, shapes, scores, topk=0.1, intervals=None):
    """Returns a dict of results: per kind and 'all'.
    share[kind][pct] = (mean share, uniform), overlap[kind][S] = (mean, random),
    stale[kind][S] = (mean stale share, mean fresh share, random), plus cols per kind."""
    nsteps = scores[0].shape[0]
    if intervals is None:
        intervals = default_intervals(nsteps)
    intervals = [S for S in intervals if 0 < S < nsteps]
    per = []  # one dict per matrix
    for name, (rows, cols), sc in zip(names, shapes, scores):
        m = {"kind": kind_of(name), "cols": cols, "share": {}, "overlap": {}, "stale": {}}
        for p in TOP_PCTS:
            n = n_of(p / 100.0, cols)
            sh = top_share(sc, n)
            m["share"][p] = (float(sh.mean()) if len(sh) else float("nan"), n / cols)
        n = n_of(topk, cols)
        mask = top_masks(sc, n)
        fresh = top_share(sc, n)
        # the share a selection catches at every age d (d = 0: the step it was made from)
        by_age = [float(fresh.mean())] + [stale_share(sc, mask, d)
                                          for d in range(1, max(intervals, default=0))]
        for S in intervals:
            m["overlap"][S] = (overlap(mask, n, S), n / cols)
            fr = float(fresh[S:].mean()) if len(fresh) > S else float("nan")
            # mean over one select interval: the selection is used at ages 0 .. S-1
            m["stale"][S] = (stale_share(sc, mask, S), fr, n / cols, float(np.mean(by_age[:S])))
        per.append(m)

    kinds = [k for k in KINDS if any(m["kind"] == k for m in per)]
    kinds += sorted({m["kind"] for m in per} - set(kinds))
    res = {"kinds": kinds + ["all"], "intervals": intervals, "nsteps": nsteps,
           "share": {}, "overlap": {}, "stale": {}, "cols": {}, "count": {}}
    for kind in kinds + ["all"]:
        group = [m for m in per if kind == "all" or m["kind"] == kind]
        res["count"][kind] = len(group)
        cols = sorted({m["cols"] for m in group})
        res["cols"][kind] = "/".join(str(c) for c in cols)
        res["share"][kind] = {p: tuple(np.nanmean([m["share"][p][i] for m in group])
                                       for i in range(2)) for p in TOP_PCTS}
        res["overlap"][kind] = {S: tuple(np.nanmean([m["overlap"][S][i] for m in group])
                                         for i in range(2)) for S in intervals}
        res["stale"][kind] = {S: tuple(np.nanmean([m["stale"][S][i] for m in group])
                                       for i in range(4)) for S in intervals}
    return res


# ----------------------------------------------------------------------------
# output

def print_report(res, topk, title):
    kinds = res["kinds"]
    print(title)
    print()
    print("(a) share of the gradient's squared norm in the top columns, mean over steps"
          " (and layers); uniform = n/IC")
    head = f"| {'kind':<9}| {'mats':>4} | {'IC':>7} |"
    for p in TOP_PCTS:
        head += f" top {p}% | uniform |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for kind in kinds:
        row = f"| {kind:<9}| {res['count'][kind]:>4} | {res['cols'][kind]:>7} |"
        for p in TOP_PCTS:
            v, u = res["share"][kind][p]
            row += f" {v:>6.3f} | {u:>7.3f} |"
        print(row)
    print()
    print(f"(b) overlap |top-k(t) & top-k(t+S)| / k, k = {topk:g} of the columns, mean over t;"
          " random = k/IC")
    head = f"| {'S':>5} |" + "".join(f" {k:>8} |" for k in kinds) + f" {'random':>7} |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for S in res["intervals"]:
        row = f"| {S:>5} |" + "".join(f" {res['overlap'][k][S][0]:>8.3f} |" for k in kinds)
        row += f" {res['overlap']['all'][S][1]:>7.3f} |"
        print(row)
    print()
    print("(c) share of the norm of g(t+S) in the columns of the top-k set chosen at step t"
          " (stale), vs the best (fresh top-k of g(t+S)) and random, all matrices;\n"
          "    interval mean = the share a selection catches on average over the S steps it"
          " is used (ages 0 .. S-1), i.e. what select interval S gives")
    head = (f"| {'S':>5} | {'stale':>6} | {'fresh':>6} | {'random':>6} | stale/fresh |"
            f" interval mean |")
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for S in res["intervals"]:
        st, fr, rnd, iv = res["stale"]["all"][S]
        print(f"| {S:>5} | {st:>6.3f} | {fr:>6.3f} | {rnd:>6.3f} | {st / fr:>11.3f} |"
              f" {iv:>13.3f} |")


def write_csv(path, res):
    with open(path, "w") as f:
        f.write("table,kind,x,value,baseline\n")
        for kind in res["kinds"]:
            for p in TOP_PCTS:
                v, u = res["share"][kind][p]
                f.write(f"topshare,{kind},{p}%,{v:.6f},{u:.6f}\n")
        for kind in res["kinds"]:
            for S in res["intervals"]:
                v, r = res["overlap"][kind][S]
                f.write(f"overlap,{kind},{S},{v:.6f},{r:.6f}\n")
        for kind in res["kinds"]:
            for S in res["intervals"]:
                st, fr, r, iv = res["stale"][kind][S]
                f.write(f"stale_share,{kind},{S},{st:.6f},{r:.6f}\n")
                f.write(f"fresh_share,{kind},{S},{fr:.6f},{r:.6f}\n")
                f.write(f"interval_share,{kind},{S},{iv:.6f},{r:.6f}\n")


def mark_default_s(ax, Ss, ytext):
    """Log x axis with a tick at every measured S, and the default S = 100 marked."""
    from matplotlib.ticker import NullFormatter, NullLocator
    ax.set_xscale("log")
    ax.set_xticks(Ss)
    ax.set_xticklabels([str(S) for S in Ss], fontsize=7)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    if Ss and Ss[-1] >= 100:
        ax.axvline(100, color="red", linestyle=":", linewidth=1)
        ax.text(100, ytext, " default S=100", color="red", fontsize=8, va="bottom")


def plot(path, res, topk, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = res["kinds"]
    colors = dict(zip(kinds, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2))
    colors["all"] = "black"
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))

    # (a) grouped bars: kinds on x, one bar per top-p%, uniform as a tick over each bar
    ax = axes[0]
    width = 0.26
    x = np.arange(len(kinds))
    shades = {1: "#9ecae1", 5: "#4292c6", 10: "#08519c"}
    for i, p in enumerate(TOP_PCTS):
        vals = [res["share"][k][p][0] for k in kinds]
        unif = [res["share"][k][p][1] for k in kinds]
        xs = x + (i - 1) * width
        ax.bar(xs, vals, width, color=shades[p], label=f"top {p}% of columns")
        ax.hlines(unif, xs - width / 2, xs + width / 2, colors="red", linewidth=2,
                  label="uniform (n/IC)" if i == 0 else None)
    ax.set_xticks(x)
    ax.set_xticklabels(kinds)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of the step's squared gradient norm")
    ax.set_title("(a) concentration: norm in the top columns")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(axis="y", alpha=0.3)

    # (b) overlap vs S
    ax = axes[1]
    Ss = res["intervals"]
    for k in kinds:
        ys = [res["overlap"][k][S][0] for S in Ss]
        ax.plot(Ss, ys, marker="o", markersize=3, color=colors[k],
                linewidth=2.5 if k == "all" else 1.2, label=k)
    ax.plot(Ss, [res["overlap"]["all"][S][1] for S in Ss], "--", color="gray",
            label="random sets (k/IC)")
    mark_default_s(ax, Ss, 1.02)
    ax.set_ylim(0, 1.08)
    ax.set_xlabel("S (steps between the two top-k sets)")
    ax.set_ylabel(f"|top-k(t) & top-k(t+S)| / k,  k = {topk:g} IC")
    ax.set_title("(b) locality: overlap of top-k sets S steps apart")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)

    # (c) captured share with a stale selection (all matrices; per kind in the CSV)
    ax = axes[2]
    fresh = [res["stale"]["all"][S][1] for S in Ss]
    stale = [res["stale"]["all"][S][0] for S in Ss]
    ax.plot(Ss, fresh, "-", color="#2ca02c", linewidth=2,
            label="fresh: top-k of g(t+S) itself (the best k columns)")
    ax.plot(Ss, stale, marker="o", markersize=4, color="black", linewidth=2.5,
            label="stale: top-k chosen S steps earlier, at t")
    ax.fill_between(Ss, stale, fresh, color="#2ca02c", alpha=0.12)
    ax.plot(Ss, [res["stale"]["all"][S][3] for S in Ss], marker="s", markersize=3,
            color="#1f77b4", linewidth=1.5,
            label="mean over a select interval of S steps")
    ax.plot(Ss, [res["stale"]["all"][S][2] for S in Ss], "--", color="gray",
            label="random k columns (k/IC)")
    mark_default_s(ax, Ss, 0.6)
    ax.set_ylim(0, 1)
    ax.set_xlabel("S: age of the selection (stale), or select interval (mean)")
    ax.set_ylabel("share of g(t+S)'s squared norm in the selected columns")
    ax.set_title("(c) what a selection S steps old still catches (all)")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------

def run_trainer(args, scores_path):
    os.makedirs(args.workdir, exist_ok=True)
    cmd = [args.trainer, "-e", args.model, "-b", str(args.batch), "-t", str(args.seq),
           "-x", str(args.steps), "-l", str(args.lr), "-zo", args.mode, "-v", "0", "-s", "0",
           "-zd", scores_path, "-o", args.workdir, "-y", "2"]  # -y 2: the workdir's earlier run is replaced
    print("running: " + " ".join(cmd), file=sys.stderr)
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail = []
    for line in proc.stdout:
        tail = (tail + [line])[-20:]
        if line.startswith("step "):
            step = line.split()[1].split("/")[0]
            if step.isdigit() and (int(step) % 25 == 0 or int(step) == args.steps):
                print("  " + line.rstrip(), file=sys.stderr)
    if proc.wait() != 0:
        sys.stderr.write("".join(tail))
        sys.exit(f"the trainer failed (exit {proc.returncode})")
    print(f"trained {args.steps} steps in {time.time() - t0:.0f} s", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scores", help="an existing -zd file (skips training)")
    ap.add_argument("--trainer", default="./train_gpt2cpu")
    ap.add_argument("--model", default="d2c128h4")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--mode", default="adamw", choices=["adamw", "offload", "zenflow"])
    ap.add_argument("--workdir", default="build/locality")
    ap.add_argument("--topk", type=float, default=0.1)
    ap.add_argument("--skip", type=int, default=0, help="ignore the first N recorded steps "
                    "(e.g. the fast-changing start of a run from random init)")
    ap.add_argument("--intervals", help="comma-separated S values (default 1,2,4,...,100,"
                    "200,... up to the run length)")
    ap.add_argument("--csv", help="CSV path (default <workdir>/locality.csv; with --scores, "
                    "locality.csv beside that file)")
    ap.add_argument("--png", help="PNG path (e.g. docs/images/locality.png)")
    args = ap.parse_args()

    if args.scores:
        path = args.scores
        title = f"importance locality, {os.path.basename(path)}"
        if os.path.isfile(path + ".txt"):  # the description the run left next to its file
            with open(path + ".txt") as f:
                title = f.read().strip() or title
    else:
        path = os.path.join(args.workdir, "scores.bin")
        run_trainer(args, path)
        title = (f"importance locality, {args.model}, tinyshakespeare, B={args.batch} "
                 f"T={args.seq}, lr {args.lr:g}, {args.mode}")
        with open(path + ".txt", "w") as f:
            f.write(title + "\n")
    with data_files.one_line_errors(path, "a -zd scores file"):
        names, shapes, steps, scores = read_scores(path)
    if args.skip:
        if args.skip >= len(steps) - 1:
            sys.exit(f"--skip {args.skip}: the file has only {len(steps)} steps")
        scores = [sc[args.skip:] for sc in scores]
        steps = steps[args.skip:]
        title += f", steps {int(steps[0]) + 1}-{int(steps[-1]) + 1} (first {args.skip} skipped)"
    intervals = None
    if args.intervals:
        intervals = [int(s) for s in args.intervals.split(",") if s.strip()]
    res = analyse(names, shapes, scores, args.topk, intervals)
    title += f", {res['nsteps']} steps analysed, {len(names)} matrices"
    print_report(res, args.topk, title)
    csv = args.csv or os.path.join(args.workdir if not args.scores else
                                   os.path.dirname(os.path.abspath(path)), "locality.csv")
    write_csv(csv, res)
    print(f"\nwrote {csv}")
    if args.png:
        plot(args.png, res, args.topk, title)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
