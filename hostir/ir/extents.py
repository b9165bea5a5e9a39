"""Comparing symbolic extents: ``2 * (i0 // 2)`` is ``i0``.

Extents in a program are built from symbols and constants by products and by
divisions by constants (a dim split over mesh axes: ``i0 // 4``). The verifier
compares them in a normal form, a rational coefficient times a sorted product of
atoms: ``i0 // 4`` is ``1/4 * i0``. Treating ``e // c`` as exact division is
sound here because every extent that is split is checked to divide when the
inputs are bound (``hostir.run.inputs``). Anything else (sums, remainders, division
by a symbol) is an atom compared by structure, so two extents are equal when
their normal forms are, and the verifier never calls extents that only differ
in form different.

An extent is a whole number >= 0 (:func:`extent_problem`): its constants are ints,
and one made of constants only is not negative; an extent over symbols is checked
when the inputs bind them (``hostir.run.inputs``). The parser, the JSON reader and the
verifier refuse any other by name.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

from hostir.errors import EvaluationError
from hostir.ir.scalars import (
    BinaryExpr,
    Const,
    Scalar,
    ScalarOp,
    evaluate_scalar,
    leaves,
    print_scalar,
    scalar_problem,
)
from hostir.ir.values import TensorValue

Normal = tuple[Fraction, tuple[object, ...]]
"""(coefficient, atoms sorted by their text)."""


def normal_form(extent: Scalar) -> Normal:
    """``extent`` as a coefficient and a sorted product of atoms (see module docstring)."""
    if (
        isinstance(extent, Const)
        and isinstance(extent.value, int)
        and not isinstance(extent.value, bool)
    ):
        return _whole(extent.value), ()
    if isinstance(extent, BinaryExpr) and extent.op is ScalarOp.MUL:
        (a, xs), (b, ys) = normal_form(extent.lhs), normal_form(extent.rhs)
        return a * b, tuple(sorted(xs + ys, key=repr))
    if (
        isinstance(extent, BinaryExpr)
        and extent.op is ScalarOp.FLOORDIV
        and isinstance(extent.rhs, Const)
        and isinstance(extent.rhs.value, int)
        and extent.rhs.value > 0
    ):
        coefficient, atoms = normal_form(extent.lhs)
        return coefficient / extent.rhs.value, atoms
    return Fraction(1), (extent,)


@lru_cache(maxsize=1024)
def _whole(value: int) -> Fraction:
    """``Fraction(value)``, made once per value: a verifier's hot spot."""
    return Fraction(value)


def extent_problem(extent: object) -> str | None:
    """Why ``extent`` cannot be a tensor's extent, as a sentence, or None: it must be a
    whole number >= 0, so every constant in it an int (not a float or a bool), and if it
    holds no symbol its value not negative. Callers prefix the tensor and dim."""
    problem = scalar_problem(extent)
    if problem is not None:
        return problem
    found = leaves(extent)
    wrong = any(isinstance(leaf, Const) and type(leaf.value) is not int for leaf in found)
    if not wrong and all(isinstance(leaf, Const) for leaf in found):
        try:
            wrong = evaluate_scalar(extent, {}) < 0
        except EvaluationError as error:  # a division by zero
            return f"{print_scalar(extent)}: {error}"
    if wrong:
        return f"an extent must be a whole number >= 0, got {print_scalar(extent)}"
    return None


def extents_text(extents: tuple[Scalar, ...]) -> str:
    """``[i0, 4]``: extents as the text form prints them."""
    return "[" + ", ".join(print_scalar(e) for e in extents) + "]"


def same_extent(a: Scalar, b: Scalar) -> bool:
    """Whether ``a`` and ``b`` are the same extent (equal normal forms)."""
    return a == b or normal_form(a) == normal_form(b)


def differ(a: Scalar | Normal, b: Scalar | Normal) -> bool:
    """Whether ``a`` and ``b`` are certainly different extents: their normal forms have the
    same atoms (none, for constants) and different coefficients. Extents over different
    symbols (``i0`` and ``i1``, two inputs' free extents) may be equal at run time, where
    the inputs' binding checks them, so they do not differ here."""
    x = a if isinstance(a, tuple) else normal_form(a)
    y = b if isinstance(b, tuple) else normal_form(b)
    return x[1] == y[1] and x[0] != y[0]


def times(a: Normal, b: Normal) -> Normal:
    """The product of two normal forms."""
    return a[0] * b[0], tuple(sorted(a[1] + b[1], key=repr))


def divides(a: Normal, b: Normal) -> Normal | None:
    """``b / a`` if it is a whole product (an int coefficient, ``a``'s atoms among ``b``'s),
    else None."""
    atoms = list(b[1])
    for atom in a[1]:
        if atom not in atoms:
            return None
        atoms.remove(atom)
    coefficient = b[0] / a[0] if a[0] else None
    if coefficient is None or coefficient.denominator != 1:
        return None
    return coefficient, tuple(atoms)


def scaled(a: Normal, factor: Fraction | int) -> Normal:
    """``a`` times a number."""
    return a[0] * factor, a[1]


def is_one(extent: Scalar) -> bool:
    """Whether ``extent`` is the constant 1 (a broadcast dim)."""
    return normal_form(extent) == (Fraction(1), ())


def local_extents(value: TensorValue) -> list[Normal]:
    """The normal forms of ``value``'s local extents (its mesh parts taken away)."""
    if value.sharding is None:
        return [normal_form(extent) for extent in value.shape]
    found = []
    for parts in value.sharding.dims:
        extent: Normal = (Fraction(1), ())
        for part in parts:
            if part.axis is None:
                extent = times(extent, normal_form(part.extent))
        found.append(extent)
    return found


def unequal_dims_problem(
    op: str, a: TensorValue, a_dim: int, b: TensorValue, b_dim: int
) -> str | None:
    """Why dim ``a_dim`` of ``a`` and dim ``b_dim`` of ``b`` cannot be one dim, or None:
    their extents certainly differ (:func:`differ`; symbolic ones are checked when
    bound)."""
    ea, eb = a.shape[a_dim], b.shape[b_dim]
    if not differ(ea, eb):
        return None
    return (
        f"{op}: {a.name} dim {a_dim} has extent {print_scalar(ea)} but {b.name} dim {b_dim}"
        f" has extent {print_scalar(eb)}; they must be equal"
    )
