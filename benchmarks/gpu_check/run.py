"""The command: stages A-E under one budget, each failure recorded, the JSON and Markdown written at the end.

See ``benchmarks/gpu_check/__init__.py`` for what the check is, and ``report.STAGES`` for what each stage measures.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.gpu_check import measure, report
from benchmarks.gpu_check.budget import SKIPPED, Budget, Watchdog
from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
DOCS_PAGE = REPO / "docs" / "performance" / "gpu.md"

# Seconds per stage; the budget is shared in these proportions. The first check (an H200, docs/performance/gpu.md)
# used A 0.4 s, B 33 s, C 200 s, E 15 s and D 64 s for eager rows alone; D now pairs every plugin eager and compiled
# (issue 43, item 6) and is what a run must answer, so it gets most of the time, and B and C (measured) little.
NOMINAL_S = {"A": 10.0, "B": 25.0, "C": 25.0, "D": 360.0, "E": 40.0}
# The order stages run in: D right after the peaks, and B last, since its CUDA-graph contender lost the CUDA
# context on the first H200 check (an illegal access is sticky: nothing after it can run in the process).
RUN_ORDER = "ADECB"
# Below this allotment a stage cannot measure anything worth reporting, so it is skipped whole.
MINIMUM_S = {"A": 3.0, "B": 15.0, "C": 20.0, "D": 10.0, "E": 5.0}
RESERVE_S = 5.0  # kept back from the stages for writing the report
GRACE_S = 12.0  # the watchdog ends the process this long after the deadline (460 + 12 s < 8 minutes)
DEFAULT_BUDGET_S = 460.0


@dataclass
class Context:
    device: torch.device
    device_name: str
    dry: bool
    b_steps: int
    peaks: dict = field(default_factory=dict)
    compile_s_per_layer: float | None = None
    created_process_group: bool = False
    save: Callable[[], object] = lambda: None  # writes what was measured so far (a stage calls it as it goes)


def stage_functions():
    from benchmarks.gpu_check import calibration, ladder, plugins, real_path, triton_kernels

    return {"A": calibration.run, "B": real_path.run, "C": ladder.run, "D": plugins.run, "E": triton_kernels.run}


def parse_args(argv: list[str] | None):
    p = OneLineArgumentParser(prog="-m benchmarks.gpu_check", description=(
        "The GPU check: the device's peaks (A), the real fit path's syncs and overhead (B), a throughput ladder "
        "against a plain model (C), every plugin's step ratio (D), the Triton kernels (E); at most 8 minutes on one "
        "H100. What each stage measures: docs/performance/gpu.md."))
    p.add_argument("--budget_s", type=float, default=DEFAULT_BUDGET_S,
                   help="seconds for the whole check, imports included; stages share it (default 460: 8 minutes "
                        "with the watchdog's grace on one H100)")
    p.add_argument("--dry", action="store_true",
                   help="every stage on the CPU at tiny shapes with aot_eager; writes nothing into the repository")
    p.add_argument("--stages", default="ABCDE", help="which stages to run, e.g. AC (default: all)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for gpu_check_<device>.json/.md (default: benchmarks/results; --dry: a temporary "
                        "folder)")
    args = p.parse_args(argv)
    if not args.budget_s >= 0:
        raise UserInputError(f"--budget_s is seconds, at least 0, got {args.budget_s}")
    unknown = sorted(set(args.stages.upper()) - set(NOMINAL_S))
    if unknown or not args.stages:
        raise UserInputError(f"--stages takes letters among {''.join(NOMINAL_S)}, got {args.stages!r}")
    return args


def commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() + ("+dirty" if dirty else "")) if out.returncode == 0 else None


def file_stem(device_name: str) -> str:
    return "gpu_check_" + re.sub(r"[^A-Za-z0-9._-]+", "_", device_name).strip("_")


class Writer:
    """Writes the JSON, its Markdown and the docs page (``None``: none); safe to call from the watchdog while a stage
    runs. ``suffix`` keeps a partial run's files apart from the full run's."""

    def __init__(self, result: dict, out_dir: Path, docs_page: Path | None, suffix: str = ""):
        self.result, self.out_dir, self.docs_page, self.suffix = result, out_dir, docs_page, suffix
        self.lock = threading.Lock()

    def write(self) -> list[Path]:
        with self.lock:
            for _ in range(5):  # the main thread may be adding to a dict as the watchdog serialises it
                try:
                    text = json.dumps(self.result, indent=1, default=str)
                    break
                except RuntimeError:
                    time.sleep(0.05)
            else:
                text = json.dumps({k: v for k, v in self.result.items() if k != "stages"}, indent=1, default=str)
            snapshot = json.loads(text)
            self.out_dir.mkdir(parents=True, exist_ok=True)
            stem = file_stem(snapshot["device"]) + self.suffix
            paths = [self.out_dir / f"{stem}.json", self.out_dir / f"{stem}.md"]
            paths[0].write_text(text + "\n")
            paths[1].write_text(report.results(snapshot))
            if self.docs_page is not None:
                self.docs_page.parent.mkdir(parents=True, exist_ok=True)
                self.docs_page.write_text(report.page(snapshot))
                paths.append(self.docs_page)
            return paths


@contextlib.contextmanager
def float32_matmuls_may_use_tf32(on: bool):
    """TF32 for fp32 contenders (a guard of the review), restored afterwards so stage B's fit runs as a user's."""
    before = torch.get_float32_matmul_precision()
    if on:
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@one_line_errors
def main(argv: list[str] | None = None, start: float | None = None,
         clock: Callable[[], float] = time.monotonic) -> int:
    """Run the check; returns 0 when every stage ran (or was skipped for budget), 1 when one failed.

    ``start`` is when the budget began (``__main__`` passes the moment before its imports); ``clock`` is what
    the budget reads (a test passes a fake one).
    """
    args = parse_args(argv)
    started = clock() if start is None else start
    cuda = torch.cuda.is_available() and not args.dry
    if not cuda and not args.dry:
        raise UserInputError("there is no CUDA GPU here: run the check on a GPU, or with --dry to check that every "
                             "stage runs (CPU, tiny shapes)")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    ctx = Context(device=device, device_name=name, dry=args.dry, b_steps=12 if args.dry else 120)
    out_dir = args.out or (Path(tempfile.mkdtemp(prefix="gpu_check_dry_")) if args.dry else RESULTS)
    letters = [s for s in RUN_ORDER if s in args.stages.upper()]
    partial = len(letters) < len(NOMINAL_S)
    # A dry run never overwrites the docs page with CPU numbers: its page goes beside its JSON. A run of some
    # stages only writes its own files (..._stages_AC.json) and leaves the page to the full check.
    docs_page = out_dir / "gpu.md" if args.dry else (None if partial else DOCS_PAGE)
    result: dict = {"device": name, "dry": args.dry, "command": " ".join(["python -m benchmarks.gpu_check",
                                                                         *(argv if argv is not None else
                                                                           sys.argv[1:])]),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit(),
                    "budget_s": args.budget_s, "stages": {}}
    writer = Writer(result, out_dir, docs_page, f"_stages_{''.join(sorted(letters))}" if partial else "")
    ctx.save = writer.write
    budget = Budget(args.budget_s, {s: NOMINAL_S[s] for s in letters}, clock=clock, start=started,
                    reserve_s=RESERVE_S)
    running: dict = {}

    def expire():
        if running:
            running["entry"]["status"] = "killed: budget"
            running["entry"]["wall_s"] = clock() - running["t0"]
        result["wall_s"] = clock() - started
        paths = writer.write()
        sys.stdout.write(f"budget exceeded by {GRACE_S:.0f} s: wrote what was measured to {paths[0]}\n")
        sys.stdout.flush()
        os._exit(3)

    watchdog = Watchdog(budget.deadline + GRACE_S, expire, clock=clock).start()
    functions = stage_functions()
    print(f"gpu_check on {name}{' (dry run: CPU, tiny shapes, aot_eager)' if args.dry else ''}: stages "
          f"{''.join(letters)}, budget {args.budget_s:.0f} s, {budget.left():.0f} s left after start-up", flush=True)
    lost_after = None  # the stage after which the CUDA context was lost (an illegal access is sticky)
    for letter in letters:
        stage_clock = budget.open(letter)
        entry: dict = {"allotted_s": stage_clock.allotted_s, "out": {}}
        result["stages"][letter] = entry
        if lost_after is not None:
            entry["status"] = f"not run: the CUDA context was lost in stage {lost_after}"
            print(f"[{letter}] {entry['status']}", flush=True)
            continue
        if stage_clock.allotted_s < (0.0 if args.dry else MINIMUM_S[letter]) or stage_clock.left() <= 0:
            entry["status"] = SKIPPED
            print(f"[{letter}] {SKIPPED} ({stage_clock.allotted_s:.0f} s allotted)", flush=True)
            continue
        entry["status"] = "running"
        running.update(entry=entry, t0=clock())
        cpu0 = time.process_time()
        print(f"[{letter}] {stage_clock.allotted_s:.0f} s allotted", flush=True)
        try:
            with measure.compile_backend("aot_eager" if args.dry else None), \
                    float32_matmuls_may_use_tf32(letter != "B"):
                functions[letter](ctx, stage_clock, entry["out"])
            entry["status"] = "ran"
        except Exception as exc:
            entry["status"] = "failed"
            entry["error"] = measure.error_text(exc)
            print(f"[{letter}] failed: {entry['error'].splitlines()[0]}", flush=True)
        finally:
            running.clear()
            entry["wall_s"] = stage_clock.elapsed()
            entry["cpu_s"] = time.process_time() - cpu0  # the host's CPU seconds (all threads)
            if stage_clock.left() < 0:
                entry["overran_s"] = -stage_clock.left()  # an estimate was short: later stages get less
            try:
                measure.free_memory(device)
            except RuntimeError as exc:  # a sticky CUDA error: nothing later can run in this process
                lost_after = letter
                entry["status"] = "failed"
                entry.setdefault("error", measure.error_text(exc))
        print(f"[{letter}] {entry['status']} in {entry['wall_s']:.1f} s", flush=True)
        result["wall_s"] = clock() - started
        writer.write()  # a run cut short from outside (a lease ending) still leaves every finished stage
    watchdog.cancel()
    result["wall_s"] = clock() - started
    paths = writer.write()
    print(report.results(json.loads(json.dumps(result, default=str))))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 1 if any(s.get("status") == "failed" for s in result["stages"].values()) else 0
