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
