"""What an AllToAllV step of a plan costs a rank: elements received and temporaries.

Both follow from the exchange pattern ``hostir.blocks.all_to_all_v_pieces``
computes at run time (the same pure function, on the plan's concrete shape),
maximised over the ranks of the mesh. The temporaries mirror the handler: a
packing buffer unless the pieces it sends are consecutive contiguous ranges of
its block, and a receive buffer unless (without a reduction) the pieces it
receives are consecutive contiguous ranges of its output.
"""

from __future__ import annotations

from hostir import Sharding
from hostir.blocks import Box, Operand, Pattern, all_to_all_v_pieces, volume
from hostir.errors import HostIrError
from hostir.scalars import Const, Scalar, add
from lowering.plan import Plan, Step, local_elements


def _concrete(shape: tuple[Scalar, ...]) -> tuple[int, ...] | None:
    if all(isinstance(e, Const) for e in shape):
        return tuple(e.value for e in shape)
    return None


def _patterns(plan: Plan, k: int) -> list[tuple[int, Pattern]] | None:
    """(position in group, pattern) for every rank of the mesh; None if the shape is
    symbolic or the pattern cannot be formed."""
    step: Step = plan.steps[k]
    shape = _concrete(plan.shape)
    if shape is None:
        return None
    before: Sharding = plan.steps[k - 1].after if k else plan.src
    src = Operand(name="src", sharding=before, shape=shape)
    out = Operand(name="out", sharding=step.after, shape=shape)
    found = []
    try:
        for rank in step.team.mesh.devices:
            group = tuple(step.team.group_of(rank))
            pattern = all_to_all_v_pieces(src, out, step.team, group, step.op is not None)
            found.append((group.index(rank), pattern))
    except HostIrError:
        return None
    return found


def exchange_received(plan: Plan, k: int) -> Scalar | None:
    """The most elements any rank receives from other ranks in step ``k``."""
    patterns = _patterns(plan, k)
    if patterns is None:
        return None
    return Const(
        value=max(
            sum(volume(p.box) for p in pattern.pieces if p.destination == me and p.source != me)
            for me, pattern in patterns
        )
    )


def exchange_temporaries(plan: Plan, k: int) -> Scalar:
    """The most elements of packing and receive buffers any rank holds in step ``k``
    (the whole input and output when the pattern cannot be computed: symbolic shapes)."""
    patterns = _patterns(plan, k)
    if patterns is None:
        before = plan.steps[k - 1].after if k else plan.src
        return add(
            local_elements(before, plan.shape), local_elements(plan.steps[k].after, plan.shape)
        )
    worst = 0
    for me, pattern in patterns:
        sends = [p for p in pattern.pieces if p.source == me and p.destination != me]
        recvs = [p for p in pattern.pieces if p.destination == me and p.source != me]
        sends.sort(key=lambda p: p.destination)
        recvs.sort(key=lambda p: p.source)
        reduced = plan.steps[k].op is not None
        packing = 0 if _consecutive(sends, pattern.src_boxes[me]) else _total(sends)
        direct = not reduced and _consecutive(recvs, pattern.out_boxes[me])
        worst = max(worst, packing + (0 if direct else _total(recvs)))
    return Const(value=worst)


def _total(pieces: list) -> int:
    return sum(volume(p.box) for p in pieces)


def _consecutive(pieces: list, block: Box) -> bool:
    """Whether the pieces, in order, are back-to-back contiguous ranges of ``block``'s
    row-major storage."""
    position = None
    for piece in pieces:
        span = _range(piece.box, block)
        if span is None or (position is not None and span[0] != position):
            return False
        position = span[1]
    return True


def _range(box: Box, block: Box) -> tuple[int, int] | None:
    """``box``'s [start, stop) in ``block``'s row-major storage if it is one contiguous
    range, else None: every dim after the last one where it is narrower than the block is
    whole (by definition of "last"), and every dim before it has extent 1."""
    narrower = [i for i, ((_, e), (_, f)) in enumerate(zip(box, block, strict=True)) if e != f]
    if narrower and any(e != 1 for _, e in box[: narrower[-1]]):
        return None
    start, stride = 0, 1
    for (offset, _), (block_offset, full) in reversed(list(zip(box, block, strict=True))):
        start += (offset - block_offset) * stride
        stride *= full
    return start, start + volume(box)
