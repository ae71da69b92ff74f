#!/usr/bin/python3
"""
scripts/convert_hf.py against transformers itself, with no network.

For each shape below, a random GPT-2 is made by transformers' own GPT2Config and
GPT2LMHeadModel, every parameter drawn at random (biases and LayerNorm gains too, so a
misplaced one shows), and saved by save_pretrained (safetensors, or pytorch_model.bin).
Then:
  1. import: convert_hf.py import writes our model file; its header has the config's shape;
  2. logits: the CPU trainer's forward pass (./forward_gpt2cpu) on a fixed batch against
     transformers' forward on the same batch: logits within 1e-5 relative to the tensor
     (max |ours - HF| / max |HF|), and the mean cross-entropy loss of the targets within 1e-5
     relative; both sides are fp32 and sum in different orders, so they agree to a few ulps,
     not bitwise (test_gpt2cpu's bounds against PyTorch, and for the same reason);
  3. export: convert_hf.py export of the imported file, loaded by
     GPT2LMHeadModel.from_pretrained, has every tensor of the original bit for bit (lm_head
     tied to wte), so its logits are the original's bit for bit; importing the export again
     gives the same model file, byte for byte; with GPT-2's vocabulary, the export holds
     GPT-2's tokenizer (its BPE files must be here: make data, or DATA_MIRROR_DIR), which
     AutoTokenizer loads and which gives scripts/bpe.py's ids;
  4. a checkpoint: two training steps of the CPU trainer from the imported file (-o, -n),
     exported from the checkpoint folder, give in transformers the logits of our forward on
     that checkpoint (1e-5); a newer model file without its manifest (a write that did not
     finish) is skipped and named, and an earlier export's vocab.json is removed.
And the converter's errors, one line each: a model name with no network, a folder without
weights, a GELU that is not GPT-2's, an lm_head not tied to wte, a config.json that is a list
or has n_head 0, a model.safetensors cut short, an index without weight_map, an import to a
folder (no .tmp left), an export into a file, a model file whose Vp is not V padded. (A
weights file that keeps the tied pair under lm_head.weight alone, as safetensors' save_model
does, imports like any; beside an index of other shards, model.safetensors is the file read,
as transformers reads it.)

What must match for the logits to agree (and the converter refuses a config.json that differs):
  - GELU: GPT-2's "gelu_new", 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), which is our
    gelu_forward; transformers' "gelu" (erf) differs by up to 1e-3;
  - the causal mask: transformers' eager attention replaces the scores above the diagonal by
    torch.finfo(float32).min before the softmax, where our attention leaves them out; exp of
    (min - max) is exactly 0 in fp32, so the probabilities are the same;
  - the attention scale 1/sqrt(head size) (scale_attn_weights, and not by layer index);
  - LayerNorm's epsilon 1e-5, the MLP 4C wide, dropout off (eval mode), fp32, the "eager"
    attention (the one transformers runs on this torch).

    /usr/bin/python3 dev/test/test_hf.py [./forward_gpt2cpu] [./train_gpt2cpu]
Prints SKIPPED (exit 0) when transformers or safetensors is not installed.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CONVERT = ROOT / "scripts" / "convert_hf.py"
PYTHON = sys.executable
# (name, n_layer, n_embd, n_head, vocab_size, n_positions, safetensors?, B, T)
SHAPES = [
    ("gpt2-vocab", 2, 64, 4, 50257, 64, True, 2, 32),   # GPT-2's vocabulary: 47 padded rows
    ("c48", 3, 48, 3, 300, 40, False, 3, 40),           # n_embd not a multiple of 64; pytorch_model.bin
    ("c40", 1, 40, 5, 128, 16, True, 4, 16),            # head size 8, Vp = V (no padding)
    ("c96", 4, 96, 2, 1000, 128, True, 1, 100),         # head size 48, T not a power of 2
]
TOL = 1e-5
results = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(f"{'PASS' if ok else 'FAIL'} {name}" + ("" if ok or not detail else f": {detail}"))
    return ok


def run(*argv, env=None):
    # no download can happen: the hub is told it is offline, and its cache is empty
    full_env = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, env=full_env)


def convert(*args, env=None):
    return run(PYTHON, CONVERT, *args, env=env)


def random_model(transformers, torch, L, C, NH, V, maxT, seed):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=L, n_embd=C, n_head=NH, vocab_size=V, n_positions=maxT,
                                  activation_function="gelu_new", attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    return model


def hf_forward(torch, model, x, y):
    with torch.no_grad():
        logits = model(torch.from_numpy(x).long()).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).long().reshape(-1))
    return logits.numpy(), float(loss)


def our_forward(forward_bin, model_bin, x, y, tmp):
    B, T = x.shape
    batch, out = Path(tmp) / "batch.bin", Path(tmp) / "out.bin"
    batch.write_bytes(struct.pack("<2i", B, T) + x.astype("<i4").tobytes() + y.astype("<i4").tobytes())
    p = run(forward_bin, model_bin, batch, out)
    if p.returncode != 0:
        raise RuntimeError(f"{forward_bin} exited {p.returncode}: {p.stderr.strip()}")
    data = np.fromfile(out, dtype="<f4")
    return data[1:].reshape(B, T, -1), float(data[0])


def compare(name, ours, ref, loss, ref_loss):
    err = float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))
    check(f"{name}: logits within {TOL:g} of transformers' (relative to the tensor): {err:.2e}", err <= TOL)
    lerr = abs(loss - ref_loss) / abs(ref_loss)
    check(f"{name}: loss {loss:.6f} vs transformers' {ref_loss:.6f}, relative {lerr:.1e}", lerr <= TOL)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_shape(transformers, torch, forward_bin, trainer, shape, tmp):
    name, L, C, NH, V, maxT, safe, B, T = shape
    tmp = Path(tmp) / name
    hf_dir, ours, exported = tmp / "hf", tmp / "model.bin", tmp / "exported"
    model = random_model(transformers, torch, L, C, NH, V, maxT, seed=L * 1000 + C)
    model.save_pretrained(hf_dir, safe_serialization=safe)
    weights = "model.safetensors" if safe else "pytorch_model.bin"
    check(f"{name}: transformers saved {weights}", (hf_dir / weights).is_file())

    # 1. import
    p = convert("import", hf_dir, ours)
    if not check(f"{name}: import", p.returncode == 0, p.stderr.strip()):
        return
    header = struct.unpack("<8i", ours.read_bytes()[:32])
    Vp = (V + 127) // 128 * 128
    check(f"{name}: header {header}", header == (20240326, 3, maxT, V, L, NH, C, Vp))

    # 2. logits and loss on a fixed batch
    rng = np.random.default_rng(C)
    x = rng.integers(0, V, size=(B, T), dtype=np.int64)
    y = rng.integers(0, V, size=(B, T), dtype=np.int64)
    ref_logits, ref_loss = hf_forward(torch, model, x, y)
    logits, loss = our_forward(forward_bin, ours, x, y, tmp)
    compare(name, logits, ref_logits, loss, ref_loss)

    # 3. export, load in transformers, bit for bit
    p = convert("export", ours, exported)
    if not check(f"{name}: export", p.returncode == 0, p.stderr.strip()):
        return
    back = transformers.GPT2LMHeadModel.from_pretrained(exported, attn_implementation="eager").eval()
    original = {k: v.numpy() for k, v in model.state_dict().items()}
    loaded = {k: v.numpy() for k, v in back.state_dict().items()}
    differ = [k for k in original if k not in loaded or not same_bits(original[k], loaded[k])]
    check(f"{name}: the export loads in transformers with all {len(original)} tensors bit for bit",
          not differ and set(original) == set(loaded), f"differ: {differ[:4]}")
    check(f"{name}: lm_head is tied to wte after loading",
          back.lm_head.weight.data_ptr() == back.transformer.wte.weight.data_ptr())
    back_logits, _ = hf_forward(torch, back, x, y)
    check(f"{name}: the export's logits are the original's bit for bit", same_bits(back_logits, ref_logits))
    if V == 50257 and check(f"{name}: the export holds GPT-2's tokenizer (vocab.json, merges.txt)",
                            (exported / "vocab.json").is_file() and (exported / "merges.txt").is_file(),
                            "GPT-2's BPE files are not here, nor downloadable (hint: make data, or "
                            "DATA_MIRROR_DIR=<a folder with gpt2/encoder.json and gpt2/vocab.bpe>)"):
        sys.path.insert(0, str(ROOT / "scripts"))
        import bpe
        text = "Hello world, ZenFlow's 2 threads!\n  tabs\tand  spaces, caf\u00e9 \u2603"
        ids = transformers.AutoTokenizer.from_pretrained(exported)(text)["input_ids"]
        check(f"{name}: the export's tokenizer (AutoTokenizer) gives our BPE's ids",
              ids == bpe.load_gpt2_tokenizer().encode(text), f"{ids}")
    again = tmp / "again.bin"
    p = convert("import", exported, again)
    check(f"{name}: import(export(file)) is the same file, byte for byte",
          p.returncode == 0 and again.read_bytes() == ours.read_bytes(), p.stderr.strip())
    if safe:  # the tied pair saved under lm_head.weight alone, as safetensors' save_model keeps it
        import safetensors.torch as safetensors_torch
        lm_only = tmp / "lm_head_only"
        model.save_pretrained(lm_only, safe_serialization=True)
        weights = safetensors_torch.load_file(str(lm_only / "model.safetensors"))
        weights["lm_head.weight"] = weights.pop("transformer.wte.weight").clone()
        safetensors_torch.save_file(weights, str(lm_only / "model.safetensors"), metadata={"format": "pt"})
        p = convert("import", lm_only, tmp / "lm_only.bin")
        check(f"{name}: a file with lm_head.weight and no wte.weight imports to the same file",
              p.returncode == 0 and (tmp / "lm_only.bin").read_bytes() == ours.read_bytes(), p.stderr.strip())
        # a folder that holds one weights file and an index of other shards: what transformers loads
        both, other = tmp / "both", tmp / "other_shards"
        shutil.copytree(hf_dir, both)
        random_model(transformers, torch, L, C, NH, V, maxT, seed=7).save_pretrained(
            other, safe_serialization=True, max_shard_size="20KB")
        shards = [f for f in other.iterdir() if f.name.startswith("model-") or f.name.endswith(".index.json")]
        for f in shards:
            shutil.copy(f, both / f.name)
        loaded = transformers.GPT2LMHeadModel.from_pretrained(both, attn_implementation="eager").eval()
        p = convert("import", both, tmp / "both.bin")
        check(f"{name}: beside an index of {len(shards) - 1} other shards, model.safetensors is read, as by "
              f"transformers", p.returncode == 0 and (tmp / "both.bin").read_bytes() == ours.read_bytes()
              and same_bits(hf_forward(torch, loaded, x, y)[0], ref_logits), p.stderr.strip())

    # 4. a checkpoint of a short fine-tuning run, exported from its folder
    if name != "c48":
        return
    run_dir = tmp / "run"
    data = tmp / "train.bin"
    tokens = rng.integers(0, V, size=4 * B * T, dtype=np.uint16)
    head = np.zeros(256, dtype="<i4")
    head[:3] = [20240520, 1, len(tokens)]
    data.write_bytes(head.tobytes() + tokens.astype("<u2").tobytes())
    p = run(trainer, "-e", ours, "-i", data, "-j", data, "-b", B, "-t", T, "-x", 2, "-v", 0, "-s", 0, "-n", 2,
            "-o", run_dir, "-l", "1e-3", "-zo", "zenflow", "-zk", "0.5")
    if not check(f"{name}: the CPU trainer fine-tunes the imported file for 2 steps", p.returncode == 0,
                 p.stderr.strip()[-300:]):
        return
    p = convert("export", run_dir, tmp / "exported_run")
    if not check(f"{name}: export of the checkpoint folder", p.returncode == 0 and "model_00000002.bin" in p.stdout,
                 p.stderr.strip() + p.stdout.strip()):
        return
    # a newer checkpoint whose write did not finish (no manifest) is skipped, as -y 1 skips it;
    # an earlier export's GPT-2 tokenizer beside this vocabulary's model is removed
    shutil.copyfile(run_dir / "model_00000002.bin", run_dir / "model_00000004.bin")
    (tmp / "exported_run" / "vocab.json").write_text("{}")
    p = convert("export", run_dir, tmp / "exported_run")
    check(f"{name}: export of a folder whose newest checkpoint has no manifest: the one before, named",
          p.returncode == 0 and "exported " + str(run_dir / "model_00000002.bin") in p.stdout
          and "skipped newer checkpoints: model_00000004.bin (no manifest" in p.stdout, p.stderr.strip() + p.stdout.strip())
    check(f"{name}: an earlier export's vocab.json is removed", not (tmp / "exported_run" / "vocab.json").exists()
          and "removed an earlier export's vocab.json" in p.stdout, p.stdout.strip())
    (run_dir / "model_00000004.bin").unlink()
    tuned = transformers.GPT2LMHeadModel.from_pretrained(tmp / "exported_run", attn_implementation="eager").eval()
    ref_logits, ref_loss = hf_forward(torch, tuned, x, y)
    logits, loss = our_forward(forward_bin, run_dir / "model_00000002.bin", x, y, tmp)
    check(f"{name}: the checkpoint's weights changed in training", not np.array_equal(ref_logits, hf_forward(torch, model, x, y)[0]))
    compare(f"{name} (checkpoint)", logits, ref_logits, loss, ref_loss)


def one_error_line(name, p, *words):
    lines = p.stderr.strip().splitlines()
    ok = p.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and all(w in lines[0] for w in words)
    check(f"error ({name}): one line naming {', '.join(words)}, exit 1", ok,
          f"exit {p.returncode}, stderr {p.stderr.strip()[-400:]!r}")


def test_errors(transformers, torch, tmp):
    tmp = Path(tmp) / "errors"
    tmp.mkdir()
    # a name, offline, with an empty cache: nothing can be downloaded
    p = convert("import", "gpt2", tmp / "x.bin", env={"HF_HOME": str(tmp / "hf_home")})
    one_error_line("a model name without network", p, "gpt2", "could not be downloaded", "huggingface-cli download")
    check("error (a model name without network): no file written", not (tmp / "x.bin").exists())
    (tmp / "empty").mkdir()
    p = convert("import", tmp / "empty", tmp / "x.bin")
    one_error_line("no config.json", p, "config.json")
    model = random_model(transformers, torch, 1, 32, 2, 64, 8, seed=7)
    model.save_pretrained(tmp / "noweights")
    (tmp / "noweights" / "model.safetensors").unlink()
    p = convert("import", tmp / "noweights", tmp / "x.bin")
    one_error_line("no weights", p, "no model.safetensors or pytorch_model.bin")
    model.config.activation_function = "gelu"
    model.save_pretrained(tmp / "erf")
    p = convert("import", tmp / "erf", tmp / "x.bin")
    one_error_line("erf GELU", p, "activation_function", "gelu_new")
    model.config.activation_function = "gelu_new"
    model.config.tie_word_embeddings = False
    untied = transformers.GPT2LMHeadModel(model.config)
    with torch.no_grad():
        untied.lm_head.weight.copy_(torch.randn_like(untied.lm_head.weight))
    untied.config.tie_word_embeddings = True  # the config says tied, the weights are not
    untied.save_pretrained(tmp / "untied")
    p = convert("import", tmp / "untied", tmp / "x.bin")
    one_error_line("untied lm_head", p, "lm_head.weight differs from wte.weight")
    p = convert("export", tmp / "empty", tmp / "out")
    one_error_line("export of a folder without checkpoints", p, "model_<step>.bin")
    # broken downloads and configs, and outputs that are the wrong kind of thing: one line each
    model.config.tie_word_embeddings = True
    model.save_pretrained(tmp / "good")
    good_config = json.loads((tmp / "good" / "config.json").read_text())
    def variant(name, config=None, weights=None, index=None):
        shutil.copytree(tmp / "good", tmp / name)
        if config is not None:
            (tmp / name / "config.json").write_text(json.dumps(config))
        if weights is not None:
            (tmp / name / "model.safetensors").write_bytes(weights)
        if index is not None:
            (tmp / name / "model.safetensors").unlink()
            (tmp / name / "model.safetensors.index.json").write_text(index)
        return convert("import", tmp / name, tmp / "x.bin")
    one_error_line("a config.json that is a list", variant("cfg_list", config=[good_config]), "not an object")
    one_error_line("n_head 0", variant("nh0", config=dict(good_config, n_head=0)), "n_head 0", "at least 1")
    cut = (tmp / "good" / "model.safetensors").read_bytes()[:-100]
    one_error_line("a model.safetensors cut short", variant("cut", weights=cut), "model.safetensors", "cannot read it")
    one_error_line("an index without weight_map", variant("index", index="{}"), "index.json", "weight_map")
    check("error (broken inputs): no model file written", not (tmp / "x.bin").exists())
    (tmp / "folder.bin").mkdir()
    p = convert("import", tmp / "good", tmp / "folder.bin")
    one_error_line("import to a folder", p, "folder.bin", "a folder")
    check("error (import to a folder): no .tmp left", not (tmp / "folder.bin.tmp").exists())
    p = convert("import", tmp / "good", tmp / "good.bin")
    check("import of the good folder", p.returncode == 0, p.stderr.strip())
    p = convert("export", tmp / "good.bin", tmp / "good.bin")
    one_error_line("export into a file", p, "good.bin", "not a folder")
    data = bytearray((tmp / "good.bin").read_bytes())
    data[28:32] = (256).to_bytes(4, "little")  # Vp 256 for V 64
    (tmp / "vp.bin").write_bytes(bytes(data))
    one_error_line("a model file whose Vp is not V padded", convert("export", tmp / "vp.bin", tmp / "vp"), "Vp=256")


def main():
    forward_bin = sys.argv[1] if len(sys.argv) > 1 else "./forward_gpt2cpu"
    trainer = sys.argv[2] if len(sys.argv) > 2 else "./train_gpt2cpu"
    try:
        import torch
        import transformers
        import safetensors  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: {e.name} is not installed (bash scripts/install_deps.sh installs it)")
        return 0
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(2)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in SHAPES:
            try:
                test_shape(transformers, torch, forward_bin, trainer, shape, tmp)
            except Exception as e:  # a bug here must be a FAIL line, not a bare traceback
                check(f"{shape[0]}: no unexpected exception", False, f"{type(e).__name__}: {e}")
        test_errors(transformers, torch, tmp)
    print(f"hf: {results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
