"""The training order: the same on any number of processes, and continued exactly after a resume.

Every epoch has one global order of samples, a seeded permutation. It is cut into global batches of
``batch_size x world_size`` samples, and rank r takes the r-th contiguous slice of each one. So the
global batch, and with it the averaged gradient, does not depend on how many processes share it: 2
ranks at batch 4 train on exactly what 1 process at batch 8 trains on, in the same order.

A run resumed from a checkpoint taken in the middle of an epoch continues the epoch where it
stopped: when an epoch's iteration starts, the sampler of ``train_loader`` asks the trainer which epoch
it is in and how many of its batches were already trained, and skips them. It asks then, not when the DataLoader
is built: a run bounded by ``max_epochs`` builds its DataLoader for ``estimated_stepping_batches`` (in
``configure_optimizers``) before Lightning restores the loop's progress from the checkpoint. Lightning's
own alternative, a stateful DataLoader, is asked for its state while one batch is already prefetched, so
it would skip one batch too many.

The sampler is a ``DistributedSampler``, so Lightning leaves it alone under DDP and FSDP2 instead of
wrapping it in its own (which would split every rank's share again).

Repeated augmentation (DeiT's default, Hoffer et al. 2020) lives in the same global order: each image of the
epoch's permutation appears ``repeats`` times in a row, and the order is cut back to the dataset's length, so an
epoch keeps its number of steps and sees about 1/``repeats`` of the images, each ``repeats`` times under fresh
augmentations (the transform draws anew at every load). timm's ``RepeatAugSampler`` deals the copies to
different ranks; here they usually share a rank's slice, which leaves the global batch, and so the averaged
gradient, the same whatever the world size.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lit.data.seeded_samples import SeededSamples, sample_key


class ResumableSampler(DistributedSampler):
    """This rank's share of a seeded, world-size-independent training order that can start mid-epoch.

    Args:
        dataset: the training set (only its length is used).
        batch_size: samples per batch on each rank.
        num_replicas: number of processes (the trainer's world size).
        rank: this process's global rank.
        shuffle: a new permutation every epoch (``set_epoch``); otherwise the dataset order.
        seed: base of the per-epoch permutation; the same on every rank.
        drop_last: drop the last incomplete global batch; otherwise it is padded (with samples from the
            start of the order) to a multiple of the world size, so every rank steps the same number of times.
        repeats: copies of each image in a row (repeated augmentation; 1: off). Only with ``shuffle``.
        keyed: yield ``(index, key)`` pairs, ``key`` a seed fixed by (seed, epoch, position in the global order),
            for ``lit.data.seeded_samples.SeededSamples`` (augmentation that resumes exactly).
    """

    def __init__(self, dataset: Dataset, batch_size: int, num_replicas: int = 1, rank: int = 0,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = True, repeats: int = 1, keyed: bool = False):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        if not (isinstance(repeats, int) and repeats >= 1):
            raise ValueError(f"repeats must be a whole number >= 1, got {repeats!r}")
        self.batch_size, self.repeats, self.keyed = batch_size, repeats, keyed
        self._skip_batches = 0
        # Asked at the start of each iteration: (epoch, batches of it already trained) in a resumed run, else 0
        # batches. The epoch too: Lightning starts a resumed run's iterator before it sets the sampler's epoch.
        self.resume_point: Callable[[], tuple[int, int]] | None = None
        global_batch = batch_size * num_replicas
        n = len(dataset)
        self.total_size = n // global_batch * global_batch if drop_last else n + (-n) % num_replicas
        self.num_samples = self.total_size // num_replicas

    def resume_at(self, batches: int) -> None:
        """Start the next iteration after ``batches`` batches of this epoch (once; later epochs are whole)."""
        self._skip_batches = batches

    def global_order(self) -> list[int]:
        n = len(self.dataset)
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            permutation = torch.randperm(n, generator=generator)
            # The epoch's first ceil(n / repeats) images, each ``repeats`` times in a row: still n samples.
            order = permutation.repeat_interleave(self.repeats)[:n].tolist()
        else:
            order = list(range(n))
        while len(order) < self.total_size:  # padding (drop_last=False); a tiny set may need several rounds
            order += order[: self.total_size - len(order)]
        return order[: self.total_size]

    def __iter__(self) -> Iterator[int] | Iterator[tuple[int, int]]:
        skip_batches, self._skip_batches = self._skip_batches, 0
        if not skip_batches and self.resume_point is not None:
            epoch, done = self.resume_point()
            # A checkpoint at the very end of an epoch resumes at the next one, whole.
            if 0 < done < -(-len(self) // self.batch_size):
                self.epoch, skip_batches = epoch, done
        order, global_batch = self.global_order(), self.batch_size * self.num_replicas
        mine: list[int] = []  # this rank's positions in the global order
        for start in range(0, len(order), global_batch):
            share = len(order[start: start + global_batch]) // self.num_replicas
            first = start + self.rank * share
            mine += range(first, first + share)
        skip = skip_batches * self.batch_size
        if self.keyed:
            return iter([(order[p], sample_key(self.seed, self.epoch, p)) for p in mine[skip:]])
        return iter([order[p] for p in mine[skip:]])

    def __len__(self) -> int:
        return self.num_samples  # the whole epoch, also when resuming: Lightning counts batches per epoch


def training_seed(datamodule=None) -> int:
    """The seed of the training order: the DataModule's own ``seed`` (``--data.seed``) when it has one,
    else the run's seed (``seed_everything`` exports it to every process).

    A data seed apart from the init seed lets two architectures see the same batches in the same order
    (paired comparisons), whatever each draws at init, and lets one vary init and order separately.
    """
    seed = getattr(datamodule, "seed", None)
    return int(os.environ.get("PL_GLOBAL_SEED", 0)) if seed is None else int(seed)


def batches_done_this_epoch(trainer) -> int:
    """Batches of the current epoch already trained: non-zero only while resuming a mid-epoch checkpoint."""
    if trainer is None or not trainer.fit_loop.restarting:
        return 0
    return trainer.fit_loop.epoch_loop.batch_progress.current.processed


def train_loader(datamodule, dataset: Dataset, batch_size: int, drop_last: bool = True, repeats: int = 1,
                 seeded_samples: bool = False, **loader_kwargs) -> DataLoader:
    """The training DataLoader of a DataModule: this rank's share of the order (each image ``repeats`` times in
    a row: repeated augmentation), resumed mid-epoch if needed; with ``seeded_samples``, each sample loaded under
    a seed fixed by its place in the order (augmentation that resumes exactly: ``lit/data/seeded_samples.py``)."""
    trainer = getattr(datamodule, "trainer", None)
    world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
    seed = training_seed(datamodule)
    sampler = ResumableSampler(dataset, batch_size, world, rank, seed=seed, drop_last=drop_last, repeats=repeats,
                               keyed=seeded_samples)
    # Lightning warns that a mid-epoch resume loses the data position unless the DataLoader is stateful;
    # this one resumes through its sampler, so the warning would be wrong.
    warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")
    if trainer is not None:
        sampler.resume_point = lambda: (trainer.current_epoch, batches_done_this_epoch(trainer))
    # Its own generator: a DataLoader draws its workers' base seed from the global RNG at every new
    # iterator, which would shift dropout's random stream differently in a resumed run.
    generator = torch.Generator().manual_seed(seed)
    if seeded_samples:
        dataset = SeededSamples(dataset)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, generator=generator, **loader_kwargs)
