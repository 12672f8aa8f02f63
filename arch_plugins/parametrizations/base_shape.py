"""The base shape a parametrization scales from: the width and depth at which hyperparameters were tuned."""

from __future__ import annotations

from arch_plugins.interfaces import StackInfo


def width_multiplier(stack: StackInfo, base_width: int | None) -> float:
    """m_d = d_model / base_width (1 when no base width is set: the model is its own base)."""
    return 1.0 if base_width is None else stack.d_model / base_width


def depth_multiplier(stack: StackInfo, base_depth: int | None) -> float:
    """m_L = n_layers / base_depth (1 when no base depth is set)."""
    return 1.0 if base_depth is None else stack.num_layers / base_depth


def positive(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be a positive integer (the width or depth the learning rate was tuned at), "
                         f"got {value!r}")


def known_rules(name: str, without: list[str] | tuple[str, ...], rules: tuple[str, ...]) -> frozenset[str]:
    unknown = sorted(set(without) - set(rules))
    if unknown:
        raise ValueError(f"{name} has no rule {', '.join(unknown)} to leave out; its rules are: {', '.join(rules)}")
    return frozenset(without)
