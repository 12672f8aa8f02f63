"""``train-tokenizer`` refuses an empty corpus, warns when the vocabulary comes out smaller than asked, and replaces
an existing ``--out`` only with ``--overwrite``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_in_process as run

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO / "lit" / "data" / "tinyshakespeare.txt"


@pytest.mark.parametrize("content", ["", "\n\n", '{"text": ""}\n'])
def test_an_empty_corpus_is_refused_and_nothing_written(tmp_path, capsys, content):
    empty = tmp_path / "e.jsonl"
    empty.write_text(content)
    out = tmp_path / "t.json"
    code, stdout, err = run(["train-tokenizer", "--vocab_size", "4096", "--out", str(out), str(empty)], capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and f"{empty} holds no text" in errors[0] and stdout == ""
    assert list(tmp_path.iterdir()) == [empty]


def test_a_vocabulary_smaller_than_asked_is_said(tmp_path, capsys):
    small = tmp_path / "small.txt"
    small.write_text("to be or not to be, that is the question\n")
    out = tmp_path / "t.json"
    code, stdout, err = run(["train-tokenizer", "--vocab_size", "4096", "--out", str(out), str(small)], capsys)
    from tokenizers import Tokenizer

    got = Tokenizer.from_file(str(out)).get_vocab_size()
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert code == 0 and got < 4096 and f"{got} tokens" in stdout
    assert len(warnings) == 1 and f"has {got} tokens, not the 4096 asked" in warnings[0]
    code, _, err = run(["train-tokenizer", "--vocab_size", str(got), "--out", str(out), "--overwrite", str(small)],
                       capsys)
    assert code == 0 and "warning:" not in err  # exactly what was asked: nothing to say


def test_an_existing_out_is_replaced_only_with_overwrite(tmp_path, capsys):
    out = tmp_path / "t.json"
    out.write_text("my tokenizer")
    argv = ["train-tokenizer", "--vocab_size", "300", "--max_bytes", "50000", "--out", str(out), str(SHAKESPEARE)]
    code, _, err = run(argv, capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and f"{out} already exists; pass --overwrite" in errors[0]
    assert out.read_text() == "my tokenizer"
    code, stdout, _ = run([*argv, "--overwrite"], capsys)
    assert code == 0 and "300 tokens" in stdout and '"model"' in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no partial file left beside it


def test_help_shows_the_defaults(capsys):
    code, stdout, _ = run(["train-tokenizer", "--help"], capsys)
    assert code == 0 and "--overwrite" in stdout and "(default: 8192)" in stdout
    code, stdout, _ = run(["prepare-data", "--help"], capsys)
    flat = " ".join(stdout.split())
    assert code == 0 and "(default: 100,000,000)" in flat and "(default: file" in flat and "min(8, cores)" in flat
