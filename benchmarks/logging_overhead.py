"""What MLflow logging costs a training step: no logger vs ``MLflowLogger`` on sqlite and on a local
``mlflow server``, synchronous and asynchronous (``MLflowLogger``'s default: MLflow's queue, merged per
second; and MLflow's plain unbuffered queue), at Lightning's default interval (every 50 steps) and at
every step.

Every contender is a real ``Trainer.fit`` of the same ``LanguageModel`` on tinyshakespeare, logging what
the CLI logs (``train/loss``, ``train/lr``, ``train/tokens_per_s``; system metrics through the
``MLflowRun`` callback, every 10 s). Timed: the wall time from the start of step W to the start of step
W + K, so every logging call of those K steps is inside the window (K a multiple of 50); validation and
checkpointing are off. Rounds interleave the contenders in rotating order (as ``benchmarks/timing.py``
does), so machine noise hits all alike. Reported: the median over rounds of the mean step time; the
overhead, the median over rounds of (mean step time / no logger's in the same round) - 1; and the time
the training loop spent inside the logger's ``log_metrics`` per step ("blocked"), which is the whole
cost of synchronous logging and, for asynchronous logging, the cost minus the background threads' share
of the cores. The server is started here on 127.0.0.1 (sqlite backend, 1 worker), as the tests do.
After each fit the number of stored ``train/loss`` points is read back: asynchronous logging must
store as many as synchronous.

    python -m benchmarks.logging_overhead                            # small model and the baseline recipe's size
    python -m benchmarks.logging_overhead --sizes small --rounds 3   # quicker
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import lightning as L
import mlflow
import torch

from lit.callbacks import MLflowRun
from lit.data.text import TextDataModule
from lit.language_model import LanguageModel
from lit.models.transformer import TransformerConfig
from lit.tracking import MLflowLogger

RESULTS = Path(__file__).parent / "results"
DEFAULT_INTERVAL = 50  # Lightning's log_every_n_steps
BUFFERING = "MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"
MODES = {"sync": None, "async": "1", "async-unbuffered": "0"}  # -> MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS


@dataclass
class Size:
    """A model and batch, and how many steps each fit times."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    block_size: int
    batch_size: int
    warmup: int
    steps: int
    contenders: tuple[str, ...]


SIZES = {
    # Small enough that the cost of a logging call is visible next to a step.
    "small": Size("small", 64, 2, 2, 64, 8, warmup=20, steps=400,
                  contenders=("none", "sqlite sync /50", "sqlite async /50", "server sync /50", "server async /50",
                              "sqlite sync /1", "sqlite async /1", "sqlite async-unbuffered /1",
                              "server sync /1", "server async /1", "server async-unbuffered /1")),
    # The baseline recipe's model and batch (recipes/gpt_baseline.yaml).
    "baseline": Size("baseline", 128, 4, 4, 128, 32, warmup=5, steps=50,
                     contenders=("none", "sqlite async /50", "server sync /50", "server async /50",
                                 "server sync /1", "server async /1")),
}


@dataclass
class Contender:
    name: str
    store: str | None  # "sqlite", "server" or None (logger=False)
    mode: str  # a key of MODES
    every: int
    seconds_per_step: list[float] = field(default_factory=list)
    blocked_per_step: list[float] = field(default_factory=list)  # seconds inside log_metrics per step
    stored_points: list[int] = field(default_factory=list)

    @classmethod
    def parse(cls, name: str) -> Contender:
        if name == "none":
            return cls(name, None, "sync", DEFAULT_INTERVAL)
        store, mode, every = name.split()
        return cls(name, store, mode, int(every.lstrip("/")))

    @property
    def median(self) -> float:
        return statistics.median(self.seconds_per_step)

    def overhead(self, baseline: Contender) -> float:
        """Median over rounds of this round's mean step time / the baseline's in the same round, - 1."""
        return statistics.median(a / b for a, b in zip(self.seconds_per_step, baseline.seconds_per_step,
                                                       strict=True)) - 1


class StepWindow(L.Callback):
    """Wall time from the start of step ``start`` to the start of step ``start + steps``."""

    def __init__(self, start: int, steps: int):
        self.start, self.steps, self.began, self.ended, self.blocked = start, steps, None, None, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step == self.start:
            self.began = time.perf_counter()
        elif trainer.global_step == self.start + self.steps:
            self.ended = time.perf_counter()

    def timing(self, log_metrics):
        """``log_metrics`` that adds the time it takes inside the window to ``blocked``."""
        def timed(metrics, step=None):
            began = time.perf_counter()
            log_metrics(metrics, step)
            if self.began is not None and self.ended is None:
                self.blocked += time.perf_counter() - began
        return timed

    @property
    def seconds_per_step(self) -> float:
        return (self.ended - self.began) / self.steps


def fit_once(size: Size, contender: Contender, data: TextDataModule, uris: dict[str, str]) -> None:
    window = StepWindow(size.warmup, size.steps)
    callbacks: list[L.Callback] = [window]
    logger: MLflowLogger | bool = False
    if contender.store is not None:
        os.environ.pop(BUFFERING, None)
        logger = MLflowLogger(experiment_name=f"overhead-{size.name}", run_name=contender.name,
                              tracking_uri=uris[contender.store], synchronous=contender.mode == "sync",
                              save_dir=str(Path(uris["workdir"]) / "runs"))
        if MODES[contender.mode] is not None:  # after the logger's own default, which it overrides
            os.environ[BUFFERING] = MODES[contender.mode]
        logger.log_metrics = window.timing(logger.log_metrics)
        callbacks.append(MLflowRun())
    torch.manual_seed(0)  # the same initial weights for every contender
    arch = TransformerConfig(d_model=size.d_model, n_layers=size.n_layers, n_heads=size.n_heads)
    model = LanguageModel(vocab_size=data.vocab_size, block_size=size.block_size, arch=arch, warmup_steps=10)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=size.warmup + size.steps + 1, logger=logger,
                        callbacks=callbacks, log_every_n_steps=contender.every, limit_val_batches=0,
                        num_sanity_val_steps=0, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, data)
    contender.seconds_per_step.append(window.seconds_per_step)
    contender.blocked_per_step.append(window.blocked / window.steps)
    if logger:
        client = mlflow.MlflowClient(uris[contender.store])
        contender.stored_points.append(len(client.get_metric_history(logger.run_id, "train/loss")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(folder: Path) -> tuple[str, subprocess.Popen]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{folder}/server.db", "--artifacts-destination", str(folder / "artifacts"),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            return url, server
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                server.kill()
                raise RuntimeError("mlflow server did not start") from None
            time.sleep(0.5)


def measure(size: Size, rounds: int, uris: dict[str, str]) -> list[Contender]:
    contenders = [Contender.parse(name) for name in size.contenders]
    data = TextDataModule(block_size=size.block_size, batch_size=size.batch_size)
    for contender in contenders:  # untimed: the first fit of a kind pays one-off costs (allocator, imports)
        fit_once(size, contender, data, uris)
        contender.seconds_per_step.clear()
        contender.blocked_per_step.clear()
        contender.stored_points.clear()
    for r in range(rounds):
        shift = r % len(contenders)
        for contender in contenders[shift:] + contenders[:shift]:
            fit_once(size, contender, data, uris)
        print(f"{size.name} round {r + 1}/{rounds}: " + ", ".join(
            f"{c.name} {1e3 * c.seconds_per_step[-1]:.2f}" for c in contenders) + " ms/step", flush=True)
    return contenders


def table(size: Size, contenders: list[Contender], rounds: int) -> str:
    none = contenders[0]
    lines = [f"**{size.name}**: d_model {size.d_model}, {size.n_layers} layers, {size.n_heads} heads, "
             f"block {size.block_size}, batch {size.batch_size}; {size.steps} timed steps per fit after "
             f"{size.warmup} warmup steps, {rounds} rounds.", "",
             "| logger | ms/step (median) | min-max over rounds | steps/s | overhead vs none | blocked in logger "
             "| train/loss points stored |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for c in contenders:
        spread = f"{1e3 * min(c.seconds_per_step):.2f}-{1e3 * max(c.seconds_per_step):.2f}"
        stored = "/".join(str(n) for n in sorted(set(c.stored_points))) if c.stored_points else "-"
        overhead = blocked = ""
        if c is not none:
            overhead = f"{100 * c.overhead(none):+.1f}%"
            share = statistics.median(c.blocked_per_step) / none.median
            blocked = f"{1e3 * statistics.median(c.blocked_per_step):.3f} ms ({100 * share:.2f}%)"
        lines.append(f"| {c.name} | {1e3 * c.median:.2f} | {spread} | {1 / c.median:,.1f} | {overhead} | "
                     f"{blocked} | {stored} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["small", "baseline"])
    p.add_argument("--rounds", type=int, default=5, help="rounds for the small model (the baseline size: 3)")
    p.add_argument("--conditions", default="", help="how the machine was loaded, written into the results")
    args = p.parse_args(argv)
    for name in ("lightning.pytorch", "mlflow"):  # per-fit banners and monitor start/stop lines
        logging.getLogger(name).setLevel(logging.WARNING)
    RESULTS.mkdir(exist_ok=True)
    load_before = os.getloadavg()
    results: dict = {"sizes": {}}
    sections = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        url, server = start_server(folder)
        uris = {"sqlite": f"sqlite:///{folder}/client.db", "server": url, "workdir": str(folder)}
        try:
            for name in args.sizes:
                size = SIZES[name]
                rounds = args.rounds if name == "small" else min(args.rounds, 3)
                contenders = measure(size, rounds, uris)
                sections.append(table(size, contenders, rounds))
                print("\n" + sections[-1] + "\n", flush=True)
                results["sizes"][name] = {"size": asdict(size), "rounds": rounds, "contenders": [
                    {**asdict(c), "median_seconds_per_step": c.median,
                     "overhead": None if c is contenders[0] else c.overhead(contenders[0])} for c in contenders]}
        finally:
            server.terminate()
            server.wait(timeout=30)
    results["machine"] = {
        "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "load_average_before": load_before,
        "load_average_after": os.getloadavg(), "python": platform.python_version(), "torch": torch.__version__,
        "lightning": L.__version__, "mlflow": mlflow.__version__, "conditions": args.conditions}
    (RESULTS / "logging_overhead.json").write_text(json.dumps(results, indent=2) + "\n")
    m = results["machine"]
    header = (f"# MLflow logging overhead (`python -m benchmarks.logging_overhead`)\n\n"
              f"{m['cpus']} CPUs, {m['torch_threads']} torch thread(s) (OMP_NUM_THREADS={m['OMP_NUM_THREADS']}), "
              f"load average {m['load_average_before'][0]:.2f} before, {m['load_average_after'][0]:.2f} after; "
              f"torch {m['torch']}, lightning {m['lightning']}, mlflow {m['mlflow']}. {args.conditions}\n\n"
              "`/50`: Lightning's default `log_every_n_steps`; `/1`: every step. `sync`/`async`: MLflow's "
              "`synchronous` switch; `async` is `MLflowLogger`'s default (MLflow's queue, what arrives within "
              f"a second merged into one request: `{BUFFERING}=1`), `async-unbuffered` MLflow's queue with "
              "one request per logging call. `server`: a local `mlflow server` (sqlite backend, 1 worker) on "
              "127.0.0.1, running on the same cores. Overhead: median over rounds of the ratio to no logger "
              "in the same round. Blocked: time inside `log_metrics` per step, and its share of no logger's "
              "step. Each contender had one untimed fit first.\n")
    (RESULTS / "logging_overhead.md").write_text(header + "\n" + "\n\n".join(sections) + "\n")
    return results


if __name__ == "__main__":
    main()
