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
existing tensor written ``out=NAME`` (the tensor results of an op of several results
``out=[NAME, NAME]``, which the verifier refuses). How a field is written and read follows
from its annotated type (:func:`hostir.ir.fields.field_kinds`), so a class declared anywhere,
with any fields of these types, prints and parses with no code of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

from hostir.ir.catalog import declaration_of
from hostir.ir.fields import (
    FieldKind,
    defined_fields,
    field_kinds,
    written_fields,
    written_fields_of,
)
from hostir.ir.values import TensorValue

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
    written = [getattr(instruction, name).name for name in written_fields_of(instruction)]
    if written:  # preallocated: ``out=T5`` (an op of several results: ``out=[T5, T6]``)
        args.append(f"out={written[0]}" if len(written) == 1 else f"out=[{', '.join(written)}]")
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
