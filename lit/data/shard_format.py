"""The llm.c shard file, written and opened (numpy only, no torch: ``prepare-data`` imports it).

A 256 x int32 header ``[20240520, version, n_tokens, 0...]`` then the tokens; version 1 holds uint16 tokens,
version 2 uint32. A file without that header is nanoGPT's raw layout, read with the dtype ``meta.json`` names.
A shard is checked whole before it is read (``check_shard``): a truncated or foreign file is one line naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

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
    """The tokens of one shard, memory-mapped, once ``check_shard`` has found the file whole."""
    dtype, offset, n = check_shard(path, default_dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(n,))


def check_shard(path: Path, default_dtype: str = "uint16") -> tuple[np.dtype, int, int]:
    """``(dtype, byte offset of the tokens, token count)`` of a shard, or one line naming the file when it is not
    whole: an llm.c header whose token count disagrees with the file's size (a copy cut short, a disk that
    filled), or a file that is not a shard at all. A file without the header is nanoGPT's raw layout, unless
    its folder's ``meta.json`` says ``prepare-data`` wrote llm.c shards there."""
    path = Path(path)
    size = path.stat().st_size
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    remake = "make the shards again (`python cli.py prepare-data`) or copy this one again"
    if len(header) and header[0] == MAGIC:
        if len(header) < HEADER_INTS:
            raise UserInputError(f"shard {path} is truncated: {size} bytes, shorter than its own "
                                 f"{HEADER_INTS * 4}-byte llm.c header; {remake}")
        version, n = int(header[1]), int(header[2])
        if version not in VERSION_DTYPES:
            raise UserInputError(f"shard {path} has unknown llm.c version {version}; expected 1 (uint16) or 2 (uint32)")
        dtype = np.dtype(VERSION_DTYPES[version])
        expected = HEADER_INTS * 4 + n * dtype.itemsize
        if size != expected:
            what = "truncated" if size < expected else "longer than its header says"
            raise UserInputError(f"shard {path} is {what}: its header counts {n:,} {dtype.name} tokens "
                                 f"({expected:,} bytes with the header) but the file holds {size:,} bytes; {remake}")
        return dtype, HEADER_INTS * 4, n
    if _written_as_llmc(path):
        raise UserInputError(f"{path} is not a token shard: it does not start with the llm.c magic number {MAGIC}, "
                             f"and {path.parent / 'meta.json'} says this folder holds llm.c shards; remove the file or "
                             f"make the shards again (`python cli.py prepare-data`)")
    dtype = np.dtype(default_dtype)
    if size % dtype.itemsize:
        raise UserInputError(f"shard {path} has no llm.c header and its {size:,} bytes are not a whole number of "
                             f"{dtype.name} tokens (nanoGPT's raw layout): truncated, or not a shard; {remake}")
    return dtype, 0, size // dtype.itemsize


def _written_as_llmc(path: Path) -> bool:
    meta = path.parent / "meta.json"
    try:
        return json.loads(meta.read_text()).get("format") == "llm.c"
    except (OSError, ValueError, AttributeError):  # no meta.json, or not ours: the raw layout stays possible
        return False
