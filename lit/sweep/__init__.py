"""Sweeps: a grid of variants x seeds (with a learning rate tuned per variant), launched and tracked in MLflow."""
