"""Images per second of the ImageNet folder path on one CPU core: JPEG decode plus DeiT's train transform, with and
without each sample's augmentation seeded by its place in the order (``lit/data/seeded_samples.py``), with
normalising and erasing left to the device (``normalize_on_device``), and the eval transform. Real photographs
(scikit-learn's two sample images) cut to ImageNet's typical 500x375 and saved as JPEGs
at quality 90. Rounds interleave the paths; the best of the rounds is reported (the machine is shared).

    python benchmarks/image_loader.py [--images 64] [--rounds 3]
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

from lit.data.imagenet import ImageFolderDataModule
from lit.data.seeded_samples import SeededSamples, sample_key


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_folder(Path(tmp), a.images)
        dm = ImageFolderDataModule(str(root), batch_size=1, num_workers=0, minival_fraction=0.0)
        dm.setup("fit")
        train, val = dm.train_set, dm.val_set
        seeded = SeededSamples(train)
        uint8 = ImageFolderDataModule(str(root), batch_size=1, num_workers=0, minival_fraction=0.0,
                                      normalize_on_device=True)
        uint8.setup("fit")
        n = len(train)
        reseed_only = SeededSamples(list(range(n)))
        paths = {
            "reseeding alone (save, seed, restore 3 generators)": lambda i: reseed_only[(i, sample_key(0, 0, i))],
            "decode only (PIL, RGB)": lambda i: Image.open(train.samples[i][0]).convert("RGB").load(),
            "train: decode + DeiT transform (ToTensor, normalise, erase)": lambda i: train[i],
            "train: decode + DeiT transform, seeded per sample": lambda i: seeded[(i, sample_key(0, 0, i))],
            "train, normalize_on_device: decode + DeiT transform to uint8": lambda i: uint8.train_set[i],
            "eval: decode + resize 256 + crop 224": lambda i: val[i],
            "eval, normalize_on_device: to uint8": lambda i: uint8.val_set[i],
        }
        best = {name: 0.0 for name in paths}
        for _ in range(a.rounds):
            for name, load in paths.items():
                best[name] = max(best[name], rate(load, n))
    print(f"one core, {n} JPEGs of 500x375, best of {a.rounds} interleaved rounds (cpu: {os.cpu_count()} cores):")
    for name, value in best.items():
        print(f"  {name:62s} {value:9.1f} images/s")


if __name__ == "__main__":
    main()
