"""The like-for-like compute table of the leads (statistics-review-3, D4) and the leads preset's fresh-seed study (D3).

The table's simulation is checked against the review's own numbers, drawn with its own scripts at the sweep's
estimates under the futility rule the sweep ran (conditional power at ±E from the first look; today's rule is
put back only inside the test). Fast: 3,000 simulated families, a fixed seed, a tolerance of three Monte-Carlo
standard errors plus the review's rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import reproduction_leads as leads
from lit.compare import design_cost
from lit.statistics import sequential

REPORT = (leads.REPO / leads.study().report_out / "report.md").read_text()
PAGE = (leads.REPO / leads.study().page).read_text()


def the_rule_the_sweep_ran(monkeypatch) -> None:
    """Futility as the leads sweep ran it (before statistics-review-3, D2): conditional power at ±E alone, checked
    from the first look. Today's ``decide`` passes max(E, |estimate|) and skips looks below 4 pairs."""
    original = sequential.conditional_power

    def at_e(mean, sd, pairs, most, effect, critical):
        return original(mean, sd, pairs, most, leads.EFFECT_OF_INTEREST, critical)

    monkeypatch.setattr(sequential, "conditional_power", at_e)
    monkeypatch.setattr(sequential, "FUTILITY_MIN_PAIRS", 0)


def within(estimate: design_cost.Estimate, quoted: float, rounding: float = 0.005) -> bool:
    return abs(estimate.mean - quoted) <= 3 * estimate.standard_error + rounding


@pytest.mark.parametrize("factor, quoted", [
    (1.0, {"sequential": (4.13, 3.29), "fixed, 6 seeds": (3.03, 2.21), "fixed, 12 seeds": (4.20, 3.90)}),
    (0.5, {"sequential": (2.54, None), "fixed, 6 seeds": (1.81, 2.21), "fixed, 12 seeds": (2.78, 3.90)}),
])
def test_the_table_reproduces_the_reviews_under_the_rule_the_sweep_ran(monkeypatch, factor, quoted):
    the_rule_the_sweep_ran(monkeypatch)
    family = leads.leads_family(REPORT, PAGE).scaled(factor)
    plan = sequential.Plan(leads.LOOKS, sequential.ALPHA, effect_of_interest=leads.EFFECT_OF_INTEREST)
    outcomes = design_cost.compare_designs(family, plan, leads.FIXED_DESIGNS, reps=3000, seed=7)
    by = {"sequential": outcomes[0], **{o.design: o for o in outcomes[2:]}}
    for design, (decisions, hours) in quoted.items():
        assert within(by[design].decisions, decisions), (design, by[design].decisions, decisions)
        if hours is not None:  # the run times come from 3-decimal costs: 0.01 of rounding on a total
            assert within(by[design].core_hours, hours, 0.011), (design, by[design].core_hours, hours)


def test_the_leads_estimates_are_read_from_the_committed_pages():
    family = leads.leads_family(REPORT, PAGE)
    differences = leads.reported_differences(REPORT)
    assert [len(differences[a.label]) for a in family.arms] == [12, 12, 9, 12, 9, 6, 9]  # the seeds each ran
    mix = next(a for a in family.arms if a.label == "config=gpt_mixnorm")
    assert abs(mix.effect - (-0.045 - 0.037 - 0.040 - 0.042 - 0.043 - 0.055) / 6) < 1e-12
    _, baseline, tuning, spent = leads.reported_seed_hours(PAGE)
    assert abs(baseline - (0.345 - 0.191) / 6) < 1e-12
    assert abs(tuning - 0.527) < 0.002 and abs(spent - 3.37) < 0.005  # the page's "In all: 3.37 core-hours"


def test_on_the_sweeps_own_data_each_design_decides_four():
    """The looks replayed from the printed differences decide what the sweep decided; a fixed 6-seed design with
    Holm over the same seven, on the first 6 seeds, decides four too (the review: Mix-LN, TokenFormer,
    hyper-connections, full AttnRes), not none."""
    line = leads.realized(REPORT, PAGE)
    assert "decide 4 (Peri-LN, TokenFormer, Mix-LN, Hyper-connections (dynamic, n=4)) for the 3.37" in line
    assert ("decides 4 (TokenFormer, Attention Residuals (full), Mix-LN, Hyper-connections (dynamic, n=4)) for "
            "2.21") in line


def test_the_baseline_runs_as_many_seeds_as_its_longest_comparison():
    family = design_cost.Family((design_cost.Arm("a", 0.0, 1.0, 1.0), design_cost.Arm("b", 0.0, 1.0, 2.0)),
                                baseline_seed_hours=10.0, tuning_hours=5.0)
    assert design_cost.cost(family, np.array([[3, 12], [6, 3]])).tolist() == [5 + 3 + 24 + 120, 5 + 6 + 6 + 60]


def test_a_fresh_seed_base_is_a_study_of_its_own():
    first, fresh = leads.study(), leads.study(leads.FRESH_SEED_BASE)
    for field in ("experiment", "store", "sweep_out", "report_out", "page"):
        assert getattr(first, field) != getattr(fresh, field), field
    assert first.store == leads.STORE and first.experiment == leads.EXPERIMENT  # where the first one ran
    args = leads.sweep_args(2, fresh)
    assert "--seed_base=2337" in args and f"--tracking_uri={fresh.store}" in args
    assert f"--experiment={fresh.experiment}" in args and f"--out={fresh.sweep_out}" in args
    same = [a for a in leads.sweep_args(2) if not a.startswith(("--seed_base", "--experiment", "--tracking_uri",
                                                                 "--out"))]
    assert same == [a for a in args if not a.startswith(("--seed_base", "--experiment", "--tracking_uri", "--out"))]
    assert "Fresh seeds" in leads.title(fresh) and "2337-2348, tuning on seed 2336" in leads.title(fresh)


def test_print_only_prints_the_fresh_study_and_runs_nothing(monkeypatch, capsys):
    monkeypatch.chdir(leads.REPO)
    monkeypatch.setattr(leads, "cli", lambda argv: pytest.fail(f"ran {argv}"))
    leads.main(["--seed_base", "2337", "--parallel", "2", "--print-only"])
    out = capsys.readouterr().out
    assert "python cli.py sweep" in out and "--seed_base=2337" in out
    assert "--tracking_uri=sqlite:///benchmarks/out/reproduction-leads-seed2337.db" in out
    assert "python cli.py compare --experiment=reproduction-leads-seed2337" in out


def test_the_fresh_studys_sweep_runs_and_tunes_on_seeds_the_first_did_not():
    """The sweep's own protocol, built from the preset's arguments as ``cli.py sweep`` builds it (no store read)."""
    from lit.sweep import command

    def seeds_of(where):
        a, fit_options = command.parser().parse_known_args(leads.sweep_args(2, where))
        proto, _, tuning = command.build_protocol(a, fit_options)
        return set(proto["seeds"]) | {tuning.seed}, proto["sequential"]["looks"]

    first, looks = seeds_of(leads.study())
    fresh, _ = seeds_of(leads.study(leads.FRESH_SEED_BASE))
    assert first == set(range(1336, 1349)) and fresh == set(range(2336, 2349)) and looks == list(leads.LOOKS)
