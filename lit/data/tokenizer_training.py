"""Train a byte-level BPE tokenizer (GPT-2's kind) on a local corpus with Hugging Face ``tokenizers``.

    python cli.py train-tokenizer --vocab_size 8192 --out tokenizer.json corpus/*.jsonl

It reads the inputs ``prepare-data`` reads (text, JSONL, parquet, a ``datasets`` folder; lit/data/documents.py)
and writes one ``tokenizer.json``. Byte-level means every byte has a token, so any text encodes without an
unknown token, and each token stands for a fixed string of bytes (what exact bits per byte counts). Special tokens
come first in the vocabulary (``<|endoftext|>`` is id 0 by default) and are never produced from text.

An empty corpus is refused (a byte-level BPE of only the bytes is not what anyone asked for), a vocabulary that
came out smaller than ``--vocab_size`` (too little text for that many merges) gets a warning line, and an existing
``--out`` is replaced only with ``--overwrite``: shards and checkpoints are tied to the exact tokenizer file.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from lit.data.documents import TEXT_UNITS, Corpus
from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors

DEFAULT_SPECIAL_TOKENS = ("<|endoftext|>",)
BYTE_ALPHABET = 256


def train_tokenizer(inputs: list[str], out: str, vocab_size: int = 8192,
                    special_tokens: tuple[str, ...] | list[str] = DEFAULT_SPECIAL_TOKENS, min_frequency: int = 2,
                    text_key: str = "text", text_unit: str = "file", max_bytes: int | None = None,
                    overwrite: bool = False):
    """Train on the documents of ``inputs`` (the first ``max_bytes`` input bytes if given), save to ``out``
    and return the ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    special_tokens = list(dict.fromkeys(special_tokens))
    if vocab_size < BYTE_ALPHABET + len(special_tokens):
        raise UserInputError(f"--vocab_size {vocab_size} is below the {BYTE_ALPHABET} byte tokens plus "
                             f"{len(special_tokens)} special tokens a byte-level BPE needs; raise it")
    if Path(out).is_dir():
        raise UserInputError(f"--out {out} is a folder; name the file to write, e.g. {Path(out) / 'tokenizer.json'}")
    if Path(out).exists() and not overwrite:
        raise UserInputError(f"{out} already exists; pass --overwrite to replace it, or another --out (shards and "
                             f"checkpoints made with the old file no longer match a new one)")
    corpus = Corpus(inputs, text_key=text_key, text_unit=text_unit)

    characters = 0

    def texts():
        nonlocal characters
        for text in corpus.texts():
            characters += len(text)
            yield text
            if max_bytes is not None and corpus.bytes_read >= max_bytes:
                return

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts(), trainer)
    if characters == 0:
        what = inputs[0] if len(inputs) == 1 else f"the {len(inputs)} inputs"
        raise UserInputError(f"{what} holds no text to train on (empty); give a corpus with text (nothing was "
                             f"written)")
    if tokenizer.get_vocab_size() < vocab_size:
        print(f"warning: the tokenizer has {tokenizer.get_vocab_size()} tokens, not the {vocab_size} asked: "
              f"{characters:,} characters of text hold no more merges seen at least --min_frequency {min_frequency} "
              f"times; give more text or a smaller --vocab_size", file=sys.stderr, flush=True)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    partial = f"{out}.partial-{os.getpid()}"
    try:
        tokenizer.save(partial)
        os.replace(partial, out)  # a reader never sees half a file
    finally:
        Path(partial).unlink(missing_ok=True)
    return tokenizer


@one_line_errors
def main(argv: list[str]) -> int:
    p = OneLineArgumentParser(prog="cli.py train-tokenizer", description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="text files, .jsonl/.parquet files or datasets folders")
    p.add_argument("--out", required=True, help="the tokenizer.json file to write (an existing one only with "
                   "--overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--vocab_size", type=int, default=8192, help="tokens, special ones included (default: 8192)")
    p.add_argument("--special_tokens", nargs="*", default=list(DEFAULT_SPECIAL_TOKENS),
                   help="tokens that text never produces, first in the vocabulary (default: <|endoftext|>)")
    p.add_argument("--min_frequency", type=int, default=2, help="merges seen fewer times are not learned (default: 2)")
    p.add_argument("--text_key", default="text",
                   help="the field/column holding the text (JSONL, parquet; default: text)")
    p.add_argument("--text_unit", choices=TEXT_UNITS, default="file",
                   help="what a document is in a text file (default: file)")
    p.add_argument("--max_bytes", type=int, default=None,
                   help="train on the first this many input bytes only (default: all)")
    a = p.parse_args(argv)
    start = time.perf_counter()
    tokenizer = train_tokenizer(a.inputs, a.out, a.vocab_size, a.special_tokens, a.min_frequency, a.text_key,
                                a.text_unit, a.max_bytes, a.overwrite)
    print(f"wrote {a.out}: byte-level BPE, {tokenizer.get_vocab_size()} tokens "
          f"(special: {', '.join(a.special_tokens) or 'none'}) in {time.perf_counter() - start:.1f} s", file=sys.stdout)
    return 0
