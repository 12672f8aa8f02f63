"""Weight-decay exceptions: declared in ``arch_plugins.declarations`` (this path keeps old imports working)."""

from arch_plugins.declarations import decays, declare_weight_decay, declared_weight_decay

__all__ = ["declare_weight_decay", "declared_weight_decay", "decays"]
