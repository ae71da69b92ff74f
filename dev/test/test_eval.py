#!/usr/bin/env python3
"""
What a run reports besides its training losses, checked against PyTorch
(scripts/gpt2_reference.py): the val loss (-v, -m) and the generated text (-s, -g).

    /usr/bin/python3 dev/test/test_eval.py <trainer> <case dir>

For each mode the trainer trains the case for 4 steps, evaluates and samples after steps 2
and 4 (-v 2, -s 2; the val loss also at step 0) and writes a checkpoint at the same steps
(-n 2), so the model files hold the parameters it evaluated and sampled with. TF32 is off
(-f 0; the CPU trainer ignores the flag), so on a GPU the tolerances below hold too.

Val loss: the mean of the losses of the first -m 5 batches of the val shards, from the
start every time. The val data are two shards written here: val_00 of exactly two batches
(2*B*T + 1 tokens: the second batch's last target is the shard's last token) and val_01 of
one and a bit, so the five batches cross to the second shard and wrap around to the first,
and the next evaluation must start again at the first; PyTorch's DataLoader (an independent
implementation) reads the same batches from the same pattern. Tolerance 5e-6 absolute: the
forward sums in another order than PyTorch's (a few 1e-7 per loss) and the trainer prints 6
decimals; the differences measured on the CPU and the emulator are at most 1e-6.

Samples: for each, PyTorch computes the next-token probabilities of the same prefix from
that model file, and the same xorshift* generator (llmc/utils.h, seeded from -r as the
trainers seed it), continued from one sample to the next, draws from them through the same
fp32 cumulative sum (sample_mult); the ids must be equal. -g 40 asks for more than the
case's maxT (32) allows: the trainer stops after maxT - 1 tokens. Then a run resumed from the
step-2 checkpoint must draw the same step-4 sample (the generator's state travels in the
state file). Samples are compared for equality, not within a tolerance: a draw can differ
only where a coin falls between PyTorch's cdf and the trainer's, which differ by about 1e-7.
The test prints the smallest distance of a coin to a step of the cdf; a mismatch with a
distance under 1e-6 is called rounding in the message (it would still fail: it means the
case should change, not the tolerance).

Each mode meets one of the three tokenizers a run can have (-k), written here:
  adamw    the model's own (97 tokens, token i spelled "[i]", <|endoftext|> = 42): the
           samples start from 42 and print through the table (ids would print as "<i>");
  offload  one of another vocabulary (5 tokens, as GPT-2's is beside a tiny model): put
           aside with a note, samples print ids and start from the model's last id;
  zenflow  none (the file is missing): the same, with the other note.

Prints one line per check and `eval: N passed, M failed`.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import gpt2_reference as ref  # noqa: E402

STEPS, EVERY, GEN, SEED = 4, 2, 40, 1337
B, T, VAL_BATCHES, VAL_TOL = 4, 16, 5, 5e-6
MODES = {
    "adamw": ["-zo", "adamw"],
    "offload": ["-zo", "offload"],
    "zenflow": ["-zo", "zenflow", "-zk", "0.2", "-zu", "3", "-zs", "6", "-zv", "1"],
}
# mode -> (tokenizer's vocabulary or None for no file, its <|endoftext|>, the note the run prints)
TOKENIZERS = {
    "adamw": (97, 42, None),
    "offload": (5, 4, "has 5 tokens, the model 97: samples will be printed as token ids"),
    "zenflow": (None, None, "not found, samples will be printed as token ids"),
}
MASK64 = (1 << 64) - 1


class Rng:
    """llmc/utils.h's random_u32 / random_f32 (xorshift*), state seeded as the trainers do"""

    def __init__(self, seed):
        self.state = seed & MASK64  # the seed itself, as llm.c seeds its sampler

    def f32(self):
        s = self.state
        s ^= s >> 12
        s ^= (s << 25) & MASK64
        s ^= s >> 27
        self.state = s
        u32 = ((s * 0x2545F4914F6CDD1D) & MASK64) >> 32
        return np.float32((u32 >> 8) / 16777216.0)


def reference_sample(model, rng, eot, n_tokens):
    """(ids, smallest |coin - cdf step|): n_tokens draws after eot, as the trainers draw them
    (train_sample in llmc/train_loop.h)"""
    V = model.config.vocab_size
    tokens, margin = [eot], 1.0
    with torch.no_grad():
        for _ in range(n_tokens):
            logits, _ = model(torch.tensor([tokens], dtype=torch.long))
            probs = torch.softmax(logits[0, -1].double(), dim=0).numpy().astype(np.float32)
            cdf = np.cumsum(probs, dtype=np.float32)  # sequential fp32 sums, as sample_mult adds
            coin = rng.f32()
            hits = np.nonzero(coin < cdf)[0]
            idx = int(hits[0]) if len(hits) else V - 1
            margin = min(margin, float(cdf[idx] - coin) if len(hits) else 1.0)
            if idx > 0:
                margin = min(margin, float(coin - cdf[idx - 1]))
            tokens.append(idx)
    return tokens[1:], margin


def write_val_shards(tmp, vocab):
    """two val shards of random ids: exactly 2 batches (2*B*T + 1 tokens), and 1 batch + 20; their glob"""
    gen = np.random.default_rng(7)
    for i, n in enumerate((2 * B * T + 1, B * T + 21)):
        ref.write_shard(os.path.join(tmp, f"val_{i:02d}.bin"), gen.integers(0, vocab, n))
    return os.path.join(tmp, "val_*.bin")


def reference_val_loss(model, pattern):
    """the mean fp32 loss of the first VAL_BATCHES batches (the trainers' val loss)"""
    loader = ref.DataLoader(pattern, B, T, model.config.vocab_size)
    total = np.float32(0.0)
    with torch.no_grad():
        for _ in range(VAL_BATCHES):
            x, y = loader.next_batch()
            total += np.float32(model(x, y)[1].item())
    return float(total / np.float32(VAL_BATCHES))


def val_losses(output):
    """(step, val loss) of each `step s/n | val loss` line"""
    return [(int(s), float(v)) for s, v in re.findall(r"^step (\d+)/\d+ \| val loss ([-0-9.naif]+)$", output, re.M)]


def write_tokenizer(path, vocab, eot):
    """a tokenizer file (llmc/tokenizer.h) whose token i is spelled [i]: not the "<i>" the trainers
    print for an id without a table, so a sample shows which of the two it went through"""
    with open(path, "wb") as f:
        f.write(ref.make_header(20240328, 2, vocab, eot).tobytes())
        for i in range(vocab):
            piece = f"[{i}]".encode()
            f.write(bytes([len(piece)]) + piece)


def trainer_samples(output, table):
    """the token ids of each `generating:` block, in order: pieces of the test tokenizer's table
    ([i]) or, without a table, printed ids (<i>); a block with anything else is None"""
    piece = r"\[(\d+)\]" if table else r"<(\d+)>"
    blocks = re.findall(r"^generating:\n---\n(.*?)\n---$", output, re.M | re.S)
    return [[int(i) for i in re.findall(piece, b)] if re.fullmatch(f"(?:{piece})*", b) else None for b in blocks]


def run(argv):
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: "
                           f"{(result.stderr.strip().splitlines() or ['(no output)'])[-1]}")
    return result.stdout


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: test_eval.py <trainer> <case dir>")
    trainer, case = sys.argv[1], sys.argv[2]
    ref.setup_torch()
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        passed, failed = passed + ok, failed + (not ok)

    initial = ref.read_model(f"{case}/model.bin")
    config = initial.config
    n_tokens = min(GEN + 1, config.max_seq_len) - 1
    for mode, flags in MODES.items():
        with tempfile.TemporaryDirectory(prefix="zf_eval_") as tmp:
            out, resumed = os.path.join(tmp, "run"), os.path.join(tmp, "resumed")
            tok_vocab, tok_eot, note = TOKENIZERS[mode]
            tok_path = os.path.join(tmp, "tokenizer.bin")
            if tok_vocab is not None:
                write_tokenizer(tok_path, tok_vocab, tok_eot)
            val_pattern = write_val_shards(tmp, config.vocab_size)
            base = [trainer, "-e", f"{case}/model.bin", "-i", f"{case}/train.bin", "-j", val_pattern,
                    "-b", str(B), "-t", str(T), "-x", str(STEPS), "-v", str(EVERY), "-m", str(VAL_BATCHES),
                    "-s", str(EVERY), "-g", str(GEN), "-r", str(SEED), "-l", "1e-3", "-c", "0.1",
                    "-n", str(EVERY), "-k", tok_path, "-f", "0"] + flags
            try:
                output = run(base + ["-o", out])
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                check(False, f"{mode}: {e}")
                continue
            models = {0: initial}  # step -> the parameters the trainer evaluated and sampled with

            def model_at(step):
                if step not in models:
                    models[step] = ref.read_model(os.path.join(out, f"model_{step:08d}.bin"))
                return models[step]

            vals = val_losses(output)
            for step, got in vals:
                want = reference_val_loss(model_at(step), val_pattern)
                check(abs(got - want) <= VAL_TOL, f"{mode}: step {step} val loss {got:.6f}, PyTorch's {want:.6f}")
            check([step for step, _ in vals] == list(range(0, STEPS + 1, EVERY)),
                  f"{mode}: val losses at steps {[step for step, _ in vals]}")
            with open(os.path.join(out, "main.log")) as f:  # llm.c's log lines: s:<step> tel:<loss>
                logged = [(int(a[2:]), float(b[4:])) for a, b in (line.split() for line in f) if b.startswith("tel:")]
            check(logged == vals, f"{mode}: main.log's tel lines are the printed val losses: {logged}")
            samples = trainer_samples(output, table=note is None)
            # the model's own tokenizer gives <|endoftext|>; without one the trainers take the last id
            eot = tok_eot if note is None else config.vocab_size - 1
            notes = [line for line in output.splitlines() if line.startswith("note: tokenizer")]
            if note is None:
                check(notes == [], f"{mode}: the model's own tokenizer, no note (got: {notes})")
            else:
                check(len(notes) == 1 and note in notes[0], f"{mode}: the note '...{note}' (got: {notes})")
            check(len(samples) == STEPS // EVERY and all(s is not None and len(s) == n_tokens for s in samples),
                  f"{mode}: {len(samples)} samples of {[None if s is None else len(s) for s in samples]} tokens "
                  f"(want {STEPS // EVERY} of {n_tokens}: -g {GEN} stops at maxT {config.max_seq_len})")
            if len(samples) != STEPS // EVERY or None in samples:
                continue
            rng = Rng(SEED)
            for k, got in enumerate(samples):
                step = (k + 1) * EVERY
                want, margin = reference_sample(model_at(step), rng, eot, n_tokens)
                same = got == want
                why = "" if same or margin >= 1e-6 else " (a coin within 1e-6 of a cdf step: rounding)"
                check(same, f"{mode}: step {step} sample equals PyTorch's draws "
                            f"(closest coin to a cdf step: {margin:.2e}){why}"
                            + ("" if same else f"\n     trainer {got}\n     pytorch {want}"))
            # resume from step 2: the state file carries the generator, so step 4 draws the same
            os.makedirs(resumed)
            for name in (f"model_{EVERY:08d}.bin", f"state_{EVERY:08d}.bin", f"manifest_{EVERY:08d}.txt"):
                shutil.copy(os.path.join(out, name), resumed)
            try:
                again = trainer_samples(run(base + ["-o", resumed, "-y", "1"]), table=note is None)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                check(False, f"{mode} resumed: {e}")
                continue
            check(again == samples[1:], f"{mode}: resumed from step {EVERY}, the step-{STEPS} sample is the same")

    print(f"eval: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
