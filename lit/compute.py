"""Compute accounting: training FLOPs per token (GPT) or per image (ViT), counted on the built model.

Curves drawn against compute, and effective-compute multipliers read off them, need the FLOPs a run spent. They
are counted from the model as built (whatever its plugins: Pattention's token attention, LAUREL's low-rank
matrices, hyper-connections' mixing), not from a formula that knows only the baseline: one forward pass of one
sample runs on fake tensors (shapes and dtypes only: no arithmetic, no memory, so a 1B model at T = 2048 costs
what a toy does) under ``torch.utils.flop_counter.FlopCounterMode``, which counts every matrix product and the
attention (``scaled_dot_product_attention`` over the full T x T, as PaLM's and Chinchilla's counts do, with no
discount for the causal mask). Training costs three forward passes (the backward pass is two: gradients with
respect to inputs and to weights), the convention of Kaplan et al. and Chinchilla.

Element-wise work (norms, activations, softmax, the residual adds) is not counted, as in those conventions; it
is a few percent of a transformer's FLOPs at these widths.

``hand_count_gpt`` is the textbook count for the plain GPT (6 N + 12 L d T per token, N the matrix parameters
applied per token), against which the counted value of the baseline is checked.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_flop_count

from arch_plugins.meta_device import meta_memo
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig
from lit.models.vit import ViT

TRAINING_PASSES = 3  # forward + backward (twice the forward's matrix products)


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """The CPU kernel of ``scaled_dot_product_attention``: the same count as the flash kernel's (QK^T and AV)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# On CPU, attention dispatches to a kernel of its own that some torch releases (2.14 among them) leave out of the
# counter's registry, so the attention FLOPs went uncounted there; it is added where the registry lacks it.
_CPU_SDPA = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
CUSTOM_FLOPS = {} if _CPU_SDPA is None or _CPU_SDPA in flop_registry else {_CPU_SDPA: _cpu_sdpa_flops}


def _forward_flops(model: nn.Module, example: torch.Tensor) -> int:
    """The FLOPs of one forward pass of ``example`` (batch of one), with no side effect on the model.

    The forward runs on a copy of the model whose parameters and buffers are on the meta device (shapes and
    dtypes, no storage): nothing is computed but each operator's output shape, which is all a FLOP count needs, and
    whatever the forward changes (a module's cached statistic, BHyT's "refresh at the first forward") changes the
    copy, not the model. Eval mode keeps batch-statistics norms from updating, and the random state is restored.
    Meta tensors first (the conformance kit's ``meta`` check holds every plugin to it), FakeTensorMode where an
    operator has no meta kernel: entering FakeTensorMode starts
    autograd's device threads, after which a process forked from this one cannot run a backward pass (the
    conformance kit's 2-process check forks its ranks).
    """
    cpu_rng = torch.get_rng_state()
    try:
        return _count(model, example, memo=meta_memo(model),
                      mode=contextlib.nullcontext(), device="meta")
    except (NotImplementedError, RuntimeError):
        fake = FakeTensorMode(allow_non_fake_inputs=True)  # small tensors kept in plain attributes stay real
        return _count(model, example, memo={id(t): fake.from_tensor(t) for t in (*model.parameters(),
                                                                                 *model.buffers())},
                      mode=fake, device=None)
    finally:
        torch.set_rng_state(cpu_rng)


def _count(model: nn.Module, example: torch.Tensor, memo: dict, mode, device: str | None) -> int:
    shadow = copy.deepcopy(model, memo)
    shadow.eval()
    with torch.no_grad(), mode, FlopCounterMode(display=False, custom_mapping=CUSTOM_FLOPS) as counter:
        shadow(example.to(device) if device else mode.from_tensor(example))
    return counter.get_total_flops()


def _device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def gpt_flops_per_token(model: GPT, seq_len: int | None = None) -> float:
    """Training FLOPs per token of ``model`` at context ``seq_len`` (default: its block size)."""
    T = seq_len or model.block_size
    tokens = torch.zeros(1, T, dtype=torch.long, device=_device(model))
    return TRAINING_PASSES * _forward_flops(model, tokens) / T


def vit_flops_per_image(model: ViT, image_size: int, in_chans: int) -> float:
    """Training FLOPs per image of ``model`` at ``image_size`` x ``image_size`` with ``in_chans`` channels."""
    images = torch.zeros(1, in_chans, image_size, image_size, device=_device(model))
    return float(TRAINING_PASSES * _forward_flops(model, images))


def hand_count_gpt(arch: TransformerConfig, vocab_size: int, seq_len: int) -> float:
    """Training FLOPs per token of the plain GPT (linear projections, no stream plugins): 6 N + 12 L d T.

    N counts the matrices applied to each token: per layer q, k, v, out (4 d^2) and the MLP (2 d h, or 3 d h
    for SwiGLU's value, gate and down), and the LM head (d V). 12 L d T is attention: QK^T and AV, 2 d T
    multiply-adds each per token and layer, times 3 for training.
    """
    d, L, h = arch.d_model, arch.n_layers, arch.resolved_mlp_hidden()
    mlp = (3 if arch.mlp == "swiglu" else 2) * d * h
    matrices = L * (4 * d * d + mlp) + d * vocab_size
    return float(6 * matrices + 12 * L * d * seq_len)


def non_embedding_parameters(model: nn.Module) -> int:
    """Parameters outside the lookup tables (token and position embeddings, class token): Kaplan's N.

    Lookup tables cost no matrix product per token, so scaling laws leave them out. A ViT's patch embedding is
    a matrix applied to every patch and counts.
    """
    tables = [module.weight for module in model.modules() if isinstance(module, nn.Embedding)]
    tables += [getattr(model, name) for name in ("pos_embed", "cls_token")
               if isinstance(getattr(model, name, None), nn.Parameter)]
    skip = {id(t) for t in tables}
    # A head tied to the token embedding is applied per token: it counts once, as the head.
    head = getattr(model, "head", None)
    if isinstance(head, nn.Linear):
        skip.discard(id(head.weight))
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)
