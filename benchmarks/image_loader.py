"""Images per second of the ImageNet loader on one CPU core (one loader worker), from the folder and from its shards
(``cli.py prepare-images``): JPEG decode plus DeiT's train transform, with and without each sample's augmentation
seeded by its place in the order (``lit/data/seeded_samples.py``), with normalising and erasing left to the device
(``normalize_on_device``), and the eval transform; reading an image's bytes alone; and the setup cost of each
(ImageFolder lists every file, the shards read meta.json and map the index). Real photographs (scikit-learn's two
sample images) cut to ImageNet's typical 500x375 and saved as JPEGs at quality 90. Rounds interleave the paths; the
best of the rounds is reported with the spread over rounds (the machine is shared).

    python benchmarks/image_loader.py [--images 64] [--rounds 3] [--setup_files 20000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from sklearn.datasets import load_sample_image
from torchvision.datasets import ImageFolder

from lit.data.imagenet import ImageFolderDataModule
from lit.data.prepare_images import pack
from lit.data.seeded_samples import SeededSamples, sample_key
from lit.data.sharded_images import ShardedImages


def make_folder(root: Path, images: int) -> Path:
    rng = np.random.default_rng(0)
    photos = [load_sample_image(name) for name in ("china.jpg", "flower.jpg")]
    for split in ("train", "val"):
        for c in range(2):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(images // 2):
                photo = photos[(i + c) % 2]
                h, w = photo.shape[:2]
                top, left = rng.integers(0, h // 4), rng.integers(0, w // 4)
                crop = Image.fromarray(photo[top: top + 3 * h // 4, left: left + 3 * w // 4])
                crop.resize((500, 375), Image.BICUBIC).save(folder / f"{i}.JPEG", quality=90)
    return root


def rate(load, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        load(i)
    return n / (time.perf_counter() - start)


def setup_seconds(root: Path, files: int, rounds: int) -> tuple[float, float]:
    """Seconds to set up the train split of ``files`` images: ImageFolder (lists them all) and the shards (meta.json
    and the index), best of ``rounds``. The files are tiny (setup reads no pixels); the page cache is warm, so a
    network filesystem would list more slowly than this."""
    per_class = files // 10
    for c in range(10):
        for split in ("train", "val"):
            folder = root / "folder" / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(per_class if split == "train" else 1):
                (folder / f"{i:07d}.JPEG").write_bytes(b"\xff\xd8" + bytes(64))
    pack(root / "folder", root / "shards", progress_every=0)
    folder_s = shard_s = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        ImageFolder(str(root / "folder" / "train"))
        folder_s = min(folder_s, time.perf_counter() - start)
        start = time.perf_counter()
        ShardedImages(root / "shards", "train")
        shard_s = min(shard_s, time.perf_counter() - start)
    return folder_s, shard_s


def module(root: Path, **kw) -> ImageFolderDataModule:
    dm = ImageFolderDataModule(str(root), batch_size=1, num_workers=0, minival_fraction=0.0, **kw)
    dm.setup("fit")
    return dm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--setup_files", type=int, default=20000, help="images in the setup measurement (0: skip it)")
    a = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_folder(Path(tmp) / "folder", a.images)
        shards = Path(tmp) / "shards"
        pack(root, shards, progress_every=0)
        folder, sharded = module(root), module(shards)
        folder_uint8, sharded_uint8 = module(root, normalize_on_device=True), module(shards, normalize_on_device=True)
        train, val = folder.train_set, folder.val_set
        n = len(train)
        reseed_only = SeededSamples(list(range(n)))
        seeded = {name: SeededSamples(dm.train_set) for name, dm in
                  (("folder", folder), ("shards", sharded), ("folder uint8", folder_uint8),
                   ("shards uint8", sharded_uint8))}
        paths = {
            "reseeding alone (save, seed, restore 3 generators)": lambda i: reseed_only[(i, sample_key(0, 0, i))],
            "folder: read bytes (open, read, close)": lambda i: Path(train.samples[i][0]).read_bytes(),
            "shards: read bytes (one positioned read)": lambda i: sharded.train_set.read(i),
            "decode only (PIL, RGB)": lambda i: Image.open(train.samples[i][0]).convert("RGB").load(),
            "folder, train: decode + DeiT transform (ToTensor, normalise, erase)": lambda i: train[i],
            "folder, train: the same, seeded per sample": lambda i: seeded["folder"][(i, sample_key(0, 0, i))],
            "shards, train: the same, seeded per sample": lambda i: seeded["shards"][(i, sample_key(0, 0, i))],
            "folder, train, normalize_on_device, seeded: to uint8":
                lambda i: seeded["folder uint8"][(i, sample_key(0, 0, i))],
            "shards, train, normalize_on_device, seeded: to uint8":
                lambda i: seeded["shards uint8"][(i, sample_key(0, 0, i))],
            "folder, eval: decode + resize 256 + crop 224": lambda i: val[i],
            "folder, eval, normalize_on_device: to uint8": lambda i: folder_uint8.val_set[i],
            "shards, eval, normalize_on_device: to uint8": lambda i: sharded_uint8.val_set[i],
        }
        rates: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(a.rounds):
            for name, load in paths.items():
                rates[name].append(rate(load, n))
        if a.setup_files:
            folder_s, shard_s = setup_seconds(Path(tmp) / "setup", a.setup_files, a.rounds)
    print(f"one core, {n} JPEGs of 500x375, best of {a.rounds} interleaved rounds (cpu: {os.cpu_count()} cores):")
    for name, values in rates.items():
        print(f"  {name:68s} {max(values):9.1f} images/s  (rounds {min(values):.1f}-{max(values):.1f})")
    if a.setup_files:
        files = a.setup_files // 10 * 10
        print(f"setup of a {files}-image train split, best of {a.rounds}: ImageFolder {folder_s:.3f} s "
              f"({folder_s / files * 1e6:.1f} us/image, {folder_s / files * 1.281e6:.0f} s for ImageNet's 1.28M), "
              f"shards {shard_s * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
