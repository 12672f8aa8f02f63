"""Every ``python cli.py SUBCOMMAND``, in one table: where it lives and one line of help.

A command is a function ``main(argv) -> exit code`` in some module, imported only when it is run, so
``python cli.py plugins`` or ``--help`` answer without importing torch, Lightning or MLflow. A user error
that escapes a command becomes one ``error:`` line and exit code 2 (``lit.errors.one_line_errors``).

To add a command, add one row to ``COMMANDS``.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from dataclasses import dataclass
from typing import Any

from lit.errors import USER_ERROR_EXIT_CODE, UserInputError, one_line_errors
from lit.lazy_imports import install as install_lazy_imports


@dataclass(frozen=True)
class Command:
    target: str  # "module:function"; the function takes the arguments after the subcommand
    help: str
    with_name: bool = False  # the function takes the subcommand too (LightningCLI parses its own subcommands)


LIGHTNING = "lit.cli:main"
COMMANDS: dict[str, Command] = {
    "fit": Command(LIGHTNING, "train a model from a recipe (--config recipes/NAME.yaml)", with_name=True),
    "validate": Command(LIGHTNING, "evaluate a checkpoint on the validation data", with_name=True),
    "test": Command(LIGHTNING, "evaluate a checkpoint on the test data", with_name=True),
    "predict": Command(LIGHTNING, "sample from a checkpoint (language models) or predict", with_name=True),
    "plugins": Command("lit.plugins_command:main", "list the installed plugins, or show one with its options"),
    "sweep": Command("lit.sweep.command:main", "train variants of a recipe over seeds, optionally tuning one value"),
    "compare": Command("lit.compare.command:main", "report a sweep: paired tests, intervals, plots"),
    "convert-norm": Command("lit.procedures.convert_norm:main", "convert a trained model's norms to another kind"),
    "remove-norms": Command("lit.procedures.remove_norms:main", "fine-tune a trained model until its norms are gone"),
    "layer-skip": Command("lit.procedures.layer_skip:main", "validation loss with each block or sublayer skipped"),
    "export": Command("lit.checkpoints:main", "turn a sharded checkpoint directory into one checkpoint file"),
    "sync": Command("lit.tracking.sync:main", "send metrics kept while the tracking server was away, or copy a run"),
    "train-tokenizer": Command("lit.data.tokenizer_training:main", "train a byte-level BPE tokenizer on a corpus"),
    "prepare-data": Command("lit.data.prepare:main", "tokenize a corpus (text, JSONL, parquet) into token shards"),
    "prepare-images": Command("lit.data.prepare_images:main", "pack an image folder into tar shards with an index"),
    "import-hf": Command("lit.interop.import_hf:main", "turn a local HF folder (GPT-2, Llama) into a checkpoint"),
    "export-hf": Command("lit.interop.llama:main", "write a baseline-family checkpoint as a Hugging Face Llama folder"),
    "lm-eval": Command("lit.evaluation.command:main", "score a language-model checkpoint on lm-eval harness tasks"),
    "coord-check": Command("lit.scale.coord_check_command:main",
                           "check a parametrization: layer scales against width or depth, figure and slopes"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name.ljust(width)}  {command.help}" for name, command in COMMANDS.items())
    return (f"usage: python cli.py SUBCOMMAND [options]\n\n{rows}\n\n"
            "`python cli.py SUBCOMMAND --help` shows a subcommand's options.")


def main(argv: list[str] | None = None) -> Any:
    """Run the subcommand ``argv[0]``; a non-zero exit code ends the process (``SystemExit``), anything else
    the command returns is returned (``fit`` returns its LightningCLI)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    result = _dispatch(argv)
    if isinstance(result, int) and not isinstance(result, bool) and result:
        sys.exit(result)
    return result


@one_line_errors
def _dispatch(argv: list[str]) -> Any:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else USER_ERROR_EXIT_CODE
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UserInputError(f"unknown subcommand '{name}'{hint} `python cli.py --help` lists them")
    command = COMMANDS[name]
    module, function = command.target.split(":")
    install_lazy_imports()  # before anything imports Lightning: torchmetrics then skips scipy, torchvision, matplotlib
    run = getattr(importlib.import_module(module), function)
    try:
        return run(argv if command.with_name else rest)
    except SystemExit as done:  # argparse's --help, or a command that exits itself
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        raise
