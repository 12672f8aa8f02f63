"""Text data: the embedded corpus, char vocabulary, deterministic split, token shards and their preparation."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from lit.data.prepare import prepare
from lit.data.shards import TokenWindows, find_shards, write_shard
from lit.data.text import TextDataModule
from lit.errors import UserInputError


def test_embedded_corpus_is_tinyshakespeare():
    dm = TextDataModule(block_size=64, batch_size=4)
    assert len(dm.text) == 1_115_394 and dm.text.startswith("First Citizen:")
    assert dm.vocab_size == 65
    assert dm.decode(dm.tokenizer.encode("To be, or not")) == "To be, or not"


def test_split_is_deterministic_and_disjoint():
    a, b = TextDataModule(block_size=64), TextDataModule(block_size=64)
    a.setup("fit"), b.setup("fit")
    assert torch.equal(a.val_set[0][0], b.val_set[0][0])
    n = len(a.text)
    val_start, test_start = int(n * 0.9), int(n * 0.9) - int(n * 0.05)
    assert len(a.train_set) == (test_start - 1) // 64
    x, y = a.train_set[3]
    assert torch.equal(x[1:], y[:-1]) and x.shape == (64,)
    # Train | test | val: validation is the last 10%, the same text as before the test split existed; the test
    # split is the 5% before it; no window reads a token of another split.
    assert a.decode(a.val_set[0][0].tolist()) == a.text[val_start: val_start + 64]
    assert a.decode(a.test_set[0][0].tolist()) == a.text[test_start: test_start + 64]
    assert len(a.test_set) == (val_start - test_start - 1) // 64
    last_train = a.train_set[len(a.train_set) - 1][1]  # the targets reach furthest
    assert a.decode(last_train.tolist()) in a.text[:test_start]
    last_test = a.test_set[len(a.test_set) - 1][1]
    assert a.decode(last_test.tolist()) in a.text[test_start:val_start]
    assert a.has_test_split and len(a.test_dataloader()) > 0


def test_no_test_split_is_said_not_replaced_by_validation():
    dm = TextDataModule(block_size=64, test_fraction=0)
    dm.setup("test")
    assert not dm.has_test_split and len(dm.train_set) == (int(len(dm.text) * 0.9) - 1) // 64
    with pytest.raises(UserInputError, match="no test split"):
        dm.test_dataloader()
    with pytest.raises(UserInputError, match="test_fraction"):
        TextDataModule(val_fraction=0.5, test_fraction=0.5)


def test_text_file_and_missing_file(tmp_path):
    f = tmp_path / "tiny.txt"
    f.write_text("abcabcabd" * 50)
    dm = TextDataModule(text_file=str(f), block_size=8, batch_size=2)
    assert dm.vocab_size == 4
    with pytest.raises(UserInputError, match="not found; pass an existing file with --data.text_file"):
        TextDataModule(text_file=str(tmp_path / "missing.txt"))


def test_llmc_and_nanogpt_shard_layouts(tmp_path):
    tokens = np.arange(1000, dtype=np.uint32) * 70  # values above 2**16 need uint32
    write_shard(tmp_path / "d_train_000001.bin", tokens, np.uint32)
    write_shard(tmp_path / "d_val_000000.bin", tokens[:300] % 60000, np.uint16)
    windows = TokenWindows(find_shards(tmp_path, "train"), block_size=10)
    assert len(windows) == 99
    x, y = windows[5]
    assert x.tolist() == (np.arange(50, 60) * 70).tolist() and y[-1].item() == 60 * 70
    raw = tmp_path / "raw"
    raw.mkdir()
    (np.arange(500, dtype=np.uint16)).tofile(raw / "train.bin")  # nanoGPT: no header
    x, _ = TokenWindows(find_shards(raw, "train"), block_size=8)[2]
    assert x.tolist() == list(range(16, 24))


def test_prepare_with_a_local_tokenizer_then_train_windows(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    corpus = [tmp_path / f"doc{i}.txt" for i in range(2)]
    for i, path in enumerate(corpus):
        path.write_text((f"the quick brown fox jumps over the lazy dog {i}\n") * 200)
    tok.train([str(p) for p in corpus], trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<eot>"]))
    tok.save(str(tmp_path / "tokenizer.json"))

    meta = prepare([str(p) for p in corpus], str(tmp_path / "tokenizer.json"), str(tmp_path / "shards"),
                   shard_tokens=1000, val_fraction=0.1, test_fraction=0.1, eot="<eot>", text_unit="line")
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == tok.get_vocab_size()
    assert json.loads((tmp_path / "shards" / "meta.json").read_text())["vocab_size"] == meta["vocab_size"]
    assert len(find_shards(tmp_path / "shards", "train")) >= 2
    assert sum(s["documents"] for s in meta["splits"].values()) == 400  # one document per line

    # The approximate bits-per-byte fallback: validation's own bytes per token (EOTs count as tokens).
    val = meta["splits"]["val"]
    assert meta["bytes_per_token"] == pytest.approx(val["bytes"] / val["tokens"]) and meta["bytes_per_token"] > 1
    dm = TextDataModule(shards_dir=str(tmp_path / "shards"), block_size=16, batch_size=2)
    assert dm.vocab_size == meta["vocab_size"] and dm.bytes_per_token == meta["bytes_per_token"]
    dm.setup("fit")
    assert dm.has_test_split and len(dm.test_set) > 0
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (2, 16) and int(x.max()) < meta["vocab_size"]
    # Round trip: the shards hold exactly what the tokenizer produced, an <eot> before each document.
    first = TokenWindows(find_shards(tmp_path / "shards", "train"), block_size=8)[0][0].tolist()
    assert first[0] == tok.token_to_id("<eot>")
    assert first[1:] == tok.encode(corpus[0].read_text().splitlines()[0]).ids[:7]  # every line reads the same


def test_missing_shards_dir_says_how_to_make_it(tmp_path):
    with pytest.raises(UserInputError, match="python cli.py prepare-data"):
        TextDataModule(shards_dir=str(tmp_path / "nope"))


def test_the_data_seed_fixes_the_order_apart_from_the_run_seed(monkeypatch):
    def order(run_seed: int, data_seed: int | None) -> list[int]:
        monkeypatch.setenv("PL_GLOBAL_SEED", str(run_seed))
        dm = TextDataModule(block_size=64, batch_size=4, seed=data_seed)
        dm.setup("fit")
        return [int(x[:, 0].sum()) for x, _ in itertools.islice(dm.train_dataloader(), 5)]

    assert order(1, data_seed=7) == order(2, data_seed=7)  # the run seed no longer moves the data
    assert order(1, data_seed=7) != order(1, data_seed=8)
    assert order(3, data_seed=None) == order(3, data_seed=3)  # unset: the order follows seed_everything


def test_bytes_per_token_of_the_embedded_corpus_is_one():
    # tinyshakespeare is ASCII: a character token is one byte, so val/bpb = val/loss / ln 2.
    assert TextDataModule(block_size=64).bytes_per_token == 1.0
