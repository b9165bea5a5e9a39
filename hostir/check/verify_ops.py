"""The verifier's one rule for declared ops: an instruction's results are what its op's
declaration (``hostir.ir.opdecl``) infers from its operands.

The declaration's ``infer`` is the rule the frontend defined the op with, so a program
the frontend lowered and one written by hand are checked alike, in the same words. The
rules on bound values the instruction shows (its declaration's ``requirements``) are
checked before, with every instruction's (``hostir.check.verify``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hostir.check.result_checks import value_problem
from hostir.check.verify_compute import COMPUTE_RULES
from hostir.ir.catalog import Kind, kind_of
from hostir.ir.opdecl import OpDecl, op_decl


def compute_problem(instruction: Any, scalar_types: Mapping[str, type]) -> str | None:
    """The problem with a compute (or memory) instruction's types and extents, or None:
    its op's declaration's rule (:func:`check_declared`), else its class's rule in
    ``hostir.check.verify_compute`` (``shard_by_stream``'s)."""
    decl = op_decl(instruction) if kind_of(type(instruction)) is Kind.COMPUTE else None
    if decl is not None:
        return check_declared(instruction, decl, scalar_types)
    rule = COMPUTE_RULES.get(type(instruction))
    return rule(instruction, scalar_types) if rule is not None else None


def check_declared(instruction: Any, decl: OpDecl, scalar_types: Mapping[str, type]) -> str | None:
    """The problem with ``instruction`` under its op's declaration ``decl``, as a sentence,
    or None: it writes the results of an op of several into preallocated tensors, its
    ``check`` fails, the declaration refuses its operands, or a result is not declared
    with the extents and dtype the op gives (``scalar_types``: each scalar
    symbol's Python type)."""
    if getattr(instruction, "preallocated", False) and len(decl.results) > 1:
        fields = ", ".join(r.field for r in decl.results)
        return (
            f"defines {len(decl.results)} results ({fields}); an op of several results"
            " cannot write into existing tensors (out=): define its results and copy each"
            " where it goes (set(..., out=...))"
        )
    if decl.check is not None:
        problem = decl.check(instruction)
        if problem is not None:
            return _unprefixed(decl, problem)
    inferred = decl.infer_of(instruction, scalar_types)
    if isinstance(inferred, str):
        return _unprefixed(decl, inferred)
    for result, result_type in zip(decl.results, inferred, strict=True):
        value = getattr(instruction, result.field)
        problem = value_problem(value, result_type.shape, result_type.dtype)
        if problem is not None:
            return problem
    return None


def _unprefixed(decl: OpDecl, refusal: str) -> str:
    """A declaration's refusal without its leading ``name: `` (the frontend's wording names
    the op first; the verifier's message names it already)."""
    prefix = f"{decl.name}: "
    return refusal[len(prefix) :] if refusal.startswith(prefix) else refusal
