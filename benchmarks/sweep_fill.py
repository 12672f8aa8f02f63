"""How full a small study keeps a GPU machine: one sweep laid out four ways, wall time, busy share and every loss.

The study is 2 variants (RMSNorm, the baseline, and LayerNorm) x 8 paired seeds at the reproduction's text size
(``benchmarks/reproduction.py``: 8 layers, 300 steps of 16 x 64 tokens, validation every 50 steps on 16 batches), no
tuning (the recipe's learning rate). Each layout runs the same `cli.py sweep` into a store of its own:

- (a) one run at a time (``--parallel 1``);
- (b) one run per GPU (``--parallel auto``); on a one-GPU machine this is (a), and is not run twice;
- (c) M runs per GPU, eager (``--parallel auto --runs_per_gpu M``);
- (d) M runs per GPU with CUDA graphs (the same, ``--model.compile=reduce-overhead``).

(a) to (c) run eager (``--model.compile=false``): they differ only in where the runs compute, so their per-seed
losses must agree; (d) compiles, and its losses are set beside them with their largest difference from (a).

Busy share: the GPUs' ``utilization.gpu`` as ``nvidia-smi`` reports it (the share of each sample period in which a
kernel ran), sampled every 500 ms over the sweep and averaged over the samples and the GPUs; and the CPUs' busy
share from ``/proc/stat`` over the same time (the whole machine's, whoever loads it).

    python -m benchmarks.sweep_fill                  # on a GPU machine: at most about 4 minutes (--budget_s)
    python -m benchmarks.sweep_fill --dry            # on CPU: 2 variants x 2 seeds, a tiny model, 2 layouts

``--dry`` lays out a genuinely smaller study on CPU, one run at a time and 2 slots, and checks that the layout did
not change a loss. Each run rewrites its own section of ``docs/performance/sweep-fill.md`` (``--out``): the CPU dry
run's, or the GPU table's; the other section is kept.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "performance" / "sweep-fill.md"
RECIPE = "recipes/gpt_baseline.yaml"
VARIANTS = "model.arch.norm=rmsnorm,layernorm"
SAMPLE_S = 0.5
GPU_BUDGET_S = 240.0  # about 4 minutes of a lent GPU, all layouts together
EAGER = "--model.compile=false"
GRAPHS = "--model.compile=reduce-overhead"
# A genuinely smaller study for CPU: a 2-layer model at d 32 trains 20 steps of 8 x 32 tokens.
DRY_BUDGET = ("--model.arch.n_layers=2", "--model.arch.d_model=32", "--model.arch.n_heads=2", "--data.batch_size=8",
              "--data.block_size=32", "--trainer.max_steps=20", "--trainer.val_check_interval=20",
              "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2", "--trainer.log_every_n_steps=10",
              "--trainer.num_sanity_val_steps=0")
SECTION = "<!-- sweep_fill:{} -->"  # the generated sections: "cpu" (the dry run) and "gpu"


@dataclass(frozen=True)
class Layout:
    name: str
    what: str
    flags: tuple[str, ...]
    eager: bool = True  # its losses must equal every other eager layout's


def gpu_layouts(gpus: int, runs_per_gpu: int) -> list[Layout]:
    m = runs_per_gpu
    layouts = [Layout("a", "one run at a time", ("--parallel", "1", EAGER))]
    if gpus > 1:
        layouts.append(Layout("b", "one run per GPU", ("--parallel", "auto", EAGER)))
    layouts += [Layout("c", f"{m} runs per GPU, eager", ("--parallel", "auto", "--runs_per_gpu", str(m), EAGER)),
                Layout("d", f"{m} runs per GPU, CUDA graphs",
                       ("--parallel", "auto", "--runs_per_gpu", str(m), GRAPHS), eager=False)]
    return layouts


DRY_LAYOUTS = [Layout("a", "one run at a time", ("--parallel", "1")),
               Layout("2 slots", "two runs at a time, a core each", ("--parallel", "2"))]


def reproduction_budget() -> tuple[str, ...]:
    """The reproduction's text budget, read from where it is defined."""
    from benchmarks.reproduction import SUITES

    return SUITES["text"].budget


def gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                         text=True)
    return len(out.stdout.split()) if out.returncode == 0 else 0


class BusySampler:
    """The GPUs' ``utilization.gpu`` (nvidia-smi, every 500 ms) and the CPUs' busy share (/proc/stat) while a sweep
    runs."""

    def __init__(self, gpus: bool):
        self.gpu_samples: list[float] = []
        self._smi = None
        if gpus:
            self._smi = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                          f"--loop-ms={int(SAMPLE_S * 1000)}"], stdout=subprocess.PIPE, text=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        self._cpu_start = _cpu_times()

    def _read(self) -> None:
        for line in self._smi.stdout:
            try:
                self.gpu_samples.append(float(line.strip()))
            except ValueError:
                pass

    def stop(self) -> dict:
        busy, total = (b - a for a, b in zip(self._cpu_start, _cpu_times(), strict=True))
        if self._smi is not None:
            self._smi.terminate()
            self._smi.wait()
            self._reader.join(timeout=5)
        gpu = sum(self.gpu_samples) / len(self.gpu_samples) if self.gpu_samples else None
        return {"gpu_busy": gpu, "gpu_samples": len(self.gpu_samples), "cpu_busy": 100 * busy / max(total, 1)}


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def sweep_command(layout: Layout, seeds: int, budget: tuple[str, ...], store: str, out: Path) -> list[str]:
    return [sys.executable, "cli.py", "sweep", "--config", RECIPE, "--vary", VARIANTS, "--seeds", str(seeds),
            "--metric", "val/loss", "--report_metric", "test/loss", "--experiment", "sweep-fill",
            "--tracking_uri", store, "--out", str(out), *layout.flags, *budget]


def run_layout(layout: Layout, seeds: int, budget: tuple[str, ...], where: Path, gpus: int,
               timeout_s: float | None = None) -> dict:
    """One sweep in a fresh store: wall time, busy shares, its placement line and every seed's test loss. A sweep
    past ``timeout_s`` is stopped (SIGTERM: it ends its workers and marks its runs KILLED) and reported as such, with
    the losses of the runs it finished, so a lent GPU's minutes always end in a page."""
    where.mkdir(parents=True)
    store = f"sqlite:///{where / 'store.db'}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    sampler = BusySampler(gpus > 0)
    start = time.perf_counter()
    sweep = subprocess.Popen(sweep_command(layout, seeds, budget, store, where / "out"), cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = sweep.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        sweep.terminate()
        try:
            stdout, stderr = sweep.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            stdout, stderr = "", ""
        try:  # its own session: the sweep and any worker it left, nothing else
            os.killpg(sweep.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if sweep.returncode is None:
            stdout, stderr = sweep.communicate()
        timed_out = True
    wall = time.perf_counter() - start
    busy = sampler.stop()
    if sweep.returncode != 0 and not timed_out:
        raise SystemExit(f"error: layout ({layout.name}) failed (exit {sweep.returncode}); its sweep said:\n"
                         f"{stdout[-2000:]}{stderr[-2000:]}")
    placed = next((line.removeprefix("placement: ") for line in stdout.splitlines()
                   if line.startswith("placement: ")), "?")
    return {"layout": layout.name, "what": layout.what, "eager": layout.eager, "wall_s": wall, "placement": placed,
            "timed_out": timed_out, **busy,
            "losses": seed_losses(store) if (where / "store.db").exists() else {}}  # stopped before its store


def seed_losses(store: str) -> dict[str, float | None]:
    """``<variant> seed <seed> -> test/loss`` of every seed run in a sweep-fill store."""
    import mlflow

    client = mlflow.MlflowClient(store)
    experiment = client.get_experiment_by_name("sweep-fill")
    if experiment is None:  # a sweep stopped before it made its experiment
        return {}
    runs = client.search_runs([experiment.experiment_id], "tags.`arch_lab.sweep.role` = 'child'", max_results=1000)
    found = {}
    for run in runs:
        tags = run.data.tags
        if tags.get("arch_lab.sweep.phase") == "seed":
            found[f"{tags['arch_lab.sweep.variant']} seed {tags['arch_lab.sweep.seed']}"] = \
                run.data.metrics.get("test/loss")
    return dict(sorted(found.items()))


def losses_agree(results: list[dict]) -> bool:
    """Every run that each eager layout finished has the same loss in all of them, bit for bit (and there is one)."""
    eager = [r["losses"] for r in results if r["eager"]]
    both = [k for k in set().union(*eager) if all(x.get(k) is not None for x in eager)]
    return bool(both) and all(len({x[k] for x in eager}) == 1 for k in both)


def render(results: list[dict], seeds: int, budget: tuple[str, ...], machine: str) -> str:
    """The section of the page for one run of this benchmark."""
    n = 2 * seeds
    gpu = any(r["gpu_busy"] is not None for r in results)
    lines = [f"Machine: {machine}. The study: 2 variants ({VARIANTS}) x {seeds} seeds, {n} runs per layout, "
             f"`{' '.join(budget)}`.", "",
             "| layout | placement (the sweep's own line) | wall time (s) | runs per minute | GPU busy (%) | "
             "CPU busy (%) |", "|---|---|---:|---:|---:|---:|"]
    for r in results:
        gpu_busy = f"{r['gpu_busy']:.0f}" if r["gpu_busy"] is not None else "no GPU"
        finished = sum(v is not None for v in r["losses"].values())
        wall = f"{r['wall_s']:.1f}" + (f" (stopped: {finished} of {n} runs done)" if r.get("timed_out") else "")
        lines.append(f"| ({r['layout']}) {r['what']} | {r['placement']} | {wall} | "
                     f"{60 * finished / r['wall_s']:.1f} | {gpu_busy} | {r['cpu_busy']:.0f} |")
    reference = results[0]["losses"]
    keys = sorted(set().union(*(r["losses"] for r in results)))
    same = losses_agree(results)
    lines += ["", "Per-seed `test/loss`, side by side:", "",
              "| run | " + " | ".join(f"({r['layout']})" for r in results) + " |",
              "|---|" + "---:|" * len(results)]
    for key in keys:
        lines.append(f"| {key} | " + " | ".join("not run" if r["losses"].get(key) is None else
                                                 repr(r["losses"][key]) for r in results) + " |")
    eager = ", ".join(f"({r['layout']})" for r in results if r["eager"])
    lines += ["", f"Eager layouts {eager}: every loss they all finished " + (
        "equal, bit for bit." if same else "NOT equal: the layout changed a number.")]
    for r in results:
        if not r["eager"]:
            diffs = [abs(r["losses"][k] - v) for k, v in reference.items()
                     if v is not None and r["losses"].get(k) is not None]
            largest = f"{max(diffs):.2e}" if diffs else "n/a"
            lines.append(f"({r['layout']}) compiles, so its floats differ from eager ones: largest |difference| from "
                         f"(a) {largest} nats.")
    lines += ["", ("GPU busy: `nvidia-smi --query-gpu=utilization.gpu` (the share of each sample period in which a "
                   "kernel ran) every 500 ms, averaged over the samples and the GPUs; " if gpu else "")
              + "CPU busy: `/proc/stat`, the whole machine's (whoever loads it), over the sweep's wall time."]
    return "\n".join(lines)


def write_section(page: Path, which: str, text: str) -> None:
    """Replace the page's ``which`` section (``cpu`` or ``gpu``) with ``text``; the rest of the page is kept."""
    start, end = SECTION.format(which), SECTION.format("/" + which)
    body = page.read_text() if page.exists() else _new_page()
    if start not in body:
        body = body.rstrip("\n") + f"\n\n{start}\n{end}\n"
    head, rest = body.split(start, 1)
    tail = rest.split(end, 1)[1] if end in rest else ""
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f"{head}{start}\n{text}\n{end}{tail}")


def _new_page() -> str:
    return ("# Filling a GPU machine with a small study\n\nGenerated by `python -m benchmarks.sweep_fill` "
            "(`--dry` on CPU).\n\n## On GPU\n\n" + SECTION.format("gpu") + "\nNot measured yet.\n"
            + SECTION.format("/gpu") + "\n\n## On CPU (`--dry`)\n\n" + SECTION.format("cpu") + "\n"
            + SECTION.format("/cpu") + "\n")


def machine() -> str:
    cpus = os.cpu_count() or 1
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "CPU")
    load = os.getloadavg()[0]
    if gpu_count():
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True).stdout.strip().splitlines()
        return f"{len(names)} x {names[0]}, {cpus} CPU cores ({model})"
    return f"{cpus} CPU cores ({model}), load average {load:.1f} at the start"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry", action="store_true",
                        help="on CPU: 2 variants x 2 seeds of a tiny model, one at a time and in 2 slots")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per variant (default 8; 2 with --dry)")
    parser.add_argument("--runs_per_gpu", type=int, default=4, help="M in layouts (c) and (d)")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page whose section this run rewrites")
    parser.add_argument("--budget_s", type=float, default=None,
                        help="the whole benchmark's time, split evenly between the layouts: a layout's sweep is "
                             f"stopped at its share and reports the runs it finished (default {GPU_BUDGET_S:.0f} on "
                             "a GPU, none with --dry)")
    args = parser.parse_args(argv)
    gpus = 0 if args.dry else gpu_count()
    if not args.dry and not gpus:
        raise SystemExit("error: no GPU seen (nvidia-smi); run with --dry for the CPU layout check")
    seeds = args.seeds or (2 if args.dry else 8)
    budget = DRY_BUDGET if args.dry else reproduction_budget()
    layouts = DRY_LAYOUTS if args.dry else gpu_layouts(gpus, args.runs_per_gpu)
    env_note = machine()
    results = []
    with tempfile.TemporaryDirectory(prefix="sweep-fill-") as tmp:
        for layout in layouts:
            budget_s = args.budget_s or (None if args.dry else GPU_BUDGET_S)
            timeout = budget_s / len(layouts) if budget_s else None
            results.append(run_layout(layout, seeds, budget, Path(tmp) / re.sub(r"\W", "_", layout.name), gpus,
                                      timeout))
            r = results[-1]
            print(f"({layout.name}) {layout.what}: {r['wall_s']:.1f} s, {r['placement']}", flush=True)
    text = render(results, seeds, budget, env_note)
    if args.dry:
        text = ("The CPU dry run (`--dry`): the same code path as the GPU study, smaller. It checks that where the "
                "runs compute does not change a loss; its times are those of a shared machine.\n\n" + text)
    write_section(args.out, "cpu" if args.dry else "gpu", text)
    print(text)
    summary = {"results": results, "losses_agree": losses_agree(results), "page": str(args.out)}
    if not summary["losses_agree"]:
        print("error: the eager layouts' losses differ: the layout changed a number", file=sys.stderr)
    return summary


if __name__ == "__main__":
    sys.exit(0 if main()["losses_agree"] else 1)
