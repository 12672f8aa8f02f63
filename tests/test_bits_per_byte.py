"""Exact bits per byte: the nats of the scored tokens over the bytes they decode to, checked against a hand count,
for the char path and for shards (prepared here, and llm.c shards given a tokenizer file)."""

from __future__ import annotations

import json
import math

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lit.data.prepare import prepare
from lit.data.shards import find_shards, open_shard, write_shard
from lit.data.text import TextDataModule
from lit.data.tokenizer_training import train_tokenizer
from lit.errors import UserInputError
from lit.language_model import LanguageModel
from lit.models.transformer import TransformerConfig

# Multi-byte characters bunched in some windows: a mean bytes-per-token would be far off there.
TEXT = ("plain ascii text here. " * 40 + "é à ü 😀 日本語 " * 25 + "\n") * 6


def scored(dm: TextDataModule, stage: str) -> float:
    model = LanguageModel(vocab_size=dm.vocab_size, block_size=dm.block_size,
                          arch=TransformerConfig(d_model=16, n_layers=1, n_heads=2), bytes_per_token=dm.bytes_per_token)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    logged = (trainer.validate if stage == "val" else trainer.test)(model, datamodule=dm, verbose=False)[0]
    return logged[f"{stage}/bpb"], model


def by_hand(model: LanguageModel, loader, byte_count) -> float:
    nats, n_bytes = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            nats += F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten(), reduction="sum").item()
            n_bytes += sum(byte_count(t) for t in y.flatten().tolist())
    return nats / n_bytes / math.log(2)


def test_char_path_bits_per_byte_is_the_hand_count(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_text(TEXT, encoding="utf-8")
    dm = TextDataModule(text_file=str(path), block_size=32, batch_size=5, val_fraction=0.3, test_fraction=0.2)
    for stage in ("val", "test"):
        bpb, model = scored(dm, stage)
        loader = dm.val_dataloader() if stage == "val" else dm.test_dataloader()
        hand = by_hand(model, loader, lambda t: len(dm.decode([t]).encode("utf-8")))
        assert bpb == pytest.approx(hand, rel=1e-5)
        # A mean of per-batch ratios would be off by more than the tolerance: the multi-byte text is bunched.
        per_batch = [by_hand(model, [batch], lambda t: len(dm.decode([t]).encode("utf-8"))) for batch in loader]
        assert abs(np.mean(per_batch) - hand) / hand > 0.01


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("bpb")
    docs = [TEXT[i * 97:(i + 1) * 97 + 300] for i in range(40)]
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    train_tokenizer([str(root / "docs.jsonl")], str(root / "tok.json"), vocab_size=300)
    prepare([str(root / "docs.jsonl")], str(root / "tok.json"), str(root / "shards"), val_fraction=0.25,
            test_fraction=0.25, seed=1, processes=1)
    return root


def test_shard_bits_per_byte_counts_each_tokens_bytes(shards):
    meta = json.loads((shards / "shards" / "meta.json").read_text())
    dm = TextDataModule(shards_dir=str(shards / "shards"), block_size=16, batch_size=4)
    val = np.concatenate([np.asarray(open_shard(p)) for p in find_shards(shards / "shards", "val")])
    # Hand count: the val documents' UTF-8 bytes, counted from their text by prepare-data.
    assert dm.token_bytes[val].sum() == meta["splits"]["val"]["bytes"]
    bpb, model = scored(dm, "val")
    dm.setup("validate")
    assert bpb == pytest.approx(by_hand(model, dm.val_dataloader(), lambda t: dm.token_bytes[t]), rel=1e-5)


def test_llmc_shards_take_a_tokenizer_file_and_refuse_the_wrong_one(shards, tmp_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(shards / "tok.json"))
    ids = np.array(tok.encode(TEXT[:3000]).ids, dtype=np.uint16)
    write_shard(tmp_path / "fineweb_train_000001.bin", ids)
    write_shard(tmp_path / "fineweb_val_000000.bin", ids[:500])
    dm = TextDataModule(shards_dir=str(tmp_path), vocab_size=320, tokenizer=str(shards / "tok.json"))
    assert len(dm.token_bytes) == 320 and dm.token_bytes[ids].sum() == len(TEXT[:3000].encode("utf-8"))
    assert TextDataModule(shards_dir=str(tmp_path), vocab_size=320).token_bytes is None  # no tokenizer: no exact bpb
    with pytest.raises(UserInputError, match=r"has \d+ tokens but the shards' vocabulary is 256"):
        TextDataModule(shards_dir=str(tmp_path), vocab_size=256, tokenizer=str(shards / "tok.json"))
    other = tmp_path / "other.json"
    train_tokenizer([str(shards / "docs.jsonl")], str(other), vocab_size=290)
    with pytest.raises(UserInputError, match="not the tokenizer these shards were made with"):
        TextDataModule(shards_dir=str(shards / "shards"), tokenizer=str(other))
