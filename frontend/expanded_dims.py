"""nvFuser's broadcasting of expanded dims in pointwise ops.

``broadcast_in_dim`` and ``expand`` make broadcast dims with an extent (expanded: every
element along the dim is the same). nvFuser's pointwise ops take such a dim as a
broadcast dim whatever its extent: where another operand has a dim that is not a
broadcast at that position, the output takes that dim's extent and the expanded extent is
ignored (``newOutputIterDomain`` in ``csrc/ops/utils.cpp`` skips broadcast dims). torch
would refuse the two extents, so an operand whose expanded dim differs from the dim it
meets is sliced to its first element along that dim (extent 1, the same values) before
the op: nvFuser's ``where(mask expanded to c, z of 2c, 0.0)`` (alphafold3's triangle
updates) runs as nvFuser runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from frontend.iter_domain import IterType
from frontend.shape_ops import OpsLike, _slice_dims
from frontend.tensor_view import TensorView
from hostir import Const, Scalar
from hostir.ir.extents import same_extent


def unexpanded(ops: OpsLike, operands: Sequence[Any]) -> tuple[Any, ...]:
    """``operands`` with each tensor's expanded dims sliced to extent 1 where a dim that is
    not a broadcast, of another extent, meets them (dims aligned from the right)."""
    tensors = [x for x in operands if isinstance(x, TensorView)]
    ndim = max(len(tv.shape_domain()) for tv in tensors)
    resolved: dict[int, list[Scalar]] = {}
    for tv in tensors:
        domain = tv.shape_domain()
        for index, axis in enumerate(domain):
            if axis.iter_type is not IterType.BROADCAST:
                resolved.setdefault(index + ndim - len(domain), []).append(axis.extent)
    result = []
    for operand in operands:
        if not isinstance(operand, TensorView):
            result.append(operand)
            continue
        domain = operand.shape_domain()
        ranges = {
            index: (Const(value=0), Const(value=1))
            for index, axis in enumerate(domain)
            if axis.iter_type is IterType.BROADCAST
            and axis.extent != Const(value=1)
            and any(
                not same_extent(axis.extent, extent)
                for extent in resolved.get(index + ndim - len(domain), [])
            )
        }
        result.append(_slice_dims(ops, operand, ranges) if ranges else operand)
    return tuple(result)
