#!/usr/bin/python3
"""
Our files and our trainer against llm.c's own CPU programs, an implementation written
independently of this project: llm.c's test_gpt2.c and train_gpt2.c (at the commit
scripts/get_llmc.sh pins), built here with gcc, read the files we write and train as ours.

    /usr/bin/python3 dev/test/test_llmc_cpu.py [--llmc build/llmc_ref] [--ours ./train_gpt2cpu]
    /usr/bin/python3 dev/test/test_llmc_cpu.py --ours build/emu/train_gpt2cu --cuda

Without llm.c's source in build/llmc_ref (`make llmc_cpu` fetches it and runs this; or bash
scripts/get_llmc.sh [GIT_DIR]) it says SKIPPED: CI has no network, so this cannot run there.

1. llm.c's test_gpt2.c on the `tiny` (V = 97, padded to 128) and `vocab` (GPT-2's real
   vocabulary) cases of dev/test/ref: it reads the model file and the debug-state file
   that our PyTorch reference wrote (the formats of llm.c's own gpt2_124M.bin and
   gpt2_124M_debug_state.bin), runs its forward and backward pass on the state's batch and
   compares the logits, the loss and the 16 gradient tensors. llm.c's own tolerances (1e-2,
   2e-2) are written for its GPU builds; we also require what two fp32 implementations of
   the same sums should meet, about ten times what was measured: logits within 4e-6, the
   loss within 2e-5 (it prints 6 decimals), every gradient within 1e-6. Its 10 training
   steps are checked against the losses of GPT-2 124M, hard-coded, so they print "OK = 0"
   here; they are not ours to check.
2. llm.c's train_gpt2.c and our CPU trainer (-zo adamw), side by side on the same model
   file (the `vocab` case's), tokenizer (data/gpt2_tokenizer.bin) and val shard (ours), for
   llm.c's fixed run: B = 4, T = 64, 40 steps of AdamW at lr 1e-4, wd 0, the val loss of 5
   batches every 10 steps, a sample of 63 tokens at steps 20 and 40, sampler seed 1337.
   Two adjustments make the runs comparable, and nothing else is changed:
   - llm.c hard-codes beta2 = 0.999 in this program (its mixed-precision train_gpt2.cu uses
     0.95); our spec's default is 0.95 (docs/zenflow_spec.md section 3.1), so the copy
     built here has that one literal changed;
   - llm.c shuffles the training batches, we read them in order, so the train shard holds
     exactly one batch (the first B*T+1 tokens of ours): every step trains on it, in both.
   Every val and train loss must agree within 3e-6: both print 6 decimals, and the weights
   differ by an ulp here and there, since spec 3.1 rounds the bias corrections 1 - b^s from
   double while llm.c computes them in float (measured: at most 1e-6). The samples draw
   the same coins (both seed xorshift* with 1337) from nearly the same probabilities, so
   their tokens must be the same, except that a coin lying within that ulp of a step of the
   cumulative sum picks the neighbouring token, and from there on the texts part. So:
   equal up to the first token that differs, and that one must be our token's id +- 1.
   Our run prints token ids (no tokenizer: llm.c's cannot run without one), which are
   decoded here with data/gpt2_tokenizer.bin as llm.c's safe_printf prints them.
3. llm.c reads the model file our trainer writes: our run checkpoints at its last step
   (-n 40), and a program of ours built on llm.c's train_gpt2.c (its functions, as
   test_gpt2.c uses them) loads that file with llm.c's gpt2_build_from_checkpoint and
   computes the val loss of the same 5 batches with llm.c's loader and forward pass. It must
   be the one our run printed at step 40, within 3e-6 (the same weights, the same sums).

With --cuda, ours is the CUDA trainer (on a GPU, or the CPU emulator as in make test), run
with TF32 off (-f 0), and the losses of parts 2 and 3 must agree within 2e-5, the bound
between our two trainers (dev/test/test_trainers_agree.py): its kernels sum in the GPU's
orders (warp and block reductions, cuBLASLt's tiles), and AdamW lets last-bit differences
grow over the steps. Measured on the emulator: 2e-6 (val), 3e-6 (train); a real GPU has
not run it yet. (The CPU trainer ignores -f.)

Builds with -O2 (IEEE fp32; llm.c's Makefile uses -Ofast, whose reassociation would make a
comparison to the last digit meaningless: scripts/bench_llmc_cpu.py, which builds it so,
measured its losses up to 1.7e-5 from ours in 10 steps of d12). About a minute here, most
of it llm.c's run.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import bpe  # noqa: E402  scripts/: the tokenizer file's reader
import data_files  # noqa: E402  scripts/: the token shards' reader and writer
from runner import nan_first  # noqa: E402  dev/test/: a nan is the largest error

B, T, STEPS, VAL_EVERY, VAL_BATCHES, SAMPLE_EVERY, GEN = 4, 64, 40, 10, 5, 20, 63
UPDATE_LLMC = "gpt2_update(&model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, step+1);"
UPDATE_OURS = UPDATE_LLMC.replace("0.999f", "0.95f")  # beta2: our spec's default
# part 3: the val loss of a model file, with llm.c's reader, loader and forward pass
VAL_LOSS_C = r'''
#define TESTING
#include "train_gpt2.c"
int main(int argc, char** argv) {  // val_loss <model file> <val shard> <B> <T> <batches>
    if (argc != 6) { return 2; }
    int B = atoi(argv[3]), T = atoi(argv[4]), batches = atoi(argv[5]);
    GPT2 model;
    gpt2_build_from_checkpoint(&model, argv[1]);
    DataLoader loader;
    dataloader_init(&loader, argv[2], B, T, 0, 1, 0);
    float val_loss = 0.0f;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(&loader);
        gpt2_forward(&model, loader.inputs, loader.targets, B, T);
        val_loss += model.mean_loss;
    }
    printf("val loss %f\n", val_loss / batches);
    return 0;
}
'''
CASE = "dev/test/ref/vocab"  # the model of part 2
TEST_CASES = ("dev/test/ref/tiny", CASE)
TOKENIZER = "data/gpt2_tokenizer.bin"
TRAIN_SHARD = "data/tinyshakespeare/tiny_shakespeare_train.bin"
VAL_SHARD = "data/tinyshakespeare/tiny_shakespeare_val.bin"
# our bounds (see above): logits, loss, gradients of test_gpt2.c; the losses of the run
TOL_LOGITS, TOL_LOSS, TOL_GRAD, TOL_RUN, TOL_RUN_CUDA = 4e-6, 2e-5, 1e-6, 3e-6, 2e-5


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def run(cmd, cwd, what, timeout=600):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    out = r.stdout.decode("utf-8", "replace")
    if r.returncode != 0:
        fail(f"{what} exited {r.returncode}:\n{out[-2000:]}")
    return r.stdout, out


failures = []


def check(ok, what):
    """one verdict line; the failed ones are kept for the last line"""
    if not ok:
        failures.append(what)
    print(f"{'ok  ' if ok else 'FAIL'}  {what}")


def safe_piece(piece):
    """what llm.c's safe_printf prints for a token: nothing for a lone unprintable byte"""
    if len(piece) == 1 and not (0x20 <= piece[0] < 0x7F or piece[0] in b" \t\n\v\f\r"):
        return b""
    return piece


def compare_sample(ours_ids, llmc_text, pieces):
    """(ok, verdict): equal up to the first difference (if any), whose two ids are neighbours.
    Token 0 must be equal: a first coin on a step is improbable, a wrong sampler is not."""
    pos = 0
    for n, tok in enumerate(ours_ids):
        piece = safe_piece(pieces[tok])
        if llmc_text.startswith(piece, pos):
            pos += len(piece)
            continue
        neighbours = [t for t in (tok - 1, tok + 1) if 0 <= t < len(pieces)
                      and safe_piece(pieces[t]) and llmc_text.startswith(safe_piece(pieces[t]), pos)]
        if neighbours:
            where = "(a coin on the step between them)" if n > 0 else "at the first token"
            return n > 0, f"{n} of {len(ours_ids)} tokens equal, then ours {tok}, llm.c's {neighbours[0]} {where}"
        return False, (f"differs at token {n} (ours {tok} {pieces[tok]!r}), llm.c printed "
                       f"{llmc_text[pos:pos + 30]!r}: not a neighbour")
    if pos != len(llmc_text):
        return False, f"llm.c printed more: {llmc_text[pos:pos + 30]!r}"
    return True, f"all {len(ours_ids)} tokens equal"


# ----------------------------------------------------------------------------
# llm.c's train_gpt2.c beside ours (scripts/bench_llmc_cpu.py uses these too)

LLMC_LOOP = "for (int step = 0; step <= 40; step++) {"


def find_llmc(path):
    """(absolute path, short commit) of llm.c's source in path, or (None, None) if it is not there"""
    src = os.path.abspath(path)
    if not all(os.path.isfile(os.path.join(src, f)) for f in ("train_gpt2.c", "test_gpt2.c", "llmc/utils.h")):
        return None, None
    commit_file = os.path.join(src, "COMMIT")
    return src, open(commit_file).read().strip()[:7] if os.path.isfile(commit_file) else "?"


def copy_llmc(src, tmp, steps=STEPS):
    """llm.c's headers, test_gpt2.c and train_gpt2.c into tmp (train_gpt2.c includes "llmc/..."),
    train_gpt2.c with beta2 = 0.95 and its loop over steps 0..`steps` (40 in llm.c). It trains
    in every iteration, so one step more than ours with -x steps; its val loss at step s is
    printed before that step's update, so after s updates, as ours is."""
    shutil.copytree(os.path.join(src, "llmc"), os.path.join(tmp, "llmc"))
    shutil.copy(os.path.join(src, "test_gpt2.c"), tmp)
    text = open(os.path.join(src, "train_gpt2.c")).read()
    for line in (UPDATE_LLMC, LLMC_LOOP):
        if text.count(line) != 1:
            fail(f"llm.c's train_gpt2.c has no single line {line!r} (not the pinned commit?)")
    text = text.replace(UPDATE_LLMC, UPDATE_OURS).replace(LLMC_LOOP, LLMC_LOOP.replace("40", str(steps)))
    open(os.path.join(tmp, "train_gpt2.c"), "w").write(text)


def make_run_dir(tmp, model):
    """the working directory llm.c's train_gpt2 expects: the model as gpt2_124M.bin, our
    tokenizer, our val shard, and a train shard of exactly one batch (llm.c shuffles the
    batches, we read them in order: with one batch both train on the same tokens)"""
    run_dir = os.path.join(tmp, "run")
    data_dir = os.path.join(run_dir, "dev/data/tinyshakespeare")
    os.makedirs(data_dir)
    data_files.write_shard(os.path.join(data_dir, "tiny_shakespeare_train.bin"),
                           data_files.read_shard(TRAIN_SHARD)[:B * T + 1])
    os.symlink(os.path.abspath(VAL_SHARD), os.path.join(data_dir, "tiny_shakespeare_val.bin"))
    os.symlink(os.path.abspath(model), os.path.join(run_dir, "gpt2_124M.bin"))
    os.symlink(os.path.abspath(TOKENIZER), os.path.join(run_dir, "gpt2_tokenizer.bin"))
    return run_dir


def our_command(ours, steps, extra):
    """our trainer in make_run_dir's directory, with llm.c's settings (no tokenizer: token ids)"""
    return [os.path.abspath(ours), "-e", "gpt2_124M.bin",
            "-i", "dev/data/tinyshakespeare/tiny_shakespeare_train.bin",
            "-j", "dev/data/tinyshakespeare/tiny_shakespeare_val.bin", "-k", "no_tokenizer.bin",
            "-b", str(B), "-t", str(T), "-x", str(steps), "-l", "1e-4", "-c", "0",
            "-v", str(VAL_EVERY), "-m", str(VAL_BATCHES), "-zo", "adamw"] + extra


def parse_llmc(out):
    """(val losses, train losses, ms per step) of llm.c's train_gpt2: "val loss %f" before the
    step of that number, "step %d: train loss %f (took %f ms)" for steps 0, 1, .."""
    steps = re.findall(r"^step \d+: train loss (\S+) \(took (\S+) ms\)$", out, re.M)
    return ([float(x) for x in re.findall(r"^val loss (\S+)$", out, re.M)],
            [float(loss) for loss, _ in steps], [float(ms) for _, ms in steps])


def parse_ours(out):
    """(val losses, train losses, ms per step) of our trainer: "step s/N | val loss %f" after
    s steps, "step s/N | loss %f | %.1f ms" for steps 1..N"""
    steps = re.findall(r"^step \d+/\d+ \| loss (\S+) \| (\S+) ms", out, re.M)
    return ([float(x) for x in re.findall(r"^step \d+/\d+ \| val loss (\S+)$", out, re.M)],
            [float(loss) for loss, _ in steps], [float(ms) for _, ms in steps])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llmc", default="build/llmc_ref", help="llm.c's source at the pinned commit")
    ap.add_argument("--ours", default="./train_gpt2cpu", help="our trainer")
    ap.add_argument("--cuda", action="store_true", help="--ours is the CUDA trainer (its bound, see above)")
    args = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    src, commit = find_llmc(args.llmc)
    if src is None:
        print(f"SKIPPED (no llm.c source in {args.llmc}: make llmc_cpu, or bash scripts/get_llmc.sh, "
              "fetches it)")
        return 0
    with open(os.path.join(data_files.REPO_ROOT, "scripts", "get_llmc.sh")) as f:
        pinned = re.search(r"^COMMIT=([0-9a-f]{40})", f.read(), re.M).group(1)
    if commit != pinned[:7]:
        fail(f"{src} holds llm.c at {commit}, not at the pinned {pinned[:7]} (hint: bash scripts/get_llmc.sh "
             "fetches it again)")
    needed = [f"{c}/{f}" for c in TEST_CASES for f in ("model.bin", "state.bin")]
    for f in [args.ours, TOKENIZER, TRAIN_SHARD, VAL_SHARD] + needed:
        if not os.path.isfile(f):
            fail(f"{f} is missing (hint: make, make refs and make data make it)")
    with tempfile.TemporaryDirectory() as tmp:
        copy_llmc(src, tmp)
        open(os.path.join(tmp, "val_loss.c"), "w").write(VAL_LOSS_C)
        for prog in ("test_gpt2", "train_gpt2", "val_loss"):
            run(["gcc", "-O2", "-fopenmp", "-DOMP", "-Wno-unused-result", "-o", prog, prog + ".c", "-lm"],
                tmp, f"gcc {prog}.c")
        print(f"llm.c {commit}: test_gpt2.c, train_gpt2.c (beta2 0.95) and val_loss.c (ours, on train_gpt2.c) "
              "built with gcc -O2")

        # 1. test_gpt2.c on our reference files (it reads them from its working directory)
        for case in TEST_CASES:
            case_dir = os.path.join(tmp, os.path.basename(case))
            os.mkdir(case_dir)
            os.symlink(os.path.abspath(f"{case}/model.bin"), os.path.join(case_dir, "gpt2_124M.bin"))
            os.symlink(os.path.abspath(f"{case}/state.bin"), os.path.join(case_dir, "gpt2_124M_debug_state.bin"))
            _, out = run([os.path.join(tmp, "test_gpt2")], case_dir, f"llm.c's test_gpt2 on {case}")
            m = re.search(r"^(NOT )?OK \(LOGITS\), max_diff = (\S+)$", out, re.M)
            check(m is not None and not m.group(1) and float(m.group(2)) <= TOL_LOGITS,
                  f"test_gpt2.c on {case}: logits max diff {m.group(2) if m else '?'} "
                  f"(llm.c: < 1e-2, ours: <= {TOL_LOGITS:g})")
            m = re.search(r"^LOSS (OK|MISMATCH): (\S+) (\S+)$", out, re.M)
            check(m is not None and m.group(1) == "OK" and abs(float(m.group(2)) - float(m.group(3))) <= TOL_LOSS,
                  f"test_gpt2.c on {case}: loss {m.group(2) if m else '?'}, the file's "
                  f"{m.group(3) if m else '?'} (ours: within {TOL_LOSS:g})")
            grads = re.findall(r"^(d\w+)\nTENSOR (OK|NOT OK), maxdiff = (\S+)$",
                               re.sub(r"^(NOT )?OK -?[\d.]+ -?[\d.]+\n", "", out, flags=re.M), re.M)
            worst = max((float(d) for _, _, d in grads), default=float("inf"), key=nan_first)
            check(len(grads) == 16 and all(v == "OK" for _, v, _ in grads) and worst <= TOL_GRAD,
                  f"test_gpt2.c on {case}: {len(grads)} of 16 gradient tensors OK, largest max diff {worst:.3g} "
                  f"(llm.c: <= 2e-2, ours: <= {TOL_GRAD:g})")

        # 2. train_gpt2.c and ours: one batch of training data, our val shard
        run_dir = make_run_dir(tmp, f"{CASE}/model.bin")
        raw, out_llmc = run([os.path.join(tmp, "train_gpt2")], run_dir, "llm.c's train_gpt2")
        _, out_ours = run(our_command(args.ours, STEPS, ["-s", str(SAMPLE_EVERY), "-g", str(GEN), "-r", "1337",
                                                         "-f", "0", "-n", str(STEPS), "-o", "out"]),
                          run_dir, "our trainer")
        tol = TOL_RUN_CUDA if args.cuda else TOL_RUN
        val_llmc, train_llmc, _ = parse_llmc(out_llmc)
        val_ours, train_ours, _ = parse_ours(out_ours)
        n_val = STEPS // VAL_EVERY + 1
        check(len(val_llmc) == n_val and len(val_ours) == n_val and len(train_llmc) == STEPS + 1
              and len(train_ours) == STEPS, f"the runs printed {len(val_llmc)}/{len(val_ours)} val losses "
              f"(llm.c/ours, {n_val} expected) and {len(train_llmc)}/{len(train_ours)} train losses")
        print(f"{'step':>5} {'llm.c val':>10} {'ours':>10} {'llm.c train':>12} {'ours':>10}")
        for s in range(0, STEPS + 1, VAL_EVERY):
            i = s // VAL_EVERY
            tr = f"{train_llmc[s - 1]:12.6f} {train_ours[s - 1]:10.6f}" if 0 < s <= len(train_ours) else ""
            if i < len(val_llmc) and i < len(val_ours):
                print(f"{s:5d} {val_llmc[i]:10.6f} {val_ours[i]:10.6f} {tr}")
        worst_val = max((abs(a - b) for a, b in zip(val_llmc, val_ours)), default=float("inf"), key=nan_first)
        worst_train = max((abs(a - b) for a, b in zip(train_llmc, train_ours)), default=float("inf"), key=nan_first)
        check(worst_val <= tol,
              f"val losses at steps 0, 10, .., 40: largest difference {worst_val:.2g} (<= {tol:g})")
        check(worst_train <= tol,
              f"train losses of steps 1..40: largest difference {worst_train:.2g} (<= {tol:g})")

        _, pieces = bpe.read_tokenizer_bin(TOKENIZER)
        samples_llmc = re.findall(rb"generating:\n---\n(.*?)\n---\n", raw, re.S)
        samples_ours = [[int(t) for t in re.findall(r"<(\d+)>", s)]
                        for s in re.findall(r"generating:\n---\n(.*?)\n---\n", out_ours, re.S)]
        check(len(samples_llmc) == 2 and len(samples_ours) == 2 and all(len(s) == GEN for s in samples_ours),
              f"two samples each (llm.c {len(samples_llmc)}, ours {len(samples_ours)} of "
              f"{[len(s) for s in samples_ours]} tokens, {GEN} expected)")
        for step, ours_ids, text in zip((SAMPLE_EVERY, STEPS), samples_ours, samples_llmc):
            ok, verdict = compare_sample(ours_ids, text, pieces)
            check(ok, f"sample at step {step}: {verdict}")

        # 3. our checkpoint through llm.c's reader
        model_file = os.path.join(run_dir, "out", f"model_{STEPS:08d}.bin")
        _, out = run([os.path.join(tmp, "val_loss"), model_file, "dev/data/tinyshakespeare/tiny_shakespeare_val.bin",
                      str(B), str(T), str(VAL_BATCHES)], run_dir, "llm.c's reader on our checkpoint")
        m = re.search(r"^val loss (\S+)$", out, re.M)
        got = float(m.group(1)) if m else float("nan")
        want = val_ours[-1] if val_ours else float("nan")
        check(abs(got - want) <= tol, f"llm.c on our checkpoint {os.path.basename(model_file)}: val loss "
              f"{got:.6f}, ours at step {STEPS} {want:.6f} (within {tol:g})")
    if failures:
        print(f"llmc_cpu: FAIL ({len(failures)} checks)")
        return 1
    print(f"llmc_cpu: PASS: llm.c's CPU programs ({commit}) read our files and agree with our trainer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
