"""The interval over seeds x test examples (lit/compare/examples.py), from the runs' per-example artifacts."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from lit.compare.command import main
from lit.compare.examples import two_way_interval
from lit.tracking import per_example
from tests.test_compare import log_child, log_parent, protocol_spec, table

SEEDS = [0, 1, 2, 3]
EXAMPLES = 50


def test_the_bootstrap_resamples_seeds_and_examples_together():
    rng = np.random.default_rng(1)
    d = rng.normal(0.02, 0.01, (5, 1)) + rng.normal(0, 0.3, (5, 200))
    low, high = two_way_interval(d, 0.9)
    brute = [d[rng.integers(0, 5, 5)][:, rng.integers(0, 200, 200)].mean() for _ in range(4000)]
    assert (low, high) == pytest.approx(tuple(np.quantile(brute, [0.05, 0.95])), abs=0.004)
    # Example noise alone widens it: the same seeds with the examples' spread removed give a narrower one.
    narrow = two_way_interval(np.repeat(d.mean(1, keepdims=True), 200, axis=1), 0.9)
    assert high - low > narrow[1] - narrow[0]
    assert two_way_interval(d[:1], 0.9) is None and two_way_interval(d, 0.9) == two_way_interval(d, 0.9)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("examples")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("examples", artifact_location=str(root / "artifacts"))
    spec = protocol_spec("e1", ["base", "v"], SEEDS, metric="val/loss", tune=None, report_metric="test/loss")
    parent = log_parent(client, experiment, "e1", spec)
    rng = np.random.default_rng(0)
    per_run = {}
    for variant, shift in (("base", 0.0), ("v", -0.03)):
        for seed in SEEDS:
            losses = 2.0 + shift + rng.normal(0, 0.01) + rng.normal(0, 0.2, EXAMPLES)
            run = log_child(client, experiment, parent, "e1", variant, seed,
                            {"val/loss": [(0, 3.0), (100, 2.1)], "test/loss": [(100, float(losses.mean()))]})
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / per_example.ARTIFACT
                np.savez_compressed(path, loss=losses)
                client.log_artifact(run, str(path))
            per_run[variant, seed] = losses
    return uri, per_run


def test_the_report_prints_it_beside_the_seed_only_interval(report, tmp_path, monkeypatch, capsys):
    uri, per_run = report
    monkeypatch.chdir(tmp_path)
    assert main(["--experiment", "examples", "--tracking_uri", uri]) == 0
    markdown = capsys.readouterr().out
    row = table(markdown, "## Against the baseline")["v"]
    level = float(row["CI (Holm)"].rsplit(" at ", 1)[1].rstrip("%")) / 100
    d = np.stack([per_run["v", s] - per_run["base", s] for s in SEEDS])
    low, high = two_way_interval(d, level)
    assert row["CI, seeds × test examples"] == f"[{low:+.3f}, {high:+.3f}]"
    assert "Verdicts rest on the seed-only tests" in markdown
    assert f"Each run was scored on {EXAMPLES} test examples" in markdown
