"""The names ``M0, M1, ...`` that a program's text gives its meshes, by first appearance.

The printer declares each mesh once (``mesh M0 = [0, 1, 2, 3]``) and writes ``@M0`` or
``M0(x)`` after; messages and pictures that show a program's instructions use the same
names. :func:`mesh_names` reads the program in the order its text is written, so it is
the one place that order is known: the printer names meshes with it before it prints.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from hostir.ir.catalog import declaration_of
from hostir.ir.communications import Wait
from hostir.ir.fields import FieldKind, defined_fields, field_kinds, written_fields
from hostir.ir.instructions import Allocate, Deallocate, ForLoop, Instruction
from hostir.ir.scalars import BinaryExpr, MeshCoordinate, Scalar
from hostir.ir.sharding import Mesh, Sharding, ShardPart
from hostir.ir.values import TensorValue

if TYPE_CHECKING:
    from hostir.ir.container import HostIrContainer, ScalarInput


class MeshNames:
    """Assigns ``M0, M1, ...`` to meshes in order of first appearance."""

    def __init__(self) -> None:
        self.names: dict[Mesh, str] = {}

    def name(self, mesh: Mesh) -> str:
        """``mesh``'s name, the next free one if it has none yet."""
        return self.names.setdefault(mesh, f"M{len(self.names)}")


def mesh_names(program: HostIrContainer) -> MeshNames:
    """The names ``program``'s text gives its meshes."""
    names = MeshNames()
    for mesh in _program_meshes(program):
        names.name(mesh)
    return names


def _program_meshes(program: HostIrContainer) -> Iterator[Mesh]:
    """Every mesh ``program``'s text writes, in the order it writes them (repeats too)."""
    for value in program.inputs:
        yield from declaration_meshes(value)
    yield from _body_meshes(program.body)


def declaration_meshes(value: TensorValue | ScalarInput) -> Iterator[Mesh]:
    """The meshes a tensor's declaration ``T0 : float32[8] @M0 {0: [x, 4]}`` writes:
    its sharding's mesh, then the mesh coordinates in the extents of its sharded dims
    (a dim written as one whole part is not written)."""
    if not isinstance(value, TensorValue) or value.sharding is None:
        return
    yield from sharding_meshes(value.sharding, value.shape)


def sharding_meshes(sharding: Sharding, shape: Sequence[Scalar] | None) -> Iterator[Mesh]:
    """The meshes ``@M0 {0: [x, i0 // 4]}`` writes, in order."""
    yield sharding.mesh
    for _, parts in written_dims(sharding, shape):
        for part in parts:
            if part.axis is None:
                yield from scalar_meshes(part.extent)


def written_dims(
    sharding: Sharding, shape: Sequence[Scalar] | None
) -> list[tuple[int, tuple[ShardPart, ...]]]:
    """The dims a sharding's text writes, with their parts: all but those that are one
    local part of the dim's whole extent (replicated); with no ``shape`` given, all but
    those without a mesh axis."""
    written = []
    for dim, parts in enumerate(sharding.dims):
        whole = (ShardPart(axis=None, extent=shape[dim]),) if shape is not None else None
        if parts == whole or (shape is None and all(p.axis is None for p in parts)):
            continue
        written.append((dim, parts))
    return written


def scalar_meshes(expr: Scalar) -> Iterator[Mesh]:
    """The meshes of the coordinates in ``expr``, left to right, as its text writes them."""
    stack = [expr]
    while stack:  # no recursion: expressions may be deep
        node = stack.pop()
        if isinstance(node, BinaryExpr):
            stack.extend((node.rhs, node.lhs))
        elif isinstance(node, MeshCoordinate):
            yield node.mesh


def _body_meshes(body: Sequence[Instruction]) -> Iterator[Mesh]:
    for instruction in body:
        if isinstance(instruction, Allocate):
            yield from declaration_meshes(instruction.out)
        elif isinstance(instruction, ForLoop):
            yield from scalar_meshes(instruction.start)
            yield from scalar_meshes(instruction.stop)
            yield from _body_meshes(instruction.body)
        elif not isinstance(instruction, Deallocate | Wait):
            yield from _call_meshes(instruction)


def _call_meshes(instruction: Instruction) -> Iterator[Mesh]:
    """A call's meshes in the order ``hostir.text.syntax.print_call`` writes its fields:
    positional ones, then ``name=value`` ones, then the values it defines."""
    cls = type(instruction)
    kinds = field_kinds(cls)
    for name in (*declaration_of(cls).positional, *written_fields(cls)):
        value = getattr(instruction, name)
        if value is not None:
            yield from _field_meshes(kinds[name][0], value)
    for name in defined_fields(instruction):
        yield from declaration_meshes(getattr(instruction, name))


def _field_meshes(kind: FieldKind, value: object) -> Iterator[Mesh]:
    if kind in (FieldKind.OPERAND, FieldKind.SCALAR) and not isinstance(value, TensorValue):
        yield from scalar_meshes(value)  # type: ignore[arg-type]
    elif kind is FieldKind.TEAM:
        yield value.mesh  # type: ignore[attr-defined]
    elif kind is FieldKind.STREAM and value.index is not None:  # type: ignore[attr-defined]
        yield from scalar_meshes(value.index)  # type: ignore[attr-defined]
