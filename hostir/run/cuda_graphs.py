"""CUDA graphs: a program's run captured once per input signature, then replayed.

A replay launches every kernel (and NCCL collective) the run enqueued with one
``cudaGraphLaunch``, skipping the host work of the run: binding, handlers, the
compiled program's Python. What it keeps and what it gives back follows
torch.compile's ``mode="reduce-overhead"`` (docs/cuda_graphs.md has the whole story):

- **Inputs are copied** into static buffers (one clone of each tensor input, made at
  capture) before each replay: the caller's tensors are read, never kept or written.
  Scalar inputs are baked into the graph: a replay with another scalar value is refused.
  A program that writes into an input is refused (the graph would write only its copy).
- **Outputs are fresh tensors**: clones of the graph's static outputs, made after each
  replay on the replaying stream. reduce-overhead returns the static buffers themselves,
  which the next replay overwrites; we pay one copy per output so that a result stays
  what it was, as an uncaptured run's does.

:func:`~hostir.run.cuda_graph_checks.check_capturable` (hostir.run.cuda_graph_checks)
refuses, with a :class:`~hostir.errors.CudaGraphError` naming each reason, a run that
cannot be captured; :class:`GraphedProgram` warms a run up on a side stream, captures it
and replays it. The executable prepared for an input signature (hostir.run.executable:
``execute`` and ``HostIrEvaluator.run`` alike) keeps one GraphedProgram.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hostir.errors import CudaGraphError
from hostir.run.compiled_runs import bitwise_equal
from hostir.run.cuda_graph_checks import NEEDS_CUDA

WARMUP_RUNS = 3
"""Runs on a side stream before the capture (torch's CUDA-graph notes use 3): the first
run of a signature creates what a capture must not (process groups, cuBLAS handles and
workspaces, the stream pool's streams, NCCL's first point-to-point connections)."""


RunOnce = Callable[[list[Any]], list[torch.Tensor | None]]
"""A run of the program on given inputs, returning its outputs (``HostIrEvaluator.run``)."""


class GraphedProgram:
    """One capture of a program for one input signature on one device.

    ``run_once(inputs) -> outputs`` runs the program (the caller passes the evaluator's
    run; it must not synchronize with the host nor decide anything from tensor values).
    ``inputs``: tensors on ``device``, scalars, or None (an input this rank does not
    hold); ``names``, if given, name them in errors. The constructor clones the tensor
    inputs into static buffers, runs ``run_once`` on them :data:`WARMUP_RUNS` times on a
    side stream (as torch's CUDA-graph notes do), then captures one more run into a
    ``torch.cuda.CUDAGraph``, keeping its outputs. CudaGraphError if the capture fails
    (what torch said is in the message); an error of a warm-up run is raised as it is.

    Memory: the static inputs, the graph's private pool (the run's peak, held for the
    graph's life) and the static outputs stay allocated while this object lives.
    """

    def __init__(
        self,
        run_once: RunOnce,
        inputs: Sequence[Any],
        device: torch.device | str,
        *,
        names: Sequence[str] | None = None,
    ) -> None:
        self.device = _cuda_device(device)
        self._names = list(names) if names is not None else None
        self._static = [self._static_input(index, given) for index, given in enumerate(inputs)]
        self._lock = threading.Lock()  # a replay's copy-in, launch and copy-out go together
        self._stream: torch.cuda.Stream | None = None  # where the last replay ran
        self._raw_stream: int | None = None  # the last replay's stream, as CUDA's handle
        with torch.cuda.device(self.device):
            self._warm_up(run_once)
            self._graph, self._outputs = self._capture(run_once)
        # What a replay copies: the tensor inputs into their static buffers, and each
        # distinct output once (an output listed twice is cloned once).
        self._buffers = [x for x in self._static if isinstance(x, torch.Tensor)]
        position: dict[int, int] = {}  # id of a static output -> its place in _distinct
        self._distinct: list[torch.Tensor] = []
        for static in self._outputs:
            if static is not None and id(static) not in position:
                position[id(static)] = len(self._distinct)
                self._distinct.append(static)
        self._picks = [None if t is None else position[id(t)] for t in self._outputs]

    def replay(self, inputs: Sequence[Any]) -> list[torch.Tensor | None]:
        """Copies ``inputs`` into the static buffers, replays the graph on the current
        stream, and returns fresh tensors: clones of the static outputs (one per distinct
        output; None where the program gives None). CudaGraphError for inputs of another
        signature (count, shape, dtype, device) or another scalar value than captured.

        Replays from several threads or streams take turns: a replay on another stream than
        the last one first waits for it, so no replay's copy-in lands in a replay still
        running."""
        return self._launch(self._checked_tensors(inputs))

    def replay_known(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
        """:meth:`replay` for inputs the caller has matched against the capture's
        signature (an executable's call, hostir.run.executable: every input a tensor of
        the captured shape, dtype and device, compared in its key): no per-input checks."""
        if len(inputs) != len(self._buffers):
            raise CudaGraphError(
                f"the graph was captured with {len(self._buffers)} inputs, got {len(inputs)}"
            )
        return self._launch(list(inputs))

    def _launch(self, tensors: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """Orders the current stream after the last replay's, copies ``tensors`` (one per
        static buffer) in, replays, and clones each distinct output once."""
        with self._lock:
            raw = _raw_stream(self.device)
            if raw != self._raw_stream:
                stream = torch.cuda.current_stream(self.device)
                if self._stream is not None and stream != self._stream:
                    stream.wait_stream(self._stream)
                self._stream, self._raw_stream = stream, raw
            if tensors:
                _copy_all(self._buffers, tensors)
            self._graph.replay()
            clones = [t.clone() for t in self._distinct]
        return [None if pick is None else clones[pick] for pick in self._picks]

    def _name(self, index: int) -> str:
        return f"input {self._names[index]}" if self._names else f"input #{index}"

    def _static_input(self, index: int, given: Any) -> Any:
        """The buffer a tensor input is copied into at each replay (its clone, which keeps
        the strides of a dense tensor, so the captured run sees the layout the uncaptured
        one saw); other inputs as they are."""
        if not isinstance(given, torch.Tensor):
            return given
        if given.device.type != "cuda" or _device_index(given.device) != self.device.index:
            raise CudaGraphError(
                f"{self._name(index)} is on {given.device}, but the graph is captured on"
                f" {self.device}"
            )
        return given.detach().clone()

    def _warm_up(self, run_once: RunOnce) -> None:
        """Runs the program :data:`WARMUP_RUNS` times on a side stream ordered after the
        current one (the static inputs were cloned there), then orders the current stream
        after it; CudaGraphError if the runs wrote into an input."""
        kept = [x.clone() if isinstance(x, torch.Tensor) else None for x in self._static]
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                run_once(self._static)
        current.wait_stream(side)
        self._check_unwritten(kept)

    def _check_unwritten(self, kept: list[torch.Tensor | None]) -> None:
        """Refuses a program that writes into an input (``out=`` a chunk of it): a replay
        would write the graph's copy, and the caller's tensor would keep its old values.
        Found by comparing the static inputs with their copies from before the warm-up
        (torch.compile's reduce-overhead, too, declines to graph a function that mutates
        its inputs)."""
        for index, (static, before) in enumerate(zip(self._static, kept, strict=True)):
            if before is not None and not bitwise_equal(static, before):
                raise CudaGraphError(
                    f"the program writes into {self._name(index)}: a replay would write the"
                    " graph's copy of it, not the caller's tensor; run it uncaptured"
                )

    def _capture(self, run_once: RunOnce) -> tuple[torch.cuda.CUDAGraph, list]:
        """One run captured on a stream of this graph's own (torch.cuda.graph's shared
        default stream belongs to whichever device first used it)."""
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(self.device)
        try:
            with torch.cuda.graph(graph, stream=stream):
                outputs = list(run_once(self._static))
        except Exception as error:
            raise CudaGraphError(
                f"capturing the program in a CUDA graph on {self.device} failed:"
                f" {type(error).__name__}: {error}"
            ) from error
        return graph, outputs

    def _checked_tensors(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """The tensor inputs, in order, once every input is checked against the capture:
        each tensor of the captured shape, dtype and device, each scalar the captured
        value."""
        if len(inputs) != len(self._static):
            raise CudaGraphError(
                f"the graph was captured with {len(self._static)} inputs, got {len(inputs)}"
            )
        tensors = []
        for index, (static, given) in enumerate(zip(self._static, inputs, strict=True)):
            if isinstance(static, torch.Tensor):
                if not _fits(given, static):
                    raise CudaGraphError(
                        f"{self._name(index)}: the graph was captured for a tensor of shape"
                        f" {list(static.shape)} and dtype {static.dtype} on {static.device},"
                        f" got {_describe(given)}"
                    )
                tensors.append(given)
            elif not _same_scalar(static, given):
                raise CudaGraphError(
                    f"{self._name(index)} was {static!r} when the graph was captured, got"
                    f" {given!r}: scalar inputs are part of the graph, capture one per value"
                )
        return tensors


def _copy_all(buffers: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``buffers[i].copy_(sources[i])`` for every i, as torch's multi-tensor copy where this
    torch has it (it copies tensor by tensor where shapes or strides rule the fast path
    out)."""
    foreach_copy = getattr(torch, "_foreach_copy_", None)
    if foreach_copy is not None:
        foreach_copy(buffers, sources)
        return
    for buffer, source in zip(buffers, sources, strict=True):
        buffer.copy_(source)


def _raw_stream(device: torch.device) -> int:
    """The current stream of ``device`` as CUDA's handle: an int, read without making a
    ``torch.cuda.Stream`` (which costs a few µs per replay)."""
    read = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if read is None:
        return torch.cuda.current_stream(device).cuda_stream
    return read(device.index)


def _cuda_device(device: torch.device | str) -> torch.device:
    """``device`` as an indexed CUDA device; CudaGraphError if it is not one or torch has
    no CUDA."""
    device = torch.device(device)
    if not torch.cuda.is_available():
        raise CudaGraphError(f"{NEEDS_CUDA}: torch reports no usable CUDA device on this machine")
    if device.type != "cuda":
        raise CudaGraphError(f"{NEEDS_CUDA}: {device} is not a CUDA device")
    return torch.device("cuda", _device_index(device))


def _device_index(device: torch.device) -> int:
    """The index of a CUDA device (``cuda`` alone is the current one)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def _fits(given: Any, static: torch.Tensor) -> bool:
    """Whether ``given`` can be copied into ``static`` as it is (no broadcast, no cast)."""
    return (
        isinstance(given, torch.Tensor)
        and given.shape == static.shape
        and given.dtype == static.dtype
        and given.device == static.device
    )


def _describe(given: Any) -> str:
    if isinstance(given, torch.Tensor):
        return f"shape {list(given.shape)} and dtype {given.dtype} on {given.device}"
    return f"a {type(given).__name__}"


def _same_scalar(captured: Any, given: Any) -> bool:
    """Whether two scalar inputs (or Nones) mean the same to a program: the same type
    and the same text (so ``nan`` equals ``nan`` and ``0.0`` differs from ``-0.0``)."""
    return type(captured) is type(given) and repr(captured) == repr(given)
