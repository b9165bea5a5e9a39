"""Every example works with every ``hostir`` command that reads a program, not only ``run``.

The tests are parametrized over the glob ``examples/*.py``, so a new example is covered
without editing this file. They call ``hostir.cli.main`` in this process (lowering needs
no ranks), from the repository root, and check what each command is for:

- ``dump`` prints a program, and only that (what the script prints goes to stderr), that
  parses back to the program the example's ``fusion`` lowers to when this module imports
  the example itself (not through the command line's loader), at the example's own world
  size and at 2 ranks; ``--json`` gives the same program. Every collective in it is named
  in the example's docstring, so the docstring says what the example lowers to.
- ``check`` verifies the text ``dump`` wrote and the script itself: ``FILE: ok (N
  instructions)``, N counted here.
- ``viz`` writes graphviz source naming every collective of the program (and an SVG where
  graphviz's ``dot`` is installed); with ``--traffic``, the ranks and the transfers between
  them of the first communication, or "no communication to draw" for a program without.
- ``traffic``, every symbolic extent bound, lists each communication of the program at its
  place (``body[i].body[j]``) and kind, and a busiest link between two ranks exactly when
  the program communicates.

Each example with plain ``python``, and ``hostir run --nproc 4`` of the README's main
job, are tests/test_docs.py's ``test_example_runs``; every other example's job on 4 ranks
is tests/test_example_ranks.py's. The command lines on examples that README.md and docs/cli.md show
run here too, with the output docs/cli.md prints under them.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import os
import pathlib
import re
import shlex
import shutil
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest

import hostir
from hostir import cli
from hostir.cli.arguments import program_symbols
from tests.multidevice import launched_by_torchrun
from tests.test_docs import Fence, parse_markdown

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.py"))
DOCS_WITH_COMMANDS = [REPO_ROOT / "README.md", REPO_ROOT / "docs" / "cli.md"]

BOUND_EXTENT = 64
"""The value ``traffic`` binds every symbolic extent of an example to (its token count): a
power of two, so it splits evenly over the examples' meshes and stream chunks."""

OTHER_WORLD = 2
"""A world size every example also lowers for (tests/test_docs.py runs them on 2 ranks)."""

SVG_MAX_INSTRUCTIONS = 160
"""The largest program whose picture ``test_viz_draws_the_program`` renders with graphviz
(every program's source is checked): dot's layout grows much faster than the program, and
the transformer block's backward (221 instructions) takes it about 30 s of CPU (graphviz
2.43, its x-coordinate network simplex over some 27,000 virtual nodes), the forward (about
100) under a second."""

pytestmark = pytest.mark.skipif(
    launched_by_torchrun() and os.environ.get("RANK") != "0",
    reason="one rank is enough for commands that start no ranks",
)


@dataclasses.dataclass(frozen=True)
class Done:
    """What one ``hostir`` command did: its exit code and what it printed."""

    code: int
    out: str
    err: str

    def describe(self) -> str:
        return f"exit code {self.code}\n--- stdout ---\n{self.out}\n--- stderr ---\n{self.err}"


Hostir = Callable[..., Done]


@pytest.fixture
def hostir_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> Hostir:
    """``hostir_cli(*args)`` runs ``hostir ARGS`` in this process from the repository root
    (with no variable set that changes the output) and returns its Done."""
    monkeypatch.chdir(REPO_ROOT)
    for name in ("HOSTIR_DUMP", "HOSTIR_TRACEBACK"):
        monkeypatch.delenv(name, raising=False)

    def run(*args: str) -> Done:
        capsys.readouterr()  # what came before is not this command's
        code = cli.main(list(args))
        captured = capsys.readouterr()
        return Done(code, captured.out, captured.err)

    return run


# ---------------------------------------------------------------------------
# The examples, and what this module finds in their programs without the CLI


@dataclasses.dataclass(frozen=True)
class Example:
    """An example script, named as a user names it: relative to the repository root."""

    path: pathlib.Path

    @property
    def name(self) -> str:
        return str(self.path.relative_to(REPO_ROOT))

    def docstring(self) -> str:
        return ast.get_docstring(ast.parse(self.path.read_text())) or ""


EXAMPLE_PARAMS = [pytest.param(Example(path), id=path.stem) for path in EXAMPLES]


@pytest.fixture
def example_module(monkeypatch: pytest.MonkeyPatch) -> Callable[[Example], ModuleType]:
    """``example_module(example)``: the example imported by this module, under a name of its
    own, with its folder first on sys.path (the examples import each other) as under
    ``python SCRIPT``; its job under ``if __name__ == "__main__":`` does not run."""

    def load(example: Example) -> ModuleType:
        monkeypatch.syspath_prepend(str(example.path.parent))
        spec = importlib.util.spec_from_file_location(f"example_{example.path.stem}", example.path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


def default_world_size(module: ModuleType) -> int:
    """The world the example's ``fusion`` is for unless told: its parameter's default, the
    world of the run its docstring shows (docs/cli.md)."""
    fusion = getattr(module, "fusion", None)
    assert callable(fusion), f"{module.__file__} defines no function 'fusion' (docs/cli.md)"
    (parameter,) = inspect.signature(fusion).parameters.values()
    assert isinstance(parameter.default, int), (
        f"{module.__file__}: fusion's world_size has no default; examples declare"
        " fusion(world_size: int = N), N the world their docstring runs them on"
    )
    return parameter.default


def lowered(module: ModuleType, world_size: int) -> hostir.HostIrContainer:
    """The program the example's fusion lowers to for ``world_size`` ranks."""
    return module.fusion(world_size).host_ir(world_size=world_size)


def instructions(body: tuple, where: str = "body") -> Iterator[tuple[str, object]]:
    """Every instruction of ``body`` with its place as ``traffic`` names it
    (``body[2].body[5]``), loops' bodies included."""
    for index, instruction in enumerate(body):
        place = f"{where}[{index}]"
        yield place, instruction
        if isinstance(instruction, hostir.ForLoop):
            yield from instructions(instruction.body, f"{place}.body")


def collectives(program: hostir.HostIrContainer) -> dict[str, str]:
    """The program's collectives: their kind (class name, the keyword of the text) by place."""
    collective_classes = tuple(hostir.COLLECTIVES)
    return {
        place: type(instruction).__name__
        for place, instruction in instructions(program.body)
        if isinstance(instruction, collective_classes)
    }


# ---------------------------------------------------------------------------
# dump and check


@pytest.mark.parametrize("example", EXAMPLE_PARAMS)
def test_dump_prints_the_program_the_fusion_lowers_to(example, hostir_cli, example_module):
    module = example_module(example)
    world = default_world_size(module)
    for args, world_size in (((), world), (("--world-size", str(OTHER_WORLD)), OTHER_WORLD)):
        done = hostir_cli("dump", example.name, *args)
        assert done.code == 0, done.describe()
        assert done.out.startswith("%HostIrContainer {\n"), done.describe()
        expected = lowered(module, world_size)
        assert hostir.parse(done.out) == expected, f"--world-size {world_size}"
        assert f"mesh M0 = [{world_size}]" in done.out
    done = hostir_cli("dump", example.name, "--json")
    assert done.code == 0, done.describe()
    assert hostir.HostIrContainer.from_json(done.out) == lowered(module, world)


@pytest.mark.parametrize("example", EXAMPLE_PARAMS)
def test_the_docstring_names_what_the_example_lowers_to(example, example_module):
    """Every collective of the example's program is named in its docstring, or the
    docstring says there is no communication."""
    module = example_module(example)
    kinds = set(collectives(lowered(module, default_world_size(module))).values())
    docstring = example.docstring()
    if kinds:
        missing = sorted(kind for kind in kinds if kind not in docstring)
        assert not missing, (
            f"{example.name} lowers to {sorted(kinds)}; its docstring lacks {missing}"
        )
    else:
        assert "no communication" in docstring, f"{example.name} communicates nothing; say so"


@pytest.mark.parametrize("example", EXAMPLE_PARAMS)
def test_check_verifies_the_script_and_the_text_dump_writes(
    example, hostir_cli, example_module, tmp_path
):
    module = example_module(example)
    program = lowered(module, default_world_size(module))
    done = hostir_cli("dump", example.name)
    assert done.code == 0, done.describe()
    text = tmp_path / f"{example.path.stem}.hir"
    text.write_text(done.out)
    done = hostir_cli("check", str(text))
    count = sum(1 for _ in instructions(program.body))
    assert (done.code, done.out) == (0, f"{text}: ok ({count} instructions)\n"), done.describe()
    done = hostir_cli("check", example.name)  # the script itself, lowered and verified
    assert (done.code, done.out) == (0, f"{example.name}: ok ({count} instructions)\n")


# ---------------------------------------------------------------------------
# viz


@pytest.mark.parametrize("example", EXAMPLE_PARAMS)
def test_viz_draws_the_program(example, hostir_cli, example_module, tmp_path):
    module = example_module(example)
    kinds = set(collectives(lowered(module, default_world_size(module))).values())
    source = tmp_path / "program.dot"
    done = hostir_cli("viz", example.name, "-o", str(source))
    assert (done.code, done.out) == (0, f"wrote {source}\n"), done.describe()
    text = source.read_text()
    assert text.startswith("digraph"), text[:200]
    assert all(kind in text for kind in kinds), f"{sorted(kinds)} not all drawn"
    if shutil.which("dot") is None:
        return  # the source above needs no graphviz; the picture does
    program = lowered(module, default_world_size(module))
    if sum(1 for _ in instructions(program.body)) > SVG_MAX_INSTRUCTIONS:
        return  # too slow for the suite to render (see SVG_MAX_INSTRUCTIONS)
    picture = tmp_path / "program.svg"
    done = hostir_cli("viz", example.name, "-o", str(picture))
    assert done.code == 0, done.describe()
    assert picture.read_text().lstrip().startswith(("<svg", "<?xml"))


@pytest.mark.parametrize("example", EXAMPLE_PARAMS)
def test_viz_traffic_draws_who_sends_to_whom(example, hostir_cli, example_module, tmp_path):
    module = example_module(example)
    world = default_world_size(module)
    kinds = list(collectives(lowered(module, world)).values())
    source = tmp_path / "traffic.dot"
    done = hostir_cli("viz", example.name, "-o", str(source), "--traffic")
    if not kinds:
        assert done.code == 1 and "no communication to draw" in done.err, done.describe()
        return
    assert done.code == 0, done.describe()
    text = source.read_text()
    assert kinds[0] in text, f"the first communication, a {kinds[0]}, is not named"
    assert all(f'label="rank {rank}"' in text for rank in range(world)), text
    edges = re.findall(r"rank(\d+)\S* -> rank(\d+)", text)
    assert any(sender != receiver for sender, receiver in edges), text


# ---------------------------------------------------------------------------
# traffic


@pytest.mark.parametrize("example", EXAMPLE_PARAMS)
def test_traffic_counts_each_communication(example, hostir_cli, example_module):
    module = example_module(example)
    world = default_world_size(module)
    program = lowered(module, world)
    binds = [f"--bind={name}={BOUND_EXTENT}" for name in sorted(program_symbols(program))]
    done = hostir_cli("traffic", example.name, *binds)
    assert done.code == 0, done.describe()
    lines = done.out.splitlines()
    assert lines[0].startswith(f"traffic of {example.name} at {world} ranks"), done.out
    if "per communication: none (the program has no communication)" in lines:
        assert collectives(program) == {}, done.out
    header = next(i for i, line in enumerate(lines) if line.startswith("per communication"))
    listed = {}
    for line in lines[header + 1 :]:
        if not line.startswith("  "):
            break
        place, kind = line.split()[:2]
        listed[place] = kind
    assert listed == collectives(program), done.out
    received_max = int(re.search(r"^received per rank: .*max (\d+) B", done.out, re.M).group(1))
    link = re.search(r"^busiest link: rank (\d+) -> rank (\d+), (\d+) B$", done.out, re.M)
    if listed:
        assert received_max > 0 and link is not None, done.out
        assert link.group(1) != link.group(2) and int(link.group(3)) > 0, done.out
    else:
        assert received_max == 0 and "busiest link: none" in done.out, done.out


# ---------------------------------------------------------------------------
# The command lines README.md and docs/cli.md show on the examples


@dataclasses.dataclass(frozen=True)
class CommandBlock:
    """A ```bash block that runs hostir on an example, and the ```text block after it (the
    output the docs show), if the next block is one."""

    path: pathlib.Path
    line: int
    commands: tuple[str, ...]
    shown: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"


def command_blocks() -> list[CommandBlock]:
    """The ```bash blocks of README.md and docs/cli.md with a ``hostir`` command line on a
    script in examples/."""
    blocks = []
    for path in DOCS_WITH_COMMANDS:
        fences = [item for item in parse_markdown(path) if isinstance(item, Fence)]
        for index, fence in enumerate(fences):
            commands = tuple(
                line.strip() for line in fence.text.splitlines() if line.startswith("hostir ")
            )
            if fence.info != "bash" or not any("examples/" in c for c in commands):
                continue
            after = fences[index + 1] if index + 1 < len(fences) else None
            shown = after.text if after is not None and after.info == "text" else None
            blocks.append(CommandBlock(path, fence.line, commands, shown))
    return blocks


def test_the_docs_show_commands_on_the_examples():
    """The collection below is not empty: README.md and docs/cli.md show the commands on
    an example (a change to either that drops them drops their test too)."""
    assert {block.path.name for block in command_blocks()} == {"README.md", "cli.md"}


@pytest.mark.parametrize("block", command_blocks(), ids=lambda block: block.id)
def test_the_docs_commands_on_the_examples_work(block, hostir_cli, monkeypatch, tmp_path):
    """Each command line of the block runs as the docs write it, in order, from a folder
    where ``examples/`` is the repository's, so the files it writes land there: exit 0, and
    the output shown under the block if the docs show one. ``hostir run`` is left to
    tests/test_docs.py, which runs every example on ranks."""
    (tmp_path / "examples").symlink_to(REPO_ROOT / "examples")
    monkeypatch.chdir(tmp_path)  # after hostir_cli's chdir to the repository root
    outputs = []
    for command in block.commands:
        words = shlex.split(command, comments=True)
        if words[1] == "run":
            continue
        redirect = None
        if ">" in words:
            words, redirect = words[: words.index(">")], words[words.index(">") + 1]
        done = hostir_cli(*words[1:])
        assert done.code == 0, f"{command}\n{done.describe()}"
        if redirect is None:
            outputs.append(done.out)
        else:
            (tmp_path / redirect).write_text(done.out)
    if block.shown is not None and outputs:  # a block of `hostir run` alone: test_docs's
        assert "".join(outputs) == block.shown
