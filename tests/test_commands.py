"""The command table (every `python cli.py SUBCOMMAND`), the one error wrapper, and the class paths that
recipes and configs stored in old MLflow runs name."""

from __future__ import annotations

import importlib
import subprocess
import sys

import mlflow
import pytest
import yaml

from lit.commands import COMMANDS, main
from lit.errors import UserInputError, one_line_errors
from tests.conftest import REPO, TINY_LM, subprocess_env

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")


def test_help_lists_every_subcommand_with_one_line():
    out = subprocess.run([sys.executable, "cli.py", "--help"], cwd=REPO, capture_output=True, text=True,
                         env=subprocess_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    listed = {line.split()[0]: " ".join(line.split()[1:]) for line in out.stdout.splitlines() if line.startswith("  ")}
    assert listed == {name: command.help for name, command in COMMANDS.items()}
    for every in ("fit", "plugins", "sweep", "compare", "convert-norm", "remove-norms", "export", "sync",
                  "prepare-data"):
        assert every in listed


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_row_names_a_function(name):
    module, function = COMMANDS[name].target.split(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_an_unknown_subcommand_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["comapre"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: unknown subcommand 'comapre'; did you mean 'compare'? `python cli.py --help` lists them"]


def test_no_subcommand_shows_the_table_and_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2 and "prepare-data" in capsys.readouterr().err


def test_a_subcommands_user_error_is_one_line_through_the_table(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sync", "send", "missing.jsonl"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: missing.jsonl not found; a run leaves unsent_metrics.jsonl in its folder under runs/"]


def test_the_wrapper_finds_the_user_error_behind_a_library_error_and_leaves_bugs_alone(capsys):
    @one_line_errors
    def wrapped(kind):
        try:
            raise UserInputError("set --x to a number,\n  like 3")
        except UserInputError as exc:
            if kind == "user":
                raise RuntimeError("a library wrapped it") from exc
        raise KeyError("a bug")

    assert wrapped("user") == 2
    assert capsys.readouterr().err == "error: set --x to a number, like 3\n"
    with pytest.raises(KeyError):
        wrapped("bug")


def test_only_the_first_process_prints(capsys, monkeypatch):
    monkeypatch.setattr("lit.errors._rank", lambda: 1)
    assert one_line_errors(lambda: (_ for _ in ()).throw(UserInputError("x")))() == 2
    assert capsys.readouterr().err == ""


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One tracking store for this module's tests: creating MLflow's tables costs seconds."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"
    mlflow.MlflowClient(uri).search_experiments()
    return uri


def stored_config(workdir, store: str) -> str:
    """A config as an old run stored it: the logger and the run callback named by their public class paths."""
    config = yaml.safe_load(open(BASELINE))
    config["trainer"]["logger"] = {"class_path": "lit.tracking.MLflowLogger",
                                   "init_args": {"experiment_name": "old", "tracking_uri": store,
                                                 "system_metrics": False}}
    config["trainer"]["callbacks"] = [{"class_path": "lit.callbacks.MLflowRun"}]
    path = workdir / "stored.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_old_class_paths_load_and_new_configs_keep_naming_them(workdir, store):
    from lit.cli import check_config
    from lit.tracking import MLflowLogger, MLflowRun
    from lit.tracking.config_log import LogConfigToMLflow

    cli = check_config(["--config", stored_config(workdir, store), *TINY_LM])
    assert isinstance(cli.trainer.logger, MLflowLogger)
    assert any(isinstance(c, MLflowRun) for c in cli.trainer.callbacks)
    dumped = yaml.safe_load(cli.parser.dump(cli.config, skip_none=False))
    assert dumped["trainer"]["logger"]["class_path"] == "lit.tracking.MLflowLogger"
    assert {c["class_path"] for c in dumped["trainer"]["callbacks"]} == {"lit.callbacks.MLflowRun"}
    import lit.tracking
    assert lit.tracking.LogConfigToMLflow is LogConfigToMLflow  # the public name of the config callback


def test_experiments_created_for_training_say_so_and_a_users_kind_is_kept(store):
    from lit.sweep.store import experiment_id_for
    from lit.tracking import MLflowLogger
    from lit.tracking.names import EXPERIMENT_KIND, MODEL_TRAINING

    uri = store
    logger = MLflowLogger(experiment_name="fresh", tracking_uri=uri, system_metrics=False)
    client = logger.experiment
    assert client.get_experiment(logger.experiment_id).tags[EXPERIMENT_KIND] == MODEL_TRAINING
    client = mlflow.MlflowClient(uri)
    assert client.get_experiment(experiment_id_for(client, "swept", create=True)).tags[EXPERIMENT_KIND] == \
        MODEL_TRAINING
    mine = client.create_experiment("mine", tags={EXPERIMENT_KIND: "genai_development"})
    MLflowLogger(experiment_name="mine", tracking_uri=uri, system_metrics=False).experiment  # noqa: B018
    assert client.get_experiment(mine).tags[EXPERIMENT_KIND] == "genai_development"
