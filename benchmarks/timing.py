"""The measurement protocol every benchmark here shares: interleaved rounds of timed training steps.

Each contender gets untimed warmup steps, then in every round each runs ``steps`` timed steps in
turn, the order rotating per round, so machine noise hits all alike; the median rate over rounds is
reported. One process, same inputs, same optimizer (AdamW).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

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


def _timed(step: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        step()
    return time.perf_counter() - start


def run_rounds(contenders: list[Contender], items_per_step: int, steps: int, rounds: int, warmup: int,
               unit: str) -> None:
    for c in contenders:
        _timed(c.step, warmup)
    for r in range(rounds):
        for c in contenders[r % len(contenders):] + contenders[:r % len(contenders)]:
            c.rates.append(steps * items_per_step / _timed(c.step, steps))
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{c.name} {c.rates[-1]:,.1f}" for c in contenders)
              + f" {unit}", flush=True)


def report(contenders: list[Contender], unit: str) -> dict[str, float]:
    """Print a Markdown table; return the ratios first / other (below 1: the first is slower)."""
    first = contenders[0]
    print(f"\n| model | params | {unit} | {first.name} / model |\n|---|---:|---:|---:|")
    for c in contenders:
        print(f"| {c.name} | {c.params / 1e6:.3f}M | {c.median:,.1f} | {first.median / c.median:.3f} |")
    return {f"{first.name}/{c.name}": first.median / c.median for c in contenders[1:]}
