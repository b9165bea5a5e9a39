"""What an op needs of its layout beyond its axis maps, for ``decompose_resharding``.

- **Axes computed whole** (:func:`whole_axes`): output axes a rank computes only from
  all of the axis, so the op runs with them unsharded and never chunk by chunk:
  - attention's sequence and head-size axes (a sharded or chunked one would need ring
    attention, or a causal mask offset by the chunk's first row);
  - the dim ``grouped_mm``'s offsets index (the groups are global row, column or K
    ranges);
  - the dim ``cumsum`` and ``topk`` run along, and the dims along which ``gather``'s
    ``index`` is smaller than ``arg`` (their rows do not line up shard by shard).

  ``decompose_resharding`` keeps them unsharded in the op's compute layout
  (:func:`computed_whole`), so a sharded operand is gathered by a ``set`` before the op
  (an Allgather) and a sharded output sliced after it; a stream-parallel one is refused by
  name (:func:`refuse_streamed_whole_axes`): a stream loop would run the op on each chunk
  as if it were the whole axis, a wrong result. Input axes that map to no output axis (the
  key's sequence, ``grouped_mm``'s groups, an ``index_select``'s indexed dim) are read
  whole by the same pass without a rule here.
- **Ops that read no tensor** (:func:`reads_no_tensor`): ``sdpfa_philox``, whose
  expression's input gives it a mesh only, needs none of its inputs resharded.

Each op says both in its declaration (``hostir.ir.opdecl``: ``ResultAxis.whole``,
``OpSharding.reads_no_tensor``), which the functions here read; an instruction of no
declared op (none the frontend records) has neither.
"""

from __future__ import annotations

from hostir.ir.catalog import keyword
from hostir.ir.instructions import Instruction
from hostir.ir.opdecl import op_decl
from lowering.errors import LoweringError
from lowering.layouts import local_parts
from lowering.snapshot import AxisLayout, LoweringOp


def whole_axes(op: LoweringOp) -> tuple[int, ...]:
    """The logical axes of its output (reduction axes included) that ``op`` computes
    unsharded and unchunked (see the module docstring): those its op's declaration marks
    ``whole`` (``hostir.ir.opdecl``)."""
    instruction = op.instruction
    decl = op_decl(instruction)
    if decl is not None:
        inferred = decl.infer_of(instruction)
        if isinstance(inferred, str):  # the verifier names it
            return ()
        return tuple(i for i, axis in enumerate(inferred[op.result].axes) if axis.whole)
    return ()


def takes_no_stream(op: LoweringOp) -> bool:
    """Whether no axis of ``op``'s output may be stream-parallel: attention with dropout,
    which takes its mask by the global index of each weight."""
    return getattr(op.instruction, "dropout_p", None) is not None


def refuse_streamed_whole_axes(op: LoweringOp, axes: tuple[AxisLayout, ...]) -> None:
    """Raises LoweringError if one of :func:`whole_axes` of the op's output (``axes``) is
    stream-parallel: the loop would run the op on each chunk as if it were the whole axis
    (a cumsum restarting at every chunk, a causal mask by local row). With dropout, any
    stream-parallel axis of attention is refused: a chunk would need its position in the
    global weights to take its slice of the mask."""
    instruction = op.instruction
    if takes_no_stream(op):
        for index, axis in enumerate(axes):
            if axis.stream is not None:
                raise LoweringError(
                    f"{op.output} = {keyword(instruction)}(...): its axis {index} is"
                    " stream-parallel, but attention with dropout takes its mask by the"
                    " global index of each weight; shard that axis over devices instead"
                )
    for index in whole_axes(op):
        if axes[index].stream is not None:
            raise LoweringError(
                f"{op.output} = {keyword(instruction)}(...): its axis {index} is"
                " stream-parallel, but the op computes that axis whole (a chunk alone gives"
                " a different result); stream-split an axis the op computes element by"
                " element (a batch or head dim), or none"
            )


def computed_whole(op: LoweringOp, axes: list[AxisLayout]) -> list[AxisLayout]:
    """``axes`` (the op's output axis layouts) with :func:`whole_axes` unsharded."""
    whole = whole_axes(op)
    return [local_parts(axis) if index in whole else axis for index, axis in enumerate(axes)]


def reads_no_tensor(instruction: Instruction) -> bool:
    """Whether the instruction reads no tensor (``sdpfa_philox``): it needs none of its
    expression's inputs resharded (its declaration says so, ``OpSharding``)."""
    decl = op_decl(instruction)
    return decl is not None and decl.sharding.reads_no_tensor
