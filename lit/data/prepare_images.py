"""Pack an image folder (``train/<class>/*``, ``val/<class>/*``) into tar shards with an offset index, the format
``lit/data/image_shard_format.py`` describes, so that setup on every rank reads two small files instead of listing
every image:

    python cli.py prepare-images /path/to/imagenet --out /path/to/imagenet-shards
    python cli.py fit --config recipes/vit_baseline.yaml --data.root /path/to/imagenet-shards

Images are copied byte for byte (no re-encoding), one at a time, in ImageFolder's order; each class folder is
listed on its own, so memory stays flat whatever the number of images. Progress goes to stderr.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from lit.data.image_shard_format import (
    FORMAT,
    INDEX_DTYPE,
    SPLITS,
    TAR_BLOCK,
    VERSION,
    ImageShardWriter,
    check_image_folder,
    folder_images,
    member_suffix,
)
from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors


def pack(source: str | Path, out: str | Path, shard_bytes: int = 1 << 30, progress_every: float = 5.0) -> dict:
    """Pack ``source`` (``train/<class>/`` and ``val/<class>/``) into shards in ``out``; return ``meta.json``'s
    content. Nothing is overwritten; a refusal removes what it wrote. ``meta.json`` is written last, so a directory
    without it was not finished."""
    source, out = Path(source).expanduser(), Path(out).expanduser()
    classes = check_image_folder(source, "pass a folder holding train/<class>/* and val/<class>/* images")
    if shard_bytes < 4 * TAR_BLOCK:
        raise UserInputError(f"--shard_mb gives {shard_bytes} bytes per shard, too small for one image; use 1 or more")
    if out.resolve() == source.resolve() or source.resolve() in out.resolve().parents:
        raise UserInputError(f"--out {out} is inside the image folder {source}; pick a directory outside it")
    if out.is_dir() and any(p for pattern in ("*.tar", "*.index", "meta.json*") for p in out.glob(pattern)):
        raise UserInputError(f"{out} already holds shards; pass an empty or new --out (nothing was overwritten)")
    out.mkdir(parents=True, exist_ok=True)
    writers: list[ImageShardWriter] = []
    start = last = time.perf_counter()
    try:
        for split in SPLITS:
            writer = ImageShardWriter(out, split, shard_bytes)
            writers.append(writer)
            for path, label in folder_images(source / split, classes):
                writer.add(path.read_bytes(), member_suffix(path), label)
                if progress_every and time.perf_counter() - last >= progress_every:
                    last = time.perf_counter()
                    print(f"prepare-images: {split}: {writer.images:,} images, "
                          f"{writer.images / (last - start):,.0f} images/s", file=sys.stderr, flush=True)
            writer.close()
    except BaseException:
        for writer in writers:
            writer.close()
            for path in writer.written:
                path.unlink(missing_ok=True)
        raise
    meta = {"format": FORMAT, "version": VERSION, "source": str(source.resolve()), "classes": classes,
            "index_dtype": {name: INDEX_DTYPE[name].str for name in INDEX_DTYPE.names},
            "splits": {w.split: {"images": w.images, "index": f"{w.split}.index", "shards": w.shards}
                       for w in writers}}
    partial = out / "meta.json.partial"
    partial.write_text(json.dumps(meta, indent=1))
    partial.replace(out / "meta.json")
    print(f"prepare-images: {sum(w.images for w in writers):,} images in {time.perf_counter() - start:,.1f} s",
          file=sys.stderr, flush=True)
    return meta



@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(prog="cli.py prepare-images", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="the image folder, holding train/<class>/* and val/<class>/*")
    p.add_argument("--out", required=True, help="output directory (new or empty of shards)")
    p.add_argument("--shard_mb", type=float, default=1024, help="shard size in MiB (an image larger gets its own)")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    meta = pack(a.source, a.out, shard_bytes=int(a.shard_mb * (1 << 20)))
    splits = {s: {"images": v["images"], "shards": len(v["shards"])} for s, v in meta["splits"].items()}
    print(json.dumps({"out": str(Path(a.out)), "classes": len(meta["classes"]), "splits": splits}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
