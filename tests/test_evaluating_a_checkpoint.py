"""Reading a checkpoint with --ckpt_path: the flags a user types win over the checkpoint's hyperparameters (Lightning
parses those over the command line), a flag that asks for another model than the checkpoint holds is one line naming
both values, and data of another tokenizer than the model's is refused in one line (--force goes on, saying so)."""

from __future__ import annotations

import pytest
import torch

from lit.cli import main
from lit.command_line_over_checkpoint import model_flags
from lit.data import tokenizer_record
from lit.errors import UserInputError
from lit.language_model import LanguageModel
from tests.conftest import REPO, TINY_LM

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
NO_LOGGER = ["--trainer.logger=false"]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    main(["fit", "--config", BASELINE, *TINY_LM, *NO_LOGGER, "--trainer.max_steps=3", "--trainer.limit_val_batches=1",
          "--trainer.val_check_interval=3", f"--trainer.default_root_dir={root}"])
    path = root / "checkpoints" / "last.ckpt"
    hparams = torch.load(path, weights_only=False)["hyper_parameters"]
    # What the flags below ask for differs from what the checkpoint holds, or the test would prove nothing.
    assert hparams["max_new_tokens"] == 200 and hparams["temperature"] == 0.8 and hparams["arch"]["d_model"] == 32
    return path


def test_predict_samples_what_the_flags_ask(checkpoint, workdir, capsys):
    prompt = "ROMEO:"
    main(["predict", "--config", BASELINE, *TINY_LM, *NO_LOGGER, "--ckpt_path", str(checkpoint),
          "--model.max_new_tokens=5", "--model.temperature=0", f"--data.prompt={prompt}"])
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(prompt)]
    # The reference: the same checkpoint's greedy decode, computed here.
    module = LanguageModel.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    from lit.data.text import TextDataModule

    data = TextDataModule(block_size=32)
    data.prepare_data()
    data.setup("predict")
    ids = torch.tensor([data.tokenizer.encode(prompt)])
    expected = data.decode(module.model.generate(ids, 5, 0.0, None)[0].tolist())
    assert len(expected) == len(prompt) + 5
    assert printed == [expected]


@pytest.mark.parametrize("subcommand", ["validate", "test"])
def test_evaluation_takes_the_flags_that_do_not_change_the_weights(subcommand, checkpoint, workdir):
    cli = main([subcommand, "--config", BASELINE, *TINY_LM, *NO_LOGGER, *QUIET, "--ckpt_path", str(checkpoint),
                "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1",
                "--model.temperature=0.3", "--model.loss_chunk_mib=1"])
    assert cli.model.hparams.temperature == 0.3 and cli.model.hparams.loss_chunk_mib == 1
    assert cli.model.model.stack.cfg.d_model == 32  # the checkpoint's, which TINY_LM also gives


@pytest.mark.parametrize("subcommand", ["predict", "validate", "test"])
def test_a_flag_against_the_checkpoints_model_is_one_line(subcommand, checkpoint, workdir, capsys):
    with pytest.raises(SystemExit) as e:
        main([subcommand, "--config", BASELINE, *TINY_LM, *NO_LOGGER, *QUIET, "--ckpt_path", str(checkpoint),
              "--model.arch.n_layers=3"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert "--model.arch.n_layers=3" in errors[0] and "arch.n_layers=2" in errors[0] and str(checkpoint) in errors[0]


def test_a_recipe_value_is_not_a_flag(checkpoint, workdir):
    """The recipe says 4 layers and d_model 64; the checkpoint's 2 and 32 replace them, as before: only typed
    flags win."""
    cli = main(["validate", "--config", BASELINE, *NO_LOGGER, *QUIET, "--data.block_size=32",
                "--ckpt_path", str(checkpoint), "--trainer.limit_val_batches=1"])
    cfg = cli.model.model.stack.cfg
    assert cfg.n_layers == 2 and cfg.d_model == 32


def test_model_flags_as_typed():
    args = ["predict", "--config", "r.yaml", "--model.max_new_tokens=5", "--model.init_args.top_k", "3",
            "--data.prompt=x", "--model.arch.norm=dyt", "--model.class_path=x.Y", "--model.max_new_tokens=6"]
    assert model_flags(args) == [("--model.init_args.top_k", "top_k"), ("--model.arch.norm=dyt", "arch.norm"),
                                 ("--model.max_new_tokens=6", "max_new_tokens")]


# --- the model's tokenizer -----------------------------------------------------------------------------------------

def test_the_checkpoint_records_the_vocabulary_it_was_trained_with(checkpoint):
    from lit.data.text import TextDataModule

    record = tokenizer_record.recorded(checkpoint)
    assert record == tokenizer_record.of_characters(TextDataModule().tokenizer.chars, "lit/data/tinyshakespeare.txt")
    assert record["kind"] == "characters" and len(record["sha256"]) == 64


def other_vocabulary_of_the_same_size(workdir) -> str:
    """tinyshakespeare with its 'z' written as 'ж': 65 characters again (the weights fit), other ids for most."""
    from importlib import resources

    text = resources.files("lit.data").joinpath("tinyshakespeare.txt").read_text(encoding="utf-8")
    path = workdir / "other.txt"
    path.write_text(text.replace("z", "ж"), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("subcommand", ["validate", "predict"])
def test_data_of_another_vocabulary_is_refused_in_one_line(subcommand, checkpoint, workdir, capsys):
    with pytest.raises(SystemExit) as e:
        main([subcommand, "--config", BASELINE, *TINY_LM, *NO_LOGGER, *QUIET, "--ckpt_path", str(checkpoint),
              f"--data.text_file={other_vocabulary_of_the_same_size(workdir)}", "--trainer.limit_val_batches=1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert "other.txt" in errors[0] and "tinyshakespeare" in errors[0] and "--force" in errors[0]


def test_force_reads_it_anyway_and_says_so(checkpoint, workdir, capsys):
    cli = main(["validate", "--config", BASELINE, *TINY_LM, *NO_LOGGER, *QUIET, "--ckpt_path", str(checkpoint),
                f"--data.text_file={other_vocabulary_of_the_same_size(workdir)}", "--trainer.limit_val_batches=1",
                "--force=true"])
    assert cli.trainer.state.finished
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: --force:")]
    assert len(warnings) == 1 and "other.txt" in warnings[0]


def test_shards_of_another_tokenizer_are_told_apart(tmp_path):
    """Two byte-level BPE tokenizers of one vocabulary size, trained on different text: the records differ; the
    same file, named from a meta.json's SHA-256 or hashed, gives one record."""
    from lit.data.token_bytes import file_sha256
    from lit.data.tokenizer_training import train_tokenizer

    shakespeare = REPO / "lit" / "data" / "tinyshakespeare.txt"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    train_tokenizer([str(shakespeare)], str(a), vocab_size=300, max_bytes=100_000)
    (tmp_path / "b.txt").write_text(shakespeare.read_text(encoding="utf-8")[500_000:600_000].upper(), encoding="utf-8")
    train_tokenizer([str(tmp_path / "b.txt")], str(b), vocab_size=300, max_bytes=100_000)
    record_a, record_b = tokenizer_record.of_tokenizer_file(a), tokenizer_record.of_tokenizer_file(b)
    assert record_a != record_b
    assert tokenizer_record.of_tokenizer_file(a, file_sha256(a)) == record_a
    tokenizer_record.check(record_a, dict(record_a), "m.ckpt")  # the same one: nothing to say
    with pytest.raises(UserInputError, match="b.json"):
        tokenizer_record.check(record_a, record_b, "m.ckpt")
