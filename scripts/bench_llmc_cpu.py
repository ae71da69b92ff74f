#!/usr/bin/python3
"""
Our CPU trainer against llm.c's train_gpt2.c, side by side in one run: ms per step of the
same training, each program built the way its own project builds it.

    /usr/bin/python3 scripts/bench_llmc_cpu.py [--llmc build/llmc_ref] [--ours ./train_gpt2cpu]
        [--models "d4c256h4 d12"] [--steps 10] [--cc cc] [--out build/bench_llmc_cpu]

(`make bench_llmc_cpu` fetches llm.c into build/llmc_ref first, as `make llmc_cpu` does.)

- llm.c: its Makefile's flags on Linux, `cc -Ofast -march=native -fopenmp -DOMP`, where cc
  is make's default compiler (its `CC ?= clang` does not override make's built-in CC = cc;
  --cc clang to build with clang). -Ofast lets the compiler reorder sums.
- ours: ./train_gpt2cpu as our Makefile builds it (-O3 -march=native -ffp-contract=off):
  every sum in an order of its own, the same bits on any thread count and vector width.
- the same model file (random init by dev/bench_model.cpp: d4c256h4 is `make run`'s model,
  16 M parameters, d12 the GPT-2 124M shape), llm.c's fixed settings (B = 4, T = 64,
  AdamW at lr 1e-4, the val loss of 5 batches every 10 steps), all cores, and the same data
  as dev/test/test_llmc_cpu.py (its helpers set the run up: beta2 0.95 in llm.c's copy, and a
  train shard of one batch, so both train on the same tokens).
- both time the same span of each step: the next batch, forward, zeroing the gradients,
  backward, AdamW. ms/step is the median over steps 3 and later: the first ones touch the
  activation and gradient memory for the first time (llm.c's first d12 step takes twice
  as long as the next).
- the last column is the largest difference between the two runs' val and train losses. It
  is not a test (test_llmc_cpu.py is, with llm.c built with -O2, within 3e-6): it measures
  how far -Ofast's reordering moves llm.c from exact fp32.

Prints one table (also OUT/bench_llmc_cpu.md). The two programs run one after the other;
on a shared machine the times mean little, the ratio a little more.
"""
import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile

# dev/test/test_llmc_cpu.py: llm.c's copy, the run directory, both programs' output
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "test"))
import test_llmc_cpu as llmc  # noqa: E402

SKIP = 2  # warm-up steps left out of the median


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Relative paths are taken from the repository's root.")
    ap.add_argument("--llmc", default="build/llmc_ref", help="llm.c's source at the pinned commit")
    ap.add_argument("--ours", default="./train_gpt2cpu", help="our CPU trainer")
    ap.add_argument("--models", default="d4c256h4 d12", help="model specs, as dev/bench_model.cpp takes them")
    ap.add_argument("--steps", type=int, default=10, help="training steps (>= 3 + 2 warm-up)")
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"), help="C compiler for llm.c (default: make's cc)")
    ap.add_argument("--out", default="build/bench_llmc_cpu", help="logs and the table")
    args = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if args.steps < SKIP + 3:
        llmc.fail(f"--steps {args.steps}: at least {SKIP + 3} (the first {SKIP} are warm-up)")
    src, commit = llmc.find_llmc(args.llmc)
    if src is None:
        llmc.fail(f"no llm.c source in {args.llmc} (hint: make bench_llmc_cpu, or bash scripts/get_llmc.sh, "
                  "fetches it)")
    for f in (args.ours, llmc.TOKENIZER, llmc.TRAIN_SHARD, llmc.VAL_SHARD):
        if not os.path.isfile(f):
            llmc.fail(f"{f} is missing (hint: make and make data make it)")
    os.makedirs(args.out, exist_ok=True)
    threads = len(os.sched_getaffinity(0))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        llmc.copy_llmc(src, tmp, args.steps)
        # llm.c's Makefile on Linux: CFLAGS -Ofast + -march=native + (OpenMP) -fopenmp -DOMP, LDLIBS -lm -lgomp
        llmc.run([args.cc, "-Ofast", "-Wno-unused-result", "-Wno-ignored-pragmas", "-Wno-unknown-attributes",
                  "-march=native", "-fopenmp", "-DOMP", "train_gpt2.c", "-lm", "-lgomp", "-o", "train_gpt2"],
                 tmp, f"{args.cc} train_gpt2.c")
        llmc.run(["g++", "-O2", "-std=c++17", "-fopenmp", "-I.", "dev/bench_model.cpp",
                  "-o", os.path.join(tmp, "bench_model")], ".", "g++ dev/bench_model.cpp")
        for spec in args.models.split():
            model = os.path.join(tmp, f"{spec}.bin")
            llmc.run([os.path.join(tmp, "bench_model"), spec, model], ".", f"bench_model {spec}")
            run_dir = llmc.make_run_dir(tmp, model)
            print(f"{spec}: llm.c's train_gpt2, then ours, {args.steps} steps each", flush=True)
            _, out_llmc = llmc.run([os.path.join(tmp, "train_gpt2")], run_dir, "llm.c's train_gpt2", timeout=3600)
            _, out_ours = llmc.run(llmc.our_command(args.ours, args.steps, ["-s", "0"]), run_dir, "our trainer",
                                   timeout=3600)
            for name, out in (("llmc", out_llmc), ("ours", out_ours)):
                open(os.path.join(args.out, f"{spec}_{name}.log"), "w").write(out)
            val_l, train_l, ms_l = llmc.parse_llmc(out_llmc)
            val_o, train_o, ms_o = llmc.parse_ours(out_ours)
            # val losses: llm.c's at steps 0, 10, .. <= steps; ours at those and at the last step
            if len(ms_l) != args.steps + 1 or len(ms_o) != args.steps or len(val_l) != args.steps // 10 + 1 \
                    or len(val_o) < len(val_l):
                llmc.fail(f"{spec}: the runs printed {len(ms_l)}/{len(ms_o)} steps and {len(val_l)}/{len(val_o)} "
                          f"val losses (llm.c/ours; logs in {args.out})")
            params = int(re.search(r"^\[GPT-2\] .*, (\d+) parameters", out_ours, re.M).group(1))
            worst = max(abs(a - b) for a, b in list(zip(val_l, val_o)) + list(zip(train_l, train_o)))
            rows.append((spec, params, statistics.median(ms_l[SKIP:args.steps]), statistics.median(ms_o[SKIP:]), worst))
            shutil.rmtree(run_dir)

    tokens = llmc.B * llmc.T
    lines = [f"CPU trainers, B={llmc.B} T={llmc.T}, {threads} threads, {args.steps} steps, ms/step = median of steps "
             f">= {SKIP + 1}; llm.c {commit} built with {args.cc} -Ofast -march=native, ours with the Makefile's flags",
             "",
             "| model | parameters | llm.c train_gpt2 ms/step | tok/s | ours ms/step | tok/s | llm.c / ours "
             "| largest loss difference |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for spec, params, ms_l, ms_o, worst in rows:
        lines.append(f"| {spec} | {params / 1e6:.1f} M | {ms_l:.1f} | {tokens / ms_l * 1e3:.0f} | {ms_o:.1f} | "
                     f"{tokens / ms_o * 1e3:.0f} | {ms_l / ms_o:.2f}x | {worst:.1e} |")
    table = "\n".join(lines)
    print(table)
    open(os.path.join(args.out, "bench_llmc_cpu.md"), "w").write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
