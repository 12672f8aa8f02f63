"""The report's outliers and sublayer-contribution panels: per variant, the last logged value of each
``diag/<quantity>/<sublayer>`` metric, mean over seeds, in stream order, one panel per quantity that was logged."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lit.compare.depth_quantities import LABELS, depth_quantities
from lit.compare.plots import draw_depth_quantities
from lit.compare.runs import RUN_COLUMNS, Sweep, is_supporting_metric
from lit.tracking.names import DEPTH_QUANTITY_PREFIXES

SUBLAYERS = ["embedding", "layer00.attn", "layer00.mlp", "layer01.attn", "layer01.mlp", "final"]


def value(variant: str, seed: int, index: int, step: int) -> float:
    return (1 + index) * (2 if variant == "b" else 1) + 0.1 * seed + step / 1000


def sweep() -> Sweep:
    rows, runs = [], []
    for variant in ("a", "b"):
        for seed in (0, 1):
            run_id = f"{variant}{seed}"
            runs.append((run_id, variant, str(seed), seed, None, seed, "finished", None))
            rows += [(run_id, "val/loss", 100, 0, 3.0)]
            for index, name in enumerate(SUBLAYERS):
                for step in (0, 100):
                    rows.append((run_id, f"diag/kurtosis/{name}", step, step, value(variant, seed, index, step)))
            rows.append((run_id, "diag/kurtosis/model", 100, 100, 99.0))  # not a sublayer: not drawn
            rows.append((run_id, "diag/io_cosine/layer00.attn", 100, 100, 0.5 if variant == "a" else 0.7))
    history = pd.DataFrame(rows, columns=["run_id", "key", "step", "timestamp", "value"])
    return Sweep(parent_id="p", experiment="e", protocol={"variants": [{"label": "a"}, {"label": "b"}]},
                 metric="val/loss", runs=pd.DataFrame(runs, columns=list(RUN_COLUMNS)), history=history,
                 logged=tuple(sorted(set(history["key"]))), left_out={}, replaced=0, tune_runs=0)


def test_each_logged_quantity_is_the_last_step_mean_over_seeds_in_stream_order(tmp_path):
    assert set(LABELS) == set(DEPTH_QUANTITY_PREFIXES)
    assert all(is_supporting_metric(f"{prefix}layer00.attn") for prefix in DEPTH_QUANTITY_PREFIXES)
    quantities = depth_quantities(sweep())
    assert list(quantities) == ["diag/kurtosis/", "diag/io_cosine/"]
    for variant in ("a", "b"):
        kurtosis = quantities["diag/kurtosis/"][variant]
        assert list(kurtosis.index) == SUBLAYERS
        expected = [np.mean([value(variant, s, i, 100) for s in (0, 1)]) for i in range(len(SUBLAYERS))]
        np.testing.assert_allclose(kurtosis.to_numpy(), expected)
    assert quantities["diag/io_cosine/"]["b"].to_dict() == {"layer00.attn": 0.7}
    path = draw_depth_quantities(quantities, "a", {"a": "C0", "b": "C1"}, tmp_path / "q.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_the_report_draws_and_links_the_panels(tmp_path):
    from lit.compare.analysis import analyze
    from lit.compare.plots import DEPTH_QUANTITIES, draw_all
    from lit.compare.report import render

    analysis = analyze(sweep(), "val/loss", None, 0.95)
    figures = draw_all(analysis, tmp_path)
    assert DEPTH_QUANTITIES in figures and (tmp_path / DEPTH_QUANTITIES).read_bytes()[:4] == b"\x89PNG"
    assert f"]({DEPTH_QUANTITIES})" in render(analysis, figures)
