"""Text data for language models: the embedded tinyshakespeare corpus by default, token shards at scale."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lit.data.resumable import train_loader
from lit.data.shards import TokenWindows, find_shards, read_meta
from lit.errors import UserInputError

EMBEDDED_CORPUS = "tinyshakespeare"


class CharTokenizer:
    """Character-level vocabulary: the sorted set of characters of the corpus (deterministic)."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self.index.keys())
        if unknown:
            raise UserInputError(f"characters {unknown!r} are not in the corpus vocabulary; use only these: "
                                 f"{''.join(self.chars)!r}")
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)


def shard_token_bytes(shards_dir: str, meta: dict, tokenizer: str | None, vocab_size: int) -> np.ndarray | None:
    """Bytes per token id of the shards' tokenizer (``tokenizer`` or the one ``meta.json`` names), padded with 0
    up to ``vocab_size`` (a vocabulary rounded up for speed); None if neither is known."""
    from lit.data.token_bytes import file_sha256, load_tokenizer, token_byte_lengths

    path = tokenizer or meta.get("tokenizer")
    if path is None:
        return None
    if tokenizer is None and not Path(path).is_file():
        raise UserInputError(f"{shards_dir}/meta.json names the tokenizer {path}, which is not there; pass its new "
                             f"place with --data.tokenizer")
    recorded = meta.get("tokenizer_sha256")
    if recorded and file_sha256(path) != recorded:
        raise UserInputError(f"{path} is not the tokenizer these shards were made with (its SHA-256 differs from "
                             f"{shards_dir}/meta.json's); pass that one with --data.tokenizer")
    lengths = token_byte_lengths(load_tokenizer(path))
    if len(lengths) > vocab_size:
        raise UserInputError(f"the tokenizer {path} has {len(lengths)} tokens but the shards' vocabulary is "
                             f"{vocab_size}; pass the shards' own tokenizer with --data.tokenizer")
    return np.pad(lengths, (0, vocab_size - len(lengths)))


class _Windows(Dataset):
    """Non-overlapping (input, target) windows of one token array."""

    def __init__(self, tokens: torch.Tensor, block_size: int):
        self.tokens, self.block_size = tokens, block_size

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def __getitem__(self, i: int):
        chunk = self.tokens[i * self.block_size: (i + 1) * self.block_size + 1]
        return chunk[:-1], chunk[1:]


class _Prompts(Dataset):
    def __init__(self, ids: list[int], n: int):
        self.ids, self.n = torch.tensor(ids, dtype=torch.long), n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.ids


class TextDataModule(L.LightningDataModule):
    """Language-model data: a char-level corpus (embedded tinyshakespeare, or a text file), or token shards.

    Args:
        text_file: a UTF-8 text file for char-level training; None uses the embedded tinyshakespeare.
        shards_dir: a directory of pre-tokenized ``*train*.bin`` / ``*val*.bin`` shards (see
            ``lit.data.prepare``); takes precedence over ``text_file``.
        vocab_size: for shards without ``meta.json``; ignored for char-level text.
        block_size: tokens per training sequence (the model's context is linked to it).
        batch_size: sequences per batch, per process.
        val_fraction: the last fraction of the corpus is the validation split (deterministic).
        test_fraction: the fraction of the corpus just before the validation split is the held-out test
            split (``trainer.test``; a sweep reports on it and tunes on validation). Train is what precedes
            it: with the defaults, train is the first 85% of the corpus, test the next 5%, validation the
            last 10% (the same validation text as before the test split existed). 0: no test split.
            Token shards have a test split when ``*test*.bin`` shards exist.
        num_workers: DataLoader workers. 0 loads in the training process, which keeps up: a batch of windows is
            a slice and a copy (about 1 ms for 64 x 1024 tokens), and since no training step waits for the device
            (``lit/log_steps.py``) the host builds the next batch while the device computes this one.
        prompt: the text that ``predict`` continues.
        num_samples: how many samples ``predict`` draws.
        seed: seed of the training order; None follows ``seed_everything``. A sweep gives seed i the same
            order in every variant, so their differences pair (see ``lit.data.resumable``).
        val_tokens: score only the first this many tokens of the validation split (a multiple of
            ``block_size``); None: all of it. modded-nanogpt validates on the first 10,485,760 tokens of its
            FineWeb val shard (recipes/gpt_fineweb_track3.yaml).

        tokenizer: the tokenizers JSON file of token shards, for exact bits per byte (``val/bpb``); default: the
            one ``meta.json`` names (``prepare-data`` records it). Give it for shards made elsewhere (llm.c's
            FineWeb shards: GPT-2's tokenizer.json).

    ``token_bytes[id]`` is the UTF-8 bytes token ``id`` stands for (0 for special tokens), from the character
    vocabulary or the shards' tokenizer; the model reads it for exact ``val/bpb`` and ``test/bpb``
    (lit/bits_per_byte.py). ``bytes_per_token`` (a fact linked to the model) is the mean bytes per token of the
    validation text, or ``meta.json``'s value for shards; the model uses it only where ``token_bytes`` is None.
    """

    def __init__(self, text_file: str | None = None, shards_dir: str | None = None,
                 vocab_size: int | None = None, block_size: int = 256, batch_size: int = 32,
                 val_fraction: float = 0.1, num_workers: int = 0, prompt: str = "\n", num_samples: int = 1,
                 seed: int | None = None, val_tokens: int | None = None, test_fraction: float = 0.05,
                 tokenizer: str | None = None):
        super().__init__()
        self.seed = seed
        if not 0 < val_fraction < 1:
            raise UserInputError(f"--data.val_fraction must be in (0, 1), got {val_fraction}")
        if not 0 <= test_fraction < 1 - val_fraction:
            raise UserInputError(f"--data.test_fraction must be in [0, 1 - val_fraction), got {test_fraction}")
        self.test_fraction = test_fraction
        if val_tokens is not None and (val_tokens <= 0 or val_tokens % block_size):
            raise UserInputError(f"--data.val_tokens={val_tokens} must be a positive multiple of --data.block_size="
                                 f"{block_size}, so that every validation token is scored exactly once")
        self.val_tokens = val_tokens
        self.text_file, self.shards_dir = text_file, shards_dir
        self.block_size, self.batch_size, self.num_workers = block_size, batch_size, num_workers
        self.val_fraction, self.prompt, self.num_samples = val_fraction, prompt, num_samples
        self.tokenizer: CharTokenizer | None = None
        self.tokenizer_file = tokenizer
        if shards_dir is not None:
            meta = read_meta(Path(shards_dir))
            find_shards(shards_dir, "train")  # fail now, with a clear line, not inside the trainer
            self.shard_dtype = meta.get("dtype", "uint16")
            self.vocab_size = meta.get("vocab_size", vocab_size)
            if self.vocab_size is None:
                raise UserInputError(f"{shards_dir} has no meta.json; pass --data.vocab_size")
            self.bytes_per_token = meta.get("bytes_per_token")
            self.token_bytes = shard_token_bytes(shards_dir, meta, tokenizer, self.vocab_size)
            self.has_test_split = any("test" in p.name for p in Path(shards_dir).glob("*.bin"))
        else:
            self.text = self._read_text()
            self.tokenizer = CharTokenizer(self.text)
            self.vocab_size = self.tokenizer.vocab_size
            val_text = self.text[self._split_index(len(self.text)):]
            self.bytes_per_token = len(val_text.encode("utf-8")) / max(1, len(val_text))
            self.token_bytes = np.array([len(c.encode("utf-8")) for c in self.tokenizer.chars], dtype=np.int64)
            self.has_test_split = test_fraction > 0

    def dataset_record(self) -> dict:
        """What identifies these data (name, digest, source, profile), for MLflow's dataset input."""
        from lit.data.fingerprint import shard_record, text_record

        if self.shards_dir is not None:
            record = self.tokenizer_record()
            return shard_record(self.shards_dir, read_meta(Path(self.shards_dir)), record and record["sha256"])
        return text_record(self.text, self._text_source())

    def tokenizer_record(self) -> dict | None:
        """Which tokenizer gives these token ids (lit/data/tokenizer_record.py): the shards' (``--data.tokenizer``,
        else the one meta.json names, with its recorded SHA-256), or the text's character vocabulary; None for
        shards whose tokenizer nobody named."""
        from lit.data import tokenizer_record

        if self.shards_dir is None:
            return tokenizer_record.of_characters(self.tokenizer.chars, self._text_source())
        meta = read_meta(Path(self.shards_dir))
        path = self.tokenizer_file or meta.get("tokenizer")
        if path is None:
            return None
        # A --data.tokenizer was checked against meta.json's SHA-256 when the data module was built.
        sha = meta.get("tokenizer_sha256")
        if sha is None and not Path(path).is_file():
            return None
        return tokenizer_record.of_tokenizer_file(path, sha)

    def _text_source(self) -> str:
        return self.text_file or f"lit/data/{EMBEDDED_CORPUS}.txt"

    def _split_index(self, n_tokens: int) -> int:
        """Where the validation split starts: the last ``val_fraction`` of the tokens (one token per character)."""
        return int(n_tokens * (1 - self.val_fraction))

    def _test_index(self, n_tokens: int) -> int:
        """Where the test split starts: ``test_fraction`` of the tokens before the validation split."""
        return self._split_index(n_tokens) - int(n_tokens * self.test_fraction)

    def _read_text(self) -> str:
        if self.text_file is None:
            return resources.files("lit.data").joinpath(f"{EMBEDDED_CORPUS}.txt").read_text(encoding="utf-8")
        path = Path(self.text_file)
        if not path.is_file():
            raise UserInputError(f"text file {path} not found; pass an existing file with --data.text_file "
                                 f"or drop the option to use the embedded {EMBEDDED_CORPUS} corpus")
        return path.read_text(encoding="utf-8")

    def setup(self, stage: str | None = None) -> None:
        if self.shards_dir is not None:
            self.train_set = TokenWindows(find_shards(self.shards_dir, "train"), self.block_size, self.shard_dtype)
            self.val_set = TokenWindows(find_shards(self.shards_dir, "val"), self.block_size, self.shard_dtype,
                                        max_tokens=self.val_tokens)
            self._check_val_tokens(self.val_set.n_predicted)
            if self.has_test_split:
                self.test_set = TokenWindows(find_shards(self.shards_dir, "test"), self.block_size, self.shard_dtype)
            return
        tokens = torch.from_numpy(np.array(self.tokenizer.encode(self.text), dtype=np.int64))
        split, test_start = self._split_index(len(tokens)), self._test_index(len(tokens))
        # Windows never read past their slice: the three splits share no token.
        self.train_set = _Windows(tokens[:test_start], self.block_size)
        if self.has_test_split:
            self.test_set = _Windows(tokens[test_start:split], self.block_size)
        val_end = len(tokens) if self.val_tokens is None else split + self.val_tokens + 1
        self.val_set = _Windows(tokens[split:val_end], self.block_size)
        self._check_val_tokens(len(self.val_set) * self.block_size)
        if len(self.train_set) == 0 or len(self.val_set) == 0 or (self.has_test_split and len(self.test_set) == 0):
            raise UserInputError(f"the corpus is too short for block_size={self.block_size} "
                                 f"({len(tokens)} tokens); lower --data.block_size")

    def _check_val_tokens(self, scored: int) -> None:
        if self.val_tokens is not None and scored < self.val_tokens:
            raise UserInputError(f"--data.val_tokens={self.val_tokens} but the validation split holds only {scored} "
                                 f"scorable tokens at block_size={self.block_size}; lower --data.val_tokens")

    def _pin_memory(self) -> bool:
        """Batches in pinned (page-locked) host memory when training on a CUDA device: Lightning's copy to the
        device is then truly asynchronous (``non_blocking``); from pageable memory CUDA stages it synchronously,
        a host-device sync per batch. Nothing changes on a CPU."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            return trainer.strategy.root_device.type == "cuda"
        return torch.cuda.is_available()

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        return DataLoader(dataset, batch_size=self.batch_size, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, pin_memory=self._pin_memory())

    def train_dataloader(self) -> DataLoader:
        return train_loader(self, self.train_set, self.batch_size, num_workers=self.num_workers,
                            persistent_workers=self.num_workers > 0, pin_memory=self._pin_memory())

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        if not self.has_test_split:
            raise UserInputError("these data have no test split: set --data.test_fraction (char-level text) or "
                                 "add *test*.bin shards; validate with `cli.py validate` instead")
        return self._eval_loader(self.test_set)

    def predict_dataloader(self) -> DataLoader:
        if self.tokenizer is None:
            # Token shards: the prompt follows the document-start tokens that prepare-data put before each document.
            meta = read_meta(Path(self.shards_dir))
            start = [meta[k] for k in ("eot_id", "bos_id") if meta.get(k) is not None]
            ids = start + self._shard_tokenizer().encode(self.prompt, add_special_tokens=False).ids
            return DataLoader(_Prompts(ids, self.num_samples), batch_size=1)
        return DataLoader(_Prompts(self.tokenizer.encode(self.prompt), self.num_samples), batch_size=1)

    def decode(self, ids) -> str:
        if self.tokenizer is None:
            return self._shard_tokenizer().decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(ids)

    def _shard_tokenizer(self):
        """The shards' tokenizers file (``--data.tokenizer``, or the one meta.json names), loaded once."""
        if getattr(self, "_loaded_tokenizer", None) is None:
            from lit.data.token_bytes import load_tokenizer

            path = self.tokenizer_file or read_meta(Path(self.shards_dir)).get("tokenizer")
            if path is None:
                raise UserInputError(f"{self.shards_dir} names no tokenizer (no meta.json from prepare-data); pass "
                                     f"--data.tokenizer=tokenizer.json to encode prompts and decode samples")
            self._loaded_tokenizer = load_tokenizer(path)
        return self._loaded_tokenizer
