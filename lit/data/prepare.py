"""Tokenize a corpus into llm.c token shards with a local tokenizer file (nothing is downloaded).

    python cli.py prepare-data --tokenizer tokenizer.json --out data/shards corpus/*.jsonl
    python -m lit.data.prepare --tokenizer tokenizer.json --out data/shards corpus/*.jsonl   (the same)

Inputs are what lit/data/documents.py reads: text files, JSONL, parquet, a ``datasets`` folder. Each document
becomes ``[EOT] [BOS] ids...`` (EOT before each document, as llm.c's FineWeb shards have it; BOS only if given);
its text is ordinary text, so a literal ``<|endoftext|>`` in it is encoded as bytes, not as the EOT (llm.c's
``encode_ordinary``; lit/data/token_bytes.py's ``load_tokenizer``). Each document goes whole to train, val or test,
drawn with ``--seed`` (so the splits do not depend on the number of processes). One text file read as one
document cannot be drawn; it is cut by position at line starts instead (train first, then test, val last: nanoGPT's
rule for tinyshakespeare). Worker processes encode batches of documents; the main process appends their ids to the
current shard of each split, which is written out as it fills, so memory stays flat whatever the corpus size.
Everything is written into a folder beside ``--out`` that becomes ``--out`` once ``meta.json`` is written
(lit/data/staged_folder.py): a run that fails half way leaves ``--out`` as it was. Progress (tokens/s, ETA) goes
to stderr. ``meta.json`` records the tokenizer (path and SHA-256), the splits' documents, tokens, bytes and shards
(each with its token count), which ``TextDataModule(shards_dir=...)`` and MLflow's dataset record read.
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
from lit.data.staged_folder import staged_folder
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
    positions = split_positions(corpus, val_fraction, test_fraction)
    if positions:
        corpus.cut_at = tuple(sorted(at for at in positions.values() if at is not None))
    with staged_folder(out) as work:  # --out appears whole, with its meta.json, or not at all
        if positions:
            print(f"prepare-data: {inputs[0]} is one text document, so it is split by position at line starts: "
                  f"{_position_rule(val_fraction, test_fraction)} (nanoGPT's rule; --text_unit paragraph or line "
                  f"draws documents at random instead)", file=sys.stderr, flush=True)
        return _write_shards(corpus, inputs, tok, tokenizer, work, name, shard_tokens, val_fraction, test_fraction,
                             eot, bos, special_ids, seed, processes, text_key, text_unit, progress_every, positions)


def split_positions(corpus: Corpus, val_fraction: float, test_fraction: float) -> dict[str, int | None] | None:
    """Where test and val start, in bytes, when the corpus is a single text file read as one document; None
    otherwise (documents are drawn). A document cannot be split by drawing, so one text file is cut as nanoGPT
    cuts tinyshakespeare: train first, then test, then val last (TextDataModule's order for char-level text)."""
    if corpus.kinds != ["text"] or corpus.text_unit != "file":
        return None
    size = corpus.total_bytes
    val_start = size - int(size * val_fraction) if val_fraction > 0 else None
    test_end = size if val_start is None else val_start
    test_start = test_end - int(size * test_fraction) if test_fraction > 0 else None
    return {"test": test_start, "val": val_start}


def _position_rule(val_fraction: float, test_fraction: float) -> str:
    parts = [f"train the first {1 - val_fraction - test_fraction:.0%}"]
    if test_fraction > 0:
        parts.append(f"test the next {test_fraction:.0%}")
    if val_fraction > 0:
        parts.append(f"val the last {val_fraction:.0%}")
    return ", ".join(parts)


def _split_at(position: int, positions: dict[str, int | None]) -> str:
    for split in ("val", "test"):  # val is last: a position past its start is val's
        if positions[split] is not None and position >= positions[split]:
            return split
    return "train"


def _write_shards(corpus: Corpus, inputs: list[str], tok, tokenizer: str, out_dir: Path, name: str,
                  shard_tokens: int, val_fraction: float, test_fraction: float, eot: str | None, bos: str | None,
                  special_ids: dict, seed: int, processes: int, text_key: str, text_unit: str,
                  progress_every: float, positions: dict[str, int | None] | None) -> dict:
    vocab = tok.get_vocab_size()
    dtype = np.uint16 if vocab <= 2**16 else np.uint32
    writers = {split: ShardWriter(out_dir, name, split, dtype, shard_tokens) for split in SPLITS}
    counts = {split: {"documents": 0, "bytes": 0} for split in SPLITS}
    prefix = [special_ids[r] for r in ("eot", "bos") if r in special_ids]
    draw = random.Random(seed)
    progress = Progress(corpus, progress_every)
    split, position = "train", 0
    try:
        for pieces, read, ids, lengths, n_bytes in encoded_batches(corpus, tokenizer, processes):
            start = 0
            for piece, length, piece_bytes in zip(pieces, lengths, n_bytes, strict=True):
                if piece.starts_document:
                    if positions:
                        split = _split_at(position, positions)
                    else:
                        u = draw.random()
                        split = "val" if u < val_fraction else "test" if u < val_fraction + test_fraction else "train"
                    counts[split]["documents"] += 1
                    writers[split].append(np.asarray(prefix, dtype=dtype))
                writers[split].append(ids[start:start + length])
                counts[split]["bytes"] += int(piece_bytes)
                start += length
                position += int(piece_bytes)
            progress.update(sum(w.tokens for w in writers.values()), read)
    finally:
        for writer in writers.values():
            writer.close()

    total = sum(c["documents"] for c in counts.values())
    if sum(c["bytes"] for c in counts.values()) == 0:
        raise UserInputError(f"{_described(inputs)} {'holds' if len(inputs) == 1 else 'hold'} no text "
                             f"({total} documents{', all empty' if total else ''}); give a corpus with text")
    wanted = {"val": val_fraction, "test": test_fraction}
    empty = [s for s, fraction in wanted.items() if fraction > 0 and counts[s]["documents"] == 0]
    if empty or counts["train"]["documents"] == 0:
        missing = empty or ["train"]
        if positions:
            raise UserInputError(f"{inputs[0]} is too short to cut {' and '.join(missing)} at a line start; give "
                                 f"more text or larger fractions (--val_fraction, --test_fraction)")
        raise UserInputError(f"of {total} documents none was drawn for {' and '.join(missing)}; give more documents "
                             f"(--text_unit paragraph or line cuts text files finer) or change the fractions")
    progress.done(sum(w.tokens for w in writers.values()))
    splits = {s: {**counts[s], "tokens": writers[s].tokens, "shards": writers[s].shards}
              for s in SPLITS if writers[s].shards}
    meta = {
        "format": "llm.c", "vocab_size": vocab, "dtype": np.dtype(dtype).name,
        "tokenizer": str(Path(tokenizer).resolve()), "tokenizer_sha256": file_sha256(tokenizer),
        "eot": eot or None, "eot_id": special_ids.get("eot"), "bos": bos or None, "bos_id": special_ids.get("bos"),
        "seed": seed, "val_fraction": val_fraction, "test_fraction": test_fraction,
        "split_by": "position" if positions else "document draw",
        "text_unit": text_unit, "text_key": text_key, "inputs": [str(Path(p).resolve()) for p in inputs],
        "splits": splits, **{f"{s}_tokens": writers[s].tokens for s in SPLITS},
        # Validation's own bytes per token: only for bits per byte where no tokenizer is at hand (the exact
        # count reads each token's bytes from the tokenizer).
        "bytes_per_token": counts["val"]["bytes"] / max(1, writers["val"].tokens) if "val" in splits else None,
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def _described(inputs: list[str]) -> str:
    if len(inputs) == 1:
        return str(inputs[0])
    return f"the {len(inputs)} inputs ({', '.join(map(str, inputs[:2]))}{', ...' if len(inputs) > 2 else ''})"


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
    p.add_argument("--out", required=True, help="output folder, new or empty; it appears only once complete")
    p.add_argument("--name", default="corpus", help="shard file prefix: NAME_train_000000.bin, ... (default: corpus)")
    p.add_argument("--shard_tokens", type=int, default=100_000_000, help="tokens per shard (default: 100,000,000)")
    p.add_argument("--val_fraction", type=float, default=0.01,
                   help="share of documents drawn for validation (default: 0.01)")
    p.add_argument("--test_fraction", type=float, default=0.01,
                   help="share of documents drawn for test; 0: none (default: 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draw of each document's split (default: 0)")
    p.add_argument("--eot", type=_none_or, default="<|endoftext|>",
                   help="token before each document; 'none': no token (default: <|endoftext|>)")
    p.add_argument("--bos", type=_none_or, default=None, help="token starting each document, after the EOT "
                   "(default: none)")
    cores = os.cpu_count() or 1
    p.add_argument("--processes", type=int, default=max(1, min(8, cores)),
                   help=f"encoding processes (default: min(8, cores), {max(1, min(8, cores))} here)")
    p.add_argument("--text_key", default="text",
                   help="the field/column holding the text: JSONL, parquet, datasets (default: text)")
    p.add_argument("--text_unit", choices=TEXT_UNITS, default="file",
                   help="what a document is in a text file (default: file; one text file alone is then split by "
                        "position: train first, test, val last)")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    meta = prepare(a.inputs, a.tokenizer, a.out, a.name, a.shard_tokens, a.val_fraction, a.test_fraction, a.eot,
                   a.bos, a.seed, a.processes, a.text_key, a.text_unit)
    summary = {s: {k: meta["splits"][s][k] for k in ("documents", "tokens", "bytes")} | {
        "shards": len(meta["splits"][s]["shards"])} for s in meta["splits"]}
    print(json.dumps({"out": str(Path(a.out)), "vocab_size": meta["vocab_size"], "splits": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
