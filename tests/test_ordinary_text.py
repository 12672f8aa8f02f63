"""A special token's string inside a document is ordinary text: encoded as its bytes, never as the special id
(llm.c's and nanochat's ``encode_ordinary``), in shards, in predict's prompt and in lm-eval's texts alike."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lit.data.shards import find_shards, open_shard
from lit.data.token_bytes import load_tokenizer
from lit.data.tokenizer_training import train_tokenizer

REPO = Path(__file__).resolve().parents[1]
EOT = "<|endoftext|>"
DOCUMENTS = [f"GPT-2 ends a text with {EOT} here.", "b", f"{EOT}", f"two {EOT}{EOT} in a row, é 😀"]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer([str(REPO / "lit" / "data" / "tinyshakespeare.txt")], str(path), vocab_size=300,
                    max_bytes=100_000)
    return path


def test_prepare_data_encodes_a_special_string_in_a_document_as_text(tmp_path, tokenizer_file, capsys):
    from lit.commands import main

    corpus = tmp_path / "s.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCUMENTS), encoding="utf-8")
    main(["prepare-data", "--tokenizer", str(tokenizer_file), "--out", str(tmp_path / "s"), "--val_fraction", "0",
          "--test_fraction", "0", "--processes", "1", str(corpus)])
    capsys.readouterr()
    tokens = np.concatenate([np.asarray(open_shard(p)) for p in find_shards(tmp_path / "s", "train")])
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    tok = load_tokenizer(tokenizer_file)
    eot = tok.token_to_id(EOT)
    assert np.count_nonzero(tokens == eot) == len(DOCUMENTS) == meta["splits"]["train"]["documents"]
    decoded = tok.decode(tokens.tolist(), skip_special_tokens=True)
    assert decoded == "".join(DOCUMENTS)  # nothing lost, no document cut in two
    assert len(decoded.encode("utf-8")) == meta["splits"]["train"]["bytes"]


def test_every_encoding_of_user_text_treats_special_strings_as_text(tmp_path, tokenizer_file):
    from lit.evaluation.text_codec import bpe_codec

    tok = load_tokenizer(tokenizer_file)
    eot = tok.token_to_id(EOT)
    codec = bpe_codec(tokenizer_file)  # lm-eval's contexts and continuations
    for text in DOCUMENTS:
        assert eot not in codec.encode(text) and codec.decode(codec.encode(text)) == text
    assert codec.prefix_id == eot  # the document start is still the EOT, placed by id

    from lit.data.prepare import prepare
    from lit.data.text import TextDataModule

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"doc {i} text"}) + "\n" for i in range(30)))
    prepare([str(corpus)], str(tokenizer_file), str(tmp_path / "s"), val_fraction=0.3, test_fraction=0,
            processes=1)
    dm = TextDataModule(shards_dir=str(tmp_path / "s"), block_size=4, prompt=f"say {EOT} now")
    prompt = next(iter(dm.predict_dataloader()))[0].tolist()
    assert prompt[0] == eot and eot not in prompt[1:]  # predict's prompt: one EOT, the one it starts after
    assert dm.decode(prompt) == f"{EOT}say {EOT} now"
