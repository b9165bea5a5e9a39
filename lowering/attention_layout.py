"""Which output axes the attention and MoE ops compute whole, and the op that reads no
tensor, for ``decompose_resharding``.

- **Axes computed whole** (:func:`whole_axes`): attention's sequence and head-size axes
  (a sharded one would need ring attention or a causal mask offset), and the dim
  ``grouped_mm``'s offsets index (the groups are global row, column or K ranges).
  ``decompose_resharding`` keeps them unsharded in the op's compute layout
  (:func:`computed_whole`), so a sharded operand is gathered by a ``set`` before the op,
  and a sharded output sliced after it. Input axes that map to no output axis (the key's
  sequence, ``grouped_mm``'s groups and offsets, the embedding's vocabulary) are read
  whole by the same pass. With dropout no axis may be stream-parallel.
- ``sdpfa_philox`` reads no tensor: its expression's input gives it a mesh only
  (:func:`reads_no_tensor`).
"""

from __future__ import annotations

from hostir.ir.attention import GroupedMm, SdpaBwd, SdpaFwd, SdpaPhilox
from hostir.ir.catalog import keyword
from hostir.ir.instructions import Instruction
from lowering.errors import LoweringError
from lowering.layouts import local_parts
from lowering.snapshot import AxisLayout


def whole_axes(instruction: Instruction) -> tuple[int, ...]:
    """The logical axes of its output that ``instruction`` computes unsharded (see the
    module docstring)."""
    if isinstance(instruction, SdpaFwd | SdpaBwd):
        rank = instruction.out.ndim
        return tuple(range(instruction.query.ndim - 2, rank))  # L (or S), and E
    if isinstance(instruction, GroupedMm):
        ranks = (instruction.mat1.ndim, instruction.mat2.ndim)
        # The logical axes are the data dims and the reduction axis K, last.
        return {(2, 3): (0,), (3, 2): (1,), (2, 2): (0, 3)}[ranks]
    return ()


def refuse_streamed_whole_axes(instruction: Instruction, axes: tuple[AxisLayout, ...]) -> None:
    """Raises LoweringError if one of :func:`whole_axes` of the op's output (``axes``) is
    stream-parallel: a stream chunk of a sequence would attend to its own rows as if they
    were the first ones (a causal mask by local row), a chunk of grouped rows would misread
    the global offsets. With dropout any stream-parallel axis is refused: a chunk would
    need its position in the global weights to take its slice of the mask."""
    if getattr(instruction, "dropout_p", None) is not None:
        for index, axis in enumerate(axes):
            if axis.stream is not None:
                raise LoweringError(
                    f"{instruction.out.name} = {keyword(instruction)}(...): its axis {index} is"
                    " stream-parallel, but attention with dropout takes its mask by the"
                    " global index of each weight; shard that axis over devices instead"
                )
    for index in whole_axes(instruction):
        if axes[index].stream is not None:
            raise LoweringError(
                f"{instruction.out.name} = {keyword(instruction)}(...): its axis {index} is"
                " stream-parallel, but the op computes that axis whole; stream-split a batch"
                " or head dim instead"
            )


def computed_whole(instruction: Instruction, axes: list[AxisLayout]) -> list[AxisLayout]:
    """``axes`` (the op's output axis layouts) with :func:`whole_axes` unsharded."""
    whole = whole_axes(instruction)
    return [local_parts(axis) if index in whole else axis for index, axis in enumerate(axes)]


def reads_no_tensor(instruction: Instruction) -> bool:
    """Whether the instruction reads no tensor (``sdpfa_philox``): it needs none of its
    expression's inputs resharded."""
    return isinstance(instruction, SdpaPhilox)
