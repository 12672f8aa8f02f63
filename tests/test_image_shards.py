"""Image shards (``cli.py prepare-images``): the folder's bytes and labels back by index, the same training on
shards as on the folder, and one-line refusals that lose nothing."""

from __future__ import annotations

import dataclasses
import pickle
import tarfile

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from lit.commands import main
from lit.data.image_shard_format import IMAGE_EXTENSIONS, read_index, read_meta
from lit.data.imagenet import ImageFolderDataModule
from lit.data.sharded_images import ShardedImages
from lit.errors import UserInputError
from tests.conftest import REPO, make_image_folder

TINY_SHARD_MB = "0.02"  # about 20 KB: a few images per shard, so items cross shard boundaries


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = make_image_folder(tmp_path_factory.mktemp("images") / "folder", per_class=5)
    # What ImageFolder reads besides a flat class folder, and what it skips.
    nested = root / "train" / "n01440764" / "more"
    nested.mkdir()
    Image.new("RGB", (50, 40), (10, 200, 30)).save(nested / "green.PNG")
    (root / "train" / "n01443537" / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="module")
def shards(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("images") / "shards"
    assert main(["prepare-images", str(folder), "--out", str(out), "--shard_mb", TINY_SHARD_MB]) == 0
    return out


def test_the_shards_hold_the_folders_images_byte_for_byte_with_its_labels(folder, shards):
    assert IMAGE_EXTENSIONS == IMG_EXTENSIONS
    meta = read_meta(shards)
    for split in ("train", "val"):
        expected = ImageFolder(str(folder / split))
        got = ShardedImages(shards, split)
        assert got.classes == expected.classes and len(got) == len(expected) == meta["splits"][split]["images"]
        assert got.targets == expected.targets
        for i, (path, label) in enumerate(expected.samples):
            data, same_label = got.read(i)
            assert data == open(path, "rb").read() and same_label == label, (split, i, path)
            image, _ = got[i]
            assert np.array_equal(np.asarray(image), np.asarray(expected[i][0]))  # decoded as ImageFolder decodes
        shard_counts = [s["images"] for s in meta["splits"][split]["shards"]]
        assert sum(shard_counts) == len(expected)
    assert len(meta["splits"]["train"]["shards"]) > 2  # the tiny shard size split the set
    # Plain tar files, webdataset's layout: key.ext members, the index's offsets where tar puts each file's data.
    rows = read_index(shards, meta, "train")
    first = meta["splits"]["train"]["shards"][0]
    with tarfile.open(shards / first["file"]) as tar:
        members = tar.getmembers()
    assert [m.name for m in members[:2]] == ["00000000.jpg", "00000000.cls"]
    images = members[::2]
    assert [m.offset_data for m in images] == rows["offset"][: first["images"]].tolist()
    # A worker started by spawn gets the dataset pickled: it maps the index and opens the shards itself.
    copy = pickle.loads(pickle.dumps(ShardedImages(shards, "val")))
    assert copy.read(3) == ShardedImages(shards, "val").read(3)


def datamodule(root, **kw) -> ImageFolderDataModule:
    """The DeiT recipe's data options (vit_baseline.yaml), at a tiny size."""
    recipe = yaml.safe_load((REPO / "recipes" / "vit_baseline.yaml").read_text())["data"]["init_args"]
    options = {**recipe, "image_size": 32, "batch_size": 4, "num_workers": 0, "minival_fraction": 0.2, "seed": 0,
               "re_prob": 1.0}
    return ImageFolderDataModule(str(root), **{**options, **kw})


def fit(root, **kw) -> tuple[float, dict]:
    from lit.diagnostics import DiagnosticsConfig
    from lit.image_classifier import ImageClassifier
    from lit.models.vit import VIT_ARCH

    L.seed_everything(0)
    arch = dataclasses.replace(VIT_ARCH, d_model=16, n_layers=2, n_heads=2, drop_path=0.1)
    module = ImageClassifier(num_classes=2, image_size=32, patch_size=8, arch=arch, lr=2e-3, warmup_steps=0,
                             diagnostics=DiagnosticsConfig(interval=0))
    trainer = L.Trainer(accelerator="cpu", max_steps=3, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                        limit_val_batches=0)
    trainer.fit(module, datamodule=datamodule(root, **kw))
    return float(trainer.callback_metrics["train/loss"]), module.state_dict()


def test_the_recipe_trains_on_the_shards_exactly_as_on_the_folder(folder, shards):
    dm = datamodule(shards)
    dm.setup("fit")
    assert dm.sharded and dm.num_classes == 2 and isinstance(dm.test_set, ShardedImages)
    on_folder = datamodule(folder)
    on_folder.setup("fit")
    assert dm.val_set.indices == on_folder.val_set.indices and dm.train_set.indices == on_folder.train_set.indices
    # DeiT's options (RandAugment, pixel erasing, repeated augmentation, mixing, the minival), uint8 batches:
    # three steps, then the loss and every weight, bit for bit; the shards read by two workers, the folder by none.
    folder_loss, folder_weights = fit(folder)
    shard_loss, shard_weights = fit(shards, num_workers=2)
    assert shard_loss == folder_loss
    for name, tensor in folder_weights.items():
        assert torch.equal(shard_weights[name], tensor), name


def run(argv, capsys) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err.strip().splitlines()


def test_bad_input_is_one_error_line_and_loses_nothing(folder, shards, tmp_path, capsys):
    code, err = run(["prepare-images", str(tmp_path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "no train/ and val/" in err[0]
    before = {p.name: p.stat().st_mtime_ns for p in shards.iterdir()}
    code, err = run(["prepare-images", str(folder), "--out", str(shards)], capsys)
    assert code == 2 and err == [f"error: {shards} already holds shards; pass an empty or new --out (nothing was "
                                 f"overwritten)"]
    assert {p.name: p.stat().st_mtime_ns for p in shards.iterdir()} == before
    # A class with no image is found while packing: what was written is removed, nothing else.
    bad = make_image_folder(tmp_path / "bad", classes=("a", "b", "c"), per_class=2)
    for image in (bad / "val" / "c").iterdir():
        image.unlink()
    (tmp_path / "out" / "mine.txt").parent.mkdir()
    (tmp_path / "out" / "mine.txt").write_text("kept")
    code, err = run(["prepare-images", str(bad), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and len(err) == 1 and "holds no image" in err[0]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]
    # A shard directory copied in part is named as such before any worker reads from it.
    import shutil

    partial = shutil.copytree(shards, tmp_path / "partial")
    (partial / read_meta(partial)["splits"]["val"]["shards"][-1]["file"]).unlink()
    with pytest.raises(UserInputError, match="lacks val-0000"):
        datamodule(partial).setup("fit")
    # Token shards are not image shards.
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / "meta.json").write_text('{"format": "llm.c"}')
    with pytest.raises(UserInputError, match="not image shards"):
        ImageFolderDataModule(str(tmp_path / "tokens"))


def test_packing_memory_does_not_grow_with_the_number_of_images(tmp_path):
    import io
    import tracemalloc

    from PIL import Image

    from lit.data.prepare_images import pack

    # One real 8x8 JPEG's bytes for every file: packing decodes each image (verify), and a file that does not decode
    # is listed as left out, which grows with the number of such files by design.
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 30, 200)).save(buffer, format="JPEG")
    jpeg = buffer.getvalue()

    def peak_bytes(per_class: int) -> int:
        root = tmp_path / f"folder{per_class}"
        for split in ("train", "val"):
            for c in range(10):
                (root / split / f"c{c}").mkdir(parents=True)
                for i in range(per_class):
                    (root / split / f"c{c}" / f"{i}.JPEG").write_bytes(jpeg)
        tracemalloc.start()
        try:
            pack(root, tmp_path / f"out{per_class}", shard_bytes=1 << 30, progress_every=0)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    few, many = peak_bytes(5), peak_bytes(30)  # 100 images, then 600: one class folder's names more, nothing per image
    assert many - few < 8_000, (few, many)
