"""Recording an op from its declaration (``hostir.ir.opdecl``): what ``fd.ops`` does for
every declared op.

:func:`record` turns the operands into the host IR's terms (a tensor into a placeholder
value of its name, dtype and extents; a scalar into its expression), asks the op's
``infer`` for its results (a refusal is an :class:`OperandError` in the declaration's
words), makes each result's TensorView, its axes of the declared kinds, maps them to the
operand axes they iterate with, and records one :class:`~frontend.exprs.FusionOp` holding
the op's instruction (an op of several results too: one expression, several outputs).
An ``fd.ops`` method only checks the form of its arguments (and translates nvFuser's to
the declaration's) before it records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from frontend.errors import OperandError
from frontend.exprs import FusionOp, ScalarVal, placeholder
from frontend.fusion import Fusion
from frontend.iter_domain import IterDomain, IterType
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import Const, TensorValue
from hostir.ir.opdecl import AxisKind, OpArgs, OpDecl, ParamKind, ResultAxis, ResultType
from hostir.ir.pointwise import POINTWISE_DECLS
from hostir.ir.requirements import HIGH, LOW, Requirement
from hostir.ir.scalars import BinaryExpr, MeshCoordinate, Symbol, symbols_of

PYTHON_TYPES = {DataType.Bool: bool, DataType.Int: int, DataType.Int32: int}
"""The Python type a scalar of each DataType counts as in a dtype rule (others: float)."""

_ITER_TYPES = {
    AxisKind.ITERATION: IterType.ITERATION,
    AxisKind.BROADCAST: IterType.BROADCAST,
    AxisKind.REDUCTION: IterType.REDUCTION,
}


def record(
    fusion: Fusion,
    decl: OpDecl,
    operands: Mapping[str, Any],
    given: Mapping[str, TensorValue] | None = None,
    mesh_from: Sequence[TensorView] = (),
) -> tuple[TensorView, ...]:
    """Records op ``decl`` on ``operands`` (by param field: TensorViews, ScalarVals,
    Python numbers, host IR scalar expressions, attribute values; a missing one takes its
    default) in ``fusion``, and returns its results. ``given``: the results' dtype or
    extents the caller chooses. ``mesh_from``: tensors the op reads nothing of but takes its
    mesh from (an op that reads no tensor, ``sdpfa_philox``): inputs of the expression, none
    of their axes mapped."""
    values, types, names, users = {}, {}, {}, []
    for param in decl.params:
        value = operands.get(param.field, param.default)
        if param.kind is ParamKind.ATTRIBUTE:
            values[param.field] = value
            continue
        if isinstance(value, Const | Symbol | MeshCoordinate | BinaryExpr):
            values[param.field] = value  # an expression the method made (a slice's clamped end)
            continue
        users.append(value)
        if isinstance(value, TensorView):
            values[param.field] = placeholder(value)
        elif isinstance(value, ScalarVal):
            values[param.field] = value.to_hostir()
            types[param.field] = PYTHON_TYPES.get(value.dtype, float)
            names[param.field] = value.name
        elif value is None:
            values[param.field] = None
        else:  # a Python number
            values[param.field] = Const(value=value)
            types[param.field], names[param.field] = type(value), repr(value)
    args = OpArgs(values=values, scalar_types=types, names=names, given=given or {})
    inferred = decl.infer(args)
    if isinstance(inferred, str):
        raise OperandError(inferred)
    tensors = {field: v for field, v in operands.items() if isinstance(v, TensorView)}
    results = []
    for result_type in inferred:
        axes = [IterDomain(a.extent, _iter_type(a, tensors)) for a in result_type.axes]
        results.append(fusion.new_tensor(DataType(result_type.dtype), axes))
    outs = {r.field: placeholder(tv) for r, tv in zip(decl.results, results, strict=True)}
    instruction = decl.cls(**decl.fixed, **outs, **values)
    fusion.require(decl.requirements(instruction) if decl.requirements is not None else ())
    fusion.require(_tied_extents(fusion, decl, values, inferred, results), carry=True)
    users += [tv for tv in mesh_from if tv not in users]
    axis_maps = []
    for tv, result_type in zip(results, inferred, strict=True):
        axis_map = _axis_map(decl, tensors, tv, result_type.axes)
        for tensor in mesh_from:
            axis_map.setdefault(tensor, [])
        axis_maps.append(axis_map)
    op = FusionOp(
        results[0],
        axis_map=axis_maps[0],
        instruction=instruction,
        decl=decl,
        operands=tuple(users),
        more_outputs=tuple(results[1:]),
        more_axis_maps=tuple(axis_maps[1:]),
    )
    fusion.add_expr(op)  # one expression, however many results the op has
    return tuple(results)


def _tied_extents(
    fusion: Fusion,
    decl: OpDecl,
    values: Mapping[str, Any],
    inferred: Sequence[ResultType],
    results: Sequence[TensorView],
) -> tuple[Requirement, ...]:
    """What a pointwise op needs of operand extents written apart that a scalar input
    sizes (``add(full([s0, 4], 1.0), T0[8, 4])``): equal to the result's extent at that
    position, checked when the inputs bind them (``hostir.check.value_rules``), so that
    ``s0 = 9`` is a BoundRequirementError on every rank before anything runs, not torch's
    size mismatch mid-run. Extents of tensor inputs alone are left as they were (a size-1
    dim bound to a symbol broadcasts), and run-time extents are bound too late for it."""
    if POINTWISE_DECLS.get(decl.name) is not decl:  # the pointwise ops broadcast
        return ()
    scalars = {v.name for v in fusion.inputs() if isinstance(v, ScalarVal)}
    out = results[0].name
    found = []
    for position, axis in enumerate(inferred[0].axes):
        for source in axis.sources:
            operand = values[source.operand]
            extent = operand.shape[source.dim]
            read = symbols_of(extent) | symbols_of(axis.extent)
            if extent == axis.extent or not read & scalars or not read <= _input_symbols(fusion):
                continue
            # a negative extent first, in the words the extent checks give it (they run later)
            sides = ((operand.name, source.dim, extent), (out, position, axis.extent))
            for name, dim, side in sides:
                if symbols_of(side) & scalars:
                    message = f"{name} dim {dim}: extent {HIGH} is not a whole number >= 0"
                    found.append(Requirement(low=Const(value=0), high=side, message=message))
            where = f"{decl.name}: dim {source.dim} of {operand.name}"
            tail = f" it broadcasts with (output dim {position}); the extents must be equal"
            found.append(
                Requirement(
                    low=extent,
                    high=axis.extent,
                    message=f"{where} ({LOW}) is larger than the extent {HIGH}{tail}",
                )
            )
            found.append(
                Requirement(
                    low=axis.extent,
                    high=extent,
                    message=f"{where} ({HIGH}) is smaller than the extent {LOW}{tail}",
                )
            )
    return tuple(found)


def _input_symbols(fusion: Fusion) -> set[str]:
    """The symbols the fusion's inputs bind: its scalar inputs and its tensor inputs'
    symbolic extents (not run-time extents, bound as the program runs)."""
    bound = set()
    for value in fusion.inputs():
        if isinstance(value, ScalarVal):
            bound.add(value.name)
        else:
            for extent in placeholder(value).shape:
                bound |= symbols_of(extent)
    return bound


def _iter_type(axis: ResultAxis, tensors: Mapping[str, TensorView]) -> IterType:
    """The iter type of a new axis of the declared kind (INHERIT: its first source's)."""
    if axis.kind is not AxisKind.INHERIT:
        return _ITER_TYPES[axis.kind]
    if axis.sources:
        source = axis.sources[0]
        return tensors[source.operand].shape_domain()[source.dim].iter_type
    return IterType.BROADCAST if axis.extent == Const(value=1) else IterType.ITERATION


def _axis_map(
    decl: OpDecl,
    tensors: Mapping[str, TensorView],
    out: TensorView,
    axes: tuple[ResultAxis, ...],
) -> dict[TensorView, list[tuple[IterDomain, IterDomain]]]:
    """Per tensor operand (each once, in the declaration's order), the pairs (result axis,
    operand axis) the declaration maps."""
    axis_map: dict[TensorView, list[tuple[IterDomain, IterDomain]]] = {}
    for param in decl.params:
        if param.field in tensors:
            axis_map.setdefault(tensors[param.field], [])
    for new, axis in zip(out.get_logical_domain(), axes, strict=True):
        for source in axis.sources:
            tv = tensors[source.operand]
            axis_map[tv].append((new, tv.shape_domain()[source.dim]))
    return axis_map
