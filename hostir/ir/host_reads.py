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
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
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
