"""The GPU check (benchmarks/gpu_check): its dry run end to end, its budget, its failure handling, its sync counter,
and the docs page it writes.

The dry run is the command a GPU user runs, with ``--dry``, in a fresh process: the Triton kernels run in Triton's
interpreter there, which must be on before triton is first imported (tests/kernels_interpreted.py says why).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import torch

from arch_plugins import registry
from benchmarks.gpu_check import report, run
from benchmarks.gpu_check.budget import SKIPPED, Budget, Watchdog
from benchmarks.gpu_check.real_path import SyncCounter
from tests.conftest import REPO, subprocess_env

STAGES = "ABCDE"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    page_before = run.DOCS_PAGE.read_text()
    results_before = sorted(run.RESULTS.glob("gpu_check_*"))
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--dry", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert run.DOCS_PAGE.read_text() == page_before, "a dry run must not touch docs/performance/gpu.md"
    assert sorted(run.RESULTS.glob("gpu_check_*")) == results_before, "a dry run writes only into --out"
    return out, json.loads((out / "gpu_check_cpu.json").read_text())


def test_dry_run_runs_every_stage_and_writes_its_report(dry_run):
    out, result = dry_run
    assert result["dry"] and result["device"] == "cpu"
    assert {k: s["status"] for k, s in result["stages"].items()} == dict.fromkeys(STAGES, "ran")
    assert (out / "gpu_check_cpu.md").read_text() == report.results(result)
    page = (out / "gpu.md").read_text()
    assert page == report.page(result) and "Dry run" in page and "### E. Triton kernels" in page


def test_dry_calibration_measures_beside_the_spec(dry_run):
    a = dry_run[1]["stages"]["A"]["out"]
    assert a["measured"]["bf16_flops"] > 0 and a["measured"]["bandwidth_bytes_per_s"] > 0
    assert a["spec"] == {"bf16_flops": None, "tf32_flops": None, "bandwidth_bytes_per_s": None}  # a CPU: no sheet


def test_dry_real_path_counts_syncs_launches_and_stamps(dry_run):
    b = dry_run[1]["stages"]["B"]["out"]
    for precision in ("32-true", "bf16-mixed"):
        fit = b["fits"][precision]
        assert fit["status"] == "ran" and fit["exit_code"] in (0, None), fit
        assert len(fit["syncs"]["per_step"]) == 4 and fit["syncs"]["steps"] == [2, 5]
        assert fit["startup_s"] > 0 and fit["median_step_s"] > 0 and fit["teardown_s"] >= 0
        assert fit["profile"]["aten_ops_per_step"] > 50  # a launch proxy on a CPU
    raw = b["raw_loop"]["contenders"]
    assert raw["eager fp32"]["tokens_per_s"] > 0 and raw["eager bf16"]["tokens_per_s"] > 0
    assert raw["cuda graph"]["status"] == "skipped: needs CUDA"


def test_dry_ladder_has_every_rung_and_contender_path(dry_run):
    rungs = dry_run[1]["stages"]["C"]["out"]["rungs"]
    assert list(rungs) == ["124M", "350M", "1.3B"]
    for rung in rungs.values():
        assert rung["status"] == "ran" and rung["flops_per_token"] > 0
        if any(name.startswith("plain") for name in rung["contenders"]):  # same weights at step 0
            assert rung["same_init_check"] == "pass", rung
        for name, row in rung["contenders"].items():
            if row["status"].startswith("not needed"):  # e.g. torch.compile whole where --model.compile is that
                continue
            assert row["status"] == "ran", (name, row)
            assert row["tokens_per_s"] > 0 and row["mfu_measured_gemm"] > 0 and row["mfu_spec"] is None
    small = rungs["124M"]["contenders"]
    assert small["plain compiled"]["graphs"] == 1 and small["plain compiled"]["graph_breaks"] == 0
    assert small["plain compiled"]["over_ceiling"] == 1.0
    assert small["ours --model.compile"]["status"] == "ran" and small["ours --model.compile"]["graphs"] >= 1
    assert {"ours FSDP2", "ours FSDP2 + activation checkpointing"} <= set(rungs["1.3B"]["contenders"])


def test_dry_plugins_give_every_registered_name_both_rows(dry_run):
    from benchmarks.gpu_check.plugins import COLUMNS

    d = dry_run[1]["stages"]["D"]["out"]
    expected = {f"{kind}={name}" for kind in registry.kinds() for name in registry.names(kind)}
    expected -= {"norm=rmsnorm", "residual=add", "projection=linear", "parametrization=sp", "optimizer=adamw"}
    assert expected <= set(d["eager"]) and expected <= set(d["compiled"])
    assert {mode: b["status"] for mode, b in d["baseline"].items()} == {"eager": "ran", "compiled": "ran"}
    for mode, least in (("eager", len(registry.kinds())), ("compiled", 2)):
        measured = {label: row for label, row in d[mode].items() if row.get("status") == "ran"}
        assert len(measured) >= least, (mode, sorted(measured))
        for label, row in measured.items():
            assert set(COLUMNS) <= set(row), (mode, label, sorted(set(COLUMNS) - set(row)))
            assert row["step_ratio"] > 0 and row["flops_ratio"] > 0 and row["host_issue_s"] > 0
            assert row["target"] == (1.5 if mode == "eager" else 1.15) and row["verdict"]
    # Muon's AdamW half steps like the baseline's AdamW (fused on a GPU, foreach on this CPU).
    assert d["eager"]["optimizer=muon"]["adamw_fused"] == d["baseline"]["eager"]["adamw_fused"]
    assert d["plan"]["steps"] >= 1 and "cut:" in d["plan"]["text"]
    assert set(d["optimizer_step_alone"]) == set(registry.names("optimizer"))


def test_dry_kernels_give_bandwidth_and_speedup_per_op(dry_run):
    e = dry_run[1]["stages"]["E"]["out"]
    assert [row["op"] for row in e["ops"]] == ["row_l2_normalize", "qk_normalize", "ngpt_stream_update",
                                               "pattention_theta"]
    for row in e["ops"]:
        assert {"eager", "compile", "kernel"} <= set(row) and row["speedup_vs_best_torch"] > 0
        assert row["kernel_forward_fraction_of_copy"] > 0
    assert e["measured_speedups_entry"] is None  # dry: nothing to paste


def test_budget_gives_each_stage_its_share_of_what_is_left():
    now = [0.0]
    budget = Budget(100, {"A": 10, "B": 30, "C": 60}, clock=lambda: now[0])
    a = budget.open("A")
    assert a.allotted_s == pytest.approx(10) and a.fits(10) and not a.fits(10.1)
    now[0] = 4.0  # A used 4 of its 10 s: the 6 left flow on to B and C
    b = budget.open("B")
    assert b.allotted_s == pytest.approx(96 * 30 / 90)
    now[0] = 120.0  # B overran the whole budget
    assert budget.open("C").allotted_s == 0 and budget.left() < 0


def _fake_stages(monkeypatch, now, *, a_takes: float = 0.0, b_raises: bool = False, a_sleeps: float = 0.0):
    calls = []
    monkeypatch.setattr(run, "commit", lambda: "test")  # git status costs seconds on a busy machine

    def stage(letter):
        def go(ctx, clock, out):
            calls.append(letter)
            if letter == "A":
                now[0] += a_takes
                time.sleep(a_sleeps)
            if letter == "B" and b_raises:
                raise RuntimeError("stage B broke")
            out["ran"] = True
        return go

    monkeypatch.setattr(run, "stage_functions", lambda: {s: stage(s) for s in STAGES})
    return calls


def test_a_stage_that_overruns_leaves_the_rest_skipped_for_budget(monkeypatch, tmp_path):
    now = [0.0]
    calls = _fake_stages(monkeypatch, now, a_takes=500.0)
    assert run.main(["--dry", "--out", str(tmp_path)], clock=lambda: now[0]) == 0
    result = json.loads((tmp_path / "gpu_check_cpu.json").read_text())
    assert calls == ["A"]
    assert result["stages"]["A"]["status"] == "ran" and result["stages"]["A"]["overran_s"] > 0
    assert [result["stages"][s]["status"] for s in run.RUN_ORDER[1:]] == [SKIPPED] * 4
    assert "skipped: budget" in (tmp_path / "gpu.md").read_text()


def test_a_failing_stage_is_recorded_and_the_others_still_run(monkeypatch, tmp_path):
    now = [0.0]
    calls = _fake_stages(monkeypatch, now, b_raises=True)
    assert run.main(["--dry", "--out", str(tmp_path)], clock=lambda: now[0]) == 1
    result = json.loads((tmp_path / "gpu_check_cpu.json").read_text())
    assert calls == list(run.RUN_ORDER)
    assert result["stages"]["B"]["status"] == "failed" and "stage B broke" in result["stages"]["B"]["error"]
    assert all(result["stages"][s]["status"] == "ran" for s in "ACDE")


def test_the_plugins_run_right_after_the_peaks_and_the_cuda_graph_stage_last():
    # D is what a lent GPU's run must answer; B's CUDA-graph contender lost the CUDA context on the first H200 check.
    assert run.RUN_ORDER[:2] == "AD" and run.RUN_ORDER[-1] == "B" and sorted(run.RUN_ORDER) == list(STAGES)
    assert max(run.NOMINAL_S, key=run.NOMINAL_S.get) == "D"


def test_each_finished_stage_is_on_disk_before_the_next_starts(monkeypatch, tmp_path):
    """A run cut short from outside (the device's lease ending) still leaves every stage it finished."""
    seen = {}
    monkeypatch.setattr(run, "commit", lambda: "test")

    def stage(letter):
        def go(ctx, clock, out):
            path = tmp_path / "gpu_check_cpu.json"
            seen[letter] = json.loads(path.read_text())["stages"] if path.exists() else {}
            out["ran"] = True
        return go

    monkeypatch.setattr(run, "stage_functions", lambda: {s: stage(s) for s in STAGES})
    assert run.main(["--dry", "--out", str(tmp_path)]) == 0
    assert seen["A"] == {}
    assert seen["B"]["C"]["status"] == "ran" and seen["B"]["C"]["out"] == {"ran": True}
    assert [s for s, e in seen["B"].items() if e["status"] == "ran"] == list(run.RUN_ORDER[:-1])


def test_a_lost_cuda_context_ends_the_stages_and_keeps_what_was_measured(monkeypatch, tmp_path):
    # An illegal memory access is sticky: the next CUDA call (here the cleanup after stage B) raises, and so would
    # every later one. The later stages are recorded as not run, stage B keeps its figures, the JSON is written.
    now = [0.0]
    calls = _fake_stages(monkeypatch, now)
    stage_of_call = iter(run.RUN_ORDER)
    lost, after = run.RUN_ORDER[1], run.RUN_ORDER[2:]

    def free_memory(device):
        if next(stage_of_call) == lost:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(run.measure, "free_memory", free_memory)
    assert run.main(["--dry", "--out", str(tmp_path)], clock=lambda: now[0]) == 1
    result = json.loads((tmp_path / "gpu_check_cpu.json").read_text())
    assert calls == list(run.RUN_ORDER[:2])
    assert result["stages"][lost]["status"] == "failed"
    assert "illegal memory access" in result["stages"][lost]["error"]
    assert result["stages"][lost]["out"]  # what it measured before the cleanup raised
    assert [result["stages"][s]["status"] for s in after] == [f"not run: the CUDA context was lost in stage {lost}"
                                                             ] * len(after)


def test_a_run_of_some_stages_writes_files_of_its_own(monkeypatch, tmp_path):
    calls = _fake_stages(monkeypatch, [0.0])
    assert run.main(["--dry", "--stages", "ca", "--out", str(tmp_path)]) == 0
    assert calls == ["A", "C"]
    result = json.loads((tmp_path / "gpu_check_cpu_stages_AC.json").read_text())
    assert list(result["stages"]) == ["A", "C"] and not (tmp_path / "gpu_check_cpu.json").exists()


def test_the_watchdog_fires_at_its_deadline():
    fired = threading.Event()
    Watchdog(time.monotonic() + 0.05, fired.set).start()
    assert fired.wait(5)


def test_a_stage_stuck_past_the_deadline_is_cut_off_with_what_was_measured(monkeypatch, tmp_path):
    """The watchdog writes the report, the running stage marked ``killed: budget``, and ends the process."""
    _fake_stages(monkeypatch, [0.0], a_sleeps=1.5)
    monkeypatch.setattr(run, "GRACE_S", 0.0)
    monkeypatch.setattr(run, "RESERVE_S", 0.0)
    ended = {}

    def exit_instead(code):  # the real one ends the process; here: what it would leave behind
        ended["code"] = code
        ended["report"] = json.loads((tmp_path / "gpu_check_cpu.json").read_text())

    monkeypatch.setattr(run.os, "_exit", exit_instead)
    run.main(["--dry", "--budget_s", "0.5", "--out", str(tmp_path)])
    assert ended["code"] == 3
    assert ended["report"]["stages"]["A"]["status"] == "killed: budget"
    assert "B" not in ended["report"]["stages"]  # never started


@pytest.mark.parametrize("argv, expected", [
    (["--dry", "--budget_s", "-1"], "--budget_s is seconds"),
    (["--dry", "--stages", "AX"], "--stages takes letters among ABCDE"),
    pytest.param([], "there is no CUDA GPU here", marks=pytest.mark.skipif(torch.cuda.is_available(),
                                                                          reason="a GPU is here")),
])
def test_bad_input_is_one_line(argv, expected, capsys):
    assert run.main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], errors


def test_the_sync_counter_catches_host_reads_and_not_optimizer_counters():
    state = {"step": 7}
    x = torch.randn(8)
    with SyncCounter(state) as counter:
        x.sum().item()
        x.tolist()
        x[x > 0]  # boolean indexing: the result's size is data-dependent
        torch.nonzero(x)
        p = torch.nn.Parameter(torch.randn(3))
        p.sum().backward()
        torch.optim.AdamW([p]).step()  # its step counter lives on the host on a GPU too
    kinds = [kind for _, kind, _ in counter.events]
    assert kinds == ["_local_scalar_dense", "Tensor.tolist", "index", "nonzero"], kinds
    assert all(step == 7 and "test_gpu_check.py" in site for step, _, site in counter.events)
    with SyncCounter(state, device_only=True) as on_gpu:  # a CUDA run: reading a CPU tensor waits for nothing
        x.sum().item()
    assert on_gpu.events == []


def test_the_docs_page_is_the_renderers_output():
    """docs/performance/gpu.md is written by report.page from a GPU run's JSON, or says that none ran: never edited
    by hand, so no figure on it was typed in."""
    jsons = [p for p in sorted(run.RESULTS.glob("gpu_check_*.json")) if "_stages_" not in p.name]  # full runs
    committed = run.DOCS_PAGE.read_text()
    if not jsons:
        assert committed == report.page(None)
        assert "No GPU has been available" in committed and "python -m benchmarks.gpu_check" in committed
    else:
        assert any(committed == report.page(json.loads(p.read_text())) for p in jsons)
