"""The check's clock: one global deadline, shared out among the stages, and a watchdog that enforces it.

Every stage reads the same deadline. When a stage starts it is allotted its nominal share of the time that is left
(time an earlier stage did not use flows on to the later ones); inside it, each unit of work (a contender, a
plugin, a compile) asks ``fits(estimate)`` first and is recorded as ``skipped: budget`` when it would overrun.
Estimates can be wrong (a compile that takes twice as long as the last one), so a watchdog thread writes whatever
has been measured and ends the process at the deadline plus a small grace: the command never runs past its budget
by more than that grace.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

SKIPPED = "skipped: budget"


class StageClock:
    """One stage's allotment: its own deadline, never later than the global one."""

    def __init__(self, name: str, clock: Callable[[], float], deadline: float, allotted_s: float):
        self.name, self.clock, self.deadline, self.allotted_s = name, clock, deadline, allotted_s
        self.started = clock()

    def left(self) -> float:
        return self.deadline - self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def fits(self, estimate_s: float) -> bool:
        """Whether work expected to take ``estimate_s`` seconds ends before this stage's deadline."""
        return self.left() >= estimate_s


class Budget:
    """``total_s`` seconds from ``start``, split among stages in proportion to ``nominal_s`` (seconds each)."""

    def __init__(self, total_s: float, nominal_s: dict[str, float], clock: Callable[[], float] = time.monotonic,
                 start: float | None = None, reserve_s: float = 0.0):
        self.clock, self.nominal_s, self.reserve_s = clock, dict(nominal_s), reserve_s
        self.start = clock() if start is None else start
        self.deadline = self.start + total_s
        self._opened: list[str] = []

    def left(self) -> float:
        return self.deadline - self.clock()

    def open(self, name: str) -> StageClock:
        """Start stage ``name``: its share of what is left (after the reserve for writing the report)."""
        remaining = [s for s in self.nominal_s if s not in self._opened]
        weight = sum(self.nominal_s[s] for s in remaining)
        share = self.nominal_s[name] / weight if weight > 0 else 1.0
        self._opened.append(name)
        allotted = max(0.0, self.left() - self.reserve_s) * share
        return StageClock(name, self.clock, min(self.clock() + allotted, self.deadline - self.reserve_s), allotted)


class Watchdog:
    """Calls ``on_expiry`` (which writes the partial report and ends the process) at ``deadline`` on ``clock``."""

    def __init__(self, deadline: float, on_expiry: Callable[[], None], clock: Callable[[], float] = time.monotonic):
        self._timer = threading.Timer(max(0.0, deadline - clock()), on_expiry)
        self._timer.daemon = True

    def start(self) -> Watchdog:
        self._timer.start()
        return self

    def cancel(self) -> None:
        self._timer.cancel()


# Stage D's pairings, sized by the fairness rules of the review (../shared/specs/gpu-plugins.md, section 4): at least
# WINDOW_STEPS steps per window, and CLOSE_ROUNDS rounds where a ratio is under CLOSE_RATIO, i.e. within reach of its
# target, where a round-to-round spread of 10% decides the verdict; ROUNDS elsewhere.
WINDOW_STEPS = 10
ROUNDS = 3
CLOSE_ROUNDS = 5
CLOSE_RATIO = 1.5


@dataclass(frozen=True)
class PairingCosts:
    """Seconds one pairing's parts take: from the stage's measured baselines (or, for the docs' estimate, from the
    figures an earlier run measured). The ratios are guesses used only to size the plan."""

    eager_step_s: float
    compiled_step_s: float
    compile_s: float  # a variant's per-block compile (its first compiled step)
    build_s: float  # building a variant and its optimizer, counting its FLOPs
    eager_ratio: float = 1.6
    compiled_ratio: float = 1.15
    close_share: float = 0.7  # share of the eager rows expected under CLOSE_RATIO (compiled: all)

    def scaled(self, factor: float) -> PairingCosts:
        """Every time ``factor`` times longer (the variants measured so far took that much more than estimated)."""
        return replace(self, eager_step_s=self.eager_step_s * factor, compiled_step_s=self.compiled_step_s * factor,
                       compile_s=self.compile_s * factor, build_s=self.build_s * factor)

    def variant_s(self, steps: int, rounds: int, close_rounds: int, warmup: int) -> float:
        """One variant's eager row, then its compiled row: build, warm-up, one baseline step, the windows."""
        eager_rounds = rounds + self.close_share * (close_rounds - rounds)
        eager = ((1 + warmup) * self.eager_ratio + 1 + eager_rounds * steps * (1 + self.eager_ratio)) \
            * self.eager_step_s
        compiled = self.compile_s + (warmup * self.compiled_ratio + 1 + close_rounds * steps
                                     * (1 + self.compiled_ratio)) * self.compiled_step_s
        return self.build_s + eager + compiled


@dataclass(frozen=True)
class PairingPlan:
    """How many steps and rounds every pairing of stage D gets, what that is expected to cost, and what the budget
    cut from the rules above to fit."""

    steps: int
    rounds: int
    close_rounds: int
    warmup: int
    variants: int
    estimate_s: float
    allotted_s: float
    cuts: tuple[str, ...] = ()

    def describe(self) -> str:
        close = f" ({self.close_rounds} under {CLOSE_RATIO}x)" if self.close_rounds != self.rounds else ""
        return (f"{self.variants} variants, each eager and compiled: {self.steps} steps per window, {self.rounds} "
                f"rounds{close}, {self.warmup} warm-up steps; estimated "
                f"{self.estimate_s:.0f} s of {self.allotted_s:.0f} s; cut: "
                + ("; ".join(self.cuts) if self.cuts else "nothing"))


# From the rules down, each level cutting one more thing; the first whose estimate fits is the plan.
FEWER_CLOSE = f"ratios under {CLOSE_RATIO}x get {ROUNDS} rounds, not {CLOSE_ROUNDS}"
FEWER_STEPS = f"5 steps per window, not {WINDOW_STEPS}"
# Rounds are cut last: with 2 rounds the t interval has one degree of freedom (12.7 standard errors wide each way),
# so fewer steps per window, which costs little precision at a step's median, goes first.
PLAN_LEVELS = (
    (WINDOW_STEPS, ROUNDS, CLOSE_ROUNDS, ()),
    (WINDOW_STEPS, ROUNDS, ROUNDS, (FEWER_CLOSE,)),
    (5, ROUNDS, ROUNDS, (FEWER_CLOSE, FEWER_STEPS)),
    (5, 2, 2, (f"every ratio 2 rounds, not {ROUNDS} or {CLOSE_ROUNDS} (wide intervals)", FEWER_STEPS)),
)
DRY_LEVEL = (1, 2, 3, ())  # the dry run: every path (the extra rounds included) at the least cost


def plan_pairings(allotted_s: float, variants: int, costs: PairingCosts, warmup: int = 2,
                  dry: bool = False) -> PairingPlan:
    """The most of the rules that fits ``allotted_s`` for ``variants`` pairings; when even the last level does not,
    the plan says how many variants it expects to reach (the rest are recorded as ``skipped: budget``)."""
    levels = (DRY_LEVEL,) if dry else PLAN_LEVELS
    for steps, rounds, close_rounds, cuts in levels:
        estimate = variants * costs.variant_s(steps, rounds, close_rounds, warmup)
        if estimate <= allotted_s or (steps, rounds, close_rounds, cuts) == levels[-1]:
            break
    if estimate > allotted_s and variants:
        reached = int(allotted_s / (estimate / variants))
        cuts = (*cuts, f"about {variants - reached} of {variants} variants, the last in measuring order, skipped")
    return PairingPlan(steps, rounds, close_rounds, warmup, variants, estimate, allotted_s, tuple(cuts))


def replan(plan: PairingPlan, costs: PairingCosts, seconds_per_variant: float, left_s: float,
           remaining: int) -> tuple[PairingPlan, PairingCosts]:
    """The plan for the ``remaining`` variants once those measured took ``seconds_per_variant`` each on average:
    the estimates scaled by what they missed by, the levels tried again (a level down when the variants cost more,
    up when less)."""
    estimated = costs.variant_s(plan.steps, plan.rounds, plan.close_rounds, plan.warmup)
    scaled = costs.scaled(seconds_per_variant / estimated) if estimated > 0 else costs
    return plan_pairings(left_s, remaining, scaled, warmup=plan.warmup), scaled


# The first H200 check's figures (docs/performance/gpu.md), from which the docs estimate stage D's plan before a run:
# the eager baseline's isolated step at batch 8 (D's warm-up, 39.7 ms); the compiled one estimated from stage C's
# 41.1 ms at batch 16, halved (the review's 21 ms); a plugin's per-block compile as twice the baseline's 2.1 s (stage
# C) plus a second; building a 124M variant and counting its FLOPs on the meta device, a guess.
FIRST_CHECK_H200 = PairingCosts(eager_step_s=0.0397, compiled_step_s=0.021, compile_s=2 * 2.1 + 1.0, build_s=0.8)
