"""The embedded image set: scikit-learn's handwritten digits (1,797 real 8x8 scans, 10 classes).

It ships inside scikit-learn, so every image recipe runs on a fresh CPU machine with no download.
The splits are fixed, so runs compare: a seeded permutation (``split_seed``) of the 1,797 images; its first
20% (359 images) are the validation split, as before a test split existed; then the test split takes, from
the rest and in permutation order, the first ``round(test_fraction * n_class)`` images of each class
(stratified: 359 images at 20%, the class shares of the whole set); train is what is left (1,079 images).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from lit.data.images import ImageDataModule
from lit.data.resumable import train_loader
from lit.errors import UserInputError


class DigitsDataModule(ImageDataModule):
    """scikit-learn's digits as (1, 8, 8) images scaled to [-1, 1].

    Args:
        batch_size: images per batch.
        val_fraction: share of the images held out for validation.
        test_fraction: share of the images held out for test (stratified by class; 0: no test split).
        split_seed: seed of the fixed permutation the splits are cut from.
        mixup, cutmix, mix_prob, label_smoothing, seed: see ``ImageDataModule``.
    """

    def __init__(self, batch_size: int = 64, val_fraction: float = 0.2, split_seed: int = 0, mixup: float = 0.0,
                 cutmix: float = 0.0, mix_prob: float = 1.0, label_smoothing: float = 0.0, seed: int | None = None,
                 test_fraction: float = 0.2):
        super().__init__(mixup, cutmix, mix_prob, label_smoothing, seed)
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if not 0 <= test_fraction < 1 - val_fraction:
            raise ValueError(f"test_fraction must be in [0, 1 - val_fraction), got {test_fraction}")
        self.test_fraction, self.has_test_split = test_fraction, test_fraction > 0
        self.batch_size, self.val_fraction, self.split_seed = batch_size, val_fraction, split_seed
        self.num_classes, self.image_size, self.in_chans = 10, 8, 1

    def setup(self, stage: str | None = None) -> None:
        from sklearn.datasets import load_digits  # scikit-learn (and pandas with it) only when the digits are used

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0  # pixels are 0..16
        labels = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.split_seed))
        n_val = int(len(labels) * self.val_fraction)
        self.val_set = TensorDataset(images[order[:n_val]], labels[order[:n_val]])
        rest = order[n_val:]
        counts = torch.bincount(labels, minlength=self.num_classes)
        test = torch.zeros(len(rest), dtype=torch.bool)
        for c in range(self.num_classes):
            of_class = (labels[rest] == c).nonzero().flatten()
            test[of_class[:round(self.test_fraction * int(counts[c]))]] = True
        self.test_set = TensorDataset(images[rest[test]], labels[rest[test]])
        self.train_set = TensorDataset(images[rest[~test]], labels[rest[~test]])

    def train_dataloader(self) -> DataLoader:
        # drop_last: batch mixing pairs images within a batch and needs an even batch size.
        return train_loader(self, self.train_set, self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)

    def test_dataloader(self) -> DataLoader:
        if not self.has_test_split:
            raise UserInputError("--data.test_fraction is 0: these data have no test split; validate instead")
        return DataLoader(self.test_set, batch_size=256)
