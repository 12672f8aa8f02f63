"""`cli.py sweep --tune ... --shared_value`: every variant but the baseline also runs its seeds at the baseline's tuned
value (a variant that picked that value reuses its seed runs), locally and as SLURM array tasks; the protocol
records it; `cli.py compare` reports the secondary comparison in its own section, computed here by hand.

Training is replaced by a fit that logs a known loss per (variant, learning rate, seed), read from the run's own
command line, so what is under test is the real child (its lookup of the baseline's value in the store, its tags,
its reuse), the sweep's waiting rule and the report, in seconds (tests/test_sweep.py trains real runs)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient
from scipy import stats

from lit.commands import main
from lit.sweep import child as child_module
from lit.sweep import command, local
from lit.sweep import protocol as P
from lit.sweep.grid import build_children, build_variants
from tests.conftest import REPO, assert_refused_in_one_line, fake_sweep_inputs
from tests.test_sweep_looks import noise

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
VALUES = ("1e-3", "3e-3")
TUNE = ["--tune", f"model.lr={','.join(VALUES)}"]
# rmsnorm (the baseline) and layernorm are best at 3e-3, dyt at 1e-3: layernorm's runs at the baseline's value are
# its seed runs; dyt's are new runs. Tuned, dyt is 0.01 better; at 3e-3 it is 0.04 worse.
EFFECT = {"norm=rmsnorm": 0.0, "norm=layernorm": 0.03, "norm=dyt": -0.01}
LR_COST = {"norm=rmsnorm": {"1e-3": 0.1, "3e-3": 0.0}, "norm=layernorm": {"1e-3": 0.1, "3e-3": 0.0},
           "norm=dyt": {"1e-3": 0.0, "3e-3": 0.05}}
PICKED = {"norm=rmsnorm": "3e-3", "norm=layernorm": "3e-3", "norm=dyt": "1e-3"}
SEEDS = (1337, 1338, 1339)


def loss(variant: str, lr: str, seed: int) -> float:
    """A seed effect every variant shares (the pairing), the variant's effect, its learning rate's cost, and noise
    of its own (std 0.004) that depends on the learning rate too."""
    lr = next(v for v in VALUES if float(v) == float(lr))
    return 3.0 + 0.05 * noise(seed) + EFFECT[variant] + LR_COST[variant][lr] + 0.004 * noise(variant, lr, seed)


def fake_fit_and_test(manifest, args, client, run_id, test):
    """What ``child._fit_and_test`` does after training, with the loss of the run's own command line."""
    options = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
    variant = json.loads(options["trainer.logger.init_args.tags"])[P.VARIANT]
    value = loss(variant, options["model.lr"], int(options["seed_everything"]))
    client.log_metric(run_id, "val/loss", value, step=1)
    if test:
        client.log_metric(run_id, "test/loss", value, step=1)
    client.set_tag(run_id, P.OUTCOME, P.FINISHED_OUTCOME)
    client.set_terminated(run_id, "FINISHED")
    return 0


def probe_the_gate(children, gate, results) -> None:
    """The waiting rule, asked directly: a run at the baseline's value waits for its variant's tuning, the baseline's
    tuning and its variant's seed run at that seed (which it may reuse); any of them failing blocks it, a diverged
    tuning value does not."""
    shared = next(c for c in children if c.key == "norm=layernorm|shared|1337")
    needs = [c.key for c in children if c.key.startswith(("norm=layernorm|tune", "norm=rmsnorm|tune"))]
    needs.append("norm=layernorm|seed|1337")
    for missing in needs:
        results.update({k: 0 for k in needs if k != missing})
        results.pop(missing, None)
        assert gate(shared) == "wait", missing
        results[missing] = 1
        assert gate(shared) == "blocked", missing
    results.update({k: 0 for k in needs})
    assert gate(shared) == "ready"
    results[needs[0]] = child_module.DIVERGED_EXIT
    assert gate(shared) == "ready"
    results.clear()


def run_ready_last_first(children, run, parallel, log_dir, gate, report, results, tick=None):
    """``local.run_children`` in this process, one at a time, always starting the *last* child the gate lets start
    (the runs at the baseline's value first, unless the gate makes them wait), after probing the gate."""
    if any(c.key == "norm=layernorm|shared|1337" for c in children):
        probe_the_gate(children, gate, results)
    pending, outcomes = list(children), []
    while pending:
        ready = next((c for c in reversed(pending) if gate(c) != "wait"), None)
        assert ready is not None, f"no child can start: {[c.key for c in pending]}"
        pending.remove(ready)
        code = -1 if gate(ready) == "blocked" else run(ready)
        results[ready.key] = code
        report(f"ran {ready.key}: {code}")
        outcomes.append(local.Outcome(ready, code, 0.0, None))
    return outcomes


@pytest.fixture
def fake_training(workdir_with_store, monkeypatch):
    monkeypatch.setattr(child_module, "_fit_and_test", fake_fit_and_test)
    monkeypatch.setattr(local, "run_children", run_ready_last_first)
    fake_sweep_inputs(monkeypatch)
    return workdir_with_store


def runs_by_key(cwd: Path, experiment: str):
    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id], max_results=1000)
    (parent,) = [r for r in runs if r.data.tags.get(P.ROLE) == P.PARENT]
    return client, parent, {r.data.tags[P.CHILD_KEY]: r for r in runs if r.data.tags.get(P.ROLE) == P.CHILD}


def final(client, run, metric="test/loss") -> float:
    return client.get_metric_history(run.info.run_id, metric)[-1].value


def check_children(client, children: dict, seeds) -> None:
    """Each run at the baseline's value ran at the baseline's pick, is never final, and logged that value's loss;
    layernorm, which picked the same value, trained nothing more: its seed runs are tagged instead."""
    for seed in seeds:
        shared = children[f"norm=dyt|shared|{seed}"]
        tags = shared.data.tags
        assert tags[P.PHASE] == P.SHARED_PHASE and tags[P.SHARED_VALUE] == P.TRUE and P.FINAL not in tags
        assert float(tags[P.TUNE_VALUE]) == float(PICKED["norm=rmsnorm"])
        assert final(client, shared) == pytest.approx(loss("norm=dyt", "3e-3", seed))
        own = children[f"norm=dyt|seed|{seed}"]  # the primary run: at dyt's own pick, untouched
        assert float(own.data.tags[P.TUNE_VALUE]) == 1e-3 and P.SHARED_VALUE not in own.data.tags
        assert final(client, own) == pytest.approx(loss("norm=dyt", "1e-3", seed))
        reused = children[f"norm=layernorm|seed|{seed}"]
        assert reused.data.tags[P.FINAL] == P.TRUE and reused.data.tags[P.SHARED_VALUE] == P.TRUE
        assert reused.data.tags[P.REUSED_AS] == f"norm=layernorm|shared|{seed}"
        assert f"norm=layernorm|shared|{seed}" not in children  # no run of its own
        assert P.SHARED_VALUE not in children[f"norm=rmsnorm|seed|{seed}"].data.tags
    assert not any(k.startswith("norm=rmsnorm|shared") for k in children)


def test_runs_at_the_baseline_value_wait_for_its_tuning_and_compare_reports_them(fake_training, capsys):
    cwd = fake_training
    args = ["sweep", "--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm,dyt", "--seeds", "3",
            *TUNE, "--shared_value", "--experiment", "shared"]
    assert main(args) in (None, 0)
    out = capsys.readouterr().out
    assert "3 variants x 3 seeds, 6 tuning runs, 6 runs at the baseline's tuned value" in out
    client, parent, children = runs_by_key(cwd, "shared")
    check_children(client, children, SEEDS)
    assert len(children) == 6 + 9 + 3  # tuning, seeds, dyt's runs at the baseline's value
    proto = json.loads(Path(client.download_artifacts(parent.info.run_id, P.PROTOCOL_FILE, str(cwd))).read_text())
    assert proto["shared_value"] is True

    assert main(args) in (None, 0)  # a resume: the reused children count as done
    assert "21 runs already finished; 0 to run" in capsys.readouterr().out

    assert main(["compare", "--experiment", "shared", "--out", str(cwd / "report")]) in (None, 0)
    report = (cwd / "report" / "report.md").read_text()
    primary, after = report.split("## Against the baseline")[1].split("## At the baseline's lr (secondary)")
    secondary, following = after.split("\n## ", 1)
    assert following.startswith("Steps to") and "\n## " not in primary  # right after the primary comparison
    assert "The verdicts of the primary comparison above (each variant at its own tuned lr) stand" in secondary
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in secondary.splitlines()
            if line.startswith("| norm=")}
    assert set(rows) == {"norm=layernorm", "norm=dyt"}
    base = {s: loss("norm=rmsnorm", "3e-3", s) for s in SEEDS}
    by_hand = {v: np.array([loss(v, "3e-3", s) - base[s] for s in SEEDS]) for v in ("norm=layernorm", "norm=dyt")}
    p = {v: stats.ttest_rel([loss(v, "3e-3", s) for s in SEEDS], list(base.values())).pvalue for v in by_hand}
    holm = {v: min(1.0, p[v] * (2 if p[v] == min(p.values()) else 1)) for v in p}  # Holm over these 2
    holm[max(p, key=p.get)] = max(holm.values())
    for v, differences in by_hand.items():
        row = rows[v]
        assert float(row[4]) == pytest.approx(differences.mean(), abs=1e-4)  # mean difference
        assert float(row[6]) == pytest.approx(p[v], rel=1e-2)  # p (paired t)
        assert float(row[10]) == pytest.approx(holm[v], rel=1e-2)  # p (Holm), over this family only
        correlation = np.corrcoef([loss(v, "3e-3", s) for s in SEEDS], list(base.values()))[0, 1]
        assert float(row[11]) == pytest.approx(correlation, abs=0.01)
        assert float(row[12]) == pytest.approx(differences.std(ddof=1), abs=1e-4)  # paired sd
    assert rows["norm=dyt"][1] == "1e-3" and rows["norm=dyt"][-1].strip(" |") == "worse"
    assert rows["norm=layernorm"][1] == "3e-3 (the baseline's: 3 seed runs reused)"
    # dyt at its own value: the primary row says better, the secondary one worse; the primary verdict stands.
    primary_dyt = next(line for line in primary.splitlines() if line.startswith("| norm=dyt"))
    assert primary_dyt.rstrip(" |").endswith("better")


def test_under_slurm_the_runs_at_the_baseline_value_are_an_array_after_the_seeds(fake_training, capsys):
    cwd = fake_training
    assert main(["sweep", "--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm,dyt", "--seeds", "2",
                 *TUNE, "--shared_value", "--experiment", "cluster", "--launch", "slurm", "--out", "sw"]) in (None, 0)
    out = cwd / "sw"
    assert "#SBATCH --array=0-3" in (out / "shared.sbatch").read_text()  # 2 variants x 2 seeds
    assert " shared " in (out / "shared.sbatch").read_text()
    submit = (out / "submit.sh").read_text().splitlines()
    assert submit[-2].startswith("seeds=$(sbatch --parsable --dependency=afterok:") and "seeds.sbatch" in submit[-2]
    assert submit[-1].startswith('sbatch --dependency=afterok:"${seeds%%;*}"') and "shared.sbatch" in submit[-1]
    manifest = out / "manifest.json"

    def task(phase: str, index: int) -> int:
        return child_module.main([str(manifest), phase, str(index)])

    shared = [c.key for c in child_module.children_of(json.loads(manifest.read_text()), "shared")]
    assert shared == ["norm=layernorm|shared|1337", "norm=layernorm|shared|1338", "norm=dyt|shared|1337",
                      "norm=dyt|shared|1338"]
    for index in range(6):
        assert task("tune", index) == 0
    capsys.readouterr()
    # Started before its seed run (the dependency broken): layernorm has nothing to reuse yet, and says so.
    assert task("shared", 0) == 1
    assert "its seed run at seed 1337 is reused, and it has not finished" in capsys.readouterr().err
    for index in range(6):
        assert task("seed", index) == 0
    for index in range(4):
        assert task("shared", index) == 0
    client, _, children = runs_by_key(cwd, "cluster")
    check_children(client, children, SEEDS[:2])
    capsys.readouterr()
    assert task("shared", 0) == 0 and task("shared", 3) == 0  # a resubmitted array redoes nothing
    assert capsys.readouterr().out.count("already finished") == 2


def test_the_protocol_records_it_in_what_identifies_the_sweep(fake_training):
    def core(*extra):
        a, fit = command.parser().parse_known_args(["--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,dyt",
                                                    *TUNE, *extra])
        proto, _, _ = command.build_protocol(a, fit)
        return {k: proto[k] for k in command.CORE_FIELDS if k in proto}

    plain, shared = core(), core("--shared_value")
    assert "shared_value" not in plain and shared["shared_value"] is True  # absent, not false: old ids stand
    assert command.sweep_id(plain) != command.sweep_id(shared)
    children = build_children(build_variants(["model.arch.norm=rmsnorm,dyt"], []), [5, 6], None, "norm=rmsnorm")
    assert [(c.key, c.seed_index) for c in children if c.phase == P.SHARED_PHASE] == [
        ("norm=dyt|shared|5", 0), ("norm=dyt|shared|6", 1)]


@pytest.mark.parametrize("args, expected", [
    (["--vary", "model.arch.norm=rmsnorm,dyt", "--shared_value"], "--shared_value needs --tune"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", *TUNE, "--shared_value", "--looks", "3,6"],
     "--shared_value with --looks"),
    (["--vary", "model.arch.norm=rmsnorm,dyt", *TUNE, "--shared_value", "--reuse_tuning_run_as_seed"],
     "--shared_value with --reuse_tuning_run_as_seed"),
    ([*TUNE, "--shared_value"], "--shared_value needs a variant besides the baseline"),
])
def test_bad_shared_value_options_are_one_line_and_exit_code_2(workdir, capsys, args, expected):
    assert_refused_in_one_line(workdir, capsys, ["sweep", "--config", BASELINE, *args], expected)


@pytest.mark.slow
def test_a_shared_value_sweep_of_real_runs_is_reported(tmp_path):
    """Real training (tiny runs): each run at the baseline's value trains at it, is tested, and compare reports it."""
    from tests.conftest import cli_in
    from tests.test_sweep import TINY

    cli = cli_in(tmp_path)

    cli("sweep", "--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm", "--seeds", "2", "--tune",
        "model.lr=1e-3,3e-2", "--tune_steps", "2", "--shared_value", "--experiment", "real", "--parallel", "2", *TINY)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("real").experiment_id], max_results=100)
    picked = {r.data.tags[P.VARIANT]: r.data.tags[P.TUNE_VALUE] for r in runs if r.data.tags.get(P.FINAL) == P.TRUE}
    at_shared = [r for r in runs if r.data.tags.get(P.SHARED_VALUE) == P.TRUE]
    assert len(at_shared) == 2 and {r.data.tags[P.VARIANT] for r in at_shared} == {"norm=layernorm"}
    for r in at_shared:  # trained at the baseline's pick (or its seed run, when layernorm picked the same value)
        assert float(r.data.tags[P.TUNE_VALUE]) == float(picked["norm=rmsnorm"])
        assert float(r.data.params["model.init_args.lr"]) == float(picked["norm=rmsnorm"])
        assert r.info.status == "FINISHED" and "test/loss" in r.data.metrics
    report = cli("compare", "--experiment", "real", "--out", str(tmp_path / "report"))
    assert "## At the baseline's lr (secondary)" in report and "| norm=layernorm | " in report.split("(secondary)")[1]
