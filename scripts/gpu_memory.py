"""
The CUDA trainer's GPU memory, part by part, computed from the shapes, and the table of
docs/memory.md: which of GPT-2's sizes fit on which GPU in each optimizer mode.

This is llmc/gpu_memory.h's formula in Python (the CPU trainer prints that one; the CUDA
trainer prints what it counted at each cudaMalloc; dev/test/test_gpu_memory.py checks that
the three agree to the byte). All of it is fp32, as the trainers are: parameters and
gradients 4 bytes each per parameter; AdamW's m and v 8 bytes per parameter that the GPU
updates (adamw: all; offload: the vectors; zenflow: the vectors and k of every matrix's
columns); ZenFlow's staging buffers 4 bytes per CPU-owned matrix element, twice with overlap
(one carries the gradients down while the other holds the window's result on its way up);
the activations of a batch (B, T) as train_gpt2.cu keeps them, no recomputation.

    python3 scripts/gpu_memory.py            # the table of docs/memory.md
    python3 scripts/gpu_memory.py -e d12 -b 4 -t 1024 -zo zenflow [-zk 0.1 -zv 1 -zw 0 -zu 4]
                                             # one setting, the lines the trainers print
-e takes what the trainers take: d12, d24, d36, d48, d<L>c<C>h<NH>[v<V>][t<maxT>], or a model file.
"""

import argparse
import re
import struct
import sys

MIB = 1048576
PARTS = ["parameters", "gradients", "moments (m, v)", "activations", "cuBLASLt workspace", "staging", "other"]
GPT2_SIZES = {12: (768, 12), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25)}  # L: (C, NH)
GPT2_NAMES = {12: "124M", 24: "350M", 36: "774M", 48: "1.5B"}
GPUS_GB = [24, 40, 80, 141]
CONTEXT_ALLOWANCE = 1 << 30  # the CUDA context, cuBLASLt's handle, fragmentation: not counted


def pad_vocab(V):
    return (V + 127) // 128 * 128


def parse_model(spec):
    """(L, C, NH, V, maxT) from a spec as llmc/gpt2_file.h reads it, or from a model file's header"""
    m = re.fullmatch(r"d(\d+)(?:c(\d+)h(\d+))?(?:v(\d+))?(?:t(\d+))?", spec)
    if m is None:
        try:
            with open(spec, "rb") as f:
                header = struct.unpack("<8i", f.read(32))
        except (OSError, struct.error) as e:
            sys.exit(f"error: -e {spec}: neither a model spec (d12, d4c256h4) nor a readable model file ({e})")
        if header[0] != 20240326:
            sys.exit(f"error: {spec}: not an llm.c model file (magic {header[0]})")
        return header[4], header[6], header[5], header[3], header[2]
    L = int(m.group(1))
    if m.group(2) is None:
        if L not in GPT2_SIZES:
            sys.exit(f"error: -e {spec}: unknown GPT-2 size (hint: d12, d24, d36, d48, or d<L>c<C>h<NH>)")
        C, NH = GPT2_SIZES[L]
    else:
        C, NH = int(m.group(2)), int(m.group(3))
    return L, C, NH, int(m.group(4) or 50257), int(m.group(5) or 1024)


def matrices(L, C, V, maxT):
    """(rows, cols) of every weight matrix, in zenflow.h's order: wte, wpe, then per layer
    qkvw, attprojw, fcw, fcprojw"""
    return [(pad_vocab(V), C), (maxT, C)] + [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)] * L


def num_params(L, C, V, maxT):
    return pad_vocab(V) * C + maxT * C + L * 12 * C * C + vector_elems(L, C)


def vector_elems(L, C):
    """the 1-D tensors: ln1 w b, qkvb, attprojb, ln2 w b, fcb, fcprojb per layer; lnf w b"""
    return L * 13 * C + 2 * C


def split(L, C, V, maxT, topk, warmup):
    """(gpu_capacity, cpu_capacity) as zenflow.h's zf_init: n_sel = floor(k cols + 0.5) columns
    of every matrix on the GPU; during a warm-up the CPU owns them all"""
    gpu = cpu = 0
    for rows, cols in matrices(L, C, V, maxT):
        n_sel = int(topk * cols + 0.5)
        gpu += n_sel * rows
        cpu += (cols if warmup > 0 else cols - n_sel) * rows
    return gpu, cpu


def mode_settings(mode, topk=0.1, overlap=1, warmup=0):
    """what zenflow.h's mode sets: adamw and offload have no overlap and no warm-up"""
    if mode == "adamw":
        return 1.0, 0, 0
    if mode == "offload":
        return 0.0, 0, 0
    return topk, overlap, warmup


def gpu_memory(L, C, NH, V, maxT, B, T, mode, topk=0.1, overlap=1, warmup=0, auto_interval=False):
    """bytes of each part (PARTS), as llmc/gpu_memory.h's gpu_memory_formula"""
    topk, overlap, warmup = mode_settings(mode, topk, overlap, warmup)
    gpu, cpu = split(L, C, V, maxT, topk, warmup)
    n, nv = 2 + 4 * L, 10
    BT = B * T
    BTC, att = BT * C, B * NH * T * T
    acts = (16 * L + 2) * BTC + (4 * L + 2) * BT + L * att + BT * pad_vocab(V)
    scratch = 10 * BTC + att
    total_cols = 2 * C + 7 * L * C  # wte, wpe: C columns each; per layer qkvw C, attprojw C, fcw C, fcprojw 4C
    tables = 32 * (3 * n + nv) + 8 * (3 * (n + 1) + nv + 1) + 4 * (total_cols + 1) + 4 * total_cols + 4 * 128 * 4 * C
    if auto_interval:
        tables += 8 * (max(gpu, cpu) // 1024 + n)
    p = num_params(L, C, V, maxT)
    values = [4 * p, 4 * p, 8 * (vector_elems(L, C) + gpu), 4 * (acts + scratch) + 4 * (5 * BT + 1),
              32 * MIB, (2 if overlap else 1) * 4 * cpu, tables]
    return dict(zip(PARTS, values))


def print_parts(parts, heading):
    """the lines the trainers print (llmc/gpu_memory.h's gpu_memory_print)"""
    print(f"[memory] {heading}")
    for name, b in list(parts.items()) + [("total", sum(parts.values()))]:
        print(f"[memory] GPU {name:20} {b / MIB:10.1f} MiB  ({b} bytes)")


def fits(total, gb):
    return total + CONTEXT_ALLOWANCE <= gb * 10**9


def table():
    """docs/memory.md's table: GB (10^9 bytes) at T = 1024, and the modes that fit each GPU"""
    modes = [("adamw", "a", {}), ("offload", "o", {}), ("zenflow", "z", {}), ("zenflow", "z0", {"overlap": 0})]
    print("| model | B | adamw | offload | zenflow | zenflow -zv 0 | " + " | ".join(f"{g} GB" for g in GPUS_GB) + " |")
    print("| --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in GPUS_GB) + " |")
    for L in GPT2_SIZES:
        C, NH = GPT2_SIZES[L]
        for B in range(1, 5):
            totals = [sum(gpu_memory(L, C, NH, 50257, 1024, B, 1024, mode, **kw).values()) for mode, _, kw in modes]
            cells = []
            for gb in GPUS_GB:
                ok = [letter for (_, letter, _), t in zip(modes, totals) if fits(t, gb)]
                cell = " ".join(ok) if ok else "-"
                # where zenflow or offload fits and adamw does not: the difference offloading makes
                cells.append(f"**{cell}**" if ok and "a" not in ok else cell)
            print(f"| {GPT2_NAMES[L]} | {B} | " + " | ".join(f"{t / 1e9:.1f}" for t in totals) + " | " +
                  " | ".join(cells) + " |")
    print()
    print(f"GB = 10^9 bytes, T = 1024, zenflow k = 0.1; a mode fits when its total plus "
          f"{CONTEXT_ALLOWANCE / 2**30:.0f} GiB for what is not counted (the CUDA context, cuBLASLt) is at most "
          f"the GPU's nominal size: a adamw, o offload, z zenflow, z0 zenflow -zv 0; bold: adamw does not fit.")
    for L in GPT2_SIZES:
        C, NH = GPT2_SIZES[L]
        p = gpu_memory(L, C, NH, 50257, 1024, 1, 1024, "zenflow")
        a = gpu_memory(L, C, NH, 50257, 1024, 1, 1024, "adamw")
        b4 = gpu_memory(L, C, NH, 50257, 1024, 4, 1024, "adamw")["activations"]
        print(f"- {GPT2_NAMES[L]}: parameters {p['parameters'] / 1e9:.2f} GB, adamw's moments "
              f"{a['moments (m, v)'] / 1e9:.2f} GB, zenflow's moments {p['moments (m, v)'] / 1e9:.2f} GB and "
              f"staging {p['staging'] / 1e9:.2f} GB; activations at B=1 {p['activations'] / 1e9:.2f} GB, "
              f"at B=4 {b4 / 1e9:.2f} GB")


def check_setting(args, L, C, NH, V, maxT):
    """one line and exit 1 for a setting the trainers refuse: no table of a run that cannot start"""
    # llmc/gpt2_file.h's gpt2_validate_config, llmc/args.h's and zenflow.h's ranges
    if not (1 <= L <= 1024 and 1 <= C <= 65536 and NH >= 1 and 1 <= V <= 65536 and 1 <= maxT <= 1 << 20) or C % NH:
        sys.exit(f"error: -e {args.e}: L={L} C={C} NH={NH} V={V} maxT={maxT} is not a shape the trainers take "
                 f"(hint: NH divides C; L <= 1024, C <= 65536, V <= 65536, maxT <= 1048576, each at least 1)")
    if not 1 <= args.b <= 1 << 16 or not 1 <= args.t <= maxT:
        sys.exit(f"error: -b {args.b} -t {args.t}: B from 1 to 65536, T from 1 to the model's maxT={maxT}")
    if not 0 <= args.zk <= 1 or args.zv not in (0, 1) or args.zw < 0:
        sys.exit(f"error: -zk {args.zk} -zv {args.zv} -zw {args.zw}: k from 0 to 1, -zv 0 or 1, -zw at least 0")
    if args.zu != "auto" and not (args.zu.isdigit() and 1 <= int(args.zu) <= 1 << 20):
        sys.exit(f"error: -zu {args.zu}: a number of steps from 1 to 1048576, or auto")


def main():
    parser = argparse.ArgumentParser(description="GPU memory of the CUDA trainer, part by part")
    parser.add_argument("-e", default=None, help="model: d12 ... or d<L>c<C>h<NH>, or a model file")
    parser.add_argument("-b", type=int, default=4)
    parser.add_argument("-t", type=int, default=64)
    parser.add_argument("-zo", default="zenflow", choices=["adamw", "offload", "zenflow"])
    parser.add_argument("-zk", type=float, default=0.1)
    parser.add_argument("-zv", type=int, default=1)
    parser.add_argument("-zw", type=int, default=0)
    parser.add_argument("-zu", default="4")
    args = parser.parse_args()
    if args.e is None:
        table()
        return
    L, C, NH, V, maxT = parse_model(args.e)
    check_setting(args, L, C, NH, V, maxT)
    parts = gpu_memory(L, C, NH, V, maxT, args.b, args.t, args.zo, args.zk, args.zv, args.zw, args.zu == "auto")
    print_parts(parts, f"GPU memory the CUDA trainer would take in {args.zo} mode at B={args.b} T={args.t}:")


if __name__ == "__main__":
    main()
