"""Training throughput from wall time between consecutive steps (data, forward, backward, update)."""

from __future__ import annotations

import time


class StepRate:
    """Items per second over the last step; reset when the step sequence is interrupted (validation)."""

    def __init__(self):
        self._last: float | None = None

    def reset(self) -> None:
        self._last = None

    def tick(self, items: int) -> float | None:
        """Call once per training step with the items it processed; None on the first step after a reset."""
        now = time.perf_counter()
        rate = items / (now - self._last) if self._last is not None else None
        self._last = now
        return rate
