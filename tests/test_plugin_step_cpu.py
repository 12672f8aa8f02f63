"""benchmarks/plugin_step_cpu.py (paired CPU step ratios per plugin) and benchmarks/rewrite_equality.py (the
rewrites' per-seed losses before and after): their arithmetic, their tables, a tiny real run, their one-line
errors."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import plugin_step_cpu as psc
from benchmarks import rewrite_equality as req


class FakeClock:
    """A clock that only the fake steps advance: each step adds its cost."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_steps(clock: FakeClock, costs: dict[str, float], calls: list[str]) -> dict:
    def step_of(name):
        def step():
            calls.append(name)
            clock.now += costs[name]
        return step

    return {name: step_of(name) for name in costs}


def test_paired_rounds_divide_each_contenders_window_by_its_neighbouring_baselines_and_flip_the_order():
    clock, calls = FakeClock(), []
    steps = fake_steps(clock, {"base": 2.0, "a": 3.0, "b": 8.0}, calls)
    out = psc.paired_rounds(steps, {"a": "base", "b": "base"}, rounds=3, steps_per_window=2, clock=clock)
    # Seconds per step (a window of 2 steps, divided by 2), and contender / baseline per round.
    assert out["a"] == {"ratios": [1.5] * 3, "seconds": [3.0] * 3, "baseline_seconds": [2.0] * 3}
    assert out["b"]["ratios"] == [4.0] * 3
    # Round 0: baseline first in each pair; round 1: the contender first; round 2: baseline first again.
    windows = calls[::2]
    assert windows == ["base", "a", "base", "b", "a", "base", "b", "base", "base", "a", "base", "b"]
    assert calls[1::2] == windows  # each window is 2 steps of one model


def test_a_contender_that_fails_is_recorded_and_the_others_still_run():
    clock, calls = FakeClock(), []
    steps = fake_steps(clock, {"base": 1.0, "ok": 2.0}, calls)

    def broken():
        raise RuntimeError("shape\nmismatch")

    steps["broken"] = broken
    out = psc.paired_rounds(steps, {"broken": "base", "ok": "base"}, rounds=2, steps_per_window=1, clock=clock)
    assert out["broken"] == {"status": "failed", "error": "RuntimeError: shape mismatch"}
    assert out["ok"]["ratios"] == [2.0, 2.0]


def test_the_median_interval_is_the_order_statistics_with_their_binomial_coverage():
    five = [1.3, 1.1, 1.5, 1.2, 1.4]
    assert psc.median_interval(five) == (1.1, 1.5, 1 - 2 / 32)  # the range: 93.75%
    nine = [float(i) for i in range(9, 0, -1)]
    low, high, cover = psc.median_interval(nine)
    assert (low, high) == (2.0, 8.0) and cover == pytest.approx(1 - 2 * (1 + 9) / 512)  # k = 2: 96.1%
    assert psc.median_interval([1.0, 2.0])[2] == 0.5
    row = psc.summarise({"ratios": five, "seconds": [2.0, 3.0, 4.0, 5.0, 6.0], "baseline_seconds": [1.0] * 5})
    assert (row["median"], row["min"], row["max"], row["step_s"]) == (1.3, 1.1, 1.5, 4.0)


def test_a_tiny_run_of_two_plugins_records_their_ratios_and_writes_the_table(tmp_path, capsys):
    out = tmp_path / "run.json"
    code = psc.main(["--shape", "tiny", "--only", "norm=ssnorm", "residual=mhc", "--rounds", "1", "--steps", "1",
                     "--warmup", "1", "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["rounds"] == 1 and len(result["load_average_before"]) == 3
    rows = result["contenders"]
    assert list(rows) == ["norm=ssnorm", "residual=mhc"]
    for row in rows.values():
        assert row["status"] == "ran" and row["baseline"] == psc.BASELINE
        assert row["median"] == pytest.approx(row["seconds"][0] / row["baseline_seconds"][0])
        assert row["median"] == row["min"] == row["max"] and math.isfinite(row["median"]) and row["median"] > 0
    table = capsys.readouterr().out
    assert table.startswith("1 rounds of 1 steps per window, clock cpu")
    for label, row in rows.items():
        line = next(line for line in table.splitlines() if line.startswith(f"| `{label}` |"))
        assert f"{row['median']:.2f}x" in line
        assert line.endswith("| yes |") == (row["median"] > psc.SLOW)


def test_3pt_runs_at_its_recipes_width_against_a_baseline_of_that_width():
    repro = psc.SHAPES["reproduction"]
    assert psc.shape_for("norm=3pt", repro).d_model == 192 and psc.shape_for("norm=3pt", repro).n_heads == 6
    assert psc.shape_for("norm=3pt", psc.SHAPES["tiny"]) == psc.SHAPES["tiny"]
    assert psc.shape_for("norm=ssnorm", repro) == repro
    assert psc.baseline_label(psc.shape_for("norm=3pt", repro), repro) == "baseline d192 h6"
    assert psc.baseline_label(repro, repro) == psc.BASELINE


def run_row(median, low, high):
    return {"status": "ran", "median": median, "min": low, "max": high, "interval": [low, high], "coverage": 0.94}


def test_the_before_after_table_gives_both_medians_their_quotient_and_what_is_still_slow():
    before = {"contenders": {"residual=mhc": run_row(4.0, 3.5, 4.4), "norm=dyt": run_row(1.0, 0.9, 1.1)}}
    after = {"contenders": {"residual=mhc": run_row(2.0, 1.8, 2.3), "norm=dyt": run_row(1.02, 0.9, 1.1),
                            "norm=new": {"status": "failed", "error": "ValueError: no"}}}
    lines = psc.render_compare(before, after).splitlines()
    assert lines[2] == ("| `residual=mhc` | 4.00x [3.50, 4.40] (3.50-4.40) | 2.00x [1.80, 2.30] (1.80-2.30) | 0.50 "
                        "| **yes** |")
    assert lines[3].endswith("| 1.02 |  |")
    assert lines[4] == "| `norm=new` | not in this run | failed: ValueError: no |  |  |"
    assert lines[6] == "- before: ? rounds of ? steps, clock ?"


def test_the_noise_line_reads_the_baselines_windows_and_the_load():
    row = run_row(1.2, 1.0, 1.4) | {"baseline": psc.BASELINE, "baseline_seconds": [0.5, 0.4, 0.7]}
    other = run_row(1.1, 1.0, 1.2) | {"baseline": "baseline d192 h6", "baseline_seconds": [9.0]}
    run = {"rounds": 3, "steps": 1, "clock": "cpu", "load_average_before": [8.04, 1, 1], "load_average": [11.6, 1, 1],
           "contenders": {"a": row, "norm=3pt": other}}
    assert psc.noise(run) == ("3 rounds of 1 steps, clock cpu; baseline 0.500 s per step over 3 windows "
                              "(0.400-0.700); load average 8.0 -> 11.6")


@pytest.mark.parametrize("argv, says", [
    # Tiny and one contender: were the check gone, the run would be quick and return 0, not hang the test.
    (["--shape", "tiny", "--only", "norm=dyt", "--rounds", "0"], "--rounds must be at least 1"),
    (["--shape", "tiny", "--only", "norm=nosuch"], "unknown contender 'norm=nosuch'"),
    (["--compare", "/nonexistent/before.json", "/nonexistent/after.json"], "/nonexistent/before.json does not exist"),
])
def test_bad_input_is_one_error_line(argv, says, capsys):
    assert psc.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1


def seed_runs(final: float, train: list[float]) -> dict:
    return {str(seed): {"final_loss": final + seed, "train_losses": [x + seed for x in train]} for seed in req.SEEDS}


def test_the_equality_table_flags_a_final_loss_more_than_the_tolerance_apart_and_where_training_parted():
    before = {"steps": 3, "runs": {"baseline": seed_runs(2.0, [4.0, 3.0, 2.5]),
                                   "residual=mhc": seed_runs(2.1, [4.0, 3.1, 2.6])}}
    after = json.loads(json.dumps(before))
    after["runs"]["baseline"]["0"]["final_loss"] += 5e-5  # within 1e-4
    after["runs"]["residual=mhc"]["2"]["final_loss"] += 3e-4
    after["runs"]["residual=mhc"]["2"]["train_losses"][1] += 2e-6
    table, differ = req.compare(before, after)
    assert differ == ["residual=mhc"]
    rows = table.splitlines()
    assert rows[2].startswith("| `baseline` | 2.00005, 3.00000, 4.00000, 5.00000 | 5.0e-05, 0.0e+00,")
    assert rows[2].endswith("| 0.0e+00 | yes |")
    assert "| 0.0e+00, 0.0e+00, 3.0e-04, 0.0e+00 | 2.0e-06 (step 2) | **no** |" in rows[3]
    assert req.first_difference([1.0, 2.0], [1.0, 2.0], 1e-6) is None


def test_a_seeds_training_is_the_same_number_for_number_when_run_again():
    """The premise of comparing two commits' runs: one machine, one thread, the same losses."""
    spec = {"arch": {"residual": "hyperconn"}, "optimizer": "adamw", "shape": psc.SHAPES["tiny"]}
    data = req.corpus()[:5000] % psc.SHAPES["tiny"].vocab  # the tiny vocabulary: 64 ids
    first, again = req.train(spec, 1, 2, data), req.train(spec, 1, 2, data)
    assert first == again and all(math.isfinite(x) for x in first["train_losses"])
    assert req.train(spec, 2, 2, data) != first  # the seed draws the init and the batches


def test_a_one_ulp_nudge_moves_every_weight_by_one_ulp_and_nothing_else():
    import torch

    model = torch.nn.Linear(64, 64)
    before = [p.detach().clone() for p in model.parameters()]
    req.nudge_one_ulp_(model)
    for old, new in zip(before, model.parameters(), strict=True):
        up, down = torch.nextafter(old, old + 1), torch.nextafter(old, old - 1)
        assert torch.all((new == up) | (new == down))
        assert (new == up).any() and (new == down).any()  # both directions drawn


def test_each_round_hands_over_the_result_so_far(tmp_path):
    seen = []
    psc.measure(psc.SHAPES["tiny"], ["norm=dyt"], rounds=2, steps=1, warmup=0, clock="cpu", progress=lambda line: None,
                after_round=seen.append)
    assert [r["rounds"] for r in seen] == [1, 2]
    assert [len(r["contenders"]["norm=dyt"]["ratios"]) for r in seen] == [1, 2]
