"""The sequential leads preset: the same design as the text suite but for its looks, a row per lead with the fixed
design's quoted result, and the compute each verdict took. Fast: fake runs and analyses, no training."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks import reproduction as repro
from benchmarks import reproduction_leads as leads
from lit.compare import stats
from lit.compare.analysis import T_TEST, Comparison
from lit.sweep import protocol


def run(variant: str, phase: str, seconds: float) -> SimpleNamespace:
    tags = {protocol.PARENT_RUN: "parent", protocol.VARIANT: variant, protocol.PHASE: phase}
    return SimpleNamespace(info=SimpleNamespace(start_time=0, end_time=int(seconds * 1000)),
                           data=SimpleNamespace(tags=tags))


def test_the_leads_run_the_text_suites_design_with_looks_instead_of_seeds():
    args = leads.sweep_args(2)
    text = repro.SUITES["text"].sweep_args(2)
    assert "--looks=3,6,9,12" in args and "--effect_of_interest=0.03" in args
    assert not any(a.startswith(("--seeds", "--family", "--equivalen")) for a in args)  # refused with --looks
    shared = ("--config", "--tune=", "--tune_steps=", "--metric=", "--report_metric=")
    assert [a for a in args if a.startswith(shared)] == [a for a in text if a.startswith(shared)]
    assert args[args.index("--config") + 1] == text[text.index("--config") + 1]
    assert [a for a in args if a.startswith(("--model.", "--trainer.", "--data."))] == list(repro.SUITES["text"].budget)


def test_every_lead_is_a_text_claim_with_its_fixed_design_row():
    text_variants = {c.variant for c in repro.CLAIMS if c.suite == "text"}
    labels = [f"config=gpt_{name}" for name in leads.LEADS]
    assert set(labels) <= text_variants
    assert set(leads.EARLIER) == set(labels)


def test_fixed_cost_prices_the_fixed_seed_count_at_the_measured_run_times():
    runs = [run("v", protocol.TUNE_PHASE, 30), run("v", protocol.TUNE_PHASE, 50),
            run("v", protocol.SEED_PHASE, 60), run("v", protocol.SEED_PHASE, 100)]
    # 2 tuning runs at their mean 40 s, then 6 seeds at their mean 80 s
    assert abs(leads.fixed_cost(runs, 6) - (2 * 40 + 6 * 80) / 3600) < 1e-12
    assert leads.fixed_cost(runs[:2], 6) is None  # no seed run ended yet: no measured price


def test_leads_table_has_a_row_per_lead_the_baseline_and_the_totals():
    variant = "config=gpt_perinorm"
    paired = stats.paired_difference({"1": 0.9, "2": 0.95, "3": 0.92}, {"1": 1.0, "2": 1.0, "3": 1.0}, 0.95)
    decided = Comparison(variant, paired, 0.01, "better (decided at look 1 of 4)", outcomes={}, test=T_TEST,
                         interval=(-0.1, -0.05), level=0.0125, correlation=0.8, mde=0.021)
    analysis = SimpleNamespace(baseline="recipe", comparisons=[decided],
                               variants=[SimpleNamespace(label=variant, tuned="2e-2"),
                                         SimpleNamespace(label="recipe", tuned="6e-3")])
    runs = [run(variant, protocol.TUNE_PHASE, 36), *(run(variant, protocol.SEED_PHASE, 72) for _ in range(3)),
            run("recipe", protocol.TUNE_PHASE, 36), *(run("recipe", protocol.SEED_PHASE, 72) for _ in range(3))]
    table = leads.leads_table(analysis, runs)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(leads.LEADS) + 1
    peri = next(r for r in rows if r.startswith("| Peri-LN"))
    cells = [c.strip() for c in peri.strip("|").split("|")]
    assert cells[2] == "2e-2 (grid edge: a bound)"  # the grid's top: the comparison is at a bound
    assert cells[3] == "better (decided at look 1 of 4)" and cells[4] == "3" and cells[7] == "+0.80"
    assert cells[5].endswith("[-0.100, -0.050] (98.75%)") and cells[8] == "0.021"  # the level; the MDE
    assert cells[9] == f"{(36 + 3 * 72) / 3600:.3f}"  # what it spent
    assert cells[10] == f"{(36 + 6 * 72) / 3600:.3f}"  # the fixed 6-seed design at the same run times
    baseline = rows[-1].strip("|").split("|")
    assert baseline[2].strip() == "6e-3" and baseline[4].strip() == "3"
    assert "not run yet" in next(r for r in rows if r.startswith("| Mix-LN"))
    assert f"**{2 * (36 + 3 * 72) / 3600:.2f} core-hours**" in table
    header = table.splitlines()[0]
    assert all(len(r.strip("|").split("|")) == header.count(" | ") + 1 for r in rows)
