"""``prepare-data`` leaves a whole output or none: an error half way (after shards were written), an empty input or
a refused ``--out`` leaves ``--out`` as it was and the same command works once the input is fixed; one text file
is split by position instead of refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lit.data.shards import find_shards, open_shard
from lit.data.tokenizer_training import train_tokenizer
from tests.conftest import run_in_process as run

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO / "lit" / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer([str(SHAKESPEARE)], str(path), vocab_size=300, max_bytes=100_000)
    return path


def one_error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name)


def test_a_malformed_line_after_shards_were_written_leaves_out_as_it_was(tmp_path, tokenizer_file, capsys,
                                                                          monkeypatch):
    from lit.data import shard_format
    from lit.data.prepare import BATCH_CHARS

    # More than one batch of text (what is read ahead of encoding) before the bad line, so that shards are written
    # before it is read.
    paragraphs = [p for p in SHAKESPEARE.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    chars = np.cumsum([len(p) for p in paragraphs])
    bad_at = int(np.searchsorted(chars, BATCH_CHARS * 1.02))
    assert bad_at < len(paragraphs) - 10
    lines = [json.dumps({"text": p}) for p in paragraphs]
    corpus = tmp_path / "big.jsonl"
    corpus.write_text("\n".join(lines[:bad_at] + ['{"text": "cut off'] + lines[bad_at:]) + "\n", encoding="utf-8")
    closed = []
    real_close = shard_format.ShardWriter._close_shard
    monkeypatch.setattr(shard_format.ShardWriter, "_close_shard",
                        lambda self: (closed.append(self._file.name), real_close(self)))
    out = tmp_path / "shards"
    argv = ["prepare-data", "--tokenizer", str(tokenizer_file), "--out", str(out), "--shard_tokens", "20000",
            "--processes", "1", str(corpus)]
    code, _, err = run(argv, capsys)
    assert code == 2 and f"big.jsonl:{bad_at + 1} is not JSON" in one_error_line(err)
    assert len(closed) >= 3, "the error came after shards had been written"
    assert not out.exists() and leftovers(tmp_path) == []

    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")  # fixed: the same command now works
    code, stdout, _ = run(argv, capsys)
    meta = json.loads((out / "meta.json").read_text())
    assert code == 0 and json.loads(stdout)["splits"]["train"]["documents"] == meta["splits"]["train"]["documents"]
    assert sum(s["documents"] for s in meta["splits"].values()) == len(lines)
    assert sorted(p.name for p in out.glob("*.bin")) == sorted(
        shard["file"] for split in meta["splits"].values() for shard in split["shards"])
    assert leftovers(tmp_path) == []


def test_empty_input_says_so_and_leaves_no_folder(tmp_path, tokenizer_file, capsys):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    out = tmp_path / "new" / "shards"
    code, _, err = run(["prepare-data", "--tokenizer", str(tokenizer_file), "--out", str(out), "--processes", "1",
                        str(empty)], capsys)
    line = one_error_line(err)
    assert code == 2 and f"{empty} holds no text" in line and "--text_unit" not in line
    assert not (tmp_path / "new").exists()  # neither --out nor the parent folder made for it
    out.parent.mkdir()
    out.mkdir()
    code, _, err = run(["prepare-data", "--tokenizer", str(tokenizer_file), "--out", str(out), str(empty)], capsys)
    assert code == 2 and "holds no text" in one_error_line(err)
    assert list(out.iterdir()) == [] and leftovers(out.parent) == []  # an empty --out stays, empty


def test_an_out_that_holds_anything_is_refused_untouched(tmp_path, tokenizer_file, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(50)))
    out = tmp_path / "out"
    out.mkdir()
    (out / "meta.json").write_text("mine")
    code, _, err = run(["prepare-data", "--tokenizer", str(tokenizer_file), "--out", str(out), str(corpus)], capsys)
    assert code == 2 and "already holds files (meta.json)" in one_error_line(err)
    assert (out / "meta.json").read_text() == "mine" and leftovers(tmp_path) == []


def test_one_text_file_is_split_by_position(tmp_path, tokenizer_file, capsys):
    from lit.data.token_bytes import load_tokenizer

    out = tmp_path / "s"
    code, stdout, err = run(["prepare-data", "--tokenizer", str(tokenizer_file), "--out", str(out),
                             "--val_fraction", "0.1", "--test_fraction", "0.05", "--processes", "1",
                             str(SHAKESPEARE)], capsys)
    assert code == 0, err
    said = [line for line in err.splitlines() if "split by position" in line]
    assert len(said) == 1 and "train the first 85%, test the next 5%, val the last 10%" in said[0]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["split_by"] == "position" and json.loads(stdout)["splits"]["val"]["documents"] == 1
    tok = load_tokenizer(tokenizer_file)
    text = SHAKESPEARE.read_bytes()
    size = len(text)
    parts = {}
    for split in ("train", "test", "val"):
        tokens = np.concatenate([np.asarray(open_shard(p)) for p in find_shards(out, split)])
        assert tokens[0] == tok.token_to_id("<|endoftext|>") and meta["splits"][split]["documents"] == 1
        parts[split] = tok.decode(tokens[1:].tolist()).encode("utf-8")
        assert len(parts[split]) == meta["splits"][split]["bytes"]
    assert parts["train"] + parts["test"] + parts["val"] == text  # in order, nothing lost or repeated
    # Each cut is at the first line start at or after its byte position: nanoGPT's rule, with a test cut.
    val_at = size - int(size * 0.1)
    assert len(parts["train"]) + len(parts["test"]) == first_line_start(text, val_at)
    assert len(parts["train"]) == first_line_start(text, val_at - int(size * 0.05))


def first_line_start(text: bytes, at: int) -> int:
    return 0 if at == 0 else text.index(b"\n", at - 1) + 1

def test_a_text_file_too_short_to_cut_is_refused_in_one_line(tmp_path, tokenizer_file, capsys):
    short = tmp_path / "short.txt"
    short.write_text("one line\nand another\n")
    code, _, err = run(["prepare-data", "--tokenizer", str(tokenizer_file), "--out", str(tmp_path / "s"),
                        "--processes", "1", str(short)], capsys)
    assert code == 2 and "short.txt is too short to cut val and test at a line start" in one_error_line(err)
    assert not (tmp_path / "s").exists()
