#!/usr/bin/python3
"""
The PyTorch reference (the oracle) for this project's GPT-2 trainers.

The C++ CPU trainer and the CUDA trainer are tested against what this file computes, so it
is written to be read: one plain fp32 GPT-2 on the CPU, the data loader, the model / token
shard / debug-state file formats of docs/formats.md, and the AdamW of docs/zenflow_spec.md
section 3.1 done by hand, one eager op per line, so that its updates are bitwise the spec's.

Run it with Debian's interpreter, /usr/bin/python3 (python3-torch 1.13, python3-numpy).

Subcommands (each writes its output atomically: temporary file, fsync, rename):
  init        random GPT-2 initialisation -> model file (v3, fp32)
  state       first batch of the loader, forward + backward -> debug state file
  train       N steps of forward, backward, hand AdamW -> one loss per line (+ final model)
  synth-shard uniformly random token ids -> token shard (for tests with tiny vocabularies)

Determinism: torch.use_deterministic_algorithms(True) and a fixed number of CPU threads
(--threads, default 1). Two runs of the same command on the same machine give the same bits.
The forward/backward numbers can depend on the thread count and on the BLAS library (the
order of the sums in a matmul), so the trainers are compared with the forward/backward
within a tolerance; the AdamW arithmetic itself is exact and independent of both.

Internally the model keeps the 16 parameter tensors of the file format, with the per-layer
tensors stacked (L, ...), so gradients come out in the file layout. The only difference to
the file is that wte has V rows here and Vp rows in a file (the padding rows are zero in a
written file and are dropped when reading; their gradient is zero).

It is also a module: `import gpt2_reference as ref` gives GPT, GPTConfig, DataLoader,
HandAdamW, read_model / write_model, read_state / write_state, read_shard / write_shard.
"""

import argparse
import glob
import math
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------
# file formats (docs/formats.md)

HEADER_INTS = 256  # every file starts with 256 int32 = 1024 bytes
HEADER_BYTES = 4 * HEADER_INTS

MODEL_MAGIC, MODEL_VERSION = 20240326, 3  # v3 = fp32 parameters
SHARD_MAGIC, SHARD_VERSION = 20240520, 1
STATE_MAGIC, STATE_VERSION = 20240327, 2

# the 16 parameter tensors, in file order
PARAM_NAMES = [
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
]
# matrices get weight decay, vectors (biases, LayerNorm parameters) do not
MATRIX_NAMES = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}
# the two projections into the residual stream get the smaller init std
RESIDUAL_PROJ_NAMES = {"attprojw", "fcprojw"}
LAYERNORM_WEIGHT_NAMES = {"ln1w", "ln2w", "lnfw"}

DEPTHS = {  # --depth: (layers L, channels C, heads NH)
    "d12": (12, 768, 12),
    "d24": (24, 1024, 16),
    "d36": (36, 1280, 20),
    "d48": (48, 1600, 25),
}


class FormatError(Exception):
    """A problem with a user's file or arguments; the CLI prints str(e) and exits 1."""

    def __init__(self, where, problem, hint=None):
        message = f"error: {where}: {problem}"
        if hint:
            message += f" (hint: {hint})"
        super().__init__(message)


def check_writable(flag, path):
    """raises FormatError unless `path` can be written: checked before the work, not after it"""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise FormatError(flag, f"{path} is a folder", "name a file")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise FormatError(flag, f"cannot write {path}: {folder} is not a folder this user can write",
                          "check the path")


def padded_vocab(V):
    """Vp: V rounded up to a multiple of 128 (50257 -> 50304)."""
    return (V + 127) // 128 * 128


def write_atomic(path, write_fn):
    """Calls write_fn(f) on a temporary file next to path, fsyncs it, renames it to path
    (so a reader never sees a half-written file, and a crash leaves the old one)."""
    tmp_path = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # umask applies
    try:
        with os.fdopen(fd, "wb") as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def make_header(magic, version, *fields):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1] = magic, version
    header[2:2 + len(fields)] = fields
    return header


def read_header(path, magic, version, what, hint):
    """Reads and checks the 1024-byte header; returns it as a numpy int array."""
    if not os.path.isfile(path):
        raise FormatError(path, "no such file", hint)
    size = os.path.getsize(path)
    if size < HEADER_BYTES:
        raise FormatError(path, f"too short to be a {what} ({size} bytes, the header alone "
                          f"is {HEADER_BYTES})", hint)
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS).astype(np.int64)
    if header[0] != magic:
        raise FormatError(path, f"bad magic {header[0]}, expected {magic}", f"not a {what}; "
                          + hint)
    if header[1] != version:
        raise FormatError(path, f"{what} version {header[1]}, expected {version}", hint)
    return header


def write_f32(f, tensor):
    f.write(np.ascontiguousarray(tensor.detach().cpu().numpy(), dtype="<f4").tobytes())


def pad_rows(tensor, rows):
    """tensor (V, C) -> (rows, C) with zero rows appended."""
    padded = torch.zeros((rows,) + tuple(tensor.shape[1:]), dtype=tensor.dtype)
    padded[: tensor.shape[0]] = tensor
    return padded


# ----------------------------------------------------------------------------
# the model

@dataclass
class GPTConfig:
    max_seq_len: int = 1024  # maxT
    vocab_size: int = 50257  # V
    n_layer: int = 12  # L
    n_head: int = 12  # NH
    n_embd: int = 768  # C

    @property
    def padded_vocab_size(self):
        return padded_vocab(self.vocab_size)


def param_shapes(config, wte_rows):
    """The 16 tensor shapes in file order; wte has wte_rows rows (V here, Vp in a file)."""
    maxT, L, C = config.max_seq_len, config.n_layer, config.n_embd
    return {
        "wte": (wte_rows, C), "wpe": (maxT, C),
        "ln1w": (L, C), "ln1b": (L, C),
        "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C),
        "attprojw": (L, C, C), "attprojb": (L, C),
        "ln2w": (L, C), "ln2b": (L, C),
        "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
        "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
        "lnfw": (C,), "lnfb": (C,),
    }


class GPT(nn.Module):
    """GPT-2, with the 16 parameter tensors of the file format as its parameters.

    forward(idx (B,T) int64, targets (B,T) int64) -> logits (B,T,V), mean cross-entropy loss.
    wte is both the token embedding and (transposed) the output projection, so its gradient
    is the sum of both contributions (autograd adds them because it is one parameter).
    """

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "C must be divisible by NH"
        self.config = config
        shapes = param_shapes(config, wte_rows=config.vocab_size)
        self.params = nn.ParameterDict(
            {name: nn.Parameter(torch.zeros(shapes[name])) for name in PARAM_NAMES})

    def attention(self, x, l):
        """Causal self-attention of layer l on x (B, T, C)."""
        P, B, T, C = self.params, x.shape[0], x.shape[1], self.config.n_embd
        NH = self.config.n_head
        hs = C // NH  # head size
        qkv = F.linear(x, P["qkvw"][l], P["qkvb"][l])  # (B, T, 3C)
        q, k, v = qkv.split(C, dim=2)  # each (B, T, C)
        q = q.view(B, T, NH, hs).transpose(1, 2)  # (B, NH, T, hs)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, NH, T, T)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))  # query t sees keys <= t
        att = att.masked_fill(~causal, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, NH, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return F.linear(y, P["attprojw"][l], P["attprojb"][l])

    def mlp(self, x, l):
        P = self.params
        h = F.linear(x, P["fcw"][l], P["fcb"][l])  # (B, T, 4C)
        h = F.gelu(h, approximate="tanh")
        return F.linear(h, P["fcprojw"][l], P["fcprojb"][l])  # (B, T, C)

    def forward(self, idx, targets=None):
        P, config = self.params, self.config
        B, T = idx.shape
        C = config.n_embd
        assert T <= config.max_seq_len, f"T = {T} exceeds the model's maxT {config.max_seq_len}"
        x = F.embedding(idx, P["wte"]) + P["wpe"][:T]  # (B, T, C)
        for l in range(config.n_layer):
            x = x + self.attention(F.layer_norm(x, (C,), P["ln1w"][l], P["ln1b"][l], 1e-5), l)
            x = x + self.mlp(F.layer_norm(x, (C,), P["ln2w"][l], P["ln2b"][l], 1e-5), l)
        x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], 1e-5)
        logits = F.linear(x, P["wte"])  # x @ wte^T: (B, T, V)
        loss = None
        if targets is not None:  # mean over all B*T positions
            loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss

    def gradients(self):
        """The 16 gradients in file order (wte's with V rows; zeros where autograd left None)."""
        return {name: (p.grad if p.grad is not None else torch.zeros_like(p))
                for name, p in self.params.items()}


@torch.no_grad()
def init_gpt2(model, seed):
    """GPT-2 initialisation, drawn with torch.manual_seed(seed) in file order, one
    normal_ call per tensor (wte with V rows): matrices ~ N(0, 0.02), the two residual
    projections ~ N(0, 0.02/sqrt(2L)), LayerNorm weights 1, all biases and LayerNorm biases 0.
    (The values depend on PyTorch's generator; the file written from them is the artifact.)"""
    torch.manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * model.config.n_layer)
    for name in PARAM_NAMES:
        p = model.params[name]
        if name in RESIDUAL_PROJ_NAMES:
            p.normal_(mean=0.0, std=residual_std)
        elif name in MATRIX_NAMES:
            p.normal_(mean=0.0, std=0.02)
        elif name in LAYERNORM_WEIGHT_NAMES:
            p.fill_(1.0)
        else:
            p.zero_()


# ----------------------------------------------------------------------------
# model files

MODEL_HINT = "make one with `gpt2_reference.py init` or llm.c's train_gpt2.py"


def write_model(path, model):
    """Writes the v3 fp32 model file: header, then the 16 tensors, wte padded to Vp rows."""
    cfg = model.config
    Vp = cfg.padded_vocab_size
    header = make_header(MODEL_MAGIC, MODEL_VERSION, cfg.max_seq_len, cfg.vocab_size,
                         cfg.n_layer, cfg.n_head, cfg.n_embd, Vp)

    def write(f):
        f.write(header.tobytes())
        for name in PARAM_NAMES:
            p = model.params[name].detach().float()
            write_f32(f, pad_rows(p, Vp) if name == "wte" else p)

    write_atomic(path, write)


def read_model(path):
    """Reads a v3 fp32 model file into a GPT (fp32, wte with its first V rows)."""
    h = read_header(path, MODEL_MAGIC, MODEL_VERSION, "model file",
                    "this reads fp32 (v3) model files only; " + MODEL_HINT)
    maxT, V, L, NH, C, Vp = (int(v) for v in h[2:8])
    if min(maxT, V, L, NH, C) <= 0 or C % NH != 0 or Vp < V:
        raise FormatError(path, f"inconsistent header maxT={maxT} V={V} L={L} NH={NH} C={C} "
                          f"Vp={Vp}", "corrupt model file")
    config = GPTConfig(max_seq_len=maxT, vocab_size=V, n_layer=L, n_head=NH, n_embd=C)
    shapes = param_shapes(config, wte_rows=Vp)
    counts = [int(np.prod(shapes[name])) for name in PARAM_NAMES]
    expected = HEADER_BYTES + 4 * sum(counts)
    size = os.path.getsize(path)
    if size != expected:
        raise FormatError(path, f"{size} bytes, but the header describes {expected}",
                          "truncated or corrupt model file")
    data = np.fromfile(path, dtype="<f4", offset=HEADER_BYTES)
    model = GPT(config)
    offset = 0
    with torch.no_grad():
        for name, count in zip(PARAM_NAMES, counts):
            values = torch.from_numpy(data[offset:offset + count].astype(np.float32))
            values = values.view(shapes[name])
            if name == "wte":
                values = values[:V]  # the padding rows are not part of the model
            model.params[name].copy_(values)
            offset += count
    return model


# ----------------------------------------------------------------------------
# token shards and the data loader (docs/formats.md, "The data loader")

SHARD_HINT = "make one with `gpt2_reference.py synth-shard` or the data preparation script"


def write_shard(path, tokens):
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > 65535):
        raise ValueError("token ids must fit in uint16")
    header = make_header(SHARD_MAGIC, SHARD_VERSION, tokens.size)

    def write(f):
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())

    write_atomic(path, write)


def read_shard(path):
    """Reads a token shard (header checks, size consistency) -> numpy uint16 array."""
    h = read_header(path, SHARD_MAGIC, SHARD_VERSION, "token shard", SHARD_HINT)
    n = int(h[2])
    size = os.path.getsize(path)
    if n < 0 or size != HEADER_BYTES + 2 * n:
        raise FormatError(path, f"header says {n} tokens but the file holds {size - HEADER_BYTES}"
                          " bytes of tokens", "truncated or corrupt file")
    return np.fromfile(path, dtype="<u2", offset=HEADER_BYTES)


class DataLoader:
    """Batches of B rows of T tokens from the shards matching a glob pattern (sorted).

    next_batch() reads the B*T+1 tokens at position p of the current shard:
    x = tokens[p : p+B*T], y = tokens[p+1 : p+B*T+1], both (B, T) int64. Then p += B*T, and
    if p + B*T + 1 > N the loader moves to the next shard (after the last, the first), p = 0.
    Every shard is checked when the loader is made (header, size, N >= B*T+1, ids < V).
    """

    def __init__(self, pattern, B, T, vocab_size):
        self.B, self.T, self.vocab_size = B, T, vocab_size
        self.paths = sorted(glob.glob(pattern))
        if not self.paths:
            raise FormatError(pattern, "no token shard matches this path",
                              "check the glob pattern; " + SHARD_HINT)
        for path in self.paths:
            self.check_shard(path, read_shard(path))
        self.reset()

    def check_shard(self, path, tokens):
        need = self.B * self.T + 1
        if tokens.size < need:
            raise FormatError(path, f"{tokens.size} tokens, but one batch needs B*T+1 = {need}",
                              "lower -b or -t")
        if tokens.size and int(tokens.max()) >= self.vocab_size:
            i = int(np.argmax(tokens >= self.vocab_size))
            raise FormatError(path, f"token {i} has id {int(tokens[i])}, but the model's "
                              f"vocabulary has {self.vocab_size} ids",
                              "the data was tokenized for another vocabulary")

    def load_shard(self, index):
        self.shard_index = index
        self.tokens = read_shard(self.paths[index])
        self.check_shard(self.paths[index], self.tokens)
        self.position = 0

    def reset(self):
        self.load_shard(0)

    def next_batch(self):
        B, T, p = self.B, self.T, self.position
        buf = torch.from_numpy(self.tokens[p:p + B * T + 1].astype(np.int64))
        x = buf[:-1].view(B, T)
        y = buf[1:].view(B, T)
        self.position += B * T
        if self.position + B * T + 1 > self.tokens.size:
            self.load_shard((self.shard_index + 1) % len(self.paths))
        return x, y


# ----------------------------------------------------------------------------
# debug state files (what the C++/CUDA tests compare against)

def write_state(path, x, y, logits, loss, grads, config):
    """x, y (B,T) ints; logits (B,T,V); loss scalar; grads: the 16 tensors, wte with V rows."""
    B, T = x.shape
    header = make_header(STATE_MAGIC, STATE_VERSION, B, T)

    def write(f):
        f.write(header.tobytes())
        f.write(np.ascontiguousarray(x.numpy(), dtype="<i4").tobytes())
        f.write(np.ascontiguousarray(y.numpy(), dtype="<i4").tobytes())
        write_f32(f, logits.float())
        write_f32(f, loss.reshape(1).float())
        for name in PARAM_NAMES:
            g = grads[name].float()
            write_f32(f, pad_rows(g, config.padded_vocab_size) if name == "wte" else g)

    write_atomic(path, write)


def read_state(path, config):
    """Reads a debug state file written for a model of this config.
    Returns dict: x, y (B,T) int64; logits (B,T,V); loss 0-dim; grads {name: tensor}, wte
    with Vp rows as in the file."""
    h = read_header(path, STATE_MAGIC, STATE_VERSION, "debug state file",
                    "make one with `gpt2_reference.py state`")
    B, T = int(h[2]), int(h[3])
    V = config.vocab_size
    shapes = param_shapes(config, wte_rows=config.padded_vocab_size)
    expected = HEADER_BYTES + 4 * (2 * B * T + B * T * V + 1
                                   + sum(int(np.prod(s)) for s in shapes.values()))
    size = os.path.getsize(path)
    if size != expected:
        raise FormatError(path, f"{size} bytes, expected {expected} for B={B} T={T} and this "
                          "model", "state written for another model, or truncated")
    raw = open(path, "rb").read()
    offset = HEADER_BYTES

    def take(dtype, shape):
        nonlocal offset
        count = int(np.prod(shape))
        a = np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset += 4 * count
        return torch.from_numpy(a.astype(np.int64 if dtype == "<i4" else np.float32))

    state = {"x": take("<i4", (B, T)), "y": take("<i4", (B, T)),
             "logits": take("<f4", (B, T, V)), "loss": take("<f4", (1,))[0]}
    state["grads"] = {name: take("<f4", shapes[name]) for name in PARAM_NAMES}
    return state


# ----------------------------------------------------------------------------
# AdamW by hand, bitwise as docs/zenflow_spec.md 3.1

class HandAdamW:
    """AdamW of spec 3.1: every scalar an fp32 value (a 0-dim float32 tensor, so that PyTorch
    does not convert a Python double on the way), one eager fp32 op per line, no fusing:

        omb1 = 1.0f - b1,  omb2 = 1.0f - b2                   (fp32 subtraction)
        bc1  = (float)(1.0 - pow((double)b1, s)),  bc2 likewise (double, rounded to fp32)
        m    = b1*m + omb1*g
        v    = b2*v + (omb2*g)*g
        mhat = m / bc1,  vhat = v / bc2
        p    = p - lr * (mhat / (sqrt(vhat) + eps) + wd*p)

    Weight decay wd applies to matrices; vectors use 0 (and still compute the 0*p term,
    exactly as the formula says).
    """

    def __init__(self, params, lr=1e-3, weight_decay=0.0, beta1=0.9, beta2=0.95, eps=1e-8):
        """params: dict name -> parameter (decay follows MATRIX_NAMES). An empty dict gives an
        object that only holds the fp32 constants, for callers that keep their own state and
        call update() on it (scripts/zenflow_reference.py)."""
        self.params = dict(params.items())
        self.b1, self.b2 = fp32(beta1), fp32(beta2)
        self.eps, self.lr, self.wd = fp32(eps), fp32(lr), fp32(weight_decay)
        self.zero = fp32(0.0)
        one = fp32(1.0)
        self.omb1 = one - self.b1  # fp32 subtraction
        self.omb2 = one - self.b2
        self.m = {name: torch.zeros_like(p) for name, p in self.params.items()}
        self.v = {name: torch.zeros_like(p) for name, p in self.params.items()}

    def bias_corrections(self, s):
        bc1 = fp32(1.0 - float(self.b1) ** s)  # float(b1) is the fp32 value, exactly
        bc2 = fp32(1.0 - float(self.b2) ** s)
        return bc1, bc2

    @torch.no_grad()
    def update(self, s, p, g, m, v, decay):
        """The spec 3.1 arithmetic on any tensors of one shape (a whole parameter, or a gathered
        subset of its elements): returns the new (p, m, v) as new tensors, inputs untouched.
        Every op is elementwise, so an element's result does not depend on which other
        elements are updated with it. decay: apply the weight decay (matrices) or 0 (vectors)."""
        b1, b2, omb1, omb2, eps, lr = self.b1, self.b2, self.omb1, self.omb2, self.eps, self.lr
        bc1, bc2 = self.bias_corrections(s)
        wd = self.wd if decay else self.zero
        m = b1 * m + omb1 * g
        v = b2 * v + (omb2 * g) * g
        mhat = m / bc1
        vhat = v / bc2
        p = p - lr * (mhat / (torch.sqrt(vhat) + eps) + wd * p)
        return p, m, v

    @torch.no_grad()
    def step(self, s, grads=None):
        """One update with step number s = t + 1. grads: dict name -> g (default: p.grad)."""
        for name, p in self.params.items():
            g = grads[name] if grads is not None else p.grad
            new_p, self.m[name], self.v[name] = self.update(
                s, p, g, self.m[name], self.v[name], decay=name in MATRIX_NAMES)
            p.copy_(new_p)


def fp32(value):
    """A 0-dim float32 tensor holding value rounded to fp32 (round to nearest)."""
    return torch.tensor(float(value), dtype=torch.float32)


# ----------------------------------------------------------------------------
# command line

def setup_torch(threads=1):
    """Deterministic fp32 CPU PyTorch with a fixed thread count."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    torch.set_default_dtype(torch.float32)


def forward_backward(model, x, y):
    model.zero_grad(set_to_none=True)
    logits, loss = model(x, y)
    loss.backward()
    return logits.detach(), loss.detach()


def cmd_init(args):
    if args.depth is not None:
        if any(v is not None for v in (args.layers, args.channels, args.heads)):
            raise FormatError("init", "give either --depth or --layers/--channels/--heads")
        L, C, NH = DEPTHS[args.depth]
    else:
        if any(v is None for v in (args.layers, args.channels, args.heads)):
            raise FormatError("init", "give --depth, or all of --layers --channels --heads")
        L, C, NH = args.layers, args.channels, args.heads
    if min(L, C, NH, args.vocab, args.max_seq_len) <= 0 or C % NH != 0:
        raise FormatError("init", f"bad shape L={L} C={C} NH={NH} V={args.vocab} "
                          f"maxT={args.max_seq_len}", "all positive, C divisible by NH")
    config = GPTConfig(max_seq_len=args.max_seq_len, vocab_size=args.vocab, n_layer=L,
                       n_head=NH, n_embd=C)
    model = GPT(config)
    init_gpt2(model, args.seed)
    write_model(args.out, model)
    n = sum(p.numel() for p in model.parameters())
    print(f"init: wrote {args.out}: L={L} C={C} NH={NH} V={config.vocab_size} "
          f"Vp={config.padded_vocab_size} maxT={config.max_seq_len} seed={args.seed}, "
          f"{n} parameters")


def check_T(model, T):
    if T > model.config.max_seq_len:
        raise FormatError("-t", f"T = {T} exceeds the model's maxT {model.config.max_seq_len}",
                          "lower -t")


def cmd_state(args):
    check_writable("--out", args.out)
    model = read_model(args.model)
    check_T(model, args.T)
    loader = DataLoader(args.data, args.B, args.T, model.config.vocab_size)
    x, y = loader.next_batch()
    logits, loss = forward_backward(model, x, y)
    write_state(args.out, x, y, logits, loss, model.gradients(), model.config)
    print(f"state: wrote {args.out}: B={args.B} T={args.T} loss {float(loss):.9g}")


def cmd_train(args):
    check_writable("--out", args.out)
    check_writable("--out-model", args.out_model)
    model = read_model(args.model)
    check_T(model, args.T)
    loader = DataLoader(args.data, args.B, args.T, model.config.vocab_size)
    opt = HandAdamW(model.params, lr=args.lr, weight_decay=args.wd, beta1=args.beta1,
                    beta2=args.beta2, eps=args.eps)
    lines = [f"# gpt2_reference.py train model={args.model} data={args.data} B={args.B} "
             f"T={args.T} steps={args.steps} lr={args.lr!r} wd={args.wd!r} "
             f"beta1={args.beta1!r} beta2={args.beta2!r} eps={args.eps!r} "
             f"threads={args.threads} torch={torch.__version__}\n"]
    for t in range(args.steps):
        x, y = loader.next_batch()
        _, loss = forward_backward(model, x, y)
        opt.step(t + 1)
        lines.append(f"{t} {float(loss):.9g}\n")
        if not args.quiet:
            print(f"step {t}: loss {float(loss):.9g}", flush=True)
    write_atomic(args.out, lambda f: f.write("".join(lines).encode()))
    if args.out_model:
        write_model(args.out_model, model)
    print(f"train: wrote {args.out}" + (f" and {args.out_model}" if args.out_model else ""))


def cmd_synth_shard(args):
    if not 0 < args.vocab <= 65536 or args.tokens < 0:
        raise FormatError("synth-shard", f"bad --vocab {args.vocab} or --tokens {args.tokens}",
                          "0 < V <= 65536 (uint16 ids), N >= 0")
    rng = np.random.RandomState(args.seed)
    tokens = rng.randint(0, args.vocab, size=args.tokens).astype(np.uint16)
    write_shard(args.out, tokens)
    print(f"synth-shard: wrote {args.out}: {args.tokens} tokens < {args.vocab}")


def add_batch_args(p):
    """the model file, the data and the batch, as both references take them"""
    p.add_argument("--model", required=True, help="v3 fp32 model file")
    p.add_argument("--data", required=True, help="glob pattern of token shards")
    p.add_argument("-b", "--batch-size", dest="B", type=int, required=True)
    p.add_argument("-t", "--seq-len", dest="T", type=int, required=True)


def add_adamw_args(p):
    """N steps of AdamW with these settings (the trainers' defaults)"""
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)


def build_parser():
    parser = argparse.ArgumentParser(description="PyTorch reference GPT-2 (the oracle).")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for PyTorch (default 1, for reproducible bits)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("init", help="random GPT-2 init -> model file")
    p.add_argument("--out", required=True)
    p.add_argument("--depth", choices=sorted(DEPTHS))
    p.add_argument("--layers", type=int)
    p.add_argument("--channels", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--seed", type=int, default=1337)
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("state", help="first batch, forward+backward -> debug state file")
    add_batch_args(p)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_state)

    p = sub.add_parser("train", help="N steps with the hand AdamW -> losses text file")
    add_batch_args(p)
    p.add_argument("--out", required=True)
    add_adamw_args(p)
    p.add_argument("--out-model", help="also write the final model here")
    p.add_argument("--quiet", action="store_true", help="no per-step line on stdout")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("synth-shard", help="uniformly random token ids -> token shard")
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_synth_shard)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    for name in ("B", "T", "steps"):
        if getattr(args, name, 1) is not None and getattr(args, name, 1) <= 0:
            print(f"error: {name} must be positive", file=sys.stderr)
            return 1
    if args.threads <= 0:
        print("error: --threads must be positive", file=sys.stderr)
        return 1
    setup_torch(args.threads)
    try:
        args.func(args)
    except FormatError as e:
        print(str(e), file=sys.stderr)
        return 1
    except OSError as e:  # a file that could not be read or written: one line, not a traceback
        print(f"error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
