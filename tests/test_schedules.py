"""Learning-rate schedules: warmup-stable-decay's shapes, and cooldown branches equal fresh runs."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from lit.cli import main
from lit.errors import UserInputError
from lit.schedules import check, multiplier, warmup_stable_decay
from tests.conftest import REPO, TINY_LM

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")


def wsd(step, total=100, warmup=10, shape="linear", fraction=0.2, steps=None, floor=0.0):
    return warmup_stable_decay(step, warmup_steps=warmup, total_steps=total, min_lr_ratio=floor,
                               cooldown_fraction=fraction, cooldown_steps=steps, cooldown_shape=shape)


@pytest.mark.parametrize("shape, at_half", [("linear", 0.5), ("1-sqrt", 1 - math.sqrt(0.5)), ("cosine", 0.5)])
def test_wsd_warms_up_holds_and_cools_down_in_its_shape(shape, at_half):
    assert [wsd(s, shape=shape) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]  # linear warmup over 10 steps
    assert all(wsd(s, shape=shape) == 1.0 for s in range(10, 81))  # stable until the last 20 steps
    assert wsd(90, shape=shape) == pytest.approx(at_half)  # halfway through the cooldown
    assert wsd(99, shape=shape) < wsd(95, shape=shape) < wsd(85, shape=shape) < 1.0
    assert wsd(90, shape=shape, floor=0.1) == pytest.approx(0.1 + 0.9 * at_half)
    assert wsd(80, shape="cosine") == 1.0 and wsd(81, shape="cosine") < 1.0


def test_the_cooldown_may_be_a_number_of_steps_and_is_placed_from_the_end():
    assert [wsd(s, total=50, steps=10) for s in (39, 40, 45)] == [1.0, 1.0, 0.5]
    assert [wsd(s, total=500, steps=10) for s in (489, 490, 495)] == [1.0, 1.0, 0.5]
    assert wsd(3, total=10, warmup=8, fraction=0.5) == pytest.approx(0.5)  # overlap: the smaller of the two
    assert wsd(7, total=10, warmup=8, fraction=0.5) == pytest.approx(0.6)  # cooldown 2/5 through


def test_schedule_options_are_checked_in_one_line():
    assert check("wsd", {"cooldown_shape": "1-sqrt"})["cooldown_fraction"] == 0.2
    for schedule, options, message in [("wsd", {"cooldown_fration": 0.2}, "no option 'cooldown_fration'"),
                                       ("wsd", {"cooldown_fraction": 1.5}, "fraction of the run"),
                                       ("wsd", {"cooldown_shape": "sqrt"}, "is not one of linear, 1-sqrt, cosine"),
                                       ("cosine", {"cooldown_fraction": 0.2}, "takes no schedule_options"),
                                       ("step", None, "unknown schedule 'step'")]:
        with pytest.raises(UserInputError, match=message):
            check(schedule, options)


def test_the_cosine_schedule_is_unchanged():
    from lit.optim import warmup_cosine

    factor = multiplier("cosine", None, warmup_steps=5, total_steps=50, min_lr_ratio=0.1)
    assert [factor(s) for s in range(60)] == [warmup_cosine(s, 5, 50, 0.1) for s in range(60)]


# --- cooldown branches -------------------------------------------------------------------------------------------

class StopAtStep(L.Callback):
    """Ends a run after ``step`` optimizer steps, as if it had been stopped there (its checkpoint is the last)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


WSD = ["--model.schedule=wsd", "--model.schedule_options={cooldown_fraction: 0.5, cooldown_shape: 1-sqrt}",
       "--model.warmup_steps=2", "--model.min_lr_ratio=0.0", "--model.arch.dropout=0.1"]


def fit(*extra: str) -> None:
    main(["fit", "--config", BASELINE, *TINY_LM, *WSD, "--trainer.val_check_interval=null",
          "--trainer.limit_val_batches=0", "--trainer.logger=false", "--checkpoint.every_n_train_steps=1",
          "--checkpoint.save_top_k=-1", "--checkpoint.dirpath=ckpt", "--checkpoint.filename={step}", *extra])


def stopper(step: int) -> str:
    return f"--trainer.callbacks=[{{class_path: tests.test_schedules.StopAtStep, init_args: {{step: {step}}}}}]"


def test_a_cooldown_branch_from_a_stable_checkpoint_equals_a_fresh_run(workdir, capsys):
    # The long run (24 steps) is stable from step 2 until step 12: its checkpoint at step 3 branches into a run of
    # 8 steps whose 1-sqrt cooldown (the last 4) a fresh 8-step run also takes.
    fit("--trainer.max_steps=24", stopper(6))
    fit("--trainer.max_steps=8", "--ckpt_path=ckpt/step=3.ckpt", "--checkpoint.dirpath=branch")
    branch = torch.load(workdir / "branch" / "last.ckpt", weights_only=True)
    fit("--trainer.max_steps=8", "--checkpoint.dirpath=fresh")
    fresh = torch.load(workdir / "fresh" / "last.ckpt", weights_only=True)
    assert branch["global_step"] == fresh["global_step"] == 8
    for name, expected in fresh["state_dict"].items():
        assert torch.equal(branch["state_dict"][name], expected), name
    for i, state in fresh["optimizer_states"][0]["state"].items():
        assert torch.equal(branch["optimizer_states"][0]["state"][i]["exp_avg"], state["exp_avg"])
    assert branch["lr_schedulers"][0]["_last_lr"] == fresh["lr_schedulers"][0]["_last_lr"]

    # From step 6, after the branch's cooldown began (step 4; its first step is still at the peak), the branch
    # would not be the run it claims to be.
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        fit("--trainer.max_steps=8", "--ckpt_path=ckpt/step=6.ckpt", "--checkpoint.dirpath=late")
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "differs at step 5" in errors[0] and "cooldown branch" in errors[0], errors
