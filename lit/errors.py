"""Errors a user can fix. The CLI prints their message as one line (no traceback) and exits non-zero."""

import argparse


class UserInputError(Exception):
    """Bad input from the user (a missing file, an inconsistent option); ``str(e)`` says what to do."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose mistakes raise ``UserInputError`` (one ``error:`` line from the command)
    instead of printing usage and a message."""

    def error(self, message: str):
        raise UserInputError(f"{message} (see `python {self.prog} --help`)")
