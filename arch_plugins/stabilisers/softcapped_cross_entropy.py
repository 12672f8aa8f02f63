"""Cross-entropy (and the z-loss's sum) of soft-capped logits in one autograd node that keeps no fp32 logits.

The plain form, ``F.cross_entropy(cap * tanh(logits.float() / cap))`` with ``logsumexp(...)**2`` for the z-loss,
leaves autograd three fp32 copies of the logits to keep for backward: tanh's output, log-softmax's output and
logsumexp's input (``../shared/specs/gpu-plugins.md`` §2.10). This node keeps the logits as they came (bf16 under
autocast: half of one fp32 copy) and one log-normaliser per token, and recomputes tanh and the softmax in backward,
as Liger-Kernel's fused linear cross-entropy does with its ``softcap`` (``LigerFusedLinearCrossEntropyLoss``,
``src/liger_kernel/ops/fused_linear_cross_entropy.py``). With c the cap, t = tanh(x / c), s = c t, p = softmax(s),
L = logsumexp(s):

    d ce_sum / d s = p - onehot(target)        (rows whose target is ignored: 0)
    d z_sum  / d s = 2 L p
    d s / d x      = 1 - t^2

The same math as the plain form to fp32 rounding (``tests/test_softcapped_cross_entropy.py``). The chunked training
loss (``lit/readout_loss.py``) calls it per chunk, under activation checkpointing, so the step's peak holds one
chunk's logits in their own dtype and nothing fp32 of the vocabulary's width is saved.
"""

from __future__ import annotations

import torch


class _SoftcappedCrossEntropySums(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, cap: float, ignore_index: int):
        capped = torch.tanh(logits.float() / cap).mul_(cap)
        log_normaliser = torch.logsumexp(capped, dim=-1)
        counted = targets != ignore_index
        picked = capped.gather(-1, torch.where(counted, targets, 0).unsqueeze(-1)).squeeze(-1)
        cross_entropy = torch.where(counted, log_normaliser - picked, 0.0).sum()
        z = log_normaliser.square().sum()
        ctx.save_for_backward(logits, targets, log_normaliser)
        ctx.cap, ctx.ignore_index = cap, ignore_index
        return cross_entropy, z

    @staticmethod
    def backward(ctx, grad_cross_entropy: torch.Tensor, grad_z: torch.Tensor):
        logits, targets, log_normaliser = ctx.saved_tensors
        counted = targets != ctx.ignore_index
        tanh = torch.tanh(logits.float() / ctx.cap)
        probs = torch.exp(tanh * ctx.cap - log_normaliser.unsqueeze(-1))
        # per row: the softmax's weight, grad_ce on counted rows plus the z-loss's 2 L grad_z
        row = torch.where(counted, grad_cross_entropy, 0.0) + 2 * grad_z * log_normaliser
        grad = probs.mul_(row.unsqueeze(-1))
        grad.scatter_add_(-1, torch.where(counted, targets, 0).unsqueeze(-1),
                          -torch.where(counted, grad_cross_entropy, 0.0).expand(targets.shape).unsqueeze(-1))
        grad.mul_(1 - tanh.square_())
        return grad.to(logits.dtype), None, None, None


def softcapped_cross_entropy_sums(logits: torch.Tensor, targets: torch.Tensor, cap: float,
                                  ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of cross-entropy over targets other than ``ignore_index``, sum over every row of logsumexp^2) of
    ``cap * tanh(logits / cap)``, in fp32. logits: (rows, vocab), any float dtype; targets: (rows,)."""
    return _SoftcappedCrossEntropySums.apply(logits, targets, float(cap), ignore_index)
