"""``fd.ops.ragged_all_to_all``: the exchange of an expert-parallel layer, by counts the
program computes (docs/run_time_extents.md).

A tensor ``[D, rows, ...]`` whose dim 0 is split over a mesh axis of D devices holds one
member's rows per device. ``ragged_all_to_all(src, counts)`` sends member q the
``counts[p][q]`` rows of member p that come after the rows p sends members before q, and
returns ``[D, r, ...]``: on member q, what every member sent it, in member order. ``r`` is
a *run-time extent* (``r0``, ``r1``, ...): bound as the program runs, different on every
member; a second tensor sent by the same counts takes the first's (``extent=``).
``transpose=True`` is the way back (``counts[q][p]`` rows), into ``extent`` rows (the
rows each member sent on the way out). Lowering reads the counts to the host
(``to_host``, after an Allgather where they are split over the mesh) and emits one
``RaggedAllToAll`` over dim 0's mesh axis.
"""

from __future__ import annotations

from typing import Any

from frontend.arguments import check_bool, shown
from frontend.errors import OperandError
from frontend.exprs import ScalarVal
from frontend.recording import record
from frontend.tensor_view import TensorView
from hostir.ir.host_reads import RAGGED_ALL_TO_ALL
from hostir.ir.scalars import Const, Scalar


def ragged_all_to_all(
    self, src: TensorView, counts: TensorView, transpose: bool = False, extent: Any = None
) -> TensorView:
    """Rows of ``src [D, m, ...]`` go to member q by ``counts [D, D]`` (module docstring):
    ``[D, r, ...]`` with ``r`` a new run-time extent, or ``extent`` rows where given (with
    ``transpose``, the way back: the way out's ``m``; or a second tensor sent by the same
    counts: the first one's ``r``, ``fd.ops.size(received, 1)``)."""
    for role, value in (("src", src), ("counts", counts)):
        if not isinstance(value, TensorView):
            raise OperandError(
                f"ragged_all_to_all: {role} must be a TensorView, got {shown(value)}"
            )
    transpose = check_bool(OperandError, "ragged_all_to_all", "transpose", transpose)
    rows = _extent(self._fusion, transpose, extent)
    operands = {"src": src, "counts": counts, "extent": rows, "transpose": transpose}
    return record(self._fusion, RAGGED_ALL_TO_ALL, operands)[0]


def _extent(fusion: Any, transpose: bool, extent: Any) -> Scalar:
    """The result's rows: ``extent`` where given (an int, or a size of the fusion: the way
    back's, or an earlier exchange's run-time extent for a second tensor sent by the same
    counts), else a new run-time extent on the way out."""
    if extent is None and not transpose:
        return fusion.new_run_time_symbol()
    if isinstance(extent, ScalarVal) and extent.extent is not None:
        return extent.extent
    if isinstance(extent, int) and not isinstance(extent, bool) and extent >= 0:
        return Const(value=extent)
    raise OperandError(
        "ragged_all_to_all: extent must be the rows each member ends with (an int or a size"
        " of the fusion; transpose=True needs it: the rows each member sent on the way"
        f" out), got {shown(extent)}"
    )


EXPERT_METHODS = {"ragged_all_to_all": ragged_all_to_all}
"""The ``fd.ops`` methods of this module, by name."""
