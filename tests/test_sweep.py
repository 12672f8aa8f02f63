"""`cli.py sweep`: the grid, the MLflow parent/child layout, paired data order, tuning, resume, SLURM, bad input.

Sweeps run as a user runs them, `python cli.py sweep ...` in a child process: the sweep forks its runs,
which is only safe from a process that has not computed with torch yet (see lit/sweep/local.py).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from mlflow import MlflowClient

from lit.commands import main
from lit.errors import UserInputError
from lit.sweep import protocol as P
from lit.sweep.grid import build_children, build_variants, find_baseline, parse_variant, split_top_level
from tests.conftest import REPO, subprocess_env

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
TINY = ["--model.arch.d_model=32", "--model.arch.n_layers=2", "--model.arch.n_heads=2", "--data.block_size=16",
        "--data.batch_size=4", "--trainer.max_steps=4", "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=2", "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=1"]


def sweep(cwd: Path, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(REPO / "cli.py"), "sweep", *args], cwd=cwd, capture_output=True,
                         text=True, env=env or subprocess_env(), timeout=600)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def client_for(cwd: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")


def runs_of(client: MlflowClient, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get(P.ROLE) == "parent"]
    children = [r for r in runs if r.data.tags.get(P.ROLE) == "child"]
    return parents, children


def final(client: MlflowClient, run, metric: str = "val/loss") -> float:
    return max(client.get_metric_history(run.info.run_id, metric), key=lambda m: m.step).value


# --- the grid (pure) ---

def test_values_split_outside_brackets():
    assert split_top_level("a,[1, 2],{x: 1, y: 2},b") == ["a", "[1, 2]", "{x: 1, y: 2}", "b"]
    assert parse_variant("model.arch.norm=dyt,model.betas=[0.9, 0.95]") == {
        "model.arch.norm": "dyt", "model.betas": "[0.9, 0.95]"}


def test_vary_makes_a_grid_and_variant_adds_to_the_recipe():
    grid = build_variants(["model.arch.norm=rmsnorm,dyt", "model.lr=1e-3,3e-3"], [])
    assert [v.label for v in grid] == ["norm=rmsnorm,lr=1e-3", "norm=rmsnorm,lr=3e-3", "norm=dyt,lr=1e-3",
                                       "norm=dyt,lr=3e-3"]
    assert [v.label for v in build_variants([], [])] == ["recipe"]  # a replication of the recipe over seeds
    ablation = build_variants([], ["model.arch.norm=dyt", "config=recipes/gpt_ngpt.yaml"])
    assert [v.label for v in ablation] == ["recipe", "norm=dyt", "config=gpt_ngpt"]
    assert find_baseline(grid, "model.arch.norm=dyt,model.lr=3e-3").label == "norm=dyt,lr=3e-3"
    with pytest.raises(UserInputError, match="matches 2 variants"):
        find_baseline(grid, "model.arch.norm=dyt")


def test_tuning_runs_come_first_and_the_first_seed_reuses_the_picked_run():
    from lit.sweep.grid import Tuning

    variants = build_variants(["model.arch.norm=rmsnorm,dyt"], [])
    children = build_children(variants, [7, 8], Tuning("model.lr", ["1e-3", "1e-2"], None, 7, True))
    assert [c.phase for c in children] == ["tune"] * 4 + ["seed"] * 4
    assert [(c.variant, c.seed, c.reuse) for c in children if c.phase == "seed"] == [
        ("norm=rmsnorm", 7, True), ("norm=rmsnorm", 8, False), ("norm=dyt", 7, True), ("norm=dyt", 8, False)]
    shorter = build_children(variants, [7, 8], Tuning("model.lr", ["1e-3", "1e-2"], 2, 7, False))
    assert not any(c.reuse for c in shorter) and {c.steps for c in shorter if c.phase == "tune"} == {2}


# --- a real tiny sweep ---

@pytest.fixture(scope="module")
def tuned_sweep(tmp_path_factory):
    """2 variants x 2 seeds, the learning rate tuned over 2 values, every step's batch recorded."""
    cwd = tmp_path_factory.mktemp("sweep")
    record = cwd / "batches"
    record.mkdir()
    out = sweep(cwd, "--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm", "--seeds", "2",
                "--tune", "model.lr=1e-3,3e-2", "--parallel", "2", "--experiment", "tiny", *TINY,
                "--trainer.callbacks+=tests.batch_recorder.RecordBatches",
                env=subprocess_env(ARCH_LAB_RECORD_BATCHES=str(record)))
    batches = [json.loads(line) for f in record.glob("*.jsonl") for line in f.read_text().splitlines()]
    return cwd, out, batches


def test_sweep_writes_one_parent_and_a_child_per_variant_seed_and_tuning_value(tuned_sweep):
    cwd, out, _ = tuned_sweep
    client = client_for(cwd)
    parents, children = runs_of(client, "tiny")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    proto = json.loads(Path(client.download_artifacts(parent.info.run_id, P.PROTOCOL_FILE, str(cwd))).read_text())
    assert [v["label"] for v in proto["variants"]] == ["norm=rmsnorm", "norm=layernorm"]
    assert proto["seeds"] == [1337, 1338] and proto["baseline"] == "norm=rmsnorm" and proto["mode"] == "min"
    assert proto["tune"]["values"] == ["1e-3", "3e-2"] and proto["tune"]["reuse_seed_run"]
    # 2 variants x 2 values of tuning on seed 1337, then seed 1338 at the picked value (1337 is reused).
    assert len(children) == 6 and all(c.info.status == "FINISHED" for c in children)
    for c in children:
        tags = c.data.tags
        assert tags[P.PARENT_RUN] == parent.info.run_id and tags[P.SWEEP_ID] == proto["sweep_id"]
        assert c.data.params["data.init_args.seed"] == tags[P.SEED] == c.data.params["seed_everything"]
        # bits per byte: tinyshakespeare is ASCII, one byte per character token.
        assert final(client, c, "val/bpb") == pytest.approx(final(client, c) / math.log(2), rel=1e-5)
        assert c.data.metrics[P.PARAMETERS_METRIC] > 0 and c.data.metrics[P.ITEMS_PER_STEP_METRIC] == 4 * 16
    finals = [c for c in children if c.data.tags.get(P.FINAL) == "true"]
    assert sorted((c.data.tags[P.VARIANT], c.data.tags[P.SEED]) for c in finals) == [
        ("norm=layernorm", "1337"), ("norm=layernorm", "1338"), ("norm=rmsnorm", "1337"), ("norm=rmsnorm", "1338")]
    assert parent.data.metrics["sweep/runs"] == 6 and 0 <= parent.data.metrics["sweep/overhead_fraction"] < 1
    assert "python cli.py compare --experiment tiny" in out.stdout


def test_each_variant_runs_its_seeds_at_the_value_with_the_best_validation_loss(tuned_sweep):
    cwd, _, _ = tuned_sweep
    client = client_for(cwd)
    _, children = runs_of(client, "tiny")
    for variant in ("norm=rmsnorm", "norm=layernorm"):
        tuning = {float(c.data.tags[P.TUNE_VALUE]): final(client, c) for c in children
                  if c.data.tags[P.VARIANT] == variant and c.data.tags[P.PHASE] == "tune"}
        best = min(tuning, key=tuning.get)
        seeds = [c for c in children if c.data.tags[P.VARIANT] == variant and c.data.tags.get(P.FINAL) == "true"]
        assert {float(c.data.params["model.init_args.lr"]) for c in seeds} == {best}
        reused = [c for c in seeds if c.data.tags[P.PHASE] == "tune"]
        assert len(reused) == 1 and reused[0].data.tags[P.SEED] == "1337"


def test_seed_i_feeds_the_same_batches_to_every_variant(tuned_sweep):
    _, _, batches = tuned_sweep
    order = defaultdict(list)
    for b in sorted(batches, key=lambda b: b["step"]):
        order[(b["seed"], b["norm"], b["lr"])].append(b["checksum"])
    assert len(order) == 6 and all(len(v) == 4 for v in order.values())
    by_seed = defaultdict(set)
    for (seed, _, _), sums in order.items():
        by_seed[seed].add(tuple(sums))
    # One order per seed, whatever the variant or learning rate; another seed, another order.
    assert {k: len(v) for k, v in by_seed.items()} == {"1337": 1, "1338": 1}
    assert by_seed["1337"] != by_seed["1338"]


def test_compare_reports_the_stored_metrics_computed_by_hand(tuned_sweep, capsys):
    import numpy as np
    from scipy import stats

    cwd, _, _ = tuned_sweep
    client = client_for(cwd)
    _, children = runs_of(client, "tiny")
    finals = {(c.data.tags[P.VARIANT], c.data.tags[P.SEED]): final(client, c) for c in children
              if c.data.tags.get(P.FINAL) == "true"}
    base = np.array([finals["norm=rmsnorm", s] for s in ("1337", "1338")])
    other = np.array([finals["norm=layernorm", s] for s in ("1337", "1338")])

    assert main(["compare", "--experiment", "tiny", "--tracking_uri", f"sqlite:///{cwd / 'mlflow.db'}",
                 "--out", str(cwd / "report")]) is None
    report = (cwd / "report" / "report.md").read_text()
    assert capsys.readouterr().out.strip() == report.strip()

    def row(heading: str, label: str) -> list[str]:
        section = report[report.index(heading):].split("\n## ", 1)[0]
        line = next(line for line in section.splitlines() if line.startswith(f"| {label}"))
        return [cell.strip() for cell in line.strip("|").split(" | ")]

    def printed(cell: str, expected: float) -> None:
        value = cell.split()[0].lstrip("+")
        decimals = len(value.split(".")[1]) if "." in value else 0
        assert abs(float(value) - expected) <= 0.5 * 10 ** -decimals + 1e-12, (cell, expected)

    printed(row("## Variants", "norm=layernorm")[2], other.mean())
    printed(row("## Variants", "norm=rmsnorm")[2], base.mean())
    difference = row("## Against the baseline", "norm=layernorm")
    printed(difference[2], (other - base).mean())
    printed(difference[4], stats.ttest_rel(other, base).pvalue)
    logged = [a.path for a in client.list_artifacts(runs_of(client, "tiny")[0][0].info.run_id, P.REPORT_DIR)]
    assert f"{P.REPORT_DIR}/report.md" in logged


def test_a_killed_sweep_resumes_without_rerunning_finished_children(tmp_path):
    args = ["--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm", "--seeds", "2",
            "--experiment", "killed", *TINY]
    proc = subprocess.Popen([sys.executable, str(REPO / "cli.py"), "sweep", *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=subprocess_env(),
                            start_new_session=True)
    try:
        for line in proc.stdout:  # kill the whole sweep (and its running child) once a child has finished
            if line.startswith("done "):
                break
        else:
            pytest.fail("the sweep ended before any child finished")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    client = client_for(tmp_path)
    _, before = runs_of(client, "killed")
    finished = {c.data.tags[P.CHILD_KEY]: c.info.run_id for c in before if c.info.status == "FINISHED"}
    assert 1 <= len(finished) < 4

    out = sweep(tmp_path, *args)
    assert f"{len(finished)} runs already finished; {4 - len(finished)} to run" in out.stdout
    _, after = runs_of(client, "killed")
    done = [c for c in after if c.info.status == "FINISHED"]
    assert sorted(c.data.tags[P.CHILD_KEY] for c in done) == sorted(
        f"norm={n}|seed|{s}" for n in ("rmsnorm", "layernorm") for s in (1337, 1338))
    for key, run_id in finished.items():  # the same run, not a new one
        assert [c.info.run_id for c in done if c.data.tags[P.CHILD_KEY] == key] == [run_id]
    # The run the kill interrupted is marked KILLED, not left RUNNING forever.
    assert all(c.info.status in ("FINISHED", "KILLED") for c in after)


def test_slurm_job_array_task_run_by_hand_logs_its_child(tmp_path):
    sweep(tmp_path, "--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm", "--seeds", "2",
          "--experiment", "cluster", "--launch", "slurm", "--out", "sw", "--sbatch=--time=00:10:00", *TINY)
    out = tmp_path / "sw"
    script = (out / "seeds.sbatch").read_text()
    assert "#SBATCH --array=0-3" in script and "#SBATCH --time=00:10:00" in script
    for name in ("seeds.sbatch", "submit.sh"):
        assert subprocess.run(["bash", "-n", str(out / name)]).returncode == 0
    client = client_for(tmp_path)
    assert runs_of(client, "cluster")[1] == []  # nothing ran: the scheduler runs it

    task = subprocess.run(["bash", str(out / "seeds.sbatch")], cwd=tmp_path, capture_output=True, text=True,
                          env=subprocess_env(SLURM_ARRAY_TASK_ID="1"), timeout=300)
    assert task.returncode == 0, task.stderr[-3000:]
    (child,) = runs_of(client, "cluster")[1]
    assert child.info.status == "FINISHED"
    assert (child.data.tags[P.VARIANT], child.data.tags[P.SEED]) == ("norm=rmsnorm", "1338")
    again = subprocess.run(["bash", str(out / "seeds.sbatch")], cwd=tmp_path, capture_output=True, text=True,
                           env=subprocess_env(SLURM_ARRAY_TASK_ID="1"), timeout=300)
    assert "already finished" in again.stdout and len(runs_of(client, "cluster")[1]) == 1


def test_slurm_with_tuning_starts_the_seeds_after_the_tuning_array(tmp_path):
    sweep(tmp_path, "--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm", "--seeds", "2",
          "--tune", "model.lr=1e-3,3e-3,1e-2", "--launch", "slurm", "--out", "sw", *TINY)
    out = tmp_path / "sw"
    assert "#SBATCH --array=0-5" in (out / "tune.sbatch").read_text()
    submit = (out / "submit.sh").read_text()
    assert "tune=$(sbatch --parsable" in submit and "--dependency=afterok:" in submit
    assert subprocess.run(["bash", "-n", str(out / "submit.sh")]).returncode == 0


@pytest.mark.parametrize("args, expected", [
    (["--vary", "model.arch.nosuch=1,2"], "variant nosuch=1: "),
    (["--vary", "model.arch.norm=rmsnorm,rmsnrom"], "variant norm=rmsnrom: unknown norm 'rmsnrom'"),
])
def test_a_key_or_value_the_recipe_rejects_is_one_line_before_anything_trains(tmp_path, args, expected):
    out = sweep(tmp_path, "--config", BASELINE, *args, *TINY, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], out.stderr
    assert "Traceback" not in out.stderr
    assert runs_of(client_for(tmp_path), "sweep-gpt_baseline")[1] == []  # no run trained


@pytest.mark.parametrize("args, expected", [
    (["--vary", "model.arch.norm"], "--vary 'model.arch.norm' is not KEY=VALUE"),
    (["--vary", "model.arch.norm=a,a"], "repeats a value"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--tune", "model.lr=1e-3"], "has one value"),
    (["--vary", "model.lr=1e-3,1e-2", "--tune", "model.lr=1e-3,1e-2"], "both varied and tuned"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--baseline", "model.arch.norm=perinorm"], "matches no variant"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--seeds", "0"], "--seeds must be at least 1"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--tune_steps", "5"], "--tune_steps needs --tune"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "-x"], "fit options are --key=value"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--seeds", "two"], "argument --seeds: invalid int value"),
])
def test_bad_options_are_one_line_and_exit_code_2(workdir, capsys, args, expected):
    # These are refused before the sweep touches the store or forks, so they can run in this process.
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--config", BASELINE, *args, *TINY])
    assert e.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0]
    assert not (workdir / "mlflow.db").exists()


def test_a_missing_recipe_is_one_line(workdir, capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--config", "nope.yaml", "--vary", "model.arch.norm=a,b"])
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: recipe nope.yaml not found")


def test_help_explains_the_command():
    out = subprocess.run([sys.executable, str(REPO / "cli.py"), "sweep", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--tune" in out.stdout and "data.seed" in out.stdout


def test_child_runs_are_read_across_mlflow_pages(tmp_path, monkeypatch):
    from lit.sweep import store

    client = client_for(tmp_path)
    experiment = client.create_experiment("paged")
    for i in range(5):
        client.create_run(experiment, tags={P.ROLE: P.CHILD, P.SWEEP_ID: "s1", P.CHILD_KEY: f"k{i}"})
    monkeypatch.setattr(store, "PAGE", 2)  # 5 runs: 3 pages; one page would miss finished children on resume
    assert sorted(r.data.tags[P.CHILD_KEY] for r in store.child_runs(client, experiment, "s1")) == [
        f"k{i}" for i in range(5)]
