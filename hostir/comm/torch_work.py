"""Work in flight on ``torch.distributed``: the backend's handles plus the copies that
complete them in ``wait()``.

torch needs contiguous buffers, so a non-contiguous output gets a contiguous
temporary that ``wait()`` copies back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hostir.comm.backend_hooks import Work
from hostir.errors import CommunicationError


class PendingWork(Work):
    """torch work handles plus the post-processing that completes them in ``wait()``."""

    def __init__(
        self,
        what: str,
        handles: Sequence[Any],
        finish: Callable[[], None] | None = None,
        keep: Sequence[torch.Tensor] = (),
        *,
        on_error: Callable[[str, BaseException], CommunicationError],
    ) -> None:
        self._what = what
        self._handles = list(handles)
        self._finish = finish
        # Buffers torch reads or writes asynchronously must outlive the call.
        self._keep = list(keep)
        self._on_error = on_error
        self._done = False

    def wait(self) -> None:
        """Waits for the handles, then copies results into place (once)."""
        if self._done:
            return
        try:
            for handle in self._handles:
                handle.wait()
        except RuntimeError as exc:  # gloo reports timeouts and lost peers this way
            raise self._on_error(self._what, exc) from exc
        if self._finish is not None:
            self._finish()
        self._done = True
        self._handles, self._finish, self._keep = [], None, []

    def ready(self) -> bool:
        """Whether :meth:`wait` would return (or raise) at once: every handle completed."""
        return self._done or all(handle.is_completed() for handle in self._handles)


def _contiguous_like(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself if contiguous, else an empty contiguous buffer of its shape."""
    if tensor.is_contiguous():
        return tensor
    return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)


def _copy_back(buf: torch.Tensor, target: torch.Tensor) -> Callable[[], None] | None:
    """A finisher copying ``buf`` into ``target`` when they differ (None when they are one)."""
    if buf is target:
        return None
    return lambda: target.copy_(buf)
