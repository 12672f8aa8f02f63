"""`cli.py sweep`: the grid, the MLflow parent/child layout, paired data order, tuning, resume, SLURM, bad input.

Sweeps that train run as a user runs them, `python cli.py sweep ...` in a child process: the sweep forks its runs,
which is only safe from a process that has not computed with torch yet (see lit/sweep/local.py). A sweep that
trains nothing here (a refusal, SLURM scripts written) runs in this process (`sweep_here`): each child process
costs seconds of importing Lightning.
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
from tests.conftest import REPO, assert_refused_in_one_line, cli_here, subprocess_env

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
TINY = ["--model.arch.d_model=32", "--model.arch.n_layers=2", "--model.arch.n_heads=2", "--data.block_size=16",
        "--data.batch_size=4", "--trainer.max_steps=4", "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2", "--trainer.num_sanity_val_steps=0",
        "--trainer.log_every_n_steps=1"]


def sweep(cwd: Path, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(REPO / "cli.py"), "sweep", *args], cwd=cwd, capture_output=True,
                         text=True, env=env or subprocess_env(), timeout=600)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def sweep_here(cwd: Path, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``sweep`` in this process (``cli_here``), for a sweep that starts no run: one that does would fork this
    process, which has computed with torch."""
    result = cli_here(["sweep", *args], cwd, env)
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


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


def test_tuning_runs_come_first_and_the_old_rule_reuses_the_picked_run():
    from lit.sweep.grid import Tuning

    variants = build_variants(["model.arch.norm=rmsnorm,dyt"], [])
    separate = build_children(variants, [7, 8], Tuning("model.lr", ["1e-3", "1e-2"], None, 6, False))
    assert {c.seed for c in separate if c.phase == "tune"} == {6} and not any(c.reuse for c in separate)
    children = build_children(variants, [7, 8], Tuning("model.lr", ["1e-3", "1e-2"], None, 7, True))
    assert [c.phase for c in children] == ["tune"] * 4 + ["seed"] * 4
    assert [(c.variant, c.seed, c.reuse) for c in children if c.phase == "seed"] == [
        ("norm=rmsnorm", 7, True), ("norm=rmsnorm", 8, False), ("norm=dyt", 7, True), ("norm=dyt", 8, False)]
    shorter = build_children(variants, [7, 8], Tuning("model.lr", ["1e-3", "1e-2"], 2, 7, False))
    assert not any(c.reuse for c in shorter) and {c.steps for c in shorter if c.phase == "tune"} == {2}


# --- a real tiny sweep ---

DIVERGING_LR = "1e37"  # the first update (the warmup's first non-zero step) makes the next loss overflow


@pytest.fixture(scope="module")
def tuned_sweep(tmp_path_factory):
    """2 variants x 2 seeds, the learning rate tuned over 3 values (one diverges) on 3-step runs of a separate
    tuning seed, every step's batch recorded."""
    cwd = tmp_path_factory.mktemp("sweep")
    record = cwd / "batches"
    record.mkdir()
    out = sweep(cwd, "--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm", "--seeds", "2",
                "--tune", f"model.lr=1e-3,3e-2,{DIVERGING_LR}", "--tune_steps", "3", "--parallel", "2",
                "--experiment", "tiny", *TINY,
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
    assert proto["metric"] == "val/loss" and proto["report_metric"] == "test/loss"
    assert proto["tune"]["values"] == ["1e-3", "3e-2", DIVERGING_LR] and proto["tune"]["rule"] == "separate_seed"
    assert proto["tune"]["seed"] == 1336 and proto["tune"]["steps"] == 3 and not proto["tune"]["reuse_seed_run"]
    assert proto["family"] == proto["sweep_id"] and proto["equivalence"] is None
    assert set(proto["identity"]) == {"recipe_sha256", "variant_files", "commit", "dirty"}
    # 2 variants x 3 values of tuning on seed 1336 (outside the evaluation seeds), then both seeds at the pick.
    assert len(children) == 10
    diverged = [c for c in children if c.info.status == "FAILED"]
    assert sorted(c.data.tags[P.CHILD_KEY] for c in diverged) == [
        f"norm={n}|tune|model.lr={DIVERGING_LR}" for n in ("layernorm", "rmsnorm")]
    for c in diverged:  # an outcome, at the first non-finite step, with the steps before it kept
        step = int(c.data.tags[P.DIVERGED_STEP])
        assert c.data.tags[P.OUTCOME] == "diverged" and step in (1, 2)
        losses = client.get_metric_history(c.info.run_id, "train/loss")
        assert sorted(m.step for m in losses) == list(range(step)) and all(math.isfinite(m.value) for m in losses)
    for c in children:
        if c in diverged:
            continue
        assert c.info.status == "FINISHED" and c.data.tags[P.OUTCOME] == "finished"
        steps = max(m.step for m in client.get_metric_history(c.info.run_id, "train/loss"))
        assert steps == (2 if c.data.tags[P.PHASE] == "tune" else 3)  # --tune_steps 3, then the full 4
        # Test on the final weights for the runs that count, never for tuning (it reads validation only).
        assert ("test/loss" in c.data.metrics) == (c.data.tags[P.PHASE] == "seed")
        tags = c.data.tags
        assert tags[P.PARENT_RUN] == parent.info.run_id and tags[P.SWEEP_ID] == proto["sweep_id"]
        assert c.data.params["data.init_args.seed"] == tags[P.SEED] == c.data.params["seed_everything"]
        # bits per byte: tinyshakespeare is ASCII, one byte per character token.
        assert final(client, c, "val/bpb") == pytest.approx(final(client, c) / math.log(2), rel=1e-5)
        assert c.data.metrics[P.PARAMETERS_METRIC] > 0 and c.data.metrics[P.ITEMS_PER_STEP_METRIC] == 4 * 16
    finals = [c for c in children if c.data.tags.get(P.FINAL) == "true"]
    assert sorted((c.data.tags[P.VARIANT], c.data.tags[P.SEED], c.data.tags[P.PHASE]) for c in finals) == [
        (f"norm={n}", s, "seed") for n in ("layernorm", "rmsnorm") for s in ("1337", "1338")]
    assert parent.data.metrics["sweep/runs"] == 8 and 0 <= parent.data.metrics["sweep/overhead_fraction"] < 1
    assert "2 runs diverged (recorded as such, not rerun)" in out.stdout
    assert "python cli.py compare --experiment tiny" in out.stdout


def test_each_variant_runs_its_seeds_at_the_value_with_the_best_validation_loss(tuned_sweep):
    cwd, _, _ = tuned_sweep
    client = client_for(cwd)
    _, children = runs_of(client, "tiny")
    for variant in ("norm=rmsnorm", "norm=layernorm"):
        tuning = {float(c.data.tags[P.TUNE_VALUE]): final(client, c) for c in children
                  if c.data.tags[P.VARIANT] == variant and c.data.tags[P.PHASE] == "tune"
                  and c.info.status == "FINISHED"}  # a diverged value is never picked
        assert len(tuning) == 2
        best = min(tuning, key=tuning.get)
        seeds = [c for c in children if c.data.tags[P.VARIANT] == variant and c.data.tags.get(P.FINAL) == "true"]
        assert {float(c.data.params["model.init_args.lr"]) for c in seeds} == {best} and len(seeds) == 2


def test_seed_i_feeds_the_same_batches_to_every_variant(tuned_sweep):
    _, _, batches = tuned_sweep
    order = defaultdict(list)
    for b in sorted(batches, key=lambda b: b["step"]):
        order[(b["seed"], b["norm"], b["lr"])].append(b["checksum"])
    order = {k: v for k, v in order.items() if k[0] != "1336"}  # the tuning runs are shorter
    assert len(order) == 4 and all(len(v) == 4 for v in order.values())
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
    # The sweep reports the test split's loss of the final weights (the protocol's report_metric).
    finals = {(c.data.tags[P.VARIANT], c.data.tags[P.SEED]): final(client, c, "test/loss") for c in children
              if c.data.tags.get(P.FINAL) == "true"}
    base = np.array([finals["norm=rmsnorm", s] for s in ("1337", "1338")])
    other = np.array([finals["norm=layernorm", s] for s in ("1337", "1338")])

    assert main(["compare", "--experiment", "tiny", "--tracking_uri", f"sqlite:///{cwd / 'mlflow.db'}",
                 "--out", str(cwd / "report")]) in (None, 0)  # commands return their exit code
    report = (cwd / "report" / "report.md").read_text()
    assert capsys.readouterr().out.strip() == report.strip()

    def row(heading: str, label: str) -> dict[str, str]:
        from tests.test_compare import table

        return table(report, heading)[label]

    def printed(cell: str, expected: float) -> None:
        value = cell.split()[0].lstrip("+")
        decimals = len(value.split(".")[1]) if "." in value else 0
        assert abs(float(value) - expected) <= 0.5 * 10 ** -decimals + 1e-12, (cell, expected)

    printed(row("## Variants", "norm=layernorm")["mean ± std"], other.mean())
    printed(row("## Variants", "norm=rmsnorm")["mean ± std"], base.mean())
    difference = row("## Against the baseline", "norm=layernorm")
    printed(difference["mean difference"], (other - base).mean())
    printed(difference["p (paired t)"], stats.ttest_rel(other, base).pvalue)
    # Real runs log their per-example test losses: the report carries the seeds x examples interval.
    assert difference["CI, seeds × test examples"].startswith("[")
    logged = [a.path for a in client.list_artifacts(runs_of(client, "tiny")[0][0].info.run_id, P.REPORT_DIR)]
    assert f"{P.REPORT_DIR}/report.md" in logged


def test_a_killed_sweep_resumes_without_rerunning_finished_children(tmp_path):
    # One seed per variant (two children): the fewest runs that leave a finished child and an interrupted one.
    args = ["--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm", "--seeds", "1",
            "--experiment", "killed", *TINY, "--trainer.callbacks+=tests.hold.HoldWhileFileExists"]
    hold = tmp_path / "hold"
    hold.touch()  # the first child waits at its start until the second command has been answered
    proc = subprocess.Popen([sys.executable, str(REPO / "cli.py"), "sweep", *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=subprocess_env(ARCH_LAB_HOLD_FILE=str(hold)), start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("start "):
                break
        # The same sweep started again while its first child trains: refused in one line naming the owner.
        second = sweep_here(tmp_path, *args, check=False)
        hold.unlink()
        assert second.returncode == 2, second.stdout + second.stderr
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "is already running" in errors[0] and f"PID {proc.pid} " in errors[0], errors
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
    assert len(finished) == 1

    out = sweep(tmp_path, *args)
    assert "1 runs already finished; 1 to run" in out.stdout
    _, after = runs_of(client, "killed")
    done = [c for c in after if c.info.status == "FINISHED"]
    assert sorted(c.data.tags[P.CHILD_KEY] for c in done) == sorted(
        f"norm={n}|seed|{s}" for n in ("rmsnorm", "layernorm") for s in (1337,))
    for key, run_id in finished.items():  # the same run, not a new one
        assert [c.info.run_id for c in done if c.data.tags[P.CHILD_KEY] == key] == [run_id]
    # The run the kill interrupted is marked KILLED, not left RUNNING forever; the parent ends too.
    assert all(c.info.status in ("FINISHED", "KILLED") for c in after)
    (parent,) = runs_of(client, "killed")[0]
    assert parent.info.status == "FINISHED"

    # Extending it by a seed (--add_seeds: only the new seed runs, in the same parent, and the original command is
    # then refused) is checked on faked training in tests/test_sweep_looks.py, without two more real fits here.


@pytest.mark.slow
def test_a_variant_diverged_at_every_value_runs_no_seed_and_the_sweep_still_finishes(tmp_path):
    args = ["--config", BASELINE, "--seeds", "1", "--tune", f"model.lr={DIVERGING_LR},1e38", "--tune_steps", "3",
            "--parallel", "2", "--experiment", "hopeless", *TINY]
    out = sweep(tmp_path, *args)
    assert "variant recipe: every tuning value diverged; its seeds were not run" in out.stdout
    client = client_for(tmp_path)
    (parent,), children = runs_of(client, "hopeless")
    assert parent.info.status == "FINISHED"
    assert sorted((c.data.tags[P.PHASE], c.info.status, c.data.tags[P.OUTCOME]) for c in children) == [
        ("tune", "FAILED", "diverged")] * 2
    again = sweep(tmp_path, *args)  # nothing to rerun: a diverged run is done
    assert "2 runs already finished; 1 to run" in again.stdout and len(runs_of(client, "hopeless")[1]) == 2


@pytest.mark.slow
def test_a_stopped_sweep_ends_its_parent_killed(tmp_path):
    proc = subprocess.Popen([sys.executable, str(REPO / "cli.py"), "sweep", "--config", BASELINE, "--seeds", "1",
                             "--experiment", "stopped", *TINY, "--trainer.max_steps=200"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=subprocess_env())
    try:
        for line in proc.stdout:
            if line.startswith("start "):
                break
        proc.send_signal(signal.SIGTERM)
    finally:
        assert proc.wait(timeout=120) == 130
    (parent,), children = runs_of(client_for(tmp_path), "stopped")
    assert parent.info.status == "KILLED" and all(c.info.status != "RUNNING" for c in children)


def test_slurm_job_array_task_run_by_hand_logs_its_child(tmp_path):
    sweep_here(tmp_path, "--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm", "--seeds", "2",
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
    sweep_here(tmp_path, "--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm", "--seeds", "2",
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
def test_a_key_or_value_the_recipe_rejects_is_one_line_before_anything_trains(workdir, capsys, args, expected):
    # Refused while the variants are built, before the sweep forks, so it can run in this process.
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--config", BASELINE, *args, *TINY])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], err
    assert "Traceback" not in err
    if (workdir / "mlflow.db").exists():
        assert runs_of(client_for(workdir), "sweep-gpt_baseline")[1] == []  # no run trained


@pytest.mark.parametrize("args, expected", [
    (["--vary", "model.arch.norm"], "--vary 'model.arch.norm' is not KEY=VALUE"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--metric", "val/score"], "--mode min or --mode max"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--tune", "model.lr=1e-3,1e-2", "--tune_seed", "1338"],
     "--tune_seed 1338 is one of the evaluation seeds"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--tune", "model.lr=1e-3,1e-2", "--tune_steps", "2",
      "--reuse_tuning_run_as_seed"], "needs tuning runs at the full budget"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--tune_seed", "5"], "--tune_seed needs --tune"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--equivalent", "norm=dyt"], "needs --equivalence_margin"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--equivalence_margin", "0.1", "--equivalent", "dyt"],
     "--equivalent dyt is not a variant"),
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
    assert_refused_in_one_line(workdir, capsys, ["sweep", "--config", BASELINE, *args, *TINY], expected)


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


# --- the rules, without training ---

def test_tuning_picks_the_best_value_that_did_not_diverge_ties_to_the_earlier():
    from lit.sweep.store import AllTuningDiverged, best_value

    values = ["1e-3", "3e-3", "1e-2", "1e4"]
    nan = math.nan
    assert best_value(values, {"1e-3": (False, 2.0), "3e-3": (False, 1.5), "1e-2": (False, nan),
                               "1e4": (True, 0.1)}, "min", "v") == "3e-3"  # diverged and NaN never win
    assert best_value(values, {"1e-3": (False, 1.5), "3e-3": (False, 1.5), "1e-2": (False, 1.7),
                               "1e4": (False, nan)}, "min", "v") == "1e-3"  # a tie goes to the earlier value
    assert best_value(values, {"1e-3": (False, 0.5), "3e-3": (False, 0.9), "1e-2": (True, 0.99),
                               "1e4": (False, nan)}, "max", "v") == "3e-3"  # accuracy: higher is better
    with pytest.raises(AllTuningDiverged, match="every tuning value of variant v diverged"):
        best_value(values, {"1e-3": (True, 2.0), "3e-3": (False, nan), "1e-2": (True, nan),
                            "1e4": (True, nan)}, "min", "v")


def test_a_run_is_stale_only_when_its_owner_is_gone(monkeypatch):
    import socket
    import time

    from lit.sweep import ownership as O

    now = time.time()
    here = socket.gethostname()

    def tags(host=here, pid=os.getpid(), beat=now, task=None):
        out = {O.OWNER_HOST: host, O.OWNER_PID: str(pid), O.HEARTBEAT: f"{beat:.0f}"}
        return {**out, O.OWNER_TASK: task} if task else out

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert O.owner_alive(tags(pid=os.getppid()), now)  # a live process on this host, beating
    assert not O.owner_alive(tags(pid=dead.pid), now)  # its PID is dead here (kill -9)
    assert O.owner_alive(tags(host="elsewhere", pid=dead.pid), now)  # another host: its beat decides
    assert not O.owner_alive(tags(host="elsewhere", beat=now - O.STALE_AFTER_S - 1), now)
    assert not O.owner_alive({}, now)  # a run of an older sweep: no owner
    # A requeued SLURM array task is its own earlier life's successor, even on another host.
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert not O.owner_alive(tags(host="elsewhere", task="77_3"), now)
    assert O.owner_alive(tags(host="elsewhere", task="77_4"), now)


def test_a_child_held_by_a_live_process_elsewhere_is_not_run_twice(tmp_path, monkeypatch):
    import time

    from lit.sweep import ownership as O
    from lit.sweep.child import claim
    from lit.sweep.grid import Child

    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    client = client_for(tmp_path)
    experiment = client.create_experiment("owned")
    child = Child("recipe|seed|1", "recipe", "seed", 1, 0, {})
    manifest = {"protocol": {"sweep_id": "s1", "tune": None}, "parent_run_id": "p"}
    other = client.create_run(experiment, tags={P.ROLE: P.CHILD, P.SWEEP_ID: "s1", P.CHILD_KEY: child.key,
                                                O.OWNER_HOST: "elsewhere", O.OWNER_PID: "1",
                                                O.HEARTBEAT: f"{time.time():.0f}"})
    assert claim(client, experiment, manifest, child, None) is None
    assert len(client.search_runs([experiment])) == 1
    client.set_tag(other.info.run_id, O.HEARTBEAT, f"{time.time() - O.STALE_AFTER_S - 5:.0f}")  # it stopped beating
    mine = claim(client, experiment, manifest, child, None)
    assert mine is not None and client.get_run(mine).data.tags[O.OWNER_PID] == str(os.getpid())


def test_identity_names_what_changed():
    from lit.sweep.identity import changes

    old = {"recipe_sha256": "a", "variant_files": {"v.yaml": "1"}, "commit": "c0ffee", "dirty": False}
    assert changes(old, {**old, "dirty": True}) == []  # a dirty tree is recorded, not refused
    new = {**old, "recipe_sha256": "b", "variant_files": {"v.yaml": "2", "w.yaml": "3"}, "commit": "deadbeef"}
    assert changes(old, new) == ["the recipe's content", "config file v.yaml", "config file w.yaml",
                                 "the code commit (c0ffee -> deadbeef)"]
    assert changes(None, old) == ["the sweep was started before sweeps recorded their inputs"]


def test_resuming_with_an_edited_variant_file_refuses_unless_a_new_sweep_is_asked(tmp_path):
    variant = tmp_path / "longer.yaml"
    variant.write_text("trainer:\n  max_steps: 4\n")
    args = ["--config", BASELINE, "--variant", f"config={variant}", "--seeds", "2", "--experiment", "edits",
            "--launch", "slurm", *TINY]
    first = sweep_here(tmp_path, *args, "--out", "a")
    assert "(new)" in first.stdout
    variant.write_text("trainer:\n  max_steps: 4  # edited\n")
    refused = sweep_here(tmp_path, *args, "--out", "a", check=False)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == 2 and len(errors) == 1, refused.stderr
    assert f"config file {variant} changed" in errors[0] or f"config file {variant}" in errors[0]
    assert "--new_sweep" in errors[0]
    fresh = sweep_here(tmp_path, *args, "--out", "b", "--new_sweep")
    assert "(new)" in fresh.stdout
    parents, _ = runs_of(client_for(tmp_path), "edits")
    assert len({p.data.tags[P.SWEEP_ID] for p in parents}) == 2
    assert all(p.info.status == "FINISHED" for p in parents)  # a SLURM launch ends its parent once written
    nothing = sweep_here(tmp_path, "--config", BASELINE, "--seeds", "2", "--add_seeds", "1", "--experiment", "none",
                    *TINY, check=False)
    assert nothing.returncode == 2 and "--add_seeds extends an existing sweep" in nothing.stderr
