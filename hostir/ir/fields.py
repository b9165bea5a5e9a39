"""How each field of an instruction is typed, read off its annotation: a tensor, an
operand, a scalar expression, an int, a team, a stream... (:func:`field_kinds`).

The text form writes a field by its kind (``hostir.text.syntax``), JSON reads it back
by it, and the verifier walks an instruction's operands by it: one classification for
all three, so a class declared anywhere, with fields of these types, needs no code of
its own in any of them.
"""

from __future__ import annotations

import enum
from dataclasses import fields
from functools import cache
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from hostir.ir.catalog import declaration_of
from hostir.ir.scalars import BinaryExpr, Const, MeshCoordinate, Symbol
from hostir.ir.team import Team
from hostir.ir.values import HostValue, RequestValue, StreamValue, TensorValue

SCALAR_TYPES = frozenset({Const, Symbol, MeshCoordinate, BinaryExpr})
"""The classes of a scalar expression's nodes."""


class FieldKind(enum.Enum):
    """How a field's value reads in text."""

    TENSOR = "a tensor name"
    OPERAND = "a tensor name or a scalar expression"
    SCALAR = "a scalar expression"
    INT = "an integer"
    BOOL = "true or false"
    INTS = "a list of integers like [0, 1]"
    TEAM = "a team like M0(x) or M0(y, x)"
    STREAM = "a stream: a name or stream(i)"
    ENUM = "a name"
    REQUEST = "a request"
    HOST = "a host value"
    OTHER = "(not written in text)"


@cache
def field_kinds(cls: type) -> dict[str, tuple[FieldKind, Any, bool]]:
    """Per field of ``cls``: its kind, its enum class (for ENUM) and whether it may be
    None."""
    found = {}
    for name, hint in get_type_hints(cls).items():
        if name in ("OUTS", "INS"):
            continue
        found[name] = _kind_of(hint)
    return found


def _kind_of(hint: Any) -> tuple[FieldKind, Any, bool]:
    args = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
    optional = NoneType in args
    members = set(args) - {NoneType}
    if members == {TensorValue}:
        return FieldKind.TENSOR, None, optional
    if TensorValue in members and members - {TensorValue} <= SCALAR_TYPES:
        return FieldKind.OPERAND, None, optional
    if members and members <= SCALAR_TYPES:
        return FieldKind.SCALAR, None, optional
    (single,) = members if len(members) == 1 else (None,)
    if single is bool:
        return FieldKind.BOOL, None, optional
    if single is int:
        return FieldKind.INT, None, optional
    if get_origin(single) is tuple and get_args(single) == (int, ...):
        return FieldKind.INTS, None, optional
    if single is Team:
        return FieldKind.TEAM, None, optional
    if single is StreamValue:
        return FieldKind.STREAM, None, optional
    if single is RequestValue:
        return FieldKind.REQUEST, None, optional
    if single is HostValue:
        return FieldKind.HOST, None, optional
    if isinstance(single, type) and issubclass(single, enum.Enum):
        return FieldKind.ENUM, single, optional
    return FieldKind.OTHER, None, optional


def defined_fields(instruction: Any) -> list[str]:
    """The fields whose values ``instruction`` defines: its results, but not, when it is
    preallocated, the tensors it writes into (``out``; every tensor result of an op of
    several results, which the verifier refuses)."""
    names = list(type(instruction).OUTS)
    if getattr(instruction, "preallocated", False):
        kinds = field_kinds(type(instruction))
        return [name for name in names if kinds[name][0] is not FieldKind.TENSOR]
    return names


def written_fields_of(instruction: Any) -> list[str]:
    """The result fields of a preallocated ``instruction`` that name existing tensors it
    writes into (``out``); none if it is not preallocated."""
    defined = defined_fields(instruction)
    return [name for name in type(instruction).OUTS if name not in defined]


@cache
def written_fields(cls: type) -> tuple[str, ...]:
    """The fields written ``name=value``: all but the positional ones, the results, the
    ``op`` field that names the instruction, and ``preallocated`` (cached per class)."""
    declaration = declaration_of(cls)
    skip = {*declaration.positional, *cls.OUTS, "preallocated", declaration.op_field}
    return tuple(f.name for f in fields(cls) if f.name not in skip)
