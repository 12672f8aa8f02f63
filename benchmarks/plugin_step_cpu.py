"""Every registered plugin's eager CPU training step over the baseline's, at the reproduction's size, paired rounds.

The contenders are the GPU check's stage D (``gpu_check.plugins.variants``: every name the registry lists for every
kind, the attention options, the nGPT recipe), each a one-part change of the baseline (pre-RMSNorm, add, linear,
SwiGLU, RoPE, the project's AdamW). The size is the reproduction's text suite (``benchmarks/reproduction.py``):
d 128, 8 layers, 4 heads, 16 x 64 tokens, vocabulary 65 (tinyshakespeare's characters), fp32 as a CPU fit runs.
3PT cannot take d 128 with 4 heads (it splits the width and the heads into 3 phases): it runs at its recipe's width
(d 192, 6 heads, 8 layers) against a baseline of that width, as its recipe's matched baseline is.

A step is forward, fp32 cross-entropy, backward, optimizer step, zero_grad (and nGPT's renormalisation where the
model declares it), on one batch made once: no data loader inside the window.

Protocol, in one process (all models alive at once): each model takes ``--warmup`` untimed steps; then in each of
``--rounds`` rounds, every contender runs a window of ``--steps`` timed steps right beside a window of its
baseline, the baseline first in even rounds and the contender first in odd ones, so drift and other processes' load
fall on both sides alike. The round's ratio is contender seconds per step over baseline seconds per step; reported
per contender: the median over rounds, the range, and the order-statistic interval for the median with its
coverage. Time is this process's CPU time by default (``--clock cpu``: another process's load disturbs it far less
than wall time on a shared machine); the ratios, never the absolute times, compare across runs and commits.

    python -m benchmarks.plugin_step_cpu --json /tmp/after.json             # every contender, ~10 min on 2 cores
    python -m benchmarks.plugin_step_cpu --only norm=ssnorm residual=mhc --rounds 3
    python -m benchmarks.plugin_step_cpu --compare /tmp/before.json /tmp/after.json   # the before -> after table

The file imports only what fe45656 (before issue 43's rewrites) already had, so a copy of it runs in a worktree of
that commit: the before column of ``docs/performance/cpu.md``.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.gpu_check.models import Shape, build_ours, fixed_batch, training_step
from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors

REPO = Path(__file__).resolve().parents[1]
BASELINE = "baseline"
SHAPES = {
    "reproduction": Shape(d_model=128, n_layers=8, n_heads=4, seq=64, vocab=65, batch=16),
    # The tests' shape, the plugin cost audit's tiny one (3PT fits it: d % 6 == 0, heads % 3 == 0).
    "tiny": Shape(d_model=48, n_layers=2, n_heads=3, seq=16, vocab=64, batch=2),
}
# 3PT needs d_model % 6 == 0 and n_heads % 3 == 0 (three phases, each a whole number of heads and channel pairs).
THREE_PHASE = "norm=3pt"
THREE_PHASE_WIDTH = {"d_model": 192, "n_heads": 6}  # recipes/gpt_3pt.yaml's
# Where a contender's ratio is called slow: issue 43's eager target for every plugin.
SLOW = 1.5
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
INTERVAL_LEVEL = 0.9


def shape_for(label: str, shape: Shape) -> Shape:
    """The shape ``label`` runs at: ``shape``, except 3PT where the width or heads do not split in three phases."""
    if label == THREE_PHASE and (shape.d_model % 6 or shape.n_heads % 3):
        return Shape(**{**vars(shape), **THREE_PHASE_WIDTH})
    return shape


def contenders(shape: Shape) -> dict[str, dict]:
    """label -> {"arch": overrides of the baseline, "optimizer": name, "shape": Shape}, the baseline first; a
    contender stage D cannot measure keeps its {"status": why}."""
    from benchmarks.gpu_check.plugins import variants

    out = {BASELINE: {"arch": {}, "optimizer": "adamw", "shape": shape}}
    for label, spec in variants(shape).items():
        out[label] = spec if "status" in spec else {**spec, "shape": shape_for(label, shape)}
    return out


def build_step(spec: dict) -> Callable[[], torch.Tensor]:
    """One contender's training step (fp32, the project's optimizer, one fixed batch), returning the loss."""
    from benchmarks.gpu_check.plugins import after_step_of, build_optimizer

    device = torch.device("cpu")
    shape = spec["shape"]
    model = build_ours(shape, device, **spec["arch"])
    opt = build_optimizer(model, spec["optimizer"])
    x, y = fixed_batch(shape, device)
    return training_step(model, model, opt, x, y, device, amp=False, after_step=after_step_of(model))


def baseline_label(contender_shape: Shape, shape: Shape) -> str:
    """The baseline a contender at ``contender_shape`` pairs with: the run's, or one of its own width (3PT)."""
    if contender_shape == shape:
        return BASELINE
    return f"{BASELINE} d{contender_shape.d_model} h{contender_shape.n_heads}"


def paired_rounds(steps: dict[str, Callable[[], object]], baseline_of: dict[str, str], rounds: int,
                  steps_per_window: int, clock: Callable[[], float], progress=None) -> dict[str, dict]:
    """Each contender's per-round seconds per step and its paired baseline's, and their ratio.

    ``steps``: every step function by name, baselines included; ``baseline_of``: contender -> the baseline it is
    paired with. In round r the pair runs baseline then contender (r even) or contender then baseline (r odd).
    Returns contender -> {"ratios", "seconds", "baseline_seconds"}, one entry per round. A contender whose step
    raises is dropped from the rounds with its error (``{"status": "failed", "error": ...}``)."""
    out: dict[str, dict] = {label: {"ratios": [], "seconds": [], "baseline_seconds": []} for label in baseline_of}

    def window(name: str) -> float:
        start = clock()
        for _ in range(steps_per_window):
            steps[name]()
        return (clock() - start) / steps_per_window

    for r in range(rounds):
        for label, base in baseline_of.items():
            row = out[label]
            if row.get("status") == "failed":
                continue
            try:
                if r % 2 == 0:
                    base_s, own_s = window(base), window(label)
                else:
                    own_s, base_s = window(label), window(base)
            except Exception as exc:  # one plugin's failure is recorded, the others still run
                out[label] = {"status": "failed", "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
                continue
            row["seconds"].append(own_s)
            row["baseline_seconds"].append(base_s)
            row["ratios"].append(own_s / base_s)
        if progress:
            progress(r, out)
    return out


def median_interval(values: list[float], level: float = INTERVAL_LEVEL) -> tuple[float, float, float]:
    """The order-statistic interval for the median (distribution-free): (x_(k), x_(n+1-k), coverage) with the
    largest k whose coverage 1 - 2 P(Binomial(n, 1/2) <= k - 1) is at least ``level``; with too few values for
    ``level``, the range and its coverage (1 - 2^(1-n))."""
    xs, n = sorted(values), len(values)

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = 1
    while k + 1 <= n // 2 and coverage(k + 1) >= level:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def summarise(row: dict) -> dict:
    """A contender's rounds -> its median ratio, range, interval for the median, and median step seconds."""
    if row.get("status") == "failed" or not row.get("ratios"):
        return dict(row)
    ratios = row["ratios"]
    low, high, cover = median_interval(ratios)
    # Copies of the per-round lists: a summary handed over after a round stays as it was when later rounds append.
    return {**{key: list(values) for key, values in row.items()}, "status": "ran",
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "interval": [low, high], "coverage": cover, "step_s": statistics.median(row["seconds"]),
            "baseline_step_s": statistics.median(row["baseline_seconds"])}


def measure(shape: Shape, only: list[str] | None, rounds: int, steps: int, warmup: int, clock: str,
            progress=print, after_round=None) -> dict:
    """The contenders' summaries; ``after_round(result so far)`` once each round is done (``main`` writes the
    JSON then, so a run stopped early keeps the rounds it finished)."""
    todo = contenders(shape)
    if only:
        unknown = [label for label in only if label not in todo or label == BASELINE]
        if unknown:
            raise UserInputError(f"unknown contender {', '.join(map(repr, unknown))}; give labels from: "
                                 f"{', '.join(label for label in todo if label != BASELINE)}")
        todo = {label: spec for label, spec in todo.items() if label == BASELINE or label in only}
    baselines = {BASELINE: todo[BASELINE]}
    baseline_of, skipped, step_fns = {}, {}, {}
    for label, spec in todo.items():
        if label == BASELINE:
            continue
        if "status" in spec:
            skipped[label] = spec
            continue
        base = baseline_label(spec["shape"], shape)
        baselines.setdefault(base, {"arch": {}, "optimizer": "adamw", "shape": spec["shape"]})
        baseline_of[label] = base
    for label, spec in {**baselines, **{label: todo[label] for label in baseline_of}}.items():
        try:
            step_fns[label] = build_step(spec)
            for _ in range(warmup):
                step_fns[label]()
        except Exception as exc:
            if label in baselines:
                raise
            skipped[label] = {"status": "failed", "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
            baseline_of.pop(label)
        progress(f"built and warmed {label}")
    started = time.perf_counter()

    def said(r: int, out: dict) -> None:
        progress(f"round {r + 1}/{rounds} ({time.perf_counter() - started:.0f} s): " + ", ".join(
            f"{label} {row['ratios'][-1]:.3f}" for label, row in out.items() if row.get("ratios")))

    load_before = list(os.getloadavg())

    def result_of(rows: dict, done: int) -> dict:
        summaries = {label: summarise(row) | {"baseline": baseline_of[label]} for label, row in rows.items()}
        return {"shape": vars(shape), "rounds": done, "steps": steps, "warmup": warmup, "clock": clock,
                "threads": torch.get_num_threads(), "load_average_before": load_before,
                "load_average": list(os.getloadavg()), "contenders": summaries | skipped}

    def round_done(r: int, rows: dict) -> None:
        said(r, rows)
        if after_round is not None:
            after_round(result_of(rows, r + 1))

    return result_of(paired_rounds(step_fns, baseline_of, rounds, steps, CLOCKS[clock], round_done), rounds)


def _ratio(row: dict | None) -> str:
    if row is None:
        return "not in this run"
    if row.get("status") != "ran":
        return f"{row.get('status')}: {row.get('error', '')}"
    low, high = row["interval"]
    return f"{row['median']:.2f}x [{low:.2f}, {high:.2f}] ({row['min']:.2f}-{row['max']:.2f})"


def render(result: dict) -> str:
    """One run's Markdown table: median ratio, interval for the median (coverage), range, per contender."""
    rows = result["contenders"]
    cover = next((row["coverage"] for row in rows.values() if row.get("status") == "ran"), None)
    lines = [f"{result['rounds']} rounds of {result['steps']} steps per window, clock {result['clock']}; ratio = "
             f"contender step / baseline step; median [interval for the median, coverage "
             f"{'n/a' if cover is None else f'{cover:.0%}'}] (range)", "",
             f"| contender | step ratio | over {SLOW}x |", "|---|---:|---|"]
    for label, row in rows.items():
        slow = "yes" if row.get("status") == "ran" and row["median"] > SLOW else ""
        lines.append(f"| `{label}` | {_ratio(row)} | {slow} |")
    return "\n".join(lines) + "\n"


def render_compare(before: dict, after: dict) -> str:
    """The before -> after table: each contender's median ratio and spread in both runs, after / before, and
    whether the after median is still over ``SLOW``."""
    rb, ra = before["contenders"], after["contenders"]
    labels = list(ra) + [label for label in rb if label not in ra]
    lines = [f"| contender | before: median [interval] (range) | after: median [interval] (range) | after / before "
             f"| after over {SLOW}x |", "|---|---:|---:|---:|---|"]
    for label in labels:
        b, a = rb.get(label), ra.get(label)
        change = (f"{a['median'] / b['median']:.2f}" if a and b and a.get("status") == b.get("status") == "ran"
                  else "")
        slow = "**yes**" if a and a.get("status") == "ran" and a["median"] > SLOW else ""
        lines.append(f"| `{label}` | {_ratio(b)} | {_ratio(a)} | {change} | {slow} |")
    lines += ["", *(f"- {name}: {noise(run)}" for name, run in (("before", before), ("after", after)))]
    return "\n".join(lines) + "\n"


def noise(run: dict) -> str:
    """What the machine did during a run: the run's baseline windows (seconds per step: median and range) and
    the load average (1 minute) before the rounds and at the end."""
    seconds = [s for row in run["contenders"].values() if row.get("baseline") == BASELINE
               for s in row.get("baseline_seconds", ())]
    said = [f"{run.get('rounds', '?')} rounds of {run.get('steps', '?')} steps, clock {run.get('clock', '?')}"]
    if seconds:
        said.append(f"baseline {statistics.median(seconds):.3f} s per step over {len(seconds)} windows "
                    f"({min(seconds):.3f}-{max(seconds):.3f})")
    loads = [run[key][0] for key in ("load_average_before", "load_average") if key in run]
    if loads:
        said.append("load average " + " -> ".join(f"{load:.1f}" for load in loads))
    return "; ".join(said)


def provenance() -> dict:
    """The cost audit's provenance (commit, torch), timed to the minute and with the CPU count: two runs of this
    benchmark on one day are told apart, and the cores bound what a ratio can show."""
    from benchmarks.plugin_cost import provenance as audit_provenance

    return audit_provenance() | {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                                 "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}


def _load(path: Path) -> dict:
    if not path.is_file():
        raise UserInputError(f"{path} does not exist; write it with `python -m benchmarks.plugin_step_cpu --json "
                             f"{path}`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path} is not this benchmark's JSON ({exc}); write it again with --json") from exc


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(prog="python -m benchmarks.plugin_step_cpu", description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="reproduction")
    p.add_argument("--only", nargs="+", metavar="LABEL", help="these contenders (and their baseline) only")
    p.add_argument("--rounds", type=int, default=5, help="paired rounds (default 5)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per window (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model before the rounds (default 2)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                   help="cpu: this process's CPU time (default; a shared machine); wall: elapsed time")
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (default 1, as a sweep child)")
    p.add_argument("--json", type=Path, help="write the result here")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                   help="measure nothing: print the before -> after table of two runs' JSON files")
    args = p.parse_args(argv)
    if args.compare:
        print(render_compare(*(_load(path) for path in args.compare)), end="")
        return 0
    for name in ("rounds", "steps", "threads"):
        if getattr(args, name) < 1:
            raise UserInputError(f"--{name} must be at least 1 (got {getattr(args, name)})")
    if args.warmup < 0:
        raise UserInputError(f"--warmup must be 0 or more (got {args.warmup})")
    torch.set_num_threads(args.threads)
    known = provenance()

    def write(result: dict) -> None:
        if args.json:
            args.json.write_text(json.dumps(known | result, indent=1) + "\n")

    result = known | measure(SHAPES[args.shape], args.only, args.rounds, args.steps, args.warmup, args.clock,
                             progress=lambda line: print(line, file=sys.stderr, flush=True), after_round=write)
    write(result)
    print(render(result), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
