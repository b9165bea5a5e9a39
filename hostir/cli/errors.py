"""How the ``hostir`` command line fails: its exit codes, the errors it reports as one
``hostir: error: ...`` line, and an argparse parser whose own errors are one such line."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

FAILURE = 1
USAGE_ERROR = 2


class CommandError(Exception):
    """A bad command line (missing file, bad count): reported as one line, exit code 2."""


class CommandFailed(Exception):
    """A failure outside the program (a missing tool): reported as one line, exit code 1."""


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one ``hostir: error: ...`` line, no usage dump."""

    def error(self, message: str) -> NoReturn:
        """Prints ``message`` as one line and exits with the usage-error code."""
        print_error(message)
        sys.exit(USAGE_ERROR)


def print_error(message: str) -> None:
    """Writes the one-line error report to stderr."""
    print(f"hostir: error: {message}", file=sys.stderr)
