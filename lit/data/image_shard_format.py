"""Image shards: an image folder packed into plain tar files, each image's place in them indexed (no torch here:
``prepare-images`` imports it).

    <out>/meta.json              classes (label = position), each split's shards with their image counts and bytes
    <out>/train-000000.tar ...   uncompressed POSIX tar: ``00000000.jpg`` (the file's bytes, unchanged) and
                                 ``00000000.cls`` (its label, as text), in the order torchvision's ImageFolder lists
    <out>/train.index            one row per image: shard number, label, byte offset of its data, byte size
    <out>/val-000000.tar ... val.index

The tars are in webdataset's layout (one sample per key, members named ``key.ext``, labels in ``.cls``), so ``tar``
lists them and streaming readers of that layout could read them (not tried here: webdataset is not a dependency);
this project reads them by random access instead: the index gives each
image's offset in its shard, one positioned read fetches its bytes. Image ``i`` of a split is the folder's image
``i``, with the folder's label, so the sampler's order, repeated augmentation, per-sample seeds, the minival and a
resume are the same on shards as on the folder, and setup reads two small files instead of listing every image.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from lit.errors import UserInputError

FORMAT = "image-tar-shards"
VERSION = 1
SPLITS = ("train", "val")
# One row per image; 24 bytes, so ImageNet's 1.28M training images index in 31 MB.
INDEX_DTYPE = np.dtype([("shard", "<u4"), ("label", "<u4"), ("offset", "<u8"), ("size", "<u8")])
# torchvision's ImageFolder extensions (torchvision.datasets.folder.IMG_EXTENSIONS; a test keeps them equal), so that
# the shards hold the files the folder path reads and no other; copied to keep torch out of this module.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
TAR_BLOCK = 512
END_BLOCKS = 2  # two zero blocks end a tar archive
# Member extensions as webdataset's ImageNet shards name them (``.jpg``; timm's ``wds`` reader looks for jpg, png or
# webp); the others keep their own, lower-cased.
MEMBER_SUFFIXES = {".jpeg": ".jpg"}


def member_suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    return MEMBER_SUFFIXES.get(suffix, suffix)


def class_names(folder: Path) -> list[str]:
    """The class folders of ``folder``, sorted: the label of a class is its position (as ImageFolder's)."""
    return sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())


def check_image_folder(path: Path, how: str) -> list[str]:
    """The classes of an image folder holding ``train/<class>/`` and ``val/<class>/``, or a ``UserInputError``
    ending in ``how`` (what the user should do)."""
    if not (path / "train").is_dir() or not (path / "val").is_dir():
        raise UserInputError(f"image folder {path} has no train/ and val/ subfolders: {how}")
    train, val = class_names(path / "train"), class_names(path / "val")
    if not train:
        raise UserInputError(f"{path / 'train'} has no class folders: {how}")
    if train != val:
        missing = sorted(set(train) ^ set(val))[:3]
        raise UserInputError(f"train/ and val/ of {path} have different classes (e.g. {missing}); "
                             "both need one folder per class, with the same names")
    return train


def folder_images(split_folder: Path, classes: list[str]) -> Iterator[tuple[Path, int]]:
    """``(path, label)`` of every image under ``split_folder``, in ImageFolder's order (classes sorted, then each
    class's tree walked in sorted order), one class folder listed at a time: memory does not grow with the set."""
    for label, name in enumerate(classes):
        found = False
        for root, _, files in sorted(os.walk(split_folder / name, followlinks=True)):
            for file in sorted(files):
                if file.lower().endswith(IMAGE_EXTENSIONS):
                    found = True
                    yield Path(root) / file, label
        if not found:
            raise UserInputError(f"class folder {split_folder / name} holds no image ({', '.join(IMAGE_EXTENSIONS)}); "
                                 "ImageFolder refuses it too: add images or remove the folder from train/ and val/")


def _padded(size: int) -> int:
    return -(-size // TAR_BLOCK) * TAR_BLOCK


class ImageShardWriter:
    """One split's images appended to ``<split>-NNNNNN.tar`` shards of at most ``shard_bytes`` (a larger image gets
    a shard of its own), with each image's index row appended to ``<split>.index`` as it is written.

    Members are written here from ``TarInfo`` headers rather than through ``tarfile.TarFile``, which keeps every
    member it wrote in a list (memory growing with the shard) and does not say where a member's data starts."""

    def __init__(self, directory: Path, split: str, shard_bytes: int):
        self.directory, self.split, self.shard_bytes = Path(directory), split, shard_bytes
        self.shards: list[dict] = []  # closed shards: file, images, bytes
        self.images = 0
        self.written: list[Path] = []  # every file this writer created (removed if the preparation is refused)
        self._index = self._create(f"{split}.index")
        self._tar = None
        self._offset = self._in_shard = 0

    def _create(self, name: str):
        path = self.directory / name
        self.written.append(path)
        return open(path, "xb")  # never over a file this call did not write

    def add(self, data: bytes, suffix: str, label: int) -> None:
        size = _padded(len(data)) + 3 * TAR_BLOCK  # its header and data, the label's header and data
        if self._tar is not None and self._offset + size + END_BLOCKS * TAR_BLOCK > self.shard_bytes:
            self._close_shard()
        if self._tar is None:
            self._tar = self._create(f"{self.split}-{len(self.shards):06d}.tar")
        key = f"{self.images:08d}"
        offset = self._member(f"{key}{suffix}", data)
        self._member(f"{key}.cls", str(label).encode())
        self._index.write(np.array([(len(self.shards), label, offset, len(data))], dtype=INDEX_DTYPE).tobytes())
        self.images += 1
        self._in_shard += 1

    def _member(self, name: str, data: bytes) -> int:
        """Write one member; return where its data starts."""
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), 0o444, 0  # the same bytes on every run
        header = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
        self._tar.write(header)
        self._tar.write(data)
        self._tar.write(bytes(_padded(len(data)) - len(data)))
        start = self._offset + len(header)
        self._offset = start + _padded(len(data))
        return start

    def _close_shard(self) -> None:
        self._tar.write(bytes(END_BLOCKS * TAR_BLOCK))  # the end of the archive, as tar writes it
        self._tar.close()
        self.shards.append({"file": Path(self._tar.name).name, "images": self._in_shard,
                            "bytes": self._offset + END_BLOCKS * TAR_BLOCK})
        self._tar, self._offset, self._in_shard = None, 0, 0

    def close(self) -> None:
        if self._tar is not None:
            self._close_shard()
        self._index.close()


def is_shard_directory(path: Path) -> bool:
    return (path / "meta.json").is_file()


def read_meta(path: Path) -> dict:
    """The ``meta.json`` of an image shard directory, checked, or a ``UserInputError`` saying what it is not."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserInputError(f"cannot read {path / 'meta.json'} ({exc}); prepare the shards again with "
                             f"`python cli.py prepare-images`") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserInputError(f"{path} holds a meta.json that is not image shards ({FORMAT}); point --data.root at an "
                             f"image folder or at shards written by `python cli.py prepare-images`")
    if meta.get("version") != VERSION or set(meta.get("splits", {})) != set(SPLITS):
        raise UserInputError(f"{path}/meta.json is image shards version {meta.get('version')} with splits "
                             f"{sorted(meta.get('splits', {}))}; this code reads version {VERSION} with train and val: "
                             "prepare them again with `python cli.py prepare-images`")
    return meta


def read_index(path: Path, meta: dict, split: str) -> np.ndarray:
    """The split's index rows, mapped from the file (shared between processes through the page cache)."""
    file = path / meta["splits"][split]["index"]
    missing = [f.name for f in (file, *(path / shard["file"] for shard in meta["splits"][split]["shards"]))
               if not f.is_file()]
    if missing:
        raise UserInputError(f"{path} lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}, which its "
                             "meta.json lists; copy the whole shard directory, or prepare it again with "
                             "`python cli.py prepare-images`")
    rows = np.memmap(file, dtype=INDEX_DTYPE, mode="r") if file.stat().st_size else np.zeros(0, INDEX_DTYPE)
    if len(rows) != meta["splits"][split]["images"]:
        raise UserInputError(f"{file} indexes {len(rows)} images but meta.json says {meta['splits'][split]['images']};"
                             " the shards are incomplete: prepare them again with `python cli.py prepare-images`")
    return rows
