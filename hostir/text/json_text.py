"""JSON text in: standard JSON only, numbers a program can hold, nesting bounded.

:func:`load` is ``json.loads`` for host IR documents (``hostir.text.json_format``), refusing
as :class:`~hostir.errors.JsonFormatError` what Python's reader would let through or
answer with a bare exception: the non-standard bare ``NaN``, ``Infinity`` and
``-Infinity`` (a non-finite float is an object, ``{"float": "nan"}``), a number that
does not fit a float64 (``1e400``, which ``json`` reads as infinity), an integer of
more than ``MAX_INT_DIGITS`` (4300) digits (a ``ValueError`` from ``int``), text or
bytes that are not JSON, anything that is neither, and a document nested deeper than
:data:`MAX_JSON_DEPTH` (a ``RecursionError`` from ``json`` when far deeper).
"""

from __future__ import annotations

import json
import math
from typing import Any

from hostir.check.verify import MAX_LOOP_DEPTH
from hostir.errors import JsonFormatError
from hostir.ir.scalars import MAX_INT_DIGITS, MAX_SCALAR_DEPTH

MAX_JSON_DEPTH = 2 * MAX_LOOP_DEPTH + MAX_SCALAR_DEPTH + 32
"""How deep objects and lists may nest in a document: two levels per loop (the loop and
its body), one per scalar operator, and room for the rest (document, program, body,
instruction, tensor, sharding, dims, parts, mesh, ...). Every program the verifier
accepts fits; the decoder, which recurses, stays far from Python's recursion limit."""


def load(text: str | bytes) -> Any:
    """The JSON value of ``text``: standard JSON only, numbers that fit, nesting bounded."""
    if not isinstance(text, str | bytes | bytearray):
        raise JsonFormatError(
            f"expected the text of a JSON document (str or bytes), got {type(text).__name__}"
        )
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_float, parse_int=_int)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise JsonFormatError(f"the text is not JSON: {error}") from None
    except RecursionError:  # from json's own decoder, before any of ours runs
        raise JsonFormatError(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels") from None
    _check_depth(data)
    return data


def _refuse_constant(name: str) -> Any:
    raise JsonFormatError(
        f"the text is not standard JSON: {name}; a non-finite float is written"
        ' {"float": "inf"}, {"float": "-inf"} or {"float": "nan"}'
    )


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonFormatError(f"the number {text[:40]} does not fit a float64")
    return value


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise JsonFormatError(f"an integer has at most {MAX_INT_DIGITS} digits, got {digits}")
    return int(text)


def _check_depth(data: Any) -> None:
    """Refuses ``data`` nested deeper than MAX_JSON_DEPTH, walking it with a stack."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise JsonFormatError(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
