"""The evaluator's streams: ``main`` (the stream a run starts on) and a bounded pool of
numbered streams per device, ``stream(i)`` on pool stream ``i mod size``."""

from __future__ import annotations

import threading
from typing import Any

import torch

from hostir.settings import checked_count, count_setting

MAIN = "main"
"""The id of the stream a run starts on."""


STREAMS_VARIABLE = "HOSTIR_STREAMS"
"""How many streams an evaluator's pool holds per device (a positive integer)."""

DEFAULT_STREAMS = 4
"""Streams per device by default: ``stream(i)`` is stream ``i mod 4`` of the pool, so a
stream loop of any length uses at most four, enough for a chunk's compute to overlap
the communication of the next three (a prefetch depth up to 3)."""


MAX_STREAMS = 32
"""The largest pool: CUDA runs at most 32 streams' work concurrently
(``CUDA_DEVICE_MAX_CONNECTIONS`` tops out at 32), so more would add only their cost."""


def stream_count(count: int | None = None) -> int:
    """The pool size to use: ``count`` if given, else ``HOSTIR_STREAMS``, else
    :data:`DEFAULT_STREAMS`; SettingError for anything but a whole number in
    ``[1, MAX_STREAMS]``."""
    if count is None:
        return count_setting(STREAMS_VARIABLE, DEFAULT_STREAMS, 1, MAX_STREAMS)
    return checked_count(count, "streams", 1, MAX_STREAMS)


class StreamPool:
    """At most ``size`` streams per device, by id: ``stream(i)`` of a program is pool stream
    ``i mod size`` (:meth:`stream_id`), so loop iterations share streams round-robin and
    two iterations on one stream run in order (the race checker sees the same ids). CUDA
    streams are created on first use (one pool per evaluator and device).

    ``main`` is the stream the current run started on, recorded per thread by
    :meth:`start_run`: torch's current stream is per thread, and a caller may start each
    run on another stream. Threads running one evaluator at once share the numbered
    streams, which only orders their work more."""

    def __init__(self, device: torch.device, size: int = DEFAULT_STREAMS) -> None:
        self.device = device
        self.size = size
        self._streams: dict[Any, torch.cuda.Stream] = {}
        self._lock = threading.Lock()  # two threads must not create one stream twice
        self._main = threading.local()

    def stream_id(self, index: int) -> int:
        """The pool stream that ``stream(index)`` runs on."""
        return index % self.size

    def start_run(self) -> None:
        """Records the calling thread's current stream as ``main`` for the run it starts."""
        if self.device.type == "cuda":
            self._main.stream = torch.cuda.current_stream(self.device)

    def get(self, stream_id: Any) -> torch.cuda.Stream:
        """The CUDA stream for ``stream_id`` (the run's starting stream for ``main``)."""
        if stream_id == MAIN:
            main = getattr(self._main, "stream", None)
            return main if main is not None else torch.cuda.current_stream(self.device)
        if stream_id not in self._streams:
            with self._lock:
                if stream_id not in self._streams:
                    self._streams[stream_id] = torch.cuda.Stream(device=self.device)
        return self._streams[stream_id]
