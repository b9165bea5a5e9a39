"""Redistribution against DTensor: our resharding programs and ``DTensor.redistribute``.

For each mesh and each ``source -> target`` case (compact notation of
``lowering.redistribution.distribution``: one placement per mesh dim, outer first, ``S<d>``
shard, ``R`` replicate, ``P`` partial sum, ``[m,..]`` a non-default shard
order), both sides redistribute the same local data in the same process:

- ours: ``tests.redistribution_programs.program_for(src, dst, shape)`` — the host IR
  program of ``fusion_for(...)`` (one ``set``; for a partial source the
  fusion's local ``sum`` over the partial values is dropped, so the program
  takes each rank's partial value as DTensor does) — run by one
  ``hostir.HostIrEvaluator`` (what ``fd.execute`` runs) that is created once;
- DTensor: ``DTensor.from_local(local, mesh, src.to_placements())`` then
  ``.redistribute(mesh, dst.to_placements()).to_local()``.

Before anything is measured every rank checks that ours, DTensor's and the
single-device reference agree exactly (integer-valued floats: any summation
order gives the same result), and that ``fd.execute`` of the whole fusion
(local sum included) gives the same result as the program.

What is reported per case (the maximum over ranks where it differs by rank):

- **collectives**: ours as written in the program (communication
  instructions; a CollectivePermute is one), and for both sides as seen by
  the profiler: the ``gloo:*`` events one call produces on a rank, where a
  ``gloo:send`` and a ``gloo:recv`` posted together (one point-to-point swap)
  count as one: collectives = other gloo events + max(sends, receives).
- **recv** (the criterion against DTensor): the bytes that arrive at a rank
  from other ranks during one call (the busiest rank: the maximum over ranks).
  A rank's own chunk, which never leaves it, does not count. Measured from what
  ran, in a call of its own (neither profiled nor timed): a
  ``TorchDispatchMode`` (:class:`ProcessGroupRecorder`) records every
  process-group op the call dispatches on this rank, ``c10d::*`` (what
  ``torch.distributed``'s functions call: ours) and ``_c10d_functional::*``
  (DTensor's functional collectives), with its tensors, split sizes, root and
  its group's size g and this rank's position in it (the profiler's events
  carry neither the group nor the split sizes). Each call then counts, for
  n bytes (:func:`received_bytes`):

  ==============================  =========================================
  all_gather (n from each rank)   (g - 1) n
  reduce_scatter (n to each)      (g - 1) n
  all_reduce of n                 2 (g - 1) n / g (ring: reduce-scatter,
                                  then all-gather)
  all_to_all(_single)             the split sizes arriving from the other
                                  g - 1 ranks (own split left out)
  broadcast of n, scatter of n    n on the others, 0 on the root
  gather of n from each           (g - 1) n on the root, 0 on the others
  reduce of n                     2 (g - 1) n / g on the root,
                                  (g - 1) n / g on the others
  recv of n / send / barrier      n / 0 / 0
  ==============================  =========================================

  These are the bytes a bandwidth-optimal algorithm moves for the collective
  that was called, the same formula for both sides; gloo's own algorithm may
  move more (its reduce-scatter all-reduces the whole input). The recorded
  call must compute the expected result, and must have recorded calls where
  the profiler saw gloo events (a call made on another thread would escape
  the recorder). ``recv ≤ DTensor`` says whether ours receives no more.
- **to gloo**: the bytes of the tensors handed to gloo as data to send or
  reduce (the input of every ``gloo:*`` event except ``gloo:recv``, from
  ``record_shapes``), per rank. Both sides go through the same gloo entry
  points, so this is the same measure for both.
- **peak extra**: from ``torch.profiler(profile_memory=True)``: every CPU
  allocation and free during one call, on every thread that runs it (the
  caller and gloo's worker threads), ordered by time; the peak of the running
  sum, leaving out the input (the caller holds it) and the output (the
  allocation that is still the result's storage when the call returns: the
  caller asked for it). What is left is every temporary, gloo's own staging
  buffers included (gloo's all-gather stages its whole output in a flat buffer
  of its own and copies it out; its reduce-scatter all-reduces a copy of the
  whole input). In parentheses the same without the allocations made inside
  the backend (inside ``c10d::*`` process-group calls and ``gloo:*`` work
  items): what the caller's own code (our evaluator, DTensor) allocates.
  ``max(in, out)`` is the bound SPEC §6 asks for: the larger of the local
  input and output (docs/benchmarks.md says why the bound is on the memory
  beyond input and output). The maximum of three profiled calls is reported
  (when gloo's threads allocate and free varies a little from call to call).
- **ms**: the median over ``--runs`` timed runs of the maximum over ranks of
  one call's ``time.perf_counter()`` wall time, each run after a barrier,
  ours and DTensor's alternating (ABBA); ``ratio`` is ours / DTensor.

Run it with::

    hostir run benchmarks/redistribute_vs_dtensor.py --nproc 4     # 2x2
    hostir run benchmarks/redistribute_vs_dtensor.py --nproc 8     # 2x2x2 and 2x4
    python benchmarks/redistribute_vs_dtensor.py --nproc 4          # starts the ranks itself

Rank 0 prints one Markdown table per mesh, then how many cases fail each check
against DTensor (more collectives, more bytes received, more bytes to gloo, a
higher peak) or the bound, then one line per such case; ``--help`` lists the
options.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import logging
import math
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

import hostir
from frontend import FusionDefinition, shard_tensor
from hostir import COLLECTIVES, HostIrEvaluator, Mesh
from lowering.redistribution.distribution import parse_notation

# The resharding fusions and programs are test builders (tests/), not library code.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.redistribution_programs import fusion_for, program_for, reference_local  # noqa: E402

MESHES = {4: [(2, 2)], 6: [(2, 3)], 8: [(2, 2, 2), (2, 4)]}
"""The mesh shapes run at each world size (``--mesh`` picks one)."""

CASES = {
    2: [
        ("S0S0", "RR"),  # chained gathers: one Allgather over the flattened team
        ("PP", "RR"),  # one Allreduce over both axes
        ("PP", "S0S0"),  # one ReduceScatter over both axes
        ("S0S1", "S1S0"),  # an axis swap: one CollectivePermute
        ("RS0", "S0R"),  # one CollectivePermute
        ("PS0", "RR"),  # reduce first, then gather
        ("S0R", "RR"),
        ("RR", "S0S1"),  # local slices only
        ("S0R", "S1R"),  # one AllToAll
        ("PR", "RR"),
        ("PR", "S0R"),
        ("S0S1", "RR"),
        ("S1S0", "S0S1"),
        ("S0S0[1,0]", "S0S0"),  # shard order [x, y] -> [y, x]
        ("S0S0[1,0]", "RR"),
        ("S0S0", "S0R"),
        ("PS1", "S0S1"),
        ("S0S0", "S1S1"),
    ],
    3: [
        ("S0S0S0", "RRR"),
        ("PPP", "RRR"),
        ("PPP", "S0S0S0"),
        ("S0S1R", "S1S0R"),
        ("RRS0", "S0RR"),
        ("PS0R", "RRR"),
        ("S0RS0", "RRR"),  # non-adjacent mesh axes: team M0(z, x)
        ("PRP", "RRR"),
        ("S0S1S1", "RRR"),
        ("RRR", "S0S1S0"),
        ("S0RR", "S1RR"),
        ("PRS0", "S0RS0"),
        ("S0S0S1", "S1S1S0"),
        ("S0S0S0[2,1,0]", "S0S0S0"),
        ("PPR", "S0S0R"),
    ],
}
"""Cases by mesh rank (each a source and a target distribution in compact notation)."""

SHAPE = (16, 16)
"""The default tensor shape (``--shape`` sets another)."""

BACKEND_EVENTS = ("c10d::", "gloo:")
"""Profiler events of the backend: process-group entry points and gloo's work items."""


COMMUNICATION_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
"""Dispatcher namespaces of process-group calls: ``c10d`` (what ``torch.distributed``'s
functions call, hence ours) and the functional collectives (what DTensor calls)."""


@dataclass
class Measured:
    """One side of one case on one rank."""

    collectives: int
    sent_bytes: int
    peak_bytes: int
    peak_outside_backend: int
    output_bytes: int
    received_bytes: int = 0
    """Bytes that arrive from other ranks (:func:`received_bytes` summed over the calls)."""


@dataclass(frozen=True)
class ProcessGroupCall:
    """One call into a process group as this rank made it: what :func:`received_bytes`
    needs."""

    kind: str
    """``all_gather``, ``reduce_scatter``, ``all_reduce``, ``all_to_all``, ``broadcast``,
    ``reduce``, ``gather``, ``scatter``, ``send``, ``recv`` or ``barrier``."""
    group_size: int
    group_rank: int
    """This rank's position in the group."""
    nbytes: int = 0
    """all_gather, gather: the bytes each member contributes; reduce_scatter, scatter: the
    bytes each member ends with; all_reduce, broadcast, reduce, recv: the tensor's bytes."""
    root: int | None = None
    """broadcast, reduce, gather, scatter: the root's position in the group."""
    from_each: tuple[int, ...] = ()
    """all_to_all: the bytes that arrive from each member, in group order (this rank's
    own entry stays local)."""


class UnmeasuredCallError(hostir.HostIrError):
    """A process-group call the received-bytes measure has no rule for: the benchmark
    stops rather than count it as nothing (add its op to ``_OPS`` and its kind to
    :func:`received_bytes`)."""


def _ring_share(nbytes: int, group_size: int) -> int:
    """(g - 1) / g of ``nbytes``, rounded up: what a rank receives in one ring pass over a
    tensor of ``nbytes`` cut in g parts (a reduce-scatter or an all-gather of it)."""
    return -(-(group_size - 1) * nbytes // group_size)


def received_bytes(call: ProcessGroupCall) -> int:
    """The bytes that arrive at this rank from other ranks in ``call`` (g the group size,
    n its ``nbytes``; what a bandwidth-optimal algorithm moves, whatever the backend does):

    - all_gather (n contributed by each): (g - 1) n; reduce_scatter (n the result of each):
      (g - 1) n;
    - all_reduce of n: 2 (g - 1) n / g (a ring: a reduce-scatter then an all-gather);
    - all_to_all: what the other members send this rank (``from_each`` less its own);
    - broadcast of n, scatter of n to each: n on the other members, 0 on the root;
    - gather of n from each: (g - 1) n on the root, 0 elsewhere;
    - reduce of n: 2 (g - 1) n / g on the root, (g - 1) n / g elsewhere (a ring
      reduce-scatter, then the root gathers the reduced parts);
    - recv of n: n; send and barrier: 0.
    """
    g, n, me = call.group_size, call.nbytes, call.group_rank
    at_root = me == call.root
    match call.kind:
        case "all_gather" | "reduce_scatter":
            return (g - 1) * n
        case "all_reduce":
            return 2 * _ring_share(n, g)
        case "all_to_all":
            return sum(call.from_each) - call.from_each[me]
        case "broadcast" | "scatter":
            return 0 if at_root else n
        case "gather":
            return (g - 1) * n if at_root else 0
        case "reduce":
            return (2 if at_root else 1) * _ring_share(n, g)
        case "recv":
            return n
        case "send" | "barrier":
            return 0
    raise UnmeasuredCallError(
        f"received bytes: no formula for a {call.kind!r} call; add one to received_bytes"
    )


_OPS = {
    # c10d (torch.distributed's functions: ours): op -> (kind, argument that gives nbytes)
    "c10d::_allgather_base_": ("all_gather", "input_tensor"),
    "c10d::allgather_": ("all_gather", "input_tensors"),
    "c10d::allgather_coalesced_": ("all_gather", "input_list"),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", "inputs"),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", "output_tensor"),
    "c10d::reduce_scatter_": ("reduce_scatter", "output_tensors"),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", "outputs"),
    "c10d::allreduce_": ("all_reduce", "tensors"),
    "c10d::allreduce_coalesced_": ("all_reduce", "tensors"),
    "c10d::alltoall_": ("all_to_all", "output_tensors"),
    "c10d::alltoall_base_": ("all_to_all", "output"),
    "c10d::broadcast_": ("broadcast", "tensors"),
    "c10d::reduce_": ("reduce", "tensors"),
    "c10d::gather_": ("gather", "input_tensors"),
    "c10d::scatter_": ("scatter", "output_tensors"),
    "c10d::send": ("send", None),
    "c10d::recv_": ("recv", "tensors"),
    "c10d::recv_any_source_": ("recv", "tensors"),
    "c10d::barrier": ("barrier", None),
    "c10d::monitored_barrier_": ("barrier", None),
    # functional collectives (DTensor's); a reduce-scatter's nbytes is its input / g
    "all_gather_into_tensor": ("all_gather", "input"),
    "all_gather_into_tensor_out": ("all_gather", "input"),
    "all_gather_into_tensor_coalesced": ("all_gather", "inputs"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_tensor_out": ("reduce_scatter", "input"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "inputs"),
    "all_reduce": ("all_reduce", "input"),
    "all_reduce_": ("all_reduce", "input"),
    "all_reduce_coalesced": ("all_reduce", "inputs"),
    "all_reduce_coalesced_": ("all_reduce", "inputs"),
    "all_to_all_single": ("all_to_all", "input"),
    "broadcast": ("broadcast", "input"),
    "broadcast_": ("broadcast", "input"),
    "isend": ("send", None),
    "irecv": ("recv", "tensor"),
}
"""How each process-group op maps to a :class:`ProcessGroupCall` (functional ops by their
name without the namespace: ``_c10d_functional`` and ``_c10d_functional_autograd`` alike)."""

_NOT_COMMUNICATION = {"wait_tensor", "_wrap_tensor_autograd", "check_for_nan"}
"""Ops of those namespaces that move nothing."""


def _nbytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


def _process_group(named: dict) -> dist.ProcessGroup:
    group = named.get("process_group", named.get("group_name"))
    if isinstance(group, str):
        return _resolve_process_group(group)
    return group if isinstance(group, dist.ProcessGroup) else dist.ProcessGroup.unbox(group)


def _from_each(tensor: torch.Tensor, splits: list, group_size: int, total: int) -> tuple:
    """Bytes per member of an all-to-all with ``splits`` rows along dim 0 (of ``tensor``'s
    row size); equal parts of ``total`` without splits."""
    if not splits:
        return (total // group_size,) * group_size
    row = math.prod(tensor.shape[1:]) * tensor.element_size()
    return tuple(int(s) * row for s in splits)


_ROOTED = ("broadcast", "reduce", "gather", "scatter")
"""Kinds of call with a root (``root_rank`` in ``c10d``, ``src`` in the functional ops)."""


def _process_group_calls(func: object, args: tuple, kwargs: dict) -> list[ProcessGroupCall]:
    """The process-group calls one dispatched op makes on this rank (several for a batch
    of point-to-point operations); none for an op that moves nothing."""
    op = func._schema.name
    key = op if op.startswith("c10d::") else op.split("::")[1]
    if key in _NOT_COMMUNICATION:
        return []
    if key not in _OPS and key != "batch_p2p_ops":
        raise UnmeasuredCallError(
            f"received bytes: no rule for the process-group op {op}; map it to a kind in _OPS"
        )
    named = dict(zip((a.name for a in func._schema.arguments), args, strict=False))
    named.update(kwargs)
    group = _process_group(named)
    size, rank = group.size(), group.rank()
    if key == "batch_p2p_ops":  # functional: one op per (kind, peer, tag, tensor)
        pairs = zip(named["op_list"], named["tensors"], strict=True)
        return [
            ProcessGroupCall("recv", size, rank, _nbytes(t))
            if kind == "irecv"
            else ProcessGroupCall("send", size, rank)
            for kind, t in pairs
        ]
    kind, argument = _OPS[key]
    nbytes = _nbytes(named[argument]) if argument else 0
    if kind == "reduce_scatter" and not key.startswith("c10d::"):
        nbytes //= size  # the functional op names its input
    root = named.get("root_rank", named.get("src")) if kind in _ROOTED else None
    from_each = ()
    if kind == "all_to_all":
        tensor = named[argument]
        if isinstance(tensor, list):  # c10d::alltoall_: one output tensor per member
            from_each = tuple(_nbytes(t) for t in tensor)
        else:
            from_each = _from_each(tensor, named["output_split_sizes"], size, nbytes)
    return [ProcessGroupCall(kind, size, rank, nbytes, root, from_each)]


class ProcessGroupRecorder(TorchDispatchMode):
    """While active, records every process-group call made on this thread as a
    :class:`ProcessGroupCall`: the ``c10d`` ops that ``torch.distributed``'s functions
    dispatch (ours) and the functional collectives (DTensor's), each with its tensors and
    its group's size and this rank's position in it. A functional collective's own
    ``c10d`` call runs inside the mode's handler, where the mode is off, so no call is
    counted twice."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[ProcessGroupCall] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace in COMMUNICATION_NAMESPACES:
            self.calls.extend(_process_group_calls(func, args, kwargs))
        return func(*args, **kwargs)


@dataclass
class Row:
    """One case's results (maxima over ranks)."""

    mesh: str
    case: str
    ours_program_collectives: int
    ours: Measured
    dtensor: Measured
    bound_bytes: int
    ours_ms: float
    dtensor_ms: float

    @property
    def ratio(self) -> float:
        """Ours / DTensor wall time."""
        return self.ours_ms / self.dtensor_ms


def _walk(events: list, in_backend: bool = False) -> Iterator[tuple[object, bool]]:
    """Every event of a profiler tree, with whether it runs inside the backend: a
    ``c10d::*`` process-group call or a ``gloo:*`` work item."""
    for event in events:
        yield event, in_backend
        inside = in_backend or event.name.startswith(BACKEND_EVENTS)
        yield from _walk(event.children, inside)


def _bytes(metadata: object) -> int:
    if isinstance(metadata, list):
        return sum(_bytes(m) for m in metadata)
    sizes = getattr(metadata, "sizes", None)
    if sizes is None:
        return 0
    return math.prod(sizes) * torch.empty((), dtype=metadata.dtype).element_size()


def profiled(call: Callable[[], object]) -> Measured:
    """Collectives, bytes handed to gloo and peak extra memory of one ``call`` (see the
    module docstring)."""
    gc.collect()
    activities = [ProfilerActivity.CPU]
    with profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
        result = call()
    output_ptr = result.untyped_storage().data_ptr()
    output_bytes = result.numel() * result.element_size()
    del result
    tree = prof.profiler.kineto_results.experimental_event_tree()
    allocations, sent, counts = [], 0, {"send": 0, "recv": 0, "other": 0}
    for event, in_backend in _walk(tree):
        fields = event.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation":
            allocations.append((event.start_time_ns, fields.alloc_size, in_backend, fields.ptr))
        elif event.name.startswith("gloo:"):
            kind = event.name[len("gloo:") :]
            counts[kind if kind in ("send", "recv") else "other"] += 1
            if kind != "recv":
                sent += sum(_bytes(i) for i in getattr(fields, "inputs", []))
    allocations = _without_output(sorted(allocations), output_ptr, output_bytes)
    collectives = counts["other"] + max(counts["send"], counts["recv"])
    return Measured(
        collectives=collectives,
        sent_bytes=sent,
        peak_bytes=_peak(allocations),
        peak_outside_backend=_peak([a for a in allocations if not a[2]]),
        output_bytes=output_bytes,
    )


def _without_output(allocations: list[tuple], output_ptr: int, output_bytes: int) -> list[tuple]:
    """``allocations`` (in time order) less the output's ``output_bytes``: taken off the last
    allocation of the buffer the result lives in (never freed during the call: the result
    outlives it). When the result is a view of a larger buffer, the rest of that buffer
    still counts as extra."""
    for index in reversed(range(len(allocations))):
        time_ns, size, in_backend, ptr = allocations[index]
        if ptr == output_ptr and size > 0:
            kept = (time_ns, size - output_bytes, in_backend, ptr)
            return [*allocations[:index], kept, *allocations[index + 1 :]]
    return allocations  # the result is (a view of) the input: nothing was allocated for it


def _peak(allocations: list[tuple]) -> int:
    """The peak of the running sum of allocations (+) and frees (-) in time order."""
    live = peak = 0
    for _, size, *_ in sorted(allocations):
        live += size
        peak = max(peak, live)
    return peak


def _worst(measures: Iterator[Measured]) -> Measured:
    """The field-wise maximum of several profiled calls (gloo's threads make the timing
    of allocations, hence the peak, vary a little from call to call)."""
    rows = [dataclasses.astuple(m) for m in measures]
    return Measured(*(max(column) for column in zip(*rows, strict=True)))


def received(call: Callable[[], torch.Tensor], expected: torch.Tensor, gloo_calls: int) -> int:
    """The bytes that arrive at this rank from other ranks in one ``call``: every
    process-group call it makes, recorded by a :class:`ProcessGroupRecorder` (a call of its
    own, not profiled or timed), summed through :func:`received_bytes`. Checks that the
    recorded call computed ``expected`` and that it recorded calls where the profiler saw
    ``gloo_calls`` gloo events (a call made on another thread would escape the recorder)."""
    recorder = ProcessGroupRecorder()
    with recorder:
        result = call()
    if not torch.equal(result, expected):
        raise AssertionError("the recorded call computed another result")
    moving = [c for c in recorder.calls if c.kind != "barrier"]
    if gloo_calls and not moving:
        raise AssertionError(f"{gloo_calls} gloo events but no process-group call recorded")
    return sum(received_bytes(c) for c in recorder.calls)


def timed(call: Callable[[], object]) -> float:
    """One call's wall time in ms, the maximum over ranks, after a barrier."""
    dist.barrier()
    start = time.perf_counter()
    result = call()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    del result
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed) * 1e3


def _max_over_ranks(values: list[int]) -> list[int]:
    tensor = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.tolist()]


def _integers(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 8, shape, generator=generator).to(torch.float32)


def measure(
    mesh_shape: tuple[int, ...],
    dmesh: object,
    src_text: str,
    dst_text: str,
    seed: int,
    runs: int,
    shape: tuple[int, ...] = SHAPE,
) -> Row:
    """Checks and measures one case on this rank; returns the maxima over ranks."""
    rank = dist.get_rank()
    mesh = Mesh(devices=tuple(range(math.prod(mesh_shape))), shape=mesh_shape)
    src, dst = parse_notation(src_text, mesh), parse_notation(dst_text, mesh)
    fd = fusion_for(src, dst, shape)
    program = program_for(src, dst, shape)
    parts = math.prod(mesh.axis_size(p.axis) for p in src.partial)
    values = _integers((parts, *shape) if src.partial else shape, seed)
    full = values.sum(0) if src.partial else values
    fusion_input = shard_tensor(values, fd.host_ir().inputs[0], rank)
    local = fusion_input.squeeze(0) if src.partial else fusion_input
    evaluator = HostIrEvaluator(program, communicator=hostir.default_communicator())
    dtensor = DTensor.from_local(
        local, dmesh, src.to_placements(), run_check=False, shape=full.shape, stride=full.stride()
    )
    placements = dst.to_placements()

    def ours() -> torch.Tensor:
        return evaluator.run([local])[0]

    def theirs() -> torch.Tensor:
        return dtensor.redistribute(dmesh, placements).to_local()

    expected = reference_local(full, dst, rank)
    (via_fusion,) = fd.execute([fusion_input])
    results = {"ours": ours(), "DTensor": theirs(), "fusion": via_fusion}
    for name, result in results.items():
        if not torch.equal(result, expected):
            raise AssertionError(
                f"{src_text} -> {dst_text} on {mesh_shape}, rank {rank}: {name} differs from the"
                f" single-device reference:\n{result}\nexpected\n{expected}"
            )
    del results, via_fusion
    mine, other = (
        _worst(profiled(ours) for _ in range(3)),
        _worst(profiled(theirs) for _ in range(3)),
    )
    mine = dataclasses.replace(mine, received_bytes=received(ours, expected, mine.collectives))
    other = dataclasses.replace(other, received_bytes=received(theirs, expected, other.collectives))
    times: dict[str, list[float]] = {"ours": [], "DTensor": []}
    for run in range(runs):
        order = [("ours", ours), ("DTensor", theirs)]
        for name, call in order if run % 2 == 0 else reversed(order):
            times[name].append(timed(call))
    bound = max(local.numel(), expected.numel()) * local.element_size()
    fields = [dataclasses.astuple(mine), dataclasses.astuple(other)]
    maxima = _max_over_ranks([*fields[0], *fields[1], bound])
    n = len(fields[0])
    written = sum(isinstance(i, tuple(COLLECTIVES)) for i in program.body)
    return Row(
        mesh="x".join(map(str, mesh_shape)),
        case=f"{src_text} → {dst_text}",
        ours_program_collectives=written,
        ours=Measured(*maxima[:n]),
        dtensor=Measured(*maxima[n : 2 * n]),
        bound_bytes=maxima[2 * n],
        ours_ms=statistics.median(times["ours"]),
        dtensor_ms=statistics.median(times["DTensor"]),
    )


def table(rows: list[Row]) -> str:
    """The Markdown table of one mesh's rows."""
    lines = [
        "| mesh | case | ours coll. (program / gloo) | DTensor coll. | ours recv | DTensor recv"
        " | recv ≤ DTensor | ours to gloo | DTensor to gloo | out"
        " | ours peak extra (outside backend) | DTensor peak extra (outside backend)"
        " | max(in, out) | ours ms | DTensor ms | ours/DTensor |",
        "|---|---|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.mesh} | {r.case} | {r.ours_program_collectives} / {r.ours.collectives}"
            f" | {r.dtensor.collectives} | {r.ours.received_bytes} | {r.dtensor.received_bytes}"
            f" | {'yes' if r.ours.received_bytes <= r.dtensor.received_bytes else '**no**'}"
            f" | {r.ours.sent_bytes} | {r.dtensor.sent_bytes} | {r.ours.output_bytes}"
            f" | {r.ours.peak_bytes} ({r.ours.peak_outside_backend})"
            f" | {r.dtensor.peak_bytes} ({r.dtensor.peak_outside_backend}) | {r.bound_bytes}"
            f" | {r.ours_ms:.3f} | {r.dtensor_ms:.3f} | {r.ratio:.2f} |"
        )
    return "\n".join(lines)


def findings(rows: list[Row]) -> list[str]:
    """One line per case where ours issues more collectives than DTensor, receives or
    hands gloo more bytes per rank, peaks higher than DTensor, or exceeds the memory bound;
    empty when there are none."""
    notes = []
    for r in rows:
        ours, theirs = r.ours, r.dtensor
        why = []
        if ours.collectives > theirs.collectives:
            why.append(f"{ours.collectives} collectives against {theirs.collectives}")
        if ours.received_bytes > theirs.received_bytes:
            why.append(
                f"{ours.received_bytes} bytes received per rank against {theirs.received_bytes}"
            )
        if ours.sent_bytes > theirs.sent_bytes:
            why.append(f"{ours.sent_bytes} bytes to gloo against {theirs.sent_bytes}")
        if ours.peak_bytes > theirs.peak_bytes:
            why.append(f"peak extra {ours.peak_bytes} B against {theirs.peak_bytes} B")
        if ours.peak_outside_backend > r.bound_bytes:  # the plan's own (SPEC §6)
            why.append(
                f"peak extra outside the backend {ours.peak_outside_backend} B over"
                f" max(in, out) = {r.bound_bytes} B"
            )
        if why:
            notes.append(f"{r.mesh} {r.case}: " + "; ".join(why))
    return notes


def counts(rows: list[Row]) -> list[tuple[str, int]]:
    """How many of ``rows`` fail each check against DTensor and the bound."""
    checks = [
        (
            "our program issues more collective instructions than DTensor's gloo calls",
            lambda r: r.ours_program_collectives > r.dtensor.collectives,
        ),
        (
            "gloo records more calls for ours than for DTensor",
            lambda r: r.ours.collectives > r.dtensor.collectives,
        ),
        (
            "bytes received per rank (busiest rank): ours above DTensor",
            lambda r: r.ours.received_bytes > r.dtensor.received_bytes,
        ),
        (
            "bytes handed to gloo per rank: ours above DTensor",
            lambda r: r.ours.sent_bytes > r.dtensor.sent_bytes,
        ),
        (
            "peak extra (backend included): ours above DTensor",
            lambda r: r.ours.peak_bytes > r.dtensor.peak_bytes,
        ),
        (
            "allocations outside the backend above max(in, out)",
            lambda r: r.ours.peak_outside_backend > r.bound_bytes,
        ),
    ]
    return [(what, sum(1 for r in rows if fails(r))) for what, fails in checks]


def counts_table(rows: list[Row]) -> str:
    """The Markdown table of :func:`counts`."""
    lines = [f"| counted over {len(rows)} cases | cases |", "|---|---:|"]
    lines += [f"| {what} | {n} |" for what, n in counts(rows)]
    return "\n".join(lines)


def sweep_pairs(k: int, per_source: int = 0) -> list[tuple[str, str]]:
    """Every source in {R, S0, S1, P}^k with every target in {R, S0, S1}^k; with
    ``per_source``, that many targets per source, spread so that every target is taken
    (the pairs ``tests/lowering/test_redistribution_sweep.py`` runs on 2x2x2 for 2)."""
    sources = ["".join(p) for p in itertools.product(["R", "S0", "S1", "P"], repeat=k)]
    targets = ["".join(p) for p in itertools.product(["R", "S0", "S1"], repeat=k)]
    if not per_source:
        return list(itertools.product(sources, targets))
    n = len(targets)
    return [
        (src, targets[(i * 10 + j * 13) % n])
        for i, src in enumerate(sources)
        for j in range(per_source)
    ]


def _placements(notation: str) -> int:
    """How many mesh dims a compact notation like ``S0S0[1,0]`` or ``PRS0`` places."""
    return len(re.findall(r"S\d+|R|P", notation.split("[")[0]))


def fusion(world_size: int = 4) -> FusionDefinition:
    """For ``hostir dump``/``viz``: the first case on the first mesh of ``world_size``."""
    shape = MESHES.get(world_size, [(world_size,)])[0]
    mesh = Mesh(devices=tuple(range(math.prod(shape))), shape=shape)
    src, dst = CASES[len(shape)][0] if len(shape) in CASES else ("S0", "R")
    return fusion_for(parse_notation(src, mesh), parse_notation(dst, mesh), SHAPE)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21, help="timed runs per case and side")
    parser.add_argument(
        "--cases", default="", help="comma-separated 'SRC->DST' cases (default: all for the mesh)"
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="every pair {R,S0,S1,P}^k -> {R,S0,S1}^k of the mesh (k its rank) instead of the"
        " listed cases",
    )
    parser.add_argument(
        "--mesh", default="", help="one mesh of the world size, e.g. 2x4 (default: all of them)"
    )
    parser.add_argument(
        "--per-source",
        type=int,
        default=0,
        help="with --sweep: this many targets per source, every target taken (default: all)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--shape",
        default="x".join(map(str, SHAPE)),
        help="the tensor's shape, e.g. 256x256 (every dim divisible by the mesh's size;"
        " 24x24 on 2x3)",
    )
    parser.add_argument(
        "--nproc", type=int, default=4, help="ranks to start when no launcher started this"
    )
    return parser.parse_args(argv)


def _quiet() -> None:
    """DTensor warns on every multi-step redistribution; the table says it all."""
    for name in ("torch.distributed.tensor._redistribute", "torch._logging._internal"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger("torch.distributed.tensor").setLevel(logging.ERROR)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        from hostir.comm import launcher  # no launcher: start the ranks ourselves

        return launcher.launch(sys.argv[0], args.nproc, list(argv))
    torch.set_num_threads(args.threads)
    _quiet()
    communicator = hostir.default_communicator()  # joins the gloo group
    rank, world = communicator.rank, communicator.world_size
    meshes = [m for m in MESHES.get(world, []) if args.mesh in ("", "x".join(map(str, m)))]
    if not meshes:
        raise SystemExit(f"run at world size 4, 6 or 8 (meshes {MESHES}), not {world} {args.mesh}")
    wanted = [tuple(c.split("->")) for c in args.cases.split(",") if c]
    shape = tuple(int(n) for n in args.shape.split("x"))
    started = time.perf_counter()
    tables = []
    for mesh_shape in meshes:
        dmesh = init_device_mesh("cpu", mesh_shape)
        # --cases: those written for this mesh's rank (one placement per mesh dim).
        cases = [c for c in wanted if _placements(c[0]) == len(mesh_shape)] if wanted else None
        cases = cases if wanted else CASES[len(mesh_shape)]
        if args.sweep:
            cases = sweep_pairs(len(mesh_shape), args.per_source)
        if not cases:
            continue
        rows = [
            measure(mesh_shape, dmesh, src, dst, seed, args.runs, shape)
            for seed, (src, dst) in enumerate(cases)
        ]
        tables.append((mesh_shape, rows))
    if rank == 0:
        for mesh_shape, rows in tables:
            print(f"Mesh {'x'.join(map(str, mesh_shape))}, float32 {list(shape)}:")
            print()
            print(table(rows))
            print()
            print(counts_table(rows))
            print()
            notes = findings(rows)
            print(
                "Ours worse than DTensor or over the bound:"
                if notes
                else "No case where ours issues more collectives, receives or hands gloo more"
                " bytes than DTensor or exceeds max(in, out)."
            )
            for note in notes:
                print(f"- {note}")
            print()
        print(
            f"command: hostir run benchmarks/redistribute_vs_dtensor.py --nproc {world}"
            + (f" -- {' '.join(argv)}" if argv else "")
        )
        print(
            f"torch {torch.__version__}, backend {dist.get_backend()}, world size {world},"
            f" {args.threads} thread(s) per rank, {os.cpu_count()} CPU(s),"
            f" Python {platform.python_version()}, {args.runs} timed runs per side,"
            f" {time.perf_counter() - started:.0f} s"
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
