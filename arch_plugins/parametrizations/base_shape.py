"""The base shape a parametrization scales from: the width and depth at which hyperparameters were tuned."""

from __future__ import annotations

from arch_plugins.interfaces import StackInfo


def width_multiplier(stack: StackInfo, base_width: int | None) -> float:
    """m_d = d_model / base_width (1 when no base width is set: the model is its own base)."""
    return 1.0 if base_width is None else stack.d_model / base_width


def depth_multiplier(stack: StackInfo, base_depth: int | None) -> float:
    """m_L = n_layers / base_depth (1 when no base depth is set)."""
    return 1.0 if base_depth is None else stack.num_layers / base_depth


def base_shape_head_dim(base_width: int | None, base_head_dim: int | None, base_heads: int | None) -> int | None:
    """The base model's head size, from ``base_head_dim`` or ``base_width / base_heads``; required with a base width.

    The target's head count cannot stand in for the base's: widened at a fixed head size (more heads), it would
    shrink the attention scale by sqrt(base_width / d_model) although the head size never changed."""
    if base_head_dim is not None and base_heads is not None:
        raise ValueError(f"set base_head_dim or base_heads, not both (got base_head_dim={base_head_dim}, "
                         f"base_heads={base_heads})")
    if base_width is None:
        if base_heads is not None:
            raise ValueError("base_heads needs base_width (the base head size is base_width / base_heads)")
        return base_head_dim
    if base_head_dim is None and base_heads is None:
        raise ValueError(f"base_width={base_width} needs the base model's head size for the attention rule: set "
                         f"base_head_dim (widening at a fixed head size, more heads) or base_heads (widening at a "
                         f"fixed number of heads) in parametrization_options")
    if base_heads is not None:
        if base_width % base_heads:
            raise ValueError(f"base_width={base_width} is not divisible by base_heads={base_heads}")
        return base_width // base_heads
    return base_head_dim


def positive(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be a positive integer (the width or depth the learning rate was tuned at), "
                         f"got {value!r}")


def known_rules(name: str, without: list[str] | tuple[str, ...], rules: tuple[str, ...]) -> frozenset[str]:
    unknown = sorted(set(without) - set(rules))
    if unknown:
        raise ValueError(f"{name} has no rule {', '.join(unknown)} to leave out; its rules are: {', '.join(rules)}")
    return frozenset(without)
