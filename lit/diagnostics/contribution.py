"""How much each sublayer changes the residual stream: its branch against the stream it merges into, and the
stream's similarity before and after the sublayer.

For sublayer k (attention or MLP of block i), with h the stream the merge receives, y the branch (the sublayer's
output after its ``*_out`` site, what the merge adds) and h' the stream after the merge:

- ``branch_ratio``: ||y_t|| / ||h_t||, per token t, averaged: the branch's size relative to the stream;
- ``branch_cosine``: cos(y_t, h_t), averaged: whether the branch writes along the stream, against it, or across;
- ``io_cosine``: cos(h_t, h'_t), averaged. "What Matters in Transformers? Not All Attention is Needed" (He et al.,
  2024, arXiv 2406.15786; code CASE-Lab-UMD/LLM-Drop, ``layer_drop.py`` with its default ``layer_drop_norm``)
  scores a layer by this similarity between the hidden states entering the sublayer's pre-norm and those leaving
  its residual addition, cosine over the hidden dimension per token, mean over tokens; importance is 1 minus it,
  and the attention layers with the highest similarity are the ones it drops.

Everything is read from the ``ResidualHistory`` the stack fills in every forward pass, so any residual type is
measured by what it actually carries: with several streams (hyper-connections, (..., n, d)) the branch is compared
with each stream it is written into and the mean taken over tokens and streams; with Attention Residuals the
carried stream is the block's partial sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from arch_plugins.interfaces import ResidualHistory

SUBLAYERS = ("attn", "mlp")
EPS = 1e-12


def _against_stream(branch: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
    """The branch broadcast against a stream that may carry an extra stream axis before the hidden one."""
    return branch.unsqueeze(-2) if stream.dim() == branch.dim() + 1 else branch


@torch.no_grad()
def contribution_metrics(history: ResidualHistory, n_layers: int) -> dict[str, torch.Tensor]:
    """``diag/branch_ratio/layerNN.{attn,mlp}``, ``diag/branch_cosine/...`` and ``diag/io_cosine/...``."""
    metrics = {}
    for i in range(n_layers):
        for j, sublayer in enumerate(SUBLAYERS):
            k = 2 * i + j
            before = (history.block_inputs[i] if j == 0 else history.states[k]).detach().float()
            after = history.states[k + 1].detach().float()
            branch = _against_stream(history.branches[k].detach().float(), before)
            name = f"layer{i:02d}.{sublayer}"
            ratio = branch.norm(dim=-1) / before.norm(dim=-1).clamp_min(EPS)
            metrics[f"diag/branch_ratio/{name}"] = ratio.mean()
            metrics[f"diag/branch_cosine/{name}"] = F.cosine_similarity(branch, before, dim=-1).mean()
            metrics[f"diag/io_cosine/{name}"] = F.cosine_similarity(before, after, dim=-1).mean()
    return metrics
