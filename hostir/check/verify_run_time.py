"""The verifier's rules for run-time extents: ``to_host`` and ``RaggedAllToAll``.

``to_host`` reads an integer tensor. A ``RaggedAllToAll`` moves whole rows: ``src`` and
``out`` have the same dtype and the same local extents past dim 0; ``out``'s dim 0 is the
symbol it binds (``received``, a rank-local extent: ``out`` is on no mesh dim 0 is split
over) or an extent that does not read it; ``src`` does not read it; its counts are a host
value read from a ``[P, P]`` integer tensor, P the size of the team's groups; both
tensors live on the team's mesh. A rule returns the problem as a sentence, or None.
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
    src, out, received = instruction.src, instruction.out, instruction.received.name
    if instruction.preallocated:
        return f"RaggedAllToAll defines {out.name}; it cannot write into a preallocated buffer"
    if src.dtype is not out.dtype:
        return f"{out.name} is {out.dtype.value} but {src.name} is {src.dtype.value}"
    if not src.shape or len(src.shape) != len(out.shape):
        return f"{out.name} and {src.name} must have the same number of dims, at least one"
    mesh = instruction.team.mesh
    for value in (src, out):
        if value.sharding is None or value.sharding.mesh != mesh:
            return f"RaggedAllToAll moves rows within its team's mesh; {value.name} is not on it"
        if value.sharding.partial:
            return f"RaggedAllToAll moves final values; {value.name} is partial"
    if received in value_symbols(src):
        return f"{src.name} reads {received}, which this RaggedAllToAll binds"
    rows = out.shape[0]
    if received in symbols_of(rows):
        if rows != instruction.received or any(p.axis is not None for p in out.sharding.dims[0]):
            return (
                f"{out.name}'s dim 0 must be {received} itself, not split over the mesh (the"
                f" rows this rank receives), or an extent that does not read {received}"
            )
    if received in set().union(*(symbols_of(e) for e in out.shape[1:])):
        return f"{out.name} reads {received} past dim 0; only its rows are received"
    if _differ(local_extents(src)[1:], local_extents(out)[1:]):
        return (
            f"{out.name}'s local extents past dim 0 must be {src.name}'s: RaggedAllToAll"
            " moves whole rows"
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
