"""Tokenize text files into token shards with a local tokenizer file (nothing is downloaded).

    python cli.py prepare-data --tokenizer tokenizer.json --out data/shards corpus/*.txt

The tokenizer is a Hugging Face ``tokenizers`` JSON file. The last ``--val_fraction`` of the tokens
(at least one shard's worth is not required) forms ``<name>_val_000000.bin``; the rest is split into
``<name>_train_NNNNNN.bin`` shards of ``--shard_tokens`` tokens. ``meta.json`` records the vocabulary
size and dtype that ``TextDataModule(shards_dir=...)`` reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lit.data.shards import write_shard
from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors


def prepare(inputs: list[str], tokenizer: str, out: str, name: str = "corpus", shard_tokens: int = 100_000_000,
            val_fraction: float = 0.01, eot: str | None = None) -> dict:
    from tokenizers import Tokenizer

    if not Path(tokenizer).is_file():
        raise UserInputError(f"tokenizer file {tokenizer} not found; pass a local tokenizers JSON file")
    tok = Tokenizer.from_file(tokenizer)
    eot_id = tok.token_to_id(eot) if eot else None
    if eot and eot_id is None:
        raise UserInputError(f"end-of-text token {eot!r} is not in the tokenizer's vocabulary")
    ids: list[int] = []
    n_bytes = 0
    for path in inputs:
        if not Path(path).is_file():
            raise UserInputError(f"input file {path} not found")
        if eot_id is not None:
            ids.append(eot_id)  # document separator, as in the FineWeb shards
        text = Path(path).read_text(encoding="utf-8")
        n_bytes += len(text.encode("utf-8"))
        ids.extend(tok.encode(text).ids)
    vocab = tok.get_vocab_size()
    dtype = np.uint16 if vocab <= 2**16 else np.uint32
    tokens = np.asarray(ids, dtype=dtype)
    n_val = max(1, int(len(tokens) * val_fraction))
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_shard(out_dir / f"{name}_val_000000.bin", tokens[-n_val:], dtype)
    train = tokens[:-n_val]
    for i, start in enumerate(range(0, len(train), shard_tokens), start=1):
        write_shard(out_dir / f"{name}_train_{i:06d}.bin", train[start:start + shard_tokens], dtype)
    meta = {"vocab_size": vocab, "dtype": np.dtype(dtype).name, "tokenizer": str(Path(tokenizer).resolve()),
            "train_tokens": int(len(train)), "val_tokens": int(n_val),
            # For val/bpb (bits per byte), which compares across tokenizers; the corpus average.
            "bytes_per_token": n_bytes / max(1, len(tokens))}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


@one_line_errors
def main(argv: list[str]) -> int:
    p = OneLineArgumentParser(prog="cli.py prepare-data", description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="UTF-8 text files")
    p.add_argument("--tokenizer", required=True, help="a local tokenizers JSON file")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--name", default="corpus")
    p.add_argument("--shard_tokens", type=int, default=100_000_000)
    p.add_argument("--val_fraction", type=float, default=0.01)
    p.add_argument("--eot", default=None, help="end-of-text token inserted before each document")
    a = p.parse_args(argv)
    meta = prepare(a.inputs, a.tokenizer, a.out, a.name, a.shard_tokens, a.val_fraction, a.eot)
    print(json.dumps(meta))
    return 0
