"""The text of call instructions, read off their declarations: one printer, one parser.

Every instruction but the four statements of the language (``allocate``,
``deallocate``, ``wait``, ``for``) reads as a call::

    T3 : float32[8, 4] @M0, R0 = Allgather(T2, team=M0(x), axis=0)
    relu(T4, out=T5)
    main = get_current_stream()

The keyword and the positional fields come from the class's declaration
(``hostir.ir.catalog``); every other field is written ``name=value`` in field order,
``None`` left out. The values it defines are on the left: a tensor with its
full type, a request or a stream by name; with ``preallocated``, ``out`` is an
existing tensor written ``out=NAME``. How a field is written and read follows
from its annotated type (:func:`field_kinds`), so a class declared anywhere,
with any fields of these types, prints and parses with no code of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import MISSING, fields
from functools import cache
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from hostir.ir.catalog import declaration_of
from hostir.ir.scalars import BinaryExpr, Const, MeshCoordinate, Symbol
from hostir.ir.team import Team
from hostir.ir.values import RequestValue, StreamValue, TensorValue

_SCALARS = frozenset({Const, Symbol, MeshCoordinate, BinaryExpr})


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
    if TensorValue in members and members - {TensorValue} <= _SCALARS:
        return FieldKind.OPERAND, None, optional
    if members and members <= _SCALARS:
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
    if isinstance(single, type) and issubclass(single, enum.Enum):
        return FieldKind.ENUM, single, optional
    return FieldKind.OTHER, None, optional


def defined_fields(instruction: Any) -> list[str]:
    """The fields whose values ``instruction`` defines (``out`` not when preallocated)."""
    names = list(type(instruction).OUTS)
    if getattr(instruction, "preallocated", False):
        names.remove("out")
    return names


@cache
def written_fields(cls: type) -> tuple[str, ...]:
    """The fields written ``name=value``: all but the positional ones, the results, the
    ``op`` field that names the instruction, and ``preallocated`` (cached per class)."""
    declaration = declaration_of(cls)
    skip = {*declaration.positional, *cls.OUTS, "preallocated", declaration.op_field}
    return tuple(f.name for f in fields(cls) if f.name not in skip)


# ----- printing -----------------------------------------------------------------------


Printers = dict[FieldKind, Callable[[Any], str]]
"""How each kind of field value prints (the printer passes its mesh names in)."""


def print_call(instruction: Any, keyword: str, values: Printers, declare: Callable) -> str:
    """One call line; ``values`` prints field values by kind, ``declare`` a defined tensor
    with its type."""
    cls = type(instruction)
    kinds = field_kinds(cls)
    declaration = declaration_of(cls)
    args = [values[kinds[name][0]](getattr(instruction, name)) for name in declaration.positional]
    for name in written_fields(cls):
        value = getattr(instruction, name)
        if value is not None:
            args.append(f"{name}={values[kinds[name][0]](value)}")
    if getattr(instruction, "preallocated", False):
        args.append(f"out={instruction.out.name}")
    targets = []
    for name in defined_fields(instruction):
        value = getattr(instruction, name)
        targets.append(declare(value) if isinstance(value, TensorValue) else value.name)
    call = f"{keyword}({', '.join(args)})"
    return f"{', '.join(targets)} = {call}" if targets else call


# ----- parsing ------------------------------------------------------------------------


def parse_call(
    cls: type,
    fixed: dict[str, Any],
    read: Callable[[FieldKind, Any, Any], Any],
    name: Any,
    positional: list,
    keywords: dict,
    targets: list,
    results: Callable[[Any, str, list, bool], dict],
    fail: Callable[[Any, str], Exception],
) -> Any:
    """The instruction a call reads as. ``read(kind, enum class, node)`` reads one value;
    ``results(name, fields in OUTS, targets, preallocated)`` reads the values the call
    defines (and ``out=``); ``fail(node, message)`` makes a ParseError there."""
    declaration = declaration_of(cls)
    kinds = field_kinds(cls)
    if len(positional) != len(declaration.positional):
        raise fail(
            name,
            f"{name} takes {len(declaration.positional)} positional operand(s)"
            f" ({', '.join(declaration.positional)}), got {len(positional)}",
        )
    values = dict(fixed)
    for field_name, node in zip(declaration.positional, positional, strict=True):
        kind, enum_class, _ = kinds[field_name]
        values[field_name] = read(kind, enum_class, node)
    allowed = written_fields(cls)
    for key, node in keywords.items():
        if key == "out":
            continue
        if key not in allowed:
            raise fail(node, f"{name} has no argument {key}; it takes {sorted(allowed)}")
        kind, enum_class, _ = kinds[key]
        values[key] = read(kind, enum_class, node)
    preallocated = "out" in keywords
    values.update(results(name, list(cls.OUTS), targets, preallocated))
    missing = [
        f.name
        for f in fields(cls)
        if f.name not in values and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise fail(name, f"{name} needs argument(s) {', '.join(missing)}")
    return cls(**values)
