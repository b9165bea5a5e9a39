"""Reading device values to the host: the instruction that makes run-time extents.

Every extent, loop bound and split of a program is known from its input signature and
scalar inputs, except those bound from values a program computes: an expert-parallel
layer sends each expert the tokens routed to it, a count known only after the router ran.
``to_host`` copies an integer tensor's values to the host (a device-to-host sync, drawn
and printed as one), and the instructions that read the host value bind extents from it
(``RaggedAllToAll``'s ``received``). See docs/run_time_extents.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.dtypes import DType
from hostir.ir.extents import differ
from hostir.ir.opdecl import OpArgs, Param, ParamKind, ResultType, declare_op, result_axis
from hostir.ir.scalars import Scalar, print_scalar
from hostir.ir.values import HostValue, TensorValue


@declare(kind=Kind.HOST_SYNC, keyword="to_host", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class ToHost:
    """``out`` holds this rank's values of the integer tensor ``src`` on the host: the
    host waits for the stream that runs it (on a GPU, a device-to-host sync; a CUDA graph
    cannot hold one). Runs on the ranks that hold ``src``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: HostValue
    src: TensorValue


# ----- the frontend's form: ragged_all_to_all, lowered to to_host and RaggedAllToAll -----


def _infer_ragged(args: OpArgs) -> tuple[ResultType, ...] | str:
    """``src [D, m, *rest]`` and integer ``counts [D, D]`` -> ``[D, extent, *rest]``: dim 0
    (one member's rows each) iterates with ``src``'s, dim 1 is the rows each member
    receives (computed whole: the exchange fills it), the rest with ``src``'s."""
    src, counts, extent = args["src"], args["counts"], args["extent"]
    op = "ragged_all_to_all"
    if src.ndim < 2:
        return f"{op}: src {src.name} has {src.ndim} dims; expected [D, rows, ...]"
    if counts.ndim != 2 or counts.dtype not in (DType.INT64, DType.INT32):
        return (
            f"{op}: counts {counts.name} must be a 2-d Int tensor [D, D] (rows member p sends"
            f" member q), got {counts.dtype.value} with {counts.ndim} dims"
        )
    for dim in (0, 1):
        if differ(counts.shape[dim], src.shape[0]):
            return (
                f"{op}: counts {counts.name} has extent {print_scalar(counts.shape[dim])} in"
                f" dim {dim} but src {src.name} has {print_scalar(src.shape[0])} members in"
                " dim 0; expected counts [D, D]"
            )
    axes = (
        result_axis(src.shape[0], ("src", 0)),
        result_axis(extent, whole=True),
        *(result_axis(e, ("src", d)) for d, e in enumerate(src.shape) if d >= 2),
    )
    return (ResultType(dtype=src.dtype, axes=axes),)


def _frontend_only(instruction: Any) -> str:
    return (
        f"ragged_all_to_all defining {instruction.out.name} is the frontend's form of an"
        " exchange by run-time counts; lowering emits to_host and RaggedAllToAll for it, and"
        " a program runs those"
    )


RAGGED_ALL_TO_ALL = declare_op(
    "ragged_all_to_all",
    class_name="RaggedExchange",
    params=(
        Param("src", ParamKind.TENSOR, TensorValue),
        Param("counts", ParamKind.TENSOR, TensorValue),
        Param("extent", ParamKind.SCALAR, Scalar),
        Param("transpose", ParamKind.ATTRIBUTE, bool, False),
    ),
    positional=("src",),
    infer=_infer_ragged,
    check=_frontend_only,
    summary="Rows of ``src[p]`` go to member q by ``counts[p][q]`` (``transpose``:"
    " ``counts[q][p]``), in member order: the dispatch and combine of an expert-parallel"
    " layer, dim 0 over a mesh axis of D devices (docs/run_time_extents.md).",
    dtype_rule="same",
    nvfuser_signature="ragged_all_to_all(src, counts, transpose=False, extent=None)",
)
RaggedExchange = RAGGED_ALL_TO_ALL.cls
"""The frontend's ``ragged_all_to_all`` (``fd.ops.ragged_all_to_all``): lowering turns it into
``to_host`` of the counts and a ``RaggedAllToAll`` over dim 0's mesh axis; the verifier
refuses it in a program."""
