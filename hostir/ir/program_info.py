"""Facts about a whole program: its instructions in order, the teams it
communicates over, the meshes it uses and whether they fit a world."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from hostir.errors import MeshError
from hostir.ir.container import HostIrContainer
from hostir.ir.instructions import ForLoop, Instruction, defined_symbols
from hostir.ir.sharding import Mesh
from hostir.ir.team import Team
from hostir.ir.values import TensorValue


def program_teams(program: HostIrContainer) -> list[Team]:
    """Every team the program communicates over, in program order, without repeats."""
    teams: dict[Team, None] = {}
    for instruction in walk_instructions(program.body):
        team = getattr(instruction, "team", None)
        if team is not None:
            teams.setdefault(team, None)
    return list(teams)


def walk_instructions(body: Sequence[Instruction]) -> Iterator[Instruction]:
    """Every instruction of ``body``, loop bodies included, in program order."""
    for instruction in body:
        yield instruction
        if isinstance(instruction, ForLoop):
            yield from walk_instructions(instruction.body)


def run_time_symbols(program: HostIrContainer) -> frozenset[str]:
    """The symbols instructions of ``program`` bind as they run (run-time extents: a
    ``RaggedAllToAll``'s ``received``), which no input signature fixes (cached per program:
    programs are immutable)."""
    found = _RUN_TIME_SYMBOLS.get(id(program))
    if found is None or found[0] is not program:
        names = frozenset(
            name for i in walk_instructions(program.body) for name in defined_symbols(i)
        )
        if len(_RUN_TIME_SYMBOLS) > 256:  # holds the programs it saw: keep it small
            _RUN_TIME_SYMBOLS.clear()
        found = _RUN_TIME_SYMBOLS[id(program)] = (program, names)
    return found[1]


_RUN_TIME_SYMBOLS: dict[int, tuple[HostIrContainer, frozenset[str]]] = {}


def program_meshes(program: HostIrContainer) -> list[Mesh]:
    """Every mesh the program's tensors live on, in order of first appearance."""
    meshes: dict[Mesh, None] = {}

    def visit(value: Any) -> None:
        if isinstance(value, TensorValue) and value.sharding is not None:
            meshes.setdefault(value.sharding.mesh, None)

    for value in program.inputs:
        visit(value)
    for instruction in walk_instructions(program.body):
        for name in instruction.OUTS + instruction.INS:
            visit(getattr(instruction, name))
        team = getattr(instruction, "team", None)
        if team is not None:
            meshes.setdefault(team.mesh, None)
    return list(meshes)


def check_meshes_fit(program: HostIrContainer, world_size: int) -> None:
    """Raises MeshError if a mesh names a device the world does not have."""
    for mesh in program_meshes(program):
        if mesh.max_device() >= world_size:
            raise MeshError(
                f"mesh {mesh} needs device {mesh.max_device()}, but the world has"
                f" {world_size} rank(s) (0..{world_size - 1})"
            )
