"""`cli.py sweep --looks`: a sequential sweep look by look, locally (the command loops) and under SLURM (each
invocation decides the finished look and writes the next look's arrays), the looks recorded and never rewritten,
compare's "decided at look k of K"; `--add_seeds` outside a plan warns and is recorded; bad input is one line.

Training is replaced by a child that logs a known test loss per (variant, seed) in this process, so a whole
sequential sweep takes seconds: what is under test is the looks' bookkeeping, not training (tests/test_sweep.py
trains real runs; the slow test at the end runs a sequential sweep with real ones)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from mlflow import MlflowClient
from scipy import stats

from lit.commands import main
from lit.compare.sequential_report import header_notes
from lit.sweep import child as child_module
from lit.sweep import local
from lit.sweep import protocol as P
from lit.sweep.history import read_extensions, read_looks
from tests.conftest import REPO, assert_refused_in_one_line, fake_sweep_inputs

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
VARY = ["--vary", "model.arch.norm=rmsnorm,layernorm,dyt,perinorm"]  # rmsnorm the baseline
# layernorm is clearly worse, dyt is the baseline's twin, perinorm a little worse (2 run-noise sds of its own).
EFFECTS = {"norm=layernorm": 0.5, "norm=dyt": 0.0, "norm=perinorm": 0.02}
SEQUENTIAL = ["--looks", "3,6,9", "--effect_of_interest", "0.01"]


def noise(*key) -> float:
    """A standard normal draw fixed by ``key``: the same (variant, seed) always gives the same loss."""
    h = int(hashlib.sha256(repr(key).encode()).hexdigest()[:12], 16) / 16 ** 12
    return float(stats.norm.ppf(h))


def fake_run_child(manifest: dict, child) -> int:
    """A seed run that logs its loss instead of training: a seed effect every variant shares (the pairing), the
    variant's effect, and its own noise of std 0.01."""
    client = MlflowClient(manifest["tracking_uri"])
    experiment = client.get_experiment_by_name(manifest["experiment"]).experiment_id
    run = client.create_run(experiment, run_name=child.key, tags=child_module.child_tags(manifest, child, None))
    value = 3.0 + 0.05 * noise(child.seed) + EFFECTS.get(child.variant, 0.0) + 0.01 * noise(child.variant, child.seed)
    for key in ("val/loss", "test/loss"):
        client.log_metric(run.info.run_id, key, value, step=1)
    client.set_tag(run.info.run_id, P.OUTCOME, P.FINISHED_OUTCOME)
    client.set_terminated(run.info.run_id, "FINISHED")
    return 0


def run_in_process(children, run, parallel, log_dir, gate, report, results, tick=None):
    """``local.run_children`` without forks: each child in turn, in this process."""
    outcomes = []
    for c in children:
        results[c.key] = code = run(c)
        report(f"done {c.key}")
        outcomes.append(local.Outcome(c, code, 0.0, None))
    return outcomes


@pytest.fixture
def fake_training(workdir_with_store, monkeypatch):
    monkeypatch.setattr(child_module, "run_child", fake_run_child)
    monkeypatch.setattr(local, "run_children", run_in_process)
    fake_sweep_inputs(monkeypatch)
    return workdir_with_store


def sweep(*args: str) -> None:
    assert main(["sweep", "--config", BASELINE, *VARY, "--experiment", "seq", *args]) in (None, 0)


def parent_and_runs(cwd: Path):
    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("seq").experiment_id], max_results=1000)
    (parent,) = [r for r in runs if r.data.tags.get(P.ROLE) == P.PARENT]
    seeds = {}
    for r in runs:
        if r.data.tags.get(P.FINAL) == P.TRUE:
            seeds.setdefault(r.data.tags[P.VARIANT], set()).add(int(r.data.tags[P.SEED]))
    return client, parent, seeds


def report_of(cwd: Path, capsys) -> str:
    capsys.readouterr()
    assert main(["compare", "--experiment", "seq", "--out", str(cwd / "report")]) in (None, 0)
    return (cwd / "report" / "report.md").read_text()


def test_a_local_sequential_sweep_spends_seeds_only_on_open_comparisons(fake_training, capsys):
    cwd = fake_training
    sweep(*SEQUENTIAL)
    out = capsys.readouterr().out
    assert "look 1 of 3: 3 paired seeds for every variant" in out
    assert "look 1 of 3 (3 seeds): open: norm=layernorm, norm=dyt, norm=perinorm -> look 2 runs 6 seeds" in out
    assert ("look 2 of 3 (6 seeds): norm=layernorm decided (higher than the baseline; p 2.96e-09 against boundary "
            "0.00") in out
    # The conditional power is taken at max(E, |estimate|), and the line says which (statistics-review-4 F2).
    assert re.search(r"norm=dyt stopped for futility \(conditional power 0\.00 < 0\.1 at ±[\d.e-]+ = max\(E 0\.01, "
                     r"\|estimate\| [\d.e-]+\)\); open: norm=perinorm", out), out
    assert "look 3 of 3 (9 seeds): norm=perinorm decided (higher than the baseline" in out
    assert "the sequential plan is settled, nothing left to run" in out
    client, parent, seeds = parent_and_runs(cwd)
    # The clear loser and the twin stopped at look 2, the close one ran on; the baseline ran what it needed.
    assert seeds == {"norm=rmsnorm": set(range(1337, 1346)), "norm=layernorm": set(range(1337, 1343)),
                     "norm=dyt": set(range(1337, 1343)), "norm=perinorm": set(range(1337, 1346))}
    looks = read_looks(client, parent.info.run_id)
    assert [k["look"] for k in looks] == [1, 2, 3]
    assert [k["open"] for k in looks] == [["norm=layernorm", "norm=dyt", "norm=perinorm"], ["norm=perinorm"], []]
    states = {c["label"]: (c["state"], c["look"], c["share"]) for c in looks[-1]["comparisons"]}
    # perinorm's boundary at look 3 is at alpha / 2: layernorm's share passed on; dyt, futile, keeps its place.
    assert states == {"norm=layernorm": ("rejected", 2, 0.05 / 3), "norm=dyt": ("futile", 2, 0.05 / 2),
                      "norm=perinorm": ("rejected", 3, 0.05 / 2)}
    proto = json.loads(Path(client.download_artifacts(parent.info.run_id, P.PROTOCOL_FILE, str(cwd))).read_text())
    assert proto["sequential"]["looks"] == [3, 6, 9] and proto["sequential"]["spending"] == "obrien_fleming"
    assert proto["sequential"]["effect_of_interest"] == 0.01 and proto["seeds"] == list(range(1337, 1346))

    report = report_of(cwd, capsys)
    against = report.split("## Against the baseline")[1].split("\n## ")[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in against.splitlines() if line.startswith("| norm=")}
    assert rows["norm=layernorm"].endswith("| worse (decided at look 2 of 3) |")
    assert rows["norm=dyt"].endswith("| not distinguishable (stopped for futility at look 2 of 3) |")
    assert rows["norm=perinorm"].endswith("| worse (decided at look 3 of 3) |")
    assert "## Sequential looks" in report and "3 of 3 looks recorded" in report
    assert "at look 3, share α/2" in report  # the boundary that decided it
    # The fixed-sample columns say so, and the method text does not claim they decide (statistics-review-3, D5).
    assert "| CI (fixed-sample, not the decision) |" in against and "| p (Holm, fixed-sample) |" in against
    assert "a verdict needs it below" not in report and "excludes 0 exactly when the verdict" not in report
    course = report.split("## Sequential looks")[1]
    def cells(line: str) -> list[str]:  # Markdown cells; "\\|" is a pipe inside a cell
        return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]

    header = next(line for line in course.splitlines() if line.startswith("| variant | decision"))
    column = cells(header).index("repeated CI at that boundary")
    against_header = next(line for line in against.splitlines() if line.startswith("| variant |"))
    mean_column = cells(against_header).index("mean difference")
    recorded = {c["label"]: c for c in looks[-1]["comparisons"]}
    for label, decided in (("norm=layernorm", True), ("norm=dyt", False), ("norm=perinorm", True)):
        line = next(line for line in course.splitlines() if line.startswith(f"| {label} |"))
        printed = cells(line)[column]
        low, high = (float(x) for x in printed.strip("[]").split(","))
        assert (low > 0 or high < 0) == decided, (label, low, high)
        # The printed interval is the recorded look's: its mean ± |t| needed × SE, to the report's decimals
        # (statistics-review-4 P5b), not merely some interval on the right side of 0.
        c = recorded[label]
        d = len(cells(rows[label])[mean_column].split(".")[1])
        half = c["critical_t"] * c["standard_error"]
        assert printed == f"[{c['mean'] - half:+.{d}f}, {c['mean'] + half:+.{d}f}]", (label, printed, c)
    # A sequential report says the looks decide, and marks the fixed-design numbers (statistics-review-4 F4).
    protocol_section = report.split("## Protocol")[1].split("\n## ")[0]
    assert "Holm over its" not in protocol_section or "group-sequential" in protocol_section
    assert "the group-sequential Holm over its looks decides the verdicts" in protocol_section
    mde_paragraph = next(p for p in against.split("\n\n") if p.startswith("**Minimum detectable effect"))
    assert "fixed-sample" in mde_paragraph, mde_paragraph
    assert "MDE (fixed-sample): the smallest mean paired difference a fixed design" in against
    assert "| q (BH, fixed-sample) |" in against
    assert "(docs/sequential.md)" in course and "comparing-statistics.md" not in course
    assert "max(0.01, |its current estimate|)" in protocol_section  # the rule that ran, in the protocol bullet

    # Rerunning the command changes nothing, and the looks are not written again.
    sweep(*SEQUENTIAL)
    assert "the sequential plan is settled" in capsys.readouterr().out
    assert read_looks(client, parent.info.run_id) == looks
    assert parent_and_runs(cwd)[2] == seeds


def test_under_slurm_each_invocation_decides_the_finished_look_and_writes_the_next(fake_training, capsys):
    cwd = fake_training
    args = ["--vary", "model.arch.norm=rmsnorm,layernorm,dyt", "--looks", "3,6", "--effect_of_interest", "0.004",
            "--launch", "slurm", "--out", "sw"]

    def invocation() -> str:
        capsys.readouterr()
        assert main(["sweep", "--config", BASELINE, "--experiment", "seq", *args]) in (None, 0)
        return capsys.readouterr().out

    def run_tasks(look: int) -> int:
        manifest = cwd / "sw" / f"look_{look}" / "manifest.json"
        script = (manifest.parent / "seeds.sbatch").read_text()
        count = int(script.split("#SBATCH --array=0-")[1].split()[0]) + 1
        for index in range(count):  # what the scheduler would run: each array task in turn
            assert child_module.main([str(manifest), "seed", str(index)]) == 0
        return count

    assert "once they have run, rerun this command to decide look 1" in invocation()
    assert parent_and_runs(cwd)[2] == {}  # nothing ran: the scheduler runs it
    assert run_tasks(1) == 9  # 3 variants x 3 seeds
    out = invocation()
    assert "look 1 of 2 (3 seeds): norm=layernorm decided" in out and "decide look 2" in out
    assert run_tasks(2) == 12  # the open comparison and the baseline, seeds 1..6 (the first 3 are done)
    out = invocation()
    assert "look 2 of 2 (6 seeds): norm=dyt not distinguishable at the last look" in out
    assert "the sequential plan is settled" in out and not (cwd / "sw" / "look_3").exists()
    client, parent, seeds = parent_and_runs(cwd)
    assert {v: len(s) for v, s in seeds.items()} == {"norm=rmsnorm": 6, "norm=layernorm": 3, "norm=dyt": 6}
    assert [k["look"] for k in read_looks(client, parent.info.run_id)] == [1, 2]


def test_add_seeds_outside_a_plan_warns_of_an_interim_look_and_records_it(fake_training, capsys):
    cwd = fake_training
    sweep("--seeds", "2")
    assert "warning" not in capsys.readouterr().err
    parent_before = parent_and_runs(cwd)[1].info.run_id
    sweep("--seeds", "2", "--add_seeds", "1")
    out = capsys.readouterr()
    warnings = [line for line in out.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "extended from 2 to 3 seeds" in warnings[0] and "interim look" in warnings[0]
    # Only the new seed runs, in the same sweep: its one parent run, not a second.
    assert "(extended from 2 seeds)" in out.out and "8 runs already finished; 4 to run" in out.out
    client, parent, seeds = parent_and_runs(cwd)
    assert parent.info.run_id == parent_before and seeds == {v: {1337, 1338, 1339} for v in seeds} and len(seeds) == 4
    assert [(e["from_seeds"], e["to_seeds"]) for e in read_extensions(client, parent.info.run_id)] == [(2, 3)]
    sweep("--seeds", "2", "--add_seeds", "1")  # finishing the same extension again: no second record
    assert "warning:" not in capsys.readouterr().err
    assert len(read_extensions(client, parent.info.run_id)) == 1
    proto = json.loads(Path(client.download_artifacts(parent.info.run_id, P.PROTOCOL_FILE, str(cwd))).read_text())
    assert proto["seeds"] == [1337, 1338, 1339] and "sequential" not in proto
    (note,) = header_notes(proto, [], read_extensions(client, parent.info.run_id))  # compare's protocol bullet
    assert note.startswith("**Extended from 2 seeds (an interim look)** to 3 by `--add_seeds`")
    # The original command no longer describes the sweep: one line saying how to name it.
    with pytest.raises(SystemExit) as refused:
        sweep("--seeds", "2")
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert refused.value.code == 2 and len(errors) == 1 and "has 3 seeds" in errors[0] and "--add_seeds 1" in errors[0]


def test_a_variant_is_diverged_at_every_value_only_once_every_value_is_done(workdir_with_store):
    from lit.sweep.looks import counted_runs

    client = MlflowClient(f"sqlite:///{workdir_with_store / 'mlflow.db'}")
    experiment = client.create_experiment("hopeless")

    def tuning_run(value: str) -> None:
        run = client.create_run(experiment, tags={P.ROLE: P.CHILD, P.SWEEP_ID: "s", P.VARIANT: "v",
                                                  P.PHASE: P.TUNE_PHASE, P.CHILD_KEY: f"v|tune|lr={value}",
                                                  P.OUTCOME: P.DIVERGED_OUTCOME})
        client.set_terminated(run.info.run_id, "FAILED")

    tuning_run("1")
    tuning_run("2")
    # Two of three values diverged: the third may still train, so the look must wait for v's seeds.
    assert counted_runs(client, experiment, "s", 3) == ({}, set())
    tuning_run("3")
    assert counted_runs(client, experiment, "s", 3) == ({}, {"v"})


@pytest.mark.parametrize("args, expected", [
    (["--looks", "3,6,6"], "--looks 3,6,6 is not increasing (6 then 6)"),
    (["--looks", "6,3"], "is not increasing"),
    (["--looks", "1,3"], "a look needs at least 2 paired seeds"),
    (["--looks", "6"], "declares one look"),
    (["--looks", "3,six"], "is not a list of seed counts"),
    (["--looks", "3,6", "--add_seeds", "2"], "--looks with --add_seeds"),
    (["--looks", "3,6", "--seeds", "9"], "the last look (6) is the maximum"),
    (["--looks", "3,6", "--family", "f"], "--looks with --family"),
    (["--looks", "3,6", "--equivalence_margin", "0.1"], "--looks with --equivalence_margin"),
    (["--looks", "3,6", "--effect_of_interest", "-0.1"], "--effect_of_interest must be a positive"),
    (["--effect_of_interest", "0.1"], "--effect_of_interest is read only with --looks"),
    (["--spending", "pocock"], "--spending is read only with --looks"),
])
def test_bad_looks_are_one_line_and_exit_code_2(workdir, capsys, args, expected):
    assert_refused_in_one_line(workdir, capsys, ["sweep", "--config", BASELINE, *VARY, *args], expected)


@pytest.mark.slow
def test_a_sequential_sweep_of_real_runs_records_its_looks(tmp_path):
    """Real training (tiny runs): the looks are performed on what the runs logged, and compare reports them."""
    from tests.conftest import cli_in
    from tests.test_sweep import TINY

    cli = cli_in(tmp_path)

    out = cli("sweep", "--config", BASELINE, "--vary", "model.arch.norm=rmsnorm,layernorm", "--looks", "2,3",
              "--experiment", "real", "--parallel", "2", *TINY)
    assert "look 1 of 2 (2 seeds)" in out
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (parent,) = [r for r in client.search_runs([client.get_experiment_by_name("real").experiment_id])
                 if r.data.tags.get(P.ROLE) == P.PARENT]
    looks = read_looks(client, parent.info.run_id)
    assert looks[0]["seeds"] == 2 and looks[0]["comparisons"][0]["label"] == "norm=layernorm"
    report = cli("compare", "--experiment", "real", "--out", str(tmp_path / "report"))
    assert "## Sequential looks" in report and " of 2" in report
