"""Placement of a local sweep's runs (lit/sweep/placement.py): each worker slot's GPUs, counted without CUDA, given
to its worker as CUDA_VISIBLE_DEVICES, and each child's trainer told how many it has; on CPU, the cores as before.

A fake device count (``visible_gpus`` monkeypatched, or ``gpus=`` given to ``plan``) stands in for a GPU node.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import lit.cli  # noqa: F401  (warm, as the sweep is when it forks its workers)
from lit.errors import UserInputError
from lit.sweep import placement, slurm
from lit.sweep.child import fit_args
from lit.sweep.grid import Child
from lit.sweep.local import run_children
from tests.conftest import REPO

EIGHT = [str(i) for i in range(8)]


def devices_of(layout: placement.Layout) -> list[tuple[str, ...]]:
    return [slot.devices for slot in layout.slots]


def test_one_gpu_per_slot_by_default_and_auto_fills_the_node():
    layout = placement.plan("auto", None, None, [], gpus=EIGHT, cpus=32)
    assert devices_of(layout) == [(d,) for d in EIGHT]
    assert [s.threads for s in layout.slots] == [4] * 8
    assert layout.trainer_args([]) == ["--trainer.accelerator=gpu", "--trainer.devices=1"]


def test_fewer_slots_than_gpus_take_distinct_gpus():
    assert devices_of(placement.plan(3, None, None, [], gpus=EIGHT, cpus=8)) == [("0",), ("1",), ("2",)]


def test_gpus_per_run_gives_each_slot_its_own_group():
    layout = placement.plan("auto", 2, None, [], gpus=EIGHT, cpus=8)
    assert devices_of(layout) == [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]
    assert layout.trainer_args([]) == ["--trainer.accelerator=gpu", "--trainer.devices=2"]
    three = placement.plan("auto", 3, None, [], gpus=EIGHT, cpus=8)
    assert devices_of(three) == [("0", "1", "2"), ("3", "4", "5")]
    assert "2 GPU(s) left idle" in three.describe()


@pytest.mark.parametrize("gpus, per_run, share, parallel", [
    (EIGHT, None, None, "auto"), (EIGHT, 2, None, "auto"), (EIGHT, 4, None, 2), (EIGHT, None, 3, "auto"),
    (["0", "1"], None, 4, 5), (["GPU-a", "GPU-b", "GPU-c"], None, 2, "auto"),
])
def test_no_two_slots_share_a_gpu_unless_runs_per_gpu_says_so(gpus, per_run, share, parallel):
    layout = placement.plan(parallel, per_run, share, [], gpus=gpus, cpus=16)
    use = Counter(d for slot in layout.slots for d in slot.devices)
    assert max(use.values()) <= (share or 1)
    assert all(len(slot.devices) == (per_run or 1) for slot in layout.slots)
    if parallel == "auto":
        assert layout.parallel == len(gpus) // (per_run or 1) * (share or 1)
        assert set(use.values()) == {share or 1}  # every GPU holds its m runs


def test_runs_per_gpu_spreads_over_the_gpus_before_sharing_one():
    layout = placement.plan(3, None, 4, [], gpus=["0", "1"], cpus=8)
    assert devices_of(layout) == [("0",), ("1",), ("0",)]
    assert placement.plan("auto", None, 4, [], gpus=["0", "1"], cpus=8).parallel == 8


def test_parallel_auto_on_cpu_is_cores_over_threads_per_run(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    layout = placement.plan("auto", None, None, [], gpus=[], cpus=16)
    assert layout.parallel == 4 and [s.threads for s in layout.slots] == [4] * 4
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert placement.plan("auto", None, None, [], gpus=[], cpus=16).parallel == 16


def test_the_cpu_path_splits_the_cores_as_before_and_tells_the_trainer_nothing():
    for parallel, cpus in ((1, 16), (2, 16), (3, 16), (4, 2)):
        layout = placement.plan(parallel, None, None, [], gpus=[], cpus=cpus)
        assert [s.threads for s in layout.slots] == [max(1, cpus // parallel)] * parallel  # the rule before placement
        assert all(s.devices == () and s.env() == {} for s in layout.slots)
        assert layout.trainer_args([]) == []
    assert placement.cpu_layout(2, 16) == placement.plan(2, None, None, [], gpus=[], cpus=16)


def test_a_cpu_sweep_on_a_gpu_node_stays_on_cpu():
    layout = placement.plan(5, None, None, ["--trainer.accelerator=cpu"], gpus=["0"], cpus=10)
    assert layout.gpus_per_run == 0 and layout.parallel == 5


def test_the_users_trainer_options_win():
    layout = placement.plan(1, None, None, [], gpus=["0"], cpus=2)
    assert layout.trainer_args(["--trainer.accelerator=cuda"]) == ["--trainer.devices=1"]
    assert layout.trainer_args(["--trainer.accelerator", "cuda", "--trainer.devices=1"]) == []
    manifest = {"recipe": "r.yaml", "fit_args": ["--trainer.max_steps=3"], "placement": layout.trainer_args([]),
                "protocol": {"tune": None, "sweep_id": "s"}, "parent_run_id": "p", "experiment": "e",
                "tracking_uri": "sqlite:///x.db", "save_dir": "out"}
    args = fit_args(manifest, Child("v|seed|1", "v", "seed", 1, 0, {}), None)
    at = args.index("--trainer.accelerator=gpu")
    assert args[at + 1] == "--trainer.devices=1" and args[at + 2] == "--trainer.max_steps=3"  # before the user's


def test_visible_gpus_follow_cuda_visible_devices_without_cuda(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert placement.visible_gpus() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert placement.visible_gpus() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,3")
    assert placement.visible_gpus() == ["1"]  # CUDA reads the list up to its first invalid entry
    import torch

    assert not torch.cuda.is_initialized()


@pytest.mark.parametrize("gpus, per_run, share, parallel, fit, expected", [
    (EIGHT, 9, None, 1, [], "--gpus_per_run 9: each run would need 9 GPUs and this machine shows 8"),
    ([], None, 2, 1, [], "--runs_per_gpu 2: this machine shows no GPU"),
    ([], 1, None, 1, [], "--gpus_per_run 1: this machine shows no GPU"),
    (["0"], None, 2, 1, ["--trainer.accelerator=cpu"], "--runs_per_gpu 2: the runs train on CPU"),
    (EIGHT, None, None, 9, [], "--parallel 9: 8 GPU(s) at one GPU per run hold 8 run(s) at once"),
    (EIGHT, None, 2, 17, [], "--parallel 17: 8 GPU(s) at one GPU per run, 2 runs per GPU hold 16"),
    (EIGHT, 2, 2, 1, [], "runs share a GPU only when each trains on one"),
    (EIGHT, 0, None, 1, [], "--gpus_per_run must be at least 1"),
    (EIGHT, 2, None, 1, ["--trainer.devices=4"], "disagree; pass only --gpus_per_run"),
    (EIGHT, None, None, 1, ["--trainer.devices=auto"], "say how many with --gpus_per_run K"),
])
def test_impossible_layouts_are_one_line(gpus, per_run, share, parallel, fit, expected):
    with pytest.raises(UserInputError) as info:
        placement.plan(parallel, per_run, share, fit, gpus=gpus, cpus=8)
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("args, expected", [
    (["--gpus_per_run", "9"], "error: --gpus_per_run 9: each run would need 9 GPUs and this machine shows 2"),
    (["--parallel", "0"], "--parallel must be a whole number of at least 1 or 'auto'"),
    (["--parallel", "many"], "--parallel must be a whole number of at least 1 or 'auto'"),
    (["--launch", "slurm", "--gpus_per_run", "2"], "error: --gpus_per_run 2 with --launch slurm"),
    (["--launch", "slurm", "--runs_per_gpu", "2"], "error: --runs_per_gpu with --launch slurm"),
])
def test_the_command_refuses_in_one_line_before_the_store(tmp_path, monkeypatch, capsys, args, expected):
    from cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(placement, "visible_gpus", lambda: ["0", "1"])
    with pytest.raises(SystemExit) as info:
        main(["sweep", "--config", str(REPO / "recipes/gpt_baseline.yaml"), "--vary", "model.arch.norm=rmsnorm,dyt",
              *args])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and err[0].startswith("error:")
    assert not (tmp_path / "mlflow.db").exists()


def test_each_slot_worker_sees_its_devices_and_a_fresh_worker_gets_the_same(tmp_path):
    layout = placement.plan(2, None, None, [], gpus=["GPU-a", "GPU-b"], cpus=4)
    seen = tmp_path / "seen.txt"

    def run(child: Child) -> int:
        with open(seen, "a") as f:
            f.write(f"{child.key} {os.getpid()} {os.environ['CUDA_VISIBLE_DEVICES']}\n")
        time.sleep(0.2)  # both slots busy at once
        return 1 if child.key.startswith("crash") else 0

    todo = [Child(f"{b}|{i}", "v", "seed", i, i, {}) for i, b in enumerate(["crash", "ok", "ok"])]
    results: dict[str, int] = {}
    # The crash runs alone first (in slot 0); then both slots start at once, slot 0 in a fresh worker.
    gate = lambda c: "ready" if c.key.startswith("crash") or "crash|0" in results else "wait"  # noqa: E731
    outcomes = run_children(todo, run, layout, tmp_path / "logs", gate, lambda m: None, results)
    assert sorted(o.code for o in outcomes) == [0, 0, 1]
    rows = [line.split() for line in seen.read_text().splitlines()]
    by_pid: dict[str, set[str]] = {}
    for _, pid, devices in rows:
        by_pid.setdefault(pid, set()).add(devices)
    assert len(by_pid) == 3 and all(len(d) == 1 for d in by_pid.values())  # the crash ended its worker
    crashed_on = next(devices for key, _, devices in rows if key == "crash|0")
    after = sorted(devices for key, _, devices in rows if key != "crash|0")
    assert crashed_on == "GPU-a" and after == ["GPU-a", "GPU-b"]  # slot 0's fresh worker kept slot 0's GPU
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # set in the forks only
    import torch

    assert not torch.cuda.is_initialized()


def test_a_slot_sharing_a_gpu_waits_for_its_share_of_memory():
    free = iter([10, 20, 30])
    said, slept = [], []
    assert placement.wait_for_share("0", 4, said.append, read=lambda d: (next(free) * placement.GIB,
                                                                         100 * placement.GIB),
                                    wait_s=10, poll_s=2, sleep=slept.append)
    assert slept == [2, 2] and "30.0 GiB free of 100.0; this run's share is 25.0 GiB" in said[-1]
    said.clear()
    assert not placement.wait_for_share("0", 2, said.append, read=lambda d: (1, 100), wait_s=4, poll_s=2,
                                        sleep=lambda s: None)
    assert "starting anyway" in said[-1] and len(said) == 1


def test_the_log_says_whether_mps_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.setattr(placement, "_process_name", lambda p: "python")
    assert placement.mps_state().startswith("CUDA MPS: not running")
    (tmp_path / "control").touch()
    assert placement.mps_state().startswith("CUDA MPS: running")
    monkeypatch.setattr(placement, "_process_name", lambda p: "nvidia-cuda-mps-control")
    (tmp_path / "control").unlink()
    assert placement.mps_state().startswith("CUDA MPS: running")


def test_slurm_tasks_ask_for_their_gpus_unless_sbatch_does(tmp_path):
    manifest = {"protocol": {"sweep_id": "abcdef012345"},
                "children": [Child("v|seed|1", "v", "seed", 1, 0, {}).to_json()]}
    slurm.write_scripts(manifest, tmp_path / "manifest.json", tmp_path, [], gpus_per_run=1)
    assert "#SBATCH --gpus-per-task=1" in (tmp_path / "seeds.sbatch").read_text()
    slurm.write_scripts(manifest, tmp_path / "manifest.json", tmp_path, ["--gres=gpu:1"], gpus_per_run=1)
    assert "gpus-per-task" not in (tmp_path / "seeds.sbatch").read_text()
    slurm.write_scripts(manifest, tmp_path / "manifest.json", tmp_path, [], gpus_per_run=0)
    assert "gpu" not in (tmp_path / "seeds.sbatch").read_text()


def test_help_shows_the_placement_flags():
    out = subprocess.run([sys.executable, str(REPO / "cli.py"), "sweep", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert all(flag in out.stdout for flag in ("--gpus_per_run", "--runs_per_gpu", "--parallel N|auto"))



@pytest.mark.slow  # two 2-process fits on 2 shared cores
def test_a_two_process_gloo_child_trains_as_fit_would(tmp_path):
    """A child on 2 devices: Lightning starts its second rank from the worker (lit/sweep/ranks.py), not the sweep's
    command line again; both ranks fit and test, and the numbers are those of the same `fit` run by hand."""
    from mlflow import MlflowClient

    from lit.sweep import protocol as P
    from tests.conftest import subprocess_env
    from tests.test_sweep import BASELINE, TINY, final

    two = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = subprocess.run([sys.executable, str(REPO / "cli.py"), "sweep", "--config", BASELINE, "--seeds", "1",
                          "--experiment", "ddp", *TINY, *two], cwd=tmp_path, capture_output=True, text=True,
                         env=subprocess_env(), timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    client = MlflowClient(uri)
    child = next(r for r in client.search_runs([client.get_experiment_by_name("ddp").experiment_id])
                 if r.data.tags.get(P.ROLE) == P.CHILD)
    seed = child.data.tags[P.SEED]
    assert client.get_metric_history(child.info.run_id, "test/loss")  # the test ran on both ranks (no hang)
    logger = "--trainer.logger.init_args."
    fit = subprocess.run([sys.executable, str(REPO / "cli.py"), "fit", "--config", BASELINE, *TINY, *two,
                          f"--seed_everything={seed}", f"--data.seed={seed}", "--model.random_numbers=by_name",
                          f"{logger}tracking_uri={uri}", f"{logger}experiment_name=direct"],
                         cwd=tmp_path, capture_output=True, text=True, env=subprocess_env(), timeout=900)
    assert fit.returncode == 0, fit.stderr[-3000:]
    direct = client.search_runs([client.get_experiment_by_name("direct").experiment_id])[0]
    for metric in ("val/loss", "train/loss"):
        assert final(client, child, metric) == pytest.approx(final(client, direct, metric), rel=1e-6, abs=0), metric


def test_while_a_child_runs_lightning_starts_its_other_ranks_from_ranks_py(monkeypatch):
    """What Lightning's launcher runs for ranks 1..n-1 (``_basic_subprocess_cmd``): ranks.py with the child's work,
    never the sweep's command line; both put back after the run."""
    import json

    from lightning.fabric.strategies.launchers.subprocess_script import _basic_subprocess_cmd

    from lit.sweep import ranks

    monkeypatch.setattr(sys, "argv", ["cli.py", "sweep", "--config", "r.yaml"])
    before = _basic_subprocess_cmd()
    with ranks.other_ranks_run(["fit", "--config", "r.yaml"], True):
        command = _basic_subprocess_cmd()
        work = json.loads(os.environ[ranks.RANK_ARGS])
    assert command == [sys.executable, str(Path(ranks.__file__).resolve())]
    assert work == {"args": ["fit", "--config", "r.yaml"], "test": True}
    assert _basic_subprocess_cmd() == before and ranks.RANK_ARGS not in os.environ


@pytest.mark.slow  # a sweep's start-up and its variant check: 30 s alone, minutes on 2 loaded cores
def test_a_slurm_launch_tells_each_task_its_gpu_after_checking_the_variants_without_one(tmp_path):
    """Submitted from a machine without a GPU: the variants are built there on CPU, the tasks ask for a GPU each and
    their runs are told it."""
    import json

    from tests.conftest import subprocess_env
    from tests.test_sweep import BASELINE, TINY

    out = subprocess.run([sys.executable, str(REPO / "cli.py"), "sweep", "--config", BASELINE, "--seeds", "1",
                          "--launch", "slurm", "--gpus_per_run", "1", "--out", str(tmp_path / "s"), *TINY],
                         cwd=tmp_path, capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["placement"] == ["--trainer.accelerator=gpu", "--trainer.devices=1"]
    assert "#SBATCH --gpus-per-task=1" in (tmp_path / "s" / "seeds.sbatch").read_text()
