"""Parametrizations: how init, per-role optimizer multipliers and the stack's multipliers follow width and depth."""
