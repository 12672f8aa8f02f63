"""Errors a user can fix. The CLI prints their message as one line (no traceback) and exits non-zero."""


class UserInputError(Exception):
    """Bad input from the user (a missing file, an inconsistent option); ``str(e)`` says what to do."""
