"""What the diagnostics callback records and how often: ``--model.diagnostics.*`` on the command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Group = Literal["stream", "grads", "attention", "scalars", "spikes", "outliers", "contribution"]
GROUPS: tuple[str, ...] = ("stream", "grads", "attention", "scalars", "spikes", "outliers", "contribution")


@dataclass
class DiagnosticsConfig:
    """Diagnostics of a training run, logged as ``diag/*`` metrics of its MLflow run.

    Args:
        interval: record every this many optimizer steps (steps 0, interval, 2 interval, ... and the end of
            training); 0 turns diagnostics off entirely (no callback, no hook).
        record: which groups: ``stream`` (residual-stream and branch RMS by depth), ``grads`` (gradient, weight
            and update/weight norms per block and role), ``attention`` (entropy and max logit per layer),
            ``scalars`` (learned scalars that plugins declare), ``spikes`` (loss and gradient-norm spike score
            and count; measured every step, logged at the interval and on every spike), ``outliers`` (excess
            kurtosis and max/median |activation| of the stream by depth, Outlier-Safe Pre-Training's measure),
            ``contribution`` (each sublayer's branch against the stream: norm ratio and cosine; the stream's
            cosine before and after each sublayer).
        probe_batch_size: samples of the fixed probe batch (the first of the first training batch this run
            sees, kept in checkpoints) for ``stream``, ``attention``, ``outliers`` and ``contribution``.
    """

    interval: int = 100
    record: list[Group] = field(default_factory=lambda: list(GROUPS))
    probe_batch_size: int = 8

    def __post_init__(self) -> None:
        from lit.errors import UserInputError

        if self.interval < 0:
            raise UserInputError(f"diagnostics.interval must be >= 0 (0 turns diagnostics off), got {self.interval}")
        if self.probe_batch_size < 1:
            raise UserInputError(f"diagnostics.probe_batch_size must be >= 1, got {self.probe_batch_size}")
        unknown = sorted(set(self.record) - set(GROUPS))
        if unknown:
            raise UserInputError(f"diagnostics.record: unknown group(s) {unknown}; choose among {list(GROUPS)}")

    @property
    def enabled(self) -> bool:
        return self.interval > 0 and bool(self.record)
