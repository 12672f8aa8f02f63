"""export-hf and lm-eval read a model with the tokenizer its checkpoint records: export-hf writes it beside the
weights with the real special-token ids, and both refuse another tokenizer in one line (--force goes on, saying so)."""

from __future__ import annotations

import json

import pytest
import torch

from lit.commands import main
from lit.data import tokenizer_record
from lit.errors import UserInputError
from tests.conftest import REPO

SHAKESPEARE = REPO / "lit" / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """Two byte-level BPE tokenizers of one vocabulary size trained on different text (the records differ)."""
    from lit.data.tokenizer_training import train_tokenizer

    root = tmp_path_factory.mktemp("tokenizers")
    text = SHAKESPEARE.read_text(encoding="utf-8")
    (root / "a.txt").write_text(text[:100_000], encoding="utf-8")
    (root / "b.txt").write_text(text[500_000:600_000].upper(), encoding="utf-8")
    for name in "ab":
        train_tokenizer([str(root / f"{name}.txt")], str(root / f"{name}.json"), vocab_size=300)
    return root / "a.json", root / "b.json"


def checkpoint_trained_with(tmp_path, tokenizer) -> tuple:
    from lit.interop.checkpoint import write_checkpoint
    from lit.language_model import LanguageModel
    from lit.models.transformer import TransformerConfig

    torch.manual_seed(1)
    module = LanguageModel(vocab_size=300, block_size=32,
                           arch=TransformerConfig(d_model=32, n_layers=2, n_heads=4)).eval()
    path = write_checkpoint(module, tmp_path / "model.ckpt")
    checkpoint = torch.load(path, weights_only=False)
    checkpoint[tokenizer_record.CHECKPOINT_KEY] = tokenizer_record.of_tokenizer_file(tokenizer)
    torch.save(checkpoint, path)
    return path, module


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_export_writes_the_recorded_tokenizer_and_its_ids(tmp_path, tokenizers):
    from tokenizers import Tokenizer

    a, _ = tokenizers
    path, _ = checkpoint_trained_with(tmp_path, a)
    out = tmp_path / "hf"
    main(["export-hf", str(path), "--out", str(out)])
    assert (out / "tokenizer.json").read_bytes() == a.read_bytes()
    end_of_text = Tokenizer.from_file(str(a)).token_to_id("<|endoftext|>")
    config, generation = (json.loads((out / name).read_text()) for name in ("config.json", "generation_config.json"))
    for ids in (config, generation):
        assert ids["bos_token_id"] == ids["eos_token_id"] == ids["pad_token_id"] == end_of_text
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|endoftext|>" and tokenizer_config["model_max_length"] == 32


def test_export_refuses_another_tokenizer_and_force_writes_it(tmp_path, tokenizers, capsys):
    a, b = tokenizers
    path, _ = checkpoint_trained_with(tmp_path, a)
    with pytest.raises(SystemExit) as e:
        main(["export-hf", str(path), "--out", str(tmp_path / "hf"), "--tokenizer", str(b)])
    assert e.value.code == 2 and "b.json" in one_error(capsys) and not (tmp_path / "hf").exists()
    main(["export-hf", str(path), "--out", str(tmp_path / "hf"), "--tokenizer", str(b), "--force"])
    assert "warning: --force:" in capsys.readouterr().err
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == b.read_bytes()


def test_export_without_a_recorded_tokenizer_writes_no_wrong_ids(tmp_path, capsys):
    from lit.interop.checkpoint import write_checkpoint
    from lit.language_model import LanguageModel
    from lit.models.transformer import TransformerConfig

    module = LanguageModel(vocab_size=101, block_size=32, arch=TransformerConfig(d_model=32, n_layers=2, n_heads=4))
    main(["export-hf", str(write_checkpoint(module, tmp_path / "old.ckpt")), "--out", str(tmp_path / "hf")])
    assert "records no tokenizer" in capsys.readouterr().err
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["bos_token_id"] is None and config["eos_token_id"] is None  # not Llama's defaults 1 and 2
    assert not (tmp_path / "hf" / "tokenizer.json").exists()


def test_export_folder_works_with_auto_tokenizer_and_generate(tmp_path, tokenizers):
    transformers = pytest.importorskip("transformers")
    a, _ = tokenizers
    path, module = checkpoint_trained_with(tmp_path, a)
    main(["export-hf", str(path), "--out", str(tmp_path / "hf")])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = tokenizer("To be, or not to be", return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0]) == "To be, or not to be"
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    out = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    expected = module.model.generate(ids, 8, 0.0, None)
    assert out[0].tolist() == expected[0].tolist()


def test_lm_eval_reads_with_the_recorded_tokenizer_and_refuses_another(tmp_path, tokenizers, capsys):
    from lit.evaluation.text_codec import resolve_codec

    a, b = tokenizers
    trained = tokenizer_record.of_tokenizer_file(a)
    codec = resolve_codec(300, None, None, trained=trained, checkpoint="m.ckpt")  # no --tokenizer: the recorded one
    assert codec.record == trained and str(a) in codec.description
    with pytest.raises(UserInputError, match="b.json.*--force"):
        resolve_codec(300, str(b), None, trained=trained, checkpoint="m.ckpt")
    assert resolve_codec(300, str(b), None, trained=trained, checkpoint="m.ckpt", force=True).record != trained
    assert "warning: --force:" in capsys.readouterr().err
    moved = {**trained, "path": str(tmp_path / "gone.json")}
    with pytest.raises(UserInputError, match="gone.json, which is not there; give its new place with --tokenizer"):
        resolve_codec(300, None, None, trained=moved, checkpoint="m.ckpt")


def test_lm_eval_command_refuses_another_tokenizer_in_one_line(tmp_path, tokenizers, capsys):
    a, b = tokenizers
    path, _ = checkpoint_trained_with(tmp_path, a)
    with pytest.raises(SystemExit) as e:
        main(["lm-eval", str(path), "--tasks", "x", "--tokenizer", str(b)])
    assert e.value.code == 2 and "b.json" in one_error(capsys)
