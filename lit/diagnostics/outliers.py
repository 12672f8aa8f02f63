"""Activation outliers by depth: excess kurtosis and the max/median magnitude ratio of the residual stream.

Excess kurtosis is Outlier-Safe Pre-Training's measure (Park et al., ACL 2025, arXiv 2506.19697), computed as its
``evaluate_kurtosis.py`` does: per token, over the hidden dimension, ``mean(x^4) / std(x)^4 - 3`` with the fourth
moment taken about zero (not about the token's mean) and ``std`` the unbiased (n - 1) standard deviation, clamped at
0 and averaged over tokens. The model's number (1818 for their Adam model, 0.04 for OSP) is that averaged over the
hidden states Hugging Face returns: the embedding, the inputs of blocks 1 .. L-1, and the final norm's output.
One difference: the reference script feeds its text one token per sequence (``input_ids`` of shape (L, 1)); the
probe reads its sequences whole, with their context.

The max/median ratio is the measure of "Massive Activations in Large Language Models" (Sun et al., 2024): the
largest |x| of a hidden state over the median |x| of that hidden state, here over every element of the probe batch.

A stream wider than the branches (hyper-connections carry n streams, (..., n, d)) is measured per token and
stream over its last dimension, as every other stream here is.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def excess_kurtosis(x: torch.Tensor) -> torch.Tensor:
    """OSP's excess kurtosis of ``x`` (..., d): per vector over the last dim, clamped at 0, mean over vectors."""
    x = x.detach().float()
    fourth = x.pow(4).mean(-1)
    std = x.std(-1)
    return (fourth / std.pow(4) - 3).relu().mean()


@torch.no_grad()
def max_median_ratio(x: torch.Tensor) -> torch.Tensor:
    """max |x| / median |x| over every element (torch's median: the lower of the two middle values)."""
    magnitude = x.detach().float().abs().flatten()
    return magnitude.max() / magnitude.median()


def osp_hidden_states(n_layers: int) -> list[str]:
    """The names (``embedding``, ``layerNN.mlp`` of blocks 0 .. L-2, ``final``) of the hidden states OSP's number
    averages: Hugging Face's ``output_hidden_states``, the input of every block and the final norm's output."""
    return ["embedding", *(f"layer{i:02d}.mlp" for i in range(n_layers - 1)), "final"]


def outlier_metrics(states: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """``diag/kurtosis/<state>``, ``diag/max_median/<state>`` for each named stream state (``embedding``,
    ``layerNN.attn``, ``layerNN.mlp``, ``final``), and ``diag/kurtosis/model``: OSP's model-level mean."""
    metrics = {}
    for name, x in states.items():
        metrics[f"diag/kurtosis/{name}"] = excess_kurtosis(x)
        metrics[f"diag/max_median/{name}"] = max_median_ratio(x)
    averaged = [metrics[f"diag/kurtosis/{name}"] for name in osp_hidden_states(n_layers)]
    metrics["diag/kurtosis/model"] = torch.stack(averaged).mean()
    return metrics
