"""Pre-tokenized token shards on disk, read through memmap (the nanoGPT / llm.c FineWeb layout).

A shard is a ``.bin`` file of token ids. Two layouts are read:

- llm.c / FineWeb: a 256 x int32 header ``[20240520, version, n_tokens, 0...]`` then the tokens;
  version 1 holds uint16 tokens (GPT-2 vocabulary), version 2 uint32 (larger vocabularies).
- nanoGPT: raw tokens with no header (``train.bin`` / ``val.bin``); their dtype comes from
  ``meta.json`` (``{"vocab_size": ..., "dtype": "uint16"}``) or defaults to uint16.

Shards belong to the train split when their name contains ``train`` and to val when it contains ``val``.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from lit.data.shard_format import HEADER_INTS, MAGIC, VERSION_DTYPES, ShardWriter, open_shard, write_shard
from lit.errors import UserInputError

__all__ = ["HEADER_INTS", "MAGIC", "VERSION_DTYPES", "ShardWriter", "TokenWindows", "find_shards", "open_shard",
           "read_meta", "write_shard"]


def read_meta(directory: Path) -> dict:
    meta = directory / "meta.json"
    return json.loads(meta.read_text()) if meta.exists() else {}


def find_shards(directory: str | Path, split: str) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        raise UserInputError(f"token shard directory {directory} does not exist; create it with "
                             f"`python cli.py prepare-data` or set --data.shards_dir")
    shards = sorted(p for p in directory.glob("*.bin") if split in p.name)
    if not shards:
        raise UserInputError(f"no '*{split}*.bin' shards in {directory}; each split needs at least one shard")
    return shards


class TokenWindows(Dataset):
    """Non-overlapping (input, target) windows of ``block_size`` tokens over a list of shards.

    Windows never cross a shard boundary (shards are separate documents streams). ``max_tokens`` keeps only
    the first that many predicted tokens, in shard order (a fixed validation set, as modded-nanogpt's first
    10,485,760 tokens of ``fineweb_val_000000.bin``).
    """

    def __init__(self, shards: list[Path], block_size: int, default_dtype: str = "uint16",
                 max_tokens: int | None = None):
        self.block_size = block_size
        self.arrays = [open_shard(p, default_dtype) for p in shards]
        if max_tokens is not None:
            self.arrays = first_tokens(self.arrays, max_tokens)
        counts = [max(0, (len(a) - 1) // block_size) for a in self.arrays]
        if sum(counts) == 0:
            raise UserInputError(f"shards {[str(p) for p in shards]} hold fewer than block_size+1="
                                 f"{block_size + 1} tokens; lower --data.block_size or add data")
        self.offsets = np.cumsum([0] + counts).tolist()

    def __len__(self) -> int:
        return self.offsets[-1]

    @property
    def n_predicted(self) -> int:
        """Tokens scored in one pass: every window predicts ``block_size`` of them."""
        return len(self) * self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = bisect.bisect_right(self.offsets, i) - 1
        start = (i - self.offsets[s]) * self.block_size
        chunk = torch.from_numpy(self.arrays[s][start:start + self.block_size + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


def first_tokens(arrays: list[np.ndarray], n: int) -> list[np.ndarray]:
    """The shards cut so that they hold the first ``n`` predicted tokens: ``n + 1`` tokens of a single shard
    (each window's targets are its inputs shifted by one), and the same counted per shard across several."""
    kept, remaining = [], n
    for array in arrays:
        if remaining <= 0:
            break
        piece = array[:remaining + 1]
        kept.append(piece)
        remaining -= max(0, len(piece) - 1)
    return kept
