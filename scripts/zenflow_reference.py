#!/usr/bin/python3
"""
The PyTorch reference of the ZenFlow optimizer, exactly as docs/zenflow_spec.md defines it.

It trains the GPT-2 of scripts/gpt2_reference.py (same model, files, data loader and the
same spec-3.1 AdamW arithmetic, imported from there) with the ZenFlow split of the update:
the selected columns of every weight matrix (and every vector) are updated "on the GPU"
every step, the remaining columns "on the CPU" from gradients accumulated over a window of
U steps, optionally one window late (overlap). Everything here runs on the CPU in one
thread; the "GPU" and the "CPU" are two sets of state with an owner for every element, kept
apart the way the spec keeps them, and the background CPU updater is simulated (section 4.6).
The comments cite the spec's section numbers; the code follows the spec's order.

    /usr/bin/python3 scripts/zenflow_reference.py --model M --data SHARD_GLOB -b B -t T \\
        --steps N --lr LR --wd WD --mode adamw|offload|zenflow [--topk 0.1] \\
        [--update-interval 4|0] [--max-update-interval 16] [--select-interval S] [--warmup 0] \\
        [--overlap 1] --out LOSSES.txt --selections SEL.txt [--out-model FINAL.bin]

--update-interval 0 is auto (spec 6, Zen-auto): a window closes when the CPU-owned columns'
accumulated gradient has caught up with the GPU-owned ones', at most U_max steps.

The three modes are one design (spec 2); adamw and offload ignore the zenflow flags:
  adamw    k = 1, U = 1, S = 0, W = 0, overlap off  (every element GPU-owned)
  offload  k = 0, U = 1, S = 0, W = 0, overlap off  (every matrix element CPU-owned)
  zenflow  k, U, S, W, overlap as given

Outputs (written atomically, like gpt2_reference.py):
  LOSSES.txt  a `#` header with the settings, then `<t> <loss>` per step (%.9g), the same
              format as `gpt2_reference.py train`.
  SEL.txt     a `#` header, then for every selection event and every matrix in matrix order
              (wte, wpe, qkvw.0..qkvw.{L-1}, attprojw.0.., fcw.0.., fcprojw.0..):
                  sel <t> <matrix_index> <name> <n_sel> : <col> <col> ...
                  scores <t> <matrix_index> : <score_0> ... <score_{IC-1}>     (%.9g)
              and with auto U (spec 6) one line per closed window, in step order:
                  win <t> <n>           (step t closed a window of n steps)

Decisions where the spec leaves room:
  - Every default is the trainers' (--select-interval 100 as -zs, --lr 3e-4 as -l), so that a
    run compares with the trainer's run of the same flags; the tests give every setting.
  - n_sel = floor(k * IC + 0.5) is computed in double from the k of the command line.
  - Before the first selection every matrix element is CPU-owned (this is the warm-up state
    of 4.1, and with W = 0 the selection at t = 0 runs before any update, so it does not
    matter there). The CPU master starts equal to the model file, all moments zero.
  - wte is scored as the full (Vp, C) matrix of the C++ (its padded rows have zero
    gradient); its state is kept with V rows, because the padded rows never change: with
    p = g = m = v = 0 the update is exactly 0.
  - A selection at a window start happens when t - (step of the last selection) >= S; with
    U = 4, S = 6, W = 0 that is t = 0, 8, 16, ... (the first window start after S steps).
  - The drain at the end (4.7) applies a submitted window update only: the gradients of a
    window that is still open when training stops (n < U) are dropped, not applied.
  - With overlap the background job is computed at once, at its submission (its inputs are
    frozen then, spec 5); only its apply to the working copy is deferred.
  - Auto U (spec 6; docs/zenflow_spec.md section 6.1 has the project's reading): the sums
    sum_o |g[o, j]| and sum_o |A[o, j]| and their means are taken in float64; a matrix with
    no selected column has c = 0 (it is always ready), one with no unselected column u = 0.
    The first step of a window can never close it (nothing was evaluated before it), unless
    U_max = 1.
"""

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402

# ----------------------------------------------------------------------------
# 1. Parameters: matrices (column-selected) and vectors (always GPU-owned)

MATRIX_PARAMS = ["wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"]  # matrix order
VECTOR_PARAMS = [name for name in ref.PARAM_NAMES if name not in ref.MATRIX_NAMES]


@dataclass
class Matrix:
    """One matrix of spec 1: a whole 2-D tensor (wte, wpe) or one layer's slice of a stacked
    (L, OC, IC) tensor. Column j is the IC-index j: the elements W[o, j] for all o."""
    index: int  # position in matrix order (the matrix_index of SEL.txt)
    name: str  # "wte", "wpe", "qkvw.0", ...
    param: str  # the parameter tensor it lives in
    layer: Optional[int]  # its slice of the stacked tensor; None for wte, wpe
    OC: int
    IC: int

    def of(self, tensors):
        """This matrix's (OC, IC) view of a dict of the 16 tensors (parameters, gradients)."""
        t = tensors[self.param]
        return t if self.layer is None else t[self.layer]


def list_matrices(config):
    """The matrices in matrix order: wte, wpe, qkvw.0..L-1, attprojw.0.., fcw.0.., fcprojw.0..
    (wte with the V rows of the model; see score_columns for its Vp rows)."""
    shapes = ref.param_shapes(config, wte_rows=config.vocab_size)
    matrices = []
    for param in MATRIX_PARAMS:
        layers = [None] if param in ("wte", "wpe") else range(config.n_layer)
        for layer in layers:
            OC, IC = shapes[param][-2:]
            name = param if layer is None else f"{param}.{layer}"
            matrices.append(Matrix(len(matrices), name, param, layer, OC, IC))
    return matrices


# ----------------------------------------------------------------------------
# 2. Hyperparameters, and the three modes as points of one design

@dataclass
class Settings:
    k: float  # topk ratio: fraction of each matrix's columns that are GPU-owned
    U: int  # update interval: steps per CPU accumulation window; 0 = auto (spec 6)
    S: int  # select interval: steps between reselections, 0 = select once
    W: int  # warm-up steps: plain synchronous offload
    overlap: bool  # CPU update in the background, applied one window later
    U_max: int = 16  # auto U: the longest window


AUTO = 0  # Settings.U for the auto update interval (spec 6)


def settings_for_mode(mode, k=0.1, U=4, S=100, W=0, overlap=True, U_max=16):
    """adamw and offload ignore the zenflow settings (spec 2)."""
    if mode == "adamw":
        return Settings(k=1.0, U=1, S=0, W=0, overlap=False)
    if mode == "offload":
        return Settings(k=0.0, U=1, S=0, W=0, overlap=False)
    if mode == "zenflow":
        return Settings(k=k, U=U, S=S, W=W, overlap=overlap, U_max=U_max)
    raise ValueError(f"unknown mode {mode!r}")


def n_selected(k, IC):
    """n_sel = floor(k * IC + 0.5): k = 0 selects nothing, k = 1 everything."""
    return math.floor(k * IC + 0.5)


# ----------------------------------------------------------------------------
# 3. State and ownership

NOT_OWNED = float("nan")  # what a side holds for an element it does not own


class ZenFlow:
    """The optimizer state of spec 3, and one training step of spec 4 (step()).

    Every matrix element is owned by one side: the GPU if its column is selected, else the
    CPU. Each side's per-matrix state is a full (OC, IC) tensor, but only the owned columns
    mean anything; the others hold NaN (NOT_OWNED), so reading a slot the side does not own
    would poison the loss instead of passing silently.

    GPU side:  working  the working copy of all 16 parameters (model.params: forward and
                        backward use it; CPU-owned columns change only when applied)
               gpu_m, gpu_v   moments of the GPU-owned columns, per matrix
               vec_m, vec_v   moments of the vectors (always GPU-owned)
    CPU side:  master       fp32 master values of the CPU-owned columns, per matrix
               cpu_m, cpu_v moments of the CPU-owned columns, per matrix
               A, n         window gradient accumulator (CPU-owned columns; 0 elsewhere)
                            and the number of steps in it
               pending      overlap on: the master holds a window's update that the
                            working copy has not seen yet (the "background job")
    Ownership: gpu_cols[name] (the selected columns, sorted ascending), cpu_cols[name] (the
               rest, sorted ascending).
    """

    def __init__(self, model, settings, lr, wd, beta1=0.9, beta2=0.95, eps=1e-8):
        self.settings = settings
        self.config = model.config
        # the spec 3.1 AdamW constants and arithmetic, shared with gpt2_reference.py
        self.adamw = ref.HandAdamW({}, lr=lr, weight_decay=wd, beta1=beta1, beta2=beta2,
                                   eps=eps)
        self.matrices = list_matrices(model.config)
        self.working = model.params  # the GPU copy
        self.gpu_cols, self.cpu_cols = {}, {}
        self.gpu_m, self.gpu_v = {}, {}
        self.master, self.cpu_m, self.cpu_v, self.A = {}, {}, {}, {}
        with torch.no_grad():
            for mx in self.matrices:
                W = mx.of(self.working)
                # before the first selection every matrix element is CPU-owned (4.1, and section 10)
                self.gpu_cols[mx.name] = torch.zeros(0, dtype=torch.long)
                self.cpu_cols[mx.name] = torch.arange(mx.IC)
                self.gpu_m[mx.name] = torch.full_like(W, NOT_OWNED)
                self.gpu_v[mx.name] = torch.full_like(W, NOT_OWNED)
                self.master[mx.name] = W.detach().clone()
                self.cpu_m[mx.name] = torch.zeros_like(W)
                self.cpu_v[mx.name] = torch.zeros_like(W)
                self.A[mx.name] = torch.zeros_like(W)
        self.vec_m = {name: torch.zeros_like(self.working[name]) for name in VECTOR_PARAMS}
        self.vec_v = {name: torch.zeros_like(self.working[name]) for name in VECTOR_PARAMS}
        self.n = 0
        self.pending = False
        self.last_selection = None  # step of the last selection
        self.selections = []  # (t, Matrix, selected columns list, scores tensor) per event
        # auto U (spec 6): per matrix the sum of c_t over the open window's steps, whether
        # the next step closes the window (decided at the end of this one), closed windows
        self.c_sum = {mx.name: 0.0 for mx in self.matrices}
        self.close_next = False
        self.windows = []  # (t, n): step t closed a window of n steps (auto U only)
        # debug hook for the tests: called as on_migrate(self, "before" | "after") around
        # the migration of a selection event (after its drain)
        self.on_migrate = None

    # ------------------------------------------------------------------------
    # 4. One training step t, after forward and backward gave grads (name -> g_t)

    @torch.no_grad()
    def step(self, t, grads):
        st = self.settings
        # 4.1 warm-up: every matrix element is CPU-owned (no selection has happened yet);
        # CPU AdamW with g_t synchronously, vectors on the GPU. Next step.
        if t < st.W:
            self.gpu_update(t, grads)  # the vectors (no matrix column is GPU-owned)
            self.cpu_update(t, {mx.name: mx.of(grads) for mx in self.matrices})
            self.apply()
            return
        # 4.2 selection
        if self.is_selection_step(t):
            self.drain()  # 4.2.1
            self.select_and_migrate(t, grads)  # 4.2.2 - 4.2.4
        # 4.3 GPU update
        self.gpu_update(t, grads)
        # 4.4 accumulate
        self.accumulate(grads)
        # 4.5 boundary? Fixed U: n == U. Auto (spec 6): decided at the end of the previous
        # step, or the window has reached U_max; if not, this step's end decides the next.
        if st.U != AUTO:
            if self.n < st.U:
                return
        elif not (self.close_next or self.n >= st.U_max):
            self.close_next = self.auto_ready(grads)
            return
        # 4.6 boundary: this closes the window
        if st.U == AUTO:
            self.windows.append((t, self.n))
            self.close_next = False
            self.c_sum = {mx.name: 0.0 for mx in self.matrices}
        G = {mx.name: window_mean(self.A[mx.name], self.n) for mx in self.matrices}
        for mx in self.matrices:
            self.A[mx.name].zero_()
        self.n = 0
        if not st.overlap:
            self.cpu_update(t, G)  # s = t+1, lr(t)
            self.apply()  # before step t+1's forward
        else:
            self.drain()  # wait for window w-1's update and apply it
            # hand window w's update to the background updater. The job reads only G (its
            # own copy) and the CPU state, which nobody else touches until the next drain,
            # so computing it right here gives what any thread timing would give (spec 5).
            self.cpu_update(t, G)
            self.pending = True  # applied at the next boundary, or at a drain

    @torch.no_grad()
    def finish(self):
        """4.7 end of training: drain (a checkpoint or an evaluation does not: spec section 10)."""
        self.drain()

    # 4.2 selection ------------------------------------------------------------

    def is_selection_step(self, t):
        """t == W, then the first step of a window once at least S steps have passed since
        the last selection (S = 0: never again)."""
        if self.last_selection is None:
            return t == self.settings.W
        window_start = self.n == 0
        S = self.settings.S
        return window_start and S > 0 and t - self.last_selection >= S

    def drain(self):
        """4.2.1 / 4.7: wait for the CPU update still running (if any) and apply it."""
        if self.pending:
            self.apply()
            self.pending = False

    def select_and_migrate(self, t, grads):
        assert self.n == 0 and not self.pending  # a window start, after the drain
        chosen = {}
        for mx in self.matrices:
            scores = score_columns(mx, mx.of(grads), self.config)  # 4.2.2
            chosen[mx.name] = top_columns(scores, n_selected(self.settings.k, mx.IC))  # 4.2.3
            self.selections.append((t, mx, chosen[mx.name], scores))
        if self.on_migrate is not None:
            self.on_migrate(self, "before")
        for mx in self.matrices:
            self.migrate(mx, chosen[mx.name])  # 4.2.4
        if self.on_migrate is not None:
            self.on_migrate(self, "after")
        self.last_selection = t

    def migrate(self, mx, selected):
        """4.2.4: ownership moves with the state; no moment is reset or lost."""
        W = mx.of(self.working)
        name = mx.name
        now_gpu = torch.zeros(mx.IC, dtype=torch.bool)
        now_gpu[self.gpu_cols[name]] = True
        will_gpu = torch.zeros(mx.IC, dtype=torch.bool)
        will_gpu[torch.tensor(selected, dtype=torch.long)] = True
        leaving = torch.nonzero(now_gpu & ~will_gpu).flatten()  # GPU -> CPU
        entering = torch.nonzero(~now_gpu & will_gpu).flatten()  # CPU -> GPU
        # columns leaving the GPU send their (p, m, v) to the CPU master
        self.master[name][:, leaving] = W[:, leaving]
        self.cpu_m[name][:, leaving] = self.gpu_m[name][:, leaving]
        self.cpu_v[name][:, leaving] = self.gpu_v[name][:, leaving]
        self.gpu_m[name][:, leaving] = NOT_OWNED
        self.gpu_v[name][:, leaving] = NOT_OWNED
        # columns entering the GPU take their (m, v) from the CPU; their p is already equal
        # (the drain applied the CPU master to the working copy)
        assert torch.equal(W[:, entering], self.master[name][:, entering])
        self.gpu_m[name][:, entering] = self.cpu_m[name][:, entering]
        self.gpu_v[name][:, entering] = self.cpu_v[name][:, entering]
        self.master[name][:, entering] = NOT_OWNED
        self.cpu_m[name][:, entering] = NOT_OWNED
        self.cpu_v[name][:, entering] = NOT_OWNED
        # A is all zero at a window start, so it has nothing to move
        self.gpu_cols[name] = torch.nonzero(will_gpu).flatten()
        self.cpu_cols[name] = torch.nonzero(~will_gpu).flatten()

    # 4.3 GPU update --------------------------------------------------------------

    def gpu_update(self, t, grads):
        """AdamW with g_t, s = t+1, on the GPU-owned columns of every matrix and on every
        vector."""
        s = t + 1
        for mx in self.matrices:
            cols = self.gpu_cols[mx.name]
            W, g = mx.of(self.working), mx.of(grads)
            m, v = self.gpu_m[mx.name], self.gpu_v[mx.name]
            new_p, new_m, new_v = self.adamw.update(s, W[:, cols], g[:, cols], m[:, cols],
                                                    v[:, cols], decay=True)
            W[:, cols], m[:, cols], v[:, cols] = new_p, new_m, new_v
        for name in VECTOR_PARAMS:  # weight decay on matrices only (spec 1)
            p = self.working[name]
            new_p, self.vec_m[name], self.vec_v[name] = self.adamw.update(
                s, p, grads[name], self.vec_m[name], self.vec_v[name], decay=False)
            p.copy_(new_p)

    # 4.4 accumulate --------------------------------------------------------------

    def accumulate(self, grads):
        """A += g_t for the CPU-owned elements (fp32, in step order); n += 1."""
        for mx in self.matrices:
            cols = self.cpu_cols[mx.name]
            A = self.A[mx.name]
            A[:, cols] = A[:, cols] + mx.of(grads)[:, cols]
        self.n += 1

    # 6 auto update interval ------------------------------------------------------

    def auto_ready(self, grads):
        """Spec 6, at the end of a step that did not close its window (n steps so far): per
        matrix c_t = mean over the selected columns j of sum_o |g_t[o, j]|, added to the
        window's c_sum, and u = mean over the unselected columns of sum_o |A[o, j]|; the
        matrix is ready when u >= c_sum / n. True (the next step closes the window) when at
        least max(1, floor(0.99 * number of matrices)) are ready. In float64."""
        ready = 0
        for mx in self.matrices:
            g = mx.of(grads).double()
            sel, unsel = self.gpu_cols[mx.name], self.cpu_cols[mx.name]
            c = g[:, sel].abs().sum(dim=0).mean().item() if len(sel) > 0 else 0.0
            u = self.A[mx.name][:, unsel].double().abs().sum(dim=0).mean().item() if len(unsel) > 0 else 0.0
            self.c_sum[mx.name] += c
            ready += u >= self.c_sum[mx.name] / self.n
        return ready >= max(1, math.floor(0.99 * len(self.matrices)))

    # 4.6 CPU update and apply ----------------------------------------------------

    def cpu_update(self, t, G):
        """The CPU AdamW on the CPU-owned elements with gradient G (name -> (OC, IC)),
        s = t+1, into the CPU master and moments. The working copy does not see it until
        apply()."""
        s = t + 1
        for mx in self.matrices:
            cols = self.cpu_cols[mx.name]
            p, m, v = self.master[mx.name], self.cpu_m[mx.name], self.cpu_v[mx.name]
            new_p, new_m, new_v = self.adamw.update(s, p[:, cols], G[mx.name][:, cols],
                                                    m[:, cols], v[:, cols], decay=True)
            p[:, cols], m[:, cols], v[:, cols] = new_p, new_m, new_v

    def apply(self):
        """Copy the CPU master values of the CPU-owned elements into the working copy."""
        for mx in self.matrices:
            cols = self.cpu_cols[mx.name]
            W = mx.of(self.working)
            W[:, cols] = self.master[mx.name][:, cols]

    # for the tests ---------------------------------------------------------------

    def owner_view(self, mx):
        """(p, m, v) of every element of matrix mx as its owner holds it: the GPU's for the
        selected columns, the CPU master's for the others (new tensors)."""
        cols = self.gpu_cols[mx.name]
        p = self.master[mx.name].clone()
        m = self.cpu_m[mx.name].clone()
        v = self.cpu_v[mx.name].clone()
        p[:, cols] = mx.of(self.working)[:, cols]
        m[:, cols] = self.gpu_m[mx.name][:, cols]
        v[:, cols] = self.gpu_v[mx.name][:, cols]
        return p, m, v


def window_mean(A, n):
    """4.6: G = A / n, a true fp32 division by n (not a multiplication by 1/n)."""
    return A / ref.fp32(n)


def score_columns(mx, g, config):
    """4.2.2: score_j = sum over o of g[o, j]^2, in fp32, as torch.sum(g * g, dim=0).
    wte is scored as the full (Vp, C) matrix of the file layout; its padded rows have zero
    gradient. The order of the additions is PyTorch's (CPU sum kernel), which is not
    necessarily the C++'s, so scores can differ from the C++ in the last bits, and a selection
    only where two columns' scores (nearly) tie."""
    if mx.param == "wte":
        g = ref.pad_rows(g, config.padded_vocab_size)
    return torch.sum(g * g, dim=0)


def top_columns(scores, n_sel):
    """4.2.3: the n_sel columns with the largest scores, ties to the lower index, returned
    sorted ascending (a list of ints)."""
    values = scores.tolist()  # exact: fp32 -> Python float
    by_rank = sorted(range(len(values)), key=lambda j: (-values[j], j))
    return sorted(by_rank[:n_sel])


# ----------------------------------------------------------------------------
# training loop and command line

def train(model, loader, settings, steps, lr, wd, beta1=0.9, beta2=0.95, eps=1e-8,
          on_step=None, on_migrate=None):
    """Runs `steps` steps of spec 4 and the final drain (4.7); returns (losses as Python
    floats, the ZenFlow object). on_step(t, loss) is called after each step."""
    zf = ZenFlow(model, settings, lr, wd, beta1, beta2, eps)
    zf.on_migrate = on_migrate
    losses = []
    for t in range(steps):
        x, y = loader.next_batch()
        _, loss = ref.forward_backward(model, x, y)  # the loss of step t is this forward's
        zf.step(t, model.gradients())
        losses.append(float(loss))
        if on_step is not None:
            on_step(t, float(loss))
    zf.finish()
    return losses, zf


def check_args(args):
    for name in ("B", "T", "steps", "threads"):
        if getattr(args, name) <= 0:
            raise ref.FormatError(f"--{name}", f"must be positive, got {getattr(args, name)}")
    if args.mode == "zenflow":
        if not 0.0 <= args.topk <= 1.0:
            raise ref.FormatError("--topk", f"{args.topk} is outside [0, 1]")
        if args.update_interval < 0:
            raise ref.FormatError("--update-interval", f"{args.update_interval} < 0", "0 is auto")
        if args.max_update_interval < 1:
            raise ref.FormatError("--max-update-interval", f"{args.max_update_interval} < 1")
        if args.select_interval < 0:
            raise ref.FormatError("--select-interval", f"{args.select_interval} < 0",
                                  "0 selects once")
        if args.warmup < 0:
            raise ref.FormatError("--warmup", f"{args.warmup} < 0")
        if args.overlap not in (0, 1):
            raise ref.FormatError("--overlap", f"{args.overlap} is not 0 or 1")


def main(argv=None):
    p = argparse.ArgumentParser(description="PyTorch reference of ZenFlow "
                                "(docs/zenflow_spec.md) on the reference GPT-2.")
    ref.add_batch_args(p)
    ref.add_adamw_args(p)
    p.add_argument("--mode", choices=["adamw", "offload", "zenflow"], required=True)
    p.add_argument("--topk", type=float, default=0.1, help="k (zenflow mode)")
    p.add_argument("--update-interval", type=int, default=4, help="U, 0 = auto (zenflow mode)")
    p.add_argument("--max-update-interval", type=int, default=16, help="U_max of auto U (spec 6)")
    p.add_argument("--select-interval", type=int, default=100,
                   help="S, 0 = select once (zenflow mode)")
    p.add_argument("--warmup", type=int, default=0, help="W (zenflow mode)")
    p.add_argument("--overlap", type=int, default=1, help="1 on, 0 off (zenflow mode)")
    p.add_argument("--out", required=True, help="losses text file")
    p.add_argument("--selections", required=True, help="selections text file")
    p.add_argument("--out-model", help="also write the final model (after the drain)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for PyTorch")
    p.add_argument("--quiet", action="store_true", help="no per-step line on stdout")
    args = p.parse_args(argv)
    try:
        check_args(args)
        for flag, path in (("--out", args.out), ("--selections", args.selections), ("--out-model", args.out_model)):
            ref.check_writable(flag, path)
        ref.setup_torch(args.threads)
        model = ref.read_model(args.model)
        ref.check_T(model, args.T)
        loader = ref.DataLoader(args.data, args.B, args.T, model.config.vocab_size)
    except ref.FormatError as e:
        print(str(e), file=sys.stderr)
        return 1
    st = settings_for_mode(args.mode, args.topk, args.update_interval, args.select_interval,
                           args.warmup, bool(args.overlap), args.max_update_interval)

    def on_step(t, loss):
        if not args.quiet:
            print(f"step {t}: loss {loss:.9g}", flush=True)

    losses, zf = train(model, loader, st, args.steps, args.lr, args.wd, args.beta1,
                       args.beta2, args.eps, on_step=on_step)

    header = (f"# zenflow_reference.py mode={args.mode} k={st.k!r} U={st.U} U_max={st.U_max} S={st.S} "
              f"W={st.W} overlap={int(st.overlap)} model={args.model} data={args.data} "
              f"B={args.B} T={args.T} steps={args.steps} lr={args.lr!r} wd={args.wd!r} "
              f"beta1={args.beta1!r} beta2={args.beta2!r} eps={args.eps!r} "
              f"threads={args.threads} torch={torch.__version__}\n")
    lines = [header] + [f"{t} {loss:.9g}\n" for t, loss in enumerate(losses)]
    ref.write_atomic(args.out, lambda f: f.write("".join(lines).encode()))

    sel_lines = [header]
    for t, mx, cols, scores in zf.selections:
        sel_lines.append(" ".join(["sel", str(t), str(mx.index), mx.name, str(len(cols)), ":"]
                                  + [str(j) for j in cols]) + "\n")
        sel_lines.append(" ".join(["scores", str(t), str(mx.index), ":"]
                                  + [f"{x:.9g}" for x in scores.tolist()]) + "\n")
    sel_lines += [f"win {t} {n}\n" for t, n in zf.windows]
    ref.write_atomic(args.selections, lambda f: f.write("".join(sel_lines).encode()))
    if args.out_model:
        ref.write_model(args.out_model, model)
    print(f"zenflow_reference: wrote {args.out}, {args.selections}"
          + (f" and {args.out_model}" if args.out_model else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
