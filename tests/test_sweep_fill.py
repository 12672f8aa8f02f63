"""benchmarks/sweep_fill.py: the layouts' page (its sections, the loss check) and, in the slow tier, the CPU dry run
that lays the same small study out one run at a time and in 2 slots and finds every loss unchanged."""

from __future__ import annotations

import time

import pytest

from benchmarks import sweep_fill


def result(name: str, losses: dict, eager: bool = True, timed_out: bool = False) -> dict:
    return {"layout": name, "what": f"layout {name}", "eager": eager, "wall_s": 60.0, "placement": "1 slot(s)",
            "timed_out": timed_out, "gpu_busy": 40.0, "gpu_samples": 120, "cpu_busy": 55.0, "losses": losses}


SAME = {"norm=layernorm seed 1337": 2.0, "norm=rmsnorm seed 1337": 2.5}


def test_the_loss_check_compares_every_run_the_eager_layouts_finished():
    assert sweep_fill.losses_agree([result("a", SAME), result("c", dict(SAME))])
    moved = {**SAME, "norm=rmsnorm seed 1337": 2.5 + 1e-7}
    assert not sweep_fill.losses_agree([result("a", SAME), result("c", moved)])
    # A compiled layout's floats may differ; a layout stopped early is compared on what it finished.
    assert sweep_fill.losses_agree([result("a", SAME), result("d", moved, eager=False)])
    stopped = {"norm=layernorm seed 1337": 2.0, "norm=rmsnorm seed 1337": None}
    assert sweep_fill.losses_agree([result("a", SAME), result("c", stopped, timed_out=True)])
    assert not sweep_fill.losses_agree([result("a", {"x": None}), result("c", {"x": None})])  # nothing compared


def test_each_run_rewrites_its_own_section_and_keeps_the_other(tmp_path):
    page = tmp_path / "sweep-fill.md"
    gpu = sweep_fill.render([result("a", SAME), result("d", {**SAME, "norm=rmsnorm seed 1337": 2.25}, eager=False)],
                            1, ("--trainer.max_steps=300",), "1 x H200")
    sweep_fill.write_section(page, "gpu", gpu)
    cpu = sweep_fill.render([result("a", SAME), result("2 slots", SAME)], 1, ("--trainer.max_steps=20",), "2 cores")
    sweep_fill.write_section(page, "cpu", cpu)
    text = page.read_text()
    assert gpu in text and cpu in text and text.index(gpu) < text.index(cpu)
    assert "largest |difference| from (a) 2.50e-01 nats" in gpu and "every loss they all finished equal" in cpu
    sweep_fill.write_section(page, "cpu", "the second CPU run")
    again = page.read_text()
    assert gpu in again and cpu not in again and "the second CPU run" in again
    assert again.count(sweep_fill.SECTION.format("cpu")) == 1


def test_a_stopped_layout_says_how_far_it_got():
    stopped = {"norm=layernorm seed 1337": 2.0, "norm=rmsnorm seed 1337": None}
    text = sweep_fill.render([result("a", SAME), result("c", stopped, timed_out=True)], 1, (), "1 x H200")
    assert "(stopped: 1 of 2 runs done)" in text and "| norm=rmsnorm seed 1337 | 2.5 | not run |" in text


def test_a_layout_past_its_share_of_the_budget_is_stopped_and_says_so(tmp_path):
    started = time.perf_counter()
    r = sweep_fill.run_layout(sweep_fill.DRY_LAYOUTS[0], 2, sweep_fill.DRY_BUDGET, tmp_path / "a", gpus=0,
                              timeout_s=2)
    assert r["timed_out"] and r["losses"] == {} and time.perf_counter() - started < 30
    text = sweep_fill.render([r], 2, sweep_fill.DRY_BUDGET, "2 cores")
    assert "(stopped: 0 of 4 runs done)" in text


@pytest.mark.slow  # two sweeps of 4 runs each: about a minute alone, several on 2 loaded cores
def test_the_dry_run_lays_out_a_small_study_twice_and_no_loss_moves(tmp_path):
    page = tmp_path / "sweep-fill.md"
    summary = sweep_fill.main(["--dry", "--out", str(page)])
    a, slots = summary["results"]
    assert a["placement"].startswith("1 slot(s) on CPU") and slots["placement"].startswith("2 slot(s) on CPU")
    assert len(a["losses"]) == 4 and all(v is not None for v in a["losses"].values())
    assert a["losses"] == slots["losses"]  # where the runs computed did not change a number
    assert summary["losses_agree"]
    text = page.read_text()
    assert "every loss they all finished equal, bit for bit" in text and "(2 slots)" in text
