"""The models the check trains: ours (``lit.models.GPT`` from the registry) and the plain nanoGPT-style peer.

Models are built directly on the device (``with torch.device(...)``): no CPU initialisation of a 1B model, and the
FLOPs are counted on the model where it lives (``lit/compute.py`` runs one sample's forward there, or on the meta
device), never through a CPU forward of the full model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.throughput import PlainGPT
from lit.models import GPT, TransformerConfig


@dataclass(frozen=True)
class Shape:
    """One model size and its batch: width, depth, heads, context, vocabulary, sequences per step."""

    d_model: int
    n_layers: int
    n_heads: int
    seq: int
    vocab: int
    batch: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def arch(shape: Shape, **override) -> TransformerConfig:
    """The baseline (pre-RMSNorm, add, linear, SwiGLU, RoPE) at ``shape``, with any field overridden."""
    fields = dict(d_model=shape.d_model, n_layers=shape.n_layers, n_heads=shape.n_heads, mlp="swiglu",
                  norm="rmsnorm", residual="add", projection="linear", positions="rope")
    return TransformerConfig(**(fields | override))


def build_ours(shape: Shape, device: torch.device, seed: int = 0, **override) -> GPT:
    torch.manual_seed(seed)
    with torch.device(device):
        return GPT(vocab_size=shape.vocab, block_size=shape.seq, arch=arch(shape, **override))


def build_plain(shape: Shape, device: torch.device, seed: int = 0) -> PlainGPT:
    torch.manual_seed(seed)
    with torch.device(device):
        return PlainGPT(shape.vocab, shape.seq, shape.d_model, shape.n_layers, shape.n_heads,
                        arch(shape).resolved_mlp_hidden())


def copy_weights(ours: nn.Module, plain: nn.Module) -> bool:
    """Give ``plain`` the weights of ``ours`` (same init for the step-0 check): both list their parameters in the
    same order with the same shapes (embedding; per block norm, qkv, out, norm, up, down; final norm; head).
    Returns False, copying nothing, where the layouts differ (the check then reports the two inits apart)."""
    src, dst = list(ours.parameters()), list(plain.parameters())
    if len(src) != len(dst) or any(a.shape != b.shape for a, b in zip(src, dst, strict=True)):
        return False
    with torch.no_grad():
        for a, b in zip(src, dst, strict=True):
            b.copy_(a)
    return True


def fixed_batch(shape: Shape, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets made once, on the device: no data loader inside a timed window."""
    g = torch.Generator(device=device).manual_seed(seed)
    idx = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=g, device=device)
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()


def loss_of(forward, x: torch.Tensor, y: torch.Tensor, device: torch.device, amp: bool) -> torch.Tensor:
    """bf16 autocast forward (when ``amp``), fp32 cross-entropy: what LanguageModel's training step computes."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        logits = forward(x)
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def project_adamw(model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer a run builds (``AdamWOptimizer.build``: parameter groups by role)."""
    from arch_plugins.optimizers.adamw import AdamWOptimizer

    return AdamWOptimizer().build(model, lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))


def fused_adamw(model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """nanoGPT's and torchtitan's choice on a GPU: one fused kernel for the whole update."""
    return torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95),
                             fused=device.type == "cuda")


def is_fused(opt: torch.optim.Optimizer) -> bool:
    return bool(opt.defaults.get("fused")) or any(g.get("fused") for g in opt.param_groups)


def training_step(model: nn.Module, forward, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                  device: torch.device, amp: bool = True, after_step=None):
    """forward, loss, backward, optimizer step, zero_grad (and ``after_step``, e.g. nGPT's renormalisation)."""

    def step() -> torch.Tensor:
        loss = loss_of(forward, x, y, device, amp)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if after_step is not None:
            after_step()
        return loss.detach()

    return step


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
