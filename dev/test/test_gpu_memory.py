#!/usr/bin/python3
"""
The GPU memory the trainers print at start, against scripts/gpu_memory.py's formula (the one
docs/memory.md's table comes from), part by part and to the byte:
  - the CUDA trainer (on the CPU emulator, or a GPU) prints what cuda_malloc counted at each
    allocation (llmc/gpu_memory.h); on the emulator, whose cudaMemGetInfo knows exactly what
    is allocated, the device's bytes in use must also equal the counted total: an allocation
    that bypassed cuda_malloc would show there;
  - the CPU trainer prints llmc/gpu_memory.h's formula (what the CUDA trainer would take).
Shapes and modes: each mode, C not a multiple of 32, warm-up, auto U, no overlap, k 0.25. And
seven settings the CPU trainer refuses (two shapes, T, B, k, two U), which the script refuses too.

    /usr/bin/python3 dev/test/test_gpu_memory.py <CUDA trainer> <CPU trainer> [--emulated-gpu]
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_memory  # noqa: E402

DATA = str(ROOT / "dev" / "test" / "ref" / "tiny" / "train.bin")  # ids < 97
CASES = [  # (model, B, T, trainer flags)
    ("d2c64h2v97t32", 2, 16, ["-zo", "adamw"]),
    ("d2c64h2v97t32", 2, 16, ["-zo", "offload"]),
    ("d2c64h2v97t32", 4, 32, ["-zo", "zenflow"]),
    ("d3c40h5v97t32", 2, 16, ["-zo", "zenflow", "-zk", "0.25", "-zv", "0"]),
    ("d3c40h5v97t32", 3, 8, ["-zo", "zenflow", "-zu", "auto", "-zw", "2", "-za", "gpu"]),
    ("d1c128h4v200t64", 1, 64, ["-zo", "zenflow", "-zk", "0.5", "-zu", "auto"]),
]
LINE = re.compile(r"^\[memory\] GPU (.+?) +[0-9.]+ MiB  \((\d+) bytes\)$")
IN_USE = re.compile(r"^\[memory\] device in use [0-9.]+ MiB \((\d+) bytes")


def expected(model, B, T, flags):
    f = dict(zip(flags[::2], flags[1::2]))
    L, C, NH, V, maxT = gpu_memory.parse_model(model)
    return gpu_memory.gpu_memory(L, C, NH, V, maxT, B, T, f["-zo"], float(f.get("-zk", 0.1)), int(f.get("-zv", 1)),
                                 int(f.get("-zw", 0)), f.get("-zu") == "auto")


def printed(trainer, model, B, T, flags):
    """the parts and total a trainer prints, and the device's bytes in use (None if not printed)"""
    argv = [trainer, "-e", model, "-i", DATA, "-j", DATA, "-b", str(B), "-t", str(T), "-x", "0", "-v", "0", "-s", "0",
            *flags]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip()[-300:]}")
    parts, in_use = {}, None
    for line in p.stdout.splitlines():
        m = LINE.match(line)
        if m:
            parts[m.group(1)] = int(m.group(2))
        m = IN_USE.match(line)
        if m:
            in_use = int(m.group(1))
    return parts, in_use


def main():
    args = [a for a in sys.argv[1:] if a != "--emulated-gpu"]
    emulated = "--emulated-gpu" in sys.argv
    if len(args) != 2:
        print(__doc__)
        return 2
    passed = failed = 0
    for model, B, T, flags in CASES:
        want = expected(model, B, T, flags)
        want["total"] = sum(want.values())
        for trainer in args:
            name = f"{Path(trainer).name} {model} B={B} T={T} {' '.join(flags)}"
            try:
                got, in_use = printed(trainer, model, B, T, flags)
            except RuntimeError as e:
                print(f"FAIL {name}: {e}")
                failed += 1
                continue
            bad = [f"{k}: printed {got.get(k)}, formula {v}" for k, v in want.items() if got.get(k) != v]
            if set(got) != set(want):
                bad.append(f"parts printed {sorted(got)}, expected {sorted(want)}")
            if trainer == args[0] and emulated and in_use != want["total"]:
                bad.append(f"the emulator's device has {in_use} bytes in use, the counted total is {want['total']}")
            if bad:
                print(f"FAIL {name}: " + "; ".join(bad))
                failed += 1
            else:
                extra = ", = the emulator's bytes in use" if trainer == args[0] and emulated else ""
                print(f"ok   {name}: {want['total']} bytes in {len(want) - 1} parts, as the formula{extra}")
                passed += 1
    # settings the trainers refuse: the script prints no table for them either
    for model, more in [("d4c256h3", []), ("d2c64h2v70000t32", []), ("d2c64h2v97t32", ["-t", "64"]),
                        ("d2c64h2v97t32", ["-b", "0"]), ("d2c64h2v97t32", ["-zk", "5"]),
                        ("d2c64h2v97t32", ["-zu", "abc"]), ("d2c64h2v97t32", ["-zu", "99999999"])]:
        argv = ["-e", model, "-t", "16", "-b", "2", *more]
        p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_memory.py"), *argv], capture_output=True,
                           text=True, timeout=60)
        t = subprocess.run([args[-1], *argv, "-i", DATA, "-x", "0", "-v", "0", "-s", "0"], capture_output=True,
                           text=True, timeout=600)
        lines, refusal = p.stderr.strip().splitlines(), t.stderr.strip().splitlines()[-1:]
        ok = (p.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and not p.stdout
              and t.returncode == 1 and refusal and refusal[0].startswith("error: ") and DATA not in refusal[0])
        print(f"{'ok  ' if ok else 'FAIL'} gpu_memory.py {' '.join(argv)}: one line, exit 1, as the CPU trainer refuses it"
              + ("" if ok else f": exit {p.returncode}, {p.stderr.strip()!r}, trainer exit {t.returncode}"))
        passed, failed = passed + ok, failed + (not ok)
    print(f"gpu memory: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
