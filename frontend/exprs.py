"""Fusion expressions: the ops a FusionDefinition records.

Each expression has inputs (TensorViews or scalars), one output TensorView,
and ``axis_map``: for each tensor input, the pairs (output logical axis, input
logical axis) that iterate over the same index. Sharding propagation and
resharding detection read those maps; broadcast (expanded) axes are not mapped.

Every op is declared in ``hostir.ir.opdecl`` and recorded as a :class:`FusionOp`, which
holds its host IR instruction (``frontend.recording``): the fusion's expressions are the
host IR's own compute instructions over placeholder values.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from frontend.iter_domain import IterDomain
from frontend.tensor_view import TensorView, ValueOwner
from frontend.types import DataType
from hostir import Const, Scalar, Symbol, TensorValue
from hostir.ir.dtypes import DType
from hostir.ir.opdecl import REQUIRED, OpDecl, ParamKind
from hostir.ir.scalars import print_scalar


@dataclass(eq=False)
class ScalarVal:
    """A scalar of the fusion: a constant (``value`` set), an input (bound at execute), or
    an extent (``extent`` set): a tensor's size (``tv.size(i)``, ``tv.shape()``) or
    arithmetic on sizes and int constants, known when the fusion's inputs are bound."""

    name: str
    dtype: DataType
    value: int | float | bool | None = None
    fusion: ValueOwner | None = field(default=None, repr=False)
    """The fusion that defined it (set by ``Fusion.new_scalar``)."""
    extent: Scalar | None = field(default=None, repr=False)
    """The host IR expression of the extent it equals (``i0``, ``i0 * 2``, a constant), for
    a size and arithmetic on sizes; None for other scalars."""

    def is_input(self) -> bool:
        """Whether the scalar is a fusion input, bound at execute."""
        return self.value is None and self.extent is None

    def to_hostir(self) -> Scalar:
        """The scalar in a host IR program: a constant, the input's symbol, or the extent's
        expression (its symbols are bound from the input tensors' shapes)."""
        if self.value is not None:
            return Const(value=self.value)
        if self.extent is not None:
            return self.extent
        return Symbol(name=self.name)

    def __repr__(self) -> str:
        if self.value is not None:
            return f"{self.name}={self.value}"
        if self.extent is not None:
            return f"{self.name}={print_scalar(self.extent)}"
        return self.name


Operand = TensorView | ScalarVal | int | float | bool


@dataclass(eq=False)
class Expr(ABC):
    """Base of fusion expressions."""

    output: TensorView
    axis_map: dict[TensorView, list[tuple[IterDomain, IterDomain]]] = field(
        default_factory=dict, kw_only=True
    )

    @abstractmethod
    def inputs(self) -> list[Operand]:
        """Operands in order (tensors, scalars and Python numbers)."""

    def tensor_inputs(self) -> list[TensorView]:
        """The TensorView operands."""
        return [x for x in self.inputs() if isinstance(x, TensorView)]

    def outputs(self) -> tuple[TensorView, ...]:
        """Every tensor the expression defines, in order: its ``output`` (and, for an op of
        several results, the others: :class:`FusionOp`)."""
        return (self.output,)

    def output_axis_maps(self) -> tuple[dict[TensorView, list[tuple[IterDomain, IterDomain]]], ...]:
        """The axis map of each of :meth:`outputs`, in order."""
        return (self.axis_map,)

    def mapped_input_axis(self, producer: TensorView, out_axis: IterDomain) -> IterDomain | None:
        """The logical axis of ``producer`` that ``out_axis`` maps to, if any."""
        for out, inp in self.axis_map.get(producer, []):
            if out is out_axis:
                return inp
        return None

    def describe(self) -> str:
        """``T2 = linear(T0, T1)``-style text (``T2, T3 = topk(...)`` for several results)."""
        args = ", ".join(
            x.name if isinstance(x, TensorView | ScalarVal) else repr(x) for x in self.inputs()
        )
        names = ", ".join(tv.name for tv in self.outputs())
        return f"{names} = {self.keyword()}({args}{self.attributes()})"

    @abstractmethod
    def keyword(self) -> str:
        """The op's name in text."""

    def attributes(self) -> str:
        """Extra ``, key=value`` text."""
        return ""


def placeholder(tv: TensorView) -> TensorValue:
    """The host IR value standing for ``tv`` in a recorded instruction: its name, dtype
    and data extents, unsharded (lowering binds the sharded value by name)."""
    shape = tuple(axis.extent for axis in tv.shape_domain())
    return TensorValue(name=tv.name, dtype=tv.dtype.to_hostir(), shape=shape)


@dataclass(eq=False)
class FusionOp(Expr):
    """An op recorded from its declaration (``frontend.recording``): its host IR
    instruction over placeholder values (the output's and the operands', named as the
    fusion's tensors), and the operands as the user gave them. An op of several results
    (``topk``, ``sdpfa_fwd``, ``sdpfa_bwd``) is one FusionOp: ``output`` is its first
    result, ``more_outputs`` the others, each with its axis map."""

    instruction: Any
    decl: OpDecl
    operands: tuple[Any, ...]
    """The tensor and scalar operands in the declaration's order (None: an optional one
    not given)."""
    more_outputs: tuple[TensorView, ...] = ()
    """The results after the first, in the declaration's order."""
    more_axis_maps: tuple[dict[TensorView, list[tuple[IterDomain, IterDomain]]], ...] = ()
    """The axis map of each of ``more_outputs``."""

    def outputs(self) -> tuple[TensorView, ...]:
        return (self.output, *self.more_outputs)

    def output_axis_maps(self) -> tuple[dict[TensorView, list[tuple[IterDomain, IterDomain]]], ...]:
        return (self.axis_map, *self.more_axis_maps)

    def inputs(self) -> list[Operand]:
        return [x for x in self.operands if x is not None]

    def keyword(self) -> str:
        return self.decl.name

    def attributes(self) -> str:
        """``, dims=[1]``: each attribute that is not its default, each scalar expression
        (``start=1``), and the dtype the caller chose (``cast``)."""
        text = f", dtype={self.output.dtype.name}" if "dtype" in self.decl.given else ""
        for param in self.decl.params:
            value = getattr(self.instruction, param.field)
            if param.kind is ParamKind.SCALAR:
                text += f", {param.field}={print_scalar(value)}"
            if param.kind is not ParamKind.ATTRIBUTE:
                continue
            if param.default is REQUIRED or value != param.default:
                text += f", {param.field}={_attribute_text(value)}"
        return text


def _attribute_text(value: Any) -> str:
    """An attribute as the fusion's text writes it: ``[0, 1]``, ``Float``."""
    if isinstance(value, tuple):
        return repr(list(value))
    if isinstance(value, DType):
        return DataType(value).name
    if isinstance(value, enum.Enum):
        return str(value.value)
    return repr(value)
