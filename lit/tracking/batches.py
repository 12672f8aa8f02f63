"""MLflow's limits per ``log_batch`` request, and the one way this package splits what it sends to fit them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_LENGTH = 6000  # characters of one param value; Lightning's own log_hyperparams truncates to 250

T = TypeVar("T")


def batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for i in range(0, len(items), size):
        yield items[i:i + size]
