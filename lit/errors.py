"""Errors a user can fix, and the one way every command reports them: one ``error:`` line, exit code 2."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import TypeVar

from arch_plugins.registry import PluginError

USER_ERROR_EXIT_CODE = 2


class UserInputError(Exception):
    """Bad input from the user (a missing file, an inconsistent option); ``str(e)`` says what to do."""


class ArchitectureError(UserInputError, ValueError):
    """An architecture whose parts do not fit together (heads vs width, patch vs image size, RoPE vs head
    width, ...), found where the model is built. A ``ValueError`` too, as code that builds models directly
    may expect; through the CLI it is one ``error:`` line like any other user error."""


class StorageFullError(UserInputError):
    """The disk or the quota filled while a file was written (a checkpoint); the message names what is intact and
    how to go on. The user fixes it by freeing space, so it is reported like bad input: one line, exit code 2."""


USER_ERRORS = (PluginError, UserInputError)


class OneLineArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose mistakes raise ``UserInputError`` (one ``error:`` line from the command)
    instead of printing usage and a message."""

    def error(self, message: str):
        raise UserInputError(f"{message} (see `python {self.prog} --help`)")


def find_cause(exc: BaseException | None, types: type | tuple[type, ...]) -> BaseException | None:
    """The first exception of ``types`` in ``exc``'s cause chain (``exc`` included), or None: libraries
    (jsonargparse, Lightning) wrap the errors raised in code they call."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, types):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def user_error(exc: BaseException | None) -> BaseException | None:
    """The user error behind ``exc``, or None."""
    return find_cause(exc, USER_ERRORS)


def report(exc: BaseException) -> int:
    """Print the user error behind ``exc`` as one ``error:`` line and return the exit code 2; re-raise ``exc``
    if it is not a user error (a bug keeps its traceback).

    Only the first process of a multi-process run prints: every process hits the same error.
    """
    cause = user_error(exc)
    if cause is None:
        raise exc
    if _rank() == 0:
        sys.stderr.write(f"error: {' '.join(str(cause).split())}\n")
    return USER_ERROR_EXIT_CODE


Command = TypeVar("Command", bound=Callable[..., int])


def one_line_errors(command: Command) -> Command:
    """Wrap a command (``main(argv) -> exit code``): a user error becomes one ``error:`` line and exit code 2."""

    @functools.wraps(command)
    def wrapped(*args, **kwargs) -> int:
        try:
            return command(*args, **kwargs)
        except Exception as exc:
            return report(exc)

    return wrapped  # type: ignore[return-value]


def _rank() -> int:
    # Lightning's own record once it runs (its strategies set it); else the launcher's variables, read as
    # Lightning reads them, without importing Lightning (a command such as `plugins` must start fast).
    rank_zero = sys.modules.get("lightning_utilities.core.rank_zero")
    rank = getattr(getattr(rank_zero, "rank_zero_only", None), "rank", None)
    if rank is not None:
        return rank
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0
