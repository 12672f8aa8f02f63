"""A sweep's identity survives a move: the same sweep run from a copy of the project at another path resumes, and
a sweep whose id hashed the recipe's absolute path (the rule before) is still found (lit/sweep/command.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from lit.sweep import protocol as P
from lit.sweep.command import find_sweep, project_path
from lit.sweep.store import LINEAGE, create_parent, follow_moved_store, read_protocol
from tests.conftest import REPO, subprocess_env
from tests.test_sweep import TINY, runs_of, sweep


@pytest.mark.slow  # two sweeps and a compare in child processes (about a minute on an idle machine)
def test_the_same_sweep_from_a_moved_project_resumes_with_no_new_runs(tmp_path):
    # No code commit in the identity: other commits landing between the two sweeps must not refuse the resume.
    env = subprocess_env(GIT_DIR=str(tmp_path / "no-git"))
    first = tmp_path / "checkout"
    (first / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "recipes" / "gpt_baseline.yaml", first / "recipes" / "baseline.yaml")
    args = ["--config", "recipes/baseline.yaml", "--seeds", "1", "--experiment", "moved", *TINY]
    started = sweep(first, *args, env=env)
    assert "(new)" in started.stdout
    moved = tmp_path / "elsewhere" / "clone"
    moved.parent.mkdir()
    shutil.move(first, moved)  # the old path is gone: nothing can be read from it any more

    again = sweep(moved, *args, env=env)
    assert "(resumed)" in again.stdout, again.stdout
    assert "1 runs already finished; 0 to run" in again.stdout, again.stdout
    assert f"artifacts are now read from {moved / 'mlruns'}" in again.stdout
    parents, children = runs_of(MlflowClient(f"sqlite:///{moved / 'mlflow.db'}"), "moved")
    assert len(parents) == 1 and len(children) == 1  # no new sweep, no new run
    # compare reads the protocol and the runs through the moved store too
    compared = subprocess.run([sys.executable, str(REPO / "cli.py"), "compare", "--experiment", "moved"],
                              cwd=moved, capture_output=True, text=True, env=env, timeout=300)
    assert compared.returncode == 0, compared.stderr[-2000:]


def test_a_sweep_started_under_the_absolute_path_rule_is_found_after_a_move(tmp_path, monkeypatch, empty_store):
    from lit.sweep.grid import sweep_id

    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("old")
    now = tmp_path / "new_place" / "recipes" / "baseline.yaml"
    now.parent.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "new_place")
    core = {"recipe": project_path(now.resolve()), "variants": [{"label": "recipe", "overrides": {}}], "seeds": None}
    assert core["recipe"] == "recipes/baseline.yaml"

    def started_under_the_old_rule(old_recipe: str) -> str:
        old_core = {**core, "recipe": old_recipe}
        proto = {**old_core, "sweep_id": sweep_id({**old_core, "identity": {}}), "report_metric": "val/loss",
                 "metric": "val/loss", "tune": None}
        return create_parent(client, experiment_id, proto, sweep_id(old_core), {})

    elsewhere = started_under_the_old_rule("/somewhere/else/recipes/other.yaml")  # another recipe: not this sweep
    old = started_under_the_old_rule("/old/home/arch-lab/recipes/baseline.yaml")
    parent, lineage = find_sweep(client, experiment_id, core, now)
    assert parent is not None and parent.info.run_id == old != elsewhere
    assert lineage == parent.data.tags[LINEAGE] and parent.data.tags[P.ROLE] == P.PARENT

    # A sweep under today's rule wins over the old one, and is found by its own lineage.
    new = create_parent(client, experiment_id, {**core, "sweep_id": "n", "report_metric": "val/loss",
                                                "metric": "val/loss", "tune": None}, sweep_id(core), {})
    parent, lineage = find_sweep(client, experiment_id, core, now)
    assert parent.info.run_id == new and lineage == sweep_id(core)


def test_the_recipe_is_named_relative_to_its_project(tmp_path, monkeypatch):
    recipe = tmp_path / "proj" / "recipes" / "x.yaml"
    recipe.parent.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "proj")
    assert project_path(recipe) == "recipes/x.yaml"
    (tmp_path / "proj" / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "proj" / "sub")  # outside the folder run from, and no .git: absolute
    assert project_path(recipe) == str(recipe)
    (tmp_path / "proj" / ".git").mkdir()  # inside a checkout: relative to it, wherever the command runs
    assert project_path(recipe) == "recipes/x.yaml"
    assert project_path(Path(REPO / "recipes" / "gpt_baseline.yaml")) == "recipes/gpt_baseline.yaml"


def test_a_moved_store_reads_its_artifacts_beside_it(tmp_path, empty_store):
    first = tmp_path / "a"
    first.mkdir()
    shutil.copyfile(empty_store, first / "mlflow.db")
    client = MlflowClient(f"sqlite:///{first / 'mlflow.db'}")
    experiment_id = client.create_experiment("x", artifact_location=str(first / "mlruns" / "1"))
    run_id = create_parent(client, experiment_id, {"sweep_id": "s", "recipe": "r.yaml", "variants": [],
                                                   "metric": "m", "report_metric": "m", "tune": None}, "l", {})
    assert follow_moved_store(client, experiment_id) is None  # not moved: nothing to do
    shutil.move(first, tmp_path / "b")
    client = MlflowClient(f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}")
    assert follow_moved_store(client, experiment_id) == str(tmp_path / "b" / "mlruns" / "1")
    assert read_protocol(client, run_id)["sweep_id"] == "s"
    assert client.get_run(run_id).info.artifact_uri.startswith(str(tmp_path / "b" / "mlruns" / "1"))
    assert follow_moved_store(client, experiment_id) is None  # once
