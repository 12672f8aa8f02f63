"""A held-out test metric is read once per run, at the end: it has no curve. The report's curves and its steps to
target then read the tuning metric (validation, logged along training), and say so; a metric logged along
training is its own curve."""

from __future__ import annotations

import pandas as pd
import pytest

from lit.compare.analysis import analyze
from lit.compare.plots import draw_all
from lit.compare.report import render
from lit.compare.runs import RUN_COLUMNS, Sweep

VAL = {"a": (3.0, 2.5, 2.0), "b": (2.8, 2.0, 1.8)}  # b gets to a's final 2.0 at step 200 of 300: 1.5x
SEEDS = (1337, 1338, 1339)


def sweep(test_along_training: bool = False) -> Sweep:
    rows, runs = [], []
    for variant in ("a", "b"):
        for seed in SEEDS:
            run_id = f"{variant}{seed}"
            runs.append((run_id, variant, str(seed), seed, None, seed, "finished", None))
            for step, loss in zip((100, 200, 300), VAL[variant], strict=True):
                rows.append((run_id, "val/loss", step, step, loss + (seed - 1337) * 0.01))
                if test_along_training or step == 300:
                    rows.append((run_id, "test/loss", step, step, loss + 0.1 + (seed - 1337) * 0.013))
    history = pd.DataFrame(rows, columns=["run_id", "key", "step", "timestamp", "value"])
    protocol = {"variants": [{"label": "a"}, {"label": "b"}], "metric": "val/loss", "report_metric": "test/loss",
                "mode": "min"}
    return Sweep(parent_id="p", experiment="e", protocol=protocol, metric="test/loss",
                 runs=pd.DataFrame(runs, columns=list(RUN_COLUMNS)), history=history,
                 logged=tuple(sorted(set(history["key"]))), left_out={}, replaced=0, tune_runs=0)


def test_a_metric_read_once_takes_its_curves_and_steps_to_target_from_the_tuning_metric(tmp_path):
    analysis = analyze(sweep(), "test/loss", None, 0.95)
    assert analysis.curve_metric == "val/loss"
    b = next(v for v in analysis.variants if v.label == "b")
    assert list(b.curve["step"]) == [100.0, 200.0, 300.0]
    assert b.values == pytest.approx({str(s): 1.9 + (s - 1337) * 0.013 for s in SEEDS})  # the test values decide
    target = next(t for t in analysis.targets if t.label == "b")
    assert target.ratios == pytest.approx({str(s): 1.5 for s in SEEDS})
    assert target.median == pytest.approx(1.5)
    markdown = render(analysis, draw_all(analysis, tmp_path))
    assert "## Steps to the baseline's final val/loss" in markdown
    assert "`test/loss` is read once per run, at the end, so it has no curve" in markdown


def test_a_metric_logged_along_training_is_its_own_curve():
    analysis = analyze(sweep(test_along_training=True), "test/loss", None, 0.95)
    assert analysis.curve_of == "test/loss"
    target = next(t for t in analysis.targets if t.label == "b")
    assert target.median == pytest.approx(1.5)


def test_the_whole_run_panel_is_cut_at_the_worst_start_and_names_what_went_beyond():
    from types import SimpleNamespace

    from lit.compare.plots import beyond_start, within_start

    def variant(label, means):
        return SimpleNamespace(label=label, curve=pd.DataFrame({"step": range(len(means)), "mean": means}))

    calm, spiky = variant("calm", [4.2, 3.0, 2.5]), variant("spiky", [4.5, 47.0, 2.6])
    low, high = within_start((2.4, 47.5), [calm, spiky], "min")
    assert low == 2.4 and 4.5 < high < 5.0  # the spike leaves the axis at the worst start (4.5) plus a margin
    assert beyond_start([calm, spiky], "min") == ["spiky"]
    accuracy = [variant("a", [0.1, 0.8, 0.9]), variant("b", [0.2, 0.01, 0.9])]
    assert 0.0 < within_start((0.0, 0.95), accuracy, "max")[0] < 0.1 and beyond_start(accuracy, "max") == ["b"]
