"""Symbolic scalars of the host IR: constants, named symbols and arithmetic.

A scalar is an immutable expression tree. Symbols stand for values bound when
a program runs: symbolic tensor extents (``i0``), loop indices, the rank and
mesh coordinates. One SPMD program serves every rank because per-rank values
stay symbolic until the evaluator binds them.

Build expressions with the helpers (:func:`add`, :func:`mul`, :func:`floordiv`,
...), which fold constants so printed programs stay short.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hostir.errors import EvaluationError
from hostir.mesh import Mesh, MeshAxis

RANK = "rank"
"""The symbol bound to this process's rank."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Const:
    """A constant: an int, a float or a bool."""

    value: int | float | bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Symbol:
    """A named value bound at run time (an extent, a loop index, the rank)."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshCoordinate:
    """This rank's coordinate on ``axis`` of ``mesh`` (bound through the ``rank`` symbol)."""

    mesh: Mesh
    axis: MeshAxis


class ScalarOp(enum.Enum):
    """Arithmetic on scalars; the value is the operator's printed form."""

    ADD = "+"
    SUB = "-"
    MUL = "*"
    FLOORDIV = "//"
    MOD = "%"


_APPLY: dict[ScalarOp, Callable[[int, int], int]] = {
    ScalarOp.ADD: operator.add,
    ScalarOp.SUB: operator.sub,
    ScalarOp.MUL: operator.mul,
    ScalarOp.FLOORDIV: operator.floordiv,
    ScalarOp.MOD: operator.mod,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class BinaryExpr:
    """``lhs op rhs`` over scalars."""

    op: ScalarOp
    lhs: Scalar
    rhs: Scalar


Scalar = Const | Symbol | MeshCoordinate | BinaryExpr


def as_scalar(value: Scalar | int | float | bool) -> Scalar:
    """Wraps a Python number as a :class:`Const`; scalars pass through."""
    if isinstance(value, Const | Symbol | MeshCoordinate | BinaryExpr):
        return value
    return Const(value=value)


def _fold(op: ScalarOp, lhs: Scalar, rhs: Scalar) -> Scalar:
    if isinstance(lhs, Const) and isinstance(rhs, Const):
        return Const(value=_APPLY[op](lhs.value, rhs.value))
    identity = {ScalarOp.ADD: 0, ScalarOp.SUB: 0, ScalarOp.MUL: 1, ScalarOp.FLOORDIV: 1}
    if op in identity and isinstance(rhs, Const) and rhs.value == identity[op]:
        return lhs
    if op in (ScalarOp.ADD, ScalarOp.MUL) and isinstance(lhs, Const):
        if lhs.value == identity[op]:
            return rhs
    if op is ScalarOp.MUL and Const(value=0) in (lhs, rhs):
        return Const(value=0)
    if op is ScalarOp.MOD and rhs == Const(value=1):
        return Const(value=0)
    return BinaryExpr(op=op, lhs=lhs, rhs=rhs)


def add(lhs: Scalar | int, rhs: Scalar | int) -> Scalar:
    """``lhs + rhs``, folded."""
    return _fold(ScalarOp.ADD, as_scalar(lhs), as_scalar(rhs))


def sub(lhs: Scalar | int, rhs: Scalar | int) -> Scalar:
    """``lhs - rhs``, folded."""
    return _fold(ScalarOp.SUB, as_scalar(lhs), as_scalar(rhs))


def mul(lhs: Scalar | int, rhs: Scalar | int) -> Scalar:
    """``lhs * rhs``, folded."""
    return _fold(ScalarOp.MUL, as_scalar(lhs), as_scalar(rhs))


def floordiv(lhs: Scalar | int, rhs: Scalar | int) -> Scalar:
    """``lhs // rhs``, folded."""
    return _fold(ScalarOp.FLOORDIV, as_scalar(lhs), as_scalar(rhs))


def mod(lhs: Scalar | int, rhs: Scalar | int) -> Scalar:
    """``lhs % rhs``, folded."""
    return _fold(ScalarOp.MOD, as_scalar(lhs), as_scalar(rhs))


def product(values: list[Scalar | int]) -> Scalar:
    """The product of ``values`` (1 for none), folded."""
    result: Scalar = Const(value=1)
    for value in values:
        result = mul(result, value)
    return result


def evaluate_scalar(expr: Scalar, env: Mapping[str, int | float | bool]) -> int | float | bool:
    """The value of ``expr`` with symbols looked up in ``env``."""
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Symbol):
        if expr.name not in env:
            raise EvaluationError(f"scalar {expr.name} is not bound when it is used")
        return env[expr.name]
    if isinstance(expr, MeshCoordinate):
        coordinate = expr.mesh.coordinate(int(env[RANK]), expr.axis)
        if coordinate is None:
            raise EvaluationError(f"rank {env[RANK]} has no coordinate in mesh {expr.mesh}")
        return coordinate
    lhs = evaluate_scalar(expr.lhs, env)
    rhs = evaluate_scalar(expr.rhs, env)
    if expr.op in (ScalarOp.FLOORDIV, ScalarOp.MOD) and rhs == 0:
        raise EvaluationError(f"division by zero in {print_scalar(expr)}")
    return _APPLY[expr.op](lhs, rhs)


def symbols_of(expr: Scalar) -> set[str]:
    """The names of the symbols ``expr`` reads (a mesh coordinate reads ``rank``)."""
    if isinstance(expr, Symbol):
        return {expr.name}
    if isinstance(expr, MeshCoordinate):
        return {RANK}
    if isinstance(expr, BinaryExpr):
        return symbols_of(expr.lhs) | symbols_of(expr.rhs)
    return set()


_PRECEDENCE = {
    ScalarOp.ADD: 1,
    ScalarOp.SUB: 1,
    ScalarOp.MUL: 2,
    ScalarOp.FLOORDIV: 2,
    ScalarOp.MOD: 2,
}


MeshNamer = Callable[[Mesh], str]


def print_scalar(expr: Scalar, mesh_name: MeshNamer = str) -> str:
    """The text form of ``expr``: ``8``, ``i0``, ``(i + coord(M0, x)) % 4``; ``mesh_name``
    names meshes (the printer passes its ``M<n>`` names)."""
    if isinstance(expr, Const):
        if isinstance(expr.value, bool):
            return "true" if expr.value else "false"
        return repr(expr.value)
    if isinstance(expr, Symbol):
        return expr.name
    if isinstance(expr, MeshCoordinate):
        return f"coord({mesh_name(expr.mesh)}, {expr.axis.value})"
    lhs = _print_operand(expr.lhs, expr.op, False, mesh_name)
    return f"{lhs} {expr.op.value} {_print_operand(expr.rhs, expr.op, True, mesh_name)}"


def _print_operand(expr: Scalar, parent: ScalarOp, is_rhs: bool, mesh_name: MeshNamer) -> str:
    text = print_scalar(expr, mesh_name)
    if not isinstance(expr, BinaryExpr):
        return text
    inner, outer = _PRECEDENCE[expr.op], _PRECEDENCE[parent]
    # Left-associative: the right operand needs parentheses at equal precedence.
    if inner < outer or (is_rhs and inner == outer):
        return f"({text})"
    return text
