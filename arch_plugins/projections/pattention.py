"""TokenFormer's Pattention (Wang et al., ICLR 2025): a projection made of learnable parameter tokens.

The input attends to ``n`` key tokens; the scores go through Θ (row-wise L2 normalisation times
sqrt(n), then GeLU) and weight ``n`` value tokens. Q, K, V and the attention output are each one
Pattention (n = d_model), and the whole FFN is a single Pattention (n = 4 d_model). Because the
parameters are tokens, a trained model can grow by appending tokens (see ``grow_from``).

The ``kernel`` option runs Θ (``l2_norm_gelu``) as one fused Triton kernel
(``arch_plugins.kernels.pattention_theta``); ``auto`` does so only where it was measured faster.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from arch_plugins.declarations import ROLE_GROUPS, declare_role, declare_unit_norm
from arch_plugins.interfaces import Concat, Kind, ProjectionType, Role, StackInfo
from arch_plugins.kernels.dispatch import PATTENTION_THETA, check_kernel, use_triton
from arch_plugins.registry import PluginError

Activation = Literal["l2_norm_gelu", "gelu_l2_norm", "softmax"]


def theta(scores: torch.Tensor, activation: Activation, scale: float | torch.Tensor, eps: float) -> torch.Tensor:
    """The "modified softmax" over the parameter-token axis (last dim).

    ``scale`` is sqrt(n) normally; growth with ``preserve_function`` keeps it at sqrt(n_old). A tensor ``scale``
    broadcasts against the scores' leading dims with a trailing 1 (the fused q|k|v path gives one per segment).
    """
    if activation == "l2_norm_gelu":
        if isinstance(scale, torch.Tensor) and scale.requires_grad:
            raise ValueError("Θ's scale gets no gradient (it is the scale_tokens buffer's square root); detach it")
        return L2NormGelu.apply(scores, scale, eps)
    if activation == "gelu_l2_norm":
        g = F.gelu(scores)
        return g * (scale / (torch.linalg.vector_norm(g, dim=-1, keepdim=True) + eps))
    if activation == "softmax":
        return torch.softmax(scores, dim=-1) * scale ** 2  # exp(A) / ||exp(A)||_1 * n
    raise ValueError(f"unknown Pattention activation {activation!r}; use l2_norm_gelu, gelu_l2_norm or softmax")


class L2NormGelu(torch.autograd.Function):
    """Θ = GeLU(A * f) with f = scale / (|A| + eps) per row of the scores A, as one autograd node.

    The forward is the eager chain's, op for op (the same values bit for bit). Left to autograd, the chain's
    backward is 13-16 small ops (the norm's, the division's, the casts') and it keeps both A and z = A * f at full
    size; here the backward is the exact derivative from z, f and |A| alone (9-10 ops), so A is not kept:

        dA = f dz - z <dz, z> / (scale |A|),   dz = g GeLU'(z)

    The second term is the norm's: d f / d|A| = -f / (|A| + eps) and d|A| / dA = A / |A|, rewritten in z (f times
    (|A| + eps) is the scale). Where |A| = 0 it is 0, as torch's norm has it (z and <dz, z> are 0 there too).
    ``scale`` gets no gradient: it is the ``scale_tokens`` buffer's square root.
    """

    @staticmethod
    def forward(ctx, scores: torch.Tensor, scale: float | torch.Tensor, eps: float) -> torch.Tensor:
        norm = torch.linalg.vector_norm(scores, dim=-1, keepdim=True)
        # One (T, 1) factor and one multiply over (T, n): cheaper than dividing then scaling.
        # The factor in the scores' dtype: under bf16 autocast the norm comes out fp32, and multiplying by it would
        # promote the whole (T, n) product and GeLU to fp32 (a write twice the size, and a cast back for the next
        # GEMM). TokenFormer's reference runs the whole model in bf16, norm included; in fp32 nothing changes.
        factor = (scale / (norm + eps)).to(scores.dtype)
        z = scores * factor
        # A tensor scale is saved with the rest (a few bytes), so that saved_tensors_hooks see every tensor kept.
        if isinstance(scale, torch.Tensor):
            ctx.save_for_backward(z, factor, norm, scale)
        else:
            ctx.save_for_backward(z, factor, norm)
            ctx.scale = scale
        return F.gelu(z)

    @staticmethod
    @once_differentiable  # a second derivative through the hand-written backward would be wrong
    def backward(ctx, grad: torch.Tensor):
        z, factor, norm, *scale = ctx.saved_tensors
        scale = scale[0] if scale else ctx.scale
        dz = torch.ops.aten.gelu_backward(grad, z)
        dot = (dz * z).sum(-1, keepdim=True)
        # inf where |A| = 0: the term is 0 there (dot is 0), not 0 / 0. masked_fill, not torch.where with a number,
        # which makes the number a tensor first (an op).
        coef = (dot / (scale * norm).masked_fill(norm == 0, math.inf)).to(z.dtype)
        return torch.addcmul(dz * factor, z, coef, value=-1), None, None


def check_theta_kernel(kernel: str, activation: Activation) -> str:
    """The ``kernel`` option, validated against the activation: only ``l2_norm_gelu`` has a Triton kernel."""
    check_kernel(kernel)
    if kernel == "triton" and activation != "l2_norm_gelu":
        raise ValueError(f"kernel: triton has a Θ kernel for activation l2_norm_gelu only, not {activation!r}; "
                         f"use kernel: auto or torch")
    return kernel


class Pattention(nn.Module):
    """``Θ(x K_Pᵀ) V_P`` with key tokens K_P (n, d_in) and value tokens V_P (n, d_out); no bias.

    ``scale_tokens`` (a buffer, so it travels in checkpoints) is the n whose square root scales the
    normalised scores: the token count at construction, the old count after a function-preserving growth.
    ``kernel`` picks Θ's implementation (``auto``, ``triton``, ``torch``: see ``PattentionProjection``).
    """

    def __init__(self, d_in: int, d_out: int, n: int, *, activation: Activation = "l2_norm_gelu",
                 eps: float = 1e-5, key_std: float = 0.02, value_std: float = 0.02, kernel: str = "auto",
                 group: str = "other"):
        super().__init__()
        if n < 1:
            raise ValueError(f"Pattention needs at least one parameter token, got n={n}")
        theta(torch.zeros(1, 1), activation, 1.0, eps)  # fail at construction on an unknown activation
        self.d_in, self.d_out, self.activation, self.eps = d_in, d_out, activation, eps
        self.kernel = check_theta_kernel(kernel, activation)
        self.key_std, self.value_std = key_std, value_std
        self.key_param_tokens = nn.Parameter(torch.empty(n, d_in))
        self.value_param_tokens = nn.Parameter(torch.empty(n, d_out))
        self.register_buffer("scale_tokens", torch.tensor(float(n)))
        # Both token sets are (n, d) with n growing with width (n = d_model or 4 d_model): hidden matrices.
        # ``group``: the block's projection this Pattention stands for (qkv, attn_out, ffn), for the diagnostics.
        declare_role(self, "key_param_tokens", "pattention_key", kind=Kind.HIDDEN, group=group)
        # scores (n) @ V: a value token's fan-in is dim 0 (the token count); its init 2/(L sqrt(d)) is already over
        # sqrt(fan-in) at the default count (n grows with d). The key tokens' fixed key_std gets muP's whole rule.
        declare_role(self, "value_param_tokens", "pattention_value", kind=Kind.HIDDEN, group=group, fan_in_dim=0,
                     init="fan_in")
        self.reset_parameters()

    @property
    def num_tokens(self) -> int:
        return self.key_param_tokens.shape[0]

    def reset_parameters(self) -> None:
        nn.init.normal_(self.key_param_tokens, std=self.key_std)
        nn.init.normal_(self.value_param_tokens, std=self.value_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = x @ self.key_param_tokens.t()
        # A tensor op, not .item(): no host sync on GPU and no graph break under torch.compile.
        scale = self.scale_tokens.sqrt()
        if self.activation == "l2_norm_gelu" and use_triton(self.kernel, PATTENTION_THETA, scores):
            from arch_plugins.kernels.pattention_theta import pattention_theta

            weights = pattention_theta(scores, scale, self.eps)
        else:
            weights = theta(scores, self.activation, scale, self.eps)
        return weights @ self.value_param_tokens

    def extra_repr(self) -> str:
        return (f"d_in={self.d_in}, d_out={self.d_out}, n={self.num_tokens}, activation={self.activation}, "
                f"kernel={self.kernel}")

    def constrain_unit_norm(self, axis: Literal["in", "out"]) -> None:
        # Every key token lives in the input space and every value token in the output space; under
        # nGPT both are d_model vectors, so each token is kept on the unit sphere whatever the axis.
        declare_unit_norm(self, "key_param_tokens", 1)
        declare_unit_norm(self, "value_param_tokens", 1)

    @torch.no_grad()
    def grow_from(self, old: dict[str, torch.Tensor], *, new_keys: Literal["zero", "init"],
                  preserve_function: bool) -> str | None:
        """Take a smaller Pattention's tokens into the first rows of this one (progressive scaling); returns what
        grew (``"32 -> 64 tokens"``), None when the count is unchanged.

        ``old`` holds ``key_param_tokens``, ``value_param_tokens`` and optionally ``scale_tokens``.
        New keys are zero (the paper: new tokens score 0 and GeLU(0) = 0, so they add nothing) or keep
        their fresh initialisation (the reference code). New values keep their initialisation. With
        ``preserve_function`` the scale stays at the old sqrt(n) and the output is unchanged.
        """
        keys, values = old["key_param_tokens"], old["value_param_tokens"]
        n_old, n_new = keys.shape[0], self.num_tokens
        if n_old > n_new:
            raise ValueError(f"cannot grow from {n_old} to {n_new} parameter tokens: the checkpoint is larger")
        if keys.shape[1] != self.d_in or values.shape[1] != self.d_out:
            raise ValueError(f"parameter-token widths differ: checkpoint keys {tuple(keys.shape)} / values "
                             f"{tuple(values.shape)}, model keys {tuple(self.key_param_tokens.shape)} / "
                             f"values {tuple(self.value_param_tokens.shape)}")
        if preserve_function and (new_keys != "zero" or self.activation == "softmax"):
            raise ValueError("preserve_function needs new_keys='zero' and an L2-normalised activation "
                             "(softmax gives new tokens weight exp(0) = 1)")
        self.key_param_tokens[:n_old].copy_(keys)
        self.value_param_tokens[:n_old].copy_(values)
        if new_keys == "zero":
            self.key_param_tokens[n_old:].zero_()
        old_scale = old.get("scale_tokens", torch.tensor(float(n_old)))
        self.scale_tokens.fill_(float(old_scale) if preserve_function else float(n_new))
        return f"{n_old} -> {n_new} tokens" if n_old != n_new else None


class FusedPattentions(Concat):
    """Several Pattentions of one input (q|k|v) as one key GEMM, a segmented Θ and one batched value GEMM.

    The same math as the ``Concat`` of the parts (each segment of n scores is normalised on its own, with its own
    scale), without three key GEMMs, three Θ chains and a ``cat`` of the outputs (``../shared/specs/gpu-plugins.md``
    §2.8). The parts stay the modules that hold the tokens (``parts.0.key_param_tokens``, ...), so checkpoints,
    growth, roles and unit-norm constraints see what they saw. Parts with different token counts or output widths
    cannot share the batched GEMMs and run as the plain ``Concat``; so does Θ's Triton kernel where it is chosen
    (it normalises whole rows with one scale).
    """

    def __init__(self, parts: list[Pattention]):
        super().__init__(parts)
        first = parts[0]
        self.fusable = all(p.num_tokens == first.num_tokens and p.d_out == first.d_out and p.d_in == first.d_in
                           for p in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.parts[0]
        # The kernel's rule reads the scores' device and row width (n): the key tokens transposed have both.
        if not self.fusable or (first.activation == "l2_norm_gelu"
                                and use_triton(first.kernel, PATTENTION_THETA, first.key_param_tokens.t())):
            return super().forward(x)
        keys = torch.cat([p.key_param_tokens for p in self.parts])  # (parts x n, d_in)
        scores = (x @ keys.t()).unflatten(-1, (len(self.parts), first.num_tokens))  # (..., parts, n)
        scale = torch.stack([p.scale_tokens for p in self.parts]).sqrt().unsqueeze(-1)  # (parts, 1)
        weights = theta(scores, first.activation, scale, first.eps)
        values = torch.stack([p.value_param_tokens for p in self.parts])  # (parts, n, d_out)
        # bmm, not @: matmul of two 3-d tensors is bmm wrapped in expands and views, 5 ops forward and 3 backward.
        out = torch.bmm(weights.reshape(-1, *weights.shape[-2:]).transpose(0, 1), values)  # (parts, tokens, d_out)
        return out.transpose(0, 1).reshape(*x.shape[:-1], -1)  # (..., parts x d_out): [q | k | v]


class PattentionProjection(ProjectionType):
    """TokenFormer's projection type: every projection and the whole FFN are Pattention layers.

    Token counts per role default to TokenFormer's rule (n_qkv = n_out = d_model, n_ffn = 4 d_model).
    Keys are N(0, key_std); values N(0, 2 / (L sqrt(d))) ("wang init", for every Pattention), as in
    the reference code. The stack's ``init_std`` and depth scaling do not apply to parameter tokens.

    Args:
        tokens_qkv: parameter tokens of each of the q, k, v projections (default d_model).
        tokens_out: parameter tokens of the attention output projection (default d_model).
        tokens_ffn: parameter tokens of the FFN (default 4 d_model).
        activation: Θ: ``l2_norm_gelu`` (TokenFormer's), ``gelu_l2_norm`` or ``softmax``.
        eps: added to the L2 norm so that a zero score row stays finite.
        key_std: std of the key tokens.
        value_std: std of the value tokens; None: 2 / (n_layers * sqrt(d_model)).
        kernel: Θ as a fused Triton kernel: ``auto`` (where measured faster, else torch), ``triton`` (l2_norm_gelu
            only) or ``torch`` (arch_plugins.kernels).
    """

    def __init__(self, tokens_qkv: int | None = None, tokens_out: int | None = None, tokens_ffn: int | None = None,
                 activation: Activation = "l2_norm_gelu", eps: float = 1e-5, key_std: float = 0.02,
                 value_std: float | None = None, kernel: str = "auto"):
        theta(torch.zeros(1, 1), activation, 1.0, eps)
        self.kernel = check_theta_kernel(kernel, activation)
        for name, n in (("tokens_qkv", tokens_qkv), ("tokens_out", tokens_out), ("tokens_ffn", tokens_ffn)):
            if n is not None and (not isinstance(n, int) or n < 1):
                raise ValueError(f"{name} is a number of parameter tokens: give a positive integer, got {n!r}")
        self.tokens_qkv, self.tokens_out, self.tokens_ffn = tokens_qkv, tokens_out, tokens_ffn
        self.activation, self.eps, self.key_std, self.value_std = activation, eps, key_std, value_std

    def depth_scaling_conflict(self, stack: StackInfo) -> str | None:
        if self.value_std is not None:
            return None  # a std the recipe fixed: nothing here follows depth
        return ("Pattention's value-token init 2/(n_layers*sqrt(d_model)), a 1/L of its own that the branch's L^-1 "
                "would square (about L^-2 at init): set projection_options.value_std to a "
                "depth-independent std")

    def _tokens(self, role: str, stack: StackInfo) -> int:
        d = stack.d_model
        if role == Role.FFN:
            return self.tokens_ffn or 4 * d
        if role == Role.ATTN_OUT:
            return self.tokens_out or d
        return self.tokens_qkv or d

    def _make(self, d_in: int, d_out: int, n: int, stack: StackInfo, bias: bool, role: str) -> Pattention:
        if bias:
            raise PluginError("projection pattention has no bias (parameter tokens replace the whole matrix); "
                              "set arch.bias=false")
        value_std = self.value_std if self.value_std is not None else 2 / (stack.num_layers * math.sqrt(stack.d_model))
        return Pattention(d_in, d_out, n, activation=self.activation, eps=self.eps, key_std=self.key_std,
                          value_std=value_std, kernel=self.kernel, group=ROLE_GROUPS[role])

    def linear(self, d_in: int, d_out: int, role: str, layer: int, stack: StackInfo, *, bias: bool,
               init_std: float) -> Pattention:
        return self._make(d_in, d_out, self._tokens(role, stack), stack, bias, role)

    def fused(self, d_in: int, d_outs: list[int], roles: list[str], layer: int, stack: StackInfo, *,
              bias: bool, init_std: float) -> FusedPattentions:
        return FusedPattentions([self.linear(d_in, d, r, layer, stack, bias=bias, init_std=init_std)
                                 for d, r in zip(d_outs, roles, strict=True)])

    def ffn(self, layer: int, stack: StackInfo, *, bias: bool, init_std: float) -> Pattention:
        return self._make(stack.d_model, stack.d_model, self._tokens(Role.FFN, stack), stack, bias, Role.FFN)
