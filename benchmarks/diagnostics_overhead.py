"""What the diagnostics callback costs a training step: off (``interval 0``) against on at its default interval
(100), on recipes/gpt_baseline.yaml's model and batch, and what one recording step costs.

Every contender is a real ``Trainer.fit`` of the same ``LanguageModel`` on tinyshakespeare, logging to MLflow
(sqlite, asynchronous, as the CLI does). Timed: the wall time from the start of step 1 to the start of step
``1 + steps`` (default 100), so the window holds exactly one recording step (step 100; step 0, also a record,
is outside) and every per-step cost of the ``spikes`` group: the overhead measured is the overhead at that
interval. Rounds interleave the two contenders in rotating order, so machine noise hits both alike; reported:
the median over rounds of (mean step time on / off in the same round) - 1. Inside the "on" fits each step is
timed too: a recording step's time minus the median step of the same fit is the cost of one record (probe
forward, declared scalars, norms with the weight copy, logging); the probe forward alone is timed apart. And
the time spent inside the callback's hooks is summed per step (``--model.diagnostics`` hooks timed in place):
a figure that machine noise hardly touches, unlike the difference of two fits.

    python -m benchmarks.diagnostics_overhead                 # 3 rounds of 100 steps (about 8 minutes on 2 CPUs)
    python -m benchmarks.diagnostics_overhead --rounds 1 --steps 50 --interval 50
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

from lit.data.text import TextDataModule
from lit.diagnostics import Diagnostics, DiagnosticsConfig
from lit.diagnostics.probe import probe
from lit.language_model import LanguageModel
from lit.models.transformer import TransformerConfig
from lit.tracking import MLflowLogger

RESULTS = Path(__file__).parent / "results"
# recipes/gpt_baseline.yaml
ARCH = dict(d_model=128, n_layers=4, n_heads=4, mlp="swiglu", norm="rmsnorm", residual="add", projection="linear")
BLOCK, BATCH = 128, 32


class StepTimes(L.Callback):
    """The wall time of every step, start of one batch to the start of the next."""

    def __init__(self):
        self.starts: dict[int, float] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self.starts.setdefault(trainer.global_step, time.perf_counter())

    def durations(self, first: int, last: int) -> dict[int, float]:
        return {s: self.starts[s + 1] - self.starts[s] for s in range(first, last)}


class HookTimes:
    """Seconds spent inside the ``Diagnostics`` hooks, per optimizer step (the step whose batches run)."""

    HOOKS = ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end")

    def __init__(self):
        self.seconds: dict[int, float] = {}
        for name in self.HOOKS:
            original = getattr(Diagnostics, name)

            def timed(callback, *args, _original=original, **kwargs):
                began = time.perf_counter()
                step = callback._step
                result = _original(callback, *args, **kwargs)
                step = max(step, callback._step)  # on_train_batch_start sets the step it runs for
                self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - began
                return result

            setattr(Diagnostics, name, timed)


def fit_once(interval: int, steps: int, data: TextDataModule, folder: Path) -> StepTimes:
    times = StepTimes()
    logger = MLflowLogger(experiment_name="diagnostics-overhead", tracking_uri=f"sqlite:///{folder}/mlflow.db",
                          save_dir=str(folder / "runs"), system_metrics=False)
    torch.manual_seed(0)
    model = LanguageModel(vocab_size=data.vocab_size, block_size=BLOCK, arch=TransformerConfig(**ARCH),
                          lr=3e-3, warmup_steps=50, diagnostics=DiagnosticsConfig(interval=interval))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps + 2, logger=logger, callbacks=[times],
                        log_every_n_steps=10, gradient_clip_val=1.0, limit_val_batches=0, num_sanity_val_steps=0,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, data)
    return times


def probe_seconds(data: TextDataModule, repeats: int) -> tuple[float, float, float]:
    """Probe forwards with every probed group and with stream and attention only, interleaved in rotating order so
    that machine noise hits both alike: (median all, median stream+attention, median of the paired differences)."""
    torch.manual_seed(0)
    model = LanguageModel(vocab_size=data.vocab_size, block_size=BLOCK, arch=TransformerConfig(**ARCH))
    idx = torch.randint(0, data.vocab_size, (DiagnosticsConfig().probe_batch_size, BLOCK))
    kinds = {"all": dict(stream=True, attention=True, outliers=True, contribution=True),
             "old": dict(stream=True, attention=True)}
    for groups in kinds.values():
        probe(model, idx, **groups)  # untimed: first-call costs
    seconds: dict[str, list[float]] = {"all": [], "old": []}
    for r in range(repeats):
        for name in (list(kinds) if r % 2 == 0 else list(reversed(kinds))):
            began = time.perf_counter()
            probe(model, idx, **kinds[name])
            seconds[name].append(time.perf_counter() - began)
    differences = [a - o for a, o in zip(seconds["all"], seconds["old"], strict=True)]
    return statistics.median(seconds["all"]), statistics.median(seconds["old"]), statistics.median(differences)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=100, help="timed steps per fit; a multiple of --interval")
    p.add_argument("--interval", type=int, default=DiagnosticsConfig().interval)
    p.add_argument("--conditions", default="", help="how the machine was loaded, written into the results")
    args = p.parse_args(argv)
    for name in ("lightning.pytorch", "mlflow"):
        logging.getLogger(name).setLevel(logging.WARNING)
    RESULTS.mkdir(exist_ok=True)
    load_before = os.getloadavg()
    data = TextDataModule(block_size=BLOCK, batch_size=BATCH)
    seconds: dict[str, list[float]] = {"off": [], "on": []}
    record_extra: list[float] = []
    inside: list[dict[int, float]] = []  # per "on" fit: seconds inside the callback per step
    on_step_times: list[list[float]] = []
    records = list(range(args.interval, args.steps + 1, args.interval))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        contenders = {"off": 0, "on": args.interval}
        for interval in contenders.values():  # untimed: the first fit of a kind pays one-off costs
            fit_once(interval, args.steps, data, folder)
        for r in range(args.rounds):
            order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
            for name in order:
                hooks = HookTimes()
                times = fit_once(contenders[name], args.steps, data, folder)
                steps = times.durations(1, 1 + args.steps)
                seconds[name].append(statistics.fmean(steps.values()))
                if name == "on":
                    median = statistics.median(steps.values())
                    on_step_times.append(list(steps.values()))
                    record_extra += [steps[s] - median for s in records]
                    inside.append({s: hooks.seconds.get(s, 0.0) for s in steps})
            print(f"round {r + 1}/{args.rounds}: off {1e3 * seconds['off'][-1]:.1f} ms/step, "
                  f"on {1e3 * seconds['on'][-1]:.1f} ms/step", flush=True)
    ratios = [on / off for on, off in zip(seconds["on"], seconds["off"], strict=True)]
    probe_s, probe_old_s, probe_new_groups_s = probe_seconds(data, repeats=10)
    results = {
        "model": {**ARCH, "block_size": BLOCK, "batch_size": BATCH}, "interval": args.interval, "steps": args.steps,
        "rounds": args.rounds, "seconds_per_step": seconds, "overhead_per_round": [r - 1 for r in ratios],
        "overhead_median": statistics.median(ratios) - 1, "record_step_extra_seconds": record_extra,
        "probe_forward_seconds": probe_s, "probe_forward_seconds_stream_attention_only": probe_old_s,
        "probe_outliers_contribution_extra_seconds": probe_new_groups_s,
        "seconds_inside_callback_per_fit": [sum(f.values()) for f in inside],
        "seconds_inside_callback_plain_step_median": statistics.median(
            [v for f in inside for s, v in f.items() if s not in records]),
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "load_average_before": load_before,
                    "load_average_after": os.getloadavg(), "python": platform.python_version(),
                    "torch": torch.__version__, "lightning": L.__version__, "conditions": args.conditions}}
    (RESULTS / "diagnostics_overhead.json").write_text(json.dumps(results, indent=2) + "\n")
    m = results["machine"]
    off, on = statistics.median(seconds["off"]), statistics.median(seconds["on"])
    on_step = statistics.median(statistics.median(times) for times in on_step_times)  # median step of "on" fits
    spread = ", ".join(f"{100 * o:+.1f}%" for o in results["overhead_per_round"])
    extra = statistics.median(record_extra)
    default = " (default)" if args.interval == DiagnosticsConfig().interval else ""
    inside_per_step = statistics.median(results["seconds_inside_callback_per_fit"]) / args.steps
    lines = [
        "# Diagnostics overhead (`python -m benchmarks.diagnostics_overhead`)", "",
        f"{m['cpus']} CPUs, {m['torch_threads']} torch thread(s) (OMP_NUM_THREADS={m['OMP_NUM_THREADS']}), load "
        f"average {m['load_average_before'][0]:.2f} before, {m['load_average_after'][0]:.2f} after; torch "
        f"{m['torch']}, lightning {m['lightning']}. {args.conditions}", "",
        f"Model and batch of recipes/gpt_baseline.yaml (d_model 128, 4 layers, 4 heads, SwiGLU, RMSNorm, block "
        f"{BLOCK}, batch {BATCH}), MLflow on sqlite (asynchronous), gradient clipping 1.0. Each fit times "
        f"{args.steps} steps (steps 1 to {args.steps}: {len(records)} recording step(s) at interval "
        f"{args.interval}, and the spike tracking of every step); {args.rounds} interleaved rounds after one "
        "untimed fit of each.", "",
        "| diagnostics | ms/step (median over rounds) | min-max over rounds |", "|---|---:|---:|",
        f"| off (`--model.diagnostics.interval=0`) | {1e3 * off:.1f} | "
        f"{1e3 * min(seconds['off']):.1f}-{1e3 * max(seconds['off']):.1f} |",
        f"| on, every {args.interval} steps{default} | {1e3 * on:.1f} | "
        f"{1e3 * min(seconds['on']):.1f}-{1e3 * max(seconds['on']):.1f} |", "",
        f"**Overhead at interval {args.interval}{default}: {100 * results['overhead_median']:+.1f}%** (median over "
        "rounds of the "
        f"per-round ratio; per round: {spread}).", "",
        f"**One recording step** costs {1e3 * extra:.0f} ms more than the median step of its fit "
        f"({100 * extra / on:.0f}% of a step; per record: "
        f"{', '.join(f'{1e3 * e:.0f}' for e in record_extra)} ms); the probe forward alone (probe batch "
        f"{DiagnosticsConfig().probe_batch_size}; stream, attention, outliers and contribution) takes "
        f"{1e3 * probe_s:.0f} ms, {1e3 * probe_old_s:.0f} ms of it with stream and attention only. Spread over "
        f"{args.interval} steps that is {100 * extra / on / args.interval:.2f}% of a step.", "",
        f"**The outliers and contribution groups** add {1e3 * probe_new_groups_s:.0f} ms to a probe (median of 10 "
        f"paired, interleaved probes), **{100 * probe_new_groups_s / args.interval / on_step:.3f}% of a step** at "
        f"interval {args.interval} (against the median step of the fit with diagnostics on, timed in the same "
        "window).", "",
        f"**Inside the callback** (its hooks timed in place, over the {args.steps} timed steps): "
        f"{1e3 * statistics.median(results['seconds_inside_callback_per_fit']) / args.steps:.2f} ms per step on "
        f"average, **{100 * statistics.median(results['seconds_inside_callback_per_fit']) / args.steps / off:.2f}% "
        f"of a step without diagnostics**, {100 * inside_per_step / on_step:.2f}% of the median step of the same "
        f"fits; a step that does not record spends "
        f"{1e3 * results['seconds_inside_callback_plain_step_median']:.2f} ms in it (spike tracking: the gradient "
        "norm and one host sync).",
    ]
    (RESULTS / "diagnostics_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return results


if __name__ == "__main__":
    main()
