"""One split of an image shard directory (``cli.py prepare-images``, layout in ``lit/data/image_shard_format.py``)
as a map-style dataset: item ``i`` is the image folder's item ``i``, same bytes, same label.

Random access rather than streaming keeps what the folder path guarantees: the sampler picks any index in any
order (``lit/data/resumable.py``: world-size-independent order, repeated augmentation, a resume mid-epoch) and each
sample is augmented under its own seed (``lit/data/seeded_samples.py``). An image costs one positioned read in a
shard already open, where the folder path opens, reads and closes a file found by its path.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from lit.data.image_decoding import decode_rgb
from lit.data.image_shard_format import read_index, read_meta

# Shards a process keeps open at once (least recently used closed first): below the usual 1,024 descriptors, and
# ImageNet's train split is ~140 shards of 1 GiB, so all of them stay open.
OPEN_SHARDS = 256


class ShardedImages(Dataset):
    """``(image, label)`` of split ``split`` of the shards in ``root``, the image decoded to RGB (as ImageFolder's
    loader does) and passed through ``transform``; ``UnreadableImage`` naming split, index and shard if it does not
    decode."""

    def __init__(self, root: str | Path, split: str, transform: Callable | None = None):
        self.root, self.split, self.transform = Path(root), split, transform
        meta = read_meta(self.root)
        self.classes: list[str] = meta["classes"]
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.shard_files = [self.root / shard["file"] for shard in meta["splits"][split]["shards"]]
        self._meta = meta
        self._rows: np.ndarray | None = read_index(self.root, meta, split)
        self._open: OrderedDict[int, int] = OrderedDict()  # shard number -> file descriptor, in this process
        self._pid = os.getpid()

    def __len__(self) -> int:
        return int(self._meta["splits"][self.split]["images"])

    @property
    def rows(self) -> np.ndarray:
        if self._rows is None:  # after unpickling in a spawned worker
            self._rows = read_index(self.root, self._meta, self.split)
        return self._rows

    @property
    def targets(self) -> list[int]:
        return self.rows["label"].astype(np.int64).tolist()

    def read(self, index: int) -> tuple[bytes, int]:
        """The image file's bytes, unchanged, and its label."""
        shard, label, offset, size = self.rows[index].item()
        return os.pread(self._descriptor(shard), size, offset), label

    def __getitem__(self, index: int):
        data, label = self.read(index)
        shard = self.shard_files[int(self.rows[index]["shard"])].name
        image = decode_rgb(data, f"{self.split} image {index} of the shards in {self.root} ({shard})")
        return (self.transform(image) if self.transform is not None else image), label

    def _descriptor(self, shard: int) -> int:
        if os.getpid() != self._pid:  # a forked worker: the parent's descriptors are the parent's to close
            self._open, self._pid = OrderedDict(), os.getpid()
        if shard in self._open:
            self._open.move_to_end(shard)
            return self._open[shard]
        if len(self._open) >= OPEN_SHARDS:
            os.close(self._open.popitem(last=False)[1])
        self._open[shard] = os.open(self.shard_files[shard], os.O_RDONLY)
        return self._open[shard]

    def __getstate__(self) -> dict:
        # A spawned worker maps the index and opens the shards itself.
        return {**self.__dict__, "_rows": None, "_open": OrderedDict()}

    def __del__(self) -> None:
        if getattr(self, "_pid", None) == os.getpid():
            for descriptor in self._open.values():
                os.close(descriptor)
