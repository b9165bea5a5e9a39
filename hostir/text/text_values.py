"""Reading the tokens of host IR text into values: positions, numbers, names, dtypes, meshes.

The parser's helpers below its builder (``hostir.text.parser``): each reads one token or one
small tree, and refuses what does not fit with a :class:`~hostir.errors.ParseError` at
the token's ``line:col``.
"""

from __future__ import annotations

from typing import Any

import lark

from hostir.errors import ParseError
from hostir.ir.dtypes import DType
from hostir.ir.mesh import Mesh
from hostir.ir.scalars import RESERVED


def where(node: Any) -> tuple[int, int]:
    """The ``line, col`` of a token or a tree (1, 1 where neither knows it)."""
    if isinstance(node, str):  # a lark Token; the line reader's tokens carry no position
        return getattr(node, "line", None) or 1, getattr(node, "column", None) or 1
    meta = getattr(node, "meta", None)
    if meta is not None and not meta.empty:
        return meta.line, meta.column
    return 1, 1


def fail(node: Any, message: str) -> ParseError:
    """A ParseError at ``node``'s position."""
    return ParseError(message, *where(node))


def read_mesh(nested: lark.Tree, strides: lark.Tree | None, offset: lark.Token | None) -> Mesh:
    """``[2, 4] : [4, 1] + 8`` (a layout: shape, strides, offset) or ``[[0, 1], [3, 2]]``
    (the devices themselves)."""
    if strides is None:
        devices, shape = _nested(nested)
        return Mesh(devices=tuple(devices), shape=tuple(shape))
    shape, shape_dims = _nested(nested)
    stride_values, stride_dims = _nested(strides)
    if len(shape_dims) != 1 or len(stride_dims) != 1:
        raise fail(nested, "a mesh layout is a flat list of sizes : a flat list of strides")
    return Mesh(shape=tuple(shape), strides=tuple(stride_values), offset=int(offset or 0))


def _nested(tree: lark.Tree, depth: int = 1) -> tuple[list[int], list[int]]:
    items = [c for c in tree.children if c is not None]
    if depth > 3:
        raise fail(tree, "a mesh has 1 to 3 dims")
    if all(getattr(c, "data", None) == "device" for c in items):
        return [int(c.children[0]) for c in items], [len(items)]
    rows = [_nested(c, depth + 1) for c in items]
    if (
        any(getattr(c, "data", None) != "nested" for c in items)
        or len({tuple(shape) for _, shape in rows}) != 1
    ):
        raise fail(tree, "a mesh is a list of devices or of equally shaped lists")
    return [d for devices, _ in rows for d in devices], [len(rows), *rows[0][1]]


CONSTANTS = {"true": True, "false": False, "inf": float("inf"), "nan": float("nan")}
"""The names that read as constants (``hostir.ir.scalars.RESERVED``)."""


def read_float(token: lark.Token) -> float:
    """The float a FLOAT token writes; one past the float64 range is refused (``inf`` is
    how the text writes infinity)."""
    value = float(token)
    if value in (float("inf"), float("-inf")):
        raise fail(token, f"{token} is beyond the range of a float64; write inf for infinity")
    return value


def check_name(token: lark.Token, what: str) -> None:
    """Refuses a ``RESERVED`` name for ``what`` (a scalar input, a loop index)."""
    if str(token) in RESERVED:
        raise fail(token, f"{token} cannot name {what}: it reads as a constant")


def read_dtype(token: lark.Token) -> DType:
    """The DType a name token names."""
    try:
        return DType(str(token))
    except ValueError:
        known = ", ".join(d.value for d in DType)
        raise fail(token, f"unknown dtype {token}; expected one of {known}") from None
