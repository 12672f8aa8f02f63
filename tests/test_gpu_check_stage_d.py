"""The GPU check's stage D (benchmarks/gpu_check/plugins.py): the verdict against each plugin's target and its
interval, the plan that sizes the pairings to the budget, Muon's AdamW half fused like the baseline's, the page's
tables; and (slow) both rows with every column for the whole registry, on a CPU.

The dry run's sample of stage D is checked in tests/test_gpu_check.py, on the fixture that runs the whole check.
"""

from __future__ import annotations

import math

import pytest
import torch

from arch_plugins import registry
from benchmarks.gpu_check import costliest_ops, plugins, ratios, report
from benchmarks.gpu_check.budget import (
    CLOSE_ROUNDS,
    FIRST_CHECK_H200,
    PLAN_LEVELS,
    ROUNDS,
    WINDOW_STEPS,
    Budget,
    PairingCosts,
    plan_pairings,
    replan,
)
from benchmarks.gpu_check.models import Shape, build_ours, fixed_batch, is_fused, project_adamw, training_step


@pytest.mark.parametrize("label, compiled, limit", [
    ("norm=ssnorm", True, 1.15), ("residual=hyperconn", True, 1.25), ("residual=mhc", True, 1.35),
    ("residual=attnres", True, 1.3), ("residual=attnres_block", True, 1.15), ("residual=mhc", False, 1.5)])
def test_each_plugin_has_the_issues_target(label, compiled, limit):
    assert ratios.target(label, compiled) == limit


def test_a_missed_target_is_flagged_and_a_met_one_is_not():
    missed = ratios.summary("residual=mhc", True, [1.52, 1.49, 1.55, 1.50, 1.51])
    assert missed["target"] == 1.35 and missed["verdict"] == "MISSED"
    met = ratios.summary("residual=mhc", True, [1.20, 1.22, 1.19, 1.21, 1.20])
    assert met["verdict"] == "met"
    # Under 1.35 by the median but the rounds spread over it: flagged as not settled.
    close = ratios.summary("residual=mhc", True, [1.10, 1.60, 1.30, 1.05, 1.45])
    assert close["verdict"] == "met (not settled)"


def test_the_interval_is_a_t_interval_of_the_log_ratios():
    rounds = [1.10, 1.20, 1.15, 1.30, 1.25]
    lo, hi = ratios.interval(rounds)
    logs = [math.log(r) for r in rounds]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1))
    half = 2.7764451051977987 * sd / math.sqrt(len(logs))  # t(0.975, 4), scipy.stats.t.isf(0.025, 4)
    assert lo == pytest.approx(math.exp(mean - half), rel=1e-9) and hi == pytest.approx(math.exp(mean + half),
                                                                                         rel=1e-9)
    assert ratios.interval([1.2]) == (0.0, math.inf)  # one round: no spread to judge


def test_the_plan_keeps_the_rules_when_time_allows_and_says_what_it_cut_when_not():
    costs = PairingCosts(eager_step_s=0.04, compiled_step_s=0.02, compile_s=5.0, build_s=1.0)
    full = costs.variant_s(WINDOW_STEPS, ROUNDS, CLOSE_ROUNDS, 2)
    plan = plan_pairings(38 * full + 1, 38, costs)
    assert (plan.steps, plan.rounds, plan.close_rounds, plan.cuts) == (WINDOW_STEPS, ROUNDS, CLOSE_ROUNDS, ())
    assert "cut: nothing" in plan.describe()
    tighter = plan_pairings(38 * full * 0.85, 38, costs)
    assert tighter.steps == WINDOW_STEPS and tighter.close_rounds == ROUNDS and tighter.cuts
    assert tighter.estimate_s <= tighter.allotted_s and "not 5" in tighter.describe()
    starved = plan_pairings(60, 38, costs)
    assert (starved.steps, starved.rounds) == PLAN_LEVELS[-1][:2] and "skipped" in starved.describe()


def test_a_replan_steps_down_when_the_variants_cost_more_and_up_when_less():
    costs = PairingCosts(eager_step_s=0.04, compiled_step_s=0.02, compile_s=5.0, build_s=1.0)
    plan = plan_pairings(20 * costs.variant_s(*PLAN_LEVELS[1][:3], 2) + 1, 20, costs)
    assert plan.close_rounds == ROUNDS  # level 1
    per_variant = costs.variant_s(plan.steps, plan.rounds, plan.close_rounds, 2)
    slower, _ = replan(plan, costs, 2 * per_variant, plan.allotted_s - 5 * 2 * per_variant, 15)
    assert (slower.steps, slower.rounds, slower.close_rounds) < (plan.steps, plan.rounds, plan.close_rounds)
    faster, _ = replan(plan, costs, 0.5 * per_variant, plan.allotted_s - 5 * 0.5 * per_variant, 15)
    assert faster.close_rounds == CLOSE_ROUNDS


def test_the_docs_estimate_is_the_plan_at_the_first_checks_figures():
    text = report.d_estimate()
    assert "under 8 minutes" in text and f"{FIRST_CHECK_H200.eager_step_s * 1e3:.1f} ms" in text
    assert "cut:" in text


def test_the_reviews_costliest_plugins_are_measured_first_and_all_exist():
    labels = list(plugins.variants(plugins.shape(True)))
    assert set(plugins.MEASURE_FIRST) <= set(labels)  # a renamed plugin would silently move to the end
    order = sorted(labels, key=plugins.first_measured)
    assert order[:3] == ["residual=mhc", "residual=attnres", "residual=hyperconn"]
    assert order[len(plugins.MEASURE_FIRST):] == [x for x in labels if x not in plugins.MEASURE_FIRST]


def test_muons_adamw_half_is_fused_like_the_baseline_and_steps_as_foreach_does():
    s = Shape(32, 2, 2, 16, 64, 2)
    x = torch.randint(0, 64, (2, 16))
    after = {}
    for fused in (False, True):
        model = build_ours(s, torch.device("cpu"))
        opt = plugins.build_optimizer(model, "muon", fused_like=fused)
        assert is_fused(opt) == fused
        assert all(bool(g.get("fused")) == fused for g in opt.param_groups if not g.get("muon", False))
        assert not any(g.get("fused") for g in opt.param_groups if g.get("muon", False))
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        opt.step()
        after[fused] = [p.detach().clone() for p in model.parameters()]
    for a, b in zip(after[False], after[True], strict=True):  # one kernel or a foreach loop: the same update
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _row(ratio: float, label: str, compiled: bool) -> dict:
    return {"status": "ran", **ratios.summary(label, compiled, [ratio] * 2 + [ratio * 1.01]), "steps_per_window": 10,
            "flops_ratio": 1.0, "peak_allocated_gib": 3.0, "memory_ratio": 1.2, "host_issue_s": 0.01,
            "device_step_s": 0.03, "host_bound": False, "first_step_s": 4.0, "graphs": 1, "graph_breaks": 0}


def test_the_page_prints_each_target_and_flags_what_missed():
    d = {"shape": {}, "plan": {"text": "the plan"}, "baseline": {},
         "compiled": {"residual=mhc": _row(1.5, "residual=mhc", True), "norm=un": _row(1.05, "norm=un", True)},
         "eager": {"residual=mhc": _row(1.4, "residual=mhc", False), "norm=un": _row(1.6, "norm=un", False)}}
    text = "\n".join(report._plugins(d))
    assert "| residual=mhc | ran | 1.500 |" in text and "| 1.35 | **MISSED** |" in text
    assert "| norm=un | ran | 1.050 |" in text and "| 1.15 | met |" in text
    assert "Targets missed, compiled: residual=mhc" in text and "Targets missed, eager: norm=un" in text


def test_a_missed_target_names_the_kernels_the_variant_spends_more_on():
    variant = {"triton_fused_sinkhorn": 3.0, "mm": 5.0, "softmax": 0.5}
    baseline = {"mm": 4.0, "softmax": 0.6}
    assert costliest_ops.extra(variant, baseline) == [["triton_fused_sinkhorn", 3.0], ["mm", 1.0]]
    d = {"shape": {}, "plan": {"text": "the plan"}, "baseline": {}, "eager": {},
         "compiled": {"residual=mhc": dict(_row(1.5, "residual=mhc", True),
                                           costliest_extra_ops=[["triton_fused_sinkhorn", 3.0]])}}
    assert "- residual=mhc: `triton_fused_sinkhorn` +3.00 ms" in "\n".join(report._plugins(d))


def test_a_profiled_step_gives_its_time_per_op():
    s = Shape(32, 2, 2, 16, 64, 2)
    model = build_ours(s, torch.device("cpu"))
    x, y = fixed_batch(s, torch.device("cpu"))
    step = training_step(model, model, project_adamw(model), x, y, torch.device("cpu"))
    ms = costliest_ops.ms_per_op(step, torch.device("cpu"))
    assert ms["aten::mm"] > 0 and all(v > 0 for v in ms.values())


def test_the_first_stage_d_is_rendered_as_measured_and_says_with_what():
    old = {"shape": {}, "baseline": {"step_s": 0.0397}, "eager": {"norm=un": {"status": "ran", "step_ratio": 2.171,
                                                                               "ratio_min": 2.1, "ratio_max": 2.4,
                                                                               "rounds": 3}}}
    text = "\n".join(report._plugins(old))
    assert text.startswith(report.OLD_STAGE_D) and "| norm=un | ran | 2.171 | 2.100-2.400 | 3 |" in text


@pytest.mark.slow
def test_every_registered_plugin_gets_both_rows_and_every_column(monkeypatch):
    """The whole registry through stage D on a CPU (the dry shape, dynamo only): 15 minutes on 2 busy cores."""
    from types import SimpleNamespace

    monkeypatch.setattr(plugins, "EVERY_VARIANT_IN_DRY", True)
    ctx = SimpleNamespace(device=torch.device("cpu"), dry=True, save=lambda: None)
    clock = Budget(3600, {"D": 1}).open("D")
    out: dict = {}
    plugins.run(ctx, clock, out)
    expected = {f"{kind}={name}" for kind in registry.kinds() for name in registry.names(kind)}
    expected -= {f"{kind}={name}" for kind, name in plugins.BASELINE.items()}
    expected |= set(plugins.OPTIONS) | {"recipe=gpt_ngpt"}
    for mode in ("eager", "compiled"):
        assert set(out[mode]) == expected
        for label, row in out[mode].items():
            assert row["status"] == "ran", (mode, label, row)
            assert set(plugins.COLUMNS) <= set(row), (mode, label, sorted(set(plugins.COLUMNS) - set(row)))
            assert row["step_ratio"] > 0 and row["flops_ratio"] > 0 and row["rounds"] >= 2
    assert out["compiled"]["projection=pattention"]["flops_ratio"] > 1.0  # its key tokens cost FLOPs


@pytest.mark.slow
def test_a_budget_too_short_for_the_registry_cuts_says_so_and_skips_the_rest(monkeypatch):
    """Stage D as a GPU runs it (the plan's real levels, the re-plan), at the dry shape on a CPU with 90 s: ~2
    minutes on 2 cores."""
    from types import SimpleNamespace

    from benchmarks.gpu_check import measure

    monkeypatch.setattr(plugins, "shape", lambda dry: Shape(48, 2, 3, 16, 64, 2))
    ctx = SimpleNamespace(device=torch.device("cpu"), dry=False, save=lambda: None)
    clock = Budget(90, {"D": 1}).open("D")
    out: dict = {}
    with measure.compile_backend("eager"):
        plugins.run(ctx, clock, out)
    assert out["plan"]["cuts"] and "skipped" in out["plan"]["text"]
    statuses = [row["status"] for mode in ("eager", "compiled") for row in out[mode].values()]
    assert "ran" in statuses and "skipped: budget" in statuses
    assert set(statuses) <= {"ran", "skipped: budget"}
    ran = [label for label, row in out["compiled"].items() if row["status"] == "ran"]
    assert set(ran) == set(plugins.MEASURE_FIRST[:len(ran)])  # the review's costliest first
    assert clock.left() > -60  # a variant started in time may finish late, but none starts past the deadline
