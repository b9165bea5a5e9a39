"""The ``hostir`` command line.

Each subcommand is one ``add_<name>_command(subparsers)`` function that declares
its arguments and sets ``handler``, a function ``(args) -> exit code``; adding a
subcommand means writing one such function and listing it in ``COMMANDS``.
Errors print a single ``hostir: error: ...`` line to stderr and exit non-zero.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from hostir import launcher
from hostir.errors import HostIrError

USAGE_ERROR = 2


class CommandError(Exception):
    """A bad command line (missing file, bad count): reported as one line, exit code 2."""


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one ``hostir: error: ...`` line, no usage dump."""

    def error(self, message: str) -> NoReturn:
        """Prints ``message`` as one line and exits with the usage-error code."""
        print_error(message)
        sys.exit(USAGE_ERROR)


def print_error(message: str) -> None:
    """Writes the one-line error report to stderr."""
    print(f"hostir: error: {message}", file=sys.stderr)


def add_run_command(subparsers: argparse._SubParsersAction) -> None:
    """``run SCRIPT --nproc N [--backend gloo|nccl] [-- ARGS...]``: local ranks."""
    parser = subparsers.add_parser(
        "run",
        usage="hostir run SCRIPT --nproc N [--backend {gloo,nccl}] [-- ARGS...]",
        help="run a script as N local ranks",
        description="Run SCRIPT as N local processes, each one rank (torchrun's variables set). "
        "Arguments after -- go to the script.",
    )
    parser.add_argument("script", metavar="SCRIPT", help="the Python script every rank runs")
    parser.add_argument("--nproc", type=int, required=True, help="number of ranks")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.set_defaults(handler=run_command, takes_extra_args=True)


def run_command(args: argparse.Namespace) -> int:
    """Launches the script; the exit code is that of the first rank that failed, else 0."""
    if not os.path.isfile(args.script):
        raise CommandError(f"script not found: {args.script}")
    if args.nproc < 1:
        raise CommandError(f"--nproc must be at least 1, got {args.nproc}")
    code = launcher.launch(args.script, args.nproc, args.extra_args, backend=args.backend)
    return code if code >= 0 else 128 - code  # killed by signal S: exit 128 + S, like a shell


COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (add_run_command,)
"""One entry per subcommand, in the order ``--help`` lists them."""


def build_parser() -> ArgumentParser:
    """The parser with every subcommand of ``COMMANDS``."""
    parser = ArgumentParser(prog="hostir", description="Host IR programs: run, inspect, plan.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in COMMANDS:
        add_command(subparsers)
    return parser


def split_extra_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Splits ``argv`` at the first ``--``: our arguments, then the script's."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def main(argv: list[str] | None = None) -> int:
    """Runs the ``hostir`` command line; returns the process exit code."""
    ours, extra = split_extra_args(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(ours)
    if extra and not getattr(args, "takes_extra_args", False):
        parser.error(f"{args.command} takes no arguments after --")
    args.extra_args = extra
    try:
        return args.handler(args)
    except CommandError as exc:
        print_error(str(exc))
        return USAGE_ERROR
    except HostIrError as exc:
        print_error(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
