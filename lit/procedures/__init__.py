"""Procedures on a trained model: converting its norms, removing them, folding them into the next linear,
measuring how it uses its depth (skipping its layers).

Each command's module has ``main(argv) -> exit code``; ``run`` turns a user error into one ``error:`` line.
"""

from __future__ import annotations

import importlib
import sys

# Subcommand -> module under lit.procedures with its ``main``.
COMMANDS = {"convert-norm": "convert_norm", "remove-norms": "remove_norms", "layer-skip": "layer_skip"}


def run(command: str, argv: list[str]) -> int:
    from lit.errors import UserInputError

    try:
        return importlib.import_module(f"lit.procedures.{COMMANDS[command]}").main(argv)
    except UserInputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
