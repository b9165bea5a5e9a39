"""The verifier's rules for run-time extents: ``to_host`` and ``RaggedAllToAll``.

``to_host`` reads an integer tensor. A ``RaggedAllToAll`` moves whole rows along
``axis``: ``src`` and ``out`` have the same dtype, one element on each rank in the dims
before it and the same local extents after it; ``out``'s rows are the symbol it binds
(``received``, a rank-local extent, split over no mesh axis) or an extent that does not
read it; ``src`` does not read it; its counts are a host value read from a ``[P, P]``
integer tensor, P the size of the team's groups; both tensors live on the team's mesh. A
rule returns the problem as a sentence, or None.
"""

from __future__ import annotations

from hostir.ir.communications import RaggedAllToAll
from hostir.ir.dtypes import DType
from hostir.ir.extents import Normal, differ, local_extents, normal_form
from hostir.ir.host_reads import ToHost
from hostir.ir.scalars import Const, symbols_of
from hostir.ir.values import TensorValue, value_symbols


def to_host_problem(instruction: ToHost) -> str | None:
    """``to_host`` reads integers."""
    src = instruction.src
    if src.dtype not in (DType.INT64, DType.INT32, DType.UINT64):
        return f"{src.name} is {src.dtype.value}; to_host reads an integer tensor (counts)"
    return None


def ragged_problem(instruction: RaggedAllToAll) -> str | None:
    """The layout rules of the module docstring (the counts' shape: :func:`counts_problem`)."""
    return _operands_problem(instruction) or _rows_problem(instruction)


def _operands_problem(instruction: RaggedAllToAll) -> str | None:
    """One dtype, as many dims, both on the team's mesh and final (not partial)."""
    src, out = instruction.src, instruction.out
    if instruction.preallocated:
        return f"RaggedAllToAll defines {out.name}; it cannot write into a preallocated buffer"
    if src.dtype is not out.dtype:
        return f"{out.name} is {out.dtype.value} but {src.name} is {src.dtype.value}"
    if not src.shape or len(src.shape) != len(out.shape):
        return f"{out.name} and {src.name} must have the same number of dims, at least one"
    if not 0 <= instruction.axis < len(src.shape):
        return f"axis {instruction.axis} is out of range for the {len(src.shape)}-d {src.name}"
    for value in (src, out):
        if value.sharding is None or value.sharding.mesh != instruction.team.mesh:
            return f"RaggedAllToAll moves rows within its team's mesh; {value.name} is not on it"
        if value.sharding.partial:
            return f"RaggedAllToAll moves final values; {value.name} is partial"
    return None


def _rows_problem(instruction: RaggedAllToAll) -> str | None:
    """Rows along ``axis``: ``out``'s are the bound symbol or free of it, one element on
    each rank before the axis, ``src``'s extents after it."""
    src, out, received, axis = (
        instruction.src,
        instruction.out,
        instruction.received.name,
        instruction.axis,
    )
    if received in value_symbols(src):
        return f"{src.name} reads {received}, which this RaggedAllToAll binds"
    rows = out.shape[axis]
    split = any(p.axis is not None for p in out.sharding.dims[axis])
    if received in symbols_of(rows) and (rows != instruction.received or split):
        return (
            f"{out.name}'s dim {axis} must be {received} itself, not split over the mesh"
            f" (the rows this rank receives), or an extent that does not read {received}"
        )
    others = [e for d, e in enumerate(out.shape) if d != axis]
    if received in set().union(*(symbols_of(e) for e in others)):
        return f"{out.name} reads {received} past its rows (dim {axis}); only rows are received"
    one = normal_form(Const(value=1))
    for value in (src, out):
        if _differ(local_extents(value)[:axis], [one] * axis):
            return (
                f"{value.name}'s dims before axis {axis} must hold one element on each rank"
                " (rows run along the axis)"
            )
    if _differ(local_extents(src)[axis + 1 :], local_extents(out)[axis + 1 :]):
        return (
            f"{out.name}'s local extents past dim {axis} must be {src.name}'s:"
            " RaggedAllToAll moves whole rows"
        )
    return None


def counts_problem(instruction: RaggedAllToAll, read: TensorValue) -> str | None:
    """The counts were read from ``read``: a ``[P, P]`` tensor on each rank, P the team's
    group size."""
    size = normal_form(Const(value=instruction.team.size))
    extents = local_extents(read)
    if len(extents) != 2 or _differ(extents, [size, size]):
        return (
            f"counts {instruction.counts.name} is read from {read.name}, whose local shape is"
            f" not [{instruction.team.size}, {instruction.team.size}]: a count per sender and"
            " receiver of the team's group"
        )
    return None


def _differ(a: list[Normal], b: list[Normal]) -> bool:
    return len(a) != len(b) or any(differ(x, y) for x, y in zip(a, b, strict=True))
