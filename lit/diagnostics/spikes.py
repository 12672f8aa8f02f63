"""Loss and gradient-norm spikes, as OLMo-core's StabilityMonitor defines them.

A step's value is compared with the last ``window`` values before it (128): its z-score is
(value - mean) / std (population std). The step's spike score is the larger z-score of the loss and of the
global gradient norm, and 0 when both are below their means; a spike is a score above ``threshold``
(6 sigma), one-sided (a sudden drop is no instability). No score before ``warmup`` values (20) are in a
window, or when a window has no spread. Every finite value enters the window, spikes included, as in
OLMo-core. Pure Python: the state is a few hundred floats, saved in checkpoints so that a resumed run keeps
its window and its count.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any


class SpikeDetector:
    def __init__(self, window: int = 128, threshold: float = 6.0, warmup: int = 20):
        if not 2 <= warmup <= window:
            raise ValueError(f"warmup must be between 2 and the window ({window}), got {warmup}")
        self.window, self.threshold, self.warmup = window, threshold, warmup
        self.history: dict[str, deque[float]] = {"loss": deque(maxlen=window), "grad_norm": deque(maxlen=window)}
        self.count = 0

    def update(self, **values: float | None) -> float:
        """Score this step's values (``loss``, ``grad_norm``; None: not measured), then add them to the windows."""
        score = 0.0
        for name, value in values.items():
            if value is None or not math.isfinite(value):
                continue
            window = self.history[name]
            score = max(score, self._z(value, window))
            window.append(value)
        if score > self.threshold:
            self.count += 1
        return score

    def _z(self, value: float, window: deque[float]) -> float:
        if len(window) < self.warmup:
            return 0.0
        mean = sum(window) / len(window)
        std = math.sqrt(sum((x - mean) ** 2 for x in window) / len(window))
        return (value - mean) / std if std > 1e-12 * max(1.0, abs(mean)) else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"history": {name: list(w) for name, w in self.history.items()}, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, values in state.get("history", {}).items():
            self.history[name] = deque(values, maxlen=self.window)
        self.count = int(state.get("count", 0))
