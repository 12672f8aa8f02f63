"""The coordinate check: how each layer's activations, and their change by training, scale with width or depth.

Under a parametrization that transfers (muP in width, CompleteP in depth) the size of every layer's output, and
of its change after a few Adam steps, does not depend on the width (the depth): the log-log slope against it is
about 0. Under standard parametrization training moves some coordinates faster at larger width (the slope of the
change is positive). This is microsoft/mup's ``get_coord_data`` check, measured with hooks on the GPT's
sublayers: per role (embedding, attention logits, attention out, MLP out, residual stream, final, logits), the
RMS of the output on a fixed probe batch (``act``; for attention logits, q.k times the scale) and the RMS of its
change since init (``delta``), averaged over layers, then over seeds (geometric mean).

Besides these fixed sites, every parameter whose declared kind has a width rule on its fan-in (``hidden``,
``readout``: the block's matrices and every plugin's, hyper-connections' dynamic alpha/beta, mHC's phi, AttnRes's
queries, the attention gate, LAUREL's low-rank maps, Pattention's tokens) has its pre-activation recorded, one
site per role (``pre:<role>``), with no code that names a plugin: the first contraction (matmul, linear, einsum)
that the parameter, or a tensor computed from it elementwise (a gain times it, a slice, a cast), enters during
the forward pass. The model is the recipe's own at each width: SwiGLU's hidden width keeps its rounding.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from arch_plugins.declarations import parameter_roles
from arch_plugins.interfaces import Kind
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig
from lit.optim import select_optimizer

# The sublayers recorded, by what they are (one line each in the figure).
SITES = ("embedding", "attn_logits", "attn_out", "mlp_out", "stream", "final", "logits")
QUANTITIES = ("act", "delta")
# The kinds whose pre-activations are recorded (``pre:<role>``): those with a width rule on their fan-in.
PRE_ACTIVATION_KINDS = (Kind.HIDDEN, Kind.READOUT)
# Where a parameter's pre-activation is made: the first of these ops it (or a tensor made from it) enters.
CONTRACTIONS = frozenset({torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
                          torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.mv, torch.Tensor.mv,
                          torch.einsum, F.linear, torch.addmm, torch.baddbmm, F.bilinear})


class PreActivations(TorchFunctionMode):
    """Records, per role, the output of the first contraction each declared parameter enters (its pre-activation).

    A parameter's mark follows it through every other op (slices, casts, products with a gain, concatenations),
    so ``h @ (gain * W[:, :1])`` is found as W's pre-activation; a concatenation of two parameters' columns is
    recorded for both. Marked tensors are held until the pass ends, so no id is reused while it runs."""

    def __init__(self, roles: dict[int, str]):
        super().__init__()
        self.marks: dict[int, tuple[torch.Tensor, frozenset[str]]] = {}
        self.roles = roles
        self.found: dict[str, list[torch.Tensor]] = defaultdict(list)

    def _mark(self, tensor: torch.Tensor) -> frozenset[str]:
        if id(tensor) in self.roles:
            return frozenset({self.roles[id(tensor)]})
        held = self.marks.get(id(tensor))
        return held[1] if held is not None and held[0] is tensor else frozenset()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        marks = frozenset().union(*(self._mark(t) for t in tree_flatten((args, kwargs))[0]
                                    if isinstance(t, torch.Tensor)))
        if not marks:
            return out
        if func in CONTRACTIONS and isinstance(out, torch.Tensor):
            for role in sorted(marks):
                self.found[f"pre:{role}"].append(out.detach().clone())
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.marks[id(t)] = (t, marks)
        return out


def _pre_activation_roles(model: nn.Module) -> dict[int, str]:
    return {id(p.param): p.role for p in parameter_roles(model, strict=False) if p.kind in PRE_ACTIVATION_KINDS}


@dataclass(frozen=True)
class CoordCheckSetup:
    """What is trained at each shape: ``arch`` with d_model (and, for a depth check, n_layers) replaced."""

    arch: TransformerConfig
    tokens: torch.Tensor  # a 1-D corpus of token ids
    vocab_size: int
    block_size: int = 64
    batch_size: int = 8
    lr: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    steps: int = 10
    optimizer: str = "adamw"  # an optimizer plugin (``muon``: Muon for the hidden matrices, AdamW for the rest)
    optimizer_options: dict | None = None


def _rms(x: torch.Tensor) -> float:
    return float(x.detach().float().pow(2).mean().sqrt())


def _recorded(model: GPT) -> dict[str, list[nn.Module]]:
    blocks = list(model.stack.blocks)
    return {"embedding": [model.tok], "attn_out": [b.attn for b in blocks], "mlp_out": [b.mlp for b in blocks],
            "stream": blocks, "final": [model.stack], "logits": [model]}


def _outputs(model: GPT, probe: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """Every recorded module's output on ``probe`` (hooks, removed after the forward)."""
    found: dict[str, list[torch.Tensor]] = defaultdict(list)
    handles = []

    def attention_logits(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> None:
        found["attn_logits"].append((q @ k.transpose(-2, -1) * scale).detach())

    blocks = list(model.stack.blocks)
    for block in blocks:
        block.attn.inspect = attention_logits
    for site, modules in _recorded(model).items():
        for module in modules:
            handles.append(module.register_forward_hook(
                lambda _m, _i, out, site=site: found[site].append(out.detach().clone())))
    recorder = PreActivations(_pre_activation_roles(model))
    try:
        with torch.no_grad(), recorder:
            model(probe)
        found.update(recorder.found)
    finally:
        for handle in handles:
            handle.remove()
        for block in blocks:
            block.attn.inspect = None
    return found


def _batches(tokens: torch.Tensor, setup: CoordCheckSetup, seed: int, n: int) -> list[tuple[torch.Tensor, ...]]:
    """The same ``n`` batches at every shape for one seed (paired across widths and depths)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - setup.block_size - 1, (n, setup.batch_size), generator=g)
    rows = [torch.stack([tokens[s:s + setup.block_size + 1] for s in batch]) for batch in starts]
    return [(r[:, :-1], r[:, 1:]) for r in rows]


def run_one(setup: CoordCheckSetup, width: int, depth: int, seed: int) -> dict[tuple[str, str], float]:
    """Train one shape for ``setup.steps`` optimizer steps; ``{(quantity, site): value}`` after the last step."""
    # The recipe's own model at this width: its MLP rule (SwiGLU's rounding to a multiple of 64 included: each
    # matrix has its own fan-in ratio); an explicit mlp_hidden is kept in proportion to d_model.
    hidden = setup.arch.mlp_hidden
    if hidden is not None:
        hidden = round(hidden * width / setup.arch.d_model)
    arch = dataclasses.replace(setup.arch, d_model=width, n_layers=depth, mlp_hidden=hidden)
    torch.manual_seed(seed)
    model = GPT(setup.vocab_size, setup.block_size, arch)
    optimizer = select_optimizer(setup.optimizer, setup.optimizer_options).build(
        model, lr=setup.lr, weight_decay=setup.weight_decay, betas=tuple(setup.betas))
    batches = _batches(setup.tokens, setup, seed, setup.steps + 1)
    probe = batches[0][0]
    before = _outputs(model, probe)
    loss_fn = nn.CrossEntropyLoss()
    for x, y in batches[1:]:
        logits = model(x)
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    after = _outputs(model, probe)
    result = {}
    for site in sorted(after, key=lambda s: (s.startswith("pre:"), SITES.index(s) if s in SITES else 0, s)):
        result["act", site] = float(np.mean([_rms(a) for a in after[site]]))
        result["delta", site] = float(np.mean([_rms(a - b) for a, b in zip(after[site], before[site], strict=True)]))
    return result


@dataclass
class CoordCheck:
    """Values per shape (width or depth, the axis) and (quantity, site), averaged over seeds; and the slopes."""

    axis: str  # "width" or "depth"
    shapes: list[int]
    values: dict[tuple[str, str], list[float]]  # one per shape
    per_seed: dict[tuple[str, str], list[list[float]]]

    def slopes(self) -> dict[tuple[str, str], float]:
        """The least-squares slope of log(value) against log(shape), per (quantity, site)."""
        x = np.log(np.asarray(self.shapes, dtype=float))
        return {key: float(np.polyfit(x, np.log(np.maximum(v, 1e-30)), 1)[0]) for key, v in self.values.items()}


def coord_check(setup: CoordCheckSetup, *, widths: Iterable[int] | None = None, depths: Iterable[int] | None = None,
                seeds: Iterable[int] = (0,)) -> CoordCheck:
    """Run the check over ``widths`` (at the setup's depth) or ``depths`` (at the setup's width)."""
    if (widths is None) == (depths is None):
        raise ValueError("give widths or depths (one coordinate check varies one axis)")
    axis = "width" if widths is not None else "depth"
    shapes = list(widths if widths is not None else depths)
    seeds = list(seeds)
    per_seed: dict[tuple[str, str], list[list[float]]] = defaultdict(lambda: [[] for _ in shapes])
    for i, shape in enumerate(shapes):
        for seed in seeds:
            width, depth = (shape, setup.arch.n_layers) if axis == "width" else (setup.arch.d_model, shape)
            for key, value in run_one(setup, width, depth, seed).items():
                per_seed[key][i].append(value)
    values = {key: [float(np.exp(np.mean(np.log(np.maximum(v, 1e-30))))) for v in rows]
              for key, rows in per_seed.items()}
    return CoordCheck(axis, shapes, values, dict(per_seed))


def format_slopes(check: CoordCheck) -> str:
    slopes = check.slopes()
    lines = [f"{'quantity':<8} {'site':<10} {'slope':>7}   values at {check.axis} {', '.join(map(str, check.shapes))}"]
    for (quantity, site), slope in sorted(slopes.items()):
        values = ", ".join(f"{v:.3g}" for v in check.values[quantity, site])
        lines.append(f"{quantity:<8} {site:<10} {slope:>+7.3f}   {values}")
    return "\n".join(lines)


def log_range(values: list[float]) -> float:
    return math.log(max(values)) - math.log(min(values))
