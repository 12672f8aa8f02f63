"""What identifies the data a run saw, as one digest: the record MLflow keeps as the run's dataset input, and what
``compare`` checks before it pairs runs ("variant A and B saw the same tokens").

For token shards: ``meta.json``'s bytes, each shard's name and size, and the tokenizer's SHA-256. For char-level
text: the text's SHA-256. Paths are kept as the source, not hashed: a moved folder holds the same data.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

DIGEST_CHARS = 16


def shard_record(shards_dir: str | Path, meta: dict, tokenizer_sha256: str | None) -> dict:
    directory = Path(shards_dir)
    digest = hashlib.sha256()
    meta_file = directory / "meta.json"
    if meta_file.exists():
        digest.update(meta_file.read_bytes())
    sizes = {p.name: p.stat().st_size for p in sorted(directory.glob("*.bin"))}
    digest.update(json.dumps(sizes, sort_keys=True).encode())
    digest.update((tokenizer_sha256 or "").encode())
    profile = {"shards": len(sizes), "bytes": sum(sizes.values()), "tokenizer_sha256": tokenizer_sha256,
               **{f"{s}_tokens": meta[f"{s}_tokens"] for s in ("train", "val", "test") if f"{s}_tokens" in meta}}
    return {"name": directory.resolve().name, "digest": digest.hexdigest()[:DIGEST_CHARS], "source_type": "local",
            "source": str(directory.resolve()), "profile": profile}


def text_record(text: str, source: str) -> dict:
    data = text.encode("utf-8")
    return {"name": Path(source).stem, "digest": hashlib.sha256(data).hexdigest()[:DIGEST_CHARS],
            "source_type": "local" if Path(source).exists() else "code", "source": source,
            "profile": {"characters": len(text), "bytes": len(data)}}
