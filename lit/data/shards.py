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

from lit.errors import UserInputError

MAGIC = 20240520
HEADER_INTS = 256
VERSION_DTYPES = {1: np.uint16, 2: np.uint32}


def write_shard(path: str | Path, tokens: np.ndarray, dtype: type = np.uint16) -> None:
    """Write one shard in the llm.c layout (the one ``prepare`` produces)."""
    version = {np.uint16: 1, np.uint32: 2}[dtype]
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = (MAGIC, version, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=dtype).tobytes())


class ShardWriter:
    """Writes one split's token stream as llm.c shards of ``shard_tokens`` tokens, each file appended to as
    tokens arrive and its header's count filled in when it closes, so memory does not grow with the corpus.

    Shards are ``<name>_<split>_NNNNNN.bin`` from 000000; ``shards`` lists each closed file and its token count.
    """

    def __init__(self, directory: Path, name: str, split: str, dtype: type, shard_tokens: int):
        self.directory, self.name, self.split = Path(directory), name, split
        self.dtype, self.shard_tokens = dtype, shard_tokens
        self.version = {np.uint16: 1, np.uint32: 2}[dtype]
        self.shards: list[dict] = []
        self._file, self._in_file = None, 0

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards) + self._in_file

    def append(self, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens, dtype=self.dtype)
        while len(tokens):
            if self._file is None:
                self._open()
            room = self.shard_tokens - self._in_file
            self._file.write(tokens[:room].tobytes())
            self._in_file += min(room, len(tokens))
            tokens = tokens[room:]
            if self._in_file == self.shard_tokens:
                self._close_shard()

    def close(self) -> None:
        if self._file is not None:
            self._close_shard()

    def _open(self) -> None:
        path = self.directory / f"{self.name}_{self.split}_{len(self.shards):06d}.bin"
        self._file, self._in_file = open(path, "wb"), 0
        self._file.write(np.zeros(HEADER_INTS, dtype=np.int32).tobytes())  # the count is known at close

    def _close_shard(self) -> None:
        header = np.zeros(HEADER_INTS, dtype=np.int32)
        header[:3] = (MAGIC, self.version, self._in_file)
        self._file.seek(0)
        self._file.write(header.tobytes())
        self._file.close()
        self.shards.append({"file": Path(self._file.name).name, "tokens": self._in_file})
        self._file, self._in_file = None, 0


def open_shard(path: Path, default_dtype: str = "uint16") -> np.memmap:
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if len(header) == HEADER_INTS and header[0] == MAGIC:
        version, n = int(header[1]), int(header[2])
        if version not in VERSION_DTYPES:
            raise UserInputError(f"shard {path} has unknown llm.c version {version}; expected 1 (uint16) or 2 (uint32)")
        return np.memmap(path, dtype=VERSION_DTYPES[version], mode="r", offset=HEADER_INTS * 4, shape=(n,))
    return np.memmap(path, dtype=np.dtype(default_dtype), mode="r")


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
