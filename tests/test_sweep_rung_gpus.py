"""A ladder's rungs on different GPU counts (``gpus_per_run=K`` in a rung): the rung's syntax and what its children
are told (lit/sweep/ladder.py), slots of several sizes on disjoint GPUs (lit/sweep/placement.py), each child on a
slot of its size (lit/sweep/local.py), and the layouts no machine here can hold, each one ``error:`` line.

A fake device count (``gpus=`` given to ``plan``, or ``visible_gpus`` monkeypatched) stands in for a GPU node.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest

import lit.cli  # noqa: F401  (warm, as the sweep is when it forks its workers)
from lit.errors import UserInputError
from lit.sweep import ladder, placement
from lit.sweep.grid import Child
from lit.sweep.local import run_children
from tests.conftest import REPO
from tests.test_scaling import LADDER, fake_measure, plan_ladder

EIGHT = [str(i) for i in range(8)]
TOP_ON_FOUR = LADDER + ",gpus_per_run=4"  # the last rung (d_model=64) trains on 4 GPUs, the others on the sweep's


def test_a_rung_sets_its_gpus_in_the_ladders_own_syntax(tmp_path):
    rungs = ladder.parse_ladder(TOP_ON_FOUR)
    assert [r.gpus_per_run for r in rungs] == [None, None, 4]
    assert rungs[2].label == "d_model=64,n_heads=2" and rungs[2].tokens == 3e6  # not a model key: not in the label
    path = tmp_path / "rungs.yaml"
    path.write_text("- {d_model: 32}\n- {d_model: 48}\n- {d_model: 64, gpus_per_run: 2}\n")
    assert [r.gpus_per_run for r in ladder.parse_ladder(str(path))] == [None, None, 2]


@pytest.mark.parametrize("value", ["0", "two", "1.5"])
def test_a_rungs_gpus_must_be_a_whole_number(value):
    with pytest.raises(UserInputError, match=f"gpus_per_run='{value}' is not a whole number"):
        ladder.parse_ladder(f"{LADDER},gpus_per_run={value}")


def test_a_rung_on_four_gpus_trains_the_same_batch_split_four_ways():
    proto, children, _ = plan_ladder("--ladder", TOP_ON_FOUR, "--tokens_per_param", "20")
    alone, _, _ = plan_ladder("--ladder", LADDER, "--tokens_per_param", "20")
    rungs, before = proto["ladder"]["rungs"], alone["ladder"]["rungs"]
    assert rungs[:2] == before[:2]  # the rungs that set nothing are written as before (their sweep ids stand)
    assert rungs[2]["gpus_per_run"] == 4 and "gpus_per_run" not in rungs[0]
    assert rungs[2]["overrides"]["trainer.devices"] == "4"
    assert rungs[2]["overrides"]["data.init_args.batch_size"] == "8"  # the recipe's 32, a quarter per rank
    assert {k: v for k, v in rungs[2].items() if k not in ("overrides", "gpus_per_run")} == \
        {k: v for k, v in before[2].items() if k != "overrides"}  # the same steps, tokens and compute
    top = [c for c in children if c.rung == 2]
    assert top and all(c.overrides["trainer.devices"] == "4" for c in top)
    assert not any("trainer.devices" in c.overrides for c in children if c.rung != 2)
    assert ladder.rung_gpus(proto["ladder"]) == [None, None, 4] and ladder.rung_gpus(None) == []


def test_the_sweeps_own_gpus_per_run_splits_the_batch_of_every_rung():
    proto, _, _ = plan_ladder("--ladder", TOP_ON_FOUR, "--tokens_per_param", "20", "--gpus_per_run", "2")
    assert [r["overrides"]["data.init_args.batch_size"] for r in proto["ladder"]["rungs"]] == ["16", "16", "8"]


@pytest.mark.parametrize("extra, message", [
    (("--data.batch_size=30",), "the batch of 30 does not split into 4 equal parts"),
    (("--variant", "data.batch_size=16"), "the variants' batch sizes are not one number"),
])
def test_a_batch_that_cannot_be_split_is_one_line(extra, message):
    with pytest.raises(UserInputError, match=message) as info:
        plan_ladder("--ladder", TOP_ON_FOUR, "--tokens_per_param", "20", *extra)
    assert "\n" not in str(info.value)


def test_a_four_gpu_rung_and_one_gpu_rungs_get_disjoint_gpus():
    layout = placement.plan("auto", None, None, [], gpus=EIGHT, cpus=16, rung_gpus=[None, None, 4])
    sizes = Counter(len(s.devices) for s in layout.slots)
    assert sizes == {4: 1, 1: 4}  # every GPU used: one slot of 4, the rest one GPU each
    four = [set(s.devices) for s in layout.slots if len(s.devices) == 4]
    ones = [d for s in layout.slots if len(s.devices) == 1 for d in s.devices]
    assert four == [{"0", "1", "2", "3"}] and sorted(ones) == ["4", "5", "6", "7"]
    assert layout.trainer_args([]) == ["--trainer.accelerator=gpu", "--trainer.devices=1"]  # the rung's 4 wins later
    top, small = Child("rung2|v|seed|1", "v", "seed", 1, 0, {"trainer.devices": "4"}, rung=2), \
        Child("rung0|v|seed|1", "v", "seed", 1, 0, {}, rung=0)
    assert len(layout.slot_for(top, list(layout.slots)).devices) == 4
    assert len(layout.slot_for(small, list(layout.slots)).devices) == 1
    assert layout.slot_for(top, [s for s in layout.slots if len(s.devices) == 1]) is None
    assert "1 slot(s) of 4, 4 slot(s) of 1" in layout.describe()


def test_one_gpu_rungs_share_only_the_gpus_the_large_slots_leave():
    layout = placement.plan("auto", None, 2, [], gpus=EIGHT, cpus=16, rung_gpus=[None, None, 4])
    four = {d for s in layout.slots if len(s.devices) == 4 for d in s.devices}
    use = Counter(d for s in layout.slots if len(s.devices) == 1 for d in s.devices)
    assert four == {"0", "1", "2", "3"} and not four & set(use)
    assert set(use.values()) == {2} and len(use) == 4


def test_more_gpus_give_slots_by_rungs_per_slot():
    """16 GPUs, three one-GPU rungs and one four-GPU rung: the sizes' queues shrink alike (3/8 and 1/2 rungs per
    slot), the larger slots first on the GPUs, and a smaller --parallel is honoured."""
    layout = placement.plan("auto", None, None, [], gpus=[str(i) for i in range(16)], cpus=16,
                            rung_gpus=[None, None, None, 4])
    assert Counter(len(s.devices) for s in layout.slots) == {4: 2, 1: 8}
    assert [s.devices for s in layout.slots[:2]] == [("0", "1", "2", "3"), ("4", "5", "6", "7")]
    assert placement.plan(3, None, None, [], gpus=EIGHT, cpus=16, rung_gpus=[None, 4, 4]).parallel == 3


@pytest.mark.parametrize("gpus, share, parallel, rung_gpus, expected", [
    (EIGHT, None, "auto", [None, None, 16], "--ladder rung 3 asks for gpus_per_run=16 and this machine shows 8 GPU(s)"),
    (["0", "1", "2", "3"], None, "auto", [None, None, 4], "one run of each at once needs 5 GPUs and this machine "
                                                          "shows 4"),
    (EIGHT, None, 1, [None, None, 4], "--parallel 1: the ladder's rungs train on 4 and 1 GPU(s), one slot"),
    (EIGHT, 2, "auto", [2, 2, 4], "--runs_per_gpu 2: no rung of this ladder trains on one GPU"),
    ([], None, 1, [None, None, 4], "--ladder rung 3 sets gpus_per_run=4: this machine shows no GPU"),
])
def test_impossible_rung_layouts_are_one_line(gpus, share, parallel, rung_gpus, expected):
    with pytest.raises(UserInputError) as info:
        placement.plan(parallel, None, share, [], gpus=gpus, cpus=8, rung_gpus=rung_gpus)
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("gpus, extra, expected", [
    (["0", "1"], [], "error: --ladder rung 3 asks for gpus_per_run=4 and this machine shows 2 GPU(s) (0,1); give it "
                     "gpus_per_run=2 or fewer"),
    (["0", "1", "2", "3"], ["--launch", "slurm"], "error: --ladder rungs with their own gpus_per_run and --launch "
                                                  "slurm"),
])
def test_the_sweep_refuses_a_rung_the_machine_cannot_hold_in_one_line(tmp_path, monkeypatch, capsys, gpus, extra,
                                                                      expected):
    from lit.sweep.command import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(placement, "visible_gpus", lambda: gpus)
    monkeypatch.setattr(ladder, "in_fork", lambda fn, args: fake_measure(args))  # sized without building models
    code = main(["--config", str(REPO / "recipes/gpt_baseline.yaml"), "--seeds", "1", "--ladder", TOP_ON_FOUR,
                 "--tokens_per_param", "20", "--tracking_uri", f"sqlite:///{tmp_path}/m.db", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(expected), err
    assert not list(tmp_path.iterdir())  # no store, no sweep folder


def test_each_child_runs_on_a_slot_of_its_rungs_size_side_by_side(tmp_path):
    """The pool gives the four-GPU rung's children the four-GPU slot only, and starts it beside the small rungs
    (it is last in the queue, smallest rungs first, yet runs from the start)."""
    layout = placement.plan("auto", None, None, [], gpus=["GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e"], cpus=4,
                            rung_gpus=[None, None, 4])
    seen = tmp_path / "seen.txt"

    def run(child: Child) -> int:
        with open(seen, "a") as f:
            f.write(f"{child.key} {time.monotonic()} {os.environ['CUDA_VISIBLE_DEVICES']}\n")
        time.sleep(0.3)
        return 0

    todo = [Child(f"rung{r}|v|seed|{i}", "v", "seed", i, i, {"trainer.devices": "4"} if r == 2 else {}, rung=r)
            for r in (0, 1, 2) for i in range(2)]
    outcomes = run_children(todo, run, layout, tmp_path / "logs", lambda c: "ready", lambda m: None, {})
    assert sorted(o.code for o in outcomes) == [0] * 6
    rows = {key: (float(at), devices) for key, at, devices in (line.split() for line in seen.read_text().splitlines())}
    assert {rows[f"rung2|v|seed|{i}"][1] for i in range(2)} == {"GPU-a,GPU-b,GPU-c,GPU-d"}
    assert all(rows[f"rung{r}|v|seed|{i}"][1] == "GPU-e" for r in (0, 1) for i in range(2))
    assert rows["rung2|v|seed|0"][0] < rows["rung0|v|seed|1"][0]  # the top rung did not wait for the small ones
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_top_rung_child_is_told_its_four_gpus_and_its_share_of_the_batch():
    """What the child's trainer reads: the placement's count for every run first, then the rung's, which wins."""
    from lit.sweep.child import fit_args
    from lit.sweep.grid import option_value

    proto, children, fit = plan_ladder("--ladder", TOP_ON_FOUR, "--tokens_per_param", "20")
    layout = placement.plan("auto", None, None, fit, gpus=EIGHT, cpus=16, rung_gpus=ladder.rung_gpus(proto["ladder"]))
    manifest = {"protocol": proto, "parent_run_id": "p", "recipe": proto["recipe"], "fit_args": fit,
                "experiment": "e", "tracking_uri": "sqlite:///x.db", "save_dir": "runs",
                "placement": layout.trainer_args(fit)}
    top = fit_args(manifest, next(c for c in children if c.rung == 2), None)
    small = fit_args(manifest, next(c for c in children if c.rung == 0), None)
    assert option_value(top, "trainer.devices") == "4" and option_value(small, "trainer.devices") == "1"
    assert option_value(top, "trainer.accelerator") == option_value(small, "trainer.accelerator") == "gpu"
    assert option_value(top, "data.init_args.batch_size") == "8" and option_value(small, "data.init_args.batch_size") \
        is None
