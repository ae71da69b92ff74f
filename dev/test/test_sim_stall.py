#!/usr/bin/python3
"""dev/sim_stall.cpp on two tiny models (U = 4, and U = 5, for which the simulator rounds its
about 12 measured steps up to whole windows, 15): its PCIe bytes per step must be spec 7's
formula, and offload's step can hide nothing: it is at least the GPU's compute plus the CPU's
AdamW.

The bytes are worked out here from the shapes alone (spec 2's n_sel = floor(k IC + 0.5) per
matrix), independently of zenflow.h: per step, adamw moves nothing; offload every matrix
element down and up; zenflow with accumulation on the CPU the CPU-owned elements down every
step and up once a window (/U); with accumulation on the GPU both ways once a window.

  /usr/bin/python3 dev/test/test_sim_stall.py [./sim_stall]
"""
import csv
import os
import subprocess
import sys
import tempfile

K, B, T = 0.1, 2, 32
MODELS = {"d2c64h4": (2, 64), "d1c40h5": (1, 40)}  # (L, C); maxT 1024, Vp 50304 (the defaults)
RUNS = [(4, "d2c64h4,d1c40h5"), (5, "d1c40h5")]   # (U, models): a U that does not divide 12 too (15 measured)


def cpu_owned(L, C, k, maxT=1024, Vp=50304):
    mats = [(Vp, C), (maxT, C)] + [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)] * L  # (OC, IC)
    return sum(rows * (cols - int(k * cols + 0.5)) for rows, cols in mats)


def expected_mb(L, C, mode, U):
    if mode == "adamw":
        return 0.0, 0.0
    if mode == "offload":
        m = cpu_owned(L, C, 0.0) * 4 / 1e6
        return m, m
    c = cpu_owned(L, C, K) * 4 / 1e6
    return (c, c / U) if mode == "zenflow" else (c / U, c / U)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "./sim_stall"
    passed = failed = 0
    for U, models in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "sim.csv")
            subprocess.run([binary, "-m", models, "-b", str(B), "-t", str(T), "-u", str(U), "-k", str(K),
                            "-o", out], check=True, stdout=subprocess.DEVNULL)
            with open(out) as f:
                rows = list(csv.DictReader(f))
        if len(rows) != 4 * len(models.split(",")):
            sys.exit(f"FAIL: {len(rows)} rows in the CSV, expected {4 * len(models.split(','))}")
        for r in rows:
            L, C = MODELS[r["model"]]
            want = expected_mb(L, C, r["mode"], U)
            got = (float(r["pcie_mb_d2h"]), float(r["pcie_mb_h2d"]))
            # the CSV has 6 decimals of MB, i.e. whole bytes: the same to within its rounding
            ok = all(abs(g - w) < 5e-7 for g, w in zip(got, want))
            print(f"  U={U} {r['model']:8} {r['mode']:12} PCIe MB down {got[0]:.6f} up {got[1]:.6f}, spec 7: "
                  f"{want[0]:.6f} {want[1]:.6f}  {'ok' if ok else 'FAIL'}")
            passed, failed = passed + ok, failed + (not ok)
            if r["mode"] == "offload":
                step, least = float(r["ms_per_step"]), float(r["compute_ms"]) + float(r["cpu_update_ms"])
                # three values of 3 decimals each: 0.0015 ms of rounding at most
                ok = step >= least - 0.0015
                print(f"  U={U} {r['model']:8} offload step {step:.3f} ms >= compute + CPU AdamW {least:.3f} ms  "
                      f"{'ok' if ok else 'FAIL'}")
                passed, failed = passed + ok, failed + (not ok)
    print(f"sim_stall: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
