"""docs/ops.md lists every op ``fd.ops`` has and only those, and each pointwise row says
what the op's declaration (``hostir.ir.ops``) says: its operands, rule and dtypes."""

from __future__ import annotations

import pathlib
import re

from frontend.ops import Ops
from hostir.ir.ops import POINTWISE_OPS

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "ops.md"


def _rows() -> dict[str, list[str]]:
    """Table rows of the page by their first cell's backticked op name."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        found = re.match(r"\| `([a-z_]+)` \|", line)
        if found:
            assert found.group(1) not in rows, f"{found.group(1)} has two rows"
            rows[found.group(1)] = [cell.strip() for cell in line.strip("|").split(" | ")]
    return rows


def test_the_page_lists_every_op_and_only_those() -> None:
    """Every public method of ``fd.ops`` has a row, and every row is such a method."""
    ops = {name for name in vars(Ops) if not name.startswith("_")}
    assert set(_rows()) == ops


def test_pointwise_rows_match_their_declarations() -> None:
    """Signature, rule and compute dtypes of each pointwise row are the declaration's."""
    rows = _rows()
    for name, op in POINTWISE_OPS.items():
        _, signature, _, rule, takes = rows[name]
        assert signature.startswith(f"`{name}({', '.join(op.params)}"), (name, signature)
        assert rule == f"`{op.rule.value}`", (name, rule)
        assert takes == ", ".join(sorted(c.value for c in op.accepts)), (name, takes)
