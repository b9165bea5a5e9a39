"""Symbolic scalars of the host IR: constants, named symbols and arithmetic.

A scalar is an immutable expression tree. Symbols stand for values bound when
a program runs: symbolic tensor extents (``i0``), loop indices, the rank and
mesh coordinates. One SPMD program serves every rank because per-rank values
stay symbolic until the evaluator binds them.

Build expressions with the helpers (:func:`add`, :func:`mul`, :func:`floordiv`,
...), which fold constants so printed programs stay short.

Every constant has a text form that reads back as the same constant: ints of any
size (up to :data:`MAX_INT_DIGITS` digits), ``true``/``false``, and floats as
Python writes them, non-finite ones included (``inf``, ``-inf``, ``nan``; so
``true``, ``false``, ``inf`` and ``nan`` are not names: :data:`RESERVED`).

An expression is at most :data:`MAX_SCALAR_DEPTH` operators deep: the helpers
below (:func:`evaluate_scalar`, :func:`print_scalar`, :func:`symbols_of`,
``hostir.ir.extents.normal_form``) recurse over it, and the verifier, which every
program passes before anything runs or prints it, refuses a deeper one by name
(:func:`scalar_problem`) instead of letting Python's recursion limit answer.
"""

from __future__ import annotations

import enum
import math
import operator
import re
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hostir.errors import EvaluationError, VerifyError
from hostir.ir.mesh import Mesh, MeshAxis

RANK = "rank"
"""The symbol bound to this process's rank."""

MAX_SCALAR_DEPTH = 100
"""How many operators deep a scalar expression may nest (``i0 + i0 + ... + i0`` with
100 ``+``; programs lowered from fusions stay under 10)."""

MAX_INT_DIGITS = 4300
"""The most decimal digits an int constant may have: Python's own limit for converting
an int to and from text (``sys.get_int_max_str_digits``), so every constant prints."""

RESERVED = frozenset({"true", "false", "inf", "nan"})
"""Names that read as constants in text, so no symbol may have them."""

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""What a name looks like in text."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Const:
    """A constant: an int, a float or a bool (Python's own types).

    Constants compare by what they mean in a program, not by Python's ``==``: the
    same type and the same value, so ``1``, ``1.0`` and ``true`` are three constants
    (torch promotes each differently), ``0.0`` and ``-0.0`` are two (``1 / x``
    differs), and a NaN constant equals a NaN constant (a program with ``nan`` equals
    itself read back from its text or JSON; the sign and payload of a NaN are not
    kept: every NaN prints ``nan``).
    """

    value: int | float | bool

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Const):
            return NotImplemented
        a, b = self.value, other.value
        if type(a) is not type(b):
            return False
        if a == b:
            return type(a) is not float or a != 0 or math.copysign(1, a) == math.copysign(1, b)
        return a != a and b != b  # NaN: see the docstring

    def __hash__(self) -> int:
        value = self.value
        return hash((type(value), "nan" if value != value else value))


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
    # A division by the constant 0 stays unfolded, for the verifier to refuse by name.
    by_zero = op in (ScalarOp.FLOORDIV, ScalarOp.MOD) and isinstance(rhs, Const) and not rhs.value
    if isinstance(lhs, Const) and isinstance(rhs, Const) and not by_zero:
        return Const(value=_APPLY[op](lhs.value, rhs.value))
    # Only the int identities fold: ``x * 1.0`` is a float, ``x`` may not be.
    identity = {ScalarOp.ADD: 0, ScalarOp.SUB: 0, ScalarOp.MUL: 1, ScalarOp.FLOORDIV: 1}
    if op in identity and rhs == Const(value=identity[op]):
        return lhs
    if op in (ScalarOp.ADD, ScalarOp.MUL) and lhs == Const(value=identity[op]):
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
        return _print_constant(expr.value)
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


def _print_constant(value: int | float | bool) -> str:
    """``true``, ``12``, ``-0.5``, ``1e+300``, ``inf``, ``nan``: text that reads back as the
    same constant (see :class:`Const`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    try:
        return repr(value)
    except ValueError:  # an int past Python's digit limit; the verifier refuses it too
        raise VerifyError(
            f"an int constant of {value.bit_length()} bits has more than {MAX_INT_DIGITS}"
            " digits: it has no text form"
        ) from None


# ----- checking an expression: iterative, so any depth gets an answer ----------------------

_TOO_LARGE = 10**MAX_INT_DIGITS
_DIVISIONS = (ScalarOp.FLOORDIV, ScalarOp.MOD)


def leaves(expr: Scalar) -> list[Scalar]:
    """The constants, symbols and mesh coordinates of ``expr``, left to right, found
    without recursion (for expressions not yet checked: see :func:`scalar_problem`)."""
    found, stack = [], [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, BinaryExpr):
            stack.extend((node.rhs, node.lhs))
        else:
            found.append(node)
    return found


def scalar_problem(
    expr: object, *, integer: bool = False, types: Mapping[str, type] | None = None
) -> str | None:
    """What makes ``expr`` unfit as a scalar of a program, as a sentence, or None: not a
    scalar; more than :data:`MAX_SCALAR_DEPTH` operators deep; a constant that is not an
    int, a float or a bool, or an int of more than :data:`MAX_INT_DIGITS` digits; a symbol
    whose name is not a name (or is :data:`RESERVED`); a division by the constant 0. With
    ``integer``, also a float or bool constant, or a symbol that ``types`` (scalar name ->
    Python type; others are ints) says is not an int: where an index, a rank or an extent
    is expected. Walks the expression with a stack, never recursing."""
    stack: list[tuple[object, int]] = [(expr, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCALAR_DEPTH:
            return f"the expression nests deeper than {MAX_SCALAR_DEPTH} operators"
        if isinstance(node, BinaryExpr):
            if node.op in _DIVISIONS and isinstance(node.rhs, Const) and node.rhs.value == 0:
                return f"division by the constant {_print_constant(node.rhs.value)}"
            stack.extend(((node.rhs, depth + 1), (node.lhs, depth + 1)))
            continue
        problem = _leaf_problem(node, integer, types or {})
        if problem is not None:
            return problem
    return None


def _leaf_problem(node: object, integer: bool, types: Mapping[str, type]) -> str | None:
    if isinstance(node, Const):
        value = node.value
        if type(value) not in (int, float, bool):
            return f"a constant is an int, a float or a bool, got {type(value).__name__}"
        if type(value) is int and abs(value) >= _TOO_LARGE:
            return f"an int constant has more than {MAX_INT_DIGITS} digits"
        if integer and type(value) is not int:
            return f"expected an integer, got the constant {_print_constant(value)}"
        return None
    if isinstance(node, Symbol):
        name = node.name
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in RESERVED:
            return f"a symbol is named {name!r}, which reads as something else in text"
        if integer and types.get(name, int) is not int:
            return f"expected an integer, got {name}, a {types[name].__name__} scalar"
        return None
    if isinstance(node, MeshCoordinate):
        return None
    shown = reprlib.repr(node)
    return f"expected a scalar (a constant, a symbol, coord(...) or arithmetic), got {shown}"
