"""Evaluator handlers for stream instructions.

A stream is identified by ``"main"`` (the stream the run started on) or by its
index in the evaluator's pool. The evaluator always tracks which stream is
current (listeners such as the race checker read ``context.current_stream``);
on CUDA it also switches torch's current stream and synchronizes with events.
On CPU the instructions only move that bookkeeping: execution stays in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from hostir.streams import GetCurrentStream, SetCurrentStream, Synchronize

if TYPE_CHECKING:
    from hostir.run_context import RunContext

MAIN = "main"
"""The id of the stream a run starts on."""


class StreamPool:
    """CUDA streams by id, created on first use (one pool per evaluator and device)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._streams: dict[Any, torch.cuda.Stream] = {}

    def get(self, stream_id: Any) -> torch.cuda.Stream:
        """The CUDA stream for ``stream_id`` (the run's starting stream for ``main``)."""
        if stream_id not in self._streams:
            if stream_id == MAIN:
                self._streams[MAIN] = torch.cuda.current_stream(self.device)
            else:
                self._streams[stream_id] = torch.cuda.Stream(device=self.device)
        return self._streams[stream_id]


def run_get_current_stream(
    context: RunContext, instruction: GetCurrentStream, operands: dict
) -> list:
    """Binds the current stream's id."""
    return [context.current_stream]


def run_set_current_stream(
    context: RunContext, instruction: SetCurrentStream, operands: dict
) -> list:
    """Switches the current stream (and torch's, on CUDA)."""
    stream_id = operands["stream"]
    context.current_stream = stream_id
    if context.device.type == "cuda":
        torch.cuda.set_stream(context.stream_pool.get(stream_id))
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
