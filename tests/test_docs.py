"""Documentation runs: the README's and docs' code blocks and every example execute.

- Every ```python block of README.md and docs/*.md runs in a fresh namespace
  in a child process of its own, with the repository root as working
  directory and no launcher variables (a world of one rank). The child is a
  fork of the session's fork server, which has imported torch and the
  project once (tests/child_runs.py), so blocks share nothing but the
  imported modules. Tracebacks give the line in the Markdown file.
- A ```python block followed by a paragraph that is exactly ``prints`` and a
  ```text block must print exactly that text.
- A block whose info string is ``python no-run`` is compiled, not run; the
  paragraph just before it must say why it is not run (it must contain "not run").
- A block whose info string has ``nproc=2,4`` also runs as a script under
  ``hostir run --nproc N`` for each N.
- A block whose info string has ``file=PATH`` (``python file=hostir/ir/ops.py``) shows
  code of the repository and is not run: ``PATH`` must hold its lines verbatim, one after
  the other (at any common indentation), so a walk-through shows the code the suite runs.
  (Put such blocks between ``<!-- fmt: off -->`` and ``<!-- fmt: on -->``: ``ruff format``
  formats Markdown's Python blocks, and would rewrite a fragment such as a table entry.)
- Every examples/*.py runs with plain ``python`` (a world of one) and as its docstring
  and the README say, under ``hostir run --nproc 4``; it must exit 0 and every rank
  must print a line ``rank R/N: ... OK``. The plain run and the launcher are
  forks of the fork server; the ranks the launcher starts are fresh
  interpreters, as for any user.

Every run the selected tests need is submitted when the first of them asks,
in the order the tests will ask for them; the session's scheduler
(tests/child_runs.py) starts them a few ranks at a time and stops a run only
when it is hung (its processes use no CPU) or far over the wall-clock limit,
never for being slow on a busy machine.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import signal
import sys
import textwrap
from collections.abc import Iterator

import pytest

from tests.child_runs import Python, Result, Run, Scheduler, ranks_ok
from tests.child_runs import child_environment as child_environment  # for older importers
from tests.multidevice import launched_by_torchrun

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC_FILES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.py"))
EXAMPLE_NPROCS = (4,)
"""The launcher runs of the README's main job: the command the README gives."""
_QUICK_START = re.search(
    r"hostir run (examples/\w+\.py) --nproc (\d+)", (REPO_ROOT / "README.md").read_text()
)
MAIN_JOB = REPO_ROOT / _QUICK_START.group(1)
"""The example the README's quick start runs (its first ``hostir run`` command). It alone
runs through the launcher on ranks here; every other example's job runs on 4 pooled ranks
(tests/test_example_ranks.py): the launcher is the same for all of them, and each launch
costs four fresh interpreters."""
FENCE = re.compile(r"^ {0,3}(`{3,})\s*([^`]*)$")

pytestmark = pytest.mark.skipif(
    launched_by_torchrun() and os.environ.get("RANK") != "0",
    reason="starts its own processes: runs on rank 0 only",
)

# ---------------------------------------------------------------------------
# Markdown: fenced blocks and the paragraphs around them


@dataclasses.dataclass(frozen=True)
class Fence:
    """A fenced code block: its info string, its text and the line of its opening fence."""

    info: str
    text: str
    line: int


@dataclasses.dataclass(frozen=True)
class Block:
    """A ```python block: where it is, its code, the paragraph before it and the
    text the docs say it prints (None if they do not say)."""

    path: pathlib.Path
    line: int
    info: str
    code: str
    before: str
    expected: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"

    @property
    def no_run(self) -> bool:
        return "no-run" in self.info.split()[1:]

    @property
    def excerpt_of(self) -> str | None:
        """The file (relative to the repository) whose code the block shows, if any."""
        for option in self.info.split()[1:]:
            if option.startswith("file="):
                return option.removeprefix("file=")
        return None

    @property
    def nprocs(self) -> tuple[int, ...]:
        for option in self.info.split()[1:]:
            if option.startswith("nproc="):
                return tuple(int(n) for n in option.removeprefix("nproc=").split(","))
        return ()

    def source(self) -> str:
        """The code, preceded by blank lines so that line numbers are those of the file."""
        return "\n" * self.line + self.code


def parse_markdown(path: pathlib.Path) -> list[Fence | str]:
    """The file as a list of fenced blocks and paragraphs (joined lines), in order."""
    items: list[Fence | str] = []
    paragraph: list[str] = []
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if match is None:
            if lines[index].strip():
                paragraph.append(lines[index].strip())
            elif paragraph:
                items.append(" ".join(paragraph))
                paragraph = []
            index += 1
            continue
        if paragraph:
            items.append(" ".join(paragraph))
            paragraph = []
        start, fence = index, match.group(1)
        index += 1
        while index < len(lines) and lines[index].strip() != fence:
            index += 1
        if index == len(lines):
            raise ValueError(f"{path}:{start + 1}: unclosed code fence")
        text = "".join(line + "\n" for line in lines[start + 1 : index])
        items.append(Fence(info=match.group(2).strip(), text=text, line=start + 1))
        index += 1
    if paragraph:
        items.append(" ".join(paragraph))
    return items


def python_blocks(path: pathlib.Path) -> list[Block]:
    """The ```python blocks of ``path``, each with what it prints if the docs show it."""
    items = parse_markdown(path)
    blocks = []
    for position, item in enumerate(items):
        if not isinstance(item, Fence) or item.info.split()[:1] != ["python"]:
            continue
        before = items[position - 1] if position > 0 else ""
        after = items[position + 1 : position + 3]
        expected = None
        if (
            len(after) == 2
            and after[0] == "prints"
            and isinstance(after[1], Fence)
            and after[1].info == "text"
        ):
            expected = after[1].text
        blocks.append(
            Block(
                path=path,
                line=item.line,
                info=item.info,
                code=item.text,
                before=before if isinstance(before, str) else "",
                expected=expected,
            )
        )
    return blocks


BLOCKS = [block for path in DOC_FILES for block in python_blocks(path)]

# ---------------------------------------------------------------------------
# The runs: each one a fork of the session's fork server (tests/child_runs.py)


def block_run(block: Block) -> Run:
    """The run of one ```python block, as ``python -c`` with line numbers of the file."""
    name = str(block.path.relative_to(REPO_ROOT))
    return Run(name=block.id, command=Python("code", block.source(), filename=name))


@dataclasses.dataclass(frozen=True)
class Launch:
    """A script (an example, or a docs block) run with plain python or on ``nproc`` ranks."""

    script: pathlib.Path | Block
    nproc: int | None

    def __str__(self) -> str:
        name = self.script.id if isinstance(self.script, Block) else self.script.stem
        return f"{name}-{'python' if self.nproc is None else f'nproc{self.nproc}'}"

    def run(self) -> Run:
        if isinstance(self.script, Block):
            files, script = (("block.py", self.script.source()),), "{dir}/block.py"
            ok_world = None
        else:
            files, script = (), str(self.script.relative_to(REPO_ROOT))
            ok_world = self.nproc or 1
        if self.nproc is None:
            command = Python("script", script)
        else:
            command = Python("module", "hostir.cli", ("run", script, "--nproc", str(self.nproc)))
        ranks = self.nproc or 1
        return Run(str(self), command, ranks=ranks, ok_world=ok_world, files=files)


def runs_of(params: dict) -> list[Run]:
    """The runs a test with these parameters needs."""
    runs = []
    for value in params.values():
        if isinstance(value, Block) and value in RUN:
            runs.append(block_run(value))
        elif isinstance(value, Launch):
            runs.append(value.run())
    return runs


@pytest.fixture(scope="module")
def runner(request: pytest.FixtureRequest, child_runs: Scheduler) -> Iterator[Scheduler]:
    """The session's scheduler, with every run the selected tests of this module need
    submitted in the order the tests will ask for them."""
    module = sys.modules[__name__]
    runs = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and getattr(item, "module", None) is module:
            runs.extend(runs_of(callspec.params))
    for run in runs:
        child_runs.submit(run)
    yield child_runs
    child_runs.forget(runs)


def describe_block(block: Block, result: Result) -> str:
    if result.killed:
        ending = f"was stopped: {result.killed}"
    elif result.returncode < 0:
        ending = f"was killed by {signal.Signals(-result.returncode).name}"
    else:
        ending = f"exited with {result.returncode}"
    return f"{block.id} {ending}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"


# ---------------------------------------------------------------------------
# The tests


RUN = [b for b in BLOCKS if not b.no_run and b.excerpt_of is None]
"""The blocks that run (not ``no-run``, not an excerpt of a file)."""


@pytest.mark.parametrize("block", RUN, ids=lambda b: b.id)
def test_doc_block_runs(block: Block, runner: Scheduler) -> None:
    result = runner.result(block_run(block))
    assert result.returncode == 0 and not result.killed, describe_block(block, result)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.no_run], ids=lambda b: b.id)
def test_a_block_not_run_says_why_and_compiles(block: Block) -> None:
    """A ``python no-run`` block (one that needs a GPU or a tool the suite lacks) is
    not run, but the paragraph before it must say why, and it must be valid Python."""
    assert "not run" in block.before.lower(), (
        f"{block.id} is marked no-run: the paragraph before it must say why it is not run"
    )
    compile(block.source(), str(block.path), "exec", dont_inherit=True)


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.expected is not None], ids=lambda block: block.id
)
def test_doc_block_prints_what_the_docs_show(block: Block, runner: Scheduler) -> None:
    assert not block.no_run, f"{block.id} shows its output, so it must run"
    result = runner.result(block_run(block))
    assert result.returncode == 0 and not result.killed, describe_block(block, result)
    assert result.stdout.rstrip("\n") == block.expected.rstrip("\n")


def excerpt_found(excerpt: str, text: str) -> bool:
    """Whether ``text`` holds the lines of ``excerpt`` one after the other, each at the
    indentation of the first plus its own (blank lines match blank lines)."""
    wanted = textwrap.dedent(excerpt).splitlines()
    lines = text.splitlines()
    for start in range(len(lines) - len(wanted) + 1):
        first = lines[start]
        indent = first[: len(first) - len(first.lstrip())]
        if all(
            lines[start + k] == indent + line if line.strip() else not lines[start + k].strip()
            for k, line in enumerate(wanted)
        ):
            return True
    return False


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.excerpt_of is not None], ids=lambda block: block.id
)
def test_a_file_excerpt_is_the_file_s_code(block: Block) -> None:
    """A ``python file=PATH`` block is not run: PATH holds its code, verbatim."""
    path = REPO_ROOT / block.excerpt_of
    assert path.is_file(), f"{block.id}: no file {block.excerpt_of}"
    assert excerpt_found(block.code, path.read_text()), (
        f"{block.id}: {block.excerpt_of} does not hold this code (any more):\n{block.code}"
    )


def test_readme_tour_output_is_checked() -> None:
    """The README's printed program is compared with what its tour prints (the
    "prints" paragraph that pairs them is not lost)."""
    shown = [b.expected for b in BLOCKS if b.path.name == "README.md" and b.expected]
    assert any(text.startswith("%HostIrContainer {") for text in shown)


POOL_BLOCKS = ("docs/concepts.md:517", "docs/cli.md:73")
"""Docs blocks with ``nproc=`` that only compute (they declare no op or collective, which
would stay registered in a worker): they run on the warm pools' ranks
(tests/test_example_ranks.py) instead of under ``hostir run``, whose launches of fresh
interpreters the README's main job and the other blocks still test (about 10 s of the
suite)."""


@pytest.mark.parametrize(
    "launch",
    [Launch(b, n) for b in RUN for n in b.nprocs if b.id not in POOL_BLOCKS],
    ids=str,
)
def test_doc_block_runs_on_ranks(launch: Launch, runner: Scheduler) -> None:
    result = runner.result(launch.run())
    assert result.returncode == 0 and not result.killed, result.describe()


@pytest.mark.parametrize(
    "launch",
    [
        Launch(path, n)
        for path in EXAMPLES
        for n in (None, *(EXAMPLE_NPROCS if path == MAIN_JOB else ()))
    ],
    ids=str,
)
def test_example_runs(launch: Launch, runner: Scheduler) -> None:
    result = runner.result(launch.run())
    assert result.returncode == 0 and not result.killed, result.describe()
    world = launch.nproc or 1
    ok = ranks_ok(result.stdout, world)
    assert ok == set(range(world)), f"ranks that printed OK: {sorted(ok)}\n{result.describe()}"
