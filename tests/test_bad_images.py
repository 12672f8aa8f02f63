"""Images that do not decode: skipped with a warning naming them and counted exactly (through DataLoader worker
processes), logged as ``data/skipped_images``, or a one-line stop; from the folder and from the shards; and
``prepare-images`` leaves them out and lists them (``lit/data/bad_images.py``, ``lit/data/prepare_images.py``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import torch

from lit.cli import main
from lit.data.bad_images import (
    BadImageLedger,
    BadImageWarning,
    ImageBatch,
    SkippedImages,
    SkipUnreadable,
    collate_with_skips,
)
from lit.data.image_decoding import UnreadableImage, decode_rgb, why_undecodable
from lit.data.imagenet import ImageFolderDataModule
from lit.data.prepare_images import main as prepare_images
from lit.data.prepare_images import pack
from lit.data.sharded_images import ShardedImages
from lit.errors import UserInputError
from tests.conftest import REPO, TINY_VIT, make_image_folder

BAD = "bad.JPEG"  # sorts first in its class folder: the split's image 0


def folder_with_a_truncated_jpeg(root: Path, per_class: int = 4) -> Path:
    """``make_image_folder`` plus ``train/<first class>/bad.JPEG``: the first third of a real JPEG (PIL opens it,
    then fails mid-decode: ``image file is truncated``)."""
    folder = make_image_folder(root, per_class=per_class)
    cls = sorted(p.name for p in (folder / "train").iterdir())[0]
    data = next((folder / "train" / cls).iterdir()).read_bytes()
    (folder / "train" / cls / BAD).write_bytes(data[: len(data) // 3])
    return folder


def test_the_decoder_names_the_file_and_says_what_pil_said(tmp_path):
    folder = folder_with_a_truncated_jpeg(tmp_path / "f")
    bad = next(folder.glob(f"train/*/{BAD}"))
    with pytest.raises(UnreadableImage, match=r"bad\.JPEG: OSError: image file is truncated"):
        decode_rgb(bad)
    with pytest.raises(UnreadableImage, match="not an image format PIL reads"):
        decode_rgb(b"not a JPEG", "text.JPEG")
    good = next(p for p in bad.parent.iterdir() if p.name != BAD)
    assert decode_rgb(good).mode == "RGB" and why_undecodable(good.read_bytes()) is None
    assert "truncated" in why_undecodable(bad.read_bytes())  # the 1/8-scale check catches it too


def _bad_loads(dm: ImageFolderDataModule, loader, epochs: int) -> int:
    """How often the sampler draws the bad image (image 0 of train) over ``epochs`` epochs: from its order alone."""
    bad = next(i for i, (path, _) in enumerate(dm.train_set.dataset.samples) if path.endswith(BAD))
    position = dm.train_set.indices.index(bad)  # its index in the training subset the sampler draws from
    draws = 0
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        draws += sum(index == position for index, _ in loader.sampler)
    return draws


def test_skips_in_worker_processes_reach_the_main_process_exactly(tmp_path):
    # Two workers, repeated augmentation (the bad file is drawn 0-3 times an epoch), four epochs: every skipped load
    # is counted once in the main process, the warning names the file (once), and no batch is short.
    folder = folder_with_a_truncated_jpeg(tmp_path / "f", per_class=6)
    dm = ImageFolderDataModule(str(folder), image_size=32, batch_size=4, num_workers=2, minival_fraction=0.1, seed=3)
    dm.setup("fit")
    loader = dm.train_dataloader()
    expected = _bad_loads(dm, loader, epochs=4)
    assert expected > 0  # the seed draws it
    with pytest.warns(BadImageWarning, match=r"skipped image .*bad\.JPEG, which does not decode") as caught:
        for epoch in range(4):
            loader.sampler.set_epoch(epoch)
            for batch in loader:
                images, labels = dm.on_before_batch_transfer(batch, 0)
                assert images.shape == (4, 3, 32, 32) and labels.shape == (4,)
    assert dm.bad_images.skipped == expected
    assert list(dm.bad_images.files) == [str(next(folder.glob(f"train/*/{BAD}")))]
    assert len([w for w in caught if issubclass(w.category, BadImageWarning)]) == 1


class _Items(torch.utils.data.Dataset):
    """Items ``(i, i)``; those in ``bad`` raise as a file that does not decode."""

    def __init__(self, n: int, bad: set[int]):
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise UnreadableImage(f"img{i}", "OSError: truncated")
        return torch.tensor(float(i)), i


def test_the_next_image_takes_the_place_and_the_limit_counts_distinct_files():
    items = SkipUnreadable(_Items(6, {1, 2}), "skip", max_bad_images=2)
    assert items[1][0] == 3 and items[1][2] == (("img1", "OSError: truncated"), ("img2", "OSError: truncated"))
    assert items[5][:2] == (5, 5) and items[5][2] == ()
    ledger = BadImageLedger("skip", max_bad_images=2)
    with pytest.warns(BadImageWarning):
        for _ in range(3):  # the same two files, three times: 6 skipped loads, 2 files, under the limit of 2
            images, labels = ledger.take(collate_with_skips([items[1], items[4]]))
    assert labels.tolist() == [3, 4] and ledger.skipped == 6 and list(ledger.files) == ["img1", "img2"]
    stricter = BadImageLedger("skip", max_bad_images=1)
    with pytest.raises(UserInputError, match=r"2 image files do not decode, more than --data.max_bad_images=1"):
        stricter.take(collate_with_skips([items[1]]))


def test_more_failures_in_a_row_than_the_limit_stop_the_run():
    items = SkipUnreadable(_Items(5, {0, 1, 2, 3}), "skip", max_bad_images=2)
    assert items[0][0] is None and len(items[0][2]) == 3  # three tries (limit + 1), then a marker
    batch = collate_with_skips([items[0], items[4]])
    assert batch[1].tolist() == [4] and batch.skipped.dropped == 1  # the marker is dropped from the batch
    with pytest.raises(UserInputError, match="more than --data.max_bad_images=2"):
        BadImageLedger("skip", max_bad_images=2).take(batch)


def test_error_mode_stops_at_the_first_bad_image_naming_it():
    items = SkipUnreadable(_Items(4, {2}), "error")
    assert items[2][0] is None and items[2][2] == (("img2", "OSError: truncated"),)  # no substitute is loaded
    with pytest.raises(UserInputError, match=r"image img2 does not decode \(OSError: truncated\); replace or remove"):
        BadImageLedger("error").take(collate_with_skips([items[1], items[2]]))
    clean = BadImageLedger("error").take(ImageBatch(torch.zeros(2), torch.ones(2), SkippedImages()))
    assert type(clean) is tuple and clean[1].tolist() == [1, 1]
    with pytest.raises(UserInputError, match="on_bad_image"):
        BadImageLedger("ignore")  # type: ignore[arg-type]
    with pytest.raises(UserInputError, match="max_bad_images"):
        BadImageLedger("skip", -1)


def test_prepare_images_leaves_out_what_does_not_decode_and_lists_it(tmp_path, capsys):
    folder = folder_with_a_truncated_jpeg(tmp_path / "f")
    (folder / "val" / "n01443537" / "text.JPEG").write_text("not an image")
    assert prepare_images([str(folder), "--out", str(tmp_path / "shards")]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)["splits"]
    assert summary["train"] == {"images": 8, "shards": 1, "left_out": 1}
    assert summary["val"] == {"images": 8, "shards": 1, "left_out": 1}
    assert "left out" in err and BAD in err and "text.JPEG" in err
    meta = json.loads((tmp_path / "shards" / "meta.json").read_text())
    assert meta["verified"] and [e["file"] for e in meta["splits"]["train"]["left_out"]] == [
        str(next(folder.glob(f"train/*/{BAD}")).relative_to(folder))]
    assert "truncated" in meta["splits"]["train"]["left_out"][0]["reason"]
    shards = ShardedImages(tmp_path / "shards", "train")
    assert all(shards[i][0].mode == "RGB" for i in range(len(shards)))  # every packed image decodes
    # Without verifying, the bad file is packed as it is (the previous behaviour), and nothing is listed.
    unverified = pack(folder, tmp_path / "raw", progress_every=0, verify=False)
    assert unverified["splits"]["train"]["images"] == 9 and unverified["splits"]["train"]["left_out"] == []


def test_shards_holding_a_bad_image_name_it_and_skip_it(tmp_path):
    folder = folder_with_a_truncated_jpeg(tmp_path / "f", per_class=6)
    pack(folder, tmp_path / "shards", shard_bytes=1 << 14, progress_every=0, verify=False)  # several shards
    with pytest.raises(UnreadableImage, match=r"train image 0 of the shards in .* \(train-000000\.tar\)"):
        ShardedImages(tmp_path / "shards", "train")[0]
    dm = ImageFolderDataModule(str(tmp_path / "shards"), image_size=32, batch_size=4, num_workers=2,
                               minival_fraction=0.1, seed=3)
    on_folder = ImageFolderDataModule(str(folder), image_size=32, batch_size=4, num_workers=0, minival_fraction=0.1,
                                      seed=3)
    dm.setup("fit")
    on_folder.setup("fit")
    loader = dm.train_dataloader()
    expected = _bad_loads(on_folder, on_folder.train_dataloader(), epochs=4)  # the same order as the folder's
    with pytest.warns(BadImageWarning, match=r"skipped image train image 0 of the shards"):
        for epoch in range(4):
            loader.sampler.set_epoch(epoch)
            for batch in loader:
                dm.on_before_batch_transfer(batch, 0)
    assert expected > 0 and dm.bad_images.skipped == expected


def _metric(db: Path, key: str) -> list[float]:
    with sqlite3.connect(db) as connection:
        return [v for (v,) in connection.execute("select value from metrics where key = ? order by step", (key,))]


def _fit_args(folder: Path, *extra: str) -> list[str]:
    # The DeiT recipe on the folder, tiny; two loader workers, so the bad image fails in a worker process. One epoch,
    # every image once (no repeats), no sanity check: the bad file is loaded exactly once, in training or validation.
    return ["fit", "--config", str(REPO / "recipes" / "vit_baseline.yaml"), f"--data.root={folder}",
            "--model.variant=null", *TINY_VIT, "--trainer.precision=32-true", "--data.batch_size=4",
            "--data.num_workers=2", "--data.image_size=32", "--data.repeated_augmentation=1", "--trainer.max_epochs=1",
            "--trainer.num_sanity_val_steps=0", *extra]


def test_a_fit_skips_a_truncated_jpeg_names_it_and_logs_the_count(workdir_with_store):
    folder = folder_with_a_truncated_jpeg(workdir_with_store / "imagenet")
    with pytest.warns(BadImageWarning, match=r"bad\.JPEG"):
        main(_fit_args(folder))
    assert _metric(workdir_with_store / "mlflow.db", "data/skipped_images")[-1] == 1.0
    with sqlite3.connect(workdir_with_store / "mlflow.db") as connection:
        assert connection.execute("select status from runs").fetchall() == [("FINISHED",)]


def test_a_fit_with_on_bad_image_error_stops_in_one_line(workdir_with_store, capsys):
    folder = folder_with_a_truncated_jpeg(workdir_with_store / "imagenet")
    with pytest.raises(SystemExit) as stop:
        main(_fit_args(folder, "--data.on_bad_image=error"))
    assert stop.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and BAD in errors[0] and "--data.on_bad_image=skip" in errors[0], errors


def test_the_skipped_names_survive_pinning():
    # A GPU run pins batches (DataLoader(pin_memory=True)), whose rebuild of a plain tuple would drop ``skipped``.
    from torch.utils.data._utils.pin_memory import pin_memory

    report = SkippedImages([("img1", "OSError: truncated")], 0)
    pinned = pin_memory(ImageBatch(None, None, report))  # no tensors to pin: a CPU-only machine has no pinned memory
    assert isinstance(pinned, ImageBatch) and pinned.skipped is report
