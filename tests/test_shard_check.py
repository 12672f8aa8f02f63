"""A shard is checked whole before it is read: a truncated or foreign file is one ``error:`` line naming it, from
the shard reader and through ``cli.py fit``, not a traceback from ``np.memmap``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lit.data.shard_format import HEADER_INTS, check_shard, open_shard, write_shard
from lit.errors import UserInputError
from tests.conftest import REPO, TINY_LM, subprocess_env


def test_a_whole_shard_reads_and_a_cut_or_padded_one_is_named(tmp_path):
    path = tmp_path / "x_train_000000.bin"
    write_shard(path, np.arange(1000) % 500, np.uint16)
    assert len(open_shard(path)) == 1000 and check_shard(path) == (np.dtype(np.uint16), HEADER_INTS * 4, 1000)
    whole = path.read_bytes()
    for size, what in ((len(whole) - 1, "truncated"), (600, "truncated"), (10, "truncated"), (len(whole) + 2,
                                                                                              "longer than")):
        path.write_bytes((whole + b"\0\0")[:size])
        with pytest.raises(UserInputError, match=f"shard {path} is {what}"):
            open_shard(path)
    path.write_bytes(whole)
    assert len(open_shard(path)) == 1000


def test_a_file_without_the_header_is_raw_tokens_unless_meta_json_says_llmc(tmp_path):
    raw = tmp_path / "train.bin"
    np.arange(10, dtype=np.uint16).tofile(raw)
    assert open_shard(raw).tolist() == list(range(10))  # nanoGPT's layout
    raw.write_bytes(raw.read_bytes()[:-1])
    with pytest.raises(UserInputError, match="not a whole number of uint16 tokens"):
        open_shard(raw)
    raw.write_bytes(np.arange(10, dtype=np.uint16).tobytes())
    (tmp_path / "meta.json").write_text(json.dumps({"format": "llm.c", "dtype": "uint16"}))
    with pytest.raises(UserInputError, match=f"{raw} is not a token shard: it does not start with the llm.c magic"):
        open_shard(raw)


@pytest.fixture
def truncated_shards(tmp_path) -> tuple[Path, Path]:
    """A shards folder prepared here whose train shard was cut short (half its size, plus a byte); and that shard."""
    from lit.data.prepare import prepare
    from lit.data.tokenizer_training import train_tokenizer

    corpus = tmp_path / "c.jsonl"
    words = (REPO / "lit" / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8").split()[:6000]
    corpus.write_text("".join(json.dumps({"text": " ".join(words[i:i + 60])}) + "\n" for i in range(0, 6000, 60)))
    train_tokenizer([str(corpus)], str(tmp_path / "tok.json"), vocab_size=300)
    shards = tmp_path / "shards"
    prepare([str(corpus)], str(tmp_path / "tok.json"), str(shards), val_fraction=0.2, test_fraction=0, processes=1)
    train = shards / "corpus_train_000000.bin"
    with open(train, "r+b") as f:
        f.truncate(train.stat().st_size // 2 + 1)
    return shards, train


FIT = ["fit", "--config", str(REPO / "recipes" / "gpt_baseline.yaml"), *TINY_LM, "--trainer.logger=false",
       "--trainer.fast_dev_run=true"]


def test_fit_on_a_truncated_shard_is_one_line_naming_it(truncated_shards, workdir, capsys):
    from lit.commands import main

    shards, train = truncated_shards
    with pytest.raises(SystemExit) as e:
        main([*FIT, f"--data.shards_dir={shards}"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert e.value.code == 2 and len(errors) == 1 and f"shard {train} is truncated" in errors[0], errors


@pytest.mark.slow  # a fresh process importing Lightning: 20-50 s on the shared 2 cores
def test_fit_on_a_truncated_shard_prints_no_traceback(truncated_shards, tmp_path):
    shards, train = truncated_shards
    out = subprocess.run([sys.executable, str(REPO / "cli.py"), *FIT, f"--data.shards_dir={shards}"], cwd=tmp_path,
                         capture_output=True, text=True, env=subprocess_env(), timeout=600)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2, out.stderr[-3000:]
    assert len(errors) == 1 and f"shard {train} is truncated" in errors[0], out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "mmap length" not in out.stderr
