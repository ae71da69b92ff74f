#!/usr/bin/env python3
"""
Bad input must fail cleanly: one line on stderr that names the file or flag and the
problem, a non-zero exit, no crash (no signal, no sanitizer report), and nothing written.

    /usr/bin/python3 dev/test/test_bad_input.py ./train_gpt2cpu
    /usr/bin/python3 dev/test/test_bad_input.py build/emu/train_gpt2cu --emulated-gpu

--emulated-gpu: the trainer is the CUDA trainer on the CPU emulator (dev/cuda/emu), whose
device memory can be made small (EMU_DEVICE_MEMORY_MB) and its kernels missing
(EMU_NO_KERNEL_IMAGE): adds "too little GPU memory" and "binary not built for this GPU".

Each case builds its broken file in a temp directory from a good tiny model and shard,
runs the trainer once, and checks the result. The last line is
`bad_input: N passed, M failed`; the exit code is 1 if any case failed.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

V = 97          # the tiny model's vocabulary
MAX_T = 32


def header(magic, version, *fields):
    h = np.zeros(256, dtype="<i4")
    h[0], h[1] = magic, version
    for i, f in enumerate(fields):
        h[2 + i] = f
    return h.tobytes()


def model_bytes(version=3, magic=20240326, L=1, C=8, NH=2, vocab=V, maxT=MAX_T):
    Vp = (vocab + 127) // 128 * 128
    n = Vp * C + maxT * C + L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C
                                 + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C
    rng = np.random.default_rng(0)
    params = (rng.standard_normal(n) * 0.02).astype("<f4")
    return header(magic, version, maxT, vocab, L, NH, C, Vp) + params.tobytes()


def zenflow_host_mib(migrates, L=1, C=8, vocab=V, maxT=MAX_T, k=0.1):
    """The host memory ZenFlow's CPU side writes at start (zenflow.h, zf_init), counted here
    from the model's shapes (spec 1, 2) for the default flags (zenflow, -za cpu, overlap on):
    master, m, v, two accumulators, two gradient staging buffers and, when a migration can
    happen, its m and v (the CPU-owned elements c each), and the four copies of the GPU's
    moments (vectors and GPU-owned elements g each)."""
    Vp = (vocab + 127) // 128 * 128
    matrices = [(Vp, C), (maxT, C)] + [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)] * L  # (OC, IC)
    gpu = sum(rows * int(k * cols + 0.5) for rows, cols in matrices)
    cpu = sum(rows * cols for rows, cols in matrices) - gpu
    vectors = L * (2 * C + 3 * C + C + 2 * C + 4 * C + C) + 2 * C
    return 4 * ((7 + 2 * migrates) * cpu + 4 * (vectors + gpu)) / 2**20


def shard_bytes(tokens, magic=20240520, version=1, count=None):
    tokens = np.asarray(tokens, dtype="<u2")
    return header(magic, version, len(tokens) if count is None else count) + tokens.tobytes()


def main():
    args = sys.argv[1:]
    emulated_gpu = "--emulated-gpu" in args
    args = [a for a in args if a != "--emulated-gpu"]
    if len(args) != 1:
        print(__doc__)
        return 2
    trainer = os.path.abspath(args[0])
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        def write(name, data):
            path = os.path.join(tmp, name)
            with open(path, "wb") as f:
                f.write(data)
            return path

        good_model = write("model.bin", model_bytes())
        good_shard = write("shard.bin", shard_bytes(np.arange(2000) % V))
        write("tokenizer_bad.bin", header(20240328, 2, 5, 4) + b"\x01a\x00")
        write("tokenizer_v1.bin", header(20240328, 1, 5) + b"\x01a" * 5)  # version 1 is GPT-2's only
        write("tokenizer_v3.bin", header(20240328, 3, 5, 4) + b"\x01a" * 5)
        outdir = os.path.join(tmp, "out")
        os.mkdir(outdir)
        kept = write("out/main.log", b"s:1 trl:1.0\n")

        between = f"{(zenflow_host_mib(False) + zenflow_host_mib(True)) / 2:.6f}"
        # (name, extra args replacing the defaults, text the error line must contain)
        cases = [
            ("missing model", ["-e", "nope.bin"], "nope.bin"),
            ("truncated model", ["-e", write("m_trunc.bin", model_bytes()[:-4])], "m_trunc.bin"),
            ("model header only", ["-e", write("m_short.bin", model_bytes()[:100])], "m_short.bin"),
            ("wrong model magic", ["-e", write("m_magic.bin", model_bytes(magic=1234))], "magic"),
            ("bf16 model version", ["-e", write("m_v5.bin", model_bytes(version=5))], "version"),
            ("C not divisible by NH", ["-e", write("m_nh.bin", model_bytes(C=8, NH=3))], "divisible"),
            ("missing shard", ["-i", os.path.join(tmp, "none_*.bin")], "none_"),
            ("wrong shard magic", ["-i", write("s_magic.bin", shard_bytes(range(100), magic=7))], "magic"),
            ("wrong shard version", ["-i", write("s_ver.bin", shard_bytes(range(100), version=2))], "version"),
            ("truncated shard", ["-i", write("s_trunc.bin", shard_bytes(range(100), count=200))], "s_trunc.bin"),
            ("token id >= V", ["-i", write("s_vocab.bin", shard_bytes([1] * 50 + [V] + [1] * 50))], "vocabulary"),
            ("bad val shard", ["-j", write("s_val.bin", shard_bytes(range(10))), "-v", "1"], "s_val.bin"),
            ("B*T+1 > shard", ["-b", "64", "-t", "32"], "B*T+1"),
            # the boundary: B*T = 32 tokens, one short (the last target would be past the end)
            ("shard of exactly B*T", ["-i", write("s_exact.bin", shard_bytes(np.arange(32) % V))], "B*T+1"),
            ("T > maxT", ["-t", str(MAX_T + 1)], "maxT"),
            ("unknown flag", ["-Z", "1"], "-Z"),
            ("a flag of one byte >= 128", ["-\udce9", "1"], "unknown argument"),  # argv gets b"-\xe9"
            ("not a flag", ["hello", "1"], "hello"),
            ("flag without value", ["-b"], "-b"),
            ("B = 0", ["-b", "0"], "-b"),
            ("B not a number", ["-b", "4x"], "-b"),
            ("negative lr", ["-l", "-1"], "-l"),
            ("lr not a number", ["-l", "nan"], "-l"),
            ("seed 0 (the sampler's xorshift state would stay 0)", ["-r", "0"], "-r"),
            ("-zp out of range", ["-zp", "2"], "-zp"),
            ("-zu neither a number nor auto", ["-zu", "often"], "-zu"),
            ("-zu 0 (auto is the word)", ["-zu", "0"], "-zu auto"),
            ("an empty -zl file name", ["-zl", ""], "is not a file name"),
            ("a -zl name that ends in /", ["-zl", "nodir/"], "is not a file name"),
            ("-zx out of range", ["-zu", "auto", "-zx", "0"], "-zx"),
            ("-n without -o", ["-n", "5", "-o", None], "-o"),
            ("unknown model spec", ["-e", "d13"], "d13"),
            ("a model spec with maxT 0", ["-e", "d1c8h2t0"], "'t' must be 1 to 1048576"),
            ("a folder as -i", ["-i", tmp], "is a directory"),
            ("a folder as -e", ["-e", outdir], "is a directory"),
            ("a folder as -k", ["-k", outdir, "-s", "1"], "is a directory"),
            ("corrupt tokenizer", ["-k", os.path.join(tmp, "tokenizer_bad.bin")], "tokenizer_bad.bin"),
            ("version 1 tokenizer of 5 tokens", ["-k", os.path.join(tmp, "tokenizer_v1.bin")], "50257"),
            ("tokenizer version 3", ["-k", os.path.join(tmp, "tokenizer_v3.bin")], "version 3"),
            # the CPU side's buffers (about 70 KiB here) against a pretended 10 KiB of free memory
            ("too little host memory", [], "of host memory", {"ZF_HOST_MEMORY_MB": "0.01"}),
            # the tests' debug delay: a typo would run a determinism test without delays
            ("ZF_WORKER_DELAY_US not a number", [], "ZF_WORKER_DELAY_US", {"ZF_WORKER_DELAY_US": "abc"}),
            ("ZF_HOST_MEMORY_MB not a number", [], "ZF_HOST_MEMORY_MB=abc", {"ZF_HOST_MEMORY_MB": "abc"}),
            # enough for the window state, not for the migration a reselection (-zs 100) will
            # do: refused at start, not killed by the OOM killer at step 100 (-zs 0 trains, below)
            ("too little host memory for a migration", [], "of host memory", {"ZF_HOST_MEMORY_MB": between}),
        ]
        if emulated_gpu:  # a 20 MiB "GPU": the 32 MiB cuBLASLt workspace does not fit
            cases.append(("too little GPU memory", [], "out of GPU memory", {"EMU_DEVICE_MEMORY_MB": "20"}))
            # a GPU the binary has no code for: named at start-up, with the rebuild to do
            cases.append(("binary not built for this GPU", [], "make clean && make", {"EMU_NO_KERNEL_IMAGE": "1"}))
        for name, extra, needle, *env in cases:
            env = dict(os.environ, **env[0]) if env else None
            args = {"-e": good_model, "-i": good_shard, "-j": good_shard, "-b": "2", "-t": "16",
                    "-x": "1", "-v": "0", "-s": "0", "-o": outdir,
                    "-k": os.path.join(tmp, "no_tokenizer.bin")}
            positional = []
            for i in range(0, len(extra), 2):
                if extra[i].startswith("-") and len(extra[i]) == 2 and extra[i] in args and i + 1 < len(extra):
                    args[extra[i]] = extra[i + 1]
                else:
                    positional += extra[i:i + 2]
            argv = [trainer]
            for k, v in args.items():
                if v is not None:
                    argv += [k, v]
            argv += positional
            with open(kept, "wb") as f:  # a log from an earlier run, which must survive
                f.write(b"s:1 trl:1.0\n")
            before = sorted(os.listdir(tmp)), sorted(os.listdir(outdir))
            result = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, errors="replace", timeout=120,
                                    env=env)
            lines = [l for l in result.stderr.splitlines() if l.strip()]
            problems = []
            if result.returncode <= 0:
                problems.append(f"exit code {result.returncode} (want > 0, no signal)")
            if len(lines) != 1:
                problems.append(f"{len(lines)} stderr lines (want 1): {lines[:3]}")
            elif not lines[0].startswith("error: ") or needle not in lines[0]:
                problems.append(f"error line does not name '{needle}': {lines[0]}")
            with open(kept, "rb") as f:
                if f.read() != b"s:1 trl:1.0\n":
                    problems.append("it overwrote out/main.log")
            after = sorted(os.listdir(tmp)), sorted(os.listdir(outdir))
            if after != before:
                problems.append(f"it left files behind: {sorted(set(after[0] + after[1]) - set(before[0] + before[1]))}")
            shown = lines[0] if lines else "(no stderr)"
            if problems:
                failed += 1
                print(f"FAIL  {name}: {'; '.join(problems)}")
            else:
                passed += 1
                print(f"ok    {name}: {shown}")
        # good input next to the limits trains: the checks are not too strict
        def trains(name, train, val, *more, env=None):
            nonlocal passed, failed
            argv = [trainer, "-e", good_model, "-i", train, "-j", val, "-b", "2", "-t", "16", "-x", "1", "-v", "0",
                    "-s", "0", *more]
            env = dict(os.environ, **env) if env else None
            result = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=120, env=env)
            if result.returncode == 0:
                passed += 1
                print(f"ok    {name}: trains")
            else:
                failed += 1
                print(f"FAIL  {name}: exit {result.returncode}: {result.stderr.strip()[:200]}")

        trains("shard of exactly B*T+1 tokens", write("s_least.bin", shard_bytes(np.arange(33) % V)), good_shard)
        trains("-v 0 and no val data (never read)", good_shard, os.path.join(tmp, "no_val_*.bin"))
        # a file in the -o the run creates, the folder spelled another way
        trains("-tr in a new -o named ./new_out", good_shard, good_shard, "-o", "./new_out", "-tr", "new_out/trace.json")
        trains("-tr in a new -o named by its absolute path", good_shard, good_shard, "-o", os.path.join(tmp, "abs_out"),
               "-tr", "abs_out/trace.json")
        # without reselections (no migration) the same memory is enough
        trains(f"{between} MiB of host memory, -zs 0", good_shard, good_shard, "-zs", "0",
               env={"ZF_HOST_MEMORY_MB": between})
    print(f"bad_input: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
