"""Requirements: what an op needs of values that may be known only when the inputs bind
their symbols.

A :class:`Requirement` is ``low <= high`` over two scalar expressions, with the sentence
that says what is wrong when it does not hold: a slice's ``start <= stop``, a pad width's
``0 <= left``, a variance's ``correction <= count``. Each rule is written once, as a
function that makes the requirement, and evaluated wherever its values become known:

- on constants, where the op is made: the frontend when an op is defined
  (``OperandError``), the verifier for any program (``VerifyError``), with the values
  in the sentence (:func:`refuted`, :func:`explain`);
- on the values the inputs bind, once per input signature, before the ranks' agreement
  (``hostir.check.value_rules``, an ``ExtentError`` with the same sentence, each
  symbolic side shown as ``expression = value``, and where its symbols came from).

Where the instruction shows what the rule reads (``slice``'s start and stop, ``pad``'s
widths, ``topk``'s k, ``gather``'s extents), the requirement is read off the instruction
(:func:`instruction_requirements`), so a program written by hand gets it too. Where no
instruction does (the count a variance divides by is a scalar operand of a ``div``), the
program carries it: ``HostIrContainer.requires``, written ``require LOW <= HIGH else
"sentence"`` in text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hostir.errors import EvaluationError
from hostir.ir.catalog import Kind, kind_of
from hostir.ir.dtypes import python_type
from hostir.ir.opdecl import op_decl
from hostir.ir.scalars import (
    Const,
    Scalar,
    evaluate_scalar,
    print_scalar,
    scalar_problem,
    symbols_of,
)
from hostir.ir.values import TensorValue

LOW, HIGH = "{low}", "{high}"
"""Where a requirement's message shows its two sides."""

Env = Mapping[str, int | float | bool]


@dataclass(frozen=True, slots=True, kw_only=True)
class Requirement:
    """``low <= high`` must hold for the values a program runs with; ``message`` says what
    is wrong when it does not, :data:`LOW` and :data:`HIGH` standing for the two sides
    (``slice of T0 dim 1: end {high} is before start {low}``)."""

    low: Scalar
    high: Scalar
    message: str


def symbols_read(requirement: Requirement) -> set[str]:
    """The symbols the two sides read."""
    return symbols_of(requirement.low) | symbols_of(requirement.high)


def holds(requirement: Requirement, env: Env) -> bool | None:
    """Whether ``low <= high`` with the symbols in ``env``; None where a side reads a symbol
    ``env`` lacks, or cannot be evaluated (a division by zero: the extent checks name it)."""
    if not symbols_read(requirement) <= env.keys():
        return None
    try:
        return evaluate_scalar(requirement.low, env) <= evaluate_scalar(requirement.high, env)
    except EvaluationError:
        return None


def refuted(requirement: Requirement) -> bool:
    """Whether the constants alone break it (a side with a symbol is decided later)."""
    return holds(requirement, {}) is False


def explain(requirement: Requirement, env: Env) -> str:
    """The message with each side shown: a constant as its value, an expression over
    symbols as ``expression = value`` (its value with the symbols in ``env``)."""
    text = requirement.message
    for mark, side in ((LOW, requirement.low), (HIGH, requirement.high)):
        shown = print_scalar(side)
        if not isinstance(side, Const):
            shown += f" = {evaluate_scalar(side, env)!r}"
        text = text.replace(mark, shown)
    return text


def input_symbol_types(inputs: Sequence[object]) -> dict[str, type]:
    """The symbols a program's ``inputs`` bind, with their Python types: its tensor inputs'
    symbolic extents (int) and its scalar inputs (by dtype)."""
    bound: dict[str, type] = {}
    for value in inputs:
        if isinstance(value, TensorValue):
            for extent in value.shape:
                bound.update(dict.fromkeys(symbols_of(extent), int))
        else:  # a ScalarInput (hostir.ir.container, which imports this module)
            bound[value.name] = python_type(value.dtype)
    return bound


def requirement_problem(requirement: object, bound: Mapping[str, type]) -> str | None:
    """Why ``requirement`` cannot be one a program carries, as a sentence, or None: its
    sides are integer scalars over the symbols its inputs bind (``bound``: name -> Python
    type, an extent's is int), its message a string the text form writes between double
    quotes (no double quote, backslash or line break), and the constants do not break it."""
    if not isinstance(requirement, Requirement):
        return f"expected a Requirement, got {type(requirement).__name__}"
    message = requirement.message
    if not isinstance(message, str) or any(c in message for c in '"\\\n\r'):
        return (
            "a requirement's message is a string without double quotes, backslashes or line"
            f" breaks, got {message!r}"
        )
    for side in (requirement.low, requirement.high):
        problem = scalar_problem(side, integer=True, types=bound)
        if problem is not None:
            return f"require {message!r}: {problem}"
        unbound = sorted(symbols_of(side) - bound.keys())
        if unbound:
            return (
                f"require {print_scalar(requirement.low)} <= {print_scalar(requirement.high)}:"
                f" {unbound[0]} is not bound by the program's inputs (a requirement reads"
                " their extents and scalar inputs only)"
            )
    if refuted(requirement):
        return explain(requirement, {})
    return None


# ----- the rules read off instructions -----------------------------------------------------


def slice_requirements(
    src: str, dim: int, extent: Scalar, start: Scalar, stop: Scalar
) -> tuple[Requirement, ...]:
    """A slice of ``src``'s dim ``dim`` (of ``extent``) takes ``0 <= start <= stop <=
    extent``. (A message names only what its two sides show, so that it reads the same
    with constants and with bound values.)"""
    where = f"slice of {src} dim {dim}"
    return (
        Requirement(low=Const(value=0), high=start, message=f"{where}: start {HIGH} is negative"),
        Requirement(low=start, high=stop, message=f"{where}: end {HIGH} is before start {LOW}"),
        Requirement(
            low=stop,
            high=extent,
            message=f"{where}: end {LOW} is past the extent {HIGH}; the indices must lie"
            " within the dim",
        ),
    )


def pad_requirements(src: str, dim: int, left: Scalar, right: Scalar) -> tuple[Requirement, ...]:
    """A pad of ``src``'s dim ``dim`` takes widths ``>= 0`` (torch's negative widths would
    cut elements off)."""
    return tuple(
        Requirement(
            low=Const(value=0),
            high=width,
            message=f"pad of {src} dim {dim}: the {side} width {HIGH} is negative; pad widths"
            " are >= 0",
        )
        for side, width in (("left", left), ("right", right))
    )


def topk_requirements(src: str, dim: int, extent: Scalar, k: Scalar) -> tuple[Requirement, ...]:
    """``topk`` along ``src``'s dim ``dim`` takes ``0 <= k <= extent``."""
    return (
        Requirement(
            low=Const(value=0),
            high=k,
            message=f"topk: k = {HIGH} along dim {dim} of {src} is negative",
        ),
        Requirement(
            low=k,
            high=extent,
            message=f"topk: k = {LOW} is larger than dim {dim} of {src} ({HIGH} entries)",
        ),
    )


def gather_requirement(
    src: str, index: str, dim: int, index_extent: Scalar, src_extent: Scalar
) -> Requirement:
    """``gather``'s index is at most as large as its source on a dim other than the
    gathered one."""
    return Requirement(
        low=index_extent,
        high=src_extent,
        message=f"gather: dim {dim} of the index {index} ({LOW}) is larger than {src}'s ({HIGH})",
    )


INSTRUCTION_REQUIREMENTS: dict[type, Callable[[Any], tuple[Requirement, ...]]] = {}
"""The requirements each instruction class shows in its fields, of the classes whose ops
are not declared (a declared op's are its declaration's ``requirements``): empty now that
every compute op of the package is declared."""


def instruction_requirements(instruction: object) -> tuple[Requirement, ...]:
    """The requirements ``instruction`` shows (none for most classes): its op's
    declaration's (``hostir.ir.opdecl``), else its class's entry above."""
    if kind_of(type(instruction)) is Kind.COMPUTE:
        decl = op_decl(instruction)
        if decl is not None:
            return decl.requirements(instruction) if decl.requirements is not None else ()
    rule = INSTRUCTION_REQUIREMENTS.get(type(instruction))
    return rule(instruction) if rule is not None else ()
