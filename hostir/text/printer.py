"""The text form of a host IR program.

One instruction per line, loop bodies indented by two spaces, ``key=value``
parameters. A tensor's full type is printed where it is defined (an input, an
``allocate``, or the left of ``=``); later uses print its name only::

    %HostIrContainer {
      mesh M0 = [0, 1, 2, 3]
      input T0 : float32[i0, 8] @M0
      input T1 : float32[32, 8] @M0 {0: [x, 8]}
      T2 : float32[i0, 32] @M0 {1: [x, 8]} = linear(T0, T1)
      output T2
    }

A sharding ``{d: [parts]}`` lists the parts of each sharded dim, outer to
inner: a mesh axis name or a local extent. Unlisted dims are replicated. What the
program requires of the values its inputs bind follows the inputs
(``require 5 <= i1 else "..."``, ``hostir.ir.requirements``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hostir.ir.communications import Wait
from hostir.ir.container import HostIrContainer, ScalarInput
from hostir.ir.fields import FieldKind
from hostir.ir.instructions import (
    Allocate,
    Deallocate,
    ForLoop,
    Instruction,
    keyword,
)
from hostir.ir.mesh_names import MeshNames, mesh_names, written_dims
from hostir.ir.requirements import Requirement
from hostir.ir.scalars import Scalar, print_scalar
from hostir.ir.sharding import Sharding
from hostir.ir.team import print_team
from hostir.ir.values import StreamValue, TensorValue
from hostir.text.syntax import print_call

INDENT = "  "


def print_program(program: HostIrContainer) -> str:
    """The text form of ``program``."""
    meshes = mesh_names(program)  # named in the order the text writes them
    body: list[str] = []
    for value in program.inputs:
        body.append(f"input {print_declaration(value, meshes)}")
    for requirement in program.requires:
        body.append(print_requirement(requirement))
    for instruction in program.body:
        body.extend(print_instruction(instruction, meshes))
    for value in program.outputs:
        body.append(f"output {value.name}")
    header = [f"mesh {name} = {mesh}" for mesh, name in meshes.names.items()]
    lines = ["%HostIrContainer {"] + [INDENT + line for line in header + body] + ["}"]
    return "\n".join(lines) + "\n"


def print_requirement(requirement: Requirement) -> str:
    """``require 5 <= i1 else "var of T0: correction {low} is larger than ..."``."""
    low, high = print_scalar(requirement.low), print_scalar(requirement.high)
    return f'require {low} <= {high} else "{requirement.message}"'


def print_declaration(value: TensorValue | ScalarInput, meshes: MeshNames) -> str:
    """``T0 : float32[i0, 8] @M0 {0: [x, i0 // 4]}`` or ``s0 : float64``."""
    if isinstance(value, ScalarInput):
        return f"{value.name} : {value.dtype.value}"
    shape = ", ".join(print_scalar(e) for e in value.shape)
    text = f"{value.name} : {value.dtype.value}[{shape}]"
    if value.sharding is not None:
        text += " " + print_sharding(value.sharding, meshes, value.shape)
    return text


def print_sharding(
    sharding: Sharding, meshes: MeshNames, shape: tuple[Scalar, ...] | None = None
) -> str:
    """``@M0 {0: [x, i0 // 4]} partial{y: sum}``. A dim is omitted when it is one local
    part of the dim's whole extent (replicated); with no ``shape`` given, every dim
    without a mesh axis is omitted."""
    text = f"@{meshes.name(sharding.mesh)}"
    dims = []
    for dim, parts in written_dims(sharding, shape):
        shown = ", ".join(
            p.axis.value if p.axis else print_scalar(p.extent, meshes.name) for p in parts
        )
        dims.append(f"{dim}: [{shown}]")
    if dims:
        text += " {" + ", ".join(dims) + "}"
    if sharding.partial:
        text += " partial{" + ", ".join(f"{p.axis.value}: {p.op.value}" for p in sharding.partial)
        text += "}"
    return text


def print_instruction(instruction: Instruction, meshes: MeshNames) -> list[str]:
    """The lines of one instruction (several for a loop): a statement of the language, or
    a call written as its declaration says (``hostir.text.syntax``)."""
    statement = _STATEMENTS.get(type(instruction))
    if statement is not None:
        return statement(instruction, meshes)
    return [
        print_call(
            instruction,
            keyword(instruction),
            _value_printers(meshes),
            lambda value: print_declaration(value, meshes),
        )
    ]


def _value_printers(meshes: MeshNames) -> dict[FieldKind, Callable[[Any], str]]:
    """How each kind of field prints, with this program's mesh names."""
    return {
        FieldKind.TENSOR: lambda value: value.name,
        FieldKind.OPERAND: lambda value: (
            value.name if isinstance(value, TensorValue) else print_scalar(value, meshes.name)
        ),
        FieldKind.SCALAR: lambda value: print_scalar(value, meshes.name),
        FieldKind.INT: str,
        FieldKind.BOOL: lambda value: "true" if value else "false",
        FieldKind.INTS: lambda values: "[" + ", ".join(str(v) for v in values) + "]",
        FieldKind.TEAM: lambda team: print_team(team, meshes.name),
        FieldKind.STREAM: lambda stream: print_stream(stream, meshes),
        FieldKind.ENUM: lambda member: member.value,
        FieldKind.HOST: lambda value: value.name,
    }


def _print_allocate(instruction: Allocate, meshes: MeshNames) -> list[str]:
    return [f"allocate {print_declaration(instruction.out, meshes)}"]


def _print_deallocate(instruction: Deallocate, meshes: MeshNames) -> list[str]:
    return [f"deallocate {instruction.tensor.name}"]


def _print_for_loop(instruction: ForLoop, meshes: MeshNames) -> list[str]:
    start = print_scalar(instruction.start, meshes.name)
    stop = print_scalar(instruction.stop, meshes.name)
    lines = [f"for {instruction.index.name} in range({start}, {stop}) {{"]
    for inner in instruction.body:
        lines.extend(INDENT + line for line in print_instruction(inner, meshes))
    return lines + ["}"]


def _print_wait(instruction: Wait, meshes: MeshNames) -> list[str]:
    return [f"wait {instruction.request.name}"]


def print_stream(stream: StreamValue, meshes: MeshNames) -> str:
    """``main`` for a bound stream, ``stream(i)`` for stream ``i`` of the pool."""
    if stream.index is None:
        return stream.name
    return f"stream({print_scalar(stream.index, meshes.name)})"


_STATEMENTS: dict[type, Callable[..., list[str]]] = {
    Allocate: _print_allocate,
    Deallocate: _print_deallocate,
    ForLoop: _print_for_loop,
    Wait: _print_wait,
}
"""The statements of the language; every other instruction prints as a call."""
