"""Random augmentation drawn from the sample's place in the training order, not from a worker's random stream.

A DataLoader worker draws each image's crop, flip, RandAugment ops and erased boxes from its own random stream,
whose seed depends on the number of workers, on how many iterators the loader has made, and on which images that
worker happened to load before. So a run resumed mid-epoch (a fresh loader), or run with another
``num_workers``, augments the same image differently. Here each sample is loaded under a seed that is a pure
function of (data seed, epoch, position in the epoch's global order) (``ResumableSampler(keyed=True)`` yields
``(index, key)`` pairs): augmentation is the same whatever the worker count, the world size or a resume, and the
copies of a repeated image (repeated augmentation) sit at different positions, so they differ.

The three generators timm's and torchvision's transforms draw from (Python's ``random``, NumPy's global one,
torch's CPU generator) are seeded for the load and restored after it, so that loading in the training process
(``num_workers=0``) leaves the training's own random stream (dropout, batch mixing) untouched.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import Dataset

_MASK = (1 << 63) - 1


def sample_key(seed: int, epoch: int, position: int) -> int:
    """The seed of the sample at ``position`` of epoch ``epoch``'s global order (distinct for distinct triples
    up to 10^7 positions and 10^6 epochs)."""
    return ((int(seed) * 1_000_003 + int(epoch)) * 10_000_019 + int(position)) & _MASK


class SeededSamples(Dataset):
    """``dataset`` indexed by ``(index, key)``: item ``index``, loaded with every random generator seeded by ``key``."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item):
        index, key = item
        saved = random.getstate(), np.random.get_state(), torch.random.default_generator.get_state()
        try:
            random.seed(key)
            np.random.seed(key % (1 << 32))
            torch.random.default_generator.manual_seed(key)
            return self.dataset[index]
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.random.default_generator.set_state(saved[2])
