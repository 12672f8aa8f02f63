"""The outlier and sublayer-contribution diagnostics on cases with known answers: OSP's kurtosis of a one-hot
vector is d - 3, Gaussian activations have none, the max/median ratio of 1..n, and a multi-stream residual
(hyper-connections) compared stream by stream."""

from __future__ import annotations

import math

import pytest
import torch

from arch_plugins.interfaces import ResidualHistory
from lit.diagnostics.contribution import contribution_metrics
from lit.diagnostics.outliers import excess_kurtosis, max_median_ratio
from lit.diagnostics.probe import probe
from lit.language_model import LanguageModel
from lit.models import TransformerConfig


def test_kurtosis_of_a_one_hot_vector_is_d_minus_3_and_of_gaussians_about_0():
    d = 64
    one_hot = torch.zeros(3, d)
    one_hot[:, 5] = 2.5  # the scale does not matter
    # mean(x^4) = a^4 / d; unbiased variance = a^2 / d, so mean(x^4) / std^4 = d.
    assert float(excess_kurtosis(one_hot)) == pytest.approx(d - 3, rel=1e-5)
    gaussian = torch.randn(64, 4096, generator=torch.Generator().manual_seed(0))
    assert float(excess_kurtosis(gaussian)) < 0.1
    # Clamped at zero per token before the mean: a flat (platykurtic) token counts 0, not its negative excess.
    flat = torch.tensor([[1.0, -1.0] * 8])
    assert float(excess_kurtosis(flat)) == 0.0


def test_max_median_ratio():
    x = -torch.arange(1.0, 10.0)  # |x| = 1..9: median 5, max 9
    assert float(max_median_ratio(x)) == pytest.approx(9 / 5)


def test_a_branch_is_compared_with_each_stream_it_is_written_into():
    g = torch.Generator().manual_seed(0)
    B, T, n, d = 2, 3, 4, 8
    streams = [torch.randn(B, T, n, d, generator=g) for _ in range(3)]
    branches = [torch.randn(B, T, d, generator=g) for _ in range(2)]
    history = ResidualHistory(states=[torch.randn(B, T, d, generator=g), streams[1], streams[2]],
                              branches=branches, block_inputs=[streams[0]])
    metrics = contribution_metrics(history, n_layers=1)
    ratios, cosines = [], []
    for b in range(B):
        for t in range(T):
            for s in range(n):
                y, h = branches[0][b, t].double(), streams[0][b, t, s].double()
                ratios.append(float(y.norm() / h.norm()))
                cosines.append(float(y @ h / (y.norm() * h.norm())))
    assert float(metrics["diag/branch_ratio/layer00.attn"]) == pytest.approx(sum(ratios) / len(ratios), rel=1e-5)
    assert float(metrics["diag/branch_cosine/layer00.attn"]) == pytest.approx(sum(cosines) / len(cosines), abs=1e-6)
    before, after = streams[1].double(), streams[2].double()
    io = (before * after).sum(-1) / (before.norm(dim=-1) * after.norm(dim=-1))
    assert float(metrics["diag/io_cosine/layer00.mlp"]) == pytest.approx(float(io.mean()), abs=1e-6)


@pytest.mark.parametrize("residual", ["hyperconn", "attnres", "laurel_pa"])
def test_every_residual_type_gets_every_depth_metric(residual):
    torch.manual_seed(0)
    arch = TransformerConfig(d_model=16, n_layers=2, n_heads=2, residual=residual)
    model = LanguageModel(vocab_size=11, block_size=8, arch=arch)
    metrics = probe(model, torch.randint(0, 11, (2, 8)), stream=False, attention=False, outliers=True,
                    contribution=True)
    states = ["embedding", "layer00.attn", "layer00.mlp", "layer01.attn", "layer01.mlp", "final"]
    sublayers = states[1:-1]
    expected = {f"diag/{q}/{s}" for q in ("kurtosis", "max_median") for s in states} | {"diag/kurtosis/model"}
    expected |= {f"diag/{q}/{s}" for q in ("branch_ratio", "branch_cosine", "io_cosine") for s in sublayers}
    assert expected <= set(metrics)
    assert not any(name.startswith("diag/stream_rms/") for name in metrics)  # the stream group was not asked
    assert all(math.isfinite(float(metrics[name])) for name in expected)
