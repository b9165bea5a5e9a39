"""A tensor input's layout as nvFuser describes it: contiguity flags and a stride order.

``define_tensor(sizes=..., strides=...)`` and ``from_pytorch`` read a layout from strides
(nvFuser's ``computeTensorDescriptor``); ``define_tensor(stride_order=...)`` takes one.
hostir runs torch ops, which take any strides, so the layout is recorded on the tensor
(``contiguity``, ``stride_order``) and does not change what runs.
"""

from __future__ import annotations

from typing import Any

from frontend.arguments import int_list, shown
from frontend.errors import DefinitionError


def stride_order_of(rank: int, stride_order: Any) -> list[int] | None:
    """``stride_order`` checked and normalized as nvFuser does: None or ``[]`` for none,
    else one entry per dim, negative entries counting from the end, a permutation of
    ``0..rank-1`` (entry ``i`` is where dim ``i`` goes, ``rank - 1`` the outermost)."""
    if stride_order is None:
        return None
    order = int_list(DefinitionError, "define_tensor", "stride_order", stride_order)
    if not order:
        return None
    if len(order) != rank:
        raise DefinitionError(
            f"define_tensor: stride_order {order} has {len(order)} entries for {rank} dims"
        )
    normalized = [entry % rank if -rank <= entry < rank else entry for entry in order]
    if sorted(normalized) != list(range(rank)):
        raise DefinitionError(
            f"define_tensor: stride_order {order} must be a permutation of 0..{rank - 1}"
            f" (an entry may count from the end, -1 for {rank - 1})"
        )
    return normalized


def tensor_descriptor(sizes: list[int], strides: list[int]) -> tuple[list[bool | None], list[int]]:
    """Contiguity flags (in allocation order: outermost first; None for a broadcast dim,
    of size 1 or stride 0) and stride order of a tensor with ``sizes`` and ``strides``,
    as nvFuser's ``computeTensorDescriptor``: dims sorted by decreasing stride, stride-0
    dims kept at their own positions; a dim is contiguous when its stride is the next
    inner non-broadcast dim's stride times its size (1 for the innermost)."""
    rank = len(sizes)
    ordered = sorted((dim for dim in range(rank) if strides[dim] != 0), key=lambda d: -strides[d])
    for dim in range(rank):  # a stride-0 dim keeps its place (Python's sort is stable too)
        if strides[dim] == 0:
            ordered.insert(dim, dim)

    def broadcast(dim: int) -> bool:
        return strides[dim] == 0 or sizes[dim] == 1

    contiguity: list[bool | None] = [None] * rank
    order = [0] * rank
    for position, dim in enumerate(ordered):
        order[dim] = rank - 1 - position
        if broadcast(dim):
            continue
        inner = next((d for d in ordered[position + 1 :] if not broadcast(d)), None)
        expected = 1 if inner is None else strides[inner] * sizes[inner]
        contiguity[position] = strides[dim] == expected
    return contiguity, order


def builder_sizes(sizes: list[int], static_sizes: bool) -> list[int]:
    """The ``shape`` ``define_tensor`` gets for ``sizes``: the sizes themselves if
    ``static_sizes``, else -1 (symbolic) for every size but 1 (a broadcast dim), as
    nvFuser's ``getTensorViewBuilderSizes``."""
    for dim, size in enumerate(sizes):
        if size < 0:
            raise DefinitionError(f"define_tensor: sizes[{dim}] = {size} must be >= 0")
    return list(sizes) if static_sizes else [1 if size == 1 else -1 for size in sizes]


def layout_from_strides(
    shape: Any, contiguity: Any, stride_order: Any, sizes: Any, strides: Any, static_sizes: bool
) -> tuple[list[int], list[bool | None], list[int]]:
    """``define_tensor``'s shape, contiguity and stride order from its ``sizes`` and
    ``strides`` form (nvFuser's), refusing a mix of the two forms (DefinitionError)."""
    mixed = [
        name
        for name, given in (
            ("shape", shape),
            ("contiguity", contiguity),
            ("stride_order", stride_order),
        )
        if given is not None
    ]
    if mixed:
        raise DefinitionError(
            f"define_tensor: give either shape (with contiguity and stride_order) or sizes and"
            f" strides, not both: got sizes/strides with {', '.join(mixed)}"
        )
    if sizes is None or strides is None:
        missing = "sizes" if sizes is None else "strides"
        raise DefinitionError(f"define_tensor: sizes and strides go together; {missing} is missing")
    sizes = int_list(DefinitionError, "define_tensor", "sizes", sizes)
    strides = int_list(DefinitionError, "define_tensor", "strides", strides)
    if len(sizes) != len(strides):
        raise DefinitionError(
            f"define_tensor: {len(sizes)} sizes {shown(sizes)} but {len(strides)} strides"
            f" {shown(strides)}"
        )
    for dim, stride in enumerate(strides):
        if stride < 0:
            raise DefinitionError(
                f"define_tensor: strides[{dim}] = {stride}: a negative stride is not supported"
            )
    flags, order = tensor_descriptor(sizes, strides)
    return builder_sizes(sizes, static_sizes), flags, order
