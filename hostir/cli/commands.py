"""The subcommands of this package: ``run`` (a script as local ranks), ``dump``, ``viz``,
``check`` and ``traffic`` (each reads a program from a script or a host IR file).

Each is an ``add_<name>_command(subparsers)`` function that declares its arguments and
sets ``handler``, a function ``(args) -> exit code``; ``hostir.cli.COMMANDS`` lists them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from hostir.check.verify import verify_located
from hostir.cli import scripts
from hostir.cli.arguments import (
    in_range,
    integer,
    parse_bindings,
    traffic_world,
    world_size_option,
)
from hostir.cli.errors import FAILURE, CommandError, CommandFailed
from hostir.cli.scripts import ScriptError
from hostir.comm import launcher
from hostir.comm.simulate import MAX_SIMULATED_RANKS
from hostir.comm.simulated_script import run_script
from hostir.comm.world import BACKEND_VARIABLE, BACKENDS
from hostir.errors import HostIrError, ParseError, VerifyError
from hostir.ir.container import HostIrContainer
from hostir.run.evaluator import HostIrEvaluator
from hostir.settings import MAX_WORLD_SIZE, choice_setting

VIZ_FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": "dot", ".gv": "dot"}
"""Output formats of ``viz`` by file extension; ``dot`` writes the graphviz source."""


def add_run_command(subparsers: argparse._SubParsersAction) -> None:
    """``run SCRIPT (--nproc N [--backend gloo|nccl] | --simulate N) [-- ARGS...]``: local
    ranks, or a simulated world of N ranks in this process."""
    parser = subparsers.add_parser(
        "run",
        usage="hostir run SCRIPT (--nproc N [--backend {gloo,nccl}] | --simulate N) [-- ARGS...]",
        help="run a script as N local ranks, or as N simulated ranks in one process",
        description="Run SCRIPT as N local processes, each one rank (torchrun's variables set), "
        "or with --simulate as N ranks of a simulated world in this process (one thread each; "
        "docs/simulated_world.md). Arguments after -- go to the script.",
    )
    parser.add_argument("script", metavar="SCRIPT", help="the Python script every rank runs")
    ranks = parser.add_mutually_exclusive_group(required=True)
    ranks.add_argument(
        "--nproc",
        type=integer,
        help=f"number of ranks (1 to {launcher.MAX_NPROC})",
    )
    ranks.add_argument(
        "--simulate",
        type=integer,
        metavar="N",
        help=f"simulate N ranks in this process (1 to {MAX_SIMULATED_RANKS}); prints the"
        " traffic it measured",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        help="the ranks' backend (default: HOSTIR_BACKEND, else gloo; both given must agree)",
    )
    parser.set_defaults(handler=run_command, takes_extra_args=True)


def launch_backend(option: str | None) -> str:
    """The backend of the ranks ``run`` starts: ``--backend``, else ``HOSTIR_BACKEND``, else
    gloo. The ranks read ``HOSTIR_BACKEND``, which the launcher sets: a user's variable
    used to be replaced silently (even ``nccl`` by gloo), so a value that differs from
    ``--backend`` is refused by name, as is nccl without CUDA."""
    asked = choice_setting(BACKEND_VARIABLE, BACKENDS)  # a bad value: SettingError, exit 2
    if option is not None and asked is not None and option != asked:
        raise CommandError(
            f"--backend {option} conflicts with {BACKEND_VARIABLE}={asked} in the environment:"
            " give one of them, or the same backend in both"
        )
    backend = option or asked or "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        source = "--backend nccl" if option else f"{BACKEND_VARIABLE}=nccl"
        raise CommandError(f"{source} needs CUDA, and this machine has no CUDA device")
    return backend


def run_command(args: argparse.Namespace) -> int:
    """Launches the script; the exit code is that of the first rank that failed, else 0."""
    if args.simulate is not None:
        in_range(args.simulate, "--simulate", 1, MAX_SIMULATED_RANKS)
    else:
        in_range(args.nproc, "--nproc", 1, launcher.MAX_NPROC)
    if not os.path.exists(args.script):
        raise CommandError(f"script not found: {args.script}")
    if not os.path.isfile(args.script):
        raise CommandError(f"script is not a file: {args.script}")
    if args.simulate is not None:
        if args.backend is not None:
            raise CommandError("--backend applies to --nproc: a simulated world has no backend")
        return run_script(args.script, args.simulate, args.extra_args)[0]
    backend = launch_backend(args.backend)
    code = launcher.launch(args.script, args.nproc, args.extra_args, backend=backend)
    return code if code >= 0 else 128 - code  # killed by signal S: exit 128 + S, like a shell


def add_dump_command(subparsers: argparse._SubParsersAction) -> None:
    """``dump SCRIPT|FILE.hir [--world-size N] [--json | --python [--rank R]]``: print the
    program, as text, as JSON, or as the Python it compiles to on one rank."""
    parser = subparsers.add_parser(
        "dump",
        help="print the host IR program of a script or a .hir file",
        description="Print the host IR program of SCRIPT (lowered here: no ranks run) or of "
        "a host IR file.",
    )
    add_program_arguments(parser)
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the program as JSON")
    form.add_argument(
        "--python",
        action="store_true",
        help="print the Python source the program compiles to on rank --rank",
    )
    parser.add_argument(
        "--rank",
        metavar="R",
        type=integer,
        help="with --python: the rank to compile for (default 0; below --world-size)",
    )
    parser.set_defaults(handler=dump_command)


def dump_command(args: argparse.Namespace) -> int:
    """Prints the program's text, or its JSON form."""
    program = load_program(args)
    if args.rank is not None and not args.python:
        raise CommandError("--rank is for --python only")
    if args.python:
        text = compiled_source(program, args.rank, args.world_size)
    elif args.json:
        data = program.to_json()
        text = data if isinstance(data, str) else json.dumps(data, indent=2)
    else:
        text = str(program)  # ends with a newline: the text of a .hir file, as written
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def compiled_source(program: HostIrContainer, rank: int | None, world_size: int | None) -> str:
    """The Python source ``program`` compiles to on ``rank`` (default 0), which must be
    below ``world_size`` when that is given (hostir.run.compiled)."""
    highest = (world_size or MAX_WORLD_SIZE) - 1
    rank = in_range(0 if rank is None else rank, "--rank", 0, highest)
    return HostIrEvaluator(program).compiled_program(rank).source


def add_viz_command(subparsers: argparse._SubParsersAction) -> None:
    """``viz SCRIPT|FILE.hir -o OUT [--traffic [--instruction K]]``: draw the program."""
    parser = subparsers.add_parser(
        "viz",
        help="draw a program with graphviz",
        description="Draw the program of SCRIPT or of a host IR file with graphviz. The "
        "format comes from OUT's extension: .svg, .png, .pdf, or .dot (the graphviz source, "
        "no dot program needed).",
    )
    add_program_arguments(parser)
    parser.add_argument("-o", "--output", metavar="OUT", required=True, help="the file to write")
    parser.add_argument(
        "--traffic", action="store_true", help="draw who sends what to whom, per iteration"
    )
    parser.add_argument(
        "--instruction",
        metavar="K",
        type=int,
        help="with --traffic: the top-level instruction to draw, a communication or a loop "
        "holding some (default: the first)",
    )
    parser.set_defaults(handler=viz_command)


def viz_command(args: argparse.Namespace) -> int:
    """Renders ``to_dot`` (or ``to_traffic_dot``) of the program to ``args.output``."""
    extension = os.path.splitext(args.output)[1].lower()
    if extension not in VIZ_FORMATS:
        known = ", ".join(VIZ_FORMATS)
        raise CommandError(f"cannot tell the format of {args.output}: use one of {known}")
    if args.instruction is not None and not args.traffic:
        raise CommandError("--instruction needs --traffic")
    program = load_program(args)
    from hostir.viz.dot import to_dot, to_traffic_dot  # graphviz: imported only when drawing

    if args.traffic:
        traffic_world(args.world_size, program)  # refuses a world too large to draw
        graph = to_traffic_dot(
            program, instruction_index=args.instruction, world_size=args.world_size
        )
    else:
        graph = to_dot(program, title=os.path.basename(args.program))
    data = render(graph, VIZ_FORMATS[extension])
    with open(args.output, "wb") as file:
        file.write(data)
    print(f"wrote {args.output}")
    return 0


def render(graph, fmt: str) -> bytes:
    """The graph in format ``fmt``: its source for ``dot``, else the output of graphviz."""
    if fmt == "dot":
        return graph.source.encode()
    import graphviz

    try:
        return graph.pipe(format=fmt)
    except graphviz.ExecutableNotFound:
        raise CommandFailed(
            "graphviz's 'dot' program was not found: install graphviz (e.g. apt-get install"
            " graphviz), or write the source with -o OUT.dot"
        ) from None
    except graphviz.CalledProcessError as error:
        detail = (error.stderr or b"").decode(errors="replace").strip().splitlines()
        raise CommandFailed(
            f"dot failed (exit code {error.returncode})" + (f": {detail[-1]}" if detail else "")
        ) from None


def add_check_command(subparsers: argparse._SubParsersAction) -> None:
    """``check SCRIPT|FILE.hir [--world-size N]``: parse (or lower) and verify a program."""
    parser = subparsers.add_parser(
        "check",
        help="parse and verify a .hir file, or lower and verify a script's fusion",
        description="Parse and verify host IR text (hostir.check.verify), or lower a script's "
        "fusion(world_size) and verify the program. Prints 'FILE: ok (N instructions)', or "
        "'FILE:LINE:COL: message' (text) or 'FILE: message' (script) on stderr and exits 1.",
    )
    add_program_arguments(parser)
    parser.set_defaults(handler=check_command)


def check_command(args: argparse.Namespace) -> int:
    """Exit code 0 if the program parses (or lowers) and verifies; else 1, with
    ``FILE:LINE:COL: message`` for text and ``FILE: message`` for a script."""
    path = args.program
    require_file(path)
    world_size_option(args.world_size)
    try:
        program = scripts.load_program(path, args.world_size)
        if scripts.is_script(path):
            verify_located(program)  # a script may return a program it built by hand
    except ScriptError as error:  # a script's refusal, its message names the script
        print(f"{error}", file=sys.stderr)
        return FAILURE
    except (ParseError, VerifyError) as error:
        if getattr(error, "line", None) is None:
            print(f"{path}: {error}", file=sys.stderr)
        else:
            print(f"{path}:{error}", file=sys.stderr)  # the message reads "LINE:COL: ..."
        return FAILURE
    except HostIrError as error:  # a mesh that does not fit the world
        print(f"{error}", file=sys.stderr)
        return FAILURE
    print(f"{path}: ok ({scripts.instruction_count(program.body)} instructions)")
    return 0


def add_traffic_command(subparsers: argparse._SubParsersAction) -> None:
    """``traffic SCRIPT|FILE.hir --world-size N [--bind NAME=VALUE ...]``: bytes per rank."""
    parser = subparsers.add_parser(
        "traffic",
        help="count the bytes each rank sends and receives, without running",
        description="Count, from each collective's exchange function, the bytes each of N "
        "ranks sends and receives in the program (every loop iteration), and print the "
        "summary: min, median and max per rank, the busiest link, and each communication.",
    )
    add_program_arguments(parser)
    parser.add_argument(
        "--bind",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="the value of a symbolic extent (i0=128); repeat for several",
    )
    parser.set_defaults(handler=traffic_command)


def traffic_command(args: argparse.Namespace) -> int:
    """Prints ``traffic_report`` of the program at ``--world-size`` ranks."""
    from hostir.analysis.traffic import count_traffic, traffic_report

    program = load_program(args)
    bindings = parse_bindings(args.bind, program)
    world = traffic_world(args.world_size, program)
    print(f"traffic of {args.program} at {world} ranks (from the exchange functions; not run)")
    print(traffic_report(count_traffic(program, world, bindings)))
    return 0


def add_program_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of the commands that read a program: the file and ``--world-size``."""
    parser.add_argument(
        "program",
        metavar="SCRIPT|FILE.hir",
        help="a .py script defining fusion(world_size), or host IR text",
    )
    parser.add_argument(
        "--world-size",
        metavar="N",
        type=integer,
        help="the world size passed to a script's fusion (default: its own default, else "
        f"{scripts.DEFAULT_WORLD_SIZE}); the program must fit it",
    )


def load_program(args: argparse.Namespace) -> HostIrContainer:
    """The program named by ``args.program``, checked against ``args.world_size``."""
    require_file(args.program)
    world_size_option(args.world_size)
    try:
        return scripts.load_program(args.program, args.world_size)
    except ParseError as error:
        raise HostIrError(f"{args.program}:{error}") from error


def require_file(path: str) -> None:
    """Raises CommandError unless ``path`` is an existing file."""
    if not os.path.exists(path):
        raise CommandError(f"file not found: {path}")
    if not os.path.isfile(path):
        raise CommandError(f"not a file: {path}")
