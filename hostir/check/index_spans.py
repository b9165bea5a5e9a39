"""The values an integer expression takes over a nest of loops, without enumerating them.

The extent checks ask of a chunk index (``j0``, ``2 * j0 + j1``,
``(j0 + coord(M0, x)) % 4``) which values it takes over the iterations of its
loops: whether every one picks a chunk (the index check), and which chunks it
picks (coverage). :func:`span` answers in closed form, in time independent of
the trip counts, when the loops form a box (:func:`loop_box`: no loop's bounds
read another loop's index):

- an *affine* index, constants plus loop indices times constants, takes its
  least and greatest values at corners of the box, which the :class:`Span`
  names; its values are every whole number between them exactly when, its
  steps (the coefficients) sorted by size, each step is at most one more than
  the reach of the smaller ones together (a step of 1 over 4 iterations reaches
  3, so a step of 4 after it leaves no gap, a step of 5 does);
- ``x // m`` and ``x % m`` by a constant ``m`` carry those facts through (a
  whole run of ``m`` or more values leaves every remainder modulo ``m``), and
  ``x % m`` by ``m > 0`` lies in ``0 .. m - 1`` whatever ``x`` is;
- any other index (a product of two indices, a division by one) has no span
  here: the caller enumerates its iterations instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hostir.ir.instructions import ForLoop
from hostir.ir.scalars import BinaryExpr, Scalar, ScalarOp, Symbol, evaluate_scalar, symbols_of

Env = Mapping[str, int | float | bool]

Box = Mapping[str, range]
"""Each loop index of a nest and the range its loop runs (none empty where a span is
asked for)."""

At = Mapping[str, int]
"""An iteration: the value of each loop index of a box."""


@dataclass(frozen=True)
class Span:
    """The values an expression takes over a box of iterations: all of them lie in
    ``lo .. hi``; every whole number there is one of them when ``whole``; ``lo_at`` and
    ``hi_at``, where known, are iterations at which ``lo`` and ``hi`` are taken."""

    lo: int
    hi: int
    whole: bool
    lo_at: At | None
    hi_at: At | None


def loop_box(loops: Sequence[ForLoop], env: Env) -> dict[str, range] | None:
    """The range of each of ``loops`` (their bounds evaluated in ``env``), or None where
    a loop's bounds read another loop's index (the iterations then form no box)."""
    names = {loop.index.name for loop in loops}
    box = {}
    for loop in loops:
        if (symbols_of(loop.start) | symbols_of(loop.stop)) & names:
            return None
        start, stop = evaluate_scalar(loop.start, env), evaluate_scalar(loop.stop, env)
        box[loop.index.name] = range(int(start), int(stop))
    return box


def span(expr: Scalar, box: Box, env: Env) -> Span | None:
    """The values ``expr`` takes over the iterations of ``box`` (every range non-empty;
    the other symbols bound in ``env``), or None where no closed form applies (see the
    module docstring)."""
    affine = _affine(expr, box, env)
    if affine is not None:
        return _affine_span(*affine, box)
    if not isinstance(expr, BinaryExpr) or symbols_of(expr.rhs) & box.keys():
        return None
    divisor = evaluate_scalar(expr.rhs, env)
    if type(divisor) is not int or divisor == 0:
        return None  # enumerating names a division by zero as the run would
    if expr.op is ScalarOp.FLOORDIV:
        return _divided(span(expr.lhs, box, env), divisor)
    if expr.op is ScalarOp.MOD and divisor > 0:
        return _remainder(span(expr.lhs, box, env), divisor)
    return None


Affine = tuple[int, dict[str, int]]
"""A constant and a coefficient per loop index."""


def _affine(expr: Scalar, box: Box, env: Env) -> Affine | None:
    """``expr`` as a constant plus loop indices times constants, if it is one."""
    if not symbols_of(expr) & box.keys():
        value = evaluate_scalar(expr, env)
        return (value, {}) if type(value) is int else None
    if isinstance(expr, Symbol):
        return 0, {expr.name: 1}
    if not isinstance(expr, BinaryExpr) or expr.op not in _LINEAR:
        return None
    lhs, rhs = _affine(expr.lhs, box, env), _affine(expr.rhs, box, env)
    if lhs is None or rhs is None:
        return None
    if expr.op is ScalarOp.MUL:
        if lhs[1] and rhs[1]:
            return None  # an index times an index
        (factor, _), (constant, terms) = (lhs, rhs) if not lhs[1] else (rhs, lhs)
        return constant * factor, {name: a * factor for name, a in terms.items()}
    sign = 1 if expr.op is ScalarOp.ADD else -1
    terms = dict(lhs[1])
    for name, a in rhs[1].items():
        terms[name] = terms.get(name, 0) + sign * a
    return lhs[0] + sign * rhs[0], terms


_LINEAR = (ScalarOp.ADD, ScalarOp.SUB, ScalarOp.MUL)


def _affine_span(constant: int, terms: dict[str, int], box: Box) -> Span:
    """The span of ``constant + sum(a * index)`` over ``box``: its ends at corners."""
    lo_at = {name: iterations[0] for name, iterations in box.items()}
    hi_at = dict(lo_at)
    for name, a in terms.items():
        first, last = box[name][0], box[name][-1]
        lo_at[name], hi_at[name] = (first, last) if a >= 0 else (last, first)
    lo = constant + sum(a * lo_at[name] for name, a in terms.items())
    hi = constant + sum(a * hi_at[name] for name, a in terms.items())
    # last - first, not len(): a range past 2**63 has no len()
    steps = sorted((abs(a), box[name][-1] - box[name][0]) for name, a in terms.items() if a)
    reach, whole = 0, True
    for step, count in steps:
        if count and step > reach + 1:
            whole = False
            break
        reach += step * count
    return Span(lo, hi, whole, lo_at, hi_at)


def _divided(found: Span | None, divisor: int) -> Span | None:
    """The span of ``x // divisor`` where ``x`` spans ``found`` (floor division is
    monotonic: it maps a whole run to a whole run, the ends to the ends)."""
    if found is None:
        return None
    if divisor > 0:
        return Span(found.lo // divisor, found.hi // divisor, found.whole, found.lo_at, found.hi_at)
    return Span(found.hi // divisor, found.lo // divisor, found.whole, found.hi_at, found.lo_at)


def _remainder(found: Span | None, divisor: int) -> Span:
    """The span of ``x % divisor`` (``divisor > 0``) where ``x`` spans ``found`` (None:
    any ``x``, whose remainders still lie in ``0 .. divisor - 1``)."""
    if found is None:
        return Span(0, divisor - 1, False, None, None)
    if found.lo // divisor == found.hi // divisor:  # within one period: x minus a constant
        lo, hi = found.lo % divisor, found.hi % divisor
        return Span(lo, hi, found.whole, found.lo_at, found.hi_at)
    every = found.whole and found.hi - found.lo + 1 >= divisor
    return Span(0, divisor - 1, every, None, None)
