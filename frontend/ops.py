"""``fd.ops``: building fusion expressions with shape and dtype inference.

Dtypes follow each op's declared rule, nvFuser's (``hostir.ir.ops`` for pointwise ops,
``hostir.ir.reductions``, ``hostir.ir.contraction``; docs/ops.md); operands a rule does
not take raise an :class:`OperandError` naming them. Shapes are inferred on (possibly
symbolic) global extents. An op declared in ``hostir.ir.opdecl`` is recorded from its
declaration (``frontend.recording``); a method written here or in the family modules checks
the form of its arguments and translates nvFuser's to the declaration's. A declared op with
no method written (``set``, ``linear``, ``matmul``, ``argsort``) gets one made from its
declaration (``frontend.declared_methods``) when this module is imported; one declared
later, outside the package, is found by ``Ops.__getattr__``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from frontend.arguments import MAX_EXTENT, check_bool, check_fits, int_list, is_int, shown
from frontend.attention_ops import ATTENTION_OPS
from frontend.contraction import broadcast_extents, mapped_requirements, wrapped_dims
from frontend.declared_methods import declared_method
from frontend.errors import DefinitionError, OperandError
from frontend.expanded_dims import unexpanded
from frontend.exprs import Operand, ScalarVal
from frontend.fusion import Fusion
from frontend.iter_domain import IterDomain
from frontend.recording import PYTHON_TYPES, record
from frontend.reduction_ops import REDUCTION_METHODS
from frontend.scalar_math import scalar_op, shape_entries
from frontend.shape_ops import SHAPE_METHODS
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import TensorValue
from hostir.ir.layout_ops import BROADCAST_IN_DIM, CAST, PERMUTE
from hostir.ir.opdecl import OpDecl, declared_ops, op_named
from hostir.ir.ops import (
    POINTWISE_OPS,
    DtypeRule,
    OpDtypeError,
    OperandType,
    promote,
    scalar_operand,
    tensor_operand,
)
from hostir.ir.pointwise import POINTWISE_DECLS


def _operand_type(operand: Operand) -> OperandType:
    """What the dtype rule reads of a frontend operand. A scalar counts by its kind (bool,
    int, or float as Double), as the host IR's scalars do."""
    if isinstance(operand, TensorView):
        return tensor_operand(operand.dtype.to_hostir(), len(operand.shape_domain()), operand.name)
    if isinstance(operand, ScalarVal):
        return scalar_operand(PYTHON_TYPES.get(operand.dtype, float), operand.name)
    return scalar_operand(type(operand), repr(operand))


def _check_tensor(op: str, value: Any, role: str) -> TensorView:
    if not isinstance(value, TensorView):
        raise OperandError(f"{op}: {role} must be a TensorView, got {value!r}")
    return value


def _dims(op: str, tv: TensorView, dims: int | Sequence[int]) -> tuple[int, ...]:
    """Normalizes dim indices of ``tv``'s data dims; raises OperandError if out of range."""
    ndim = len(tv.shape_domain())
    dims = int_list(OperandError, op, "dims", dims, allow_int=True)
    result = []
    for dim in dims:
        if not -ndim <= dim < ndim:
            raise OperandError(f"{op}: dim {dim} is out of range for {tv.name} with {ndim} dims")
        result.append(dim % ndim)
    if len(set(result)) != len(result):
        raise OperandError(f"{op}: dims {dims} of {tv.name} repeat")
    return tuple(result)


class Ops:
    """The ops of a FusionDefinition (``fd.ops``)."""

    def __init__(self, fusion: Fusion) -> None:
        self._fusion = fusion

    # ----- helpers -----
    def _new(self, dtype: DataType, axes: list[IterDomain]) -> TensorView:
        return self._fusion.new_tensor(dtype, axes)

    @staticmethod
    def _copy_axes(tv: TensorView) -> tuple[list[IterDomain], list[tuple[IterDomain, IterDomain]]]:
        axes, pairs = [], []
        for axis in tv.shape_domain():
            new = IterDomain(axis.extent, axis.iter_type)
            axes.append(new)
            pairs.append((new, axis))
        return axes, pairs

    def __getattr__(self, name: str) -> Any:
        """The method of an op declared after this module was imported (outside the
        package: docs/extending.md), made from its declaration."""
        method = _declared_later(name)
        if method is None:
            raise AttributeError(f"fd.ops has no op {name!r}")
        return method.__get__(self, type(self))

    def __dir__(self) -> list[str]:
        later = (d.name for d in declared_ops() if d.fd_method)
        return sorted({*super().__dir__(), *later})

    # ----- unary -----
    def gelu(self, x: TensorView, approximate: str = "none") -> TensorView:
        """GELU, exact (``approximate="none"``, with erf) or its tanh approximation
        (``"tanh"``, the op ``tanh_gelu``), as ``torch.nn.functional.gelu``.

        Dtype: Half, BFloat16, integer and bool operands compute and return Float.
        nvFuser's Python frontend has no gelu; its C++ composites are ``gelu`` and
        ``tanh_gelu`` (docs/ops.md)."""
        if approximate not in ("none", "tanh"):
            raise OperandError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        return self._pointwise("gelu" if approximate == "none" else "tanh_gelu", (x,))

    def cast(self, tv: TensorView, dtype: DataType | torch.dtype) -> TensorView:
        """``tv`` converted to ``dtype``."""
        tv = _check_tensor("cast", tv, "operand")
        given = TensorValue(name=tv.name, dtype=DataType.of(dtype).to_hostir(), shape=())
        return record(self._fusion, CAST, {"src": tv}, given={"out": given})[0]

    # ----- pointwise ops (declared in hostir.ir.pointwise; their methods are made below) -----
    def _pointwise(self, name: str, operands: tuple[Any, ...]) -> TensorView:
        """Op ``name`` on ``operands`` (tensors or scalars), recorded from its declaration:
        extents broadcast from the right, the dtype from the op's rule (nvFuser's
        promotion)."""
        op = POINTWISE_OPS[name]
        for param, operand in zip(op.params, operands, strict=True):
            if not isinstance(operand, TensorView | ScalarVal | int | float | bool):
                raise OperandError(f"{name}: {param} {operand!r} is not a tensor or scalar")
            if is_int(operand):
                why = ": torch and nvFuser take a Python int as an int64 scalar"
                check_fits(OperandError, name, "the constant", operand, DataType.Int, why)
        if not any(isinstance(x, TensorView) for x in operands):
            return scalar_op(self._fusion, name, operands)  # frontend.scalar_math
        try:  # refused here, before any slice of an expanded dim is recorded
            promotion = promote(op, tuple(_operand_type(x) for x in operands))
        except OpDtypeError as error:
            raise OperandError(str(error)) from None
        for operand in operands:
            _check_constant_fits(name, operand, DataType(promotion.compute))
        operands = unexpanded(self, operands)  # expanded dims broadcast as nvFuser's
        decl = POINTWISE_DECLS[name]
        fields = (p.field for p in decl.params)
        (out,) = record(self._fusion, decl, dict(zip(fields, operands, strict=True)))
        return out

    # ----- layout -----
    def broadcast_in_dim(
        self, tv: TensorView, shape: Sequence[Any], broadcast_dims: Sequence[int]
    ) -> TensorView:
        """Places ``tv``'s dim ``i`` at output dim ``broadcast_dims[i]`` of ``shape``
        (negative dims count from the end of ``shape``, as nvFuser's ``wrapDim``).

        Other output dims are new broadcast dims of extent ``shape[j]``, expanded; a
        ``shape`` entry of -1 keeps the mapped input extent. Entries are ints or Int
        scalars: constants, or sizes (``x.size(0)``, ``x.shape()``) known when the inputs
        are bound, which a new dim takes as its extent.
        """
        tv = _check_tensor("broadcast_in_dim", tv, "operand")
        shape = shape_entries("broadcast_in_dim", shape)
        broadcast_dims = int_list(
            OperandError, "broadcast_in_dim", "broadcast_dims", broadcast_dims
        )
        for dim, size in enumerate(shape):
            if is_int(size) and size > MAX_EXTENT:  # smaller sizes: checked with their dims
                raise OperandError(
                    f"broadcast_in_dim: shape[{dim}] = {shown(size)} of {tv.name}'s output is"
                    f" larger than an extent can be ({MAX_EXTENT})"
                )
        broadcast_dims = wrapped_dims(tv, broadcast_dims, len(shape))
        extents = broadcast_extents(tv, shape, broadcast_dims)
        inputs = {x.name for x in self._fusion.inputs() if isinstance(x, ScalarVal)}
        self._fusion.require(mapped_requirements(tv, extents, broadcast_dims, inputs), carry=True)
        given = TensorValue(name=tv.name, dtype=tv.dtype.to_hostir(), shape=extents)
        operands = {"src": tv, "broadcast_dims": tuple(broadcast_dims)}
        return record(self._fusion, BROADCAST_IN_DIM, operands, given={"out": given})[0]

    def broadcast(self, tv: TensorView, is_broadcast_dim: Sequence[bool]) -> TensorView:
        """nvFuser's ``broadcast(arg, is_broadcast_dim)``: the output has one dim per
        entry, a new broadcast dim of extent 1 where it is True, and ``tv``'s dims in
        order where it is False (``broadcast_in_dim`` with those dims kept)."""
        tv = _check_tensor("broadcast", tv, "operand")
        if isinstance(is_broadcast_dim, str | bytes) or not isinstance(is_broadcast_dim, Sequence):
            raise OperandError(
                f"broadcast of {tv.name}: is_broadcast_dim must be a list of bools, got"
                f" {shown(is_broadcast_dim)}"
            )
        flags = [
            check_bool(OperandError, "broadcast", f"is_broadcast_dim[{i}]", flag)
            for i, flag in enumerate(is_broadcast_dim)
        ]
        kept = [i for i, flag in enumerate(flags) if not flag]
        dims = len(tv.shape_domain())
        if len(kept) != dims:
            raise OperandError(
                f"broadcast of {tv.name}: is_broadcast_dim {flags} keeps {len(kept)} dims,"
                f" but {tv.name} has {dims}: one False per dim of the operand"
            )
        return self.broadcast_in_dim(tv, [1 if flag else -1 for flag in flags], kept)

    def size(self, tv: TensorView, dim: int) -> Any:
        """nvFuser's ``size(arg, dim)``: the extent of ``tv``'s dim ``dim`` as an Int scalar
        (``TensorView.size``)."""
        return _check_tensor("size", tv, "operand").size(dim)

    def shape(self, tv: TensorView) -> list[Any]:
        """nvFuser's ``shape(arg)``: every dim's extent as Int scalars
        (``TensorView.shape``)."""
        return _check_tensor("shape", tv, "operand").shape()

    def permute(self, tv: TensorView, dims: Sequence[int]) -> TensorView:
        """Output dim ``i`` is ``tv``'s dim ``dims[i]``."""
        tv = _check_tensor("permute", tv, "operand")
        ndim = len(tv.shape_domain())
        normalized = _dims("permute", tv, int_list(OperandError, "permute", "dims", dims))
        if len(normalized) != ndim:
            raise OperandError(
                f"permute: dims {shown(dims)} must be a permutation of the {ndim} dims of {tv.name}"
            )
        return record(self._fusion, PERMUTE, {"src": tv, "dims": normalized})[0]


def _check_constant_fits(op: str, operand: Operand, dtype: DataType) -> None:
    """An int constant must fit the integer dtype of the result it is computed in: torch
    converts it to that dtype and silently wraps (``int32_tensor + 2**40`` adds 0)."""
    if dtype not in (DataType.Int, DataType.Int32):
        return
    value = operand.value if isinstance(operand, ScalarVal) else operand
    if is_int(value):
        what = (
            f"the constant {operand.name} =" if isinstance(operand, ScalarVal) else "the constant"
        )
        why = ", the dtype its result is computed in: it would wrap around"
        check_fits(OperandError, op, what, value, dtype, why)


def _checked(method: Callable) -> Callable:
    """``method`` refusing, before it runs: an op added to a finished definition (nvFuser
    refuses too: it would be silently missing from the lowered program), arguments that do
    not fit its parameters, and a tensor or scalar of another FusionDefinition (it would
    silently stand for this fusion's value of the same name)."""
    signature = inspect.signature(method)
    where = f"fd.ops.{method.__name__}"
    parameters = ", ".join(list(signature.parameters)[1:])

    @functools.wraps(method)
    def checked(self: Ops, *args: Any, **kwargs: Any) -> Any:
        if self._fusion.finished:
            raise DefinitionError(
                f"{where}: the fusion definition is finished; add ops inside"
                " the 'with FusionDefinition() as fd:' block (before the first execute)"
            )
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError as error:
            raise OperandError(f"{where}({parameters}): {error}") from None
        for name, value in list(bound.arguments.items())[1:]:
            role = "operand" if name in ("tv", "x", "arg") else name
            self._fusion.check_owns(where, value, role)
        return method(self, *args, **kwargs)

    return checked


_RULE_TEXT = {
    DtypeRule.PROMOTE: "the operands' common dtype (nvFuser's promotion); Half and BFloat16"
    " compute and return Float",
    DtypeRule.FLOAT: "as the common dtype, but integer and bool operands give Float; Half and"
    " BFloat16 compute and return Float",
    DtypeRule.SAME: "the operand's dtype (Half stays Half)",
    DtypeRule.COMPARE: "Bool; the operands are compared in their common dtype",
    DtypeRule.SELECT: "the common dtype of x and y (Half stays Half); condition must be Bool",
}


def _pointwise_method(decl: OpDecl) -> Callable[..., TensorView]:
    """The ``fd.ops`` method of a declared pointwise op: nvFuser's signature, a docstring
    from the declaration's summary and dtype rule."""
    names = [p.name for p in decl.params]
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    signature = inspect.Signature(parameters, return_annotation=TensorView)

    def method(self: Ops, *args: Any, **kwargs: Any) -> TensorView:
        bound = signature.bind(self, *args, **kwargs)
        return self._pointwise(decl.name, tuple(bound.arguments[n] for n in names))

    method.__name__ = decl.name
    method.__qualname__ = f"Ops.{decl.name}"
    method.__signature__ = signature
    method.__doc__ = (
        f"{decl.summary}\n\nDtype: {_RULE_TEXT[DtypeRule(decl.dtype_rule)]}. Scalars are"
        " taken as operands. Shards as its operands, communicates nothing (docs/ops.md)."
    )
    return method


# Every declared pointwise op is an fd.ops method, unless written out above (gelu).
for _decl in POINTWISE_DECLS.values():
    if _decl.name not in vars(Ops):
        setattr(Ops, _decl.name, _pointwise_method(_decl))

# The creation, random, indexing and scan ops are written in their own modules.
from frontend.creation_ops import CREATION_METHODS  # noqa: E402 - joins the class above
from frontend.expert_ops import EXPERT_METHODS  # noqa: E402
from frontend.indexing_ops import INDEXING_METHODS  # noqa: E402

for _method_name, _method in {**CREATION_METHODS, **INDEXING_METHODS, **EXPERT_METHODS}.items():
    setattr(Ops, _method_name, _method)

# The attention and MoE ops (frontend.attention_ops) are methods too.
for _attention_op, _function in ATTENTION_OPS.items():
    setattr(Ops, _attention_op, _function)

# The shape ops are written in frontend.shape_ops.
for _shape_op, _shape_method in SHAPE_METHODS.items():
    setattr(Ops, _shape_op, _shape_method)

# The reductions and their composites (frontend.reduction_ops) are fd.ops methods too.
for _method_name, _method in REDUCTION_METHODS.items():
    setattr(Ops, _method_name, _method)

# Every other declared op's method is made from its declaration (frontend.declared_methods).
for _decl in declared_ops():
    if _decl.fd_method and _decl.name not in vars(Ops):
        setattr(Ops, _decl.name, declared_method(_decl))

# Every public op checks its arguments and that the definition is still open.
for _op_name in [name for name in vars(Ops) if not name.startswith("_")]:
    setattr(Ops, _op_name, _checked(getattr(Ops, _op_name)))

_LATER: dict[str, tuple[OpDecl, Callable]] = {}
"""The methods of ops declared after import, by name, with the declaration each was made
from (an op declared again gets a new one)."""


def _declared_later(name: str) -> Callable | None:
    """The checked method of op ``name``, declared after this module was imported; None if
    no op of that name is declared, or it has no ``fd.ops`` method."""
    decl = op_named(name)
    if decl is None or not decl.fd_method or name.startswith("_"):
        return None
    made = _LATER.get(name)
    if made is None or made[0] is not decl:
        made = _LATER[name] = (decl, _checked(declared_method(decl)))
    return made[1]
