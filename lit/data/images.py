"""What every image DataModule shares: the facts the model needs, and timm's batch-level mixing.

Mixup/CutMix and label smoothing act on whole batches (timm's ``Mixup``), so they run in
``on_after_batch_transfer``, on the device, during training only. They turn class indices into
probability targets; the classifier's cross-entropy takes either, so it never needs to know.
"""

from __future__ import annotations

import lightning as L
import torch
from timm.data import Mixup
from timm.data.mixup import mixup_target


class ImageDataModule(L.LightningDataModule):
    """Base of the image DataModules. Subclasses set ``num_classes``, ``image_size`` and ``in_chans`` in __init__.

    Args:
        mixup: Mixup alpha (0: off).
        cutmix: CutMix alpha (0: off).
        mix_prob: probability of mixing a batch when mixup or cutmix is on.
        label_smoothing: smoothing of the training targets (with or without mixing).
        seed: seed of the training order; None follows ``seed_everything`` (see ``lit.data.resumable``).
    """

    num_classes: int
    image_size: int
    in_chans: int

    def __init__(self, mixup: float = 0.0, cutmix: float = 0.0, mix_prob: float = 1.0, label_smoothing: float = 0.0,
                 seed: int | None = None):
        super().__init__()
        self.seed = seed
        self.mixup, self.cutmix, self.mix_prob, self.label_smoothing = mixup, cutmix, mix_prob, label_smoothing
        self._mixer: Mixup | None = None

    def _mix(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mixup > 0 or self.cutmix > 0:
            if self._mixer is None:
                self._mixer = Mixup(mixup_alpha=self.mixup, cutmix_alpha=self.cutmix, prob=self.mix_prob,
                                    label_smoothing=self.label_smoothing, num_classes=self.num_classes)
            return self._mixer(images, labels)
        if self.label_smoothing > 0:
            return images, mixup_target(labels, self.num_classes, smoothing=self.label_smoothing)
        return images, labels

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.training:
            images, labels = batch
            return self._mix(images, labels)
        return batch
