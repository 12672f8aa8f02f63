"""How many bytes of text each token id stands for: what exact bits per byte divides by.

A byte-level BPE token is a fixed string of bytes (its characters map one-to-one onto bytes through GPT-2's
``bytes_to_unicode`` table), so its length is exact. Special tokens (``<|endoftext|>``) stand for no text: 0 bytes.
For other tokenizers (WordPiece, SentencePiece-like) the decoded string of each token alone is counted, which is
exact when tokens decode independently.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import numpy as np

from lit.errors import UserInputError


@lru_cache(maxsize=1)
def _byte_level_chars() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` inverted: the printable character standing for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def load_tokenizer(path: str | Path):
    """A local tokenizers JSON file, set to encode text as ordinary text: a special token's string inside a
    document (``<|endoftext|>`` in a web page about language models) becomes its bytes' tokens, never the special
    id, as llm.c's ``encode_ordinary`` and nanochat's tokenizer do. Special ids are placed by ids only (the EOT
    ``prepare-data`` puts before each document, a prompt's start). Every encoding of text for training and
    evaluation (``prepare-data``, ``predict``'s prompt, lm-eval) loads its tokenizer here."""
    from tokenizers import Tokenizer

    if not Path(path).is_file():
        raise UserInputError(f"tokenizer file {path} not found; pass a local tokenizers JSON file "
                             f"(`python cli.py train-tokenizer` makes one)")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
        raise UserInputError(f"{path} is not a tokenizers JSON file ({e})") from e
    tokenizer.encode_special_tokens = True  # "encode them as text": the added vocabulary is not matched in text
    return tokenizer


def _is_byte_level(tokenizer) -> bool:
    return '"ByteLevel"' in tokenizer.to_str()


def token_byte_lengths(tokenizer) -> np.ndarray:
    """``lengths[id]``: the UTF-8 bytes of text that token ``id`` decodes to (0 for special tokens)."""
    vocab_size = tokenizer.get_vocab_size()
    lengths = np.zeros(vocab_size, dtype=np.int64)
    special = {token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special}
    byte_level = _is_byte_level(tokenizer)
    chars = _byte_level_chars()
    for token, index in tokenizer.get_vocab().items():
        if token in special:
            continue
        if byte_level and all(c in chars for c in token):
            lengths[index] = len(token)  # one character per byte
        else:
            lengths[index] = len(tokenizer.decode([index], skip_special_tokens=False).encode("utf-8"))
    return lengths


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
