"""Images that do not decode (a truncated copy, a text file named ``.JPEG``): skipped, named and counted, or a stop.

    --data.on_bad_image=skip      (default) another image of the split takes its place; a warning names the file
    --data.max_bad_images=50      the run stops, in one ``error:`` line, once more files than this fail to decode
    --data.on_bad_image=error     the run stops at the first one, in one ``error:`` line naming it

timm's ``ImageDataset`` skips the same way (the next index, up to 50 failures in a row). Here the limit counts
distinct files, per process, over the whole run: with repeated augmentation and hundreds of epochs one bad file is
drawn hundreds of times, which should not stop a run, while 51 bad files say the copy of the data set is damaged.

Where each part runs. Decoding happens in DataLoader worker processes, and an exception raised there comes back to
the main process as a multi-line traceback, so nothing is raised in a worker: ``SkipUnreadable`` catches the
decoder's ``UnreadableImage`` (``lit/data/image_decoding.py``) and either loads the next image of the split in its
place (up to ``max_bad_images + 1`` in a row) or, under ``error`` or past that, returns a marker with no image.
Each item carries the names of what it skipped; ``collate_with_skips`` drops markers and hangs the names on the
batch, an ``ImageBatch`` (``(images, labels)`` to any code that unpacks it); ``BadImageLedger``, in the main
process (the DataModule's ``on_before_batch_transfer``, on the host, before the batch moves), takes them off the
batch, warns once per file, counts every skipped load exactly, and raises the one-line ``UserInputError``. The
count is logged as ``data/skipped_images`` by ``lit/image_classifier.py``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Literal

from torch.utils.data import Dataset, default_collate

from lit.data.image_decoding import UnreadableImage
from lit.errors import UserInputError

BadImagePolicy = Literal["skip", "error"]
BAD_IMAGE_POLICIES = ("skip", "error")
DEFAULT_MAX_BAD_IMAGES = 50


class BadImageWarning(UserWarning):
    """An image that did not decode was skipped (Python shows each file's warning once)."""


@dataclass
class SkippedImages:
    """What one batch's items skipped, beside the batch: ``(name, reason)`` per failed load, and how many items
    were dropped for lack of any readable image (``error``, or more failures in a row than the limit)."""

    skipped: list[tuple[str, str]] = field(default_factory=list)
    dropped: int = 0


class ImageBatch(tuple):
    """``(images, labels)``, with ``skipped`` (``SkippedImages``) beside them: code that knows nothing of skipped
    images unpacks two values as before. It survives the trip from a worker (pickling) and pinning."""

    skipped: SkippedImages

    def __new__(cls, images, labels, skipped: SkippedImages | None = None):
        batch = super().__new__(cls, (images, labels))
        batch.skipped = SkippedImages() if skipped is None else skipped
        return batch

    def __getnewargs__(self):
        return self[0], self[1], self.skipped

    def pin_memory(self) -> ImageBatch:
        # DataLoader's pinning rebuilds a plain tuple's type from its two items, which would drop ``skipped``.
        return ImageBatch(*(x.pin_memory() if x is not None else None for x in self), self.skipped)


class SkipUnreadable(Dataset):
    """``dataset`` whose items are ``(image, label, skipped)``: ``skipped`` names the images that did not decode and
    were passed over for this item; ``image`` is None when no readable image was found (see the module doc)."""

    def __init__(self, dataset: Dataset, on_bad_image: BadImagePolicy = "skip",
                 max_bad_images: int = DEFAULT_MAX_BAD_IMAGES):
        self.dataset, self.on_bad_image, self.max_bad_images = dataset, on_bad_image, max_bad_images

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        skipped: list[tuple[str, str]] = []
        tries = 1 if self.on_bad_image == "error" else min(self.max_bad_images + 1, len(self))
        for attempt in range(tries):
            try:
                image, label = self.dataset[(index + attempt) % len(self)]
                return image, label, tuple(skipped)
            except UnreadableImage as exc:
                skipped.append((exc.name, exc.reason))
        return None, None, tuple(skipped)


def collate_with_skips(items: list[tuple]) -> ImageBatch:
    """``default_collate`` of the items that have an image, with what the items skipped."""
    report = SkippedImages()
    kept = []
    for image, label, skipped in items:
        report.skipped.extend(skipped)
        if image is None:
            report.dropped += 1
        else:
            kept.append((image, label))
    images, labels = default_collate(kept) if kept else (None, None)
    return ImageBatch(images, labels, report)


class BadImageLedger:
    """This process's record of skipped images: ``take`` strips a batch's report, warns, counts and stops."""

    def __init__(self, on_bad_image: BadImagePolicy = "skip", max_bad_images: int = DEFAULT_MAX_BAD_IMAGES):
        check_bad_image_options(on_bad_image, max_bad_images)
        self.on_bad_image, self.max_bad_images = on_bad_image, max_bad_images
        self.skipped = 0  # loads that failed and were replaced, over the run
        self.files: dict[str, str] = {}  # each distinct file that failed -> PIL's reason, in the order found

    def take(self, batch):
        """``batch`` as a plain ``(images, labels)``, its skipped images recorded (another batch passes unchanged)."""
        if not isinstance(batch, ImageBatch):
            return batch
        (images, labels), report = batch, batch.skipped
        for name, reason in report.skipped:
            if self.on_bad_image == "error":
                raise UserInputError(f"image {name} does not decode ({reason}); replace or remove it (then "
                                     f"`python cli.py prepare-images` again if these are shards), or pass "
                                     f"--data.on_bad_image=skip to train past it")
            self.skipped += 1
            if name not in self.files:
                self.files[name] = reason
                if len(self.files) > self.max_bad_images:
                    examples = ", ".join(list(self.files)[:3])
                    raise UserInputError(f"{len(self.files)} image files do not decode, more than "
                                         f"--data.max_bad_images={self.max_bad_images} (e.g. {examples}): the data "
                                         f"set looks damaged; check or copy it again, or raise --data.max_bad_images")
                warnings.warn(f"skipped image {name}, which does not decode ({reason}); the next image of the "
                              f"split took its place (--data.on_bad_image=error stops instead)", BadImageWarning,
                              stacklevel=2)
        if report.dropped:  # only past the limit: every try of an item failed
            raise UserInputError(f"{report.dropped} item(s) found no image that decodes in up to "
                                 f"{self.max_bad_images + 1} images in a row (the last: {report.skipped[-1][0]}), "
                                 f"more than --data.max_bad_images={self.max_bad_images}: check the data set, or "
                                 f"raise --data.max_bad_images")
        return images, labels


def check_bad_image_options(on_bad_image: str, max_bad_images: int) -> None:
    if on_bad_image not in BAD_IMAGE_POLICIES:
        raise UserInputError(f"--data.on_bad_image is what to do with an image that does not decode: skip (another "
                             f"takes its place) or error (stop); got {on_bad_image!r}")
    if not (isinstance(max_bad_images, int) and not isinstance(max_bad_images, bool) and max_bad_images >= 0):
        raise UserInputError(f"--data.max_bad_images is how many image files may fail to decode before the run "
                             f"stops, a whole number >= 0; got {max_bad_images!r}")
