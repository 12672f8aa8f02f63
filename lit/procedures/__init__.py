"""Procedures on a trained model: converting its norms, removing them, folding them into the next linear."""
