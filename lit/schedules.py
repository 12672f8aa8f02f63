"""Learning-rate schedules (``--model.schedule``): warmup + cosine, and warmup-stable-decay with cooldown branches.

A schedule is a multiplier of the peak learning rate per optimizer step, a pure function of (step, total steps):

- ``cosine``: linear warmup to 1, cosine decay to ``min_lr_ratio`` at the last step (nanoGPT's).
- ``wsd``: linear warmup, constant, and a cooldown to ``min_lr_ratio`` over the last ``cooldown_fraction`` of
  the run (or the last ``cooldown_steps``), shaped ``linear``, ``1-sqrt`` (Hägele et al. 2024) or ``cosine``.

Because a WSD cooldown is placed from the end of the run, every run of any length is constant until its own
cooldown: a checkpoint from the stable phase of a long run, resumed with a smaller ``--trainer.max_steps``, cools
down exactly as a fresh run of that length would (a cooldown branch; ``docs/optimizers.md``). The multiplier is
a ``functools.partial`` of a module function: ``LambdaLR`` saves no state for it, so a resumed run follows its
own command line's total steps rather than the checkpoint's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

from lit.errors import UserInputError

SCHEDULES = ("cosine", "wsd")
COOLDOWN_SHAPES = {
    "linear": lambda progress: 1.0 - progress,
    "1-sqrt": lambda progress: 1.0 - math.sqrt(progress),
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
}


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: linear warmup to 1, then cosine decay to ``min_lr_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def cooldown_length(total_steps: int, cooldown_fraction: float, cooldown_steps: int | None) -> int:
    return cooldown_steps if cooldown_steps is not None else round(cooldown_fraction * total_steps)


def warmup_stable_decay(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float,
                        cooldown_fraction: float, cooldown_steps: int | None, cooldown_shape: str) -> float:
    """LR multiplier: linear warmup to 1, constant, then the cooldown over the last steps to ``min_lr_ratio``.

    The cooldown's step ``i`` of ``n`` (0-based) has progress ``i / n``: its first step is at the peak, and the
    multiplier would reach ``min_lr_ratio`` one step after the last. A run shorter than warmup plus cooldown
    takes the smaller of the two multipliers.
    """
    warmup = (step + 1) / warmup_steps if step < warmup_steps else 1.0
    n = cooldown_length(total_steps, cooldown_fraction, cooldown_steps)
    start = total_steps - n
    if step < start or n == 0:
        return warmup
    progress = min(1.0, (step - start) / n)
    return min(warmup, min_lr_ratio + (1 - min_lr_ratio) * COOLDOWN_SHAPES[cooldown_shape](progress))


@dataclass(frozen=True)
class WSDOptions:
    cooldown_fraction: float = 0.2
    cooldown_steps: int | None = None
    cooldown_shape: str = "linear"


def check(schedule: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """The schedule's options, complete and checked; a one-line ``UserInputError`` otherwise."""
    options = dict(options or {})
    if schedule == "cosine":
        if options:
            raise UserInputError(f"schedule cosine takes no schedule_options, got {options}; warmup and the final "
                                 f"ratio are --model.warmup_steps and --model.min_lr_ratio")
        return {}
    if schedule != "wsd":
        raise UserInputError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")
    fields = WSDOptions.__dataclass_fields__
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise UserInputError(f"schedule wsd has no option {unknown[0]!r}; its options are {', '.join(fields)}")
    o = WSDOptions(**options)
    if not 0 <= o.cooldown_fraction <= 1:
        raise UserInputError(f"cooldown_fraction is a fraction of the run in [0, 1], got {o.cooldown_fraction}")
    if o.cooldown_steps is not None and not (isinstance(o.cooldown_steps, int) and o.cooldown_steps >= 0):
        raise UserInputError(f"cooldown_steps must be a whole number >= 0 (or null), got {o.cooldown_steps!r}")
    if o.cooldown_shape not in COOLDOWN_SHAPES:
        raise UserInputError(f"cooldown_shape {o.cooldown_shape!r} is not one of {', '.join(COOLDOWN_SHAPES)}")
    return dict(cooldown_fraction=float(o.cooldown_fraction), cooldown_steps=o.cooldown_steps,
                cooldown_shape=o.cooldown_shape)


def multiplier(schedule: str, options: dict[str, Any] | None, *, warmup_steps: int, total_steps: int,
               min_lr_ratio: float) -> partial:
    """The per-step LR multiplier of ``schedule`` for a run of ``total_steps`` optimizer steps."""
    checked = check(schedule, options)
    function = warmup_cosine if schedule == "cosine" else warmup_stable_decay
    return partial(function, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio,
                   **checked)
