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
inner: a mesh axis name or a local extent. Unlisted dims are replicated.
"""

from __future__ import annotations

from collections.abc import Callable

from hostir.communications import COLLECTIVES, LocalShard, Wait
from hostir.container import HostIrContainer, ScalarInput
from hostir.instructions import (
    COMPUTE,
    Allocate,
    BroadcastInDim,
    Deallocate,
    ForLoop,
    Instruction,
    Linear,
    Permute,
    ShardByStream,
    Sum,
    keyword,
)
from hostir.scalars import Scalar, print_scalar
from hostir.sharding import Mesh, MeshAxis, ReduceOp, Sharding, ShardPart
from hostir.streams import GetCurrentStream, SetCurrentStream, Synchronize
from hostir.team import Team
from hostir.values import StreamValue, TensorValue

INDENT = "  "


class _MeshNames:
    """Assigns ``M0, M1, ...`` to meshes in order of first appearance."""

    def __init__(self) -> None:
        self.names: dict[Mesh, str] = {}

    def name(self, mesh: Mesh) -> str:
        return self.names.setdefault(mesh, f"M{len(self.names)}")


def print_program(program: HostIrContainer) -> str:
    """The text form of ``program``."""
    meshes = _MeshNames()
    body: list[str] = []
    for value in program.inputs:
        body.append(f"input {print_declaration(value, meshes)}")
    for instruction in program.body:
        body.extend(print_instruction(instruction, meshes))
    for value in program.outputs:
        body.append(f"output {value.name}")
    header = [f"mesh {name} = {mesh}" for mesh, name in meshes.names.items()]
    lines = ["%HostIrContainer {"] + [INDENT + line for line in header + body] + ["}"]
    return "\n".join(lines) + "\n"


def print_declaration(value: TensorValue | ScalarInput, meshes: _MeshNames) -> str:
    """``T0 : float32[i0, 8] @M0 {0: [x, i0 // 4]}`` or ``s0 : float64``."""
    if isinstance(value, ScalarInput):
        return f"{value.name} : {value.dtype.value}"
    shape = ", ".join(print_scalar(e) for e in value.shape)
    text = f"{value.name} : {value.dtype.value}[{shape}]"
    if value.sharding is not None:
        text += " " + print_sharding(value.sharding, meshes, value.shape)
    return text


def print_sharding(
    sharding: Sharding, meshes: _MeshNames, shape: tuple[Scalar, ...] | None = None
) -> str:
    """``@M0 {0: [x, i0 // 4]} partial{y: sum}``. A dim is omitted when it is one local
    part of the dim's whole extent (replicated); with no ``shape`` given, every dim
    without a mesh axis is omitted."""
    text = f"@{meshes.name(sharding.mesh)}"
    dims = []
    for dim, parts in enumerate(sharding.dims):
        whole = (ShardPart(axis=None, extent=shape[dim]),) if shape is not None else None
        if parts == whole or (shape is None and all(p.axis is None for p in parts)):
            continue
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


def print_instruction(instruction: Instruction, meshes: _MeshNames) -> list[str]:
    """The lines of one instruction (several for a loop)."""
    printer = _PRINTERS.get(type(instruction))
    if printer is None:
        raise TypeError(f"no printer for instruction {type(instruction).__name__}")
    return printer(instruction, meshes)


def _operand(value: object, meshes: _MeshNames) -> str:
    if isinstance(value, TensorValue):
        return value.name
    return print_scalar(value, meshes.name)  # type: ignore[arg-type]


def _ints(values: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _compute_params(instruction: Instruction, meshes: _MeshNames) -> list[str]:
    """The operands and ``key=value`` attributes of a compute instruction."""
    if isinstance(instruction, Linear):
        ins = [instruction.input.name, instruction.weight.name]
        ins += [f"bias={instruction.bias.name}"] if instruction.bias else []
    else:
        ins = [_operand(getattr(instruction, name), meshes) for name in instruction.INS]
    if isinstance(instruction, Sum):
        ins += [f"dims={_ints(instruction.dims)}", f"keepdim={str(instruction.keepdim).lower()}"]
    if isinstance(instruction, BroadcastInDim):
        ins += [f"broadcast_dims={_ints(instruction.broadcast_dims)}"]
    if isinstance(instruction, Permute):
        ins += [f"dims={_ints(instruction.dims)}"]
    return ins


def _print_compute(instruction: Instruction, meshes: _MeshNames) -> list[str]:
    params = _compute_params(instruction, meshes)
    out = instruction.out  # type: ignore[union-attr]
    if instruction.preallocated:  # type: ignore[union-attr]
        return [f"{keyword(instruction)}({', '.join(params + [f'out={out.name}'])})"]
    return [f"{print_declaration(out, meshes)} = {keyword(instruction)}({', '.join(params)})"]


def _print_allocate(instruction: Allocate, meshes: _MeshNames) -> list[str]:
    return [f"allocate {print_declaration(instruction.out, meshes)}"]


def _print_deallocate(instruction: Deallocate, meshes: _MeshNames) -> list[str]:
    return [f"deallocate {instruction.tensor.name}"]


def _print_shard_by_stream(instruction: ShardByStream, meshes: _MeshNames) -> list[str]:
    out = print_declaration(instruction.out, meshes)
    index = print_scalar(instruction.index, meshes.name)
    args = f"{instruction.src.name}, axis={instruction.axis}, index={index}"
    return [f"{out} = shard_by_stream({args})"]


def _print_for_loop(instruction: ForLoop, meshes: _MeshNames) -> list[str]:
    start = print_scalar(instruction.start, meshes.name)
    stop = print_scalar(instruction.stop, meshes.name)
    lines = [f"for {instruction.index.name} in range({start}, {stop}) {{"]
    for inner in instruction.body:
        lines.extend(INDENT + line for line in print_instruction(inner, meshes))
    return lines + ["}"]


def print_team(team: Team, meshes: _MeshNames) -> str:
    """``M0(y, x)``: the team's mesh and its axes, outer first."""
    return f"{meshes.name(team.mesh)}({', '.join(axis.value for axis in team.axes)})"


_COMMUNICATION_PARAMS = (
    "axis",
    "inner",
    "split_axis",
    "concat_axis",
    "root",
    "sender",
    "receiver",
    "send_peer",
    "recv_peer",
    "mesh_axis",
    "op",
)
"""Attributes of communications, printed as ``key=value`` in this order when set."""


def _param_text(value: object, meshes: _MeshNames) -> str:
    if isinstance(value, MeshAxis | ReduceOp):
        return value.value
    if isinstance(value, int):
        return str(value)
    return print_scalar(value, meshes.name)  # type: ignore[arg-type]


def _communication_params(instruction: Instruction, meshes: _MeshNames) -> list[str]:
    params = [instruction.src.name]  # type: ignore[union-attr]
    team = getattr(instruction, "team", None)
    if team is not None:
        params.append(f"team={print_team(team, meshes)}")
    for name in _COMMUNICATION_PARAMS:
        value = getattr(instruction, name, None)
        if value is not None:
            params.append(f"{name}={_param_text(value, meshes)}")
    if getattr(instruction, "preallocated", False):
        params.append(f"out={instruction.out.name}")  # type: ignore[union-attr]
    return params


def _print_communication(instruction: Instruction, meshes: _MeshNames) -> list[str]:
    """``T3 : <type>, R0 = Allgather(T2, team=M0(x), axis=0)``."""
    call = f"{keyword(instruction)}({', '.join(_communication_params(instruction, meshes))})"
    defined = []
    if not getattr(instruction, "preallocated", False):
        defined.append(print_declaration(instruction.out, meshes))  # type: ignore[union-attr]
    request = getattr(instruction, "request", None)
    if request is not None:
        defined.append(request.name)
    return [f"{', '.join(defined)} = {call}" if defined else call]


def _print_wait(instruction: Wait, meshes: _MeshNames) -> list[str]:
    return [f"wait {instruction.request.name}"]


def print_stream(stream: StreamValue, meshes: _MeshNames) -> str:
    """``main`` for a bound stream, ``stream(i)`` for stream ``i`` of the pool."""
    if stream.index is None:
        return stream.name
    return f"stream({print_scalar(stream.index, meshes.name)})"


def _print_get_current_stream(instruction: GetCurrentStream, meshes: _MeshNames) -> list[str]:
    return [f"{instruction.out.name} = get_current_stream()"]


def _print_stream_use(instruction: SetCurrentStream | Synchronize, meshes: _MeshNames) -> list[str]:
    return [f"{keyword(instruction)}({print_stream(instruction.stream, meshes)})"]


_PRINTERS: dict[type, Callable[..., list[str]]] = {
    GetCurrentStream: _print_get_current_stream,
    SetCurrentStream: _print_stream_use,
    Synchronize: _print_stream_use,
    Wait: _print_wait,
    LocalShard: _print_communication,
    **{cls: _print_communication for cls in COLLECTIVES},
    Allocate: _print_allocate,
    Deallocate: _print_deallocate,
    ShardByStream: _print_shard_by_stream,
    ForLoop: _print_for_loop,
    **{cls: _print_compute for cls in COMPUTE},
}
