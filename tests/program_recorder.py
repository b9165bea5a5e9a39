"""The program recorder: with ``HOSTIR_RECORD_PROGRAMS=DIR`` set, every program the
lowering produces during a test run is written to DIR, so that a refactoring can show
that the suite's programs print, serialize, draw and count as before
(``python3 scripts/record_programs.py compare BEFORE AFTER``).

What is recorded, under DIR:

- ``programs/<hash>/``: one folder per distinct program, named by the first 16 hex
  digits of the SHA-256 of its text, holding ``program.hir`` (``str(program)``),
  ``program.json`` (``program.to_json()``), ``program.dot`` (``hostir.to_dot``'s
  source) and ``traffic.txt`` (the static traffic at the program's world size, as
  ``hostir traffic`` counts it, with no bindings; or the error it gives).
- ``manifest/<key>.json``: one entry per lowering: the test that lowered it (pytest's
  node id, or ``run NAME`` for a child run), the kind of process (``pytest`` or
  ``python``), its rank, the ordinal of the lowering within that test in that process
  (0, 1, ...) and the program's hash.

Where it hooks: ``lowering.lower_fusion`` (``FusionDefinition.execute`` and
``host_ir``, the fuzzer and the scripts all lower through it) is wrapped, in every
process of the run:

- the pytest process: this module is a pytest plugin (tests/conftest.py) that installs
  the wrapper at configure time, when the variable is set;
- every Python interpreter started after that (the multi-rank pools' fork server and
  so their workers, tests/fork_server.py and so every child run, ``hostir run``'s
  ranks): the plugin puts tests/program_recording/ first on ``PYTHONPATH``; its
  ``sitecustomize`` installs the wrapper when ``lowering`` is first imported.

The test a lowering belongs to is ``PYTEST_CURRENT_TEST`` (pytest sets it in its own
process; the pools' workers set it from the job, tests/multidevice_pool.py); a child
run (tests/child_runs.py) is named by ``HOSTIR_RECORD_RUN`` (its run's name), since
runs are often submitted by a fixture on behalf of many tests.

Without the variable nothing is installed: the plugin's configure hook reads it once,
and no other process sees the site folder. Several processes may record at once:
each file is written under a temporary name and renamed; a program's folder is
renamed into place whole, so a program written by several ranks is kept once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import tempfile
from collections.abc import Callable
from typing import Any

RECORD_VARIABLE = "HOSTIR_RECORD_PROGRAMS"
"""The folder to record into; unset (or empty): nothing is recorded."""
RUN_VARIABLE = "HOSTIR_RECORD_RUN"
"""Set by tests/child_runs.py in a child run while recording: the run's name."""
SITE = pathlib.Path(__file__).resolve().parent / "program_recording"
"""The folder whose sitecustomize installs the recorder in new interpreters."""
ARTIFACTS = ("program.hir", "program.json", "program.dot", "traffic.txt")
"""The files of a recorded program, in the order the comparison lists them."""

_ordinals: dict[str, int] = {}
"""Per test, how many programs this process has lowered in it."""
_process = "python"
"""What this process is: ``pytest`` (the plugin installed the recorder) or ``python``
(any other: a pool worker, a child run, a rank of ``hostir run``, a test's subprocess)."""


# ---------------------------------------------------------------------------
# The pytest plugin


def pytest_configure(config: Any) -> None:
    """Installs the recorder in this process, and in every interpreter started from it."""
    folder = os.environ.get(RECORD_VARIABLE)
    if not folder:
        return
    os.environ[RECORD_VARIABLE] = str(pathlib.Path(folder).resolve())  # children may chdir
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(SITE) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), *paths]))
    global _process
    _process = "pytest"
    install()


# ---------------------------------------------------------------------------
# Installing


def install() -> None:
    """Wraps ``lowering.lower_fusion`` so that it records what it returns (once)."""
    import lowering
    from lowering import pipeline

    if getattr(pipeline.lower_fusion, "records_programs", False):
        return
    recording = _recording(pipeline.lower_fusion)
    pipeline.lower_fusion = recording
    lowering.lower_fusion = recording


def _recording(lower: Callable) -> Callable:
    @functools.wraps(lower)
    def lower_fusion(fusion: Any) -> Any:
        program = lower(fusion)
        record(program)
        return program

    lower_fusion.records_programs = True  # type: ignore[attr-defined]
    return lower_fusion


# ---------------------------------------------------------------------------
# Recording


def current_test() -> str:
    """The test (pytest node id) this process is running, or the child run it is."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rpartition(" (")[0]  # "id (call)"
    run = os.environ.get(RUN_VARIABLE)
    if run:
        return f"run {run}" + (f" > {test}" if test else "")
    return test or "(outside a test)"


def record(program: Any, folder: str | os.PathLike | None = None) -> str:
    """Writes ``program`` and its manifest entry under ``folder`` (default: the
    variable's); returns the program's hash."""
    root = pathlib.Path(folder or os.environ[RECORD_VARIABLE])
    text = str(program)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    test = current_test()
    rank = int(os.environ.get("RANK") or 0)
    ordinal = _ordinals[test] = _ordinals.get(test, -1) + 1
    if not (root / "programs" / digest).is_dir():
        _write_program(root / "programs", digest, program, text)
    entry = {"test": test, "process": _process, "rank": rank, "ordinal": ordinal}
    entry["program"] = digest
    key = hashlib.sha256(f"{test}\0{_process}\0{rank}\0{ordinal}".encode()).hexdigest()[:24]
    _write_atomically(root / "manifest" / f"{key}.json", json.dumps(entry, indent=1) + "\n")
    return digest


def artifacts(program: Any, text: str | None = None) -> dict[str, str]:
    """The recorded files of ``program``: name -> content. A part that fails records
    its error (the recorder never changes what a test sees)."""
    return {
        "program.hir": str(program) if text is None else text,
        "program.json": _or_error(program.to_json),
        "program.dot": _or_error(lambda: _dot_source(program)),
        "traffic.txt": _or_error(lambda: _traffic(program)),
    }


def _dot_source(program: Any) -> str:
    from hostir import to_dot

    return to_dot(program).source


def _traffic(program: Any) -> str:
    """What ``hostir traffic`` prints for the program at its own world size (the largest
    device of any of its meshes, plus one), with no bindings."""
    from hostir.analysis.traffic import count_traffic, traffic_report
    from hostir.cli.arguments import traffic_world
    from hostir.ir.program_info import program_meshes

    devices = max((mesh.max_device() + 1 for mesh in program_meshes(program)), default=1)
    world = traffic_world(devices, program)  # refuses a world too large to count
    return f"at {world} ranks\n{traffic_report(count_traffic(program, world, {}))}\n"


def _or_error(make: Callable[[], str]) -> str:
    try:
        return make()
    except Exception as error:  # recorded, compared like any other output
        return f"error: {type(error).__name__}: {error}\n"


def _write_program(programs: pathlib.Path, digest: str, program: Any, text: str) -> None:
    """Writes the program's files into a fresh folder, then renames it into place; if
    another process got there first, its (identical) copy stays."""
    programs.mkdir(parents=True, exist_ok=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=programs))
    for name, content in artifacts(program, text).items():
        (scratch / name).write_text(content)
    try:
        os.rename(scratch, programs / digest)
    except OSError:  # the folder exists now: written by another rank
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()


def _write_atomically(path: pathlib.Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w") as file:
        file.write(content)
    os.replace(scratch, path)


# ---------------------------------------------------------------------------
# Reading a recording back (scripts/record_programs.py compares two)


def read_manifest(folder: str | os.PathLike) -> dict[tuple[str, str, int, int], str]:
    """(test, process, rank, ordinal) -> program hash, for every lowering recorded in
    ``folder``."""
    entries = {}
    for path in sorted(pathlib.Path(folder, "manifest").glob("*.json")):
        e = json.loads(path.read_text())
        entries[e["test"], e["process"], e["rank"], e["ordinal"]] = e["program"]
    return entries


def read_program(folder: str | os.PathLike, digest: str) -> dict[str, str]:
    """The recorded files of one program: name -> content."""
    where = pathlib.Path(folder, "programs", digest)
    return {name: (where / name).read_text() for name in ARTIFACTS}


def program_hashes(folder: str | os.PathLike) -> set[str]:
    """The hashes of every program recorded in ``folder``."""
    programs = pathlib.Path(folder, "programs")
    if not programs.is_dir():
        return set()
    return {p.name for p in programs.iterdir() if p.is_dir() and not p.name.startswith(".")}
