"""Procedures on a trained model: converting its norms, removing them, folding them into the next linear,
measuring how it uses its depth (skipping its layers).

Each command's module has ``main(argv) -> exit code``; ``lit/commands.py`` names them as subcommands.
"""
