#!/usr/bin/python3
"""Stacked bars of the step time per optimizer mode (and per model size / device), from the
step-time CSV that scripts/bench_modes_cpu.py writes (the GPU benchmark writes the same
columns: device,model,mode,ms_per_step,compute_ms,stall_ms,cpu_update_ms,pcie_mb_d2h,
pcie_mb_h2d; empty cells are allowed where a value is unknown).

Each mode gets two bars side by side:
  left, stacked, sums to the step time:  compute | stall (waiting for the CPU) |
        other (= ms_per_step - compute - stall: transfers, bookkeeping)
  right, hatched: the CPU's optimizer work per step (cpu_update_ms). When it is as tall as
        the stall, the loop waited for all of it (offload); when the stall is near zero,
        the work ran in the background (zenflow's overlap).
One panel per (device, model); several CSVs can be given and are concatenated. PCIe MB per
step, when known, is written under each mode's name.

Usage: /usr/bin/python3 scripts/plot_step_time.py --csv build/bench/step_time_cpu.csv
           [--csv more.csv] --out docs/images/step_time.png [--title "..."]
"""
import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # data_files, beside this script
import data_files  # noqa: E402

MODE_ORDER = ["adamw", "offload", "zenflow"]


def num(x):
    x = (x or "").strip()
    return float(x) if x else None


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            for r in csv.DictReader(f):
                rows.append({"device": r["device"], "model": r["model"], "mode": r["mode"],
                             "step": num(r["ms_per_step"]), "compute": num(r["compute_ms"]),
                             "stall": num(r["stall_ms"]), "cpu": num(r["cpu_update_ms"]),
                             "d2h": num(r.get("pcie_mb_d2h")),
                             "h2d": num(r.get("pcie_mb_h2d"))})
    if not rows:
        raise ValueError("no rows")
    return rows


def plot(rows, out, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = []
    for r in rows:
        key = (r["device"], r["model"])
        if key not in groups:
            groups.append(key)
    fig, axes = plt.subplots(1, len(groups), figsize=(max(6.5, 5.2 * len(groups)), 5.2),
                             squeeze=False)
    colors = {"compute": "#4c72b0", "stall": "#c44e52", "other": "#bbbbbb", "cpu": "#dd8452"}
    for ax, (device, model) in zip(axes[0], groups):
        mine = [r for r in rows if (r["device"], r["model"]) == (device, model)]
        mine.sort(key=lambda r: (MODE_ORDER.index(r["mode"]) if r["mode"] in MODE_ORDER
                                 else len(MODE_ORDER), r["mode"]))
        w = 0.36
        labels = []
        for i, r in enumerate(mine):
            step = r["step"] or 0.0
            comp = r["compute"] or 0.0
            stall = r["stall"] or 0.0
            other = max(0.0, step - comp - stall)
            x = i - w / 2
            first = i == 0
            ax.bar(x, comp, w, color=colors["compute"], label="compute" if first else None)
            ax.bar(x, stall, w, bottom=comp, color=colors["stall"],
                   label="stall (waiting for the CPU or a copy)" if first else None)
            ax.bar(x, other, w, bottom=comp + stall, color=colors["other"],
                   label="other (transfers, bookkeeping)" if first else None)
            ax.text(x, step, f"{step:.0f} ms\n{100 * stall / step if step else 0:.0f}% stall",
                    ha="center", va="bottom", fontsize=8)
            if r["cpu"] is not None:
                ax.bar(i + w / 2, r["cpu"], w, color="white", edgecolor=colors["cpu"],
                       hatch="///", label="CPU optimizer work per step" if first else None)
                ax.text(i + w / 2, r["cpu"], f"{r['cpu']:.0f}", ha="center", va="bottom",
                        fontsize=8, color="#8c4a1a")
            lab = r["mode"]
            if r["d2h"] is not None and r["h2d"] is not None:
                lab += f"\nPCIe MB/step\ndown {r['d2h']:.0f}\nup {r['h2d']:.0f}"
            labels.append(lab)
        ax.set_xticks(range(len(mine)))
        ax.set_xticklabels(labels, fontsize=9)
        ax.set_ylabel("ms per step")
        top = max((r["step"] or 0) for r in mine)
        ax.set_ylim(0, top * 1.22 if top > 0 else 1)
        ax.set_title(f"{model} on {device}")
        ax.grid(axis="y", alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    wide = len(groups) >= 2
    fig.legend(handles, names, loc="lower center", ncol=4 if wide else 2, fontsize=8,
               frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07 if wide else 0.1, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", action="append", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--title")
    args = ap.parse_args()
    with data_files.one_line_errors(", ".join(args.csv), "a step-time CSV (device,model,mode,ms_per_step,...)"):
        rows = load(args.csv)
    with data_files.one_line_errors(args.out, "a picture", "--out must be a path that can be written"):
        plot(rows, args.out, args.title)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
