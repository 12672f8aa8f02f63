"""Tokenize a corpus into llm.c token shards with a local tokenizer file (nothing is downloaded).

    python cli.py prepare-data --tokenizer tokenizer.json --out data/shards corpus/*.jsonl
    python -m lit.data.prepare --tokenizer tokenizer.json --out data/shards corpus/*.jsonl   (the same)

Inputs are what lit/data/documents.py reads: text files, JSONL, parquet, a ``datasets`` folder. Each document
becomes ``[EOT] [BOS] ids...`` (EOT before each document, as llm.c's FineWeb shards have it; BOS only if given)
and goes whole to train, val or test, drawn with ``--seed`` (so the splits do not depend on the number of
processes). Worker processes encode batches of documents; the main process appends their ids to the current shard
of each split, which is written out as it fills, so memory stays flat whatever the corpus size. Progress (tokens/s,
ETA) goes to stderr. ``meta.json`` records the tokenizer (path and SHA-256), the splits' documents, tokens, bytes
and shards (each with its token count), which ``TextDataModule(shards_dir=...)`` and MLflow's dataset record read.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

from lit.data.documents import PIECE_CHARS, TEXT_UNITS, Corpus
from lit.data.shard_format import ShardWriter
from lit.data.token_bytes import file_sha256, load_tokenizer
from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors

SPLITS = ("train", "val", "test")
BATCH_CHARS = 1 << 20  # text per task sent to a worker: large enough to amortise the pickling
IN_FLIGHT_PER_PROCESS = 4  # tasks queued per worker: enough to keep it busy, few enough to bound memory


def prepare(inputs: list[str], tokenizer: str, out: str, name: str = "corpus", shard_tokens: int = 100_000_000,
            val_fraction: float = 0.01, test_fraction: float = 0.01, eot: str | None = "<|endoftext|>",
            bos: str | None = None, seed: int = 0, processes: int = 1, text_key: str = "text",
            text_unit: str = "file", progress_every: float = 5.0, piece_chars: int = PIECE_CHARS) -> dict:
    """Write the shards and ``meta.json`` into ``out`` and return the meta."""
    tok = load_tokenizer(tokenizer)
    special_ids = {}
    for role, token in (("eot", eot), ("bos", bos)):
        if token:
            special_ids[role] = tok.token_to_id(token)
            if special_ids[role] is None:
                flag = f"--{role}"
                raise UserInputError(f"{role} token {token!r} is not in {tokenizer}'s vocabulary; pass {flag} with one "
                                     f"of its special tokens, or {flag} none")
    if not (0 <= val_fraction and 0 <= test_fraction and val_fraction + test_fraction < 1):
        raise UserInputError(f"--val_fraction {val_fraction} and --test_fraction {test_fraction} must be >= 0 and "
                             f"leave documents for train (sum below 1)")
    if shard_tokens <= 0 or processes <= 0:
        raise UserInputError("--shard_tokens and --processes must be positive")
    if any(split in name for split in SPLITS):
        raise UserInputError(f"--name {name!r} contains a split's name (train, val, test), which would mix the splits' "
                             f"shards; pick another")
    corpus = Corpus(inputs, text_key=text_key, text_unit=text_unit, piece_chars=piece_chars)
    out_dir = Path(out)
    if out_dir.is_dir() and any(out_dir.glob("*.bin")):
        raise UserInputError(f"{out_dir} already holds shards; pass an empty or new --out (nothing was overwritten)")
    out_dir.mkdir(parents=True, exist_ok=True)

    vocab = tok.get_vocab_size()
    dtype = np.uint16 if vocab <= 2**16 else np.uint32
    writers = {split: ShardWriter(out_dir, name, split, dtype, shard_tokens) for split in SPLITS}
    counts = {split: {"documents": 0, "bytes": 0} for split in SPLITS}
    prefix = [special_ids[r] for r in ("eot", "bos") if r in special_ids]
    draw = random.Random(seed)
    progress = Progress(corpus, progress_every)
    split = "train"
    try:
        for pieces, read, ids, lengths, n_bytes in encoded_batches(corpus, tokenizer, processes):
            start = 0
            for piece, length, piece_bytes in zip(pieces, lengths, n_bytes, strict=True):
                if piece.starts_document:
                    u = draw.random()
                    split = "val" if u < val_fraction else "test" if u < val_fraction + test_fraction else "train"
                    counts[split]["documents"] += 1
                    writers[split].append(np.asarray(prefix, dtype=dtype))
                writers[split].append(ids[start:start + length])
                counts[split]["bytes"] += int(piece_bytes)
                start += length
            progress.update(sum(w.tokens for w in writers.values()), read)
    finally:
        for writer in writers.values():
            writer.close()
    progress.done(sum(w.tokens for w in writers.values()))

    wanted = {"val": val_fraction, "test": test_fraction}
    empty = [s for s, fraction in wanted.items() if fraction > 0 and counts[s]["documents"] == 0]
    if empty or counts["train"]["documents"] == 0:
        missing = empty or ["train"]
        for writer in writers.values():  # what this call wrote, and nothing else
            for shard in writer.shards:
                (out_dir / shard["file"]).unlink()
        total = sum(c["documents"] for c in counts.values())
        raise UserInputError(f"of {total} documents none was drawn for {' and '.join(missing)}; give more documents "
                             f"(--text_unit paragraph or line cuts text files finer) or change the fractions")
    splits = {s: {**counts[s], "tokens": writers[s].tokens, "shards": writers[s].shards}
              for s in SPLITS if writers[s].shards}
    meta = {
        "format": "llm.c", "vocab_size": vocab, "dtype": np.dtype(dtype).name,
        "tokenizer": str(Path(tokenizer).resolve()), "tokenizer_sha256": file_sha256(tokenizer),
        "eot": eot or None, "eot_id": special_ids.get("eot"), "bos": bos or None, "bos_id": special_ids.get("bos"),
        "seed": seed, "val_fraction": val_fraction, "test_fraction": test_fraction,
        "text_unit": text_unit, "text_key": text_key, "inputs": [str(Path(p).resolve()) for p in inputs],
        "splits": splits, **{f"{s}_tokens": writers[s].tokens for s in SPLITS},
        # Validation's own bytes per token: only for bits per byte where no tokenizer is at hand (the exact
        # count reads each token's bytes from the tokenizer).
        "bytes_per_token": counts["val"]["bytes"] / max(1, writers["val"].tokens) if "val" in splits else None,
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def batches(corpus: Corpus, batch_chars: int = BATCH_CHARS):
    """Pieces grouped into tasks of about ``batch_chars`` characters, each with the input bytes read up to it
    (progress counts a task's input as done when its ids are written, not when it is read ahead)."""
    batch, size = [], 0
    for piece in corpus:
        batch.append(piece)
        size += len(piece.text)
        if size >= batch_chars:
            yield batch, corpus.bytes_read
            batch, size = [], 0
    if batch:
        yield batch, corpus.total_bytes


_worker_tokenizer = None


def _start_worker(tokenizer: str, one_thread: bool = True) -> None:
    global _worker_tokenizer
    if one_thread:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    _worker_tokenizer = load_tokenizer(tokenizer)


def encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One task: the ids of every text concatenated (uint32), each text's token count and UTF-8 bytes."""
    encode_batch = getattr(_worker_tokenizer, "encode_batch_fast", _worker_tokenizer.encode_batch)  # fast: 0.21+
    encodings = encode_batch(texts, add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
    ids = np.fromiter((i for e in encodings for i in e.ids), dtype=np.uint32, count=int(lengths.sum()))
    n_bytes = np.fromiter((len(t.encode("utf-8")) for t in texts), dtype=np.int64, count=len(texts))
    return ids, lengths, n_bytes


def encoded_batches(corpus: Corpus, tokenizer: str, processes: int):
    """``(pieces, input bytes read, ids, lengths, bytes)`` per task, in corpus order. With several processes a
    bounded number of tasks is in flight (``Pool.imap`` would read the whole corpus ahead into its queue)."""
    if processes == 1:
        _start_worker(tokenizer, one_thread=False)  # this process's environment is the caller's
        for batch, read in batches(corpus):
            yield (batch, read, *encode([p.text for p in batch]))
        return
    # fork: a spawned worker would import lit.data (Lightning, torch) again; forked ones share those pages.
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with context.Pool(processes, initializer=_start_worker, initargs=(tokenizer,)) as pool:
        pending: deque = deque()
        for batch, read in batches(corpus):
            pending.append((batch, read, pool.apply_async(encode, ([p.text for p in batch],))))
            if len(pending) >= processes * IN_FLIGHT_PER_PROCESS:
                done, done_read, result = pending.popleft()
                yield (done, done_read, *result.get())
        while pending:
            done, done_read, result = pending.popleft()
            yield (done, done_read, *result.get())


class Progress:
    """A line on stderr every ``every`` seconds: tokens, tokens/s, how much of the input is read, and the ETA."""

    def __init__(self, corpus: Corpus, every: float):
        self.corpus, self.every = corpus, every
        self.start = self.last = time.perf_counter()

    def update(self, tokens: int, read: int) -> None:
        now = time.perf_counter()
        if self.every and now - self.last >= self.every:
            self.last = now
            elapsed = now - self.start
            fraction = read / max(1, self.corpus.total_bytes)
            eta = elapsed * (1 - fraction) / fraction if fraction > 0 else float("nan")
            print(f"prepare-data: {tokens:,} tokens, {tokens / elapsed:,.0f} tokens/s, {fraction:.1%} of "
                  f"{self.corpus.total_bytes / 1e6:,.1f} MB done, ETA {eta:,.0f} s", file=sys.stderr, flush=True)

    def done(self, tokens: int) -> None:
        elapsed = time.perf_counter() - self.start
        print(f"prepare-data: {tokens:,} tokens in {elapsed:,.1f} s ({tokens / max(elapsed, 1e-9):,.0f} tokens/s)",
              file=sys.stderr, flush=True)


def _none_or(value: str) -> str | None:
    return None if value.lower() in ("", "none") else value


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(prog="cli.py prepare-data", description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="text files, .jsonl/.parquet files or datasets folders")
    p.add_argument("--tokenizer", required=True, help="a local tokenizers JSON file (cli.py train-tokenizer)")
    p.add_argument("--out", required=True, help="output directory (new or empty of shards)")
    p.add_argument("--name", default="corpus", help="shard file prefix: NAME_train_000000.bin, ...")
    p.add_argument("--shard_tokens", type=int, default=100_000_000)
    p.add_argument("--val_fraction", type=float, default=0.01, help="share of documents drawn for validation")
    p.add_argument("--test_fraction", type=float, default=0.01, help="share of documents drawn for test (0: none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draw of each document's split")
    p.add_argument("--eot", type=_none_or, default="<|endoftext|>", 
                   help="token before each document ('none': no token)")
    p.add_argument("--bos", type=_none_or, default=None, help="token starting each document, after the EOT")
    p.add_argument("--processes", type=int, default=max(1, min(8, os.cpu_count() or 1)), help="encoding processes")
    p.add_argument("--text_key", default="text", help="the field/column holding the text (JSONL, parquet, datasets)")
    p.add_argument("--text_unit", choices=TEXT_UNITS, default="file", help="what a document is in a text file")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    meta = prepare(a.inputs, a.tokenizer, a.out, a.name, a.shard_tokens, a.val_fraction, a.test_fraction, a.eot,
                   a.bos, a.seed, a.processes, a.text_key, a.text_unit)
    summary = {s: {k: meta["splits"][s][k] for k in ("documents", "tokens", "bytes")} | {
        "shards": len(meta["splits"][s]["shards"])} for s in meta["splits"]}
    print(json.dumps({"out": str(Path(a.out)), "vocab_size": meta["vocab_size"], "splits": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
