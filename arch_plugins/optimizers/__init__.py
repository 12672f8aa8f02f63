"""Optimizers selected by ``--model.optimizer`` (entry-point group ``arch_plugins.optimizer``), routed by role."""
