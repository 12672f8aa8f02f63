"""ImageClassifier: a ViT assembled from plugins, trained with cross-entropy on hard or mixed targets."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy

from lit.compute import vit_flops_per_image
from lit.diagnostics import DiagnosticsConfig
from lit.init_from import Growth, load_initial_weights
from lit.models.transformer import TransformerConfig
from lit.models.vit import VIT_ARCH, ViT, with_variant
from lit.optim import with_installed_optimizers
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
        lr: peak learning rate.
        weight_decay: AdamW decay of matrices (vectors never decay).
        betas: AdamW betas.
        warmup_steps: linear warmup length.
        min_lr_ratio: the cosine ends at ``lr * min_lr_ratio``.
        optimizer: the optimizer, one of the installed <optimizers>, routed by parameter role
            (``python cli.py plugins NAME`` shows its options).
        optimizer_options: its options, e.g. ``{lr_multipliers: {embedding: 0.3, head: 0.003125}}``
            (docs/optimizers.md).
        schedule: the learning-rate schedule: ``cosine`` (warmup + cosine) or ``wsd`` (warmup-stable-decay).
        schedule_options: ``wsd``'s ``cooldown_fraction`` (0.2), ``cooldown_steps`` (instead of the fraction) and
            ``cooldown_shape`` (``linear``, ``1-sqrt``, ``cosine``); it cools down to ``lr * min_lr_ratio``.
        init_from: a checkpoint whose weights start this run (optimizer and step start fresh); a TokenFormer
            checkpoint with fewer parameter tokens grows into this model.
        growth: how parameter tokens are added when growing.
        compile: ``torch.compile`` each transformer block (recipes/trainer/compile.yaml).
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
                 weight_decay: float = 0.05, betas: tuple[float, float] = (0.9, 0.999), warmup_steps: int = 100,
                 min_lr_ratio: float = 0.01,
                 optimizer: str = "adamw", optimizer_options: dict[str, Any] | None = None,
                 schedule: str = "cosine", schedule_options: dict[str, Any] | None = None,
                 init_from: str | None = None, growth: Growth = Growth(),
                 compile: bool = False, activation_checkpointing: bool = False,
                 diagnostics: DiagnosticsConfig = DiagnosticsConfig(),
                 random_numbers: Literal["construction_order", "by_name"] = "construction_order"):
        super().__init__(compile=compile, activation_checkpointing=activation_checkpointing, items="images",
                         diagnostics=diagnostics)
        self.check_optimizer(optimizer, optimizer_options, schedule, schedule_options)
        self.save_hyperparameters(logger=False, ignore=EXECUTION_OPTIONS)
        self.model = self.build_model(
            lambda: ViT(num_classes, image_size, patch_size, in_chans, with_variant(arch, variant), pooling, pos_embed),
            random_numbers)
        if init_from is not None:
            load_initial_weights(self, init_from, growth)
        top5 = min(5, num_classes)
        self.train_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(num_classes, top_k=top5, average="micro")
        self.test_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")

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
        self.train_acc(logits, targets.argmax(dim=-1) if targets.is_floating_point() else targets)
        self.log("train/acc", self.train_acc)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.log("val/loss", F.cross_entropy(logits.float(), labels), prog_bar=True, sync_dist=True)
        self.val_acc1(logits, labels)
        self.val_acc5(logits, labels)
        self.log("val/acc1", self.val_acc1, prog_bar=True)
        self.log("val/acc5", self.val_acc5)

    def test_step(self, batch, batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.record_test_examples(loss=F.cross_entropy(logits.float(), labels, reduction="none"),
                                  acc1=(logits.argmax(-1) == labels).float())
        self.log("test/loss", F.cross_entropy(logits.float(), labels), sync_dist=True)
        self.test_acc1(logits, labels)
        self.log("test/acc1", self.test_acc1)


ImageClassifier.__doc__ = with_installed_optimizers(ImageClassifier.__doc__)
