"""ImageClassifier: a ViT assembled from plugins, trained with cross-entropy on hard or mixed targets.

DeiT's training extras live here as options: an EMA of the weights (timm's ``ModelEmaV3``), validated and logged
beside the raw model (``val_ema/*``) and saved in checkpoints; a learning rate given per ``lr_batch_size`` images
and warmup in epochs, both resolved from the global batch (processes x batch x accumulation) when the optimizer is
built, and logged as resolved (``train/peak_lr``, ``train/warmup_steps``); layer-wise lr decay for fine-tuning
(``lit/layer_decay.py``).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from timm.utils import ModelEmaV3
from torchmetrics.classification import MulticlassAccuracy

from lit.compile_mode import CompileOption
from lit.compute import vit_flops_per_image
from lit.diagnostics import DiagnosticsConfig
from lit.errors import UserInputError
from lit.init_from import Growth, load_initial_weights
from lit.layer_decay import declare_layer_decay
from lit.log_steps import is_log_step
from lit.models.transformer import TransformerConfig
from lit.models.vit import VIT_ARCH, ViT, with_variant
from lit.optim import select_optimizer, with_installed_optimizers
from lit.schedules import multiplier
from lit.task import EXECUTION_OPTIONS, ArchitectureTask


class ImageClassifier(ArchitectureTask):
    """Image classification. Never looks inside the architecture: ``arch`` (and ``variant``) say it all.

    Args:
        num_classes: linked from the DataModule.
        image_size: linked from the DataModule.
        in_chans: linked from the DataModule.
        arch: the transformer stack and its plugins (ViT defaults: layernorm, GELU MLP, biases).
        variant: a standard ViT size (tiny, small, base, large) that sets d_model, n_layers and n_heads of
            ``arch``; None keeps ``arch`` as given.
        patch_size: side of the square patches.
        pooling: ``cls`` token or ``mean`` of the final tokens.
        pos_embed: ``learned`` (ViT/DeiT), ``sincos`` (fixed 2-D, MAE) or ``none``.
        lr: peak learning rate; with ``lr_batch_size``, the rate for a global batch of that many images.
        lr_batch_size: scale ``lr`` linearly with the global batch (processes x batch x accumulation):
            the run's peak rate is ``lr * global_batch / lr_batch_size`` (DeiT: 5e-4 per 512). None: ``lr`` as given.
        weight_decay: AdamW decay of matrices (vectors never decay).
        betas: AdamW betas.
        warmup_steps: linear warmup length in optimizer steps (unless ``warmup_epochs`` is set).
        warmup_epochs: linear warmup length in epochs of the training set, turned into steps for this run's
            global batch (DeiT: 5); None: ``warmup_steps``.
        min_lr_ratio: the cosine ends at ``lr * min_lr_ratio``.
        optimizer: the optimizer, one of the installed <optimizers>, routed by parameter role
            (``python cli.py plugins NAME`` shows its options).
        optimizer_options: its options, e.g. ``{lr_multipliers: {embedding: 0.3, head: 0.003125}}``
            (docs/optimizers.md).
        schedule: the learning-rate schedule: ``cosine`` (warmup + cosine) or ``wsd`` (warmup-stable-decay).
        schedule_options: ``wsd``'s ``cooldown_fraction`` (0.2), ``cooldown_steps`` (instead of the fraction) and
            ``cooldown_shape`` (``linear``, ``1-sqrt``, ``cosine``); it cools down to ``lr * min_lr_ratio``.
        init_from: a checkpoint whose weights start this run (optimizer and step start fresh): a Lightning
            checkpoint (a TokenFormer one with fewer parameter tokens grows into this model), or a timm/DeiT ViT
            file (``.pth``/``.bin``/``.safetensors``), whose head is re-initialised when the class count differs.
        layer_decay: layer-wise lr decay for fine-tuning (``lit/layer_decay.py``; e.g. 0.65-0.75); None: off.
        ema_decay: keep an EMA of the weights with this decay per optimizer step (DeiT: 0.99996), validated
            beside the raw model as ``val_ema/*`` and saved in checkpoints; None: off.
        growth: how parameter tokens are added when growing.
        compile: ``false``, ``true``, ``reduce-overhead`` or ``auto`` (the default; lit/compile_mode.py).
        activation_checkpointing: recompute each block's activations in backward
            (recipes/trainer/activation_checkpointing.yaml).
        diagnostics: ``diag/*`` metrics every ``interval`` steps (``--model.diagnostics.interval=0``: off).
        random_numbers: how the run's random numbers are drawn: ``construction_order`` (seed once, then build:
            PyTorch's default) or ``by_name`` (each parameter's init keyed by its name, dropout by module and
            batch, so that variants start identical in what they share; what ``cli.py sweep`` uses).
    """

    def __init__(self, num_classes: int = 1000, image_size: int = 224, in_chans: int = 3,
                 arch: TransformerConfig = VIT_ARCH, variant: Literal["tiny", "small", "base", "large"] | None = None,
                 patch_size: int = 16, pooling: Literal["cls", "mean"] = "cls",
                 pos_embed: Literal["learned", "sincos", "none"] = "learned", lr: float = 1e-3,
                 lr_batch_size: int | None = None,
                 weight_decay: float = 0.05, betas: tuple[float, float] = (0.9, 0.999), warmup_steps: int = 100,
                 warmup_epochs: float | None = None, min_lr_ratio: float = 0.01,
                 optimizer: str = "adamw", optimizer_options: dict[str, Any] | None = None,
                 schedule: str = "cosine", schedule_options: dict[str, Any] | None = None,
                 init_from: str | None = None, growth: Growth = Growth(), layer_decay: float | None = None,
                 ema_decay: float | None = None, compile: CompileOption = "auto",
                 activation_checkpointing: bool = False,
                 diagnostics: DiagnosticsConfig = DiagnosticsConfig(),
                 random_numbers: Literal["construction_order", "by_name"] = "construction_order"):
        super().__init__(compile=compile, activation_checkpointing=activation_checkpointing, items="images",
                         diagnostics=diagnostics)
        self.check_optimizer(optimizer, optimizer_options, schedule, schedule_options)
        _check_deit_options(lr_batch_size, warmup_epochs, layer_decay, ema_decay)
        self.save_hyperparameters(logger=False, ignore=EXECUTION_OPTIONS)
        self.model = self.build_model(
            lambda: ViT(num_classes, image_size, patch_size, in_chans, with_variant(arch, variant), pooling, pos_embed),
            random_numbers)
        if init_from is not None:
            load_initial_weights(self, init_from, growth)
        if layer_decay is not None:
            declare_layer_decay(self.model, layer_decay)
        top5 = min(5, num_classes)
        self.val_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")
        self.test_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.test_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")
        # The EMA is built in setup (after init_from, before compile or sharding wrap the model) and kept out of
        # this module's registered children (``__dict__``): the optimizer, the role table, parameter counts,
        # ``init_from`` and the weights a checkpoint's ``state_dict`` holds stay the raw model's alone; the EMA
        # travels in the checkpoint under its own key.
        self.__dict__["ema"] = None
        if ema_decay is not None:
            self.val_ema_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
            self.val_ema_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")
            self.test_ema_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
            self.test_ema_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)

    def training_flops_per_item(self) -> float:
        return vit_flops_per_image(self.model, self.hparams.image_size, self.hparams.in_chans)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, targets = batch
        logits = self(images)
        # Class indices or probabilities (Mixup/CutMix, label smoothing): cross_entropy takes both.
        loss = F.cross_entropy(logits.float(), targets)
        self.log_training_step(loss, images.shape[0])
        labels = targets.argmax(dim=-1) if targets.is_floating_point() else targets
        # The batch's top-1 accuracy as a device tensor, not through a torchmetrics object: one resets its state from
        # host defaults at every call, a host-to-device copy per step (tests/test_syncs.py).
        self.log("train/acc", (logits.argmax(dim=-1) == labels).float().mean())
        if is_log_step(self.trainer):
            self._log_skipped_images()
        return loss

    def on_train_epoch_end(self) -> None:
        super().on_train_epoch_end()
        self._log_skipped_images()  # the epoch's last skips, after its last log step

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        self._log_skipped_images()

    def _log_skipped_images(self) -> None:
        """``data/skipped_images``: image loads skipped because the file did not decode, so far in this run (every
        split; ``lit/data/bad_images.py``), summed over processes. A host count; only the sum across processes
        touches the device, and only at log steps and epoch ends, which all processes reach together."""
        ledger = getattr(self.trainer.datamodule, "bad_images", None) if self.trainer.datamodule is not None else None
        if ledger is None:
            return
        count = float(ledger.skipped)
        if self.trainer.world_size > 1:
            count = float(self.trainer.strategy.reduce(torch.tensor(count, device=self.device), reduce_op="sum"))
        self._log_host("data/skipped_images", count)

    def validation_step(self, batch, batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.log("val/loss", F.cross_entropy(logits.float(), labels), prog_bar=True, sync_dist=True)
        self.val_acc1(logits, labels)
        self.val_acc5(logits, labels)
        self.log("val/acc1", self.val_acc1, prog_bar=True)
        self.log("val/acc5", self.val_acc5)
        if self.ema is not None:
            ema_logits = self._ema_on(images.device)(images)
            self.log("val_ema/loss", F.cross_entropy(ema_logits.float(), labels), sync_dist=True)
            self.val_ema_acc1(ema_logits, labels)
            self.val_ema_acc5(ema_logits, labels)
            self.log("val_ema/acc1", self.val_ema_acc1)
            self.log("val_ema/acc5", self.val_ema_acc5)

    def test_step(self, batch, batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.record_test_examples(loss=F.cross_entropy(logits.float(), labels, reduction="none"),
                                  acc1=(logits.argmax(-1) == labels).float())
        self.log("test/loss", F.cross_entropy(logits.float(), labels), sync_dist=True)
        self.test_acc1(logits, labels)
        self.test_acc5(logits, labels)
        self.log("test/acc1", self.test_acc1)
        self.log("test/acc5", self.test_acc5)
        if self.ema is not None:
            ema_logits = self._ema_on(images.device)(images)
            self.log("test_ema/loss", F.cross_entropy(ema_logits.float(), labels), sync_dist=True)
            self.test_ema_acc1(ema_logits, labels)
            self.test_ema_acc5(ema_logits, labels)
            self.log("test_ema/acc1", self.test_ema_acc1)
            self.log("test_ema/acc5", self.test_ema_acc5)

    # --- the EMA of the weights -------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        super().setup(stage)
        decay = self.hparams.get("ema_decay")
        if decay is not None and self.ema is None:
            if self.device_mesh is not None:
                raise UserInputError("--model.ema_decay keeps a whole copy of the model on every process; it does "
                                     "not work with a sharded model (FSDP2): use DDP, or set --model.ema_decay=null")
            # fp32 whatever the training precision (Lightning's mixed precision keeps fp32 weights);
            # ``step`` from the trainer makes the decay a function of the step, so a resumed run continues exactly.
            self.__dict__["ema"] = ModelEmaV3(self.model, decay=decay)

    def _ema_on(self, device: torch.device) -> torch.nn.Module:
        module = self.ema.module
        if next(module.parameters()).device != device:
            module.to(device)
        return module

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        # Here, once per optimizer step, rather than at the batch's end: Lightning runs callbacks' batch-end hooks
        # (ModelCheckpoint's included) before the module's, so a checkpoint of this step holds this step's EMA.
        if self.ema is not None:
            self._ema_on(self.device)
            self.ema.update(self.model, step=self.trainer.global_step + 1)  # counted after this hook

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.ema is not None:
            checkpoint["ema_state_dict"] = {k: v.detach().clone() for k, v in self.ema.state_dict().items()}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        if self.ema is not None and "ema_state_dict" in checkpoint:
            self.ema.load_state_dict(checkpoint["ema_state_dict"])

    # --- the optimizer, with the rate and warmup resolved for this run's global batch ----------------------------

    def resolved_lr_and_warmup(self, batches_per_epoch: int | None = None) -> tuple[float, int, int | None]:
        """(peak lr, warmup steps, global batch) of this run: ``lr`` scaled by global batch / ``lr_batch_size``,
        ``warmup_epochs`` turned into optimizer steps per epoch of this run."""
        hp, trainer = self.hparams, self.trainer
        batches_per_epoch = batches_per_epoch if batches_per_epoch is not None else self.training_batches_per_epoch()
        per_process = getattr(trainer.datamodule, "batch_size", None) if trainer.datamodule is not None else None
        accumulate = trainer.accumulate_grad_batches
        global_batch = int(per_process) * trainer.world_size * accumulate if per_process else None
        lr = hp.lr
        if hp.get("lr_batch_size") is not None:
            if global_batch is None:
                raise UserInputError("--model.lr_batch_size needs a DataModule with a batch_size to scale by")
            lr = hp.lr * global_batch / hp.lr_batch_size
        warmup = hp.warmup_steps
        if hp.get("warmup_epochs") is not None:
            if batches_per_epoch is None:
                raise UserInputError("--model.warmup_epochs needs a training set with a length; use warmup_steps")
            warmup = round(hp.warmup_epochs * math.ceil(batches_per_epoch / accumulate))
        return lr, warmup, global_batch

    def configure_optimizers(self):
        hp = self.hparams
        batches_per_epoch = self.training_batches_per_epoch()
        self._schedule_total_steps = total = self.stepping_batches(batches_per_epoch)
        lr, warmup, global_batch = self.resolved_lr_and_warmup(batches_per_epoch)
        for logger in self.loggers:
            logger.log_metrics({"train/peak_lr": lr, "train/warmup_steps": float(warmup)}, step=self.global_step)
        rank_zero_info(f"Learning rate {lr:.6g} and {warmup} warmup steps for a global batch of {global_batch}")
        built = select_optimizer(hp.get("optimizer", "adamw"), hp.get("optimizer_options")).build(
            self, lr=lr, weight_decay=hp.weight_decay, betas=tuple(hp.betas))
        factor = multiplier(hp.get("schedule", "cosine"), hp.get("schedule_options"), warmup_steps=max(warmup, 0),
                            total_steps=total, min_lr_ratio=hp.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(built, factor)
        return {"optimizer": built, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _check_deit_options(lr_batch_size, warmup_epochs, layer_decay, ema_decay) -> None:
    if lr_batch_size is not None and not (isinstance(lr_batch_size, int) and lr_batch_size > 0):
        raise UserInputError(f"--model.lr_batch_size is the global batch --model.lr is given for (DeiT: 512), a "
                             f"whole number > 0, or null; got {lr_batch_size!r}")
    if warmup_epochs is not None and not warmup_epochs >= 0:
        raise UserInputError(f"--model.warmup_epochs must be >= 0 (or null: use warmup_steps), got {warmup_epochs!r}")
    if layer_decay is not None and not 0 < layer_decay <= 1:
        raise UserInputError(f"--model.layer_decay is in (0, 1] (MAE fine-tunes ViT-B at 0.65), or null; "
                             f"got {layer_decay!r}")
    if ema_decay is not None and not 0 < ema_decay < 1:
        raise UserInputError(f"--model.ema_decay is in (0, 1) (DeiT: 0.99996), or null; got {ema_decay!r}")


ImageClassifier.__doc__ = with_installed_optimizers(ImageClassifier.__doc__)
