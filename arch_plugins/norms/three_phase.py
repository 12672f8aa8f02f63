"""Three-Phase Transformer, 3PT (Abu Ayyash, arXiv 2604.14430): a structural prior on the residual stream.

The d_model stream is read as N equal contiguous channels ("phases", N = 3 canonically). Every operation that
touches the stream as a whole respects the partition::

    embedding   x' = x + (r(p) - mean_j x_j),  r(p) = 1 / (p + 1)   Gabriel's horn: the stream's mean over all d
                                                                    channels (the one direction the phases share,
                                                                    the "DC subspace") is replaced by a fixed
                                                                    profile of the position p; nothing learned
    norms       per-phase RMSNorm: each phase by its own RMS, with its own gain (pre-norm at both sublayers and
                before the head; as many gains as one RMSNorm over d)
    after attn  h <- R_l h, not residual: within phase i, the k-th (even, odd) channel pair is rotated by the
                Givens angle theta_k + 2 pi i / N; theta in R^{d/(2N)} per block, initialised to (l + 1) pi / (2L)

So the strategy's added parameters are the L * d / (2N) rotation angles: 12 * 768 / 6 = 1,536 at the paper's
123M model. The paper also aligns GQA heads with the phases (N divides the head counts, so each head's channels
lie in one phase); this stack has no GQA, so the alignment is the constraint that N divides n_heads.

Every piece sits at a norm-strategy site the block already calls: the horn at ``embedding``, the per-phase norm at
``attn_in``, ``mlp_in`` and ``final``, the rotation at ``attn_after_add`` (between the attention's residual add and
the MLP's input, exactly where the reference applies it). Faithful to achelousace/three-phase-transformer
(ThreePhaseTransformer123M.py), whose AdamW decays every parameter: so are the angles and the per-phase gains here
(``weight_decay``), unlike the project's other norm gains. The difference, on purpose: the horn is computed for the
sequence at hand instead of read from a buffer of max_len = 1025 positions, so any block size works (the values
are the same).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.declarations import declare_diagnostic, declare_role, declare_weight_decay
from arch_plugins.interfaces import Kind, NormStrategy, Role, Site, StackInfo
from arch_plugins.registry import PluginError


class PhaseRMSNorm(nn.Module):
    """RMSNorm of each of ``phases`` contiguous channel groups with its own gains: x / sqrt(mean x^2 + eps) * g."""

    def __init__(self, dim: int, phases: int, eps: float = 1e-6, decay: bool = False):
        super().__init__()
        self.phases, self.eps = phases, eps
        self.weight = nn.Parameter(torch.ones(dim))  # the N per-phase gain vectors, concatenated
        declare_role(self, "weight", Role.GAIN)
        declare_weight_decay(self, "weight", decay)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        phased = x.unflatten(-1, (self.phases, -1))
        normed = F.rms_norm(phased, (phased.shape[-1],), eps=self.eps).flatten(-2)
        return normed * self.weight


class PhaseRotation(nn.Module):
    """Givens rotation of every (even, odd) channel pair of each phase i by theta_k + 2 pi i / N: an orthogonal map."""

    def __init__(self, dim: int, phases: int, layer: int, num_layers: int, decay: bool = False):
        super().__init__()
        self.phases = phases
        # The reference's depth-linear schedule: a small angle in the first block, a quarter turn in the last.
        self.theta = nn.Parameter(torch.full((dim // phases // 2,), (layer + 1) * math.pi / (2 * num_layers)))
        declare_role(self, "theta", "phase_angle", kind=Kind.VECTOR, group="norms")
        declare_weight_decay(self, "theta", decay)
        self.register_buffer("offsets", 2 * math.pi / phases * torch.arange(phases, dtype=torch.float32),
                             persistent=False)
        declare_diagnostic(self, "theta")  # the paper tracks the drift of the mean angle per block (its U shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pairs = x.unflatten(-1, (self.phases, -1, 2))  # (..., phase, pair k, even/odd)
        angle = self.theta + self.offsets.unsqueeze(-1)  # (phase, k)
        if x.dtype in (torch.float32, torch.float64) and x.dtype == angle.dtype and not torch.compiler.is_compiling():
            # The pair (even, odd) as the complex number even + i odd: the rotation is one complex multiply by
            # e^{i angle} (even cos - odd sin, even sin + odd cos), one pass instead of seven. Complex types exist
            # for fp32 and fp64 only; other dtypes take the real form below, and so does torch.compile, which fuses
            # the real form into its neighbours but leaves complex ops to eager kernels.
            turned = torch.view_as_complex(pairs.contiguous()) * torch.polar(torch.ones_like(angle), angle)
            return torch.view_as_real(turned).flatten(-3)
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        even, odd = pairs[..., 0], pairs[..., 1]
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-3)


class HornInjection(nn.Module):
    """Replaces each position's mean over the channels by s / (p + 1) (p = index along dim -2); no parameters."""

    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[-2], device=x.device, dtype=torch.float32)
        horn = (self.scale / (positions + 1.0)).to(x.dtype).unsqueeze(-1)
        return x + (horn - x.mean(dim=-1, keepdim=True))


class ThreePhaseStrategy(NormStrategy):
    """3PT: per-phase RMSNorm, a per-phase Givens rotation between attention and MLP, and Gabriel's horn.

    Args:
        phases: N, the number of cyclic channel groups (the paper's canonical 3; 1 is its one-phase variant).
        eps: the RMSNorm epsilon (the reference's 1e-6).
        horn: inject the horn's absolute-position profile after the embedding (language models only: an encoder's
            patches are not a sequence it was designed for; pass horn: false for ViT).
        weight_decay: decay the rotation angles and the per-phase gains as the reference does (its AdamW decays
            every parameter); false keeps the project's default for vectors (not decayed).
        horn_scale: s in the horn's profile s / (p + 1). The reference's is 1 on a token embedding it never
            re-initialises (PyTorch's N(0, 1)); this project's embedding starts at N(0, init_std^2) (0.02), where
            s = 1 makes the horn about 50x larger relative to the tokens: the first ~50 positions start with their
            token identity squeezed to a few percent of each phase's normalised input. s = init_std (0.02) restores
            the reference's ratio of horn to token signal (the next operation, per-phase RMSNorm, sees only the
            ratio). Default 1, the profile as written; the difference is a stated, measured choice (docs).
    """

    # An encoder has no sequence position for the profile to follow: what the conformance kit (and a user) passes.
    stack_options = {"vit": {"horn": False}}

    def __init__(self, phases: int = 3, eps: float = 1e-6, horn: bool = True, weight_decay: bool = True,
                 horn_scale: float = 1.0):
        if not isinstance(phases, int) or isinstance(phases, bool) or phases < 1:
            raise ValueError(f"phases is the number of channel groups N (the paper uses 3); give an integer >= 1, "
                             f"got {phases!r}")
        if not horn_scale > 0:
            raise ValueError(f"horn_scale is the horn's amplitude (1 as written; init_std for the reference's ratio "
                             f"to the tokens), a positive number, got {horn_scale!r}")
        self.phases, self.eps, self.horn, self.weight_decay = phases, eps, horn, weight_decay
        self.horn_scale = horn_scale

    def _check(self, stack: StackInfo) -> None:
        n = self.phases
        if stack.d_model % (2 * n):
            raise PluginError(f"3PT splits d_model into {n} phases of (even, odd) channel pairs: "
                              f"d_model={stack.d_model} must be divisible by {2 * n}; change d_model or phases")
        if stack.num_heads % n:
            raise PluginError(f"3PT aligns the attention heads with its {n} phases: n_heads={stack.num_heads} must be "
                              f"divisible by phases={n}; change n_heads or phases")
        if self.horn and not stack.causal:
            raise PluginError("3PT's horn writes a 1/(p+1) absolute position into a token sequence (a language "
                              "model); for an encoder such as ViT pass norm_options {horn: false}")

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        self._check(stack)
        if site == Site.EMBEDDING:
            return HornInjection(self.horn_scale) if self.horn else None
        if site in (Site.ATTN_IN, Site.MLP_IN, Site.FINAL):
            return PhaseRMSNorm(dim, self.phases, self.eps, self.weight_decay)
        if site == Site.ATTN_AFTER_ADD:
            return PhaseRotation(dim, self.phases, layer, stack.num_layers, self.weight_decay)
        return None

    def incremental_decoding_conflict(self, stack: StackInfo) -> str | None:
        if self.horn:  # the profile is computed for the sequence at hand: a cached step's lone token would be p = 0
            return ("adds the horn's 1/(p+1) profile of each token's place in the sequence it is handed, which a "
                    "KV-cached step (the new token alone) cannot place; norm_options {horn: false} removes it")
        return None
