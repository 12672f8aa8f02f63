"""Scaling ladders: the law fit and the multiplier (noise-free identities), the interval's calibration by
simulation, ``sweep --ladder``'s plan and tags, and ``compare --scaling`` on a ladder logged to MLflow."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from lit.compare.scaling import (
    Ladder,
    TrueLaw,
    calibrate,
    fit_laws,
    holdout_check,
    holdout_error,
    multipliers,
)
from lit.errors import UserInputError
from lit.sweep import protocol

REPO = Path(__file__).resolve().parents[1]

LAW = TrueLaw()
RUNGS = np.asarray(LAW.rungs)


def law_ladder(multiplier=1.25, alpha_variant=None, seeds=3, noise=0.0, rng=None):
    """A baseline on ``LAW`` and a variant worth ``multiplier`` times its compute (or with its own exponent)."""
    base = LAW.E + LAW.A * RUNGS ** -LAW.alpha
    alpha = LAW.alpha if alpha_variant is None else alpha_variant
    # With its own exponent, the variant is worth ``multiplier`` at the middle rung and more (or less) beyond.
    middle = RUNGS[len(RUNGS) // 2]
    variant = LAW.E + LAW.A * (multiplier * middle) ** -LAW.alpha * (RUNGS / middle) ** -alpha
    loss = np.stack([base, variant])[:, :, None] + np.zeros(seeds)
    if noise:
        loss = loss + noise * rng.standard_normal(loss.shape)
    return Ladder(("baseline", "variant"), np.stack([RUNGS, RUNGS]), loss)


# --- the fit and the multiplier, noise-free -----------------------------------------------------------------------

def test_noise_free_fit_recovers_E_A_and_alpha():
    ladder = law_ladder(multiplier=1.25)
    laws = fit_laws(np.log(ladder.compute), ladder.loss.mean(-1), common_alpha=True)
    assert float(laws.E) == pytest.approx(LAW.E, abs=2e-4)
    assert laws.alpha[0] == pytest.approx(LAW.alpha, rel=2e-3)
    assert laws.A[0] == pytest.approx(LAW.A, rel=2e-2)
    assert laws.A[1] == pytest.approx(LAW.A * 1.25 ** -LAW.alpha, rel=2e-2)
    pinned = fit_laws(np.log(ladder.compute), ladder.loss.mean(-1), pinned_E=LAW.E)
    assert pinned.alpha == pytest.approx([LAW.alpha] * 2, rel=1e-9)
    assert pinned.A[0] == pytest.approx(LAW.A, rel=1e-9)


def test_noise_free_multiplier_is_exactly_the_injected_one():
    m = multipliers(law_ladder(multiplier=1.25), resamples=200)[0]
    assert m.at_target == pytest.approx(1.25, rel=1e-3)
    assert m.target_interval[0] == pytest.approx(1.25, rel=1e-3) and m.target_interval[1] == pytest.approx(1.25,
                                                                                                            rel=1e-3)
    inside = ~m.extrapolated
    assert inside.sum() >= 3  # read off the baseline's runs, not its law
    # Between rungs the baseline's observed curve is interpolated in a power law's own shape: exact too.
    np.testing.assert_allclose(m.per_rung, 1.25, rtol=1e-4)
    assert abs(m.trend) < 5e-3 and not m.depends_on_scale


def test_target_multiplier_uses_the_shared_exponent_when_exponents_agree():
    ladder = law_ladder(multiplier=1.25, noise=LAW.noise_sd, rng=np.random.default_rng(11))
    m = multipliers(ladder, resamples=300)[0]
    assert not m.depends_on_scale
    laws = fit_laws(np.log(ladder.compute), ladder.loss.mean(-1), common_alpha=True)
    # Same exponent: the baseline needs (A_b / A_v)^(1/alpha) times the compute, at any target.
    assert m.at_target == pytest.approx((laws.A[0] / laws.A[1]) ** (1 / laws.alpha[0]), rel=1e-9)


def test_trend_flag_fires_when_the_exponents_differ():
    rng = np.random.default_rng(0)
    flagged = [multipliers(law_ladder(multiplier=1.0, alpha_variant=0.24, noise=LAW.noise_sd / 4, rng=rng),
                           resamples=300, seed=i)[0] for i in range(5)]
    assert all(m.depends_on_scale and m.trend > 0 for m in flagged)
    # The gain grows with compute: 2^(0.24 / 0.2 - 1) = 1.149 per doubling, 1 at the middle rung.
    truth = (RUNGS / RUNGS[2]) ** (0.24 / 0.2 - 1)
    assert all(np.allclose(m.per_rung, truth, rtol=0.1) for m in flagged)
    exact = multipliers(law_ladder(multiplier=1.0, alpha_variant=0.24), resamples=200)[0]
    np.testing.assert_allclose(exact.per_rung, truth, rtol=1e-4)
    assert exact.at_target == pytest.approx(truth[-1], rel=1e-4)
    assert exact.trend == pytest.approx(0.24 / 0.2 - 1, rel=1e-4)


def test_holdout_error_is_zero_on_noise_free_data():
    err = holdout_error(law_ladder(multiplier=1.25))
    np.testing.assert_allclose(err, 0.0, atol=2e-3)


# --- calibration by simulation ------------------------------------------------------------------------------------

LADDERS, RESAMPLES = 200, 200


def test_null_interval_covers_one():
    c = calibrate(1.0, seeds=3, ladders=LADDERS, resamples=RESAMPLES, seed=1)
    assert c.coverage >= 0.90
    assert c.flagged <= 0.10


def test_injected_multiplier_recovered_with_small_bias_and_calibrated_coverage():
    c = calibrate(1.25, seeds=3, ladders=LADDERS, resamples=RESAMPLES, seed=2)
    assert abs(c.relative_bias) <= 0.05
    assert 0.90 <= c.coverage <= 0.98


def test_handicapped_variant_gives_a_multiplier_below_one():
    c = calibrate(0.8, seeds=3, ladders=LADDERS, resamples=RESAMPLES, seed=3)
    assert c.median_estimate < 1 and c.below_one >= 0.95
    assert 0.90 <= c.coverage <= 0.98


def test_simulated_noise_is_drawn_from_a_real_ladder():
    rng = np.random.default_rng(4)
    ladder = law_ladder(multiplier=1.25, seeds=5, noise=0.02, rng=rng)
    law = TrueLaw.from_ladder(ladder)
    assert law.noise_sd == pytest.approx(0.02, rel=0.35)
    assert law.rungs == tuple(RUNGS)
    assert law.alpha > 0 and law.E < ladder.loss.min()


# --- sweep --ladder ---------------------------------------------------------------------------------------------

# --- failures: a diverged seed is never averaged away (review D8) -------------------------------------------------

def failed_ladder(survivor_shift=0.0):
    """A baseline, a variant ``v`` whose seed 2 diverged at rung 3 (its two survivors shifted by
    ``survivor_shift``), and a variant ``w`` worth 1.25x, with seed noise."""
    rng = np.random.default_rng(3)
    mean = np.stack([LAW.E + LAW.A * (m * RUNGS) ** -LAW.alpha for m in (1.0, 1.0, 1.25)])
    loss = mean[:, :, None] + 0.0076 * rng.standard_normal((3, len(RUNGS), 3))
    loss[1, 3, 2] = np.nan
    loss[1, 3, :2] += survivor_shift
    diverged = np.zeros((3, len(RUNGS)), dtype=int)
    diverged[1, 3] = 1
    return Ladder(("baseline", "v", "w"), np.stack([RUNGS] * 3), loss, diverged)


def test_a_diverged_seed_makes_its_rung_a_failure_with_an_upper_bound():
    lucky = failed_ladder(survivor_shift=-0.03)  # the survivors are the lucky seeds: their mean flatters v
    v, w = multipliers(lucky, resamples=300)
    assert not v.estimable and w.estimable
    assert np.isnan(v.per_rung[3]) and np.isnan(v.at_target) and np.isnan(v.trend) and not v.depends_on_scale
    assert list(v.failed) == [False, False, False, True, False] and np.isnan(v.upper_bound[[0, 1, 2, 4]]).all()
    # The bound is what averaging the survivors would have claimed, above the truth (1) by the lucky shift.
    assert v.upper_bound[3] > 1.1
    assert np.isfinite(v.per_rung[[0, 1, 2, 4]]).all()  # its finished rungs are still read


def test_a_failed_cells_survivors_feed_no_fit():
    """Whatever the survivors of a failed cell say, no other number moves: they are in no mean and no fit."""
    a, b = multipliers(failed_ladder(-0.05), resamples=300), multipliers(failed_ladder(+0.05), resamples=300)
    assert a[1].at_target == b[1].at_target and np.array_equal(a[1].per_rung, b[1].per_rung)
    assert np.array_equal(a[0].per_rung, b[0].per_rung, equal_nan=True)
    assert a[0].upper_bound[3] > b[0].upper_bound[3]  # only the bound reads them
    errors = [holdout_check(failed_ladder(shift), resamples=200)[0] for shift in (-0.05, 0.05)]
    assert np.array_equal(errors[0], errors[1])


def test_a_failed_baseline_is_refused():
    ladder = failed_ladder()
    diverged = np.zeros_like(ladder.diverged)
    diverged[0, 2] = 1
    with pytest.raises(ValueError, match="baseline 'baseline' diverged at rung"):
        multipliers(Ladder(ladder.variants, ladder.compute, ladder.loss, diverged), resamples=100)


def sweep_args(*extra):
    from lit.sweep.command import parser

    return parser().parse_known_args(["--config", "recipes/gpt_baseline.yaml", "--variant",
                                      "config=recipes/gpt_perinorm.yaml", "--seeds", "2", *extra])


def fake_measure(args_by_rung):
    """Sizes from the d_model each rung sets, as if counted: parameters 12 d^2, 6 x that FLOPs per token."""
    sizes = []
    for args in args_by_rung:
        d = int(next(a for a in args if "d_model=" in a).split("=")[1])
        sizes.append((12 * d * d, 6.0 * 12 * d * d, 4096))
    return sizes


LADDER = "d_model=32,n_heads=2;d_model=48,n_heads=2;d_model=64,n_heads=2,tokens=3e6"


def plan_ladder(*extra):
    """The protocol (with the ladder in it) and the children ``cli.py sweep`` would run, sized by ``fake_measure``."""
    from lit.sweep import ladder
    from lit.sweep.command import build_protocol
    from lit.sweep.grid import build_children

    a, fit = sweep_args(*extra)
    proto, variants, tuning = build_protocol(a, fit, measure_fn=fake_measure)
    proto["sweep_id"] = "s"
    return proto, ladder.expand(build_children(variants, proto["seeds"], tuning), proto.get("ladder")), fit


def test_ladder_plan_sizes_rungs_and_expands_children():
    proto, children, _ = plan_ladder("--ladder", LADDER, "--tokens_per_param", "20", "--ladder_lr_check", "baseline")
    rungs = proto["ladder"]["rungs"]
    assert [r["parameters"] for r in rungs] == [12 * 32 ** 2, 12 * 48 ** 2, 12 * 64 ** 2]
    # 20 tokens per parameter in whole logging intervals (the recipe logs every 10 steps); the last rung's own budget
    assert rungs[0]["steps"] == 10 * -(-20 * 12 * 32 ** 2 // (4096 * 10))
    assert rungs[2]["steps"] == 10 * -(-3_000_000 // (4096 * 10))
    assert rungs[0]["overrides"]["model.init_args.arch.d_model"] == "32"
    assert rungs[0]["overrides"]["trainer.val_check_interval"] == str(rungs[0]["steps"])
    assert rungs[0]["overrides"]["model.init_args.warmup_steps"] == str(round(0.1 * rungs[0]["steps"]))
    assert "not transferred" in proto["ladder"]["lr_rule"]
    seeds = [c for c in children if c.phase == "seed"]
    checks = [c for c in children if c.phase == "lr_check"]
    assert len(seeds) == 3 * 2 * 2 and len({c.key for c in children}) == len(children)
    assert {c.rung for c in seeds} == {0, 1, 2}
    assert len(checks) == 3 * 2 and {c.variant for c in checks} == {"recipe"}  # the baseline only
    assert sorted(float(c.overrides["model.init_args.lr"]) for c in checks if c.rung == 0) == [1.5e-3, 6e-3]


def test_ladder_child_runs_carry_rung_tags():
    from lit.sweep.child import fit_args

    proto, children, fit = plan_ladder("--ladder", LADDER, "--tokens_per_param", "20")
    manifest = {"protocol": proto, "parent_run_id": "p", "recipe": proto["recipe"], "fit_args": fit,
                "experiment": "e", "tracking_uri": "sqlite:///x.db", "save_dir": "runs"}
    child = next(c for c in children if c.rung == 1 and c.phase == "seed")
    args = fit_args(manifest, child, None)
    tags = json.loads(next(x for x in args if x.startswith("--trainer.logger.init_args.tags=")).split("=", 1)[1])
    assert tags[protocol.RUNG] == "1" and tags[protocol.RUNG_SIZE] == "d_model=48,n_heads=2"
    assert float(tags[protocol.RUNG_COMPUTE]) == pytest.approx(proto["ladder"]["rungs"][1]["compute"], rel=1e-5)
    assert "--model.init_args.arch.d_model=48" in args
    assert f"--trainer.max_steps={proto['ladder']['rungs'][1]['steps']}" in args


@pytest.mark.parametrize("extra, message", [
    (("--ladder", "d_model=32;d_model=64"), "at least 3"),
    (("--ladder", LADDER), "no token budget"),
    (("--ladder", LADDER, "--tokens_per_param", "20", "--ladder_lr", "transfer"), "needs a parametrization"),
    (("--ladder", LADDER, "--tokens_per_param", "20", "--ladder_lr", "transfer", "--model.arch.parametrization=sp"),
     "needs a parametrization"),
    (("--tokens_per_param", "20"), "only with --ladder"),
    (("--ladder", "d_model=64,n_heads=2;d_model=48,n_heads=2;d_model=32,n_heads=2", "--tokens_per_param", "20"),
     "grow in compute"),
    (("--ladder", LADDER, "--tokens_per_param", "20", "--tune", "model.init_args.lr=1e-3,3e-3"), "--tune with"),
])
def test_ladder_mistakes_are_one_line_errors(extra, message):
    with pytest.raises(UserInputError, match=message):
        plan_ladder(*extra)


def test_ladder_lr_transfer_is_accepted_with_a_parametrization():
    proto, _, _ = plan_ladder("--ladder", LADDER, "--tokens_per_param", "20", "--ladder_lr", "transfer",
                              "--model.arch.parametrization=mup",
                              "--model.arch.parametrization_options={base_width: 128, base_heads: 4}")
    assert proto["ladder"]["lr"] == "transfer" and "transferred to each rung by the mup" in proto["ladder"]["lr_rule"]
    assert "base width 128" in proto["ladder"]["lr_rule"]


@pytest.mark.parametrize("options, message", [
    ((), "no base width"),  # m_d = 1 at every rung: one fixed lr under what is SP (review D4)
    (("--model.arch.parametrization_options={base_heads: 4}",), "no base width"),
    (("--model.arch.parametrization_options={base_width: 64, base_heads: 2}",), "d_model 128 is not its base width 64"),
])
def test_ladder_lr_transfer_refuses_a_recipe_without_its_base_shape(options, message):
    with pytest.raises(UserInputError, match=message):
        plan_ladder("--ladder", LADDER, "--tokens_per_param", "20", "--ladder_lr", "transfer",
                    "--model.arch.parametrization=completep", *options)


def test_ladder_lr_transfer_refusal_is_one_error_line_before_any_run(tmp_path, monkeypatch, capsys):
    from lit.sweep import ladder
    from lit.sweep.command import main

    def no_runs(*args):
        raise AssertionError("the ladder was sized (its runs would follow) before the refusal")

    monkeypatch.setattr(ladder, "in_fork", no_runs)
    monkeypatch.chdir(tmp_path)
    code = main(["--config", str(REPO / "recipes/gpt_baseline.yaml"), "--seeds", "1", "--ladder", LADDER,
                 "--tokens_per_param", "20", "--ladder_lr", "transfer", "--model.arch.parametrization=mup",
                 "--tracking_uri", f"sqlite:///{tmp_path}/m.db"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "no base width" in err[0]
    assert not (tmp_path / "m.db").exists() and not list(tmp_path.iterdir())


def test_ladder_file_syntax(tmp_path):
    from lit.sweep.ladder import parse_ladder

    path = tmp_path / "rungs.yaml"
    path.write_text("- {d_model: 32, n_layers: 2}\n- {d_model: 48, n_layers: 2}\n- {d_model: 64, tokens: 1e6}\n")
    rungs = parse_ladder(str(path))
    assert [r.overrides for r in rungs][0] == {"model.init_args.arch.d_model": "32",
                                               "model.init_args.arch.n_layers": "2"}
    assert rungs[2].tokens == 1e6 and rungs[0].tokens is None


# --- compare --scaling on a ladder in MLflow ------------------------------------------------------------------------

SEEDS = 3
VARIANTS = {"base": 1.0, "better": 1.25, "worse": 0.8}
TOKENS_PER_S = {"base": 1000.0, "better": 900.0, "worse": 1000.0}


def log_ladder(client, experiment_id, sweep_id, rungs, rng, ladder=True, children=True, diverge=()):
    """A ladder sweep in MLflow; ``diverge``: (variant, rung, seed) runs that diverge (FAILED, no final loss)."""
    from mlflow.entities import Metric

    spec = {"sweep_id": sweep_id, "variants": [{"label": v, "overrides": {}} for v in VARIANTS],
            "baseline": "base", "seeds": list(range(SEEDS)), "metric": "val/loss", "mode": "min"}
    if ladder:
        spec["ladder"] = {"rungs": [{"index": i, "label": f"d_model={16 * (i + 1)}", "overrides": {},
                                     "parameters": 1000 * (i + 1), "flops_per_token": 6000.0 * (i + 1),
                                     "tokens": int(c / (6000.0 * (i + 1))), "steps": 100, "compute": c}
                                    for i, c in enumerate(rungs)],
                          "tokens_per_param": 20, "lr": "fixed", "lr_rule": "the recipe's learning rate",
                          "lr_check": ["base"], "warmup_fraction": 0.1, "variant_lr": {v: 3e-3 for v in VARIANTS}}
    parent = client.create_run(experiment_id, tags={protocol.ROLE: "parent", protocol.SWEEP_ID: sweep_id})
    parent_id = parent.info.run_id
    client.log_text(parent_id, json.dumps(spec), protocol.PROTOCOL_FILE)
    client.set_terminated(parent_id)
    if not children:  # refused on its protocol alone
        return parent_id
    shared = rng.standard_normal(SEEDS)
    for r, compute in enumerate(rungs):
        per_token = 6000.0 * (r + 1)
        for variant, m in VARIANTS.items():
            for s in range(SEEDS):
                loss = LAW.E + LAW.A * (m * compute) ** -LAW.alpha + 0.004 * (shared[s] + rng.standard_normal())
                tags = {protocol.ROLE: "child", protocol.SWEEP_ID: sweep_id, protocol.VARIANT: variant,
                        protocol.SEED: str(s), protocol.SEED_INDEX: str(s), protocol.PHASE: "seed",
                        protocol.FINAL: "true", protocol.PARENT_RUN: parent_id, protocol.RUNG: str(r)}
                if (variant, r, s) in diverge:
                    tags[protocol.OUTCOME] = protocol.DIVERGED_OUTCOME
                run = client.create_run(experiment_id, tags=tags)
                client.log_batch(run.info.run_id, metrics=[
                    Metric("train/flops", compute / (3 if (variant, r, s) in diverge else 1), 0, 100),
                    Metric("model/flops_per_token", per_token, 0, 0),
                    Metric("train/tokens_per_s", TOKENS_PER_S[variant], 0, 50)]
                    + ([] if (variant, r, s) in diverge else [Metric("val/loss", loss, 0, 100)]))
                client.set_terminated(run.info.run_id, "FAILED" if (variant, r, s) in diverge else "FINISHED")
        for lr, bump in ((1.5e-3, 0.02), (6e-3, -0.01)) if not diverge else ():  # 2 lr is better: an edge
            tags = {protocol.ROLE: "child", protocol.VARIANT: "base", protocol.SEED: "0", protocol.SEED_INDEX: "0",
                    protocol.PHASE: "lr_check", protocol.PARENT_RUN: parent_id, protocol.RUNG: str(r),
                    protocol.LR_CHECK_VALUE: repr(lr)}
            run = client.create_run(experiment_id, tags=tags)
            base = LAW.E + LAW.A * compute ** -LAW.alpha
            client.log_batch(run.info.run_id, metrics=[Metric("val/loss", base + bump, 0, 100)])
            client.set_terminated(run.info.run_id)
    return parent_id


@pytest.fixture(scope="module")
def ladder_store(tmp_path_factory, empty_store):
    import shutil

    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("ladder")
    shutil.copyfile(empty_store, root / "mlflow.db")  # an initialised store: no schema migrations to run
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    rng = np.random.default_rng(7)
    ids = {}
    diverge = {"diverged": (("better", 3, 1),), "baseline_diverged": (("base", 1, 0), ("better", 2, 2))}
    for name, rungs, ladder in (("ladder", LAW.rungs[:4], True), ("short", LAW.rungs[:2], True),
                                ("flat", LAW.rungs[:4], False), ("diverged", LAW.rungs[:4], True),
                                ("baseline_diverged", LAW.rungs[:3], True)):
        exp = client.create_experiment(name, artifact_location=str(root / f"artifacts-{name}"))
        ids[name] = log_ladder(client, exp, f"sweep-{name}", rungs, rng, ladder,
                               children=name not in ("short", "flat"), diverge=diverge.get(name, ()))
    return {"uri": uri, "ids": ids}


def table_after(markdown: str, marker: str) -> dict[str, list[str]]:
    """The first Markdown table at or after the line containing ``marker``: {first cell: cells}."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    rows = {}
    for line in lines[start:]:
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows.setdefault(cells[0], cells)
        elif rows and not line.startswith("|"):
            break
    return rows


def interval(cell: str) -> tuple[float, float, float]:
    value, lo, hi = re.findall(r"([\d.]+) \[([\d.]+), ([\d.]+)\]", cell)[0]
    return float(value), float(lo), float(hi)


def run_scaling(store, tmp_path, monkeypatch, capsys, *args):
    from lit.compare.command import main

    monkeypatch.chdir(tmp_path)
    code = main(["--scaling", "--tracking_uri", store["uri"], "--resamples", "300", "--calibration_ladders", "20",
                 *args])
    captured = capsys.readouterr()
    return code, captured.out, [line for line in captured.err.splitlines() if line.strip()]


def test_compare_scaling_reports_multipliers_intervals_and_figures(ladder_store, tmp_path, monkeypatch, capsys):
    code, out, err = run_scaling(ladder_store, tmp_path, monkeypatch, capsys, "--experiment", "ladder",
                                 "--out", "rep")
    assert code == 0, err
    at_target = table_after(out, "At the target compute")
    m, lo, hi = interval(at_target["better"][1])
    assert lo < 1.25 < hi and m == pytest.approx(1.25, rel=0.1)
    assert float(at_target["better"][2]) == pytest.approx(0.9, rel=1e-6)  # FLOP/s: tokens/s x FLOPs per token
    wall = interval(at_target["better"][3])
    assert wall == pytest.approx((m * 0.9, lo * 0.9, hi * 0.9), rel=2e-3)
    assert interval(at_target["worse"][1])[2] < 1  # the handicapped variant's interval excludes 1
    per_rung = table_after(out, "| variant | rung 0")
    assert len(per_rung["better"]) == 5 and all(interval(c)[1] < interval(c)[0] < interval(c)[2]
                                                 for c in per_rung["better"][1:])
    assert "Hold-out" in out and "inside" in out
    assert "**edge**" in out  # 2 lr was better at every rung
    assert "E = " in out and "fitted, shared" in out
    assert (tmp_path / "rep" / "report.md").is_file()
    for name in ("scaling_loss.png", "scaling_multiplier.png"):
        assert (tmp_path / "rep" / name).stat().st_size > 10_000


def test_compare_scaling_counts_a_diverged_run_as_a_failure_of_its_variant(ladder_store, tmp_path, monkeypatch,
                                                                            capsys):
    code, out, err = run_scaling(ladder_store, tmp_path, monkeypatch, capsys, "--experiment", "diverged",
                                 "--calibration_ladders", "0")
    assert code == 0, err
    checks = out[out.index("## Checks"):out.index("## Multipliers per rung")]
    assert "**better diverged** at rung 3 (1 of 3 seeds)" in checks and "worse diverged" not in checks
    per_rung = table_after(out, "| variant | rung 0")
    assert per_rung["better"][4].startswith("<= ") and "(diverged 1/3)" in per_rung["better"][4]
    assert all(interval(c) for c in per_rung["better"][1:4] + per_rung["worse"][1:])  # the rest are read
    at_target = table_after(out, "At the target compute")
    assert at_target["better"][1] == "not estimable (diverged at rung 3)" and at_target["better"][4] == "n/a"
    assert interval(at_target["worse"][1])
    assert "n/a (diverged at the largest rung)" in table_after(out, "| variant | A |")["better"][3]


def test_compare_scaling_refuses_a_diverged_baseline_in_one_line(ladder_store, tmp_path, monkeypatch, capsys):
    code, out, err = run_scaling(ladder_store, tmp_path, monkeypatch, capsys, "--experiment", "baseline_diverged")
    assert code == 2 and len(err) == 1 and err[0].startswith("error:"), err
    assert "baseline 'base' diverged at rung 1 (1 of 3 seeds)" in err[0] and "pass --baseline worse" in err[0]


def test_compare_scaling_pinned_irreducible_is_stated(ladder_store, tmp_path, monkeypatch, capsys):
    code, out, err = run_scaling(ladder_store, tmp_path, monkeypatch, capsys, "--experiment", "ladder",
                                 "--irreducible", str(LAW.E), "--calibration_ladders", "0")
    assert code == 0, err
    assert f"pinned by --irreducible at {LAW.E:g}" in out


@pytest.mark.parametrize("args, message", [
    (("--experiment", "flat"), "not a ladder sweep"),
    (("--experiment", "short"), "at least 3"),
    (("--experiment", "ladder", "--target_compute", "1e20"), "more than 10x"),
    (("--experiment", "ladder", "--irreducible", "5"), "not below every mean loss"),
])
def test_compare_scaling_errors(ladder_store, tmp_path, monkeypatch, capsys, args, message):
    code, out, err = run_scaling(ladder_store, tmp_path, monkeypatch, capsys, *args)
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and message in err[0], err


def test_scaling_options_need_scaling(ladder_store, tmp_path, monkeypatch, capsys):
    from lit.compare.command import main

    monkeypatch.chdir(tmp_path)
    code = main(["--experiment", "ladder", "--irreducible", "1.0", "--tracking_uri", ladder_store["uri"]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: --irreducible is read only with --scaling")


def test_ladder_namespace_defaults_are_off():
    from lit.sweep.ladder import plan

    a = SimpleNamespace(ladder=None, tokens_per_param=None, ladder_lr="fixed", ladder_lr_check=None,
                        ladder_warmup=0.1, tune=None)
    assert plan(a, [], "recipes/gpt_baseline.yaml", [], None) is None


# --- the report's own checks (review D5) ----------------------------------------------------------------------------

def fake_sweep(ladder, checked=(), edge_at=()):
    """A LadderSweep around ``ladder`` as load_ladder returns it; ``checked`` variants ran the lr check at every
    rung, 2 lr winning at the rungs in ``edge_at``."""
    import pandas as pd

    from lit.compare.ladder_runs import RUN_COLUMNS, LadderSweep

    V, R, _ = ladder.loss.shape
    rungs = [{"index": r, "label": f"d_model={16 * (r + 1)}", "parameters": 1000 * (r + 1), "tokens": 10 ** 6,
              "steps": 100, "compute": float(ladder.compute[0, r])} for r in range(R)]
    spec = {"sweep_id": "fake", "ladder": {"rungs": rungs, "lr_rule": "the recipe's learning rate",
                                           "lr_check": list(checked), "variant_lr": {v: 1e-3 for v in ladder.variants}}}
    checks = [(v, r, lr, 2.0 + (0.1 if (lr == 5e-4 or (lr == 2e-3 and r not in edge_at)) else -0.1 * (lr == 2e-3)))
              for v in checked for r in range(R) for lr in (5e-4, 1e-3, 2e-3)]
    lr_check = pd.DataFrame(checks, columns=["variant", "rung", "lr", "loss"])
    return LadderSweep("fake", spec, "val/loss", ladder, pd.DataFrame([], columns=list(RUN_COLUMNS)),
                       np.ones((V, R)), lr_check)


def test_e_position_names_the_bound_it_sits_at():
    from lit.compare.scaling_report import e_position

    assert "sits at its lower bound 0: the fit is not identified" in e_position(0.0, 1.8, pinned=False)
    assert "sits at its upper bound, the lowest mean loss 1.8000" in e_position(1.7999, 1.8, pinned=False)
    assert "lies inside its bounds [0, 1.8000)" in e_position(1.2, 1.8, pinned=False)
    assert "pinned at 1.2" in e_position(1.2, 1.8, pinned=True)


@pytest.mark.parametrize("errors, fails, says", [
    ((0.02, 0.03, 0.01, 0.05, 0.04), True, "all 5 hold-out errors positive"),  # inside, but a shared bias
    ((-0.02, -0.01, -0.03), False, "with 3 variants this may be chance"),
    ((0.02, -0.01, 0.03, -0.02), False, "both signs (2 positive, 2 negative)"),
    ((0.02, -0.09, 0.03, -0.02), True, "1 of 4 outside its seed interval (v1)"),
])
def test_holdout_sign_pattern(errors, fails, says):
    from lit.compare.scaling_report import holdout_pattern

    errors = np.asarray(errors)
    failed, sentence = holdout_pattern(errors, np.full_like(errors, 0.06), tuple(f"v{i}" for i in range(len(errors))))
    assert failed is fails and says in sentence
    assert ("the law is misspecified" in sentence) is (len(errors) >= 4 and len(set(np.sign(errors))) == 1)


def test_lr_checks_name_the_unchecked_variants_and_the_edges():
    from lit.compare.scaling_report import lr_checks

    ladder = law_ladder()
    lines = lr_checks(fake_sweep(ladder))
    assert len(lines) == 1 and lines[0].startswith("No variant's learning rate was checked")
    lines = lr_checks(fake_sweep(ladder, checked=("baseline",), edge_at=(0, 4)))
    assert "**not checked: variant**" in lines[0]
    assert "at its grid's **edge** at rung(s) 0 (2 lr better), 4 (2 lr better)" in lines[1]
    lines = lr_checks(fake_sweep(ladder, checked=("baseline", "variant")))
    assert lines[0] == "Every variant's learning rate was checked."
    assert all("at the centre of its check at every checked rung" in line for line in lines[1:])


def report_of(ladder):
    from lit.compare.scaling_report import analyze_scaling, render_scaling

    return render_scaling(analyze_scaling(fake_sweep(ladder, checked=("baseline",)), None, None, 0.95,
                                          resamples=300, calibration_ladders=0), [])


def test_a_law_that_fails_its_hold_out_is_a_local_description_and_the_per_rung_multipliers_lead():
    """One rule: the report's order and words follow the hold-out."""
    held = law_ladder(noise=0.0076, rng=np.random.default_rng(0))  # its hold-out passes
    out = report_of(held)
    assert "The law passes its hold-out" in out and "local description" not in out
    assert out.index("## Fitted laws") < out.index("## Multipliers per rung") < out.index("## Multiplier at the target")
    # The same ladder, its largest rung 0.05 above the law for both: every error negative and outside.
    bent = Ladder(held.variants, held.compute, held.loss + np.array([0, 0, 0, 0, 0.05])[None, :, None])
    out = report_of(bent)
    assert "**The law fails its hold-out: it is a local description of this range" in out
    assert out.index("## Multipliers per rung") < out.index("## Fitted laws (a local description)") \
        < out.index("## Multiplier at the target compute (conditional on the law)")
    assert "2 of 2 outside its seed interval" in out


# --- a real tiny ladder, end to end (slow: 14 short fits) ----------------------------------------------------------

@pytest.mark.slow
def test_a_real_ladder_sweep_reports_its_multipliers(tmp_path):
    import subprocess
    import sys

    from mlflow import MlflowClient

    from tests.conftest import REPO, subprocess_env

    tiny = ["--data.block_size=16", "--data.batch_size=4", "--trainer.limit_val_batches=2",
            "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=5"]
    rungs = "d_model=16,n_layers=1,n_heads=2,tokens=640;d_model=24,n_layers=1,n_heads=2,tokens=1280;" \
            "d_model=32,n_layers=1,n_heads=2,tokens=2560"
    out = subprocess.run([sys.executable, str(REPO / "cli.py"), "sweep", "--config",
                          str(REPO / "recipes" / "gpt_baseline.yaml"), "--variant", "model.arch.norm=layernorm",
                          "--ladder", rungs, "--ladder_lr_check", "baseline", "--seeds", "2", "--parallel", "2",
                          "--experiment", "ladder", *tiny], cwd=tmp_path, capture_output=True, text=True,
                         env=subprocess_env(), timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ladder").experiment_id], max_results=100)
    children = [r for r in runs if r.data.tags.get(protocol.ROLE) == "child"]
    assert len([r for r in runs if r.data.tags.get(protocol.ROLE) == "parent"]) == 1
    assert len(children) == 3 * 2 * 2 + 3 * 2  # rungs x variants x seeds, and the baseline's lr check
    flops = {}
    for r in children:
        assert r.info.status == "FINISHED"
        flops.setdefault(int(r.data.tags[protocol.RUNG]), set()).add(r.data.metrics["train/flops"])
    # 10, 20, 40 steps of 64 tokens: each rung spends more, and the last logged train/flops is the total
    assert max(flops[0]) < min(flops[1]) and max(flops[1]) < min(flops[2])
    report = subprocess.run([sys.executable, str(REPO / "cli.py"), "compare", "--scaling", "--experiment",
                             "ladder", "--calibration_ladders", "0", "--resamples", "200", "--out", "rep"],
                            cwd=tmp_path, capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "norm=layernorm" in table_after(report.stdout, "At the target compute")
    assert (tmp_path / "rep" / "scaling_multiplier.png").is_file()
