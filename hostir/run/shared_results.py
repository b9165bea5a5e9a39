"""Ops of several results, computed once per run for all the instructions that keep one.

nvFuser's ``sdpfa_fwd``, ``sdpfa_bwd`` and ``topk`` return several tensors. The host IR
holds one instruction per result (each names the result it keeps: ``result=logsumexp``),
so a program that uses two results of one op holds two instructions that differ only in
that name and their output. Their handlers share the op's computation through the run:
the first to run computes every result (:func:`shared`) and keeps them; its siblings
take theirs from it. A kept entry goes when the last sibling has taken its result, so it
holds no memory past the instructions that read it.

Siblings are found twice, so that sharing never changes a result:

- in the program, once: instructions of one class whose fields are equal (by value where
  they compare by value, else the same objects) but for ``out``, ``result`` and
  ``preallocated`` (:func:`op_key`); an op with one instruction keeps nothing;
- at run time: besides the op key, the operand tensors must be the same objects at the
  same version (``Tensor._version``, which every in-place write bumps), and the current
  stream the same one (a result made on another stream is not ordered before this one).
  Anything else, a later loop iteration's operands say, computes again.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from hostir.ir.container import HostIrContainer
from hostir.ir.program_info import walk_instructions

Results = tuple[torch.Tensor, ...]

NOT_THE_OP = ("out", "result", "preallocated")
"""The fields in which the sibling instructions of one op differ."""

SHARING_CLASSES: set[type] = set()
"""The instruction classes whose handlers call :func:`shared` (they register here)."""


def sharing(cls: type) -> type:
    """Registers ``cls`` as an instruction class whose handler shares its op's results."""
    SHARING_CLASSES.add(cls)
    return cls


def op_key(instruction: Any) -> tuple:
    """What ``instruction`` computes, apart from which result it keeps: its class and
    every field but :data:`NOT_THE_OP` (see :func:`_identity`)."""
    return (type(instruction),) + tuple(
        _identity(getattr(instruction, field.name))
        for field in dataclasses.fields(instruction)
        if field.name not in NOT_THE_OP
    )


def _identity(value: Any) -> Any:
    """``value`` itself where it compares by value (plain values, frozen IR scalars such
    as ``Const(3)``, which a parsed program holds one of per instruction), else the
    object's identity."""
    try:
        hash(value)
    except TypeError:
        return id(value)
    return value


def sibling_counts(program: HostIrContainer) -> Counter:
    """How many instructions of ``program`` compute each op (by :func:`op_key`) of a
    sharing class; the evaluator counts once per program (``HostIrEvaluator.siblings``)."""
    return Counter(op_key(i) for i in walk_instructions(program.body) if type(i) in SHARING_CLASSES)


def _operand_key(operands: dict[str, Any]) -> tuple:
    """The operands as run-time identities: each tensor's object and version, other
    values as they are; ``out`` (each sibling's own buffer) left out."""
    key = []
    for name, value in operands.items():
        if name == "out":
            continue
        if isinstance(value, torch.Tensor):
            key.append((name, id(value), value._version))
        else:
            key.append((name, type(value).__name__, repr(value)))
    return tuple(key)


def shared(
    context: Any, instruction: Any, operands: dict[str, Any], compute: Callable[[], Results]
) -> Results:
    """Every result of ``instruction``'s op on ``operands``: ``compute()`` for the first
    sibling of a run to ask, what it kept for the others (see the module docstring)."""
    expected = context.runner.siblings(instruction)
    if expected <= 1:
        return compute()
    memo = context.shared_results
    key = (op_key(instruction), _operand_key(operands), context.current_stream)
    entry = memo.get(key)
    if entry is None:
        results = compute()
        # The operands stay referenced while the entry lives, so no other tensor can
        # take their ids meanwhile.
        memo[key] = [results, expected - 1, list(operands.values())]
        return results
    entry[1] -= 1
    if entry[1] <= 0:
        del memo[key]
    return entry[0]
