#!/usr/bin/python3
"""
Self-checks of the PyTorch reference (scripts/gpt2_reference.py), the oracle of the project.

    /usr/bin/python3 dev/test/test_reference.py

Prints one line per check and `reference: N passed, M failed`; exits 1 if any failed.
Everything runs on the CPU in a temporary directory, in well under a minute.
"""

import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import gpt2_reference as ref  # noqa: E402
import runner  # noqa: E402  dev/test/runner.py

SCRIPT = os.path.join(SCRIPTS, "gpt2_reference.py")
TMP = tempfile.mkdtemp(prefix="test_reference_")


def tmp(name):
    return os.path.join(TMP, name)


def run_cli(*args):
    """Runs the reference CLI; returns (exit code, stdout, stderr)."""
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def tiny_config(V=11, L=2, C=8, NH=2, maxT=8):
    return ref.GPTConfig(max_seq_len=maxT, vocab_size=V, n_layer=L, n_head=NH, n_embd=C)


def random_model(config, seed, std=0.3):
    """A model whose every parameter (LayerNorm ones too) is random, so no gradient is
    trivially zero or one."""
    model = ref.GPT(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


# ----------------------------------------------------------------------------
# the checks


def test_adamw_bitwise_vs_scalar_formula():
    """HandAdamW == spec 3.1 evaluated per element with numpy float32 scalars, bit for bit,
    over several steps, for a decayed matrix and an undecayed vector."""
    rng = np.random.RandomState(0)
    hyper = dict(lr=6e-4, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8)
    shapes = {"qkvw": (30, 41), "ln1b": (203,)}  # sizes with vector-loop tails
    # magnitudes spread over many decades, so rounding differences would show
    def draw(shape):
        return (rng.randn(*shape) * 10.0 ** rng.uniform(-6, 1, size=shape)).astype(np.float32)
    p0 = {name: draw(shape) for name, shape in shapes.items()}
    grads = [{name: draw(shape) for name, shape in shapes.items()} for _ in range(4)]

    params = {name: torch.nn.Parameter(torch.from_numpy(p0[name].copy())) for name in shapes}
    opt = ref.HandAdamW(params, **hyper)
    for s, g in enumerate(grads, start=1):
        opt.step(s, grads={name: torch.from_numpy(g[name]) for name in shapes})

    f = np.float32
    b1, b2, eps, lr = f(hyper["beta1"]), f(hyper["beta2"]), f(hyper["eps"]), f(hyper["lr"])
    omb1, omb2 = f(1.0) - b1, f(1.0) - b2
    for name in shapes:
        wd = f(hyper["weight_decay"]) if name in ref.MATRIX_NAMES else f(0.0)
        expected = p0[name].copy().reshape(-1)
        for i in range(expected.size):
            p, m, v = expected[i], f(0.0), f(0.0)
            for s, g_all in enumerate(grads, start=1):
                g = g_all[name].reshape(-1)[i]
                bc1 = f(1.0 - float(b1) ** s)
                bc2 = f(1.0 - float(b2) ** s)
                m = b1 * m + omb1 * g
                v = b2 * v + (omb2 * g) * g
                mhat = m / bc1
                vhat = v / bc2
                p = p - lr * (mhat / (np.sqrt(vhat) + eps) + wd * p)
                assert type(p) is np.float32
            expected[i] = p
        got = params[name].detach().numpy().reshape(-1)
        bad = np.flatnonzero(got.view(np.uint32) != expected.view(np.uint32))
        assert bad.size == 0, f"{name}: {bad.size} elements differ, e.g. {got[bad[0]]!r} vs " \
                              f"{expected[bad[0]]!r}"


def test_adamw_close_to_torch_optim():
    """The hand AdamW is AdamW: torch.optim.AdamW (same hyperparameters, decay on matrices
    only), fed the same gradients, lands within fp32 rounding of it. (The gradients are fixed
    random tensors, not the model's: Adam normalises near-zero gradients, such as the key
    bias's, to steps of size lr, so a feedback through the loss would amplify roundoff.)"""
    config = tiny_config()
    a, b = random_model(config, 1), random_model(config, 1)
    opt_a = ref.HandAdamW(a.params, lr=1e-2, weight_decay=0.1)
    groups = [
        {"params": [p for n, p in b.params.items() if n in ref.MATRIX_NAMES], "weight_decay": 0.1},
        {"params": [p for n, p in b.params.items() if n not in ref.MATRIX_NAMES],
         "weight_decay": 0.0},
    ]
    opt_b = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(2)
    for s in range(1, 4):
        grads = {n: torch.randn(p.shape, generator=gen) for n, p in a.params.items()}
        for n, p in b.params.items():
            p.grad = grads[n].clone()
        opt_a.step(s, grads=grads)
        opt_b.step()
    for name in ref.PARAM_NAMES:
        diff = (a.params[name] - b.params[name]).abs().max().item()
        # 3 steps of a dozen fp32 operations on values below 1: rounding stays near 1e-7; a
        # wrong term (a bias correction, decay on a vector) moves a parameter by about lr = 1e-2
        assert diff < 1e-6, f"{name}: max difference {diff}"


def test_model_file_roundtrip():
    config = tiny_config(V=130)  # Vp = 256: 126 padding rows
    model = random_model(config, 4)
    path = tmp("roundtrip.bin")
    ref.write_model(path, model)
    header = np.fromfile(path, dtype="<i4", count=256)
    assert list(header[:8]) == [20240326, 3, 8, 130, 2, 2, 8, 256], header[:8]
    assert not header[8:].any()
    back = ref.read_model(path)
    assert back.config == config
    for name in ref.PARAM_NAMES:
        assert torch.equal(back.params[name], model.params[name]), name
    wte_in_file = np.fromfile(path, dtype="<f4", offset=1024, count=256 * 8).reshape(256, 8)
    assert np.array_equal(wte_in_file[:130], model.params["wte"].detach().numpy())
    assert not wte_in_file[130:].any(), "padding rows of wte must be zero"
    # a second write of the read model gives the same bytes
    ref.write_model(tmp("roundtrip2.bin"), back)
    assert open(path, "rb").read() == open(tmp("roundtrip2.bin"), "rb").read()


def test_init_statistics_and_determinism():
    code, out, err = run_cli("init", "--out", tmp("init.bin"), "--layers", "4", "--channels",
                             "128", "--heads", "4", "--vocab", "300", "--max-seq-len", "64")
    assert code == 0, err
    model = ref.read_model(tmp("init.bin"))
    P, L = model.params, 4

    # The std of n normal samples is off by about std / sqrt(2 n): 0.8% for the smallest tensor
    # here (wpe, 64 x 128), so 3% is 4 sigma; a missing 1/sqrt(2L) is off by 65%. The mean's
    # error is std / sqrt(n), below 3e-4: 1e-3 catches a shifted (one-sided) init.
    def close(value, target, rel):
        return abs(value - target) <= rel * target

    for name in ("wte", "wpe", "qkvw", "fcw"):
        std = P[name].std().item()
        assert close(std, 0.02, 0.03), f"{name} std {std}"
    for name in ("attprojw", "fcprojw"):
        std = P[name].std().item()
        assert close(std, 0.02 / math.sqrt(2 * L), 0.03), f"{name} std {std}"
    for name in ("wte", "qkvw", "attprojw"):
        assert abs(P[name].mean().item()) < 1e-3, f"{name} mean"
    for name in ("ln1w", "ln2w", "lnfw"):
        assert torch.equal(P[name], torch.ones_like(P[name])), name
    for name in ("ln1b", "ln2b", "lnfb", "qkvb", "attprojb", "fcb", "fcprojb"):
        assert not P[name].any(), name
    # seeded: same seed -> same bytes, another seed -> other bytes
    for out, seed in (("init_again.bin", []), ("init_seed2.bin", ["--seed", "2"])):
        code, _, err = run_cli("init", "--out", tmp(out), "--layers", "4", "--channels", "128",
                               "--heads", "4", "--vocab", "300", "--max-seq-len", "64", *seed)
        assert code == 0, err
    first = open(tmp("init.bin"), "rb").read()
    assert first == open(tmp("init_again.bin"), "rb").read(), "init is not deterministic"
    assert first != open(tmp("init_seed2.bin"), "rb").read(), "seed has no effect"


def test_depth_presets():
    assert ref.DEPTHS == {"d12": (12, 768, 12), "d24": (24, 1024, 16), "d36": (36, 1280, 20),
                          "d48": (48, 1600, 25)}
    assert ref.padded_vocab(50257) == 50304 and ref.padded_vocab(128) == 128
    # GPT-2 small's parameter count, as in the literature (124M, with V rows for wte)
    n = sum(int(np.prod(s)) for s in ref.param_shapes(ref.GPTConfig(), 50257).values())
    assert n == 124439808, n


def test_gradients_vs_finite_differences_float64():
    """Autograd of the (double precision) model against central differences of the loss."""
    config = tiny_config(V=11, L=2, C=8, NH=2, maxT=8)
    model = random_model(config, 5).double()
    gen = torch.Generator().manual_seed(6)
    x = torch.randint(0, 10, (2, 5), generator=gen)  # id 10 never an input: wte row 10
    y = torch.randint(0, 11, (2, 5), generator=gen)  # gets only the output contribution
    _, loss = model(x, y)
    loss.backward()
    h = 1e-5
    rng = np.random.RandomState(7)
    with torch.no_grad():
        for name in ref.PARAM_NAMES:
            p = model.params[name]
            flat_indices = list(rng.choice(p.numel(), size=min(6, p.numel()), replace=False))
            if name == "wte":
                flat_indices += [10 * config.n_embd, int(x[0, 0]) * config.n_embd + 3]
            for i in flat_indices:
                idx = np.unravel_index(i, p.shape)
                saved = p[idx].item()
                p[idx] = saved + h
                plus = model(x, y)[1].item()
                p[idx] = saved - h
                minus = model(x, y)[1].item()
                p[idx] = saved
                numeric = (plus - minus) / (2 * h)
                analytic = p.grad[idx].item()
                # float64, central difference with h = 1e-5: truncation ~h^2 and rounding ~1e-16 / h,
                # both near 1e-10: 10x below the absolute 1e-9 that a small or zero gradient gets,
                # far below 1e-6 of a larger one; a wrong gradient term is off by O(1)
                assert abs(numeric - analytic) <= 1e-9 + 1e-6 * abs(analytic), f"{name}{tuple(idx)}: autograd {analytic} vs " \
                                   f"finite difference {numeric}"
    assert model.params["wpe"].grad[5:].abs().max() == 0, "positions >= T get no gradient"


def test_loss_at_init_is_ln_V():
    config = ref.GPTConfig(max_seq_len=32, vocab_size=97, n_layer=2, n_head=4, n_embd=64)
    model = ref.GPT(config)
    ref.init_gpt2(model, 1337)
    gen = torch.Generator().manual_seed(8)
    x = torch.randint(0, 97, (4, 16), generator=gen)
    y = torch.randint(0, 97, (4, 16), generator=gen)
    _, loss = model(x, y)
    # weights of std 0.02 make the logits nearly 0 (std about 0.02 sqrt(C) = 0.16), the softmax
    # nearly uniform: the loss is ln V plus about var/2 = 0.013 (0.0167 here); 0.05 (1%) still
    # fails a model whose logits are not centred
    assert abs(loss.item() - math.log(97)) < 0.05, f"loss {loss.item()} vs ln V {math.log(97)}"


def numpy_gpt2_loss(P, config, x, y):
    """GPT-2 again, written differently: float64 numpy, explicit loops over batch rows, heads
    and positions, the formulas spelled out (biased variance in LayerNorm, GELU's tanh form,
    head h = channels [h*hs, (h+1)*hs) of each of q, k, v). Returns logits, loss."""
    C, NH, L = config.n_embd, config.n_head, config.n_layer
    hs = C // NH
    B, T = x.shape

    def layernorm(a, w, b):
        mean = a.mean(-1, keepdims=True)
        var = ((a - mean) ** 2).mean(-1, keepdims=True)
        return (a - mean) / np.sqrt(var + 1e-5) * w + b

    def gelu(a):
        return 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3)))

    h = P["wte"][x] + P["wpe"][np.arange(T)]
    for l in range(L):
        a = layernorm(h, P["ln1w"][l], P["ln1b"][l])
        qkv = a @ P["qkvw"][l].T + P["qkvb"][l]
        out = np.zeros((B, T, C))
        for b in range(B):
            for head in range(NH):
                q = qkv[b, :, head * hs:(head + 1) * hs]
                k = qkv[b, :, C + head * hs:C + (head + 1) * hs]
                v = qkv[b, :, 2 * C + head * hs:2 * C + (head + 1) * hs]
                for t in range(T):
                    scores = np.array([q[t] @ k[u] / math.sqrt(hs) for u in range(t + 1)])
                    weights = np.exp(scores - scores.max())
                    weights /= weights.sum()
                    out[b, t, head * hs:(head + 1) * hs] = weights @ v[:t + 1]
        h = h + out @ P["attprojw"][l].T + P["attprojb"][l]
        a = layernorm(h, P["ln2w"][l], P["ln2b"][l])
        h = h + gelu(a @ P["fcw"][l].T + P["fcb"][l]) @ P["fcprojw"][l].T + P["fcprojb"][l]
    h = layernorm(h, P["lnfw"], P["lnfb"])
    logits = h @ P["wte"].T
    mx = logits.max(-1, keepdims=True)
    logsumexp = np.log(np.exp(logits - mx).sum(-1)) + mx[..., 0]
    picked = np.take_along_axis(logits, y[..., None], -1)[..., 0]
    return logits, (logsumexp - picked).mean()


def test_forward_vs_independent_numpy_float64():
    config = tiny_config(V=13, L=2, C=12, NH=3, maxT=8)
    model = random_model(config, 11).double()
    gen = torch.Generator().manual_seed(12)
    x = torch.randint(0, 13, (2, 6), generator=gen)
    y = torch.randint(0, 13, (2, 6), generator=gen)
    with torch.no_grad():
        logits, loss = model(x, y)
    P = {name: p.detach().numpy() for name, p in model.params.items()}
    np_logits, np_loss = numpy_gpt2_loss(P, config, x.numpy(), y.numpy())
    # both float64: the same math in another library differs by a few ulps (~1e-15) only
    assert np.abs(logits.numpy() - np_logits).max() < 1e-12
    assert abs(loss.item() - np_loss) < 1e-12, (loss.item(), np_loss)


def test_attention_is_causal():
    """Changing a later token must not change earlier positions' logits."""
    config = tiny_config(V=11, maxT=8)
    model = random_model(config, 9)
    x = torch.tensor([[1, 2, 3, 4, 5, 6]])
    x2 = x.clone()
    x2[0, 4] = 9
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(x2)
    assert torch.equal(a[0, :4], b[0, :4])
    assert not torch.equal(a[0, 4:], b[0, 4:])


def test_loader_walk_and_wraparound():
    """Two shards (named so that creation order != sorted order), B=2, T=4: BT = 8.
    Shard a (50 tokens): batches at p = 0, 8, ..., 40 (40+8+1 = 49 <= 50, 48+9 > 50).
    Shard b (37 tokens): p = 0, 8, 16, 24 (32+9 > 37). Then back to shard a, p = 0."""
    d = tmp("loader")
    os.makedirs(d)
    tok_b = 100 + np.arange(37)
    tok_a = np.arange(50)
    ref.write_shard(os.path.join(d, "shard_b.bin"), tok_b)
    ref.write_shard(os.path.join(d, "shard_a.bin"), tok_a)
    loader = ref.DataLoader(os.path.join(d, "shard_*.bin"), 2, 4, 200)
    expected = [(tok_a, p) for p in range(0, 41, 8)] + [(tok_b, p) for p in range(0, 25, 8)]
    expected += expected[:3]  # wrapped around
    for k, (tokens, p) in enumerate(expected):
        x, y = loader.next_batch()
        assert x.dtype == torch.int64 and x.shape == (2, 4) and y.shape == (2, 4)
        assert np.array_equal(x.numpy().reshape(-1), tokens[p:p + 8]), f"batch {k}: x"
        assert np.array_equal(y.numpy().reshape(-1), tokens[p + 1:p + 9]), f"batch {k}: y"
    loader.reset()
    x, _ = loader.next_batch()
    assert np.array_equal(x.numpy().reshape(-1), tok_a[:8]), "reset goes back to shard a, p=0"
    # one shard, exactly B*T+1 tokens: every batch is the same
    ref.write_shard(tmp("exact.bin"), np.arange(9))
    loader = ref.DataLoader(tmp("exact.bin"), 2, 4, 10)
    for _ in range(3):
        x, y = loader.next_batch()
        assert np.array_equal(x.numpy().reshape(-1), np.arange(8))
        assert np.array_equal(y.numpy().reshape(-1), np.arange(1, 9))


def expect_format_error(fn, *words):
    try:
        fn()
    except ref.FormatError as e:
        message = str(e)
        assert message.startswith("error: ") and "\n" not in message, message
        for w in words:
            assert w in message, f"{w!r} not in {message!r}"
        return
    raise AssertionError("no error raised")


def test_loader_and_model_errors():
    ref.write_shard(tmp("big_id.bin"), np.array([1, 2, 3, 40, 5, 6, 7, 8, 9, 10]))
    expect_format_error(lambda: ref.DataLoader(tmp("big_id.bin"), 1, 4, 40), "big_id.bin",
                        "token 3 has id 40")
    expect_format_error(lambda: ref.DataLoader(tmp("big_id.bin"), 3, 4, 100), "B*T+1 = 13")
    expect_format_error(lambda: ref.DataLoader(tmp("nothing_*.bin"), 1, 4, 100), "no token shard")
    data = bytearray(open(tmp("big_id.bin"), "rb").read())
    open(tmp("truncated.bin"), "wb").write(data[:-2])
    expect_format_error(lambda: ref.DataLoader(tmp("truncated.bin"), 1, 4, 100), "header says 10")
    data[0] = 0
    open(tmp("bad_magic.bin"), "wb").write(data)
    expect_format_error(lambda: ref.DataLoader(tmp("bad_magic.bin"), 1, 4, 100), "bad magic")
    open(tmp("short.bin"), "wb").write(b"\0" * 100)
    expect_format_error(lambda: ref.read_model(tmp("short.bin")), "too short")
    # a bf16 (v5) model file
    header = ref.make_header(20240326, 5, 8, 11, 2, 2, 8, 128)
    open(tmp("v5.bin"), "wb").write(header.tobytes() + b"\0" * 64)
    expect_format_error(lambda: ref.read_model(tmp("v5.bin")), "version 5")
    # the CLI: one line on stderr, exit 1
    code, _, err = run_cli("state", "--model", tmp("v5.bin"), "--data", tmp("big_id.bin"),
                           "-b", "1", "-t", "4", "--out", tmp("never.bin"))
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: "), (code, err)
    assert not os.path.exists(tmp("never.bin"))


def test_state_file_cli():
    """`state` writes the first batch, the logits, the loss and the gradients, which match
    an in-process forward/backward bit for bit (same thread count)."""
    code, _, err = run_cli("init", "--out", tmp("s_model.bin"), "--layers", "2", "--channels",
                           "16", "--heads", "2", "--vocab", "130", "--max-seq-len", "16")
    assert code == 0, err
    code, _, err = run_cli("synth-shard", "--out", tmp("s_data.bin"), "--tokens", "200",
                           "--vocab", "130", "--seed", "3")
    assert code == 0, err
    code, _, err = run_cli("state", "--model", tmp("s_model.bin"), "--data", tmp("s_data.bin"),
                           "-b", "3", "-t", "8", "--out", tmp("s_state.bin"))
    assert code == 0, err
    model = ref.read_model(tmp("s_model.bin"))
    state = ref.read_state(tmp("s_state.bin"), model.config)
    tokens = ref.read_shard(tmp("s_data.bin")).astype(np.int64)
    assert np.array_equal(state["x"].numpy().reshape(-1), tokens[:24])
    assert np.array_equal(state["y"].numpy().reshape(-1), tokens[1:25])
    logits, loss = ref.forward_backward(model, state["x"], state["y"])
    assert torch.equal(state["logits"], logits)
    assert torch.equal(state["loss"], loss)
    for name in ref.PARAM_NAMES:
        g = state["grads"][name]
        if name == "wte":
            assert g.shape == (256, 16) and not g[130:].any(), "wte gradient padding"
            g = g[:130]
        assert torch.equal(g, model.params[name].grad), name
    # the loss is the mean cross-entropy, recomputed here in float64 from the logits
    lp = torch.log_softmax(state["logits"].double(), dim=-1)
    nll = -lp.gather(-1, state["y"].unsqueeze(-1)).mean().item()
    assert abs(nll - state["loss"].item()) < 1e-5  # the fp32 loss (~5) is good to ~1e-6


def test_train_cli():
    """`train`: header line, one line per step, deterministic, first loss = state loss,
    the final model's padding rows still zero, and the final model = N in-process steps."""
    args = ["train", "--model", tmp("s_model.bin"), "--data", tmp("s_data.bin"), "-b", "3", "-t",
            "8", "--steps", "5", "--lr", "1e-2", "--wd", "0.1", "--quiet"]
    code, _, err = run_cli(*args, "--out", tmp("loss1.txt"), "--out-model", tmp("final1.bin"))
    assert code == 0, err
    code, _, err = run_cli(*args, "--out", tmp("loss2.txt"))
    assert code == 0, err
    lines = open(tmp("loss1.txt")).read().splitlines()
    assert lines[0].startswith("#") and "wd=0.1" in lines[0], lines[0]
    assert [l.split()[0] for l in lines[1:]] == ["0", "1", "2", "3", "4"]
    assert lines == open(tmp("loss2.txt")).read().splitlines(), "train is not deterministic"
    losses = [float(l.split()[1]) for l in lines[1:]]
    state = ref.read_state(tmp("s_state.bin"), ref.read_model(tmp("s_model.bin")).config)
    assert np.float32(losses[0]) == state["loss"].numpy(), "%.9g must round-trip fp32"
    assert losses[-1] < losses[0], "5 steps at lr 1e-2 should lower the loss"
    final = np.fromfile(tmp("final1.bin"), dtype="<f4", offset=1024, count=256 * 16)
    assert not final.reshape(256, 16)[130:].any(), "padding rows must stay zero"
    # the same in-process
    model = ref.read_model(tmp("s_model.bin"))
    loader = ref.DataLoader(tmp("s_data.bin"), 3, 8, 130)
    opt = ref.HandAdamW(model.params, lr=1e-2, weight_decay=0.1)
    for t in range(5):
        x, y = loader.next_batch()
        _, loss = ref.forward_backward(model, x, y)
        assert f"{loss.item():.9g}" == lines[1 + t].split()[1]
        opt.step(t + 1)
    final_model = ref.read_model(tmp("final1.bin"))
    for name in ref.PARAM_NAMES:
        assert torch.equal(final_model.params[name], model.params[name]), name


# ----------------------------------------------------------------------------


def main():
    ref.setup_torch(1)
    return runner.run_test_functions("reference", globals(), TMP)


if __name__ == "__main__":
    sys.exit(main())
