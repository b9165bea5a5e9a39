"""The shape ops' former fusion expressions (``fd.ops.reshape``, ``slice``, ``pad``,
``cat``). No longer recorded: ``fd.ops`` records these ops from their declarations
(``hostir.ir.shape_ops``, ``frontend.recording``); the classes stay, with their builders in
``lowering.snapshot``, until the mirror classes of every op family are removed.

Their ``axis_map`` pairs only dims that iterate over the same index: a reshape's dims that
it keeps one to one, the dims a slice, pad or cat leaves alone. A dim it changes is not
mapped, so the lowering gathers it before the op if it is sharded (``set``); a reshape that
splits or merges a sharded dim keeps it sharded where the shard stays contiguous
(``lowering.shape_ops``).
"""

from __future__ import annotations

from dataclasses import dataclass

from frontend.exprs import Expr, Operand
from frontend.tensor_view import TensorView
from hostir import Scalar
from hostir.ir.scalars import print_scalar


@dataclass(eq=False)
class ReshapeOp(Expr):
    """``reshape``: the same elements in the output's shape."""

    src: TensorView

    def inputs(self) -> list[Operand]:
        return [self.src]

    def keyword(self) -> str:
        return "reshape"

    def attributes(self) -> str:
        shape = ", ".join(print_scalar(a.extent) for a in self.output.shape_domain())
        return f", new_shape=[{shape}]"


@dataclass(eq=False)
class SliceOp(Expr):
    """``slice`` of one dim: elements ``start <= i < stop`` (normalized)."""

    src: TensorView
    dim: int
    start: Scalar
    stop: Scalar

    def inputs(self) -> list[Operand]:
        return [self.src]

    def keyword(self) -> str:
        return "slice"

    def attributes(self) -> str:
        return f", dim={self.dim}, start={print_scalar(self.start)}, stop={print_scalar(self.stop)}"


@dataclass(eq=False)
class PadOp(Expr):
    """``pad`` of one dim: ``left`` and ``right`` elements of ``value`` around it."""

    src: TensorView
    dim: int
    left: Scalar
    right: Scalar
    value: Scalar

    def inputs(self) -> list[Operand]:
        return [self.src]

    def keyword(self) -> str:
        return "pad"

    def attributes(self) -> str:
        widths = f"{print_scalar(self.left)}, {print_scalar(self.right)}"
        return f", dim={self.dim}, widths=[{widths}], value={print_scalar(self.value)}"


@dataclass(eq=False)
class CatOp(Expr):
    """``cat`` of two tensors along ``dim``."""

    lhs: TensorView
    rhs: TensorView
    dim: int

    def inputs(self) -> list[Operand]:
        return [self.lhs, self.rhs]

    def keyword(self) -> str:
        return "cat"

    def attributes(self) -> str:
        return f", dim={self.dim}"
