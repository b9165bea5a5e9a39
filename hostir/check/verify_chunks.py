"""``check_chunk_uniformity``: a collective in a loop sees the same chunk on every member.

A swizzled stream loop (``swizzle1d``) visits chunk ``(j + coord(M, a)) % S`` at
iteration ``j``: ranks that differ in their coordinate on mesh axis ``a`` hold
*different* chunks in the same iteration. That is what the swizzle is for: a
``CollectivePermute`` (or ``SendRecv``) whose peers are functions of the same
coordinate hands each rank the chunk it needs. Any other communication over a
team whose members differ on ``a`` (an ``Allreduce``, ``ReduceScatter``,
``Allgather``, ``Broadcast``, ``AllToAll``, ...) would combine unrelated chunks:
a wrong result, no error (fuzz seed 6025 at 8 ranks). This check refuses such a
program by name.

A value is *chunk-dependent* on ``coord(M, a)`` when it is

- a ``shard_by_stream`` alias whose index reads both the index of an enclosing
  loop and ``coord(M, a)`` (a swizzled chunk), or an alias of such a value;
- received by a ``CollectivePermute``/``SendRecv`` whose peers read both;
- computed (or communicated) from a chunk-dependent value.

An index that reads coordinates but no loop index (``index=coord(M0, x)``) is
each member's own slot of a buffer, the usual way to write an in-place
Allgather or ReduceScatter, and is not a swizzled chunk.

hostir does not import the frontend or the lowering; the lowering refuses the
same schedules earlier, naming the fusion's tensors (``lowering/stream_loops.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from hostir.errors import VerifyError
from hostir.ir.catalog import Kind, declaration_of
from hostir.ir.communications import CollectivePermute, SendRecv
from hostir.ir.container import HostIrContainer
from hostir.ir.instructions import ForLoop, Instruction, ShardByStream, keyword
from hostir.ir.mesh_names import mesh_names
from hostir.ir.scalars import MeshCoordinate, Scalar, leaves, print_scalar, symbols_of
from hostir.ir.sharding import Mesh, MeshAxis
from hostir.ir.team import Team, print_team
from hostir.ir.values import TensorValue

Path = tuple[int, ...]
Coordinates = frozenset[MeshCoordinate]

_CHUNK_FIELDS = {  # the scalar fields that choose the chunk an instruction's output holds
    ShardByStream: ("index",),
    CollectivePermute: ("recv_peer", "send_peer"),
    SendRecv: ("sender", "receiver"),
}


def check_chunk_uniformity(program: HostIrContainer) -> None:
    """Raises VerifyError (``path``: the instruction's index in the body, then in each
    enclosing loop body) at the first collective other than CollectivePermute/SendRecv
    that reads or writes a chunk-dependent value (module docstring) over a team whose
    members differ in the coordinate the chunk depends on."""
    _Walk(program).body(program.body, (), ())


def team_splits_coordinate(team: Team, mesh: Mesh, axis: MeshAxis) -> bool:
    """Whether two members of one of ``team``'s groups differ in their coordinate on
    ``axis`` of ``mesh`` (a device outside ``mesh`` counts as differing from those in
    it). On ``mesh`` itself: whether the team spans ``axis``."""
    if team.mesh == mesh:
        return axis in team.axes
    dim = axis.dim(mesh.ndim)
    for group in team.groups:
        seen = {_coordinate(mesh, device, dim) for device in group}
        if len(seen) > 1:
            return True
    return False


def swizzle_coordinates(index: Scalar, loop_indices: Iterable[str]) -> Coordinates:
    """The mesh coordinates ``index`` reads if it also reads one of ``loop_indices``
    (a chunk that rotates with the rank), else none."""
    if not symbols_of(index) & set(loop_indices):
        return frozenset()
    return frozenset(leaf for leaf in leaves(index) if isinstance(leaf, MeshCoordinate))


def _coordinate(mesh: Mesh, device: int, dim: int) -> int | None:
    coords = mesh.coordinates(device)
    return None if coords is None else coords[dim]


@dataclasses.dataclass
class _Origin:
    """Why a value is chunk-dependent: the coordinates, and the first value that made it
    so with the field and expression that chose its chunk (for the message)."""

    coordinates: Coordinates
    source: str
    field: str
    index: Scalar


class _Walk:
    """The check's state: which values are chunk-dependent, on which coordinates."""

    def __init__(self, program: HostIrContainer) -> None:
        self.program = program
        self.origins: dict[str, _Origin] = {}

    def body(self, body: Sequence[Instruction], prefix: Path, loops: tuple[str, ...]) -> None:
        for position, instruction in enumerate(body):
            path = (*prefix, position)
            if isinstance(instruction, ForLoop):
                self.body(instruction.body, path, (*loops, instruction.index.name))
            else:
                self.instruction(instruction, path, loops)

    def instruction(self, instruction: Instruction, path: Path, loops: tuple[str, ...]) -> None:
        ins = _tensors(instruction, instruction.INS)
        outs = _tensors(instruction, instruction.OUTS)
        kind = declaration_of(type(instruction)).kind
        if kind is Kind.COLLECTIVE:
            self.check_collective(instruction, [("reads", v) for v in ins], path)
            self.check_collective(instruction, [("writes", v) for v in outs], path)
        origin = self.origin_of(instruction, ins, outs, loops)
        if origin is not None:
            for value in outs:
                self.origins.setdefault(value.name, origin)

    def origin_of(
        self,
        instruction: Instruction,
        ins: list[TensorValue],
        outs: list[TensorValue],
        loops: tuple[str, ...],
    ) -> _Origin | None:
        """What makes ``instruction``'s outputs chunk-dependent: a swizzled index or peer
        of its own, or a chunk-dependent input (None: nothing)."""
        for field in _CHUNK_FIELDS.get(type(instruction), ()):
            index = getattr(instruction, field)
            found = swizzle_coordinates(index, loops)
            if found:
                inherited = [self.origins[v.name] for v in ins if v.name in self.origins]
                for origin in inherited:
                    found |= origin.coordinates
                return _Origin(coordinates=found, source=outs[0].name, field=field, index=index)
        for value in ins:
            if value.name in self.origins:
                return self.origins[value.name]
        return None

    def check_collective(
        self, instruction: Instruction, values: list[tuple[str, TensorValue]], path: Path
    ) -> None:
        """Raises VerifyError if one of ``values`` (each with ``reads`` or ``writes``)
        depends on a coordinate that ``instruction``'s team's members differ in."""
        team: Team | None = getattr(instruction, "team", None)
        if team is None:  # not one of hostir's collectives: nothing to compare
            return
        for verb, value in values:
            origin = self.origins.get(value.name)
            if origin is None:
                continue
            for coordinate in sorted(origin.coordinates, key=_coordinate_key):
                if team_splits_coordinate(team, coordinate.mesh, coordinate.axis):
                    message = self._message(instruction, verb, value, origin, coordinate)
                    raise VerifyError(message, path=path)

    def _message(
        self,
        instruction: Instruction,
        verb: str,
        value: TensorValue,
        origin: _Origin,
        coordinate: MeshCoordinate,
    ) -> str:
        meshes = mesh_names(self.program)
        team = print_team(instruction.team, meshes.name)
        coord = print_scalar(coordinate, meshes.name)
        index = print_scalar(origin.index, meshes.name)
        via = "" if origin.source == value.name else f" (computed from {origin.source})"
        return (
            f"{keyword(instruction)} over team {team} {verb} {value.name}{via}, whose chunk"
            f" depends on {coord} ({origin.source}'s {origin.field} is {index}): the team's"
            f" members differ in {coord}, so they hold different chunks in the same"
            f" iteration and the {keyword(instruction)} would mix data of different chunks;"
            f" index the chunks the same on every member of the team (no {coord}), or"
            " exchange them with CollectivePermute or SendRecv"
        )


def _tensors(instruction: Instruction, names: tuple[str, ...]) -> list[TensorValue]:
    found = (getattr(instruction, name) for name in names)
    return [value for value in found if isinstance(value, TensorValue)]


def _coordinate_key(coordinate: MeshCoordinate) -> tuple:
    return (coordinate.axis.value, str(coordinate.mesh))
