"""A metric's direction, by one rule shared by `sweep`, `compare` and ladders (lit/sweep/protocol.py): exact names
first, then the lower-is-better suffixes; anything else needs --mode. Prefixes are never read."""

from __future__ import annotations

import pytest

from lit.compare import ladder_runs
from lit.compare.analysis import metric_direction
from lit.errors import UserInputError
from lit.sweep.command import resolve_mode
from lit.sweep.protocol import known_mode

NAMES = {
    # lower is better, though each starts like a higher-is-better name (the old prefix guess flipped them)
    "val/dice_loss": "min", "val/iou_loss": "min", "val/f1_loss": "min", "val/map_loss": "min",
    "val/topk_loss": "min", "val/top1_err": "min", "val/top5_error": "min", "val/mape": "min",
    "val/accuracy_error": "min",
    # exact names
    "val/loss": "min", "test/loss": "min", "val/bpb": "min", "val/ppl": "min", "val/rmse": "min",
    "val/acc1": "max", "test/acc1": "max", "val/iou": "max", "val/dice": "max", "val/top5": "max",
    "val/F1": "max", "val/auroc": "max",
    # nothing the rule knows: must be told
    "val/score": None, "val/topk": None, "val/accuracy_gain": None, "val/loss_scale": None,
}


@pytest.mark.parametrize("metric", sorted(NAMES))
def test_every_command_reads_a_name_the_same_way(metric):
    expected = NAMES[metric]
    assert known_mode(metric) == expected
    if expected is None:
        with pytest.raises(UserInputError, match="--mode"):
            resolve_mode(metric, None)
        with pytest.raises(UserInputError, match="--mode"):
            metric_direction({}, metric)
    else:
        assert resolve_mode(metric, None) == expected
        assert metric_direction({}, metric) == (expected, "the metric's name")
    assert resolve_mode(metric, "max") == "max" and metric_direction({}, metric, "min")[0] == "min"


class Run:
    class info:
        run_id = "parent"


@pytest.mark.parametrize("metric, refused", [("val/iou", "goes up"), ("val/score", "--mode"),
                                             ("val/top1_err", None), ("val/dice_loss", None)])
def test_ladders_read_the_same_rule(monkeypatch, metric, refused):
    spec = {"ladder": {"rungs": [{}, {}, {}]}, "metric": "val/loss", "mode": "min", "variants": [{"label": "b"}]}
    monkeypatch.setattr(ladder_runs, "read_protocol", lambda client, parent: spec)
    monkeypatch.setattr(ladder_runs, "search_all_runs", lambda *a: [])
    if refused is None:
        with pytest.raises(Exception) as caught:  # past the direction check: it fails later, on the missing runs
            ladder_runs.load_ladder(None, Run, metric)
        assert "goes up" not in str(caught.value) and "--mode" not in str(caught.value)
    else:
        with pytest.raises(UserInputError, match=refused):
            ladder_runs.load_ladder(None, Run, metric)
