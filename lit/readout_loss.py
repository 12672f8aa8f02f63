"""The training loss read out a chunk of tokens at a time, so the (tokens x vocab) fp32 logits are never whole.

A language model's loss is the largest tensor of a step when the vocabulary is large: at 64 x 1024 tokens and a
vocabulary of 50,304 the fp32 logits are 13.2 GB, their log-softmax (saved for backward) as much again, and
their gradient as much again. Here the head's input (tokens x d_model, small) is passed through the model's
``readout`` (the LM head and the norm strategy's logits site: a soft-cap, nGPT's s_z, whatever the plugin
applies) one chunk of tokens at a time; each chunk's cross-entropy (and z-loss) is summed and its logits freed.
Each chunk runs under activation checkpointing, so backward recomputes that chunk's logits instead of keeping
them: the step's peak holds one chunk's logits, not all of them. The cost is the head's matrix product once
more in backward (2 x tokens x d_model x vocab FLOPs, a third more than the head's training FLOPs).

The same math as the whole-logits loss, with the sum taken in another order: equal to float rounding (tested).
A micro-batch that fits one chunk takes exactly the whole-logits path, so it is bit-identical to it. The
readout must act on each token's logits alone (every built-in logits site does: a scale or a cap per entry).
A logit soft-cap at the readout's end is applied inside each chunk's cross-entropy instead
(``arch_plugins/stabilisers/softcapped_cross_entropy.py``, Liger-Kernel's fused linear cross-entropy's softcap):
the recomputed chunk then keeps its logits in their own dtype for backward, and no fp32 copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from arch_plugins.stabilisers.logit_softcap import deferred_softcap
from arch_plugins.stabilisers.softcapped_cross_entropy import softcapped_cross_entropy_sums
from arch_plugins.stabilisers.z_loss import z_loss

IGNORE_INDEX = -100  # F.cross_entropy's default: such targets count in neither the sum nor the mean


def chunk_tokens(vocab_size: int, chunk_mib: float) -> int | None:
    """Tokens per chunk whose fp32 logits take at most ``chunk_mib`` MiB (at least one); None: no chunking."""
    if chunk_mib <= 0:
        return None
    return max(1, int(chunk_mib * 2 ** 20) // (4 * vocab_size))


def _chunk_sums(readout, hidden: torch.Tensor, targets: torch.Tensor, with_z: bool):
    # A readout that ends with a logit soft-cap hands it over: the cap runs inside the cross-entropy's own autograd
    # node, which keeps this chunk's logits in their dtype and no fp32 copy (tanh's output, the log-softmax, the
    # z-loss's logsumexp input each were one). Entered here, inside the checkpointed function, so that the
    # recomputation in backward defers it too.
    with deferred_softcap() as caps:
        logits = readout(hidden)
    if len(caps) > 1:
        raise ValueError(f"the readout applies {len(caps)} logit soft-caps; a model has at most one (its logits site)")
    if caps:
        cross_entropy, z = softcapped_cross_entropy_sums(logits, targets, caps[0], IGNORE_INDEX)
        return cross_entropy, (z if with_z else cross_entropy.new_zeros(()))
    cross_entropy = F.cross_entropy(logits.float(), targets, reduction="sum", ignore_index=IGNORE_INDEX)
    z = torch.logsumexp(logits.float(), dim=-1).square().sum() if with_z else cross_entropy.new_zeros(())
    return cross_entropy, z


def readout_loss(readout, hidden: torch.Tensor, targets: torch.Tensor, chunk: int | None,
                 with_z: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(mean cross-entropy, mean z-loss or None) of ``readout(hidden)`` against ``targets``.

    hidden: (..., d) the head's input; targets: (...) token ids. ``chunk``: tokens per chunk (None: whole).
    The cross-entropy is the mean over targets other than ``IGNORE_INDEX`` and the z-loss
    (``arch_plugins.stabilisers.z_loss``) the mean over every position, as on the whole logits.
    """
    hidden, targets = hidden.flatten(0, -2), targets.flatten()
    if chunk is None or targets.numel() <= chunk:
        logits = readout(hidden)
        return F.cross_entropy(logits.float(), targets), (z_loss(logits) if with_z else None)
    cross_entropy = z = None
    for start in range(0, targets.numel(), chunk):
        ce_sum, z_sum = checkpoint(_chunk_sums, readout, hidden[start:start + chunk], targets[start:start + chunk],
                                   with_z, use_reentrant=False)
        cross_entropy = ce_sum if cross_entropy is None else cross_entropy + ce_sum
        z = z_sum if z is None else z + z_sum
    counted = (targets != IGNORE_INDEX).sum()  # a device tensor: no host sync
    return cross_entropy / counted, (z / targets.numel() if with_z else None)
