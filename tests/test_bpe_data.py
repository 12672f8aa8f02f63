"""The BPE data path: a tokenizer trained here, a corpus streamed from text/JSONL/parquet/datasets folders, shards
written as they fill with a train/val/test split by document, and per-token byte lengths for exact bits per byte."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from lit.data.documents import Corpus
from lit.data.prepare import prepare
from lit.data.shards import find_shards, open_shard
from lit.data.token_bytes import token_byte_lengths
from lit.data.tokenizer_training import train_tokenizer
from lit.errors import UserInputError

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO / "lit" / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer([str(SHAKESPEARE)], str(path), vocab_size=512, max_bytes=300_000)
    return path


def documents(n: int = 60) -> list[str]:
    words = SHAKESPEARE.read_text(encoding="utf-8").split()
    return [" ".join(words[i * 37:(i + 1) * 37 + i % 11]) + f" é{i} 😀" for i in range(n)]


def test_trained_tokenizer_is_byte_level_bpe_with_its_special_token(tokenizer_file):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    assert tok.get_vocab_size() == 512 and tok.token_to_id("<|endoftext|>") == 0
    text = "Wherefore art thou, Ромео? 😀 \t\n"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text and 0 not in ids  # any text, no unknown token; text never makes the EOT
    assert len(ids) < len(text.encode("utf-8"))  # merges were learned


def test_train_tokenizer_command_and_its_refusal(tmp_path, capsys):
    from lit.commands import main

    out = tmp_path / "t.json"
    main(["train-tokenizer", "--vocab_size", "300", "--special_tokens", "<|endoftext|>", "<|bos|>",
          "--out", str(out), str(SHAKESPEARE), "--max_bytes", "100000"])
    assert "300 tokens" in capsys.readouterr().out
    vocab = json.loads(out.read_text())["model"]["vocab"]
    assert vocab["<|endoftext|>"] == 0 and vocab["<|bos|>"] == 1
    with pytest.raises(SystemExit) as exit_info:
        main(["train-tokenizer", "--vocab_size", "100", "--out", str(tmp_path / "u.json"), str(SHAKESPEARE)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "u.json").exists()


def test_long_text_is_cut_into_pieces_that_encode_as_the_whole(tmp_path):
    # Indented lines and blank-line runs: where a careless cut (after any newline) changes the tokens, since
    # byte-level BPE learns merges such as "\n   " across a line break.
    lines = SHAKESPEARE.read_text(encoding="utf-8")[:150_000].splitlines(keepends=True)
    text = "".join(("    " * (i % 3) + line) if i % 5 else "\n\n" + line for i, line in enumerate(lines))
    path = tmp_path / "long.txt"
    path.write_text(text, encoding="utf-8")
    tok = train_tokenizer([str(path)], str(tmp_path / "t.json"), vocab_size=400)
    pieces = list(Corpus([str(path)], piece_chars=2_000))
    assert len(pieces) > 50 and pieces[0].starts_document and not any(p.starts_document for p in pieces[1:])
    assert "".join(p.text for p in pieces) == text
    by_piece = [i for p in pieces for i in tok.encode(p.text).ids]
    assert by_piece == tok.encode(text).ids


def write_inputs(directory: Path, docs: list[str]) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = directory / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    parquet = directory / "docs.parquet"
    pq.write_table(pa.table({"text": docs, "id": list(range(len(docs)))}), parquet, row_group_size=7)
    folder = directory / "saved"  # what datasets' save_to_disk writes: Arrow stream files named in state.json
    folder.mkdir()
    table = pa.table({"id": list(range(len(docs))), "text": docs})
    for k, part in enumerate((table.slice(0, 25), table.slice(25))):
        with pa.OSFile(str(folder / f"data-{k:05d}-of-00002.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, part.schema) as writer:
                writer.write_table(part, max_chunksize=10)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": f"data-{k:05d}-of-00002.arrow"}
                                                                    for k in range(2)]}))
    lines = directory / "lines.txt"
    lines.write_text("\n".join(docs) + "\n", encoding="utf-8")
    return {"jsonl": jsonl, "parquet": parquet, "datasets": folder, "lines": lines}


def test_every_input_kind_reads_the_same_documents(tmp_path):
    docs = documents()
    inputs = write_inputs(tmp_path, docs)
    for kind, path in inputs.items():
        corpus = Corpus([str(path)], text_unit="line")
        got = [p.text for p in corpus]
        assert got == docs, kind
        assert corpus.bytes_read == corpus.total_bytes, kind
    with pytest.raises(UserInputError, match="no 'body' field; name the text field with --text_key"):
        list(Corpus([str(inputs["jsonl"])], text_key="body"))
    with pytest.raises(UserInputError, match="no column 'body'"):
        list(Corpus([str(inputs["parquet"])], text_key="body"))
    with pytest.raises(UserInputError, match="not a Hugging Face datasets folder"):
        Corpus([str(tmp_path)])


def shard_tokens(directory: Path, split: str) -> np.ndarray:
    return np.concatenate([np.asarray(open_shard(p)) for p in find_shards(directory, split)])


def test_prepare_splits_by_document_and_writes_shards_as_they_fill(tmp_path, tokenizer_file):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    docs = documents()
    jsonl = write_inputs(tmp_path, docs)["jsonl"]
    meta = prepare([str(jsonl)], str(tokenizer_file), str(tmp_path / "a"), shard_tokens=700, val_fraction=0.15,
                   test_fraction=0.15, seed=3, processes=1)
    meta_again = prepare([str(jsonl)], str(tokenizer_file), str(tmp_path / "b"), shard_tokens=700, val_fraction=0.15,
                         test_fraction=0.15, seed=3, processes=2)
    assert meta_again["splits"] == meta["splits"]  # the split of each document does not depend on the processes
    for split in ("train", "val", "test"):
        assert (shard_tokens(tmp_path / "a", split) == shard_tokens(tmp_path / "b", split)).all()

    eot = tok.token_to_id("<|endoftext|>")
    seen = []
    for split, info in meta["splits"].items():
        tokens = shard_tokens(tmp_path / "a", split)
        assert len(tokens) == info["tokens"] == sum(s["tokens"] for s in info["shards"]) == meta[f"{split}_tokens"]
        assert all(s["tokens"] == 700 for s in info["shards"][:-1]) and len(info["shards"]) >= 1
        for shard in info["shards"]:  # the header counts what the shard holds
            assert len(open_shard(tmp_path / "a" / shard["file"])) == shard["tokens"]
        starts = np.flatnonzero(tokens == eot)
        assert starts[0] == 0 and len(starts) == info["documents"]
        parts = np.split(tokens, starts[1:])
        texts = [tok.decode(part[1:].tolist()) for part in parts]  # every document whole, after its EOT
        assert sum(len(t.encode("utf-8")) for t in texts) == info["bytes"]
        seen += texts
    assert sorted(seen) == sorted(docs)
    assert 3 <= meta["splits"]["val"]["documents"] <= 20 and 3 <= meta["splits"]["test"]["documents"] <= 20
    assert len(meta["tokenizer_sha256"]) == 64 and meta["vocab_size"] == 512
    assert json.loads((tmp_path / "a" / "meta.json").read_text()) == meta


def test_prepare_refusals_lose_nothing(tmp_path, tokenizer_file):
    jsonl = write_inputs(tmp_path, documents(3))["jsonl"]
    out = tmp_path / "shards"
    with pytest.raises(UserInputError, match="none was drawn for val"):
        prepare([str(jsonl)], str(tokenizer_file), str(out), val_fraction=0.01, test_fraction=0)
    assert not list(out.glob("*")), "a refused run leaves no half-written shards"
    with pytest.raises(UserInputError, match="'<eot>' is not in"):
        prepare([str(jsonl)], str(tokenizer_file), str(out), eot="<eot>")
    out.mkdir(exist_ok=True)
    (out / "mine_train_000000.bin").write_bytes(b"keep")
    with pytest.raises(UserInputError, match="already holds shards"):
        prepare([str(jsonl)], str(tokenizer_file), str(out), val_fraction=0.5, test_fraction=0)
    assert (out / "mine_train_000000.bin").read_bytes() == b"keep"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # runpy: the package imported the module first
def test_python_dash_m_entry_point_writes_shards(tmp_path, tokenizer_file, monkeypatch, capsys):
    import runpy

    lines = write_inputs(tmp_path, documents(40))["lines"]
    monkeypatch.setattr(sys, "argv", ["prepare", "--tokenizer", str(tokenizer_file), "--out", str(tmp_path / "m"),
                                      "--text_unit", "line", "--val_fraction", "0.2", "--test_fraction", "0.2",
                                      "--processes", "1", str(lines)])
    with pytest.raises(SystemExit) as exit_info:  # what `python -m lit.data.prepare ...` runs
        runpy.run_module("lit.data.prepare", run_name="__main__")
    out = capsys.readouterr()
    assert exit_info.value.code == 0 and json.loads(out.out)["splits"]["train"]["documents"] > 0
    assert "tokens/s" in out.err and (tmp_path / "m" / "meta.json").exists()


def test_token_byte_lengths_count_the_text_each_token_decodes_to(tokenizer_file):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    lengths = token_byte_lengths(tok)
    assert lengths[tok.token_to_id("<|endoftext|>")] == 0
    text = "To be, or not — 😀 ÿ\n"
    ids = tok.encode(text).ids
    assert lengths[ids].sum() == len(text.encode("utf-8"))
    assert (lengths[1:] >= 1).all()


def test_a_shard_trained_model_samples_with_the_tokenizer_meta_json_names(tmp_path, tokenizer_file, capsys):
    import lightning as L

    from lit.data.text import TextDataModule
    from lit.language_model import LanguageModel
    from lit.models.transformer import TransformerConfig

    jsonl = write_inputs(tmp_path, documents(40))["jsonl"]
    prepare([str(jsonl)], str(tokenizer_file), str(tmp_path / "s"), val_fraction=0.2, test_fraction=0, processes=1)
    dm = TextDataModule(shards_dir=str(tmp_path / "s"), block_size=16, prompt="ROMEO: é", num_samples=2)
    model = LanguageModel(vocab_size=dm.vocab_size, block_size=16, max_new_tokens=6,
                          arch=TransformerConfig(d_model=16, n_layers=1, n_heads=2))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    samples = [text for batch in trainer.predict(model, datamodule=dm) for text in batch]
    assert len(samples) == 2 and all(s.startswith("<|endoftext|>ROMEO: é") for s in samples)
    assert all(len(s) > len("<|endoftext|>ROMEO: é") for s in samples)  # six tokens of at least one byte each
    bare = tmp_path / "bare"
    bare.mkdir()
    for shard in (tmp_path / "s").glob("*.bin"):
        shutil.copy(shard, bare)
    with pytest.raises(UserInputError, match="names no tokenizer"):
        TextDataModule(shards_dir=str(bare), vocab_size=512, block_size=16).predict_dataloader()
