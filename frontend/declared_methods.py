"""``fd.ops`` methods made from op declarations (``hostir.ir.opdecl``).

An op whose nvFuser form is one instruction, with nvFuser's arguments being its params,
needs no method written out: :func:`declared_method` makes it from the declaration. The
method has nvFuser's signature (each param under its nvFuser name, with its default), a
docstring from the summary and the dtype rule, and a body that checks the form of each
argument from the param's kind and type (a tensor, a scalar, a bool, an int, a dim of a
tensor operand, which it wraps) and records the op (``frontend.recording``): every rule on
dtypes and extents is the declaration's ``infer``.

``frontend.ops`` attaches such a method to ``Ops`` for each op declared when it is imported
that has none written out (``linear``, ``argsort``); an op declared later, outside the
package, is found by ``Ops.__getattr__`` (docs/extending.md, "Adding an op"). Ops whose
nvFuser form is not one instruction (``topk``'s ``k``, ``pad``'s list of widths, the
reductions' ``keepdim``) keep a written method that translates their arguments and calls
``record``; so do the pointwise ops, whose method also folds scalars (``frontend.ops``).
"""

from __future__ import annotations

import enum
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import torch

from frontend.arguments import check_bool, check_fits, int_list, is_int, shown
from frontend.errors import OperandError
from frontend.exprs import ScalarVal
from frontend.recording import record
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir.ir.dtypes import DType
from hostir.ir.opdecl import REQUIRED, OpDecl, Param, ParamKind

_NUMBERS = (bool, int, float)


def declared_method(decl: OpDecl) -> Callable[..., Any]:
    """The ``fd.ops`` method of op ``decl`` (see the module docstring); it returns the
    op's result, or a tuple of them where it has several. TypeError if its params cannot
    form a Python signature (a param without a default after one with)."""
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for param in decl.params:
        default = _default(param)
        parameters.append(
            inspect.Parameter(
                param.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=inspect.Parameter.empty if default is REQUIRED else default,
            )
        )
    try:
        signature = inspect.Signature(parameters)
    except ValueError as error:
        raise TypeError(f"fd.ops.{decl.name} cannot be made from its params: {error}") from None
    attributes = [p for p in decl.params if p.kind is ParamKind.ATTRIBUTE]
    operands = [p for p in decl.params if p.kind is not ParamKind.ATTRIBUTE]

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        values: dict[str, Any] = {}
        for param in operands:  # first: a dim attribute is checked against its tensor
            values[param.field] = _operand(decl.name, param, given[param.name])
        for param in attributes:
            values[param.field] = _attribute(decl.name, param, given[param.name], values)
        results = record(self._fusion, decl, values)
        return results[0] if len(results) == 1 else results

    method.__name__ = decl.name
    method.__qualname__ = f"Ops.{decl.name}"
    method.__signature__ = signature
    method.__doc__ = (
        f"{decl.summary}\n\nnvFuser's ``{decl.signature()}``. Dtype rule: ``{decl.dtype_rule}``"
        f" (docs/ops.md). Recorded from its declaration (``{decl.infer.__module__}``)."
    )
    return method


def _default(param: Param) -> Any:
    """The default of ``param`` in nvFuser's signature (REQUIRED: none)."""
    return param.nvfuser_default if param.nvfuser_default is not REQUIRED else param.default


def _operand(op: str, param: Param, value: Any) -> Any:
    """A tensor or scalar argument, checked for its form (its dtype and extents are the
    declaration's to check)."""
    if value is None and _default(param) is None:
        return None  # an optional operand not given
    if param.kind is ParamKind.TENSOR:
        if not isinstance(value, TensorView):
            raise OperandError(f"{op}: {param.name} must be a TensorView, got {shown(value)}")
        return value
    taken = (ScalarVal, *_NUMBERS) + ((TensorView,) if param.kind is ParamKind.OPERAND else ())
    if not isinstance(value, taken):
        what = "a tensor or a scalar" if param.kind is ParamKind.OPERAND else "a scalar"
        raise OperandError(f"{op}: {param.name} must be {what}, got {shown(value)}")
    if is_int(value):
        why = ": torch and nvFuser take a Python int as an int64 scalar"
        check_fits(OperandError, op, param.name, value, DataType.Int, why)
    return value


def _attribute(op: str, param: Param, value: Any, operands: Mapping[str, Any]) -> Any:
    """A static argument in the form the instruction's field holds it, by the field's type:
    a bool, an int, a float, ints (a dim or dims of a tensor operand wrapped), a dtype, an
    enum member (or its value); any other type is taken as given."""
    if value is None and _default(param) is None:
        return None
    if param.dim_of is not None:
        return _dims(op, param, value, operands[param.dim_of])
    simple = _SIMPLE.get(param.annotation)
    if simple is not None:
        return simple(op, param.name, value)
    kinds = _types_of(param.annotation)
    if DType in kinds:
        if not isinstance(value, DataType | torch.dtype):
            raise OperandError(
                f"{op}: {param.name} must be a DataType or torch.dtype, got {shown(value)}"
            )
        return DataType.of(value).to_hostir()
    enums = [t for t in kinds if isinstance(t, type) and issubclass(t, enum.Enum)]
    if not enums or isinstance(value, enums[0]):
        return value
    try:
        return enums[0](value)
    except ValueError:
        taken = ", ".join(repr(m.value) for m in enums[0])
        why = f"{op}: {param.name} must be one of {taken}, got {shown(value)}"
        raise OperandError(why) from None


def _int(op: str, name: str, value: Any) -> int:
    if not is_int(value):
        raise OperandError(f"{op}: {name} must be an int, got {shown(value)}")
    return value


def _float(op: str, name: str, value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise OperandError(f"{op}: {name} must be a number, got {shown(value)}")
    return float(value)


_SIMPLE: dict[Any, Callable[[str, str, Any], Any]] = {
    bool: lambda op, name, value: check_bool(OperandError, op, name, value),
    int: _int,
    float: _float,
    tuple[int, ...]: lambda op, name, value: tuple(
        int_list(OperandError, op, name, value, allow_int=True)
    ),
}
"""The check of an attribute of each plain type, returning its value in the field's form."""


def _types_of(annotation: Any) -> tuple[Any, ...]:
    """The types a field's annotation allows (``DType | None``: DType and NoneType)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)
    return (annotation,)


def _dims(op: str, param: Param, value: Any, tv: Any) -> int | tuple[int, ...]:
    """A dim (an int) or dims (ints) of tensor ``tv``, negative ones counted from its last
    dim; OperandError naming ``tv`` for one out of range or repeated."""
    ndim = len(tv.shape_domain())
    if ndim == 0:
        raise OperandError(f"{op}: {tv.name} is 0-d; {op} needs a tensor with dims")
    one = param.annotation is int
    if one and not is_int(value):
        raise OperandError(f"{op}: {param.name} {shown(value)} must be an int")
    wanted = [value] if one else int_list(OperandError, op, param.name, value, allow_int=True)
    dims = []
    for dim in wanted:
        if not -ndim <= dim < ndim:
            raise OperandError(f"{op}: dim {dim} is out of range for {tv.name} with {ndim} dims")
        dims.append(dim % ndim)
    if len(set(dims)) != len(dims):
        raise OperandError(f"{op}: dims {wanted} of {tv.name} repeat")
    return dims[0] if one else tuple(dims)
