"""Decoding an image file to RGB, with a failure that names the file (no torch here: ``prepare-images`` imports it).

PIL's own errors rarely say which file they came from (``OSError: image file is truncated (81 bytes not
processed)``), and from shards there is no file at all; ``UnreadableImage`` carries the name the caller gives, so the
loader can skip the image with a warning naming it, or stop with one line naming it (``lit/data/bad_images.py``).
"""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, UnidentifiedImageError


class UnreadableImage(Exception):
    """An image file that does not decode: ``name`` says where it is, ``reason`` what PIL said."""

    def __init__(self, name: str, reason: str = ""):
        super().__init__(f"{name}: {reason}" if reason else name)
        self.name, self.reason = name, reason


def _reason(exc: BaseException) -> str:
    if isinstance(exc, UnidentifiedImageError):  # PIL's message names a path or a BytesIO object: said here instead
        return f"{type(exc).__name__}: not an image format PIL reads"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def decode_rgb(source: str | Path | bytes, name: str | None = None) -> Image.Image:
    """The image in ``source`` (a path or a file's bytes) as RGB, decoded in full now, exactly as torchvision's
    ``pil_loader`` decodes it; ``UnreadableImage(name)`` if it does not decode. Every error from opening to the
    last pixel counts: truncated data (``OSError``), a file PIL does not recognise (``UnidentifiedImageError``), a
    corrupt chunk (``SyntaxError``, ``ValueError``), an oversized image (``DecompressionBombError``)."""
    name = str(source) if name is None else name
    try:
        with (open(source, "rb") if not isinstance(source, bytes) else io.BytesIO(source)) as file:
            return Image.open(file).convert("RGB")
    except Exception as exc:  # noqa: BLE001 - anything PIL raises while decoding means this file does not decode
        raise UnreadableImage(name, _reason(exc)) from exc


def why_undecodable(data: bytes) -> str | None:
    """None if ``data`` decodes to an image, else what PIL said. For a JPEG it decodes at 1/8 scale (PIL's
    ``draft``: the whole entropy-coded stream is still read, so truncated or corrupt data fails as in a full
    decode, for a fraction of the inverse DCT's cost); anything else is decoded in full."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format == "JPEG":
                image.draft("RGB", (1, 1))
            image.convert("RGB")
    except Exception as exc:  # noqa: BLE001 - see decode_rgb
        return _reason(exc)
    return None
