"""Op declarations: each compute op declared once (:class:`OpDecl`).

A declaration says, for one keyword (nvFuser's name: ``relu``, ``sum``), everything the
layers need to know of the op:

- its **params**, the instruction's operand and attribute fields in order, with nvFuser's
  names and defaults where they differ (``src`` is nvFuser's ``arg``);
- its **results** (several allowed), the fields it defines;
- its **dtype and shape rule**, one function ``infer(OpArgs)``: the type of each result
  (a dtype and its logical axes, each with its extent, its kind, the operand axes it
  iterates with and whether it is computed whole), or the refusal as one sentence. The
  frontend records an op with it, the verifier checks a program's instruction against it,
  lowering reads its axis facts;
- the **facts sharding needs** (:class:`OpSharding`);
- a one-line **summary** (``fd.ops``' docstring, docs/ops.md).

The declaration builds on the instruction catalog (``hostir.ir.catalog``), which keeps the
class, its keyword and its text syntax. :func:`declare_op` comes in two forms: given an
existing dataclass (``cls=``) it checks that the class has exactly the declared fields, in
order, so text and JSON stay what they were; without one it makes the class and declares
it in the catalog. The torch implementation is registered in ``hostir.run`` under the
declaration's name (``hostir.run.implementations``). Layers find a declaration with
:func:`op_decl`; an instruction whose op is not declared gets None, and the layer's own
table answers for it.

This module imports no instruction module, so the modules that hold instruction classes
declare their ops here without an import circle.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import Any, get_type_hints

from hostir.ir.catalog import Kind, declaration_of, declare, keyword
from hostir.ir.dtypes import DType
from hostir.ir.scalars import BinaryExpr, Const, MeshCoordinate, Scalar, print_scalar
from hostir.ir.sharding import ReduceOp
from hostir.ir.values import TensorValue


class _Required:
    """The type of :data:`REQUIRED`."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The default of a param that has none."""


class ParamKind(enum.Enum):
    """What a param is at run time."""

    TENSOR = "tensor"  # a TensorValue (or None where optional): read at run time
    OPERAND = "operand"  # a tensor or a scalar: read at run time
    SCALAR = "scalar"  # a scalar expression: evaluated at run time
    ATTRIBUTE = "attribute"  # static: ints, bools, an enum, a dtype; not read at run time


@dataclass(frozen=True)
class Param:
    """One operand or attribute field of an op."""

    field: str
    kind: ParamKind
    annotation: Any
    """The field's type, as the instruction class declares it (text and JSON read it)."""
    default: Any = REQUIRED
    nvfuser: str | None = None
    """The name ``fd.ops`` gives it where nvFuser's differs from the field's (``arg``)."""
    nvfuser_default: Any = REQUIRED
    """nvFuser's default where the instruction's field has none (``dims=None``)."""
    dim_of: str | None = None
    """The tensor param whose dim (or dims) this attribute names: ``fd.ops`` wraps a
    negative one (``dim=-1``) and refuses one out of range before the op infers."""

    @property
    def name(self) -> str:
        """nvFuser's name of the param."""
        return self.nvfuser or self.field

    def signature_text(self) -> str:
        """``dims=None``: how nvFuser's signature writes the param."""
        default = self.nvfuser_default if self.nvfuser_default is not REQUIRED else self.default
        return self.name if default is REQUIRED else f"{self.name}={default!r}"


@dataclass(frozen=True)
class Result:
    """One result field of an op."""

    field: str = "out"


class AxisKind(enum.Enum):
    """What a result axis is in the frontend's logical domain."""

    INHERIT = "inherit"  # the iter type of its first source axis (a plain axis without one)
    ITERATION = "iteration"
    BROADCAST = "broadcast"
    REDUCTION = "reduction"  # a reduced axis: logical only, no data dim of the result


@dataclass(frozen=True)
class AxisSource:
    """An operand axis that a result axis iterates with: data dim ``dim`` of operand
    field ``operand``."""

    operand: str
    dim: int


@dataclass(frozen=True)
class ResultAxis:
    """One logical axis of a result."""

    extent: Scalar
    kind: AxisKind = AxisKind.INHERIT
    sources: tuple[AxisSource, ...] = ()
    """The operand axes it iterates with (the frontend's axis map, lowering's axis pairs)."""
    whole: bool = False
    """Computed unsharded and unchunked: a rank needs all of it (a cumsum's dim)."""


def result_axis(
    extent: Scalar,
    *sources: tuple[str, int],
    kind: AxisKind = AxisKind.INHERIT,
    whole: bool = False,
) -> ResultAxis:
    """A result axis of ``extent`` iterating with the operand axes ``sources``, each a
    ``(field, dim)`` pair: the short form a declaration's ``infer`` writes."""
    return ResultAxis(
        extent=extent, kind=kind, sources=tuple(AxisSource(*s) for s in sources), whole=whole
    )


@dataclass(frozen=True)
class ResultType:
    """A result's dtype and logical axes (reduction axes where the frontend keeps them)."""

    dtype: DType
    axes: tuple[ResultAxis, ...]

    @property
    def shape(self) -> tuple[Scalar, ...]:
        """The extents of its data dims (the host IR value's shape)."""
        return tuple(a.extent for a in self.axes if a.kind is not AxisKind.REDUCTION)


@dataclass(frozen=True)
class OpSharding:
    """What lowering's sharding passes need to know of an op beyond its axis map."""

    elementwise: bool = False
    """Every operand plays one role (dims aligned alike): a tensor read as two operands
    needs one layout, one chunking."""
    combine: ReduceOp | None = None
    """How partial results over a sharded reduced axis combine (None: a sum)."""
    mesh_priority: tuple[str, ...] = ()
    """The operand fields that lend the result their mesh and sharding first, in order
    (linear: weight, bias, input); empty: the most sharded operand first."""
    added_after_reduction: str | None = None
    """The operand field added after partial results are reduced (linear's bias)."""
    reads_no_tensor: bool = False
    """Its tensor operands give it a mesh only (sdpfa_philox): none is resharded."""
    keeps_blocks: bool = False
    """A dim it splits or merges keeps its operand's sharded blocks where each rank's shard
    stays one block of the result (``reshape``: ``lowering.shape_ops``)."""


@dataclass(frozen=True)
class OpArgs:
    """What ``infer`` reads: the instruction's param values by field, and what the values
    alone do not say."""

    values: Mapping[str, Any]
    """Per param field: a TensorValue, a scalar expression, or the attribute's value."""
    scalar_types: Mapping[str, type] = field(default_factory=dict)
    """Per scalar operand field: its Python type (bool, int, float) where the value does
    not show it (a symbol); the frontend gives every scalar's."""
    names: Mapping[str, str] = field(default_factory=dict)
    """Per scalar operand field: how a message names it (default: the expression)."""
    given: Mapping[str, TensorValue] = field(default_factory=dict)
    """Per result field whose dtype or shape the caller chooses (cast's dtype): a value
    holding them."""

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def scalar_type(self, name: str) -> type:
        """The Python type of scalar operand ``name``."""
        known = self.scalar_types.get(name)
        return known if known is not None else scalar_type(self.values[name])

    def name(self, name: str) -> str:
        """How a message names operand ``name``."""
        value = self.values[name]
        if isinstance(value, TensorValue):
            return value.name
        return self.names.get(name) or print_scalar(value)


Inferred = tuple[ResultType, ...] | str
"""The result types of an op, one per result, or why the op refuses its operands."""


@dataclass(frozen=True)
class OpDecl:
    """One compute op, declared once (see the module docstring)."""

    name: str
    cls: type
    fixed: Mapping[str, Any]
    """The fields the keyword fixes (``{"op": UnaryOpKind.RELU}`` for a family class)."""
    params: tuple[Param, ...]
    results: tuple[Result, ...]
    infer: Callable[[OpArgs], Inferred]
    summary: str
    dtype_rule: str
    """The dtype rule's name, as docs/ops.md writes it (``promote``, ``accumulate``)."""
    sharding: OpSharding = OpSharding()
    requirements: Callable[[Any], tuple] | None = None
    """The rules on bound values the instruction shows (``hostir.ir.requirements``)."""
    check: Callable[[Any], str | None] | None = None
    """What only an instruction shows, checked by the verifier before ``infer`` (``set``:
    its local extents), as a sentence, or None."""
    given: frozenset[str] = frozenset()
    """What of its result the caller chooses (``cast``'s ``"dtype"``, ``broadcast_in_dim``'s
    ``"shape"``): ``infer`` reads it from ``OpArgs.given``."""
    nvfuser_signature: str | None = None
    """nvFuser's signature where the ``fd.ops`` method takes other arguments than the
    params (``cast(tv, dtype)``)."""
    fd_method: bool = True
    """``fd.ops`` has a method for it (made from the params unless one is written); False
    for an op that only another op's method records (``sdpfa_philox``)."""

    def param(self, name: str) -> Param:
        """The param of field ``name``."""
        return next(p for p in self.params if p.field == name)

    def signature(self) -> str:
        """nvFuser's signature: ``sum(arg, dims=None, keepdim=False, dtype=None)``."""
        if self.nvfuser_signature is not None:
            return self.nvfuser_signature
        return f"{self.name}({', '.join(p.signature_text() for p in self.params)})"

    def args_of(self, instruction: Any, scalar_types: Mapping[str, type] = {}) -> OpArgs:
        """What ``infer`` reads of ``instruction`` (``scalar_types``: the Python type of
        each scalar symbol, by symbol name)."""
        values = {p.field: getattr(instruction, p.field) for p in self.params}
        types = {
            p.field: scalar_type(values[p.field], scalar_types)
            for p in self.params
            if p.kind in (ParamKind.OPERAND, ParamKind.SCALAR)
        }
        given = {r.field: getattr(instruction, r.field) for r in self.results}
        return OpArgs(values=values, scalar_types=types, given=given)

    def infer_of(self, instruction: Any, scalar_types: Mapping[str, type] = {}) -> Inferred:
        """``infer`` on ``instruction``'s params."""
        return self.infer(self.args_of(instruction, scalar_types))


def scalar_type(value: Any, symbols: Mapping[str, type] = {}) -> type:
    """The Python type of a scalar expression (``symbols``: a symbol's, by name; int if
    unknown, as extents and loop indices are)."""
    if isinstance(value, Const):
        return type(value.value)
    if isinstance(value, MeshCoordinate):
        return int
    if isinstance(value, BinaryExpr):
        types = {scalar_type(value.lhs, symbols), scalar_type(value.rhs, symbols)}
        return float if float in types else int
    name = getattr(value, "name", None)
    return symbols.get(name, int) if isinstance(name, str) else int


# ----- the registry -----------------------------------------------------------------------

_DECLS: dict[str, OpDecl] = {}


def op_decl(instruction: Any) -> OpDecl | None:
    """The declaration of ``instruction``'s op; None where its op is not declared."""
    return _DECLS.get(keyword(instruction))


def op_named(name: str) -> OpDecl | None:
    """The declaration of op ``name``; None if there is none."""
    return _DECLS.get(name)


def declared_ops() -> tuple[OpDecl, ...]:
    """Every declared op, in the order it was declared."""
    return tuple(_DECLS.values())


def declare_op(
    name: str,
    *,
    params: tuple[Param, ...],
    infer: Callable[[OpArgs], Inferred],
    summary: str,
    dtype_rule: str,
    results: tuple[Result, ...] = (Result(),),
    sharding: OpSharding = OpSharding(),
    requirements: Callable[[Any], tuple] | None = None,
    check: Callable[[Any], str | None] | None = None,
    given: frozenset[str] = frozenset(),
    nvfuser_signature: str | None = None,
    fd_method: bool = True,
    cls: type | None = None,
    class_name: str | None = None,
    positional: tuple[str, ...] = (),
) -> OpDecl:
    """Declares op ``name`` and returns its declaration.

    With ``cls`` (an instruction class already in the catalog, whose keyword or ``op``
    enum member is ``name``), checks that its fields are the declared ones in order (the
    enum field, the results, the params, then ``preallocated``), with the declared types
    and defaults, and that its ``OUTS`` and ``INS`` are the results and the params read at
    run time: a TypeError names the difference. Without ``cls``, makes the instruction
    class ``class_name`` (frozen, slotted, keyword-only; its docstring the summary) with
    those fields and declares it in the catalog, ``positional`` fields written first.
    """
    if cls is None:
        cls = _make_class(name, class_name, params, results, summary, positional, infer)
    fixed = _fixed(name, cls)
    _check_fields(name, cls, fixed, params, results)
    decl = OpDecl(
        name=name,
        cls=cls,
        fixed=fixed,
        params=params,
        results=results,
        infer=infer,
        summary=summary,
        dtype_rule=dtype_rule,
        sharding=sharding,
        requirements=requirements,
        check=check,
        given=given,
        nvfuser_signature=nvfuser_signature,
        fd_method=fd_method,
    )
    _DECLS[name] = decl
    return decl


def _make_class(
    name: str,
    class_name: str | None,
    params: tuple[Param, ...],
    results: tuple[Result, ...],
    summary: str,
    positional: tuple[str, ...],
    infer: Callable,
) -> type:
    """The instruction class of a new op, declared in the catalog."""
    if class_name is None:
        raise TypeError(f"declare_op({name!r}): a new op needs class_name (its JSON tag)")
    specs: list[tuple] = [(r.field, TensorValue) for r in results]
    for p in params:
        default = () if p.default is REQUIRED else (p.default,)
        specs.append((p.field, p.annotation, *default))
    specs.append(("preallocated", bool, False))
    namespace = {
        "OUTS": tuple(r.field for r in results),
        "INS": tuple(p.field for p in params if p.kind is not ParamKind.ATTRIBUTE),
    }
    made = make_dataclass(
        class_name, specs, namespace=namespace, frozen=True, slots=True, kw_only=True
    )
    made.__doc__ = summary
    made.__module__ = infer.__module__  # the declaring module (a module run again replaces it)
    return declare(kind=Kind.COMPUTE, keyword=name, positional=positional)(made)


def _fixed(name: str, cls: type) -> dict[str, Any]:
    """The fields keyword ``name`` fixes in ``cls``; TypeError if it does not name it."""
    declaration = declaration_of(cls)
    if declaration.kind is not Kind.COMPUTE:
        raise TypeError(f"declare_op({name!r}): {cls.__name__} is not a compute instruction")
    keywords = declaration.keywords()
    if name not in keywords:
        raise TypeError(f"declare_op({name!r}): {cls.__name__} has keywords {sorted(keywords)}")
    return dict(keywords[name])


def _check_fields(
    name: str,
    cls: type,
    fixed: Mapping[str, Any],
    params: tuple[Param, ...],
    results: tuple[Result, ...],
) -> None:
    """TypeError unless ``cls``'s fields, OUTS and INS are the declared ones."""
    declared = [*fixed, *(r.field for r in results), *(p.field for p in params), "preallocated"]
    actual = [f.name for f in fields(cls)]
    problems = []
    if actual != declared:
        problems.append(f"fields {actual}, declared {declared}")
    hints = get_type_hints(cls)
    defaults = {f.name: REQUIRED if f.default is MISSING else f.default for f in fields(cls)}
    for p in params:
        if p.field in hints and hints[p.field] != p.annotation:
            problems.append(f"{p.field} is {hints[p.field]}, declared {p.annotation}")
        if p.field in defaults and defaults[p.field] != p.default:
            problems.append(f"{p.field} defaults to {defaults[p.field]!r}, declared {p.default!r}")
    outs = tuple(r.field for r in results)
    ins = tuple(p.field for p in params if p.kind is not ParamKind.ATTRIBUTE)
    if cls.OUTS != outs or cls.INS != ins:
        problems.append(f"OUTS {cls.OUTS} and INS {cls.INS}, declared {outs} and {ins}")
    if problems:
        raise TypeError(f"declare_op({name!r}) on {cls.__name__}: {'; '.join(problems)}")
