"""``cli.py compare`` against a real sqlite MLflow store written the way ``lit/sweep/protocol.py`` says.

No training: the runs are written with MlflowClient, with metric values chosen so that one variant is clearly
better, one clearly worse and one within the noise. Every number of the report is checked against numpy/scipy
on the same values.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from scipy import stats as scipy_stats

from lit.compare import stats
from lit.compare.analysis import known_mode
from lit.compare.command import main
from lit.sweep import protocol

STEPS = [0, 100, 200, 300, 400]
SEEDS = [0, 1, 2]
FINALS = {  # variant -> final val/loss per seed
    "base": [3.300, 3.320, 3.310],
    "fast": [3.250, 3.281, 3.262],
    "same": [3.306, 3.322, 3.303],
    "slow": [3.360, 3.375, 3.372],
}
START_EXCESS = 6.0  # the loss at step 0 sits this far above the final one
PARAMETERS = {"base": 1_000_000, "fast": 1_100_000, "same": 1_000_000, "slow": 900_000}
RATE = {"base": 1000.0, "fast": 800.0, "same": 1010.0, "slow": 1200.0}  # tokens/s around which runs log
ITEMS_PER_STEP = 4096
SUBLAYERS = ["embedding", "layer00.attn", "layer00.mlp", "layer01.attn", "layer01.mlp", "final"]
DEPTH_VARIANTS = ("base", "fast")
TUNE = {"key": "model.init_args.lr", "values": [0.001, 0.003], "steps": 100, "seed": 0, "reuse_seed_run": False,
        "rule": "lowest val/loss at the tuning run's last step"}
TUNED = {"base": "0.003", "fast": "0.001", "same": "0.003", "slow": "0.001"}


def loss_curve(final: float) -> list[float]:
    """A falling curve, steep early: the first point is far above the rest, as in training."""
    return [final + START_EXCESS * (1 - s / STEPS[-1]) ** 2 for s in STEPS]


def spikes(variant: str, seed: int) -> int:
    return {"base": 1, "fast": 0}[variant] + seed


def stream_rms(variant: str, seed: int, index: int, step: int) -> float:
    return (1 + index) * (1.5 if variant == "fast" else 1.0) * (1 + step / 400) + 0.1 * seed


def throughput(variant: str, seed: int) -> list[float]:
    # A slow first (compiling) step the median must ignore.
    return [RATE[variant] * 0.1] + [RATE[variant] * (1 + 0.01 * seed) + d for d in (-5, 0, 5, 10)]


def log_child(client, experiment_id, parent_id, sweep_id, variant, seed, metrics, *, final=True, phase="seed",
              status="FINISHED", tune_value=None, start_time=None, tags=None, relogged=()):
    """One child run; ``relogged``: (key, step, value) logged again later, as a resumed run does."""
    from mlflow.entities import Metric

    extra = tags
    tags = {protocol.ROLE: "child", protocol.SWEEP_ID: sweep_id, protocol.VARIANT: variant,
            protocol.SEED: str(seed), protocol.SEED_INDEX: str(seed), protocol.PHASE: phase,
            protocol.CHILD_KEY: f"{variant}/{phase}/{seed}/{tune_value}", protocol.PARENT_RUN: parent_id}
    if final:
        tags[protocol.FINAL] = "true"
    if tune_value is not None:
        tags[protocol.TUNE_KEY], tags[protocol.TUNE_VALUE] = TUNE["key"], str(tune_value)
    tags.update(extra or {})
    run = client.create_run(experiment_id, tags=tags, run_name=f"{variant}-{phase}-{seed}", start_time=start_time)
    points = [Metric(key, float(value), 1_700_000_000_000 + step, step) for key, series in metrics.items()
              for step, value in series]
    for i in range(0, len(points), 500):
        client.log_batch(run.info.run_id, metrics=points[i:i + 500])
    for key, step, value in relogged:
        client.log_batch(run.info.run_id, metrics=[Metric(key, float(value), 1_800_000_000_000 + step, step)])
    client.set_terminated(run.info.run_id, status=status)
    return run.info.run_id


def log_parent(client, experiment_id, sweep_id, spec):
    parent = client.create_run(experiment_id, tags={protocol.ROLE: "parent", protocol.SWEEP_ID: sweep_id},
                               run_name=f"sweep-{sweep_id}")
    client.log_text(parent.info.run_id, json.dumps(spec), protocol.PROTOCOL_FILE)
    client.set_terminated(parent.info.run_id)
    return parent.info.run_id


def protocol_spec(sweep_id, variants, seeds, metric="val/loss", tune=TUNE, **fields):
    """A protocol as ``cli.py sweep`` writes it; ``fields`` add or replace entries (family, equivalence, ...)."""
    return {"sweep_id": sweep_id, "recipe": "recipes/gpt_tiny.yaml",
            "variants": [{"label": v, "overrides": [f"--model.init_args.norm={v}"]} for v in variants],
            "baseline": variants[0], "seeds": seeds, "metric": metric, "mode": known_mode(metric),
            "tune": tune, "fit_args": [], "steps": STEPS[-1], **fields}


def seed_metrics(variant, seed):
    losses = loss_curve(FINALS[variant][seed])
    metrics = {
        "val/loss": list(zip(STEPS, losses, strict=True)),
        "val/acc1": [(s, 10 - v) for s, v in zip(STEPS, losses, strict=True)],  # the mirror: higher is better
        "val/acc5": list(zip(STEPS, losses, strict=True)),  # loss numbers under a higher-is-better name
        "train/tokens_per_s": list(enumerate(throughput(variant, seed), start=1)),
        protocol.PARAMETERS_METRIC: [(0, PARAMETERS[variant])],
        protocol.ITEMS_PER_STEP_METRIC: [(0, ITEMS_PER_STEP)],
    }
    if variant in DEPTH_VARIANTS:
        for index, name in enumerate(SUBLAYERS):
            metrics[f"diag/stream_rms/{name}"] = [(s, stream_rms(variant, seed, index, s)) for s in (0, 400)]
        metrics["diag/spike_count"] = [(200, 0), (400, spikes(variant, seed))]
        metrics["diag/grad_norm/layer00.attn"] = [(400, 1.0)]  # a diagnostic the report does not show
    return metrics


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store for the whole module (creating MLflow's tables takes seconds): the main sweep, a
    one-seed sweep, an unfinished one, and an experiment without any sweep."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    ids = {}

    main_exp = client.create_experiment("norms", artifact_location=str(root / "artifacts-norms"))
    sweep_id = "a1b2c3d4e5f6"
    parent = log_parent(client, main_exp, sweep_id, protocol_spec(sweep_id, list(FINALS), SEEDS))
    children = {}
    for variant in FINALS:
        for value in TUNE["values"]:
            log_child(client, main_exp, parent, sweep_id, variant, TUNE["seed"], {"val/loss": [(100, 4.0)]},
                      final=False, phase="tune", tune_value=value)
        for seed in SEEDS:
            children[variant, seed] = log_child(client, main_exp, parent, sweep_id, variant, seed,
                                                seed_metrics(variant, seed), tune_value=TUNED[variant])
    # Left out of the numbers: a failed seed run, and an older finished run of (base, seed 0) that the run
    # above superseded (its loss of 9 would move every number of the report).
    log_child(client, main_exp, parent, sweep_id, "same", 3, seed_metrics("same", 0), status="FAILED")
    log_child(client, main_exp, parent, sweep_id, "base", 0, {"val/loss": [(400, 9.0)]}, start_time=1)
    ids.update(main=parent, child=children["fast", 1], sweep_id=sweep_id)

    single_exp = client.create_experiment("single", artifact_location=str(root / "artifacts-single"))
    single = log_parent(client, single_exp, "single0001", protocol_spec("single0001", ["base", "fast"], [0],
                                                                        tune=None))
    for variant in ("base", "fast"):
        log_child(client, single_exp, single, "single0001", variant, 0, seed_metrics(variant, 0))
    ids["single"] = single

    unfinished_exp = client.create_experiment("unfinished", artifact_location=str(root / "artifacts-unfinished"))
    unfinished = log_parent(client, unfinished_exp, "unfin0001", protocol_spec("unfin0001", ["base"], [0, 1]))
    log_child(client, unfinished_exp, unfinished, "unfin0001", "base", 0, seed_metrics("base", 0), status="FAILED")
    log_child(client, unfinished_exp, unfinished, "unfin0001", "base", 1, seed_metrics("base", 1), status="RUNNING")

    plain_exp = client.create_experiment("plain", artifact_location=str(root / "artifacts-plain"))
    client.set_terminated(client.create_run(plain_exp).info.run_id)

    edge_exp = client.create_experiment("edge", artifact_location=str(root / "artifacts-edge"))
    ids["edge"] = log_edge_sweep(client, edge_exp)
    digits_exp = client.create_experiment("digits", artifact_location=str(root / "artifacts-digits"))
    ids["digits"] = log_digits_sweep(client, digits_exp)
    family_exp = client.create_experiment("family", artifact_location=str(root / "artifacts-family"))
    ids["family"] = [log_family_sweep(client, family_exp, name) for name in FAMILY]
    return {"uri": uri, "client": client, "root": root, **ids}


# The "edge" sweep: missing and extra seeds, non-monotone curves, a step logged twice on resume, a diverged seed, a
# variant that diverged at every tuning value, a parity claim, and a report metric apart from the tuning metric.
EDGE_SEEDS = [0, 1, 2, 3]
EDGE_FINALS = {  # variant -> {seed: final test/loss}; None: diverged
    "base": {0: 3.30, 1: 3.40, 2: 3.20, 3: 3.35},
    "holes": {0: 3.20, 2: 3.11, 3: 3.26, 4: 3.00},  # no seed 1; a seed 4 the baseline lacks
    "wobbly": {0: 3.31, 1: 3.38, 2: 3.215, 3: 3.35},
    "div": {0: 3.10, 1: 3.21, 2: None, 3: 3.14},
    "eq": {0: 3.301, 1: 3.398, 2: 3.2015, 3: 3.35},
}
EDGE_MARGIN = 0.05
EDGE_TUNE = {"key": "model.init_args.lr", "values": [0.001, 10000.0], "steps": 100, "seed": 99,
             "reuse_seed_run": False, "rule": "separate_seed"}
BOGUS = 9.0  # the value first logged at the last step of a resumed run, logged again later with the real one


def wobbly_curve(final: float) -> list[float]:
    """Non-monotone: dips below the final value at step 200, then rises back above it."""
    return [final + 6.0, final + 0.5, final - 0.05, final + 0.1, final]


def log_edge_sweep(client, experiment_id):
    sweep_id = "edge00000001"
    spec = protocol_spec(sweep_id, list(EDGE_FINALS) + ["dead"], EDGE_SEEDS, tune=EDGE_TUNE,
                         report_metric="test/loss", equivalence={"margin": EDGE_MARGIN, "variants": ["eq"]})
    parent = log_parent(client, experiment_id, sweep_id, spec)
    for variant in [*EDGE_FINALS, "dead"]:
        for value in EDGE_TUNE["values"]:
            diverges = variant == "dead" or value > 1
            log_child(client, experiment_id, parent, sweep_id, variant, 99, {"val/loss": [(100, 4.0)]}, final=False,
                      phase="tune", tune_value=value, status="FAILED" if diverges else "FINISHED",
                      tags={protocol.OUTCOME: "diverged" if diverges else "finished"})
    for variant, finals in EDGE_FINALS.items():
        for seed, final in finals.items():
            if final is None:
                log_child(client, experiment_id, parent, sweep_id, variant, seed, {"test/loss": [(0, 9.0)]},
                          status="FAILED", tune_value=0.001,
                          tags={protocol.OUTCOME: "diverged", protocol.DIVERGED_STEP: "150"})
                continue
            curve = wobbly_curve(final) if variant in ("wobbly", "base") else loss_curve(final)
            relogged = ()
            if variant == "wobbly":
                relogged = [("test/loss", STEPS[-1], final)]
                curve = [*curve[:-1], BOGUS]
            metrics = {"test/loss": list(zip(STEPS, curve, strict=True)),
                       "val/loss": [(s, v - 0.01) for s, v in zip(STEPS, curve, strict=True)]}
            log_child(client, experiment_id, parent, sweep_id, variant, seed, metrics, tune_value=0.001,
                      relogged=relogged, tags={protocol.OUTCOME: "finished"})
    return parent


DIGITS_FINALS = {"layernorm": [0.95, 0.96, 0.955, 0.95, 0.96], "dyt": [0.93, 0.94, 0.10, 0.935, 0.94]}


def log_digits_sweep(client, experiment_id):
    sweep_id = "digits000001"
    seeds = list(range(5))
    parent = log_parent(client, experiment_id, sweep_id, protocol_spec(sweep_id, list(DIGITS_FINALS), seeds,
                                                                       metric="val/acc1", tune=None))
    for variant, finals in DIGITS_FINALS.items():
        for seed, final in zip(seeds, finals, strict=True):
            curve = [(s, final * (0.3 + 0.7 * s / STEPS[-1])) for s in STEPS]
            log_child(client, experiment_id, parent, sweep_id, variant, seed,
                      {"val/acc1": curve, "val/score": curve})
    return parent


FAMILY = {"famA00000001": {"base": [3.30, 3.32, 3.31], "a": [3.25, 3.281, 3.262]},
          "famB00000001": {"base": [3.30, 3.32, 3.31], "b": [3.29, 3.305, 3.30]}}


def log_family_sweep(client, experiment_id, sweep_id):
    finals = FAMILY[sweep_id]
    parent = log_parent(client, experiment_id, sweep_id, protocol_spec(sweep_id, list(finals), SEEDS, tune=None,
                                                                       family="suite"))
    for variant, values in finals.items():
        for seed, final in zip(SEEDS, values, strict=True):
            log_child(client, experiment_id, parent, sweep_id, variant, seed,
                      {"val/loss": list(zip(STEPS, loss_curve(final), strict=True))})
    return parent


@pytest.fixture
def run_compare(store, tmp_path, monkeypatch, capsys):
    """``main([...])`` on the store, from an empty working folder; returns (exit code, stdout, stderr lines)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def run(*args):
        code = main([*args, "--tracking_uri", store["uri"]])
        captured = capsys.readouterr()
        return code, captured.out, [line for line in captured.err.splitlines() if line.strip()]

    return run


# --- reading the report back -------------------------------------------------------------------------------------


def table(markdown: str, heading: str) -> dict[str, dict[str, str]]:
    """The table of the section whose heading starts with ``heading``, as {first cell: {column: cell}}."""
    section = markdown[markdown.index(heading):].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")]
            for line in section.splitlines() if line.startswith("|")]
    header, body = rows[0], rows[2:]
    return {row[0].removesuffix(" (baseline)"): dict(zip(header, row, strict=True)) for row in body}


def numbers(cell: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"[-+]?\d[\d,]*\.?\d*(?:e[-+]?\d+)?", cell)]


def assert_printed(cell: str, expected: float, relative: float = 0.0):
    """The printed number equals ``expected`` to the decimals it was printed with."""
    (value,) = numbers(cell)
    decimals = len(cell.split(".")[1].rstrip("×")) if "." in cell and "e" not in cell else 0
    tolerance = max(0.5 * 10 ** -decimals * (1 + 1e-9), relative * abs(expected))
    assert abs(value - expected) <= tolerance, (cell, expected)


def pair(cell: str) -> tuple[str, str]:
    low, high = cell.strip("[]").split(", ")
    return low, high


def hand_interval(values, confidence=0.95):
    values = np.asarray(values)
    half = scipy_stats.t.ppf((1 + confidence) / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return values.mean() - half, values.mean() + half


def hand_holm(p):
    order = np.argsort(p)
    adjusted, running = np.empty(len(p)), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


# --- the report --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loss_report(store, tmp_path_factory):
    """The report on val/loss, run once for the tests that read it."""
    out = tmp_path_factory.mktemp("report")
    code = main(["--experiment", "norms", "--tracking_uri", store["uri"], "--out", str(out)])
    assert code == 0
    return (out / "report.md").read_text(), out


DECIMALS = 3  # two significant digits of the smallest spread (the baseline's std, 0.010)


def assert_decimals(cell: str, decimals: int = DECIMALS):
    """Every number in the cell is printed with exactly ``decimals`` decimals."""
    printed = re.findall(r"\d+(?:\.(\d*))?", cell)
    assert printed and all(len(d) == decimals for d in printed), (cell, decimals)


def test_variant_table_matches_a_computation_by_hand(loss_report):
    markdown, _ = loss_report
    rows = table(markdown, "## Variants")
    assert list(rows) == list(FINALS)
    for variant, finals in FINALS.items():
        row = rows[variant]
        assert row["seeds"] == "3"
        assert row["per seed"] == "; ".join(f"{s}: {f:.3f}" for s, f in zip(SEEDS, finals, strict=True))
        mean, std = row["mean ± std"].split(" ± ")
        assert_decimals(mean) and assert_decimals(std)
        assert_printed(mean, np.mean(finals))
        assert_printed(std, np.std(finals, ddof=1))
        low, high = pair(row["95% CI"])
        assert_printed(low, hand_interval(finals)[0])
        assert_printed(high, hand_interval(finals)[1])
        assert row[f"tuned `{TUNE['key']}`"] == TUNED[variant]
        assert row["parameters"] == f"{PARAMETERS[variant]:,}"
        rate = np.mean([np.median(throughput(variant, s)) for s in SEEDS])
        base_rate = np.mean([np.median(throughput("base", s)) for s in SEEDS])
        assert_printed(row["throughput vs baseline"], rate / base_rate)
    assert_printed(rows["base"]["spikes (final, mean)"], np.mean([spikes("base", s) for s in SEEDS]))
    assert_printed(rows["fast"]["spikes (final, mean)"], np.mean([spikes("fast", s) for s in SEEDS]))
    assert rows["same"]["spikes (final, mean)"] == "—"


def hand_holm_levels(p, alpha=0.05):
    """Holm's per-step levels alpha / (m - rank) until the first step it does not reject, that level after."""
    levels, stopped = np.empty(len(p)), None
    for rank, i in enumerate(np.argsort(p)):
        levels[i] = stopped or alpha / (len(p) - rank)
        if stopped is None and p[i] >= levels[i]:
            stopped = levels[i]
    return levels


def hand_mde(sd, n, alpha, power=0.8):
    """The effect whose noncentral-t power is ``power``, by bisection on scipy's nct (upper tail: the lower one
    is negligible at these effects)."""
    critical = scipy_stats.t.ppf(1 - alpha / 2, n - 1)
    low, high = 0.0, 100 * sd
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if scipy_stats.nct.sf(critical, n - 1, mid * np.sqrt(n) / sd) < power else (low, mid)
    return mid


def hand_sd_limit(differences, confidence=0.8):
    """The one-sided upper confidence limit of the std the MDE and the plan read: s * sqrt((n-1) / chi2 quantile
    at 1 - confidence, n-1 degrees of freedom), from scipy's chi2."""
    n = len(differences)
    return np.std(differences, ddof=1) * np.sqrt((n - 1) / scipy_stats.chi2.ppf(1 - confidence, n - 1))


def test_paired_tests_holm_and_verdicts_match_scipy(loss_report):
    markdown, _ = loss_report
    rows = table(markdown, "## Against the baseline")
    others = [v for v in FINALS if v != "base"]
    p = np.array([scipy_stats.ttest_rel(FINALS[v], FINALS["base"]).pvalue for v in others])
    adjusted, levels = hand_holm(p), hand_holm_levels(p)
    q = scipy_stats.false_discovery_control(p)
    for variant, p_raw, p_holm, level, q_bh in zip(others, p, adjusted, levels, q, strict=True):
        row = rows[variant]
        differences = np.subtract(FINALS[variant], FINALS["base"])
        assert row["paired seeds"] == "3"
        assert row["per-seed difference"] == "; ".join(f"{s}: {d:+.3f}" for s, d in zip(SEEDS, differences,
                                                                                         strict=True))
        assert_decimals(row["mean difference"])
        assert_printed(row["mean difference"], differences.mean())
        interval, at = row["CI (Holm)"].split(" at ")
        low, high = pair(interval)
        assert_printed(at.rstrip("%"), 100 * (1 - level))
        assert_printed(low, hand_interval(differences, 1 - level)[0])
        assert_printed(high, hand_interval(differences, 1 - level)[1])
        assert_printed(row["p (paired t)"], p_raw, relative=5e-3)
        assert_printed(row["p (Holm)"], p_holm, relative=5e-3)
        assert_printed(row["q (BH)"], q_bh, relative=5e-3)
        assert row["test"] == "paired t"
        assert_printed(row["MDE (80%)"], hand_mde(hand_sd_limit(differences), 3, 0.05 / 3))
        # the values' correlation, not the differences' (a variant's per-seed values against the baseline's)
        assert_printed(row["corr."], np.corrcoef(FINALS[variant], FINALS["base"])[0, 1])
        # all 3 seeds of "fast" and "slow" point one way: 2 of the 8 sign patterns are as extreme
        expected_flip = 0.25 if variant != "same" else 1.0
        assert_printed(row["p (sign-flip)"], expected_flip, relative=1e-3)
    assert rows["fast"]["verdict"] == "better"
    assert rows["slow"]["verdict"] == "worse"
    assert rows["same"]["verdict"] == "not distinguishable at this noise"
    assert "scipy.stats.ttest_rel" in markdown and "Holm-adjusted over the 3 tested comparisons" in markdown
    assert "Noise floor" not in markdown
    mde = re.search(r"\*\*Minimum detectable effect:\*\* ([\d.]+) to ([\d.]+)", markdown)
    mdes = [hand_mde(hand_sd_limit(np.subtract(FINALS[v], FINALS["base"])), 3, 0.05 / 3) for v in others]
    assert "80% upper confidence limit, each comparison's from its own pairs" in markdown
    assert "corr. is Pearson's correlation" in markdown
    assert_printed(mde[1], min(mdes)) and assert_printed(mde[2], max(mdes))


def hand_crossing(curve, target):
    """The first crossing of a falling curve, by np.interp on the reversed curve (valid for monotone curves)."""
    return np.interp(target, np.asarray(curve)[::-1], np.asarray(STEPS)[::-1])


def test_steps_to_each_baseline_seeds_final_value(loss_report):
    markdown, _ = loss_report
    rows = table(markdown, "## Steps to the baseline's final")
    assert rows["base"]["per-seed speedup"] == "0: 1.00×; 1: 1.00×; 2: 1.00×"  # 1.00 by construction
    # 3 seeds: the order-statistic interval [min, max] covers the median 75% of the time only, so none is printed
    assert rows["base"]["median speedup"] == "1.00×" and rows["base"]["interval (coverage)"] == "needs ≥6 seeds"
    ratios = []
    for seed in SEEDS:
        target = FINALS["base"][seed]
        ratios.append(hand_crossing(loss_curve(FINALS["base"][seed]), target)
                      / hand_crossing(loss_curve(FINALS["fast"][seed]), target))
    assert rows["fast"]["reached"] == "3 of 3"
    assert rows["fast"]["per-seed speedup"] == "; ".join(f"{s}: {r:.2f}×" for s, r in zip(SEEDS, ratios,
                                                                                          strict=True))
    assert_printed(rows["fast"]["median speedup"].rstrip("×"), np.median(ratios))
    assert rows["fast"]["interval (coverage)"] == "needs ≥6 seeds"
    assert rows["fast"]["sign test p"] == "0.25"  # 3 of 3 faster: 2 / 2^3
    steps = [hand_crossing(loss_curve(FINALS["fast"][s]), FINALS["base"][s]) for s in SEEDS]
    assert_printed(rows["fast"]["tokens"], np.median(steps) * ITEMS_PER_STEP, relative=1e-3)
    # Never reached: each seed counts at its bound (base step / last step), a slower outcome, not a blank.
    assert rows["slow"]["reached"] == "0 of 3" and rows["slow"]["median speedup"].startswith("≤")
    bounds = [hand_crossing(loss_curve(FINALS["base"][s]), FINALS["base"][s]) / STEPS[-1] for s in SEEDS]
    assert_printed(rows["slow"]["median speedup"].lstrip("≤").rstrip("×"), np.median(bounds))
    assert rows["slow"]["tokens"].startswith("≥")


def test_header_states_the_protocol(loss_report):
    markdown, _ = loss_report
    assert "`recipes/gpt_tiny.yaml`, 400 training steps per run" in markdown
    assert "Seeds: 0, 1, 2 (3 per variant)" in markdown
    assert "`val/loss`, lower is better (from the sweep's protocol)" in markdown
    assert "predates a separate report metric" in markdown
    assert "`model.init_args.lr` over 0.001, 0.003 per variant, 100 steps at seed 0" in markdown
    assert "Budget: 2 runs per variant, 8 planned, 8 found" in markdown
    assert "Rule: reuse (this sweep predates the tuning rule" in markdown and "evaluation seed 0" in markdown
    assert "this sweep's own family (the protocol declares none); Holm over its 3 tested comparisons" in markdown
    assert ("Counted: 12 FINISHED final runs (left out: 1 FAILED, 1 superseded by a newer run of the same variant "
            "and seed)") in markdown
    assert "Duplicate runs of one (variant, seed): base/seed 0 ×2; rule applied: the latest-started run" in markdown


def test_figures_are_written_linked_and_logged_to_the_parent(loss_report, store):
    markdown, out = loss_report
    for name in ("curves.png", "forest.png", "depth.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
        assert f"]({name})" in markdown
    logged = {a.path for a in store["client"].list_artifacts(store["main"], protocol.REPORT_DIR)}
    assert logged == {f"{protocol.REPORT_DIR}/{n}" for n in ("report.md", "curves.png", "forest.png", "depth.png")}


def test_depth_profile_is_the_mean_over_seeds_in_stream_order(store):
    from lit.compare.analysis import analyze
    from lit.compare.runs import find_parent, load_sweep

    client = store["client"]
    sweep = load_sweep(client, find_parent(client, sweep_run_id=store["main"]))
    assert "diag/grad_norm/layer00.attn" in sweep.logged and "diag/grad_norm/layer00.attn" not in set(sweep.history.key)
    depth = analyze(sweep, sweep.metric, None, 0.95).depth
    assert set(depth.first) == set(DEPTH_VARIANTS) and depth.first_steps == (0.0,) and depth.last_steps == (400.0,)
    for variant in DEPTH_VARIANTS:
        assert list(depth.last[variant].index) == SUBLAYERS
        expected = [np.mean([stream_rms(variant, s, i, 400) for s in SEEDS]) for i in range(len(SUBLAYERS))]
        np.testing.assert_allclose(depth.last[variant].to_numpy(), expected)


def test_stdout_is_the_report_and_default_out_folder(run_compare, tmp_path, store):
    code, out, err = run_compare("--sweep", store["main"])
    assert code == 0
    written = tmp_path / "compare" / store["sweep_id"][:8] / "report.md"
    assert written.read_text() == out
    assert len(err) == 1 and not err[0].startswith("error:")


def test_higher_is_better_metric_keeps_the_better_variant_better(run_compare):
    """val/acc1 = 10 - loss: every difference changes sign, the verdicts and the speedups must not."""
    code, markdown, _ = run_compare("--experiment", "norms", "--metric", "val/acc1")
    assert code == 0
    rows = table(markdown, "## Against the baseline")
    assert rows["fast"]["verdict"] == "better" and rows["slow"]["verdict"] == "worse"
    assert_printed(rows["fast"]["mean difference"], -np.mean(np.subtract(FINALS["fast"], FINALS["base"])))
    assert "`val/acc1`, higher is better" in markdown and "a positive difference favours the variant" in markdown
    targets = table(markdown, "## Steps to the baseline's final")
    assert targets["fast"]["reached"] == "3 of 3" and targets["slow"]["reached"] == "0 of 3"


def test_higher_is_better_flips_the_verdict_on_the_same_numbers(run_compare):
    """val/acc5 carries the loss numbers: the lower "fast" must now be worse, the higher "slow" better."""
    code, markdown, _ = run_compare("--experiment", "norms", "--metric", "val/acc5")
    assert code == 0
    rows = table(markdown, "## Against the baseline")
    assert rows["fast"]["verdict"] == "worse" and rows["slow"]["verdict"] == "better"
    assert rows["same"]["verdict"] == "not distinguishable at this noise"
    targets = table(markdown, "## Steps to the baseline's final")
    # a higher-is-better reading of falling curves: at the target from the first point, no speedup to speak of
    assert targets["slow"]["per-seed speedup"] == "0: at first point; 1: at first point; 2: at first point"


def test_another_baseline_and_confidence(run_compare):
    code, markdown, _ = run_compare("--experiment", "norms", "--baseline", "fast", "--confidence", "0.9")
    assert code == 0
    rows = table(markdown, "## Variants")
    low, high = pair(rows["slow"]["90% CI"])
    assert_printed(low, hand_interval(FINALS["slow"], 0.9)[0])
    assert set(table(markdown, "## Against the baseline")) == {"base", "same", "slow"}


def test_one_seed_gives_means_without_a_p_value(run_compare, store):
    code, markdown, _ = run_compare("--sweep", store["single"])
    assert code == 0
    variants = table(markdown, "## Variants")
    assert variants["fast"]["95% CI"] == "needs ≥2 seeds for an interval"
    assert_printed(variants["fast"]["mean ± std"], FINALS["fast"][0])
    row = table(markdown, "## Against the baseline")["fast"]
    assert row["p (paired t)"] == "—" and row["p (Holm)"] == "—"
    assert row["verdict"] == "needs ≥2 paired seeds for a test"
    assert row["corr."] == "—" and row["MDE (80%)"] == "—"
    assert "**Minimum detectable effect:** unknown; it needs ≥2 paired seeds" in markdown
    assert "Tuning: none" in markdown


# --- missing seeds, divergence, resume, parity, bounded metrics, families, plans ---------------------------------


@pytest.fixture(scope="module")
def edge_report(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("edge")
    assert main(["--sweep", store["edge"], "--tracking_uri", store["uri"], "--out", str(out)]) == 0
    return (out / "report.md").read_text()


def edge_differences(variant):
    base, ours = EDGE_FINALS["base"], EDGE_FINALS[variant]
    return {s: ours[s] - base[s] for s in sorted(set(base) & set(ours)) if ours[s] is not None}


def test_edge_reports_the_held_out_metric_and_the_tuning_rule(edge_report):
    assert "# Sweep `edge0000`: test/loss" in edge_report
    assert "the sweep reports `test/loss` and tuned by `val/loss`" in edge_report
    assert "Rule: separate seed: tuning ran on seed 99, outside the evaluation seeds" in edge_report
    assert "and 1 diverged (div 1)" in edge_report


def test_missing_seeds_pair_by_seed(edge_report):
    row = table(edge_report, "## Against the baseline")["holes"]
    differences = edge_differences("holes")
    assert list(differences) == [0, 2, 3] and row["paired seeds"] == "3"
    assert row["per-seed difference"] == "; ".join(f"{s}: {d:+.3f}" for s, d in differences.items())
    assert_printed(row["mean difference"], np.mean(list(differences.values())))
    p = scipy_stats.ttest_rel([EDGE_FINALS["holes"][s] for s in differences],
                              [EDGE_FINALS["base"][s] for s in differences]).pvalue
    assert_printed(row["p (paired t)"], p, relative=5e-3)
    # the correlation pairs by seed too: seeds 0, 2, 3 (by position it would pair holes' seed 2 with base's seed 1)
    assert_printed(row["corr."], np.corrcoef([EDGE_FINALS["holes"][s] for s in differences],
                                             [EDGE_FINALS["base"][s] for s in differences])[0, 1])
    variants = table(edge_report, "## Variants")
    assert variants["holes"]["per seed"] == "0: 3.200; 2: 3.110; 3: 3.260; 4: 3.000"


def test_a_resumed_step_keeps_its_latest_value_on_non_monotone_curves(edge_report):
    variants = table(edge_report, "## Variants")
    finals = EDGE_FINALS["wobbly"]
    assert variants["wobbly"]["per seed"] == "; ".join(f"{s}: {f:.3f}" for s, f in finals.items())
    assert_printed(variants["wobbly"]["mean ± std"].split(" ± ")[0], np.mean(list(finals.values())))
    # Both curves dip below the target at step 200 before ending above the dip: the first crossing counts (and
    # is interpolated), for the baseline seed too, which reaches its own final value before its last step.
    speedups = table(edge_report, "## Steps to the baseline's final")["wobbly"]
    for seed, cell in zip(EDGE_SEEDS, speedups["per-seed speedup"].split("; "), strict=True):
        target = EDGE_FINALS["base"][seed]
        base_step = first_crossing(wobbly_curve(target), target)
        assert base_step < STEPS[-1]
        assert_printed(cell.split(": ")[1].rstrip("×"), base_step / first_crossing(wobbly_curve(finals[seed]), target))


def first_crossing(curve, target):
    """The first point at or below ``target``, interpolated from the point before it."""
    first = next(i for i, v in enumerate(curve) if v <= target)
    if first == 0:
        return STEPS[0]
    return STEPS[first - 1] + (target - curve[first - 1]) * (STEPS[first] - STEPS[first - 1]) / (
        curve[first] - curve[first - 1])


def test_a_diverged_seed_is_an_outcome(edge_report):
    variants = table(edge_report, "## Variants")
    assert variants["div"]["seeds"] == "3 + 1 diverged"
    assert "2: diverged at 150" in variants["div"]["per seed"]
    row = table(edge_report, "## Against the baseline")["div"]
    assert row["paired seeds"] == "4 (1 diverged: not in t)" and "2: variant diverged" in row["per-seed difference"]
    assert row["test"] == "sign-flip" and row["CI (Holm)"] == "— (sign-flip verdict)"
    finite = edge_differences("div")
    assert_printed(row["p (paired t)"], scipy_stats.ttest_1samp(list(finite.values()), 0).pvalue, relative=5e-3)
    assert_printed(row["corr."], np.corrcoef([EDGE_FINALS["div"][s] for s in finite],  # the finished pairs only
                                             [EDGE_FINALS["base"][s] for s in finite])[0, 1])
    # three seeds better, the diverged one worst of all: signed ranks -2, -1, +4, -3, |sum| 2. A pattern's sum is
    # 10 - 2 * (the ranks it negates); only {1, 4} and {2, 3} give 0, so 14 of the 16 patterns reach |2|
    assert_printed(row["p (sign-flip)"], 14 / 16, relative=1e-3)
    assert row["verdict"] == "not distinguishable at this noise"
    assert "enters the sign-flip test as the worst outcome" in edge_report


def test_a_variant_diverged_at_every_tuning_value_is_reported(edge_report):
    assert table(edge_report, "## Variants")["dead"]["seeds"] == "0 (diverged at every tuning value: 2 of 2)"
    assert table(edge_report, "## Against the baseline")["dead"]["verdict"] == "diverged at every tuning value"


def test_parity_is_tested_as_equivalence(edge_report):
    row = table(edge_report, "## Against the baseline")["eq"]
    d = np.array(list(edge_differences("eq").values()))
    p = max(scipy_stats.ttest_1samp(d, -EDGE_MARGIN, alternative="greater").pvalue,
            scipy_stats.ttest_1samp(d, EDGE_MARGIN, alternative="less").pvalue)
    assert_printed(row["p (TOST)"], p, relative=5e-3)
    assert float(row["p (TOST, Holm)"]) >= float(row["p (TOST)"])  # the adjusted p, the one the verdict reads
    # Two families, each Holm on its own: the report says so and gives the union bound.
    assert "a second family, Holm-adjusted on their own; by the union bound" in edge_report
    assert row["verdict"] == f"equivalent within ±{EDGE_MARGIN:g}"
    assert table(edge_report, "## Against the baseline")["holes"]["p (TOST)"] == "—"


def test_parity_flags_override_the_protocol(run_compare, store):
    code, markdown, _ = run_compare("--sweep", store["edge"], "--parity", "holes", "--equivalence_margin", "0.001")
    assert code == 0
    rows = table(markdown, "## Against the baseline")
    assert rows["holes"]["verdict"] in ("different (better)", "not shown equivalent")
    assert rows["eq"]["p (TOST)"] == "—"


def test_a_bounded_metric_keeps_its_interval_in_zero_one_and_shows_the_collapse(run_compare):
    code, markdown, _ = run_compare("--experiment", "digits")
    assert code == 0
    row = table(markdown, "## Variants")["dyt"]
    low, high = (float(x) for x in pair(row["95% CI"]))
    assert 0 < low < high < 1 and hand_interval(DIGITS_FINALS["dyt"])[1] > 1  # the raw t interval would not
    assert row["seeds"] == "5 (1 collapsed)" and "2: 0.1000 collapsed" in row["per seed"]
    comparison = table(markdown, "## Against the baseline")["dyt"]
    assert_printed(comparison["p (sign-flip)"], 2 / 32, relative=1e-3)  # all five seeds worse
    assert "logit scale" in markdown


def test_an_unknown_metric_needs_a_mode(run_compare):
    code, _, err = run_compare("--experiment", "digits", "--metric", "val/score")
    assert code == 2 and len(err) == 1 and "--mode min or --mode max" in err[0]
    code, markdown, _ = run_compare("--experiment", "digits", "--metric", "val/score", "--mode", "max")
    assert code == 0 and "`val/score`, higher is better (from --mode)" in markdown
    assert table(markdown, "## Against the baseline")["dyt"]["verdict"] != "better"


def test_holm_runs_over_the_declared_family(run_compare, store):
    def p(sweep):
        (base, variant) = FAMILY[sweep].values()
        return scipy_stats.ttest_rel(variant, base).pvalue

    code, markdown, _ = run_compare("--sweep", store["family"][0])
    assert code == 0
    assert "family `suite`, declared in the protocol over 2 sweeps (famA0000, famB0000)" in markdown
    row = table(markdown, "## Against the baseline")["a"]
    assert_printed(row["p (Holm)"], hand_holm(np.array([p("famA00000001"), p("famB00000001")]))[0], relative=5e-3)
    code, markdown, _ = run_compare("--sweep", store["family"][0], "--no_family")
    assert_printed(table(markdown, "## Against the baseline")["a"]["p (Holm)"], p("famA00000001"), relative=5e-3)


def test_plan_gives_the_seeds_an_effect_needs(run_compare):
    code, out, _ = run_compare("--experiment", "norms", "--plan", "--effect", "0.02")
    assert code == 0 and "# Plan for sweep" in out
    rows = table(out, "# Plan")
    alpha = 0.05 / 3
    assert "read at its 80% upper confidence limit" in out
    for variant in ("fast", "same", "slow"):
        differences = np.subtract(FINALS[variant], FINALS["base"])
        sd = hand_sd_limit(differences)
        n = next(n for n in range(2, 1000) if scipy_stats.nct.sf(scipy_stats.t.ppf(1 - alpha / 2, n - 1), n - 1,
                                                                  0.02 * np.sqrt(n) / sd) >= 0.8)
        assert rows[variant]["seeds for 0.02"] == str(n)
        assert_printed(rows[variant]["std of paired differences"], differences.std(ddof=1))
        assert_printed(rows[variant]["80% upper limit of the std"], sd)
        assert_printed(rows[variant]["MDE now (80%)"], hand_mde(sd, 3, alpha))


# --- errors: one line, exit code 2 -------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "says"), [
    (["--experiment", "nope"], ["no experiment named 'nope'", "'norms'", "'single'"]),
    (["--experiment", "plain"], ["has no sweep parent run"]),
    (["--sweep", "0123456789abcdef"], ["no MLflow run '0123456789abcdef'"]),
    (["--experiment", "norms", "--metric", "val/nope"], ["'val/nope'", "val/acc1", "val/loss", "model/parameters"]),
    (["--experiment", "norms", "--baseline", "nope"], ["'nope' is not a variant", "base, fast, same, slow"]),
    (["--experiment", "unfinished"], ["no FINISHED final child runs", "FAILED: 1", "RUNNING: 1"]),
    (["--experiment", "single", "--require_test"], ["--require_test", "paired seeds fast: 1"]),
    (["--experiment", "norms", "--confidence", "95"], ["between 0 and 1"]),
    (["--experiment", "norms", "--plan"], ["--plan needs --effect"]),
    (["--experiment", "norms", "--effect", "0.1"], ["--effect is read only with --plan"]),
    (["--experiment", "norms", "--parity", "fast"], ["needs a margin", "--equivalence_margin"]),
    (["--experiment", "norms", "--equivalence_margin", "0.1"], ["--parity LABEL"]),
    (["--experiment", "norms", "--parity", "nope", "--equivalence_margin", "0.1"], ["not a variant"]),
    (["--experiment", "norms", "--mode", "up"], ["invalid choice"]),
    ([], ["one of the arguments --experiment --sweep is required"]),
])
def test_user_errors_are_one_line(run_compare, args, says):
    code, out, err = run_compare(*args)
    assert code == 2 and out == ""
    assert len(err) == 1 and err[0].startswith("error: "), err
    for text in says:
        assert text in err[0]


def test_a_child_run_id_points_at_its_parent(run_compare, store):
    code, _, err = run_compare("--sweep", store["child"])
    assert code == 2 and len(err) == 1
    assert "is not a sweep parent run" in err[0] and f"its parent run is {store['main']}" in err[0]


def test_a_missing_database_is_not_created(tmp_path, capsys):
    missing = tmp_path / "elsewhere.db"
    assert main(["--experiment", "norms", "--tracking_uri", f"sqlite:///{missing}"]) == 2
    assert capsys.readouterr().err.startswith(f"error: no MLflow database at {missing}")
    assert not missing.exists()


def test_help_explains_the_command(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for words in ("--experiment", "--sweep", "--require_test", "Holm", "report/"):
        assert words in text


# --- the statistics on their own ---------------------------------------------------------------------------------


def test_holm_matches_its_definition():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    p = np.random.default_rng(0).uniform(0, 0.2, 7)
    np.testing.assert_allclose(stats.holm(list(p)), hand_holm(p))


def test_step_reaching_interpolates_in_both_directions():
    assert stats.step_reaching([0, 100, 200], [5.0, 3.0, 2.0], 2.5, "min") == pytest.approx(150)
    assert stats.step_reaching([0, 100, 200], [0.1, 0.5, 0.9], 0.7, "max") == pytest.approx(150)
    assert stats.step_reaching([0, 100], [5.0, 4.0], 3.0, "min") is None


def test_a_tuned_value_at_the_edge_of_the_grid_is_flagged():
    from types import SimpleNamespace

    from lit.compare.report import _at_grid_edge

    grid = SimpleNamespace(protocol={"tune": {"values": ["1e-3", "3e-3", "1e-2"]}})
    # Tags may carry the value rewritten (0.01 for 1e-2): compared as numbers.
    assert _at_grid_edge(grid, "0.01") and _at_grid_edge(grid, "1e-3") and not _at_grid_edge(grid, "0.003")
    # A 2-value grid has no inside: every pick is at an edge, and the report says the grid cannot bracket one.
    assert _at_grid_edge(SimpleNamespace(protocol={"tune": {"values": ["1e-3", "1e-2"]}}), "0.01")
    assert not _at_grid_edge(SimpleNamespace(protocol={"tune": None}), None)


def test_a_two_value_grid_is_said_to_bracket_nothing(loss_report):
    markdown, _ = loss_report  # the fixture tunes over 2 values: every pick is at an edge
    assert "**A 2-value tuning grid cannot bracket an optimum:**" in markdown
    assert "**At the edge of the tuning grid:**" not in markdown  # one note, the one that says why


def test_each_row_prints_the_sign_flip_floor_at_its_n_and_family(loss_report):
    from lit.compare import stats

    assert stats.sign_flip_decides_from(24, 0.05) == 10 and stats.sign_flip_decides_from(4, 0.05) == 8
    assert stats.sign_flip_decides_from(1, 0.05) == 6 and stats.sign_flip_floor(6) == pytest.approx(0.03125)
    markdown, _ = loss_report
    rows = table(markdown, "## Against the baseline")
    m = len(rows)  # one family of this sweep's tested comparisons, 3 pairs each
    need = stats.sign_flip_decides_from(m, 0.05)
    for row in rows.values():
        assert row["sign-flip floor (Holm)"] == f"{min(1.0, m * 2 / 2**3):.2g} (decides from n = {need})"
