"""The reproduction preset's own logic: the claims table read from compare's analysis (no Holm of its own), the
verdicts in each claim's terms, the suites' commands and the resume order. Fast: fake analyses, no training."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import reproduction as repro
from lit.compare import stats
from lit.compare.analysis import DIFFERENT, EQUIVALENT, NEEDS_PAIRS, NOT_EQUIVALENT, T_TEST, Comparison, Equivalence
from lit.sweep.grid import label_of, parse_variant


def comparison(label: str, differences: dict[str, float], verdict: str, p_adjusted: float | None = 0.5,
               equivalence: Equivalence | None = None, interval=(-0.01, 0.03)) -> Comparison:
    baseline = {seed: 1.0 for seed in differences}
    variant = {seed: 1.0 + d for seed, d in differences.items()}
    paired = stats.paired_difference(variant, baseline, 0.95)
    return Comparison(label, paired, p_adjusted, verdict, outcomes=dict(differences), p_sign_flip=0.25, test=T_TEST,
                      q_value=p_adjusted, level=0.01, interval=interval, mde=0.0421, equivalence=equivalence)


def claim(method: str) -> repro.Claim:
    return next(c for c in repro.CLAIMS if c.method == method)


SEEDS = {"1337": -0.02, "1338": -0.01, "1339": -0.03}


@pytest.mark.parametrize(("expect", "verdict", "status", "says"), [
    ("better", stats.BETTER, repro.DECIDED, "reproduced"),
    ("better", stats.WORSE, repro.DECIDED, "not reproduced (worse)"),
    ("better", stats.UNRESOLVED, repro.UNDECIDED, "undecided"),
    ("worse", stats.WORSE, repro.DECIDED, "reproduced"),
    ("worse", stats.BETTER, repro.DECIDED, "not reproduced (better)"),
    ("parity", EQUIVALENT.format(margin=0.02), repro.DECIDED, "reproduced (equivalent within ±0.02)"),
    ("parity", NOT_EQUIVALENT, repro.UNDECIDED, "undecided"),
    ("parity", f"{DIFFERENT} ({stats.BETTER})", repro.DECIDED, "not reproduced (better: not parity)"),
    ("parity", f"{DIFFERENT} ({stats.WORSE})", repro.DECIDED, "not reproduced (worse)"),
    ("parity_or_better", f"{DIFFERENT} ({stats.BETTER})", repro.DECIDED, "reproduced (beats it)"),
    ("parity_or_better", EQUIVALENT.format(margin=0.02), repro.DECIDED, "reproduced (equivalent"),
    ("parity_or_better", f"{DIFFERENT} ({stats.WORSE})", repro.DECIDED, "not reproduced (worse)"),
])
def test_verdict_in_the_claims_own_terms(expect, verdict, status, says):
    c = repro.Claim("text", "m", "config=x", "paper", expect)
    text, got = repro.claim_verdict(c, comparison("config=x", SEEDS, verdict, p_adjusted=0.01))
    assert got == status
    assert text.startswith(says)


def test_untested_or_missing_comparison_is_pending():
    c = claim("Peri-LN")
    assert repro.claim_verdict(c, None) == ("pending: not run yet", repro.PENDING)
    text, status = repro.claim_verdict(c, comparison(c.variant, {"1337": 0.1}, NEEDS_PAIRS, p_adjusted=None))
    assert status == repro.PENDING and NEEDS_PAIRS in text


def test_claims_table_prints_compares_numbers_without_its_own_correction():
    peri, lns = claim("Peri-LN"), claim("LayerNorm-Scaling")
    dyt = claim("DyT (LM)")
    tost = Equivalence(0.02, 0.004, 0.0123, EQUIVALENT.format(margin=0.02))
    text = SimpleNamespace(metric="test/loss", comparisons=[
        comparison(peri.variant, SEEDS, stats.BETTER, p_adjusted=0.0217, interval=(-0.035, -0.005)),
        comparison(lns.variant, {"1337": 0.01, "1338": -0.02, "1339": 0.005}, stats.UNRESOLVED, p_adjusted=0.871),
        comparison(dyt.variant, {"1337": 0.001, "1338": -0.002, "1339": 0.0}, tost.verdict, p_adjusted=1.0,
                   equivalence=tost),
    ])
    table, counts = repro.claims_table({("text", None): text})
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    # the Holm p compare gave, as given: a second correction over the table's rows would change 0.0217 and 0.871
    assert "| 0.0217 |" in rows["Peri-LN"] and "| 0.871 |" in rows["LayerNorm-Scaling"]
    assert "[-0.035, -0.005]" in rows["Peri-LN"]  # compare's interval in step with Holm, not a fresh one
    assert "1337: -0.020, 1338: -0.010, 1339: -0.030" in rows["Peri-LN"]  # per-seed values, by seed
    assert "-0.020 [" in rows["Peri-LN"]  # the mean paired difference
    assert "0.0421" in rows["Peri-LN"]  # the MDE
    assert rows["Peri-LN"].endswith("| reproduced |  |")  # no steps to target in this fake analysis
    assert rows["LayerNorm-Scaling"].endswith("| undecided (no difference shown) |  |")
    assert "0.0123 (±0.02)" in rows["DyT (LM)"] and "reproduced (equivalent within ±0.02)" in rows["DyT (LM)"]
    raw = stats.paired_difference({s: 1 + d for s, d in SEEDS.items()}, dict.fromkeys(SEEDS, 1.0), 0.95).p_value
    assert f"{raw:.3g} ({T_TEST})" in rows["Peri-LN"]  # the raw p is printed beside the adjusted one
    assert rows["Post-LN"].endswith("| pending: not run yet |  |")  # in the suite, not in the fake analysis
    assert rows["DyT (ViT)"].endswith("| pending: not run yet |  |")  # a suite with no analysis at all
    assert counts == {repro.DECIDED: 2, repro.UNDECIDED: 1, repro.PENDING: len(repro.CLAIMS) - 3}
    assert "2 claims decided, 1 undecided" in table
    assert len(rows) == len(repro.CLAIMS) + 1  # the header and one row per claim
    assert all(line.count(" | ") == repro.HEADER.count(" | ") for line in rows.values())


def test_outlier_claims_read_their_own_metric():
    osp = claim("OSP (single-scale RMSNorm + embedding projection)")
    assert osp.metric == repro.KURTOSIS
    kurtosis = SimpleNamespace(metric=repro.KURTOSIS, comparisons=[
        comparison(osp.variant, {"1337": -5.0, "1338": -4.0, "1339": -6.0}, stats.BETTER, p_adjusted=0.03)])
    loss = SimpleNamespace(metric="test/loss", comparisons=[
        comparison(osp.variant, SEEDS, stats.WORSE, p_adjusted=0.03)])
    table, _ = repro.claims_table({("text", repro.KURTOSIS): kurtosis, ("text", None): loss})
    row = next(line for line in table.splitlines() if line.startswith(f"| {osp.method} |"))
    assert f"| {repro.KURTOSIS} |" in row and row.endswith("| reproduced |  |")


def test_suites_and_claims_agree():
    for suite in repro.SUITES.values():
        labels = {label_of(parse_variant(v)) for v in suite.variants} | {"recipe"}
        assert set(suite.equivalent) <= labels
        for c in (c for c in repro.CLAIMS if c.suite == suite.name):
            assert c.variant in labels, c
            parity = c.expect.startswith("parity") and c.metric is None
            assert parity == (not suite.equivalent or c.variant in suite.equivalent), c
    text = repro.SUITES["text"]
    for zoo in ("attnres", "attnres_block", "hyperconn", "bhyt", "precrmsnorm", "prepbn"):
        assert f"config=recipes/gpt_{zoo}.yaml" in text.variants  # the zoo beside the other text methods
    args = text.sweep_args(1)
    assert "--model.arch.n_layers=8" in args and "--tune=model.lr=1e-3,2e-3,6e-3,2e-2" in args
    assert not any(a.startswith("--reuse_tuning_run_as_seed") for a in args)  # the separate tuning seed
    for suite in repro.SUITES.values():
        args = suite.sweep_args(1)
        assert f"--family=reproduction-{suite.name}" in args and suite.report_metric.startswith("test/")
        assert suite.seeds + suite.add_seeds >= 6


def test_run_sweep_first_pass_then_plan_then_extension():
    calls = []
    suite = repro.SUITES["digits"]
    repro.run_sweep(suite, 1, calls.append)
    assert [c[0] for c in calls] == ["sweep", "compare", "sweep"]
    assert "--plan" in calls[1] and calls[2][-1] == f"--add_seeds={suite.add_seeds}"
    assert not any(a.startswith("--add_seeds") for a in calls[0])
    assert calls[2][:-1] == calls[0]  # the extension is the same sweep, named the same way


def test_run_sweep_after_the_extension_runs_only_the_extended_command():
    calls = []

    def run(argv):
        calls.append(argv)
        if len(calls) == 1:  # the first-pass command refuses once the sweep has more seeds (exit 2)
            raise SystemExit(2)

    suite = repro.SUITES["text"]
    repro.run_sweep(suite, 1, run)
    assert len(calls) == 2 and calls[1][-1] == f"--add_seeds={suite.add_seeds}"


def test_run_sweep_stops_when_the_first_pass_is_interrupted():
    calls = []

    def run(argv):
        calls.append(argv)
        raise SystemExit(130)  # Ctrl-C: the sweep says how to resume; the preset must not go on to extend it

    with pytest.raises(SystemExit):
        repro.run_sweep(repro.SUITES["digits"], 1, run)
    assert len(calls) == 1


def test_tuning_and_report_metrics_point_the_same_way():
    from lit.compare.analysis import known_mode

    for suite in repro.SUITES.values():
        assert known_mode(suite.metric) == known_mode(suite.report_metric), suite.name


def child(phase: str | None, start_ms: int, end_ms: int | None, parent: str | None = "p") -> SimpleNamespace:
    tags = {repro.protocol.PHASE: phase} if phase else {}
    if parent:
        tags[repro.protocol.PARENT_RUN] = parent
    return SimpleNamespace(data=SimpleNamespace(tags=tags), info=SimpleNamespace(start_time=start_ms,
                                                                                  end_time=end_ms))


def test_compute_sums_the_child_runs_that_ended_by_phase():
    runs = [child("tune", 0, 1_800_000), child("seed", 0, 3_600_000), child("seed", 1_000, 1_801_000),
            child("seed", 0, None),  # still going: nothing yet
            child(None, 0, 9_000_000, parent=None)]  # the parent: its time is its children's
    compute = repro.compute_of(runs)
    assert (compute.tuning_runs, compute.seed_runs) == (1, 2)
    assert compute.run_hours == pytest.approx(0.5 + 1.0 + 0.5)
    text = repro.compute_lines({"text": compute, "digits": None})
    assert "text: 1 tuning + 2 seed runs, 2.00 run-hours" in text and "2.00 run-hours in all" in text
    assert "no run has ended" in repro.compute_lines({"text": None})


def test_speedup_cell_reads_compares_steps_to_target_for_claims_on_the_suite_metric():
    ngpt, osp = claim("nGPT (ViT)"), claim("OSP (single-scale RMSNorm + embedding projection)")
    from lit.compare.stats import CensoredMedian

    summary = CensoredMedian(2.5712, False, (2.18, 3.031), False, 0.9784, 0.002, 6)
    reached = SimpleNamespace(label=ngpt.variant, summary=summary, interval=(2.18, 3.031), reached=10, seeds=10)
    analysis = SimpleNamespace(targets=[reached])
    assert repro.speedup_cell(ngpt, analysis) == "2.57x [2.18, 3.03] (97.8%) (10 of 10 reached)"
    # Seeds that never reached count at their bound: the median and the interval's lower end are bounds then.
    some = SimpleNamespace(label=ngpt.variant, summary=CensoredMedian(0.98, True, (0.7, 1.3), True, 0.969, 1.0, 6),
                           interval=(0.7, 1.3), reached=3, seeds=6)
    assert repro.speedup_cell(ngpt, SimpleNamespace(targets=[some])) == "≤0.98x [≤0.70, 1.30] (96.9%) (3 of 6 reached)"
    never = SimpleNamespace(label=ngpt.variant, summary=None, interval=None, reached=0, seeds=10)
    assert repro.speedup_cell(ngpt, SimpleNamespace(targets=[never])) == "not reached (0 of 10)"
    assert repro.speedup_cell(osp, analysis) == ""  # a claim on another metric (kurtosis): no steps to target
    assert repro.speedup_cell(ngpt, None) == ""


def test_each_suite_has_a_store_of_its_own():
    # A suite can then run where its runs are cheapest and its store travel alone (docs/reproduction.md).
    stores = {name: suite.store for name, suite in repro.SUITES.items()}
    assert len(set(stores.values())) == len(stores)
    for name, suite in repro.SUITES.items():
        args = suite.sweep_args(parallel=1)
        assert f"--tracking_uri={stores[name]}" in args and name in stores[name]
