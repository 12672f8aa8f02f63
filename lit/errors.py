"""Errors a user can fix. The CLI prints their message as one line (no traceback) and exits non-zero."""

import argparse


class UserInputError(Exception):
    """Bad input from the user (a missing file, an inconsistent option); ``str(e)`` says what to do."""


class ArchitectureError(UserInputError, ValueError):
    """An architecture whose parts do not fit together (heads vs width, patch vs image size, RoPE vs head
    width, ...), found where the model is built. A ``ValueError`` too, as code that builds models directly
    may expect; through the CLI it is one ``error:`` line like any other user error."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose mistakes raise ``UserInputError`` (one ``error:`` line from the command)
    instead of printing usage and a message."""

    def error(self, message: str):
        raise UserInputError(f"{message} (see `python {self.prog} --help`)")
