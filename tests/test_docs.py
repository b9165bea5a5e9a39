"""Documentation runs: the README's and docs' code blocks and every example execute.

- Every ```python block of README.md and docs/*.md runs in a fresh namespace
  in a child process, with the repository root as working directory and no
  launcher variables (a world of one rank). One runner process per file
  imports torch and the project once and forks a child per block, so blocks
  share nothing but the imported modules, and the file pays for importing
  torch once. Tracebacks give the line in the Markdown file.
- A ```python block followed by a paragraph that is exactly ``prints`` and a
  ```text block must print exactly that text.
- A block whose info string is ``python no-run`` is skipped; the paragraph
  just before it must say why it is not run (it must contain "not run").
- A block whose info string has ``nproc=2,4`` also runs as a script under
  ``hostir run --nproc N`` for each N.
- Every examples/*.py runs with plain ``python`` (a world of one) and under
  ``hostir run --nproc 2`` and ``--nproc 4``; it must exit 0 and every rank
  must print a line ``rank R/N: ... OK``.

Every child process the selected tests need starts when the first of them
asks, so the module takes about as long as its slowest run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.multidevice import launched_by_torchrun

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC_FILES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.py"))
NPROCS = (2, 4)
BLOCK_TIMEOUT_S = 120
SCRIPT_TIMEOUT_S = 180
FENCE = re.compile(r"^ {0,3}(`{3,})\s*([^`]*)$")
RANK_OK = re.compile(r"^rank (\d+)/(\d+): .*\bOK$")

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
# Child processes, all started together

RUNNER = r"""
import json, os, signal, sys, tempfile, traceback
import torch, hostir, frontend, lowering  # imported once: every block's child inherits them


def run(block):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            status = 0
            try:
                signal.alarm(block["timeout"])
                code = compile(block["source"], block["file"], "exec")
                exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
            except SystemExit as exit:
                status = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
            except BaseException as error:  # the block's frames only, not this runner's
                traceback.print_exception(type(error), error, error.__traceback__.tb_next)
                status = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        _, wait_status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return {
            "status": os.waitstatus_to_exitcode(wait_status),
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


with open(sys.argv[1]) as f:
    blocks = json.load(f)
results = [run(block) for block in blocks]
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""
"""Runs the blocks listed in argv[1], one forked child each; writes results to argv[2]."""


@dataclasses.dataclass(frozen=True)
class Run:
    """A child process: a command run from the repository root, files it needs
    (written to the run's folder first), and a time limit. ``{dir}`` in the
    command stands for the run's folder."""

    name: str
    argv: tuple[str, ...]
    timeout_s: float
    files: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Result:
    """How a run ended: exit code (negative: killed by that signal), output, folder."""

    returncode: int
    stdout: str
    stderr: str
    folder: pathlib.Path
    timed_out: bool

    def describe(self) -> str:
        ending = "timed out" if self.timed_out else f"exit code {self.returncode}"
        return f"{ending}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


def child_environment() -> dict[str, str]:
    """Ours, minus launcher variables (a child is a world of its own) and HOSTIR_DUMP
    (it would add output); the repository root first on PYTHONPATH."""
    prefixes = ("MASTER_", "TORCHELASTIC_", "ROLE_", "GROUP_", "OMPI_COMM_WORLD_")
    launcher = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HOSTIR_DUMP"}
    env = {k: v for k, v in os.environ.items() if k not in launcher and not k.startswith(prefixes)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


class Started:
    """A run in progress; ``result()`` waits for it (killing it at its time limit)."""

    def __init__(self, run: Run, folder: pathlib.Path) -> None:
        self.run = run
        self.folder = folder
        folder.mkdir(parents=True)
        for name, text in run.files:
            (folder / name).write_text(text)
        self.stdout = (folder / "stdout").open("w+b")
        self.stderr = (folder / "stderr").open("w+b")
        self.deadline = time.monotonic() + run.timeout_s
        self.process = subprocess.Popen(
            [arg.replace("{dir}", str(folder)) for arg in run.argv],
            cwd=REPO_ROOT,
            env=child_environment(),
            stdin=subprocess.DEVNULL,
            stdout=self.stdout,
            stderr=self.stderr,
            start_new_session=True,  # its own process group: a timeout kills all its ranks
        )
        self.result_: Result | None = None

    def result(self) -> Result:
        if self.result_ is None:
            timed_out = False
            try:
                self.process.wait(timeout=max(self.deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                timed_out = True
                self.kill()
            self.result_ = Result(
                returncode=self.process.returncode,
                stdout=self._read(self.stdout),
                stderr=self._read(self.stderr),
                folder=self.folder,
                timed_out=timed_out,
            )
        return self.result_

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    @staticmethod
    def _read(file) -> str:
        file.seek(0)
        text = file.read().decode(errors="replace")
        file.close()
        return text


class Runner:
    """Starts runs once each, in folders of their own, and hands out their results."""

    def __init__(self, folder: pathlib.Path) -> None:
        self.folder = folder
        self.started: dict[str, Started] = {}

    def start(self, run: Run) -> None:
        if run.name not in self.started:
            folder = self.folder / re.sub(r"[^\w.-]+", "_", run.name)
            self.started[run.name] = Started(run, folder)

    def result(self, run: Run) -> Result:
        self.start(run)
        return self.started[run.name].result()

    def stop(self) -> None:
        for started in self.started.values():
            started.kill()


def docs_run(path: pathlib.Path) -> Run:
    """The run of every runnable ```python block of one Markdown file."""
    name = str(path.relative_to(REPO_ROOT))
    blocks = [
        {"file": name, "source": block.source(), "timeout": BLOCK_TIMEOUT_S}
        for block in BLOCKS
        if block.path == path and not block.no_run
    ]
    return Run(
        name=f"docs {name}",
        argv=(sys.executable, "-c", RUNNER, "{dir}/blocks.json", "{dir}/results.json"),
        timeout_s=30 + BLOCK_TIMEOUT_S * len(blocks),
        files=(("blocks.json", json.dumps(blocks)),),
    )


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
        else:
            files, script = (), str(self.script.relative_to(REPO_ROOT))
        if self.nproc is None:
            argv: tuple[str, ...] = (sys.executable, script)
        else:
            argv = (sys.executable, "-m", "hostir.cli", "run", script, "--nproc", str(self.nproc))
        return Run(name=str(self), argv=argv, timeout_s=SCRIPT_TIMEOUT_S, files=files)


def runs_of(params: dict) -> list[Run]:
    """The runs a test with these parameters needs."""
    runs = []
    for value in params.values():
        if isinstance(value, Block):
            runs.append(docs_run(value.path))
        elif isinstance(value, Launch):
            runs.append(value.run())
    return runs


@pytest.fixture(scope="module")
def runner(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A Runner that has started every run the selected tests of this module need."""
    runner = Runner(tmp_path_factory.mktemp("docs"))
    module = sys.modules[__name__]
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and getattr(item, "module", None) is module:
            for run in runs_of(callspec.params):
                runner.start(run)
    yield runner
    runner.stop()


def block_result(runner: Runner, block: Block) -> dict:
    """What ``block`` did in its file's docs run: status, stdout, stderr."""
    result = runner.result(docs_run(block.path))
    results_file = result.folder / "results.json"
    assert result.returncode == 0 and results_file.exists(), (
        f"the docs runner for {block.path.name} failed: {result.describe()}"
    )
    runnable = [b for b in BLOCKS if b.path == block.path and not b.no_run]
    return json.loads(results_file.read_text())[runnable.index(block)]


def describe_block(block: Block, outcome: dict) -> str:
    status = outcome["status"]
    if status == -signal.SIGALRM:
        ending = f"ran over its time limit of {BLOCK_TIMEOUT_S} s"
    elif status < 0:
        ending = f"was killed by {signal.Signals(-status).name}"
    else:
        ending = f"exited with {status}"
    return (
        f"{block.id} {ending}\n--- stdout ---\n{outcome['stdout']}"
        f"\n--- stderr ---\n{outcome['stderr']}"
    )


# ---------------------------------------------------------------------------
# The tests


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.id)
def test_doc_block_runs(block: Block, runner: Runner) -> None:
    if block.no_run:
        assert "not run" in block.before.lower(), (
            f"{block.id} is marked no-run: the paragraph before it must say why it is not run"
        )
        pytest.skip(f"{block.id} is marked no-run: {block.before}")
    outcome = block_result(runner, block)
    assert outcome["status"] == 0, describe_block(block, outcome)


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.expected is not None], ids=lambda block: block.id
)
def test_doc_block_prints_what_the_docs_show(block: Block, runner: Runner) -> None:
    assert not block.no_run, f"{block.id} shows its output, so it must run"
    outcome = block_result(runner, block)
    assert outcome["status"] == 0, describe_block(block, outcome)
    assert outcome["stdout"].rstrip("\n") == block.expected.rstrip("\n")


def test_readme_tour_output_is_checked() -> None:
    """The README's printed program is compared with what its tour prints (the
    "prints" paragraph that pairs them is not lost)."""
    shown = [b.expected for b in BLOCKS if b.path.name == "README.md" and b.expected]
    assert any(text.startswith("%HostIrContainer {") for text in shown)


@pytest.mark.parametrize(
    "launch", [Launch(b, n) for b in BLOCKS for n in b.nprocs if not b.no_run], ids=str
)
def test_doc_block_runs_on_ranks(launch: Launch, runner: Runner) -> None:
    result = runner.result(launch.run())
    assert result.returncode == 0 and not result.timed_out, result.describe()


@pytest.mark.parametrize(
    "launch", [Launch(path, n) for path in EXAMPLES for n in (None, *NPROCS)], ids=str
)
def test_example_runs(launch: Launch, runner: Runner) -> None:
    result = runner.result(launch.run())
    assert result.returncode == 0 and not result.timed_out, result.describe()
    world = launch.nproc or 1
    ok = {
        int(match[1])
        for match in map(RANK_OK.match, result.stdout.splitlines())
        if match and int(match[2]) == world
    }
    assert ok == set(range(world)), f"ranks that printed OK: {sorted(ok)}\n{result.describe()}"
