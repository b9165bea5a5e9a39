"""Stream instructions: which stream runs the following instructions, and ordering.

Streams are values: ``main = get_current_stream()`` names the stream the
program started on, and ``stream(i)`` is stream ``i`` of the evaluator's pool.
On CUDA, instructions after ``set_current_stream(s)`` are enqueued on ``s``
and ``synchronize(s)`` makes the current stream wait for all work enqueued on
``s`` so far. On CPU everything runs in program order (a valid schedule); the
race checker still tracks the streams, so a program that would race on a GPU
fails on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.values import StreamValue


@declare(kind=Kind.STREAM, keyword="get_current_stream")
@dataclass(frozen=True, slots=True, kw_only=True)
class GetCurrentStream:
    """Binds ``out`` to the stream currently in use."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ()
    out: StreamValue


@declare(kind=Kind.STREAM, keyword="set_current_stream", positional=("stream",))
@dataclass(frozen=True, slots=True, kw_only=True)
class SetCurrentStream:
    """Makes ``stream`` the stream that runs the following instructions."""

    OUTS: ClassVar[tuple[str, ...]] = ()
    INS: ClassVar[tuple[str, ...]] = ("stream",)
    stream: StreamValue


@declare(kind=Kind.STREAM, keyword="synchronize", positional=("stream",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Synchronize:
    """The current stream waits for everything enqueued on ``stream`` so far."""

    OUTS: ClassVar[tuple[str, ...]] = ()
    INS: ClassVar[tuple[str, ...]] = ("stream",)
    stream: StreamValue


STREAM_INSTRUCTIONS = (GetCurrentStream, SetCurrentStream, Synchronize)
"""The stream instructions, in catalog order."""
