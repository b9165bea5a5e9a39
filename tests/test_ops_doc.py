"""docs/ops.md lists every op ``fd.ops`` has and only those, and each declared op's row says
what its declaration (``hostir.ir.opdecl``) says: its signature, summary and dtype rule (and
a pointwise row the compute dtypes its rule takes, ``hostir.ir.ops``)."""

from __future__ import annotations

import pathlib
import re

from frontend.ops import Ops
from hostir.ir.opdecl import OpDecl, declared_ops
from hostir.ir.ops import POINTWISE_OPS

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "ops.md"


def rows_of(text: str) -> dict[str, dict[str, str]]:
    """Table rows of a page's ``text`` by their first cell's backticked op name, each a
    mapping from its table's column titles to its cells."""
    rows, titles = {}, []
    for line in text.splitlines():
        if not line.startswith("| "):
            continue
        cells = [
            c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\) \| ", line.strip()[2:-2])
        ]
        found = re.match(r"`([a-z_]+)`$", cells[0])
        if not found:  # a table's title row (or its rule)
            titles = cells
            continue
        assert found.group(1) not in rows, f"{found.group(1)} has two rows"
        rows[found.group(1)] = dict(zip(titles, cells, strict=True))
    return rows


def _rows() -> dict[str, dict[str, str]]:
    """docs/ops.md's rows (:func:`rows_of`)."""
    return rows_of(PAGE.read_text())


def missing_rows(decls: tuple[OpDecl, ...], rows: dict[str, dict[str, str]]) -> list[str]:
    """The names of ``decls`` (ops with an ``fd.ops`` method) that have no row in
    ``rows``: an op declared outside the package is listed too."""
    return [d.name for d in decls if d.fd_method and d.name not in rows]


def row_problems(decls: tuple[OpDecl, ...], rows: dict[str, dict[str, str]]) -> list[str]:
    """What the rows say otherwise than ``decls`` (each an ``fd.ops`` method): a missing
    row, a signature cell that does not start with the declared signature, and where the
    row's table has them, a "computes" cell that is not the summary, a "dtype rule" cell
    that is not the rule's name."""
    problems = []
    for decl in decls:
        row = rows.get(decl.name)
        if row is None:
            problems.append(f"{decl.name}: no row")
            continue
        signature = row["signature"]
        if not signature.startswith(f"`{decl.signature()[:-1]}"):
            problems.append(f"{decl.name}: signature {signature}, declared {decl.signature()}")
        computes = row.get("computes", decl.summary.replace("``", "`"))
        if computes != decl.summary.replace("``", "`"):
            problems.append(f"{decl.name}: computes {computes!r}, declared {decl.summary!r}")
        rule = row.get("dtype rule", f"`{decl.dtype_rule}`")
        if rule != f"`{decl.dtype_rule}`":
            problems.append(f"{decl.name}: dtype rule {rule}, declared {decl.dtype_rule}")
    return problems


def test_the_page_lists_every_op_and_only_those() -> None:
    """Every public method of ``fd.ops`` has a row, and every row is such a method."""
    ops = {name for name in vars(Ops) if not name.startswith("_")}
    assert set(_rows()) == ops


def test_declared_rows_match_their_declarations() -> None:
    """Each op the package declares is an ``fd.ops`` method (written or made from its
    declaration) unless another op's method records it, and its row gives its declared
    signature, summary and dtype rule. (An op declared later, outside the package, is no
    method of ``Ops`` but found by ``Ops.__getattr__``; tests/test_external_op.py checks
    one against a page of its own with these functions.)"""
    package = [d for d in declared_ops() if d.cls.__module__.startswith("hostir.")]
    assert {d.name for d in package if d.fd_method} <= set(vars(Ops))
    declared = tuple(d for d in package if d.name in vars(Ops))
    assert {d.name for d in declared} >= set(POINTWISE_OPS)
    assert missing_rows(declared, _rows()) == []
    assert row_problems(declared, _rows()) == []


def test_pointwise_rows_match_their_declarations() -> None:
    """The compute dtypes each pointwise row says its rule takes are the declaration's."""
    rows = _rows()
    for name, op in POINTWISE_OPS.items():
        takes = rows[name]["compute dtypes taken"]
        assert takes == ", ".join(sorted(c.value for c in op.accepts)), (name, takes)
