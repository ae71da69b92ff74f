#!/usr/bin/python3
"""
Can every kernel launch with a block of 1024 threads? A check of ptxas's numbers, no GPU needed.

A kernel that compiles can still fail at every launch on a GPU with "too many resources
requested for launch": an SM gives one block at most 65536 registers (sm_80 and sm_90 alike),
allocated per warp in units of 256, so a block of 1024 threads (32 warps) fits only if each
thread uses at most 64 registers. Neither the compile nor the CPU emulator sees this (the
emulator has no registers), and CI has no GPU, so this reads what ptxas reports for each
kernel and architecture and checks the registers: at most 64 per thread, so that any block
size up to 1024 fits. It also lists each kernel's static
shared memory (ptxas itself rejects more than 48 KiB) and its spills (local memory traffic:
slower, not wrong).
The rule asks for 1024 threads whatever block the launcher uses (most use 256): simple, and
the launchers stay free to change their block size. A kernel that needs more registers
would have to declare __launch_bounds__(its block) and this check learn each kernel's block;
none comes near (the most is 38 registers, with nvcc 13.0).

    /usr/bin/python3 dev/cuda/check_launch_resources.py [--nvcc NVCC] [--arch 80 --arch 90] [FILE.cu ...]

FILEs default to train_gpt2.cu (which includes every kernel of the trainer and ZenFlow) and
each dev/cuda/*.cu that defines a kernel of its own. Exit status 1 if a kernel breaks a limit.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

REGS_PER_BLOCK = 65536    # sm_80 .. sm_90: the register file one block may use
REG_UNIT_PER_WARP = 256   # registers are allocated per warp, in units of 256
MAX_THREADS = 1024


def largest_block(regs):
    """the most threads per block (a multiple of 32, <= 1024) that regs registers per thread allow"""
    if regs == 0:
        return MAX_THREADS
    per_warp = -(-regs * 32 // REG_UNIT_PER_WARP) * REG_UNIT_PER_WARP
    return min(MAX_THREADS, REGS_PER_BLOCK // per_warp * 32)


def ptxas_report(nvcc, path, archs):
    """[(arch, mangled kernel name, registers, static smem bytes, spill bytes)] from nvcc --resource-usage"""
    gencode = []
    for a in archs:
        gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    with tempfile.TemporaryDirectory() as tmp:
        argv = [nvcc, "-O3", "-std=c++17", "-fmad=false", *gencode, "-Xcompiler", "-fopenmp",
                "--resource-usage", "-c", path, "-o", os.path.join(tmp, "k.o")]
        r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"check_launch_resources.py: nvcc failed on {path}:\n{r.stderr[-2000:]}")
    rows, name, arch, spill = [], None, None, 0
    for line in (r.stdout + r.stderr).splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for 'sm_(\d+)'", line)
        if m:
            name, arch, spill = m.group(1), m.group(2), 0
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            spill = int(m.group(1)) + int(m.group(2))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            smem = re.search(r"(\d+) bytes smem", line)
            rows.append((arch, name, int(m.group(1)), int(smem.group(1)) if smem else 0, spill))
            name = None
    return rows


def demangle(names):
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    out = r.stdout.splitlines()
    return {n: (d.split("(")[0] if d else n) for n, d in zip(names, out)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*")
    p.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    p.add_argument("--arch", action="append", help="compute capability without the dot (default: 80 and 90)")
    a = p.parse_args()
    archs = a.arch or ["80", "90"]
    files = a.files or ["train_gpt2.cu"] + sorted(
        f for f in glob.glob("dev/cuda/*.cu") if "__global__" in open(f).read())
    if not shutil.which(a.nvcc):
        print(f"check_launch_resources: SKIPPED (no {a.nvcc}: install the CUDA toolkit)")
        return 0
    rows = []
    for f in files:
        rows += ptxas_report(a.nvcc, f, archs)
    if not rows:
        sys.exit("check_launch_resources.py: ptxas reported no kernels (did --resource-usage change its format?)")
    names = demangle(sorted({r[1] for r in rows}))
    bad = 0
    seen = set()
    print(f"{'kernel':44s} {'sm':>3s} {'regs':>4s} {'block<=':>7s} {'smem':>6s} {'spill':>5s}")
    for arch, name, regs, smem, spill in sorted(rows, key=lambda r: (names[r[1]], r[0])):
        key = (name, arch)
        if key in seen:  # a header's kernel, again in another file
            continue
        seen.add(key)
        block = largest_block(regs)
        too_many = block < MAX_THREADS
        print(f"{names[name][:44]:44s} {arch:>3s} {regs:4d} {block:7d} {smem:6d} {spill:5d}"
              + (f"   FAIL: {regs} registers: a block of more than {block} threads cannot launch" if too_many else ""))
        bad += too_many
    kernels = len({r[1] for r in rows})
    spilled = sorted({names[r[1]] for r in rows if r[4] > 0})
    print(f"spills: {', '.join(spilled) if spilled else 'none'}")
    if bad:
        print(f"check_launch_resources: FAILED: {bad} kernel/architecture pair(s) over 64 registers (hint: fewer "
              f"live values per thread, or __launch_bounds__(block) and a smaller block)")
        return 1
    print(f"check_launch_resources: {kernels} kernels on sm_{', sm_'.join(archs)}: every one launches with "
          f"1024 threads per block (at most {max(r[2] for r in rows)} registers, "
          f"{max(r[3] for r in rows)} bytes of static shared memory)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
