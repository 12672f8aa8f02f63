"""The procedures on a trained model, end to end from a tiny trained pre-LayerNorm checkpoint: ``convert-norm``
(Pre-RMSNorm / Pre-CRMSNorm, equal logits) and ``remove-norms`` (LayerNorm-free by fine-tuning); their one-line
refusals; and the training-progress hooks through a real fit (once per optimizer step, resume keeps BHyT's state)."""

from __future__ import annotations

import json

import pytest
import torch

from lit.commands import main
from lit.language_model import LanguageModel
from lit.models.transformer import TransformerConfig
from lit.procedures.checkpoint_io import read_trained_lm, write_lm_checkpoint
from lit.procedures.remove_norms import FakeLayerNorm, RemovalSchedule
from tests.conftest import REPO

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
TINY = ["--model.arch.d_model=16", "--model.arch.n_layers=2", "--model.arch.n_heads=2", "--data.block_size=16",
        "--data.batch_size=2", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--trainer.logger=false", "--trainer.limit_val_batches=2", "--model.diagnostics.interval=0"]


def fit(tmp, name: str, *extra: str) -> str:
    main(["fit", "--config", BASELINE, *TINY, f"--checkpoint.dirpath={tmp / name}", *extra])
    return str(tmp / name / "last.ckpt")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A pre-LayerNorm GPT after a few steps, as a checkpoint."""
    tmp = tmp_path_factory.mktemp("trained")
    return fit(tmp, "ln", "--model.arch.norm=layernorm", "--trainer.max_steps=4", "--trainer.val_check_interval=4")


@pytest.fixture(scope="module")
def trained_loss(trained):
    return validate(trained)


def validate(ckpt: str) -> float:
    cli = main(["validate", "--config", BASELINE, *TINY, f"--ckpt_path={ckpt}"])
    return cli.trainer.callback_metrics["val/loss"].item()


@pytest.mark.parametrize("target", ["prermsnorm", "precrmsnorm"])
def test_convert_norm_keeps_the_logits_and_writes_a_checkpoint_validate_and_init_from_read(target, trained, workdir,
                                                                                           trained_loss, capsys):
    out = workdir / f"{target}.ckpt"
    main(["convert-norm", trained, "--to", target, "--out", str(out)])
    assert "max |logit difference|" in capsys.readouterr().out
    source, converted = read_trained_lm(trained, "t"), read_trained_lm(out, "t")
    assert converted.arch.norm == target and source.arch.norm == "layernorm"
    tokens = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(5))
    before, after = source.load().eval(), converted.load().eval()
    torch.testing.assert_close(after(tokens), before(tokens), atol=1e-5, rtol=1e-5)
    assert validate(str(out)) == pytest.approx(trained_loss, abs=1e-5)
    main(["fit", "--config", BASELINE, *TINY, f"--model.init_from={out}", f"--model.arch.norm={target}",
          "--model.arch.norm_options={eps: 1.0e-5, affine: true}", "--trainer.max_steps=1",
          f"--checkpoint.dirpath={workdir / 'again'}"])


def checkpoint_of(workdir, **arch) -> str:
    module = LanguageModel(vocab_size=65, block_size=16, arch=TransformerConfig(d_model=16, n_layers=1, n_heads=2,
                                                                                **arch))
    module.hparams["_class_path"] = "lit.language_model.LanguageModel"
    source = type("Source", (), {"hparams": dict(module.hparams), "checkpoint": {}})()
    return str(write_lm_checkpoint(source, module, module.hparams.arch, workdir / f"{arch['norm']}.ckpt"))


@pytest.mark.parametrize("command", [["convert-norm", "--to", "prermsnorm"], ["remove-norms"]])
@pytest.mark.parametrize("arch", [dict(norm="hypersphere", residual="ngpt"), dict(norm="postnorm")])
def test_a_checkpoint_the_procedure_cannot_handle_is_one_error_line(command, arch, workdir, capsys):
    ckpt = checkpoint_of(workdir, **arch)
    with pytest.raises(SystemExit) as exit_info:
        main([command[0], ckpt, *command[1:], "--out", str(workdir / "out.ckpt")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and arch["norm"] in err[0]
    assert not (workdir / "out.ckpt").exists()


def test_removal_schedule_is_the_references_for_gpt2_small():
    s = RemovalSchedule(12)  # config.py make_gpt2_standard: start_ln1qk 44, start_ln1v 68, start_lnf 104
    assert (s.mlp(0), s.mlp(11), s.qk(0), s.v(0), s.v(11), s.final()) == (20, 42, 44, 68, 101, 104)


def test_fake_layernorm_freezes_sigma_when_its_last_path_goes_fake():
    norm = torch.nn.LayerNorm(4)
    fake = FakeLayerNorm(norm, init_std=1.0, switch_at={"qk": 2, "v": 3})
    x = torch.tensor([[1.0, -1.0, 3.0, -3.0]])  # std 2.236
    from arch_plugins.progress import TrainingProgress
    fake.on_progress(TrainingProgress(2, 10))
    fake(x, "v")  # the v path is still real: sigma follows the EMA (0.9 * 1 + 0.1 * 2.236)
    assert fake.frozen_std.item() == pytest.approx(0.9 + 0.1 * (5.0 + 1e-5) ** 0.5)
    torch.testing.assert_close(fake(x, "qk"), (x - x.mean()) / fake.frozen_std)
    fake.on_progress(TrainingProgress(3, 10))
    frozen = fake.frozen_std.item()
    fake(x, "v"), fake(x * 10, "qk")
    assert fake.frozen_std.item() == frozen and fake.real_std.item() != frozen  # the EMA goes on, sigma is frozen


def test_remove_norms_end_to_end_exports_a_model_with_no_norms(trained, workdir, capsys):
    out, report = workdir / "lnfree.ckpt", workdir / "report.json"
    steps = RemovalSchedule(2).final() + 1
    main(["remove-norms", trained, "--out", str(out), "--steps", str(steps), "--batch-size", "2", "--val-batches", "4",
          "--json", str(report)])
    losses = json.loads(report.read_text())
    assert set(losses) >= {"before", "lnfree", "exported"}
    assert losses["exported"] == pytest.approx(losses["lnfree"], abs=1e-4)
    exported = read_trained_lm(out, "t").load()
    assert exported.hparams.arch.norm == "lnfree"
    assert not any(isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm, FakeLayerNorm)) for m in exported.modules())
    assert "LayerNorm-free after" in capsys.readouterr().out
    validate(str(out))
    with pytest.raises(SystemExit):  # too few steps for the schedule: one line, nothing written
        main(["remove-norms", trained, "--out", str(workdir / "short.ckpt"), "--steps", "10"])
    assert "before the last norm goes fake" in capsys.readouterr().err


def test_progress_hooks_run_once_per_optimizer_step_and_resume_keeps_bhyt_state(workdir):
    bhyt = ["--model.arch.norm=bhyt", "--model.arch.norm_options={refresh_every: 3}", "--trainer.val_check_interval=2",
            "--trainer.accumulate_grad_batches=2"]
    cli = main(["fit", "--config", BASELINE, *TINY, *bhyt, "--trainer.max_steps=4", "--checkpoint.dirpath=full"])
    reported = [c.steps_reported for c in cli.trainer.callbacks if hasattr(c, "steps_reported")]
    assert reported == [4]  # 8 micro-batches, 4 optimizer steps
    main(["fit", "--config", BASELINE, *TINY, *bhyt, "--trainer.max_steps=2", "--checkpoint.dirpath=half"])
    main(["fit", "--config", BASELINE, *TINY, *bhyt, "--trainer.max_steps=4", "--checkpoint.dirpath=half",
          "--ckpt_path=half/last.ckpt"])
    full, resumed = (torch.load(f"{d}/last.ckpt", weights_only=False)["state_dict"] for d in ("full", "half"))
    c_attn = [k for k in full if k.endswith("c_attn")]
    assert c_attn and all(full[k] > 0 for k in c_attn)
    for key in full:  # c_attn as last refreshed at step 3, the weights, everything
        torch.testing.assert_close(resumed[key], full[key], msg=key)
