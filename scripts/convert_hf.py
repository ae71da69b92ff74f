"""
Hugging Face GPT-2 checkpoints to llm.c model files, and back.

    python3 scripts/convert_hf.py import SRC OUT.bin
        SRC: a Hugging Face model folder (config.json and model.safetensors or
        pytorch_model.bin, also sharded with an index), or a model name: gpt2, gpt2-medium,
        gpt2-large, gpt2-xl, distilgpt2 (downloaded by huggingface_hub, or found in its cache)
    python3 scripts/convert_hf.py export SRC DIR
        SRC: an llm.c model file, or a run's checkpoint folder (-o; the model_*.bin of its
        newest checkpoint whose manifest is there, as -y 1 chooses)
        DIR: a folder that transformers' GPT2LMHeadModel.from_pretrained(DIR) loads; with
        GPT-2's vocabulary also its tokenizer (vocab.json and merges.txt: GPT-2's own BPE
        files), so that AutoTokenizer and pipeline("text-generation", DIR) load it too (an
        earlier export's tokenizer files beside a model of another vocabulary are removed)

What the conversion does (the model file's layout: docs/formats.md):
- Names. HF's tensors are named per layer (h.<l>.attn.c_attn.weight, ...), with or without
  the prefix "transformer." (GPT2LMHeadModel's and GPT2Model's checkpoints); ours are 16
  tensors with the layers stacked: qkvw is every layer's c_attn.weight, one after another.
  TENSORS below is the table. HF's "attn.bias" and "attn.masked_bias" are the causal mask and
  its fill value, buffers rather than weights: skipped on import, not written on export.
- Transposes. HF's GPT-2 computes its linear layers with Conv1D, whose weight is stored
  (in, out): y = x W + b. Ours are (out, in) like nn.Linear: y = x W^T + b. So the four
  matrices of every layer (c_attn, attn.c_proj, c_fc, mlp.c_proj) are transposed, both ways.
  wte and wpe are embeddings, (rows, C) on both sides, not transposed.
- The tied output layer. GPT-2's lm_head is wte itself (logits = x wte^T). We store wte once;
  an import refuses a checkpoint whose lm_head.weight differs from wte (not GPT-2's
  architecture); an export writes no lm_head.weight, and transformers ties it to wte on load.
- The padded vocabulary. Our wte has Vp rows, V rounded up to a multiple of 128 (50257 ->
  50304) for faster matmuls; the padded rows are zero on import and never take part in the
  loss, so they stay zero in training (their gradient is zero). An export drops them.
- Everything is fp32: an fp16 or bf16 checkpoint is widened exactly; the export is fp32.
- The math must be GPT-2's, as our trainers compute it: GELU "gelu_new" (the tanh
  approximation), LayerNorm epsilon 1e-5, attention scaled by 1/sqrt(head size), the MLP 4C
  wide, no cross-attention. A config.json that says otherwise is refused with the key named.
Both directions are exact: HF -> ours -> HF gives back the same bits (dev/test/test_hf.py).

Needs torch and safetensors (and huggingface_hub for a model name); bash
scripts/install_deps.sh installs them. Errors are one line, `error: ...`, and exit code 1.
"""

import argparse
import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

import data_files

MODEL_MAGIC, MODEL_VERSION = 20240326, 3
NAMES = ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2"]
# ours, in file order -> HF's name (per layer: "h.{l}." before it) and whether it is transposed
TENSORS = [
    ("wte", "wte.weight", False), ("wpe", "wpe.weight", False),
    ("ln1w", "ln_1.weight", False), ("ln1b", "ln_1.bias", False),
    ("qkvw", "attn.c_attn.weight", True), ("qkvb", "attn.c_attn.bias", False),
    ("attprojw", "attn.c_proj.weight", True), ("attprojb", "attn.c_proj.bias", False),
    ("ln2w", "ln_2.weight", False), ("ln2b", "ln_2.bias", False),
    ("fcw", "mlp.c_fc.weight", True), ("fcb", "mlp.c_fc.bias", False),
    ("fcprojw", "mlp.c_proj.weight", True), ("fcprojb", "mlp.c_proj.bias", False),
    ("lnfw", "ln_f.weight", False), ("lnfb", "ln_f.bias", False),
]
PER_LAYER = {name for name, _, _ in TENSORS[2:14]}
MASK_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


class ConvertError(Exception):
    """a user error: str() is the one line printed"""


def pad_vocab(V):
    return (V + 127) // 128 * 128


def shapes(L, C, V, maxT):
    """our 16 tensors' shapes (docs/formats.md)"""
    per_layer = {"ln1w": (C,), "ln1b": (C,), "qkvw": (3 * C, C), "qkvb": (3 * C,), "attprojw": (C, C),
                 "attprojb": (C,), "ln2w": (C,), "ln2b": (C,), "fcw": (4 * C, C), "fcb": (4 * C,),
                 "fcprojw": (C, 4 * C), "fcprojb": (C,)}
    out = {"wte": (pad_vocab(V), C), "wpe": (maxT, C), "lnfw": (C,), "lnfb": (C,)}
    out.update({k: (L, *s) for k, s in per_layer.items()})
    return [out[name] for name, _, _ in TENSORS]


def need(module, what):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise ConvertError(f"{what} needs the Python package {module.split('.')[0]} "
                           f"(hint: bash scripts/install_deps.sh)")


# -----------------------------------------------------------------------------
# import: HF -> ours

def find_folder(src):
    """the folder of SRC: itself, or the download (or cache) of a model name"""
    if Path(src).is_dir():
        return Path(src)
    if Path(src).exists() or src.startswith((".", "/")) or src.count("/") > 1:
        raise ConvertError(f"{src}: not a model folder (hint: a folder with config.json and "
                           f"model.safetensors, or a model name: {', '.join(NAMES)})")
    hub = need("huggingface_hub", f"downloading {src}")
    patterns = ["config.json", "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json"]
    try:
        return Path(hub.snapshot_download(src, allow_patterns=patterns))
    except Exception as e:  # offline, unknown name, no network: the hub's errors vary
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConvertError(f"{src}: no such folder, and the model could not be downloaded ({reason}) "
                           f"(hint: on a machine with network, `huggingface-cli download {src} config.json "
                           f"model.safetensors --local-dir {src}`, then copy the folder here and pass its path)")


def read_config(folder):
    path = folder / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{path}: missing (hint: a Hugging Face model folder holds config.json "
                           f"next to the weights)")
    except (ValueError, UnicodeDecodeError) as e:
        raise ConvertError(f"{path}: not JSON ({e})")
    if not isinstance(cfg, dict):
        raise ConvertError(f"{path}: a JSON {type(cfg).__name__}, not an object (hint: is it a model's config.json?)")
    if cfg.get("model_type") != "gpt2":
        raise ConvertError(f"{path}: model_type {cfg.get('model_type')!r}, not 'gpt2' (hint: only GPT-2 "
                           f"checkpoints convert)")
    try:
        L, C, NH, V = (int(cfg[k]) for k in ("n_layer", "n_embd", "n_head", "vocab_size"))
        maxT = int(cfg.get("n_positions", cfg.get("n_ctx")))
    except (KeyError, TypeError, ValueError) as e:
        raise ConvertError(f"{path}: no usable {e} (hint: a GPT-2 config has n_layer, n_embd, n_head, "
                           f"vocab_size, n_positions)")
    if min(L, C, NH, V, maxT) < 1:
        raise ConvertError(f"{path}: n_layer {L}, n_embd {C}, n_head {NH}, vocab_size {V}, n_positions {maxT}: "
                           f"each must be at least 1")
    # the math our trainers compute (the header says why each matters)
    want = {"activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False,
            "tie_word_embeddings": True}
    for key, value in want.items():
        if key in cfg and cfg[key] != value:
            raise ConvertError(f"{path}: {key} is {cfg[key]!r}; the trainers compute GPT-2 with {value!r}")
    if cfg.get("n_inner") not in (None, 4 * C):
        raise ConvertError(f"{path}: n_inner is {cfg['n_inner']}; the trainers' MLP is 4 * n_embd = {4 * C}")
    if C % NH or V > 65536:
        raise ConvertError(f"{path}: n_embd {C} not divisible by n_head {NH}, or vocab_size {V} over 65536 "
                           f"(token shards store ids as uint16)")
    return L, C, NH, V, maxT


def read_weights(folder):
    """every tensor of the folder's weights as fp32 numpy arrays, the prefix "transformer." dropped"""
    torch = need("torch", "reading the weights")
    files = []
    # transformers' order: safetensors before pytorch_model, one file before an index of shards
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json"):
        if not (folder / name).is_file():
            continue
        if name.endswith(".index.json"):
            try:
                files = sorted({folder / f for f in json.loads((folder / name).read_text())["weight_map"].values()})
            except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
                raise ConvertError(f"{folder / name}: not an index of weight files ({type(e).__name__}: {e}) "
                                   f"(hint: its weight_map names each tensor's file)")
        else:
            files = [folder / name]
        break
    if not files:
        raise ConvertError(f"{folder}: no model.safetensors or pytorch_model.bin (hint: download the "
                           f"weights too, not only config.json)")
    tensors = {}
    for f in files:
        try:
            if f.suffix == ".safetensors":
                part = need("safetensors.torch", f"reading {f.name}").load_file(str(f))
            else:
                part = torch.load(str(f), map_location="cpu", weights_only=True)
        except Exception as e:  # the readers' errors vary (SafetensorError, UnpicklingError, OSError, ...)
            raise ConvertError(f"{f}: cannot read it ({str(e).splitlines()[0] if str(e) else type(e).__name__}) "
                               f"(hint: a download cut short? fetch the file again)")
        for name, t in part.items():
            name = name[len("transformer."):] if name.startswith("transformer.") else name
            tensors[name] = t.detach().to(torch.float32).numpy()
    return tensors


def hf_to_ours(tensors, L, C, V, maxT, where):
    """our 16 tensors, in file order, from HF's (the header says how)"""
    lm_head = tensors.pop("lm_head.weight", None)
    if lm_head is not None:
        tensors.setdefault("wte.weight", lm_head)  # (a file that kept only one name of the tied pair)
        if not np.array_equal(lm_head, tensors["wte.weight"]):
            raise ConvertError(f"{where}: lm_head.weight differs from wte.weight (hint: GPT-2 ties them; an "
                               f"untied output layer is not GPT-2's architecture)")
    used = set()

    def take(name, shape, transpose):
        if name not in tensors:
            raise ConvertError(f"{where}: no tensor {name} (hint: is it a GPT-2 checkpoint?)")
        t = tensors[name].T if transpose else tensors[name]
        if t.shape != shape:
            raise ConvertError(f"{where}: {name} has shape {tensors[name].shape}, config.json's sizes "
                               f"need {shape[::-1] if transpose else shape}")
        used.add(name)
        return t

    out = []
    for (ours, hf, transpose), shape in zip(TENSORS, shapes(L, C, V, maxT)):
        if ours in PER_LAYER:
            out.append(np.stack([take(f"h.{l}.{hf}", shape[1:], transpose) for l in range(L)]))
        elif ours == "wte":
            wte = np.zeros(shape, dtype=np.float32)
            wte[:V] = take(hf, (V, C), False)
            out.append(wte)
        else:
            out.append(take(hf, shape, False))
    extra = sorted(k for k in tensors if k not in used and not MASK_BUFFERS.fullmatch(k))
    if extra:
        raise ConvertError(f"{where}: tensors that are not GPT-2's: {', '.join(extra[:5])} (hint: only "
                           f"GPT2LMHeadModel or GPT2Model checkpoints convert)")
    return out


def write_model(path, L, C, NH, V, maxT, arrays):
    header = np.zeros(256, dtype="<i4")
    header[:8] = [MODEL_MAGIC, MODEL_VERSION, maxT, V, L, NH, C, pad_vocab(V)]
    path = Path(path)
    if path.is_dir():
        raise ConvertError(f"{path}: a folder (hint: name the model file to write, e.g. {path / 'model.bin'})")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            for a in arrays:
                f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # (a full disk: no half file left)
        raise


def do_import(src, out):
    folder = find_folder(src)
    L, C, NH, V, maxT = read_config(folder)
    arrays = hf_to_ours(read_weights(folder), L, C, V, maxT, folder)
    write_model(out, L, C, NH, V, maxT, arrays)
    n = sum(a.size for a in arrays)
    print(f"imported {src}: L={L} C={C} NH={NH} V={V} (padded to {pad_vocab(V)}) maxT={maxT}, "
          f"{n:,} parameters, to {out}")


# -----------------------------------------------------------------------------
# export: ours -> HF

def newest_model(src):
    """SRC itself, or the model_<step>.bin of a checkpoint folder's newest checkpoint whose write
    finished: its manifest, written last, is there and gives the model file's size (as -y 1
    chooses; the checksums are the trainer's to verify). Newer ones are named and skipped."""
    p = Path(src)
    if p.is_dir():
        models = sorted(p.glob("model_[0-9]*.bin"), reverse=True)
        if not models:
            raise ConvertError(f"{src}: a folder without checkpoints model_<step>.bin (hint: train with "
                               f"-o {src} -n <every N steps>, or pass a model file)")
        skipped = []
        for model in models:
            manifest = p / model.name.replace("model_", "manifest_").replace(".bin", ".txt")
            text = manifest.read_text(errors="replace") if manifest.is_file() else ""
            size = re.search(rf"^model {re.escape(model.name)} (\d+) ", text, re.M)
            if size is not None and int(size.group(1)) == model.stat().st_size:
                if skipped:
                    print(f"note: skipped newer checkpoints: {', '.join(skipped)}")
                return model
            skipped.append(f"{model.name} ({'not the size its manifest gives' if text else 'no manifest: its write did not finish'})")
        raise ConvertError(f"{src}: no checkpoint whose write finished: {', '.join(skipped)} (hint: pass a model "
                           f"file)")
    if not p.is_file():
        raise ConvertError(f"{src}: no such model file or checkpoint folder")
    return p


def read_model(path):
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = struct.unpack("<8i", f.read(32)) if size >= 1024 else None
    if header is None:
        raise ConvertError(f"{path}: too short to be a model file ({size} bytes)")
    if header[0] != MODEL_MAGIC or header[1] != MODEL_VERSION:
        raise ConvertError(f"{path}: magic {header[0]} version {header[1]}, not an llm.c fp32 model file "
                           f"({MODEL_MAGIC}, {MODEL_VERSION})")
    maxT, V, L, NH, C, Vp = header[2:8]
    if min(L, C, NH, V, maxT) < 1 or C % NH or Vp != pad_vocab(V):
        raise ConvertError(f"{path}: the header's L={L} C={C} NH={NH} V={V} Vp={Vp} maxT={maxT} is not a GPT-2 "
                           f"shape (NH divides C; Vp is V rounded up to a multiple of 128) (hint: corrupt file)")
    want = shapes(L, C, V, maxT)
    n = sum(int(np.prod(s)) for s in want)
    if size != 1024 + 4 * n:
        raise ConvertError(f"{path}: {size} bytes, the header's shape needs {1024 + 4 * n} (hint: "
                           f"truncated or corrupt file)")
    flat = np.fromfile(path, dtype="<f4", offset=1024)
    arrays, at = [], 0
    for s in want:
        count = int(np.prod(s))
        arrays.append(flat[at:at + count].reshape(s))
        at += count
    return (L, C, NH, V, maxT), arrays


def ours_to_hf(L, V, arrays):
    """HF's tensors (GPT2LMHeadModel's names) from our 16"""
    out = {}
    for (ours, hf, transpose), a in zip(TENSORS, arrays):
        if ours in PER_LAYER:
            for l in range(L):
                out[f"transformer.h.{l}.{hf}"] = a[l].T if transpose else a[l]
        else:
            out[f"transformer.{hf}"] = a[:V] if ours == "wte" else a
    return out


def hf_config(L, C, NH, V, maxT):
    # GPT-2's <|endoftext|>, 50256, also where tokens were added after it (a small test vocabulary: its last)
    eot = 50256 if V > 50256 else V - 1
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": maxT,
            "n_embd": C, "n_layer": L, "n_head": NH, "n_inner": None, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
            "initializer_range": 0.02, "scale_attn_weights": True, "tie_word_embeddings": True,
            "bos_token_id": eot, "eos_token_id": eot, "torch_dtype": "float32"}


def do_export(src, out):
    torch = need("torch", "export")
    save_file = need("safetensors.torch", "export").save_file
    path = newest_model(src)
    (L, C, NH, V, maxT), arrays = read_model(path)
    if np.any(arrays[0][V:]):
        print(f"note: {path}: the padded rows of wte are not zero; they never reach the loss and are dropped")
    tensors = {k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in ours_to_hf(L, V, arrays).items()}
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConvertError(f"{out}: a file, not a folder (hint: name the folder to write the Hugging Face files to)")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(hf_config(L, C, NH, V, maxT), indent=2) + "\n")
    tokenizer = export_tokenizer(out) if V == 50257 else ""
    files = "config.json, model.safetensors" + tokenizer
    stale = [] if V == 50257 else [n for n in ("vocab.json", "merges.txt") if (out / n).exists()]
    for name in stale:  # an earlier export's tokenizer, not this model's
        (out / name).unlink()
    removed = f"; removed an earlier export's {', '.join(stale)}" if stale else ""
    print(f"exported {path}: L={L} C={C} NH={NH} V={V} maxT={maxT} to {out} ({files}){removed}")


def export_tokenizer(out):
    """GPT-2's tokenizer beside the model: its BPE files under transformers' names"""
    try:
        vocab, merges = data_files.input_path("gpt2/encoder.json"), data_files.input_path("gpt2/vocab.bpe")
    except data_files.InputError as e:
        print(f"note: no tokenizer written ({str(e).removeprefix('error: ')})")
        return ""
    shutil.copyfile(vocab, out / "vocab.json")
    shutil.copyfile(merges, out / "merges.txt")
    return ", vocab.json, merges.txt (GPT-2's tokenizer)"


def main():
    parser = argparse.ArgumentParser(description="Hugging Face GPT-2 <-> llm.c model files")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("import", help="a Hugging Face folder or model name -> an llm.c model file")
    p.add_argument("src", help=f"a model folder, or a name: {', '.join(NAMES)}")
    p.add_argument("out", help="the model file to write, e.g. gpt2_124M.bin")
    p = sub.add_parser("export", help="an llm.c model file or checkpoint folder -> a Hugging Face folder")
    p.add_argument("src", help="a model file, or a checkpoint folder (its newest finished checkpoint)")
    p.add_argument("out", help="the folder to write (config.json, model.safetensors; the tokenizer's files)")
    args = parser.parse_args()
    try:
        (do_import if args.command == "import" else do_export)(args.src, args.out)
    except ConvertError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:  # a file that cannot be read or written (a full disk, no permission)
        print(f"error: {e.filename or args.out}: {e.strerror} (hint: check the path and the space)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
