"""Which tokenizer a language model was trained with, kept in its checkpoint, and the check that whatever reads the
model later (``validate``, ``test``, ``predict``, ``lm-eval``, ``export-hf``) uses the same one.

A model's token ids mean the text of its own tokenizer only. Another tokenizer of the same vocabulary size fits the
weights' shapes, so nothing else notices: scored on shards made with it, a model's bits per byte came out 3.56
instead of 1.35, lm-eval below chance and samples gibberish, without a word. The record is the tokenizer's SHA-256
(its file's for a ``tokenizers`` JSON; for a character vocabulary, of its characters in order) and where it was.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from lit.errors import UserInputError

CHECKPOINT_KEY = "tokenizer"


def of_tokenizer_file(path: str | Path, sha256: str | None = None) -> dict:
    """The record of a ``tokenizers`` JSON file (its SHA-256 computed unless given, e.g. from a meta.json)."""
    if sha256 is None:
        from lit.data.token_bytes import file_sha256

        sha256 = file_sha256(path)
    return {"kind": "tokenizers", "sha256": sha256, "path": str(Path(path).resolve())}


def of_characters(chars: list[str], source: str) -> dict:
    """The record of a character vocabulary (char-level text): its characters, in id order."""
    return {"kind": "characters", "sha256": hashlib.sha256("".join(chars).encode("utf-8")).hexdigest(),
            "path": source}


def recorded(checkpoint: str | Path) -> dict | None:
    """The tokenizer record of a checkpoint file or sharded checkpoint directory; None for one written before
    checkpoints carried it (or by a procedure that had no data)."""
    from lit.init_from import load_weights_only

    path = Path(checkpoint)
    if path.is_dir():
        from lit.checkpoints import SHARDED_METADATA

        path = path / SHARDED_METADATA
    return in_checkpoint(load_weights_only(path))


def in_checkpoint(checkpoint: object) -> dict | None:
    """The tokenizer record of a loaded checkpoint dict, or None."""
    record = checkpoint.get(CHECKPOINT_KEY) if isinstance(checkpoint, dict) else None
    return record if isinstance(record, dict) and record.get("sha256") else None


def recorded_tokenizer_file(trained: dict, checkpoint: str | Path) -> Path:
    """The tokenizers JSON file a checkpoint records, where it was at training: refused in one line if it is gone
    or its bytes changed since."""
    path = Path(trained["path"])
    if not path.is_file():
        raise UserInputError(f"{checkpoint} was trained with the tokenizer {path}, which is not there; give its new "
                             f"place with --tokenizer")
    check(trained, of_tokenizer_file(path), checkpoint,
          fix=f"the file at {path} changed since training; give the original with --tokenizer")
    return path


def _describe(record: dict) -> str:
    what = "the character vocabulary of" if record.get("kind") == "characters" else "the tokenizer"
    return f"{what} {record.get('path')} (SHA-256 {record['sha256'][:12]})"


def check(trained: dict | None, current: dict | None, checkpoint: str | Path, *, force: bool = False,
          fix: str = "use the model's own tokenizer (or shards made with it)") -> None:
    """Refuse, in one line, to read the model at ``checkpoint`` (trained with ``trained``) with the tokenizer
    ``current``; with ``force``, go on and say so. Either record unknown: a warning that nothing could be checked."""
    if trained is None or current is None:
        missing = (f"{checkpoint} records no tokenizer (written before checkpoints carried one)" if trained is None
                   else "the tokenizer of these data is unknown (no meta.json names it; pass --data.tokenizer)")
        sys.stderr.write(f"warning: {missing}: cannot check that the model and its data share one\n")
        return
    if trained["sha256"] == current["sha256"]:
        return
    problem = (f"{checkpoint} was trained with {_describe(trained)}, but this run reads {_describe(current)}: "
               f"the same token ids stand for other text")
    if force:
        sys.stderr.write(f"warning: --force: {problem}; going on as asked\n")
        return
    raise UserInputError(f"{problem}; {fix}, or pass --force to go on anyway")
