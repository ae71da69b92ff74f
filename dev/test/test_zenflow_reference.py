#!/usr/bin/python3
"""
Self-checks of the ZenFlow PyTorch reference (scripts/zenflow_reference.py).

    /usr/bin/python3 dev/test/test_zenflow_reference.py

Prints one line per check and `zenflow_reference: N passed, M failed`; exits 1 if any
failed. Runs on the CPU in a temporary directory, on a tiny model (L=2, C=32, NH=2, V=97,
maxT=32; B=2, T=16), in well under a minute.
"""

import math
import os
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import torch

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import gpt2_reference as ref  # noqa: E402
import zenflow_reference as zr  # noqa: E402
import runner  # noqa: E402  dev/test/runner.py

REF_SCRIPT = os.path.join(SCRIPTS, "gpt2_reference.py")
ZF_SCRIPT = os.path.join(SCRIPTS, "zenflow_reference.py")
TMP = tempfile.mkdtemp(prefix="test_zenflow_reference_")
MODEL, DATA = os.path.join(TMP, "model.bin"), os.path.join(TMP, "data.bin")
B, T, STEPS, LR, WD = 2, 16, 12, 1e-3, 0.1


def tmp(name):
    return os.path.join(TMP, name)


def run(script, *args):
    """Runs a script's CLI; returns (exit code, stdout, stderr)."""
    p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def make_files():
    code, _, err = run(REF_SCRIPT, "init", "--out", MODEL, "--layers", "2", "--channels", "32",
                       "--heads", "2", "--vocab", "97", "--max-seq-len", "32", "--seed", "5")
    assert code == 0, err
    code, _, err = run(REF_SCRIPT, "synth-shard", "--out", DATA, "--tokens", "4000",
                       "--vocab", "97", "--seed", "3")
    assert code == 0, err


def train(mode, steps=STEPS, on_migrate=None, **zenflow):
    """In-process run on the tiny model -> (losses, final parameters, ZenFlow object)."""
    model = ref.read_model(MODEL)
    loader = ref.DataLoader(DATA, B, T, model.config.vocab_size)
    settings = zr.settings_for_mode(mode, **zenflow)
    losses, zf = zr.train(model, loader, settings, steps, LR, WD, on_migrate=on_migrate)
    params = {name: p.detach().clone() for name, p in model.params.items()}
    return losses, params, zf


def same_params(a, b):
    return all(torch.equal(a[name], b[name]) for name in ref.PARAM_NAMES)


_adamw_cache = {}


def adamw_run():
    if not _adamw_cache:
        _adamw_cache["run"] = train("adamw")
    return _adamw_cache["run"]


def read_losses(path):
    lines = open(path).read().splitlines()
    assert lines[0].startswith("#"), lines[0]
    return [l for l in lines if not l.startswith("#")]


# ----------------------------------------------------------------------------
# the checks


def test_matrix_order_and_modes():
    """Spec 1/2: the matrix order and shapes, and the three modes' settings."""
    config = ref.read_model(MODEL).config
    L, C = config.n_layer, config.n_embd
    mxs = zr.list_matrices(config)
    expected = (["wte", "wpe"] + [f"qkvw.{l}" for l in range(L)]
                + [f"attprojw.{l}" for l in range(L)] + [f"fcw.{l}" for l in range(L)]
                + [f"fcprojw.{l}" for l in range(L)])
    assert [mx.name for mx in mxs] == expected
    assert [mx.index for mx in mxs] == list(range(len(expected)))
    shapes = {"wte": (97, C), "wpe": (32, C), "qkvw": (3 * C, C), "attprojw": (C, C),
              "fcw": (4 * C, C), "fcprojw": (C, 4 * C)}
    for mx in mxs:
        assert (mx.OC, mx.IC) == shapes[mx.param], mx
    assert zr.settings_for_mode("adamw", k=0.3, U=4, S=2, W=3) == zr.Settings(1.0, 1, 0, 0, False)
    assert zr.settings_for_mode("offload", k=0.3, U=4, S=2, W=3) == zr.Settings(0.0, 1, 0, 0,
                                                                                 False)
    assert [zr.n_selected(k, 32) for k in (0.0, 0.05, 0.1, 0.3, 0.5, 1.0)] == [0, 2, 3, 10, 16, 32]


def test_a_zenflow_U1_without_overlap_equals_adamw():
    """(a) U = 1, overlap off: the CPU update of step t uses g_t with s = t+1 and is applied
    before the next forward, so every k gives adamw's losses and weights to the bit; also with
    reselection (S = 3, moments migrate) and with k = 1 at U = 4 with overlap (nothing is
    CPU-owned)."""
    losses_a, params_a, _ = adamw_run()
    for k in (0.05, 0.3, 0.5):
        for S in (0, 3):
            losses, params, zf = train("zenflow", k=k, U=1, S=S, W=0, overlap=False)
            assert losses == losses_a, (k, S, losses, losses_a)
            assert same_params(params, params_a), (k, S)
            events = sorted({t for t, *_ in zf.selections})
            assert events == ([0] if S == 0 else [0, 3, 6, 9]), events
    losses, params, _ = train("zenflow", k=1.0, U=4, S=0, W=0, overlap=True)
    assert losses == losses_a and same_params(params, params_a)


def test_b_offload_equals_adamw():
    """(b) offload (k = 0, U = 1, no overlap) == adamw, losses and final weights."""
    losses_a, params_a, _ = adamw_run()
    losses, params, zf = train("offload")
    assert losses == losses_a
    assert same_params(params, params_a)
    assert all(len(cols) == 0 for _, _, cols, _ in zf.selections)


def test_c_adamw_mode_equals_gpt2_reference_train():
    """(c) the CLI in adamw mode gives gpt2_reference.py train's losses and final model."""
    common = ["--model", MODEL, "--data", DATA, "-b", str(B), "-t", str(T), "--steps",
              str(STEPS), "--lr", str(LR), "--wd", str(WD), "--quiet"]
    code, _, err = run(REF_SCRIPT, "train", *common, "--out", tmp("ref_losses.txt"),
                       "--out-model", tmp("ref_final.bin"))
    assert code == 0, err
    code, _, err = run(ZF_SCRIPT, *common, "--mode", "adamw", "--out", tmp("zf_losses.txt"),
                       "--selections", tmp("zf_sel.txt"), "--out-model", tmp("zf_final.bin"))
    assert code == 0, err
    zf_lines = read_losses(tmp("zf_losses.txt"))
    assert zf_lines == read_losses(tmp("ref_losses.txt"))
    assert [l.split()[0] for l in zf_lines] == [str(t) for t in range(STEPS)]
    assert open(tmp("zf_final.bin"), "rb").read() == open(tmp("ref_final.bin"), "rb").read()
    header = open(tmp("zf_losses.txt")).readline()
    assert "mode=adamw" in header and "k=1.0" in header and "U=1" in header, header
    # and the in-process run is the same
    losses_a, _, _ = adamw_run()
    assert [f"{t} {x:.9g}" for t, x in enumerate(losses_a)] == zf_lines


def test_d_zenflow_with_U4_and_overlap_is_not_adamw():
    """(d) U = 4 with overlap: the CPU-owned columns see their first update only after
    window 1 closes, so the losses must leave adamw's after step 0 (guards against the
    optimizer silently doing adamw). Overlap off differs from overlap on as well."""
    losses_a, params_a, _ = adamw_run()
    losses, params, _ = train("zenflow", k=0.1, U=4, S=0, W=0, overlap=True)
    assert losses[0] == losses_a[0], "step 0's forward sees the initial weights in both"
    assert losses[1] != losses_a[1], "step 1 must see the CPU-owned columns not updated"
    assert sum(a != b for a, b in zip(losses, losses_a)) == STEPS - 1
    assert not same_params(params, params_a)
    assert all(math.isfinite(x) for x in losses)
    losses_off, params_off, _ = train("zenflow", k=0.1, U=4, S=0, W=0, overlap=False)
    # window 0 = steps 0..3: without overlap its CPU update is visible to step 4's forward,
    # with overlap only to step 8's
    assert losses_off[:4] == losses[:4]
    assert losses_off[4] != losses[4]
    assert not same_params(params_off, params)


def parse_selections(path):
    """SEL.txt -> list of events (t, index, name, n_sel, cols, scores)."""
    lines = [l for l in open(path).read().splitlines() if not l.startswith("#")]
    assert len(lines) % 2 == 0
    events = []
    for sel, sc in zip(lines[0::2], lines[1::2]):
        head, cols = sel.split(":")
        word, t, index, name, n_sel = head.split()
        assert word == "sel", sel
        sc_head, scores = sc.split(":")
        assert sc_head.split() == ["scores", t, index], (sel, sc)
        events.append((int(t), int(index), name, int(n_sel), [int(c) for c in cols.split()],
                       [np.float32(x) for x in scores.split()]))  # %.9g: fp32 exactly
    return events


def test_e_selection_file_and_invariants():
    """(e) SEL.txt: an event at t = 0 and at the first window start >= S steps later (U = 4,
    S = 6: t = 8), every matrix in matrix order; n_sel = floor(k*IC+0.5), sorted, unique, and
    the same as a brute-force ranking of the written scores (ties to the lower index); the
    scores at t = 0 are the columns' squared L2 norms of the first batch's gradient."""
    model = ref.read_model(MODEL)
    mxs = zr.list_matrices(model.config)
    for k in (0.1, 0.3):
        code, _, err = run(ZF_SCRIPT, "--model", MODEL, "--data", DATA, "-b", str(B), "-t",
                           str(T), "--steps", str(STEPS), "--lr", str(LR), "--wd", str(WD),
                           "--mode", "zenflow", "--topk", str(k), "--update-interval", "4",
                           "--select-interval", "6", "--overlap", "1", "--quiet",
                           "--out", tmp("e_losses.txt"), "--selections", tmp("e_sel.txt"))
        assert code == 0, err
        events = parse_selections(tmp("e_sel.txt"))
        assert [(t, i, name) for t, i, name, *_ in events] == \
            [(t, mx.index, mx.name) for t in (0, 8) for mx in mxs]
        for t, i, name, n_sel, cols, scores in events:
            IC = mxs[i].IC
            assert len(scores) == IC, (name, len(scores))
            assert n_sel == math.floor(k * IC + 0.5) == len(cols), (name, n_sel, len(cols))
            assert cols == sorted(set(cols)) and all(0 <= j < IC for j in cols), cols
            # brute force: column j is selected iff fewer than n_sel columns beat it
            beats = lambda a, j: scores[a] > scores[j] or (scores[a] == scores[j] and a < j)
            brute = [j for j in range(IC) if sum(beats(a, j) for a in range(IC)) < n_sel]
            assert cols == brute, (name, cols, brute)
    # the scores of t = 0, against a float64 recomputation (column j = IC index j)
    loader = ref.DataLoader(DATA, B, T, model.config.vocab_size)
    x, y = loader.next_batch()
    ref.forward_backward(model, x, y)
    grads = model.gradients()
    for t, i, name, n_sel, cols, scores in events:
        if t == 0:
            g = mxs[i].of(grads).double()
            expected = (g * g).sum(dim=0)
            # fp32 sums of the rows' squares (at most 128 rows here) against float64:
            # within 128 x 6e-8 = 8e-6 relative in the worst case, typically far less
            assert torch.allclose(torch.tensor(np.array(scores, dtype=np.float64)), expected,
                                  rtol=1e-5, atol=0), name


def test_f_no_moment_lost_at_migration():
    """(f) S = 2 with U = 2 and overlap: a selection at every window start. Around every
    migration the (p, m, v) of every element, as its owner holds it, is unchanged to the
    bit, nothing NaN (no slot that a side does not own is read), and columns do move."""
    moved = [0]
    snapshots = {}

    def hook(zf, stage):
        views = {mx.name: zf.owner_view(mx) for mx in zf.matrices}
        cols = {name: set(c.tolist()) for name, c in zf.gpu_cols.items()}
        if stage == "before":
            snapshots["views"], snapshots["cols"] = views, cols
            return
        for name, (p, m, v) in views.items():
            p0, m0, v0 = snapshots["views"][name]
            for a, b in ((p, p0), (m, m0), (v, v0)):
                assert not torch.isnan(a).any(), name
                assert torch.equal(a, b), name
            moved[0] += len(cols[name] - snapshots["cols"][name])
            IC = len(cols[name]) + len(zf.cpu_cols[name])
            assert len(cols[name]) == zr.n_selected(0.3, IC), name

    losses, _, zf = train("zenflow", k=0.3, U=2, S=2, W=0, overlap=True, on_migrate=hook)
    events = sorted({t for t, *_ in zf.selections})
    assert events == [0, 2, 4, 6, 8, 10], events
    assert moved[0] > 0, "no column changed owner: the check would be vacuous"
    # the first event moves every selected column (all start CPU-owned); later ones some
    n_first = sum(zr.n_selected(0.3, mx.IC) for mx in zf.matrices)
    assert moved[0] > n_first, (moved[0], n_first)
    assert all(math.isfinite(x) for x in losses)


def test_g_warmup_is_offload():
    """(g) W = 3: the first W steps are offload, so the losses of steps 0..W (step W's
    forward sees the weights after W warm-up updates) and the weights after W steps equal
    offload's; after that the run is ZenFlow's (different)."""
    W = 3
    losses_o, params_o, _ = train("offload")
    losses, _, zf = train("zenflow", k=0.3, U=4, S=0, W=W, overlap=True)
    assert losses[:W + 1] == losses_o[:W + 1]
    assert all(a != b for a, b in zip(losses[W + 1:], losses_o[W + 1:])), "a step after warm-up is offload's"
    assert sorted({t for t, *_ in zf.selections}) == [W]
    _, params_o_w, _ = train("offload", steps=W)
    _, params_w, _ = train("zenflow", steps=W, k=0.3, U=4, S=0, W=W, overlap=True)
    assert same_params(params_w, params_o_w)


# an independent numpy oracle of spec 4 (selection once, S = 0), on synthetic gradients

def adamw_np(p, g, m, v, s, decay, lr=np.float32(1e-2), wd=np.float32(0.1)):
    """Spec 3.1 with numpy float32 arrays (one rounding per operation)."""
    f = np.float32
    b1, b2, eps = f(0.9), f(0.95), f(1e-8)
    omb1, omb2 = f(1.0) - b1, f(1.0) - b2
    bc1, bc2 = f(1.0 - float(b1) ** s), f(1.0 - float(b2) ** s)
    wd = wd if decay else f(0.0)
    m = b1 * m + omb1 * g
    v = b2 * v + (omb2 * g) * g
    p = p - lr * ((m / bc1) / (np.sqrt(v / bc2) + eps) + wd * p)
    return p, m, v


def oracle_selection(g, k):
    """4.2 for one matrix: a mask of the n_sel = floor(k * IC + 0.5) columns with the largest
    squared L2 norm of g (in float64), ties to the lower index"""
    IC = g.shape[1]
    score = (g.astype(np.float64) ** 2).sum(axis=0)
    gpu = np.zeros(IC, dtype=bool)
    gpu[np.lexsort((np.arange(IC), -score))[:math.floor(k * IC + 0.5)]] = True
    return gpu


def oracle_matrix(p0, grads, k, U, W, overlap):
    """One matrix through spec 4 element by element: one (m, v) per element (an element's
    moments do not care which side holds them), `visible` = the working copy. Returns the
    working copy after every step and after the final drain."""
    visible, master = p0.copy(), p0.copy()
    m, v = np.zeros_like(p0), np.zeros_like(p0)
    A, n, pending, gpu = np.zeros_like(p0), 0, False, None
    seen = []
    for t, g in enumerate(grads):
        s = t + 1
        if t < W:  # warm-up: everything on the CPU, synchronously
            master, m, v = adamw_np(master, g, m, v, s, True)
            visible = master.copy()
            seen.append(visible.copy())
            continue
        if t == W:
            gpu = oracle_selection(g, k)
        cpu = ~gpu
        visible[:, gpu], m[:, gpu], v[:, gpu] = adamw_np(visible[:, gpu], g[:, gpu], m[:, gpu],
                                                         v[:, gpu], s, True)
        A[:, cpu] = A[:, cpu] + g[:, cpu]
        n += 1
        if n == U:
            G = A / np.float32(n)
            A, n = np.zeros_like(A), 0
            if overlap and pending:
                visible[:, cpu] = master[:, cpu]
            master[:, cpu], m[:, cpu], v[:, cpu] = adamw_np(master[:, cpu], G[:, cpu],
                                                            m[:, cpu], v[:, cpu], s, True)
            if overlap:
                pending = True
            else:
                visible[:, cpu] = master[:, cpu]
        seen.append(visible.copy())
    if pending:
        visible[:, ~gpu] = master[:, ~gpu]
    seen.append(visible.copy())
    return seen


def synthetic_grads(p0, steps, grad):
    """`steps` steps of gradients, one for each tensor of p0 (in order): grad(t, p)"""
    return [{name: grad(t, p) for name, p in p0.items()} for t in range(steps)]


def small_model(seed):
    """A one-layer GPT with random parameters for the synthetic-gradient tests: (config,
    model, a copy of its parameters, the generator to go on drawing from)."""
    config = ref.GPTConfig(max_seq_len=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8)
    gen = torch.Generator().manual_seed(seed)
    model = ref.GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    p0 = {name: p.detach().clone() for name, p in model.params.items()}
    return config, model, p0, gen


def test_h_overlap_timing_vs_numpy_oracle():
    """(h) Synthetic gradients (columns of very different sizes) straight into ZenFlow.step;
    the working copy after every step and after the drain equals an independent numpy
    simulation of spec 4 to the bit (windows, true-division mean, s of the boundary step,
    one-window-late apply, warm-up then migration, a partial last window not applied)."""
    config, model, p0, gen = small_model(7)
    steps = 9

    def grad(t, p):  # columns of random scales (the scales drawn first)
        col_scale = torch.rand(p.shape[-1], generator=gen) * 3 + 0.05
        return torch.randn(p.shape, generator=gen) * col_scale
    grads = synthetic_grads(p0, steps, grad)
    mxs = zr.list_matrices(config)
    for k, U, W, overlap in ((0.25, 2, 0, True), (0.25, 3, 2, False), (0.5, 2, 1, True),
                             (0.25, 4, 0, True)):
        with torch.no_grad():
            for name, p in model.params.items():
                p.copy_(p0[name])
        zf = zr.ZenFlow(model, zr.Settings(k, U, 0, W, overlap), lr=1e-2, wd=0.1)
        seen = []
        for t in range(steps):
            zf.step(t, grads[t])
            seen.append({name: p.detach().clone() for name, p in model.params.items()})
        zf.finish()
        seen.append({name: p.detach().clone() for name, p in model.params.items()})
        for mx in mxs:
            expected = oracle_matrix(mx.of(p0).numpy().copy(),
                                     [mx.of(g).numpy() for g in grads], k, U, W, overlap)
            for t in range(steps + 1):
                got = mx.of(seen[t]).numpy()
                assert np.array_equal(got, expected[t]), (k, U, W, overlap, mx.name, t)
        for name in zr.VECTOR_PARAMS:  # vectors: plain AdamW every step, no decay
            p, m, v = p0[name].numpy(), 0 * p0[name].numpy(), 0 * p0[name].numpy()
            for t in range(steps):
                p, m, v = adamw_np(p, grads[t][name].numpy(), m, v, t + 1, False)
                assert np.array_equal(seen[t][name].numpy(), p), (name, t)


def test_auto_update_interval():
    """Spec 6 against a numpy oracle of its text: the windows auto U closes on synthetic
    gradients whose columns have very different scales (so that windows of several lengths
    occur), with one selection at t = 0; and U_max = 1 is exactly U = 1."""
    config, model, p0, gen = small_model(11)
    steps = 40

    def grad(t, p):
        col_scale = torch.linspace(0.05, 3.0, p.shape[-1])
        drift = 1.0 + 0.5 * math.sin(t / 3.0)  # the same sign for a while: A grows
        return (torch.randn(p.shape, generator=gen) * 0.5 + drift) * col_scale
    grads = synthetic_grads(p0, steps, grad)
    mxs = zr.list_matrices(config)
    for U_max in (16, 3):
        with torch.no_grad():
            for name, p in model.params.items():
                p.copy_(p0[name])
        zf = zr.ZenFlow(model, zr.Settings(0.25, zr.AUTO, 0, 0, True, U_max), lr=1e-3, wd=0.0)
        for t in range(steps):
            zf.step(t, grads[t])
        # the oracle: the selection of t = 0 (S = 0: never again) fixes the columns; it is
        # made here, and the reference's must be the same
        gpu = {mx.name: oracle_selection(mx.of(grads[0]).numpy(), 0.25) for mx in mxs}
        sel = {name: np.flatnonzero(mask) for name, mask in gpu.items()}
        uns = {name: np.flatnonzero(~mask) for name, mask in gpu.items()}
        for mx in mxs:
            assert np.array_equal(zf.gpu_cols[mx.name].numpy(), sel[mx.name]), mx.name
            assert np.array_equal(zf.cpu_cols[mx.name].numpy(), uns[mx.name]), mx.name
        windows, n, close_next = [], 0, False
        A = {mx.name: 0 for mx in mxs}
        c_sum = {mx.name: 0.0 for mx in mxs}
        for t in range(steps):
            for mx in mxs:
                A[mx.name] = A[mx.name] + mx.of(grads[t]).numpy().astype(np.float32)
            n += 1
            if close_next or n >= U_max:
                windows.append((t, n))
                n, close_next = 0, False
                A = {mx.name: 0 for mx in mxs}
                c_sum = {mx.name: 0.0 for mx in mxs}
                continue
            ready = 0
            for mx in mxs:
                g = mx.of(grads[t]).numpy().astype(np.float64)
                s_, u_ = sel[mx.name], uns[mx.name]
                c = np.abs(g[:, s_]).sum(axis=0).mean() if len(s_) else 0.0
                u = np.abs(np.asarray(A[mx.name], np.float64)[:, u_]).sum(axis=0).mean() if len(u_) else 0.0
                c_sum[mx.name] += c
                ready += u >= c_sum[mx.name] / n
            close_next = ready >= max(1, math.floor(0.99 * len(mxs)))
        assert zf.windows == windows, (U_max, zf.windows, windows)
        # U_max = 16: the decisions close windows of several lengths, none reaches U_max;
        # U_max = 3: every window is cut at U_max (the test data needs 4 steps or more)
        lengths = sorted({w[1] for w in windows})
        if U_max == 16:
            assert len(lengths) >= 2 and 2 <= lengths[0] and lengths[-1] < U_max, lengths
        else:
            assert lengths == [U_max], lengths
    # U_max = 1: every step closes its window, exactly as U = 1
    runs = []
    for st in (zr.Settings(0.25, zr.AUTO, 0, 0, False, 1), zr.Settings(0.25, 1, 0, 0, False)):
        with torch.no_grad():
            for name, p in model.params.items():
                p.copy_(p0[name])
        zf = zr.ZenFlow(model, st, lr=1e-3, wd=0.0)
        for t in range(8):
            zf.step(t, grads[t])
        zf.finish()
        runs.append({name: p.detach().clone() for name, p in model.params.items()})
    assert all(torch.equal(runs[0][name], runs[1][name]) for name in runs[0])


def test_window_mean_is_a_true_division():
    """4.6: G = A / n is a true fp32 division (a multiplication by 1/n rounds differently)."""
    rng = np.random.RandomState(1)
    a = (rng.randn(100000) * 10.0 ** rng.uniform(-6, 3, 100000)).astype(np.float32)
    for n in (3, 5, 6, 7):
        got = zr.window_mean(torch.from_numpy(a), n).numpy()
        assert np.array_equal(got, a / np.float32(n)), n


def test_top_columns_ties_and_edges():
    scores = torch.tensor([1.0, 3.0, 3.0, 0.0, 3.0, 2.0])
    assert zr.top_columns(scores, 0) == []
    assert zr.top_columns(scores, 2) == [1, 2]
    assert zr.top_columns(scores, 4) == [1, 2, 4, 5]
    assert zr.top_columns(scores, 6) == [0, 1, 2, 3, 4, 5]


def test_determinism_and_cli_errors():
    """Two CLI runs give the same files; bad settings and files exit 1 with an error line."""
    args = ["--model", MODEL, "--data", DATA, "-b", str(B), "-t", str(T), "--steps", "6",
            "--lr", "1e-3", "--mode", "zenflow", "--topk", "0.3", "--update-interval", "2",
            "--select-interval", "2", "--quiet"]
    outs = []
    for i in range(2):
        code, _, err = run(ZF_SCRIPT, *args, "--out", tmp(f"d{i}.txt"), "--selections",
                           tmp(f"ds{i}.txt"))
        assert code == 0, err
        outs.append((open(tmp(f"d{i}.txt")).read(), open(tmp(f"ds{i}.txt")).read()))
    assert outs[0] == outs[1]
    for bad in (["--topk", "1.5"], ["--update-interval", "-1"], ["--max-update-interval", "0"],
                ["--select-interval", "-1"],
                ["--warmup", "-2"], ["--overlap", "2"], ["--model", tmp("missing.bin")],
                ["-t", "64"]):
        code, _, err = run(ZF_SCRIPT, *args, *bad, "--out", tmp("bad.txt"), "--selections",
                           tmp("bads.txt"))
        assert code == 1 and err.startswith("error:"), (bad, code, err)
        assert not os.path.exists(tmp("bad.txt"))


# ----------------------------------------------------------------------------


def main():
    ref.setup_torch(1)
    try:
        make_files()
    except Exception:
        traceback.print_exc()
        print("zenflow_reference: 0 passed, 1 failed (could not make the test files)")
        return 1
    return runner.run_test_functions("zenflow_reference", globals(), TMP)


if __name__ == "__main__":
    sys.exit(main())
