"""Checking decoded JSON values against the IR's dataclass annotations
(``hostir.text.json_format``).

A node's fields are read by their annotations: :func:`conforms` says whether a decoded
value fits one (a bool is not an int here, a tuple of ints is not a tuple of floats), and
:func:`mismatch` says, at the innermost list item that does not, what was expected.
"""

from __future__ import annotations

import enum
import json
from dataclasses import fields, is_dataclass
from functools import cache
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from hostir.ir.catalog import Instruction, is_instruction
from hostir.ir.scalars import Scalar

PRIMITIVES = (bool, int, float, str)
"""The JSON values a field holds as they are."""

# Unions printed by name in messages, largest first (Operand is TensorValue | Scalar).
_NAMED_UNIONS: tuple[tuple[str, Any], ...] = (("Scalar", Scalar),)


@cache
def fields_of(cls: type) -> tuple[tuple[str, Any], ...]:
    """``(name, resolved annotation)`` of each constructor field of ``cls``, in order."""
    hints = get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in fields(cls) if f.init)


def conforms(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the annotation ``hint`` (bool is not an int here)."""
    if hint is Instruction:
        return is_instruction(value)
    origin = get_origin(hint)
    if origin in (Union, UnionType):
        return any(conforms(value, arg) for arg in get_args(hint))
    if origin is tuple:
        args = get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(item, args[0]) for item in value)
        return len(args) == len(value) and all(map(conforms, value, args))
    if hint is NoneType:
        return value is None
    if hint in PRIMITIVES:
        return type(value) is hint
    if hint is Any:
        return True
    return isinstance(value, hint)


def mismatch(value: Any, hint: Any, path: str) -> str | None:
    """None if ``value`` fits ``hint``, else a message at the innermost misfit list item."""
    if conforms(value, hint):
        return None
    args = get_args(hint)
    if get_origin(hint) is tuple and isinstance(value, tuple) and args[-1:] == (Ellipsis,):
        for i, item in enumerate(value):
            if not conforms(item, args[0]):
                return mismatch(item, args[0], f"{path}[{i}]")
    return f"{path}: expected {describe_hint(hint)}, got {describe_value(value)}"


def describe_hint(hint: Any) -> str:
    """An annotation in words: ``Scalar | null``, ``a list of int``."""
    origin = get_origin(hint)
    if origin in (Union, UnionType):
        args = get_args(hint)
        named: dict[Any, str] = {}
        for name, union in _NAMED_UNIONS:
            members = get_args(union)
            if all(member in args and member not in named for member in members):
                named.update(dict.fromkeys(members, name))
        labels = [named.get(arg) or describe_hint(arg) for arg in args]
        return " | ".join(dict.fromkeys(labels))  # in declaration order, each name once
    if origin is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {describe_hint(args[0])}"
        return f"a list of {len(args)}: {', '.join(describe_hint(a) for a in args)}"
    if hint is NoneType:
        return "null"
    return getattr(hint, "__name__", str(hint))


def describe_value(value: Any) -> str:
    """A decoded value in words: ``DType "float32"``, ``Mesh``, ``a list of 2``."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__} {json.dumps(value.value)}"
    if is_dataclass(value):
        return type(value).__name__
    if isinstance(value, tuple):
        return f"a list of {len(value)}"
    return describe_json(value)


def describe_json(data: Any) -> str:
    """A JSON value in words: ``null``, ``an object``, ``int 3``."""
    if data is None:
        return "null"
    if isinstance(data, dict | list):
        return "an object" if isinstance(data, dict) else "a list"
    return f"{type(data).__name__} {json.dumps(data)}"
