"""The interval over seeds x test examples (lit/compare/examples.py), from the runs' per-example artifacts."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from lit.compare import calibration
from lit.compare.command import main
from lit.compare.examples import two_way_interval, two_way_intervals, two_way_standard_error
from lit.tracking import per_example
from tests.test_compare import log_child, log_parent, protocol_spec, table

SEEDS = [0, 1, 2, 3]
EXAMPLES = 50
SHIFTS = {"v": -0.3, "w": -0.15, "x": 0.004}  # a family of 3: Holm gives each its own level


def grids(rng, reps: int, seeds: int, examples: int = 100, seed_sd: float = calibration.SEED_SD,
          test_se: float = calibration.TEST_SE) -> np.ndarray:
    """Null seeds x examples grids (``calibration.example_grids``, whose figures docs/comparing-statistics.md
    shows at 4,000 grids and 871 examples); here 100 examples, which keeps the tests quick."""
    return calibration.example_grids(rng, reps, seeds, examples, seed_sd, test_se)


# 6 seeds at the Holm levels of 24 and 1 comparisons, 10 at alpha/2, 12 at alpha/4; then a test set as noisy as
# the seeds (the digits' case: 10 seeds, 359 images).
@pytest.mark.parametrize("seeds, confidence, seed_sd, test_se", [
    (6, 1 - 0.05 / 24, 0.015, 0.0017), (6, 0.95, 0.015, 0.0017), (10, 0.975, 0.015, 0.0017),
    (12, 0.9875, 0.015, 0.0017), (10, 0.95, 0.002, 0.004)])
def test_the_two_way_interval_covers_at_its_level(seeds, confidence, seed_sd, test_se):
    reps = 3000  # Monte-Carlo sd of a 95% coverage: 0.4 points
    low, high = two_way_intervals(grids(np.random.default_rng(seeds), reps, seeds, seed_sd=seed_sd, test_se=test_se),
                                  confidence)
    covered = float(((low <= 0) & (0 <= high)).mean())
    assert abs(covered - confidence) < 0.015, (covered, confidence)


def test_correlated_test_windows_make_it_too_narrow_as_the_docs_say():
    # The interval assumes independent test examples. Neighbouring windows of one text are not: with AR(1) 0.5
    # along the windows and test noise equal to the seed noise it covers 78% at 95% (docs/comparing-statistics.md,
    # 4,000 grids; statistics-review-4 item 7). Here 2,000 grids of the same structure, within 3 Monte-Carlo sds.
    documented = 0.780
    rate, width, guarded = calibration.two_way_coverage(
        np.random.default_rng(7), 2000, 6, 0.95, examples=calibration.TEST_EXAMPLES, seed_sd=calibration.TEST_SE,
        ar=0.5)
    assert abs(rate.rate - documented) <= 3 * rate.standard_error, rate
    assert width > 1.2 and guarded == 0  # wider than the seed-only interval, and still short of its level


def test_the_two_way_interval_is_the_seed_only_t_interval_when_the_examples_add_nothing():
    from scipy import stats

    rng = np.random.default_rng(2)
    per_seed = rng.normal(0.02, 0.01, 6)
    d = np.repeat(per_seed[:, None], 40, axis=1)  # every example of a seed differs alike: no test-set noise
    half = stats.t.isf(0.025, 5) * per_seed.std(ddof=1) / np.sqrt(6)
    assert two_way_interval(d, 0.95) == pytest.approx((per_seed.mean() - half, per_seed.mean() + half))
    noisy = d + rng.normal(0, 0.3, (1, 40))  # a noisy test set widens it
    low, high = two_way_interval(noisy, 0.95)
    assert high - low > 2 * half
    assert two_way_interval(d[:1], 0.95) is None


def by_hand(grid: list[list[float]]) -> tuple[float, float, float]:
    """(mean, standard error, df) of a seeds x examples grid in plain Python: the two-way ANOVA's mean squares,
    the examples' share MS_examples - MS_interaction floored at 0, and Satterthwaite's df for MS_seeds + that share
    (each mean square over its own df, the share's two terms only where it is positive), at least S - 1."""
    seeds, examples = len(grid), len(grid[0])
    mean = sum(map(sum, grid)) / (seeds * examples)
    by_seed = [sum(row) / examples for row in grid]
    by_example = [sum(row[e] for row in grid) / seeds for e in range(examples)]
    ms_seeds = examples * sum((m - mean) ** 2 for m in by_seed) / (seeds - 1)
    ms_examples = seeds * sum((m - mean) ** 2 for m in by_example) / (examples - 1)
    df_interaction = (seeds - 1) * (examples - 1)
    ms_interaction = sum((grid[s][e] - by_seed[s] - by_example[e] + mean) ** 2
                         for s in range(seeds) for e in range(examples)) / df_interaction
    share = max(ms_examples - ms_interaction, 0.0)
    variance = ms_seeds + share
    denominator = ms_seeds ** 2 / (seeds - 1)
    if share > 0:
        denominator += ms_examples ** 2 / (examples - 1) + ms_interaction ** 2 / df_interaction
    return mean, (variance / (seeds * examples)) ** 0.5, max(variance ** 2 / denominator, seeds - 1)


# Fixed 3 x 4 grids (statistics-review-4, item 6): the examples' share negative (df S - 1 by the floor), and
# Satterthwaite's df below S - 1 (floored), between S - 1 and S, and above S.
@pytest.mark.parametrize("grid, raw_df", [
    ([[2, -3, -2, -2], [-2, 2, 3, 1], [-3, -3, -1, 0]], None),
    ([[1, 1, 3, -1], [3, -3, -3, 3], [3, -1, -3, -1]], 0.3119),
    ([[-3, -2, -1, 0], [0, -1, 3, 1], [-2, -1, -2, -2]], 2.1119),
    ([[2, -2, 1, 3], [0, -3, -3, -1], [-1, 0, -1, 2]], 3.2325)])
def test_the_satterthwaite_df_and_standard_error_match_a_hand_computation(grid, raw_df):
    mean, se, df = two_way_standard_error(np.array(grid, dtype=float))
    expected = by_hand(grid)
    assert (float(mean), float(se), float(df)) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert float(df) == pytest.approx(2.0 if raw_df is None or raw_df < 2 else raw_df, abs=1e-4)


def test_the_two_way_interval_is_never_narrower_than_the_seed_only_one():
    # A 6-seed grid where the seeds dominate and the raw two-way interval comes out a little narrower (its
    # Satterthwaite df above 5 buys a smaller t than the slightly larger SE costs): the guard gives the seed-only
    # t interval, exactly. This is the case in most 6-seed grids of the text suite's structure (docs).
    from scipy import stats

    candidates = grids(np.random.default_rng(0), 20, 6, examples=40)
    mean, se, df = two_way_standard_error(candidates)
    per_seed = candidates.mean(axis=-1)
    seed_only = stats.t.isf(0.025, 5) * per_seed.std(axis=-1, ddof=1) / np.sqrt(6)
    ratio = stats.t.isf(0.025, df) * se / seed_only
    pick = int(np.argmin(ratio))
    assert ratio[pick] < 0.999 and df[pick] > 5, (ratio[pick], df[pick])  # the raw interval is narrower here
    low, high = two_way_interval(candidates[pick], 0.95)
    centre = per_seed[pick].mean()
    assert (low, high) == pytest.approx((centre - seed_only[pick], centre + seed_only[pick]), rel=1e-13, abs=1e-15)


@pytest.fixture(scope="module")
def report(tmp_path_factory, empty_store):
    import shutil

    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("examples")
    shutil.copyfile(empty_store, root / "mlflow.db")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("examples", artifact_location=str(root / "artifacts"))
    spec = protocol_spec("e1", ["base", *SHIFTS], SEEDS, metric="val/loss", tune=None, report_metric="test/loss")
    parent = log_parent(client, experiment, "e1", spec)
    rng = np.random.default_rng(0)
    per_run = {}
    for variant, shift in (("base", 0.0), *SHIFTS.items()):
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
    rows = table(markdown, "## Against the baseline")
    levels = set()
    for variant in SHIFTS:  # each at its own Holm level, not at 95%
        row = rows[variant]
        level = float(row["CI (Holm)"].rsplit(" at ", 1)[1].rstrip("%")) / 100
        levels.add(level)
        d = np.stack([per_run[variant, s] - per_run["base", s] for s in SEEDS])
        low, high = two_way_interval(d, level)
        assert row["CI, seeds × test examples"] == f"[{low:+.3f}, {high:+.3f}]"
    assert len(levels) > 1, levels
    assert "Verdicts rest on the seed-only tests" in markdown
    assert f"Each run was scored on {EXAMPLES} test examples" in markdown
