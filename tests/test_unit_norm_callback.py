"""The unit-norm renormalisation through a real Trainer: before training, on resume, once per optimizer step."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from arch_plugins.constraints import unit_norm_parameters
from lit.callbacks import RenormalizeUnitNormWeights
from lit.errors import UserInputError
from lit.language_model import LanguageModel
from lit.models import TransformerConfig

VOCAB, T = 23, 16


def tiny_lm(norm="hypersphere", residual="ngpt") -> LanguageModel:
    arch = TransformerConfig(d_model=32, n_layers=2, n_heads=2, norm=norm, residual=residual, init_std=0.3)
    return LanguageModel(vocab_size=VOCAB, block_size=T, arch=arch, lr=3e-2, weight_decay=0.0, warmup_steps=0)


def batches(n: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (n * 4, T + 1), generator=g)
    return DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=4)


def trainer(max_steps: int, callbacks=(), **kw) -> L.Trainer:
    return L.Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks), **kw)


def max_norm_error(model: torch.nn.Module) -> float:
    return max((p.detach().norm(dim=dim) - 1).abs().max().item() for _, p, dim in unit_norm_parameters(model))


class CheckUnitNorm(L.Callback):
    """Records the norm error at the first batch, right after each optimizer update, and after each step."""

    def __init__(self):
        self.at_start: float | None = None
        self.before_renorm: list[float] = []
        self.after_step: list[float] = []
        self._seen_step = 0

    def on_train_start(self, trainer, pl_module):
        # Registered before the renormalisation's own hook (trainer callbacks run before the model's),
        # so this sees the raw optimizer update: proof that the invariant is not trivially true.
        trainer.optimizers[0].register_step_post_hook(
            lambda *_: self.before_renorm.append(max_norm_error(pl_module)))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.at_start is None:
            self.at_start = max_norm_error(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step > self._seen_step:
            self._seen_step = trainer.global_step
            self.after_step.append(max_norm_error(pl_module))


def test_fresh_model_is_not_on_the_sphere():
    assert max_norm_error(tiny_lm().model) > 0.1  # so "unit norm at the first batch" below is a real check


def test_unit_norm_before_training_and_after_every_step_with_accumulation():
    model, check = tiny_lm(), CheckUnitNorm()
    t = trainer(max_steps=3, callbacks=[check], accumulate_grad_batches=2)
    t.fit(model, batches(6))
    renorm = next(c for c in t.callbacks if isinstance(c, RenormalizeUnitNormWeights))
    assert t.global_step == 3
    assert renorm.steps_renormalized == 3  # once per optimizer step, not per micro-batch (6 batches)
    assert check.at_start < 1e-6
    assert len(check.before_renorm) == 3 and min(check.before_renorm) > 1e-3  # Adam steps leave the sphere
    assert len(check.after_step) == 3 and max(check.after_step) < 1e-6  # and are projected back every time


def test_callback_attached_only_when_some_weight_is_constrained():
    def renormalizers(model):
        return [c for c in model.configure_callbacks() if isinstance(c, RenormalizeUnitNormWeights)]

    assert len(renormalizers(tiny_lm())) == 1
    assert renormalizers(tiny_lm(norm="rmsnorm", residual="add")) == []


def test_fsdp1_is_refused_with_one_line():
    # Lightning's FSDPStrategy needs a GPU to run; its flat parameters would split rows, so refuse it upfront.
    with pytest.raises(UserInputError, match="ModelParallelStrategy"):
        RenormalizeUnitNormWeights().setup(SimpleNamespace(strategy=FSDPStrategy()), tiny_lm(), "fit")


def test_resume_renormalizes_the_restored_weights(tmp_path):
    model = tiny_lm()
    t = trainer(max_steps=2)
    t.fit(model, batches(4))
    path = tmp_path / "step2.ckpt"
    t.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=False)
    for name, _, _ in unit_norm_parameters(model):  # e.g. a checkpoint written by another tool
        ckpt["state_dict"][name] *= 3.0
    torch.save(ckpt, path)

    check = CheckUnitNorm()
    resumed = tiny_lm()
    trainer(max_steps=3, callbacks=[check]).fit(resumed, batches(4), ckpt_path=path, weights_only=False)
    assert check.at_start < 1e-6 and max(check.after_step) < 1e-6
