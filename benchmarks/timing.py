"""The measurement protocol every benchmark here shares: interleaved rounds of timed training steps.

Each contender gets untimed warmup steps, then in every round each runs ``steps`` timed steps in
turn, the order rotating per round (with two contenders: alternating), so machine noise hits all
alike; the median over rounds is reported. ``timed`` and ``interleave`` are the loop itself, used by
``throughput.py``, ``ngpt_throughput.py``, ``optimizer_overhead.py`` and, through ``run_rounds``
(one process, same inputs, same optimizer: AdamW), by ``vit_throughput.py`` and ``pattention_vs_mlp.py``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn


@dataclass
class Contender:
    name: str
    model: nn.Module
    step: Callable[[], None]
    rates: list[float] = field(default_factory=list)

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def training_step(model: nn.Module, loss_fn: Callable[[nn.Module], torch.Tensor]) -> Callable[[], None]:
    """forward + loss, backward, AdamW step, zero_grad."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05)

    def step() -> None:
        loss_fn(model).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


T = TypeVar("T")


def timed(step: Callable[[], object], n: int, clock: Callable[[], float] = time.perf_counter,
          sync: Callable[[], None] | None = None) -> float:
    """Seconds ``clock`` counts over ``n`` calls of ``step``; ``sync`` (a device synchronisation) before and
    after, so queued device work is inside the window and none from before it."""
    if sync is not None:
        sync()
    start = clock()
    for _ in range(n):
        step()
    if sync is not None:
        sync()
    return clock() - start


def interleave(names: Sequence[str], measure: Callable[[str], T], rounds: int,
               warmup: Callable[[str], object] | None = None,
               after_round: Callable[[int, dict[str, T]], None] | None = None) -> dict[str, list[T]]:
    """``rounds`` rounds of ``measure(name)`` for every contender, the order rotating each round (round r starts
    at contender r mod n), after one ``warmup(name)`` each; ``after_round(r, latest)`` once a round is done.
    Returns each contender's measurements, one per round, in round order."""
    if warmup is not None:
        for name in names:
            warmup(name)
    results: dict[str, list[T]] = {name: [] for name in names}
    for r in range(rounds):
        first = r % len(names)
        for name in list(names[first:]) + list(names[:first]):
            results[name].append(measure(name))
        if after_round is not None:
            after_round(r, {name: values[-1] for name, values in results.items()})
    return results


def run_rounds(contenders: list[Contender], items_per_step: int, steps: int, rounds: int, warmup: int,
               unit: str) -> None:
    by_name = {c.name: c for c in contenders}
    rates = interleave(
        list(by_name), lambda name: steps * items_per_step / timed(by_name[name].step, steps), rounds,
        warmup=lambda name: timed(by_name[name].step, warmup),
        after_round=lambda r, latest: print(f"round {r + 1}/{rounds}: " + ", ".join(
            f"{name} {rate:,.1f}" for name, rate in latest.items()) + f" {unit}", flush=True))
    for name, values in rates.items():
        by_name[name].rates.extend(values)


def report(contenders: list[Contender], unit: str) -> dict[str, float]:
    """Print a Markdown table; return the ratios first / other (below 1: the first is slower)."""
    first = contenders[0]
    print(f"\n| model | params | {unit} | {first.name} / model |\n|---|---:|---:|---:|")
    for c in contenders:
        print(f"| {c.name} | {c.params / 1e6:.3f}M | {c.median:,.1f} | {first.median / c.median:.3f} |")
    return {f"{first.name}/{c.name}": first.median / c.median for c in contenders[1:]}
