"""Broadcasting: the result axes of an op whose tensor operands broadcast together.

One rule, which the pointwise ops' declaration reads (``hostir.ir.pointwise``), so the
frontend's ``fd.ops`` and the verifier agree on it. Torch's rule, dims aligned from the
right: at each position, the operands' extents other than 1 must agree, and the result
takes theirs (a constant where one is, since a symbol beside it must equal it), or 1
where every operand has 1. Symbolic extents over different symbols may agree at run
time, where binding the inputs checks them; extents that certainly differ (two
constants, ``2 * i0`` and ``3 * i0``) are refused. An operand dim of extent 1 beside a
larger one is broadcast: it is no source of the result axis.
"""

from __future__ import annotations

from collections.abc import Sequence

from hostir.ir.extents import differ, is_one
from hostir.ir.opdecl import AxisKind, AxisSource, ResultAxis
from hostir.ir.scalars import Const, Scalar, print_scalar

Operand = tuple[str, str, tuple[Scalar, ...]]
"""A tensor operand: its field, its name in messages, its extents."""


def broadcast_axes(op: str, operands: Sequence[Operand]) -> tuple[ResultAxis, ...] | str:
    """The result axes of ``operands`` broadcast together (see the module docstring), each
    with the operand dims it iterates with; or why they do not broadcast, naming ``op``."""
    ndim = max(len(shape) for _, _, shape in operands)
    axes = []
    for position in range(ndim):
        candidates = [
            (field, name, index, shape[index])
            for field, name, shape in operands
            if (index := position - (ndim - len(shape))) >= 0
        ]
        real = [c for c in candidates if not is_one(c[3])]
        extent = _extent(real)
        if any(differ(extent, c[3]) for c in real):
            described = ", ".join(
                f"{name} dim {index} = {print_scalar(e)}" for _, name, index, e in candidates
            )
            return f"{op}: output dim {position} has incompatible extents ({described})"
        one = not real
        sources = tuple(AxisSource(f, index) for f, _, index, e in (candidates if one else real))
        kind = AxisKind.BROADCAST if one else AxisKind.ITERATION
        axes.append(ResultAxis(extent=extent, kind=kind, sources=sources))
    return tuple(axes)


def _extent(real: list) -> Scalar:
    """The result extent: the first constant among the operands' extents other than 1,
    else the first of them, else 1."""
    for *_, extent in real:
        if isinstance(extent, Const):
            return extent
    return real[0][3] if real else Const(value=1)
