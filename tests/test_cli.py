"""The ``hostir`` console script: ``dump``, ``viz``, ``check`` and ``run``.

Most tests run ``python -m hostir.cli`` (one the installed ``hostir``
executable, a fresh process) from the repository root, on the files of
``tests/data/cli_*``, and check the exit code, the output and that errors are
one line without a traceback. They go through the session's ``child_runs``
(tests/child_runs.py): ``python -m hostir.cli`` is a fork of its fork server,
which has imported torch once, so each costs milliseconds instead of a second.
The last section calls ``cli.main`` in this process, for the cases that need
no process of their own.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import re
import shutil
from collections.abc import Callable

import pytest

from hostir import cli, parse
from hostir.cli import scripts
from tests.child_runs import Python, Result, Run, Scheduler
from tests.hostir.test_dot import needs_dot
from tests.multidevice import launched_by_torchrun
from tests.test_docs import Fence, parse_markdown

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = pathlib.Path("tests/data")  # relative: messages name files as given
SCRIPT = str(DATA / "cli_column_parallel.py")
HIR = str(DATA / "cli_column_parallel.hir")
BROKEN = str(DATA / "cli_broken.hir")
NO_FUSION = str(DATA / "cli_no_fusion.py")

pytestmark = pytest.mark.skipif(
    launched_by_torchrun() and os.environ.get("RANK") != "0",
    reason="starts its own processes: runs on rank 0 only",
)


@pytest.fixture
def hostir(child_runs: Scheduler, request: pytest.FixtureRequest) -> Callable[..., Result]:
    """``hostir(*args, command=None, **env)`` runs ``python -m hostir.cli ARGS`` (or the
    fresh process ``command ARGS``) from the repository root, with ``env`` added to a
    plain environment (tests/child_runs.py), and returns its Result."""
    calls = itertools.count()

    def run(*args: str, command: tuple[str, ...] | None = None, **env: str) -> Result:
        program = Python("module", "hostir.cli", args) if command is None else (*command, *args)
        ranks = int(args[args.index("--nproc") + 1]) if "--nproc" in args else 1
        name = f"{request.node.nodeid} #{next(calls)}"
        return child_runs.result(Run(name, program, ranks=ranks, env=tuple(env.items())))

    return run


def assert_one_line_error(done, code: int, *fragments: str) -> None:
    """Exit code ``code`` and one ``hostir: error:`` line holding every fragment."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("hostir: error: ") and done.stderr.count("\n") == 1, done.stderr
    for fragment in fragments:
        assert fragment in done.stderr


# ---------------------------------------------------------------------------
# dump


def test_dump_script_lowers_without_ranks(hostir):
    done = hostir("dump", SCRIPT)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("%HostIrContainer {\n  mesh M0 = [2] : [1]\n")  # world size 2
    for line in ("CollectivePermute(T0, team=M0(x)", "shard_by_stream(T4", "linear(T3_c, T1"):
        assert line in text
    assert text.rstrip("\n").endswith("output T4\n}")


def test_dump_script_world_size_is_passed_to_fusion(hostir):
    done = hostir("dump", SCRIPT, "--world-size", "4")
    assert done.returncode == 0, done.stderr
    assert "mesh M0 = [4] : [1]" in done.stdout and "range(0, 4)" in done.stdout


def test_dump_hir_file_prints_the_file(hostir):
    done = hostir("dump", HIR)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (REPO_ROOT / HIR).read_text()


def test_dump_json_is_a_versioned_document(hostir):
    done = hostir("dump", HIR, "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert isinstance(document, dict) and "version" in document


def test_dump_missing_file(hostir):
    done = hostir("dump", "tests/data/cli_no_such_file.py")
    assert_one_line_error(done, 2, "file not found: tests/data/cli_no_such_file.py")


def test_dump_script_without_fusion_says_what_to_add(hostir):
    done = hostir("dump", NO_FUSION)
    assert done.returncode == 1 and done.stdout == ""  # the script's print went to stderr
    assert "Traceback" not in done.stderr
    *script_output, error = done.stderr.splitlines()
    assert script_output == ["cli_no_fusion.py imported"]
    assert error.startswith(f"hostir: error: {NO_FUSION}: defines no function 'fusion'")
    assert "def fusion(world_size: int) -> FusionDefinition" in error


# ---------------------------------------------------------------------------
# viz


@needs_dot
def test_viz_svg(hostir, tmp_path):
    out = tmp_path / "program.svg"
    done = hostir("viz", SCRIPT, "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_text().lstrip().startswith(("<svg", "<?xml"))
    assert "CollectivePermute" in out.read_text()


@needs_dot
def test_viz_traffic_svg_with_the_installed_executable(hostir, tmp_path):
    executable = shutil.which("hostir")
    if executable is None:
        pytest.skip("the hostir console script is not installed (pip install -e .)")
    out = tmp_path / "traffic.svg"
    done = hostir("viz", HIR, "-o", str(out), "--traffic", command=(executable,))
    assert done.returncode == 0, done.stderr
    assert out.read_text().lstrip().startswith(("<svg", "<?xml"))


def test_viz_without_graphviz_says_to_install_it(hostir, tmp_path):
    done = hostir("viz", HIR, "-o", str(tmp_path / "p.svg"), PATH=str(tmp_path))  # no dot
    assert_one_line_error(done, 1, "install graphviz")


# ---------------------------------------------------------------------------
# check


def test_check_ok(hostir):
    done = hostir("check", HIR)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{HIR}: ok (14 instructions)\n"


def test_check_lowers_and_verifies_a_script(in_repo, capsys):
    """``check SCRIPT`` counts the instructions of the program ``dump SCRIPT`` prints."""
    assert main("dump", SCRIPT, "--world-size", "2") == 0
    dumped = parse(capsys.readouterr().out)
    assert main("check", SCRIPT, "--world-size", "2") == 0
    count = scripts.instruction_count(dumped.body)
    assert count > 3 and capsys.readouterr().out == f"{SCRIPT}: ok ({count} instructions)\n"


UNVERIFIED_SCRIPT = """
from hostir import parse

# a program built in Python, not parsed: its second output is never defined
GOOD = "%HostIrContainer {\\n  mesh M0 = [0]\\n  input T0 : float32[4] @M0\\n  output T0\\n}\\n"

def fusion(world_size=1):
    import dataclasses
    program = parse(GOOD)
    ghost = dataclasses.replace(program.outputs[0], name="T9")
    return dataclasses.replace(program, outputs=(*program.outputs, ghost))
"""


def test_check_verifies_a_program_a_script_builds_by_hand(tmp_path, capsys):
    script = tmp_path / "ghost.py"
    script.write_text(UNVERIFIED_SCRIPT)
    assert main("dump", str(script)) == 0  # dump prints what it is given
    capsys.readouterr()
    assert main("check", str(script)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{script}: ") and "T9" in err and err.count("\n") == 1, err


def test_check_names_the_script_when_its_fusion_does_not_lower(tmp_path, capsys):
    script = tmp_path / "returns_int.py"
    script.write_text("def fusion(world_size):\n    return 3\n")
    assert main("check", str(script)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{script}: fusion(") and "returned int" in err, err


def test_check_broken_file_gives_line_and_column(hostir):
    done = hostir("check", BROKEN)
    assert done.returncode == 1 and done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr == f"{BROKEN}:14:5: unknown instruction linaer\n"


# ---------------------------------------------------------------------------
# usage errors and run


def test_unknown_subcommand(hostir):
    done = hostir("frobnicate")
    assert_one_line_error(done, 2, "invalid choice: 'frobnicate'")


def test_run_with_host_ir_dump_prints_the_program_on_rank_0_only(hostir):
    """HOSTIR_DUMP=host_ir: the program is printed once, and both ranks check OK."""
    done = hostir("run", SCRIPT, "--nproc", "2", HOSTIR_DUMP="host_ir")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("%HostIrContainer {") == 1
    assert "mesh M0 = [2] : [1]" in done.stdout
    # The ranks share one pipe, so their lines may interleave: find, don't split.
    assert sorted(re.findall(r"rank [01]/2: OK", done.stdout)) == ["rank 0/2: OK", "rank 1/2: OK"]


LISTENING = r"""
import ipaddress, os, sys

sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
from hostir import default_communicator

world = default_communicator()  # the default group: rendezvous and gloo sockets are open
dist.barrier()


def tree(root):
    # The launcher and its children (the ranks).
    pids = [root]
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == root:
            pids.append(int(entry))
    return pids


def socket_inodes(pids):
    found = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    found.add(target[8:-1])
        except OSError:
            continue
    return found


def address(text):
    raw = bytes.fromhex(text)  # /proc/net/tcp*: 32-bit words in host (little-endian) order
    raw = b"".join(raw[k : k + 4][::-1] for k in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    return getattr(ip, "ipv4_mapped", None) or ip


if world.rank == 0:
    inodes = socket_inodes(tree(os.getppid()))
    listening, exposed = 0, []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as file:
            for line in file.readlines()[1:]:
                fields = line.split()
                if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                    continue
                host, port = fields[1].split(":")
                listening += 1
                if not address(host).is_loopback:
                    exposed.append(f"{address(host)}:{int(port, 16)}")
    print(f"listening {listening} exposed {sorted(exposed)}", flush=True)
dist.barrier()  # every rank alive until rank 0 has looked
"""


def test_a_local_run_listens_on_loopback_only(hostir, tmp_path):
    """During ``hostir run --nproc 2``, every TCP socket the launcher and its ranks listen
    on is bound to 127.0.0.1 or ::1 (rank 0's rendezvous store used to listen on every
    interface, ``*:PORT``)."""
    script = tmp_path / "listening.py"
    script.write_text(LISTENING)
    done = hostir("run", str(script), "--nproc", "2", "--", str(REPO_ROOT))
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("listening ")]
    count, exposed = re.fullmatch(r"listening (\d+) exposed (.*)", line).groups()
    assert exposed == "[]" and int(count) >= 2, line  # the store and gloo's own


# ---------------------------------------------------------------------------
# In this process: cli.main


def main(*args: str) -> int:
    """``cli.main(args)``; argparse's own exits become their exit code."""
    try:
        return cli.main(list(args))
    except SystemExit as exit:
        return exit.code


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths resolve from the repository root; no variables that change output."""
    monkeypatch.chdir(REPO_ROOT)
    for name in ("HOSTIR_DUMP", "HOSTIR_TRACEBACK"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["dump", HIR, "--world-size", "1"], 1, f"{HIR}: mesh [2] : [1] needs device 1"),
        (["dump", SCRIPT, "--world-size", "0"], 2, "--world-size must be at least 1, got 0"),
        (["dump", BROKEN], 1, f"{BROKEN}:14:5: unknown instruction linaer"),
        (["dump", "tests/data"], 2, "not a file: tests/data"),
        (["viz", HIR, "-o", "p.jpg"], 2, "cannot tell the format of p.jpg"),
        (["viz", HIR, "-o", "p.svg", "--instruction", "2"], 2, "--instruction needs --traffic"),
        (["check", "cli_no_such_file.hir"], 2, "file not found: cli_no_such_file.hir"),
        (["viz", HIR], 2, "the following arguments are required: -o/--output"),
    ],
    ids=[
        "world-too-small",
        "world-size-0",
        "parse-error",
        "folder",
        "viz-format",
        "instruction-without-traffic",
        "check-missing",
        "viz-no-output",
    ],
)
def test_errors_are_one_line(args, code, message, in_repo, capsys):
    assert main(*args) == code
    err = capsys.readouterr().err
    assert err.startswith("hostir: error: ") and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(
    "args, code, message",
    [
        (
            ["plan", "--mesh", "99999x99999", "--shape", "8x8", "--from", "RR", "--to", "RR"],
            2,
            "--mesh '99999x99999': each size must be from 1 to 65536, got 99999",
        ),
        (
            ["plan", "--mesh", "256x257", "--shape", "8", "--from", "RR", "--to", "RR"],
            2,
            "--mesh '256x257': 65792 devices; plan takes meshes of at most 65536 devices",
        ),
        (
            ["plan", "--mesh", "2x2", "--shape", "1_6x8", "--from", "RR", "--to", "RR"],
            2,
            "--shape '1_6x8': expected sizes like 2x2 or 8x8",
        ),
        (
            ["run", "cli_no_such_script.py", "--nproc", "300"],
            2,
            "--nproc must be at most 256, got 300",
        ),
        (
            ["run", "cli_no_such_script.py", "--nproc", "²"],
            2,
            "argument --nproc: expected a whole number (ASCII digits), got '²'",
        ),
        (["run", "tests/data", "--nproc", "2"], 2, "script is not a file: tests/data"),
        (["traffic", HIR, "--bind", "i0=²"], 2, "--bind i0='²': expected a whole number >= 0"),
        (["traffic", HIR, "--bind", "i9=4"], 2, "i9 is not a symbolic extent of the program"),
        (["traffic", HIR, "--bind", "i0=-4"], 2, "--bind i0='-4': expected a whole number >= 0"),
        (["traffic", HIR, "--bind", "i0=3"], 1, "extent i0 // 2 divides i0 = 3 by 2"),
        (["traffic", HIR, "--world-size", "5000"], 2, "traffic counts and draws at most 4096"),
        (
            ["viz", HIR, "-o", "p.dot", "--traffic", "--world-size", "5000"],
            2,
            "--world-size 5000 ranks: traffic counts and draws at most 4096 ranks",
        ),
        (
            ["check", HIR, "--world-size", "99999999999"],
            2,
            "--world-size must be at most 1048576, got 99999999999",
        ),
    ],
    ids=[
        "plan-huge-mesh",
        "plan-too-many-devices",
        "plan-underscore",
        "run-nproc-300",
        "run-nproc-superscript",
        "run-folder",
        "bind-superscript",
        "bind-unknown-symbol",
        "bind-negative",
        "bind-not-dividing",
        "traffic-huge-world",
        "viz-traffic-huge-world",
        "check-huge-world",
    ],
)
def test_bad_values_are_one_line_not_internal_errors(args, code, message, in_repo, capsys):
    """Values that used to end in ``internal error: MemoryError`` (a 99999x99999 mesh, a
    traffic world of 99999 ranks), a ValueError from ``int('²')``, a launch of any number
    of processes, or a silently wrong count (``i0 = -4``, ``i0 = 3`` split in 2)."""
    assert main(*args) == code
    err = capsys.readouterr().err
    assert err.startswith("hostir: error: ") and err.count("\n") == 1 and message in err, err
    assert "internal error" not in err


PLAN = ["plan", "--mesh", "2x2", "--shape", "8x8", "--from", "S0S0"]

BAD_ARGUMENTS = {
    "run": (["run", SCRIPT, "--nproc", "2", "--backend", "mpi"], "invalid choice: 'mpi'"),
    "dump": (["dump", HIR, "--rank", "1"], "--rank is for --python only"),
    "viz": (
        ["viz", HIR, "-o", "p.dot", "--traffic", "--instruction", "9"],
        "instruction index 9 is out of range: the program body has 5 top-level instructions",
    ),
    "viz-no-communication": (
        ["viz", HIR, "-o", "p.dot", "--traffic", "--instruction", "0"],
        "instruction 0 has no communication to draw: allocate T4",
    ),
    "check": (["check", HIR, "--world-size", "0"], "--world-size must be at least 1, got 0"),
    "traffic": (
        ["traffic", HIR, "--bind", "i0=4", "--bind", "i0=8"],
        "--bind i0 is given twice: 4 and 8",
    ),
    "plan": ([*PLAN, "--to", "Q"], "cannot read the distribution 'Q' at 'Q'"),
    "plan-dtype": ([*PLAN, "--to", "RR", "--dtype", "f32"], "--dtype 'f32': expected one of"),
    "plan-no-plan": ([*PLAN, "--to", "PR"], "the target holds partial sums the source does not"),
}
"""One bad argument per subcommand (and the other refusals that used to exit 1 or 0:
``plan``'s notation, dtype and impossible targets, ``viz --instruction``, a ``--bind``
given two values), with a fragment of its one-line message."""


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_every_command_s_bad_arguments_exit_2(case, in_repo, tmp_path, capsys):
    """docs/cli.md: a bad command line exits 2. ``plan`` exited 1 on every refusal of its
    options; ``viz --instruction`` out of range or at no communication exited 1; ``traffic``
    took the last of two ``--bind`` values silently."""
    args, message = BAD_ARGUMENTS[case]
    args = [str(tmp_path / a) if a == "p.dot" else a for a in args]
    assert main(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith("hostir: error: ") and err.count("\n") == 1 and message in err, err
    assert not list(tmp_path.iterdir())  # nothing drawn


def test_the_bad_argument_cases_cover_every_command():
    """A subcommand added later gets its case in BAD_ARGUMENTS."""
    subparsers = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert {case.split("-")[0] for case in BAD_ARGUMENTS} == set(subparsers.choices)


def test_a_bad_traceback_setting_is_one_line(in_repo, monkeypatch, capsys):
    """HOSTIR_TRACEBACK=yes used to mean yes (anything but 0); now only 0 and 1 are read."""
    monkeypatch.setenv("HOSTIR_TRACEBACK", "yes")
    assert main("check", HIR) == 2
    assert capsys.readouterr().err == "hostir: error: HOSTIR_TRACEBACK='yes': expected 0 or 1\n"


def test_viz_traffic_of_one_instruction_as_dot_source(in_repo, tmp_path, capsys):
    out = tmp_path / "traffic.dot"
    assert main("viz", HIR, "-o", str(out), "--traffic", "--instruction", "2") == 0
    assert out.read_text().lstrip().startswith("digraph")
    assert capsys.readouterr().out == f"wrote {out}\n"


@pytest.mark.parametrize(
    "source, message",
    [
        (
            "def fusion(world_size):\n    raise ValueError('no\\nway')\n",
            "raises.py:2: ValueError: no way",
        ),
        (
            "def fusion(world_size:\n    pass\n",
            "raises.py:1:11: syntax error: '(' was never closed",
        ),
        ("import sys\nsys.exit(3)\n", "exited (code 3) while being imported"),
        ("def fusion(world_size):\n    return 3\n", "fusion(2) returned int; expected a"),
        ("fusion = 3\n", "'fusion' is a int, not a function"),
        ("x = 1\x00\n", "raises.py: syntax error: source code string cannot contain null"),
    ],
    ids=["raises", "syntax", "exits", "returns-int", "not-callable", "null-byte"],
)
def test_bad_scripts_are_one_line(source, message, tmp_path, capsys):
    script = tmp_path / "raises.py"
    script.write_text(source)
    assert main("dump", str(script)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"hostir: error: {script}") and err.count("\n") == 1 and message in err


DEFAULT_WORLD_SIZE_SCRIPT = """
from hostir import parse

TEXT = "%HostIrContainer {\\n  mesh M0 = [{}]\\n  input T0 : float32[4] @M0\\n  output T0\\n}\\n"

def fusion(world_size=3):  # may return a program as well as a FusionDefinition
    return parse(TEXT.replace("{}", ", ".join(map(str, range(world_size)))))
"""


def test_world_size_defaults_to_the_fusion_default(tmp_path, capsys):
    script = tmp_path / "three.py"
    script.write_text(DEFAULT_WORLD_SIZE_SCRIPT)
    assert main("dump", str(script)) == 0
    assert "mesh M0 = [3] : [1]" in capsys.readouterr().out


INTERNAL_BUG = """
class Broken:
    def host_ir(self, world_size):
        raise RuntimeError("a bug in the lowering")

def fusion(world_size):
    return Broken()
"""


def test_internal_errors_are_one_line_unless_a_traceback_is_asked_for(
    tmp_path, capsys, monkeypatch
):
    script = tmp_path / "bug.py"
    script.write_text(INTERNAL_BUG)
    monkeypatch.delenv("HOSTIR_TRACEBACK", raising=False)
    assert main("dump", str(script)) == 1
    err = capsys.readouterr().err
    assert err == (
        "hostir: error: internal error: RuntimeError: a bug in the lowering"
        " (set HOSTIR_TRACEBACK=1 for the traceback)\n"
    )
    monkeypatch.setenv("HOSTIR_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="a bug in the lowering"):
        cli.main(["dump", str(script)])


# ---------------------------------------------------------------------------
# docs/cli.md shows what the commands print


def shown_output(items: list, command: str) -> str:
    """The first ```text block after the ```bash block that is exactly ``command`` (prose
    may come between; no other code block may)."""
    for index, item in enumerate(items):
        if isinstance(item, Fence) and item.info == "bash" and item.text.strip() == command:
            after = next((f for f in items[index + 1 :] if isinstance(f, Fence)), None)
            assert after is not None and after.info == "text", command
            return after.text
    raise AssertionError(f"docs/cli.md shows no output of {command!r}")


def test_docs_show_what_the_commands_print(tmp_path, monkeypatch, capsys):
    items = parse_markdown(REPO_ROOT / "docs" / "cli.md")
    (script,) = [f for f in items if isinstance(f, Fence) and f.info.startswith("python")]
    (tmp_path / "my_linear.py").write_text(script.text)
    monkeypatch.chdir(tmp_path)
    assert main("dump", "my_linear.py") == 0
    assert capsys.readouterr().out == shown_output(items, "hostir dump my_linear.py")
    assert main("dump", "my_linear.py", "--world-size", "4") == 0
    (tmp_path / "linear4.hir").write_text(capsys.readouterr().out)
    assert main("check", "linear4.hir") == 0
    assert capsys.readouterr().out == shown_output(items, "hostir check linear4.hir")
    assert main("dump", "linear4.hir", "--json") == 0
    shown = shown_output(items, "hostir dump linear4.hir --json").removesuffix("...\n")
    assert capsys.readouterr().out.startswith(shown)
    monkeypatch.chdir(REPO_ROOT)
    assert main("check", BROKEN) == 1
    assert capsys.readouterr().err == shown_output(items, f"hostir check {BROKEN}")
    plan = "hostir plan --mesh 2x2 --shape 8x8 --from S0S1 --to S1S0"
    assert main(*plan.split()[1:]) == 0
    assert capsys.readouterr().out == shown_output(items, plan)


def test_dump_python_prints_the_compiled_source_the_docs_show(tmp_path, monkeypatch, capsys):
    """``dump --python`` prints the source the program compiles to on ``--rank`` (as
    docs/cli.md shows it), the rank checked against ``--world-size``."""
    items = parse_markdown(REPO_ROOT / "docs" / "cli.md")
    (script,) = [f for f in items if isinstance(f, Fence) and f.info.startswith("python")]
    (tmp_path / "my_linear.py").write_text(script.text)
    monkeypatch.chdir(tmp_path)
    command = "hostir dump my_linear.py --python --rank 1"
    assert main(*command.split()[1:]) == 0
    assert capsys.readouterr().out == shown_output(items, command)
    assert main("dump", "my_linear.py", "--python", "--world-size", "2", "--rank", "2") == 2
    assert capsys.readouterr().err == "hostir: error: --rank must be at most 1, got 2\n"
    assert main("dump", "my_linear.py", "--rank", "1") == 2
    assert "--rank is for --python only" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# plan


def test_plan_explains_a_fused_gather(hostir):
    """`hostir plan` prints the plan: one Allgather over the flattened team."""
    done = hostir("plan", "--mesh", "2x2", "--shape", "8x8", "--from", "S0S0", "--to", "RR")
    assert done.returncode == 0, done.stderr
    assert (
        "1. Allgather over M0(y, x): receives 192 B per rank, temporaries 0 B (gloo stages 256 B)"
        in done.stdout
    )
    assert "1 collective(s), 1 step(s)" in done.stdout


def test_plan_explains_a_permutation_and_a_reduction_first(hostir):
    """S0S1 -> S1S0 is one CollectivePermute; PS0 -> RR reduces before it gathers."""
    done = hostir("plan", "--mesh", "2x2", "--shape", "8x8", "--from", "S0S1", "--to", "S1S0")
    assert "1. CollectivePermute over M0(y, x)" in done.stdout
    done = hostir("plan", "--mesh", "2x2", "--shape", "8x8", "--from", "PS0", "--to", "RR")
    lines = done.stdout.splitlines()
    assert lines[1].startswith("1. Allreduce over M0(y)") and lines[2].startswith("2. Allgather")


def test_plan_refuses_uneven_shapes_in_one_line(hostir):
    """An extent that does not split evenly: one error line, exit 2 (a bad option)."""
    done = hostir("plan", "--mesh", "2x2", "--shape", "7x8", "--from", "S0S0", "--to", "RR")
    assert_one_line_error(done, 2, "dim 0 of extent 7 does not divide over 4 devices")


def test_traffic_sizes_the_world_from_every_mesh_and_takes_scalar_inputs(in_repo, tmp_path, capsys):
    """Without ``--world-size`` the world reaches the largest device of any mesh the program's
    tensors live on: here a SendRecv from device 0 to device 2 (M1), which no input is on,
    and a scalar input, which has no mesh (it used to be an internal AttributeError, and the
    inputs' meshes alone gave a world of 1 rank, outside which M1 lies). Rank 2 receives the
    whole 16x3 block."""
    path = tmp_path / "scalar.hir"
    path.write_text(
        "%HostIrContainer {\n"
        "  mesh M0 = [1] : [1]\n"
        "  mesh M1 = [1] : [1] + 2\n"
        "  mesh M2 = [2] : [2]\n"
        "  input T0 : float32[16, 3] @M0\n"
        "  input s0 : float32\n"
        "  T1 : float32[16, 3] @M0 = mul(T0, s0)\n"
        "  T2 : float32[16, 3] @M1, R0 = SendRecv(T1, team=M2(x), sender=0, receiver=1)\n"
        "  wait R0\n"
        "  output T2\n"
        "}\n"
    )
    text = path.read_text()
    assert main("check", str(path)) == 0, capsys.readouterr()
    capsys.readouterr()
    assert main("traffic", str(path)) == 0, text
    out = capsys.readouterr().out
    assert "at 3 ranks" in out and f"max {16 * 3 * 4} B (rank 2)" in out, out
