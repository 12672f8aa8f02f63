"""The command line wins over a ``--ckpt_path``'s hyperparameters, or says why it cannot.

Lightning's CLI reads the hyperparameters a checkpoint was trained with and parses them over the command line
(``LightningCLI._parse_ckpt_path``), so ``predict --ckpt_path=... --model.max_new_tokens=5`` sampled the
checkpoint's 200 tokens and ``test`` with another model shape scored the checkpoint's model, both without a word.
Here every ``--model.*`` flag the user typed is put back after that merge, with one exception: an option that
defines the weights (the task's ``ARCHITECTURE_OPTIONS``: ``arch`` and the like) cannot differ from the
checkpoint's, and a flag that asks for another value is one line naming both.

Only flags typed on the command line count: a recipe's values (``--config``) are the defaults the checkpoint's
own hyperparameters replace, as before.
"""

from __future__ import annotations

import importlib
from typing import Any

from lit.errors import UserInputError

MODEL_FLAG = "--model."


def model_flags(args: list[str]) -> list[tuple[str, str]]:
    """``(flag as typed, option path under init_args)`` for each ``--model.*`` option in ``args``, the last flag of
    an option given twice (the one the parser keeps); ``--model.arch.d_model=64`` and ``--model.arch.d_model 64``
    alike, ``--model.init_args.x`` is ``x``."""
    flags: dict[str, str] = {}
    for token in args:
        if not token.startswith(MODEL_FLAG):
            continue
        key = token[len(MODEL_FLAG):].split("=", 1)[0]
        key = key.removeprefix("init_args.")
        if key and key not in ("class_path", "dict_kwargs"):
            flags.pop(key, None)
            flags[key] = token
    return [(token, key) for key, token in flags.items()]


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    if hasattr(value, "items") and not isinstance(value, dict):  # a jsonargparse Namespace: its leaves, dotted
        return {f"{prefix}.{k}": v for k, v in value.items()}
    return {prefix: value}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):  # a checkpoint stores tuples as lists
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def architecture_options(class_path: str) -> tuple[str, ...]:
    module, _, name = class_path.rpartition(".")
    task = getattr(importlib.import_module(module), name, None)
    return tuple(getattr(task, "ARCHITECTURE_OPTIONS", ("arch",)))


def apply(typed: Any, merged: Any, args: list[str], checkpoint: str) -> Any:
    """``merged`` (a subcommand's config after the checkpoint's hyperparameters were parsed over it) with the
    value of every ``--model.*`` flag in ``args`` taken back from ``typed`` (the same config before the merge).

    Raises UserInputError where a flag asks for another value of an option that defines the weights."""
    flags = model_flags(args)
    if not flags:
        return merged
    fixed = architecture_options(merged["model.class_path"])
    for token, key in flags:
        path = f"model.init_args.{key}"
        if path not in typed or path not in merged:
            continue  # not an option of this task: the parser has already said so, or will
        wanted, held = typed[path], merged[path]
        if _same(wanted, held):
            continue
        if key.split(".", 1)[0] in fixed:
            theirs = _leaves(held, key)
            differ = [k for k, v in _leaves(wanted, key).items() if not _same(v, theirs.get(k))]
            shown = differ[0] if differ else key
            raise UserInputError(
                f"{token} contradicts the checkpoint {checkpoint}, whose model has {shown}="
                f"{theirs.get(shown, held)!r} (asked: {_leaves(wanted, key).get(shown, wanted)!r}); drop the flag "
                f"to evaluate the checkpoint's model, or start a new run from its weights with --model.init_from")
        merged[path] = wanted
    return merged
