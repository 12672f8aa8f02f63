"""Never lose a run: exact resume after a real SIGKILL, SIGTERM, Ctrl-C or a kill between validations, a clear stop
on a non-finite loss, safe checkpoint loading.

The interrupted runs are processes of their own (a signal or a kill ends them); the uninterrupted run and the
resumes need no process boundary and run in this one (`fit_here`): a process costs seconds of importing Lightning.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch

from lit.cli import main
from lit.data.resumable import ResumableSampler
from tests.conftest import REPO, TINY_LM, cli_here, subprocess_env

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
STEPS = 12


# --- the training order -------------------------------------------------------------------------------------------

def shares(n: int, batch: int, world: int, epoch: int = 0, drop_last: bool = True, **kw) -> list[list[int]]:
    samplers = [ResumableSampler(range(n), batch, world, rank, seed=3, drop_last=drop_last, **kw)
                for rank in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
    return [list(s) for s in samplers]


def global_batches(per_rank: list[list[int]], batch: int) -> list[list[int]]:
    """What the ranks train on together, batch by batch."""
    steps = len(per_rank[0]) // batch + (len(per_rank[0]) % batch > 0)
    return [sum((r[i * batch:(i + 1) * batch] for r in per_rank), []) for i in range(steps)]


def test_the_global_batches_do_not_depend_on_the_number_of_processes():
    one = global_batches(shares(50, 8, 1), 8)
    assert global_batches(shares(50, 4, 2), 4) == one
    assert global_batches(shares(50, 2, 4), 2) == one
    assert len(one) == 6 and len({i for b in one for i in b}) == 48  # drop_last: 6 full global batches, no repeat
    assert global_batches(shares(50, 8, 1, epoch=1), 8) != one  # a new permutation every epoch


def test_without_drop_last_every_rank_steps_equally():
    per_rank = shares(11, 4, 2, drop_last=False)
    assert len(per_rank[0]) == len(per_rank[1]) == len(ResumableSampler(range(11), 4, 2, 0, drop_last=False)) == 6
    assert set(per_rank[0]) | set(per_rank[1]) == set(range(11))


def test_repeated_augmentation_repeats_each_image_thrice_in_an_epoch_of_the_same_length():
    one = global_batches(shares(48, 8, 1, repeats=3), 8)
    assert global_batches(shares(48, 4, 2, repeats=3), 4) == one  # still the same global batches on 2 processes
    order = sum(one, [])
    assert len(order) == 48 and len(set(order)) == 16  # the epoch's length; a third of the images, thrice
    assert all(order[i] == order[i + 1] == order[i + 2] for i in range(0, 48, 3))
    assert sum(global_batches(shares(48, 8, 1, epoch=1, repeats=3), 8), []) != order
    assert sum(global_batches(shares(48, 8, 1), 8), []) == sum(global_batches(shares(48, 8, 1, repeats=1), 8), [])


def test_keyed_samples_carry_a_seed_of_their_place_in_the_order_whatever_the_world_size():
    one = global_batches(shares(48, 8, 1, repeats=3, keyed=True), 8)
    assert global_batches(shares(48, 4, 2, repeats=3, keyed=True), 4) == one
    keys = [key for _, key in sum(one, [])]
    assert len(set(keys)) == 48  # the three copies of an image are augmented differently
    assert [i for i, _ in sum(one, [])] == sum(global_batches(shares(48, 8, 1, repeats=3), 8), [])
    assert {k for _, k in sum(global_batches(shares(48, 8, 1, epoch=1, keyed=True), 8), [])}.isdisjoint(keys)
    sampler = ResumableSampler(range(48), 4, 2, 1, seed=3, repeats=3, keyed=True)
    full = list(sampler)
    sampler.resume_at(2)
    assert list(sampler) == full[8:]


def test_the_sampler_asks_for_the_batches_already_trained_when_an_epoch_starts():
    sampler = ResumableSampler(range(40), 4, 2, 1, seed=3)
    full = list(sampler)
    trained = [3]
    # The trainer's loop progress, restored after the DataLoader was built; Lightning starts the resumed epoch's
    # iterator before it sets the sampler's epoch, so the epoch comes from the trainer too.
    sampler.resume_point = lambda: (0, trained[0])
    assert list(sampler) == full[12:]
    trained[0] = 5  # the checkpoint ended the epoch: the next one starts whole
    assert list(sampler) == full
    trained[0] = 0
    assert list(sampler) == full
    sampler.set_epoch(0)
    sampler.resume_point = lambda: (1, 2)
    second = ResumableSampler(range(40), 4, 2, 1, seed=3)
    second.set_epoch(1)
    assert list(sampler) == list(second)[8:]


def test_resume_at_skips_the_batches_already_trained_once():
    sampler = ResumableSampler(range(40), 4, 2, 1, seed=3)
    full = list(sampler)
    sampler.resume_at(3)
    assert list(sampler) == full[12:]
    assert list(sampler) == full  # the next epoch is whole again
    assert len(sampler) == 20


# --- kill and resume ---------------------------------------------------------------------------------------------

def small_corpus(folder: Path) -> Path:
    """~5 training batches per epoch at block 32 / batch 4, so the runs cross epoch boundaries."""
    text = (REPO / "lit" / "data" / "tinyshakespeare.txt").read_text()[:800]
    path = folder / "corpus.txt"
    path.write_text(text)
    return path


def fit_command(corpus: Path, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "cli.py"), "fit", "--config", BASELINE, *TINY_LM,
            f"--data.text_file={corpus}", "--model.arch.dropout=0.1",  # dropout: random states must resume too
            f"--trainer.max_steps={STEPS}", "--trainer.val_check_interval=null", "--trainer.limit_val_batches=0",
            "--checkpoint.every_n_train_steps=1", *extra]


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=subprocess_env())


def newest_last_checkpoint(folder: Path) -> Path:
    # last-v1.ckpt when a run resumes with other checkpoint settings (ModelCheckpoint keys its state by them).
    return max(folder.glob("runs/*/*/checkpoints/last*.ckpt"), key=lambda p: p.stat().st_mtime)


def final_state(folder: Path) -> dict:
    return torch.load(newest_last_checkpoint(folder), map_location="cpu", weights_only=True)


def fault(callback: str, step: int, **more) -> str:
    args = ", ".join(f"{k}: {v}" for k, v in {"step": step, **more}.items())
    return f"{{class_path: tests.fault_injection.{callback}, init_args: {{{args}}}}}"


def fit_here(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``command`` (a ``fit_command``) run in this process (``cli_here``), without the interpreter and cli.py."""
    return cli_here(command[2:], cwd)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("uninterrupted")
    proc = fit_here(fit_command(small_corpus(folder)), folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return final_state(folder)


def assert_resumes_exactly(corpus: Path, last: Path, folder: Path, uninterrupted: dict) -> None:
    resumed = fit_here(fit_command(corpus, f"--ckpt_path={last}"), folder)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "not resumable" not in resumed.stderr  # Lightning's warning is false here: the sampler resumes exactly
    final = final_state(folder)
    assert final["global_step"] == uninterrupted["global_step"] == STEPS
    for name, expected in uninterrupted["state_dict"].items():
        assert torch.equal(final["state_dict"][name], expected), name
    expected_moments = uninterrupted["optimizer_states"][0]["state"]
    for i, state in final["optimizer_states"][0]["state"].items():
        assert torch.equal(state["exp_avg_sq"], expected_moments[i]["exp_avg_sq"])


# Step 5 ends the first epoch (5 batches); step 7 is in the middle of the second.
# A second kill point (after a validation) and SIGINT (the same handler as SIGTERM) are in the slow tier.
@pytest.mark.parametrize("kill_at", [5, pytest.param(7, marks=pytest.mark.slow)])
def test_a_run_killed_by_sigkill_resumes_to_the_same_weights(kill_at, uninterrupted, tmp_path):
    corpus = small_corpus(tmp_path)
    killer = f"--trainer.callbacks=[{fault('SigkillAtStep', kill_at)}]"
    killed = run(fit_command(corpus, killer), tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]  # really killed, no cleanup ran
    last = newest_last_checkpoint(tmp_path)
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == kill_at
    assert_resumes_exactly(corpus, last, tmp_path, uninterrupted)


# Only the signal saves here: no step checkpoints, no validation, no clock.
SIGNAL_ONLY = ["--checkpoint.every_n_train_steps=0", "--preemption.interval_minutes=0"]


@pytest.mark.parametrize("signal_name, exit_code", [("SIGTERM", 143),
                                                     pytest.param("SIGINT", 130, marks=pytest.mark.slow)])
def test_a_signal_saves_marks_the_run_and_resumes_exactly(signal_name, exit_code, uninterrupted, tmp_path):
    corpus = small_corpus(tmp_path)
    sender = f"--trainer.callbacks=[{fault('SignalAtStep', 6, signal=signal_name)}]"
    stopped = run(fit_command(corpus, sender, *SIGNAL_ONLY), tmp_path)
    assert stopped.returncode == exit_code, stopped.stderr[-3000:]
    last = newest_last_checkpoint(tmp_path)
    # The signal came during step 6 (the 7th batch): that step is finished and saved.
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 7
    lines = [line for line in stopped.stderr.splitlines() if line.startswith("stopped:")]
    assert lines == [f"stopped: stopped by {signal_name} at step 7; checkpoint {last.relative_to(tmp_path)}; resume "
                     f"with the same command and --ckpt_path={last.relative_to(tmp_path)}"], stopped.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run_info,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run_info.info.status == "KILLED" and run_info.data.tags["arch_lab.stopped_by"] == signal_name
    assert run_info.data.tags["arch_lab.stopped_at_step"] == "7"

    assert_resumes_exactly(corpus, last, tmp_path, uninterrupted)
    assert client.get_run(run_info.info.run_id).info.status == "FINISHED"  # the same run, continued


def test_a_kill_between_validations_loses_at_most_the_checkpoint_interval(uninterrupted, tmp_path):
    # Validation never comes (as between two validations of a long run); steps take >= 0.3 s and the clock
    # refreshes last.ckpt every 0.9 s of training, so a SIGKILL at step 10 loses a few steps, not ten.
    corpus = small_corpus(tmp_path)
    interval_s, step_s = 0.9, 0.3
    slow = f"{{class_path: tests.fault_injection.SlowSteps, init_args: {{seconds: {step_s}}}}}"
    callbacks = f"--trainer.callbacks=[{slow}, {fault('SigkillAtStep', 10)}]"
    killed = run(fit_command(corpus, callbacks, "--checkpoint.every_n_train_steps=0",
                             f"--preemption.interval_minutes={interval_s / 60}"), tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]
    last = newest_last_checkpoint(tmp_path)
    saved_at = torch.load(last, map_location="cpu", weights_only=True)["global_step"]
    assert 10 - saved_at <= math.ceil(interval_s / step_s) + 1, saved_at
    assert_resumes_exactly(corpus, last, tmp_path, uninterrupted)


# --- non-finite loss ---------------------------------------------------------------------------------------------

def test_a_nan_loss_stops_the_run_with_one_line_and_keeps_the_last_good_checkpoint(workdir, capsys):
    poison = f"--trainer.callbacks=[{fault('PoisonWeightsAtStep', 3)}]"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", BASELINE, *TINY_LM, "--trainer.max_steps=10", "--trainer.val_check_interval=null",
              "--trainer.limit_val_batches=0", "--checkpoint.every_n_train_steps=1", poison])
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "training loss is nan at step 3" in errors[0], errors
    last = newest_last_checkpoint(workdir)
    assert str(last.relative_to(workdir)) in errors[0]
    kept = torch.load(last, map_location="cpu", weights_only=True)
    assert kept["global_step"] == 3
    assert all(torch.isfinite(t).all() for t in kept["state_dict"].values())


def test_a_nan_loss_between_log_steps_stops_at_the_next_one_before_its_metrics_are_logged(workdir_with_store, capsys):
    # The loss is read at log steps (every 5 here) and before checkpoints, not at every step (tests/test_syncs.py).
    poison = f"--trainer.callbacks=[{fault('PoisonWeightsAtStep', 7)}]"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", BASELINE, *TINY_LM, "--trainer.max_steps=30", "--trainer.val_check_interval=null",
              "--trainer.limit_val_batches=0", "--trainer.log_every_n_steps=5", poison])
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "training loss is nan at step 7 (found at step 9:" in errors[0], errors
    assert "No checkpoint was written before it" in errors[0]
    client = mlflow.MlflowClient(f"sqlite:///{workdir_with_store}/mlflow.db")
    run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in losses] == [4] and all(math.isfinite(m.value) for m in losses)
    assert not list(workdir_with_store.glob("runs/*/*/checkpoints/*.ckpt"))


def test_a_nan_loss_on_one_rank_stops_every_rank(tmp_path):
    # Rank 1 alone sees a NaN loss at step 2; a rank 0 that went on would wait for rank 1 forever.
    proc = run([*fit_command(small_corpus(tmp_path), f"--trainer.callbacks=[{fault('PoisonWeightsAtStep', 2, rank=1)}]",
                             "--config", str(REPO / "recipes" / "trainer" / "ddp.yaml"), "--trainer.devices=2",
                             "--trainer.accelerator=cpu")], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "loss is non-finite on another process at step 2" in errors[0], errors
    assert torch.load(newest_last_checkpoint(tmp_path), weights_only=True)["global_step"] == 2


# --- checkpoints from elsewhere ----------------------------------------------------------------------------------

class Payload:
    """Stands for arbitrary code pickled into a file."""


def one_error_line(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture
def tiny_checkpoint(workdir) -> Path:
    main(["fit", "--config", BASELINE, *TINY_LM, "--trainer.max_steps=1", "--trainer.limit_val_batches=0"])
    return newest_last_checkpoint(workdir)


@pytest.mark.parametrize("subcommand", ["fit", "validate"])
def test_bad_checkpoints_give_one_line(subcommand, tiny_checkpoint, workdir, capsys):
    args = [subcommand, "--config", BASELINE, *TINY_LM, "--trainer.max_steps=2", "--trainer.limit_val_batches=1"]
    corrupt = workdir / "corrupt.ckpt"
    corrupt.write_bytes(tiny_checkpoint.read_bytes()[:5000])  # a truncated copy
    assert "cannot read checkpoint" in one_error_line([*args, f"--ckpt_path={corrupt}"], capsys)

    foreign = workdir / "foreign.ckpt"
    torch.save({"state_dict": {}, "payload": Payload()}, foreign)
    assert "Unsupported global" in one_error_line([*args, f"--ckpt_path={foreign}"], capsys)

    # LightningCLI rebuilds the model from a checkpoint's hyperparameters; weights saved by other code have none.
    checkpoint = torch.load(tiny_checkpoint, weights_only=True)
    del checkpoint["hyper_parameters"]
    checkpoint["state_dict"]["model.renamed.weight"] = checkpoint["state_dict"].pop("model.tok.weight")
    other = workdir / "other_code.ckpt"
    torch.save(checkpoint, other)
    line = one_error_line([*args, f"--ckpt_path={other}", "--model.arch.d_model=64"], capsys)
    assert "does not fit this model" in line and "shapes differ" in line and "--model.init_from" in line
    assert "missing (model.tok.weight" in line and "unexpected (model.renamed.weight" in line

    assert "not found" in one_error_line([*args, "--ckpt_path=missing.ckpt"], capsys)


@pytest.mark.slow  # three real fits with DataLoader workers
def test_a_text_run_bounded_by_epochs_with_workers_resumes_mid_epoch_exactly(tmp_path, monkeypatch):
    # max_epochs bounds the run, so the schedule's length is counted in configure_optimizers, before the loop's
    # progress is restored; counting it through Lightning's estimated_stepping_batches starts the DataLoader's
    # workers there, and the resumed epoch then replays the start of epoch 0's order.
    monkeypatch.chdir(tmp_path)
    corpus = small_corpus(tmp_path)
    common = [sys.executable, str(REPO / "cli.py"), "fit", "--config", BASELINE, *TINY_LM,
              f"--data.text_file={corpus}", "--data.num_workers=2", "--trainer.max_epochs=2",
              "--trainer.max_steps=-1", "--trainer.val_check_interval=null", "--trainer.limit_val_batches=0",
              "--checkpoint.every_n_train_steps=1", "--checkpoint.save_top_k=-1"]
    (tmp_path / "whole").mkdir()
    whole = run(common, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    steps = sorted((tmp_path / "whole").glob("runs/*/*/checkpoints/*step=7*.ckpt"))
    assert steps, sorted(p.name for p in (tmp_path / "whole").glob("runs/*/*/checkpoints/*"))
    (tmp_path / "resumed").mkdir()
    resumed = run([*common, f"--ckpt_path={steps[0]}"], tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, final = final_state(tmp_path / "whole"), final_state(tmp_path / "resumed")
    assert final["global_step"] == expected["global_step"] == 10
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(final["state_dict"][name], tensor), name
