"""The verifier's rules for communications: what each does to its operand's layout.

Every communication keeps its operand's dtype and, except AllToAll (which trades
extent between two dims), its global extents. Beyond that, one rule per class in
:data:`COMMUNICATION_RULES` checks the local extents the communicator contract
gives (an Allgather's ``out`` is ``src`` times the team along ``axis``, ...) and,
for the collectives that change how a tensor is spread, its partial axes:
``Allreduce`` and ``ReduceScatter`` need ``src`` partial over the team's axes
(with their ``op``) and leave ``out`` without them; an ``AllToAllV`` reduces only
partial axes its team spans and creates none. A rule returns the problem as a
sentence, or None. Extents are compared symbolically (:mod:`hostir.ir.extents`).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from hostir.check.verify_run_time import ragged_problem, to_host_problem
from hostir.ir.communications import (
    Allgather,
    Allreduce,
    AllToAll,
    AllToAllV,
    Broadcast,
    CollectivePermute,
    Gather,
    LocalShard,
    RaggedAllToAll,
    Reduce,
    ReduceScatter,
    Scatter,
    SendRecv,
)
from hostir.ir.extents import Normal, differ, local_extents, scaled
from hostir.ir.host_reads import ToHost
from hostir.ir.values import TensorValue


def _dims_text(value: TensorValue) -> str:
    return f"{value.name} ({value.dtype.value}, {len(value.shape)}-d)"


def _common(instruction: Any, same_shape: bool = True) -> str | None:
    """dtype and global extents: a communication moves data, it does not change it."""
    src, out = instruction.src, instruction.out
    if src.dtype is not out.dtype:
        return f"{out.name} is {out.dtype.value} but {src.name} is {src.dtype.value}"
    if len(src.shape) != len(out.shape):
        return f"{_dims_text(out)} and {_dims_text(src)} differ in rank"
    if same_shape and any(differ(a, b) for a, b in zip(src.shape, out.shape, strict=True)):
        return f"{out.name} and {src.name} must have the same global extents"
    return None


def _same_local_extents(a: list[Normal], b: list[Normal]) -> bool:
    return len(a) == len(b) and not any(differ(x, y) for x, y in zip(a, b, strict=True))


def _local(
    instruction: Any, *, axis: int | None = None, factor: Fraction = Fraction(1)
) -> str | None:
    """``out``'s local extents are ``src``'s, dim ``axis`` times ``factor``."""
    src, out = instruction.src, instruction.out
    expected = local_extents(src)
    if axis is not None:
        if not 0 <= axis < len(expected):
            return f"axis {axis} is out of range for the {len(expected)}-d {src.name}"
        expected[axis] = scaled(expected[axis], factor)
    if not _same_local_extents(local_extents(out), expected):
        what = "as" if axis is None else f"as {src.name}'s, dim {axis} scaled by {factor},"
        return (
            f"{out.name}'s local extents must be {what} {src.name}'s (the communicator"
            " moves whole local buffers)"
        )
    return None


def _partial(value: TensorValue) -> dict:
    return {} if value.sharding is None else {p.axis: p.op for p in value.sharding.partial}


def _reduces_team(instruction: Any) -> str | None:
    """Allreduce / ReduceScatter: ``src`` partial over every team axis with ``op``; ``out``
    keeps only ``src``'s other partial axes."""
    src, out, op = instruction.src, instruction.out, instruction.op
    if instruction.team.size == 1:
        return None  # a team of one reduces nothing: partial or not, the values are final
    have, left = _partial(src), _partial(out)
    missing = [a.value for a in instruction.team.axes if have.get(a) is not op]
    name = type(instruction).__name__
    if missing:
        return (
            f"{name} reduces {src.name} over ({', '.join(missing)}) with {op.value}, but"
            f" {src.name} is not partial ({op.value}) there: nothing to reduce"
        )
    expected = {a: o for a, o in have.items() if a not in instruction.team.axes}
    if left != expected:
        return f"{out.name} must stay partial over exactly what the {name} does not reduce"
    return None


def _rule_allreduce(instruction: Allreduce) -> str | None:
    return _common(instruction) or _reduces_team(instruction) or _local(instruction)


def _rule_reduce_scatter(instruction: ReduceScatter) -> str | None:
    size = Fraction(1, instruction.team.size)
    return (
        _common(instruction)
        or _reduces_team(instruction)
        or _local(instruction, axis=instruction.axis, factor=size)
    )


def _rule_allgather(instruction: Allgather) -> str | None:
    if _partial(instruction.src) != _partial(instruction.out):
        return f"Allgather keeps partial axes: {instruction.out.name} and {instruction.src.name}"
    return _common(instruction) or _local(
        instruction, axis=instruction.axis, factor=Fraction(instruction.team.size)
    )


def _rule_all_to_all(instruction: AllToAll) -> str | None:
    problem = _common(instruction, same_shape=False)
    if problem:
        return problem
    src, out = instruction.src, instruction.out
    expected = local_extents(src)
    size = instruction.team.size
    for axis in (instruction.split_axis, instruction.concat_axis):
        if not 0 <= axis < len(expected):
            return f"axis {axis} is out of range for the {len(expected)}-d {src.name}"
    expected[instruction.split_axis] = scaled(expected[instruction.split_axis], Fraction(1, size))
    expected[instruction.concat_axis] = scaled(expected[instruction.concat_axis], size)
    if not _same_local_extents(local_extents(out), expected):
        return (
            f"{out.name}'s local extents must be {src.name}'s with dim {instruction.split_axis}"
            f" divided and dim {instruction.concat_axis} multiplied by the team size {size}"
        )
    return None


def _rule_all_to_all_v(instruction: AllToAllV) -> str | None:
    src, out = instruction.src, instruction.out
    problem = _common(instruction)
    if problem:
        return problem
    mesh = instruction.team.mesh
    for value in (src, out):
        if value.sharding is None or value.sharding.mesh != mesh:
            return f"AllToAllV moves data within its team's mesh; {value.name} is not on it"
    have, left = _partial(src), _partial(out)
    if any(have.get(a) is not op for a, op in left.items()):
        return f"AllToAllV cannot make {out.name} partial where {src.name} is not"
    reduced = [a for a in have if a not in left]
    if any(a not in instruction.team.axes for a in reduced):
        return f"AllToAllV reduces partial axes of {src.name} its team does not span"
    if reduced and instruction.op is None:
        return f"AllToAllV reduces the partial axes of {src.name}: it needs an op"
    if instruction.rounds is not None and instruction.rounds < 1:
        return f"AllToAllV of {src.name} has rounds={instruction.rounds}; expected 1 or more"
    return None


def _rule_local_shard(instruction: LocalShard) -> str | None:
    mesh = instruction.out.sharding.mesh if instruction.out.sharding is not None else None
    if mesh is None:
        return f"local_shard needs {instruction.out.name} on a mesh"
    size = mesh.axis_size(instruction.mesh_axis)
    return _common(instruction) or _local(
        instruction, axis=instruction.axis, factor=Fraction(1, size)
    )


def _rule_same_local(instruction: Any) -> str | None:
    """Broadcast, Reduce, SendRecv, CollectivePermute: whole local buffers go as they are
    (a stream loop's chunk can take a whole shard: only local extents must agree)."""
    return _common(instruction, same_shape=False) or _local(instruction)


def _rule_gather(instruction: Gather) -> str | None:
    size = Fraction(instruction.team.size)
    return _common(instruction, same_shape=False) or _local(
        instruction, axis=instruction.axis, factor=size
    )


def _rule_scatter(instruction: Scatter) -> str | None:
    size = Fraction(1, instruction.team.size)
    return _common(instruction, same_shape=False) or _local(
        instruction, axis=instruction.axis, factor=size
    )


COMMUNICATION_RULES: dict[type, Callable[[Any], str | None]] = {
    Allreduce: _rule_allreduce,
    ReduceScatter: _rule_reduce_scatter,
    Allgather: _rule_allgather,
    AllToAll: _rule_all_to_all,
    AllToAllV: _rule_all_to_all_v,
    LocalShard: _rule_local_shard,
    Broadcast: _rule_same_local,
    Reduce: _rule_same_local,
    SendRecv: _rule_same_local,
    CollectivePermute: _rule_same_local,
    Gather: _rule_gather,
    Scatter: _rule_scatter,
    RaggedAllToAll: ragged_problem,
    ToHost: to_host_problem,
}
"""One rule per communication class (and LocalShard, which reshards without one; ToHost,
which reads values to the host: hostir.check.verify_run_time)."""
