"""The ``hostir`` command line.

Each subcommand is one ``add_<name>_command(subparsers)`` function that declares
its arguments and sets ``handler``, a function ``(args) -> exit code``; adding a
subcommand means writing one such function (this package's are in
``hostir.cli.commands``) and listing it in ``COMMANDS``.

Errors (``hostir.cli.errors``) print a single ``hostir: error: ...`` line to stderr,
never a traceback: exit code 2 for a bad command line or setting (unknown option,
missing file, a value out of range: a SettingError), 1 for a bad program or script
and for a failure (another HostIrError, an OSError, anything else).
``HOSTIR_TRACEBACK=1`` re-raises instead, for debugging. Programs come from files
through ``hostir.cli.scripts``: a ``.py`` SCRIPT defines ``fusion(world_size)``, any
other file is host IR text. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Callable

from hostir.cli.commands import (
    add_check_command,
    add_dump_command,
    add_run_command,
    add_traffic_command,
    add_viz_command,
)
from hostir.cli.errors import (
    FAILURE,
    USAGE_ERROR,
    ArgumentParser,
    CommandError,
    CommandFailed,
    print_error,
)
from hostir.errors import HostIrError, SettingError
from hostir.settings import flag_setting

TRACEBACK_VARIABLE = "HOSTIR_TRACEBACK"


COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    add_run_command,
    add_dump_command,
    add_viz_command,
    add_check_command,
    add_traffic_command,
)
"""One entry per subcommand of this package, in the order ``--help`` lists them."""

PLUGIN_GROUP = "hostir.commands"
"""The entry point group through which other packages add subcommands: each entry point
names an ``add_<name>_command(subparsers)`` function (``lowering`` adds ``plan`` this way,
so this package never imports ``lowering``)."""


def plugin_commands() -> list[Callable[[argparse._SubParsersAction], None]]:
    """The subcommand declarations other installed packages provide, by entry point name;
    one that cannot be loaded becomes a command that says why."""
    found = []
    for entry in sorted(importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            found.append(entry.load())
        except Exception as error:  # noqa: BLE001 - a broken plugin must not break the CLI
            found.append(_unloadable(entry.name, entry.value, error))
    return found


def _unloadable(name: str, value: str, error: Exception) -> Callable:
    def add_command(subparsers: argparse._SubParsersAction) -> None:
        def fail(args: argparse.Namespace) -> int:
            raise CommandFailed(f"the {name} command ({value}) could not be loaded: {error}")

        parser = subparsers.add_parser(name, help=f"(unavailable: {value} failed to load)")
        parser.set_defaults(handler=fail)

    return add_command


def build_parser() -> ArgumentParser:
    """The parser with every subcommand of ``COMMANDS`` and of the plugins."""
    parser = ArgumentParser(prog="hostir", description="Host IR programs: run, inspect, plan.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in (*COMMANDS, *plugin_commands()):
        add_command(subparsers)
    return parser


def split_extra_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Splits ``argv`` at the first ``--``: our arguments, then the script's."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def main(argv: list[str] | None = None) -> int:
    """Runs the ``hostir`` command line; returns the process exit code.

    Whatever goes wrong is one ``hostir: error:`` line, never a traceback, unless
    ``HOSTIR_TRACEBACK=1`` asks for it.
    """
    try:
        traceback_wanted()  # a bad value is refused before it decides how errors look
    except SettingError as error:
        print_error(str(error))
        return USAGE_ERROR
    try:
        return run_main(argv)
    except Exception as error:
        if traceback_wanted():
            raise
        print_error(
            f"internal error: {type(error).__name__}: {one_line(error)}"
            f" (set {TRACEBACK_VARIABLE}=1 for the traceback)"
        )
        return FAILURE


def traceback_wanted() -> bool:
    """Whether ``HOSTIR_TRACEBACK=1`` asks errors to propagate with their traceback (``0``
    or unset: no; SettingError for any other value)."""
    return flag_setting(TRACEBACK_VARIABLE)


def one_line(error: BaseException) -> str:
    """The error's message on one line."""
    return " ".join(str(error).split()) or "(no message)"


def run_main(argv: list[str] | None) -> int:
    """Parses the command line and runs the handler, reporting the expected errors."""
    ours, extra = split_extra_args(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(ours)
    if extra and not getattr(args, "takes_extra_args", False):
        parser.error(f"{args.command} takes no arguments after --")
    args.extra_args = extra
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. ``hostir dump ... | head``: not worth a message
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return FAILURE
    except (CommandError, CommandFailed, HostIrError, OSError) as error:
        if traceback_wanted():
            raise
        print_error(describe(error))
        return USAGE_ERROR if isinstance(error, CommandError | SettingError) else FAILURE


def describe(error: Exception) -> str:
    """The one-line message for an expected error."""
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{error.strerror}"
    return one_line(error)


if __name__ == "__main__":
    sys.exit(main())
