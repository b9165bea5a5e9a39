"""Evaluator handlers for stream instructions.

A stream is identified by ``"main"`` (the stream the run started on) or by its
index in the evaluator's pool (``hostir.run.stream_pool``). The evaluator always
tracks which stream is current (listeners such as the race checker read
``context.current_stream``); on CUDA it also switches torch's current stream and
synchronizes with events.
On CPU the instructions only move that bookkeeping: execution stays in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from hostir.ir.streams import GetCurrentStream, SetCurrentStream, Synchronize

if TYPE_CHECKING:
    from hostir.run.context import RunContext


def run_get_current_stream(
    context: RunContext, instruction: GetCurrentStream, operands: dict
) -> list:
    """Binds the current stream's id."""
    return [context.current_stream]


def make_current(context: RunContext, stream_id: Any) -> None:
    """Makes ``stream_id`` the run's current stream (and torch's, on CUDA)."""
    context.current_stream = stream_id
    if context.device.type == "cuda":
        torch.cuda.set_stream(context.stream_pool.get(stream_id))


def run_set_current_stream(
    context: RunContext, instruction: SetCurrentStream, operands: dict
) -> list:
    """Switches the current stream (and torch's, on CUDA)."""
    make_current(context, operands["stream"])
    return []


def run_synchronize(context: RunContext, instruction: Synchronize, operands: dict) -> list:
    """The current stream waits for the work enqueued on the given one."""
    if context.device.type == "cuda":
        event = torch.cuda.Event()
        event.record(context.stream_pool.get(operands["stream"]))
        torch.cuda.current_stream(context.device).wait_event(event)
    return []


STREAM_HANDLERS = {
    GetCurrentStream: run_get_current_stream,
    SetCurrentStream: run_set_current_stream,
    Synchronize: run_synchronize,
}
"""One handler per stream instruction."""
