"""What each collective sends and receives: one semantic function per collective.

:func:`exchange` gives, for one group of a communication's team at one
iteration, its :class:`Flow` s: every rank of ``sources`` sends ``elements``
elements of a tensor to every rank of ``destinations`` (a rank never sends to
itself, except a one-to-one flow from a rank to itself: a local copy). The
functions are written once, in :data:`EXCHANGES`, and read by the traffic
picture (:mod:`hostir.viz.traffic_dot`) and the static traffic count
(:mod:`hostir.analysis.traffic`); a collective defined outside ``hostir`` adds its own
with :func:`register_exchange`.

The model is the logical exchange, bandwidth-optimal where the collective
leaves the algorithm open: an ``Allreduce`` is a reduce-scatter then an
all-gather (each rank receives ``2 (n - 1) / n`` of its buffer), which is what
ring and tree implementations move per rank. A flow is a compact description:
an all-gather over ``n`` ranks is one flow, not ``n (n - 1)`` transfers, so
counting traffic on 4096 ranks stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hostir.analysis.boxes import Operand, print_box, volume
from hostir.analysis.member_exchanges import group_pieces
from hostir.errors import HostIrError
from hostir.ir.communications import (
    Allgather,
    Allreduce,
    AllToAll,
    AllToAllV,
    Broadcast,
    CollectivePermute,
    Gather,
    RaggedAllToAll,
    Reduce,
    ReduceScatter,
    Scatter,
    SendRecv,
)
from hostir.ir.scalars import RANK, Scalar, evaluate_scalar
from hostir.ir.values import TensorValue

Group = tuple[int, ...]
"""The ranks of one group of a team, in team order (position ``p`` is ``group[p]``)."""

Env = Mapping[str, int]
"""Loop indices and symbolic extents by name."""


@dataclass(frozen=True)
class Flow:
    """Every rank of ``sources`` sends ``elements`` elements (``what``, e.g. ``T0 chunk 1``)
    to every rank of ``destinations`` but itself."""

    sources: Group
    destinations: Group
    elements: int | None  # None: the extents are symbolic and not bound in the env
    what: str

    @property
    def local_copy(self) -> bool:
        """A rank's copy to itself (a CollectivePermute whose peer is the rank)."""
        return len(self.sources) == 1 and self.sources == self.destinations

    def transfers(self) -> list[tuple[int, int]]:
        """The (sender, receiver) pairs of this flow, local copies excluded."""
        return [(s, d) for s in self.sources for d in self.destinations if s != d]


Exchange = Callable[[Any, Group, Env], list[Flow]]
"""A collective's semantic function: its flows within one group at one iteration."""

EXCHANGES: dict[type, Exchange] = {}
"""The semantic function of each collective class."""


def register_exchange(cls: type) -> Callable[[Exchange], Exchange]:
    """Decorator: ``fn`` is the semantic function of collective class ``cls``."""

    def register(fn: Exchange) -> Exchange:
        EXCHANGES[cls] = fn
        return fn

    return register


def exchange(instruction: Any, group: Group, env: Env) -> list[Flow]:
    """The flows of ``instruction`` within ``group`` at the iteration ``env``."""
    fn = EXCHANGES.get(type(instruction))
    if fn is None:
        raise HostIrError(
            f"{type(instruction).__name__} has no exchange function; define one with"
            " hostir.analysis.exchanges.register_exchange"
        )
    return fn(instruction, group, env)


def busiest_received(instruction: Any, group: Group, env: Env) -> int | None:
    """The most elements one member of ``group`` receives in ``instruction`` (copies to
    itself not counted); None when a flow's extents are symbolic."""
    received: dict[int, int] = {}
    for flow in exchange(instruction, group, env):
        if flow.elements is None:
            return None
        if flow.local_copy:
            continue
        sources = set(flow.sources)
        for d in flow.destinations:
            received[d] = received.get(d, 0) + flow.elements * (len(sources) - (d in sources))
    return max(received.values(), default=0)


def local_elements(value: TensorValue, env: Env) -> int | None:
    """The number of elements of ``value``'s local buffer, its extents evaluated in
    ``env``; None when a symbolic extent is not bound there."""
    if value.sharding is None:
        extents = value.shape
    else:
        extents = tuple(p.extent for parts in value.sharding.dims for p in parts if p.axis is None)
    try:
        return math.prod(int(evaluate_scalar(e, env)) for e in extents)
    except HostIrError:
        return None


def _part(elements: int | None, count: int) -> int | None:
    return None if elements is None else elements // count


def member_at(expr: Scalar, member: int, env: Env, group: Group) -> int:
    """The rank at team position ``expr``, evaluated on rank ``member``."""
    position = int(evaluate_scalar(expr, {**env, RANK: member}))
    if not 0 <= position < len(group):
        raise HostIrError(f"position {position} is outside the group {list(group)}")
    return group[position]


def _chunks(c: Any, group: Group, env: Env, reduced: bool) -> list[Flow]:
    """Chunk ``p`` of every member's ``src`` to the member at position ``p``."""
    size = _part(local_elements(c.src, env), len(group))
    suffix = f" ({c.op.value})" if reduced else ""
    return [Flow(group, (q,), size, f"{c.src.name} chunk {p}{suffix}") for p, q in enumerate(group)]


@register_exchange(Allgather)
def _allgather(c: Allgather, group: Group, env: Env) -> list[Flow]:
    return [Flow(group, group, local_elements(c.src, env), c.src.name)]


@register_exchange(AllToAll)
def _all_to_all(c: AllToAll, group: Group, env: Env) -> list[Flow]:
    return _chunks(c, group, env, reduced=False)


@register_exchange(ReduceScatter)
def _reduce_scatter(c: ReduceScatter, group: Group, env: Env) -> list[Flow]:
    return _chunks(c, group, env, reduced=True)


@register_exchange(Allreduce)
def _allreduce(c: Allreduce, group: Group, env: Env) -> list[Flow]:
    """A reduce-scatter of chunks, then an all-gather of the reduced chunks."""
    size = _part(local_elements(c.src, env), len(group))
    return _chunks(c, group, env, reduced=True) + [
        Flow((q,), group, size, f"{c.src.name} chunk {p} (reduced)") for p, q in enumerate(group)
    ]


@register_exchange(Broadcast)
def _broadcast(c: Broadcast, group: Group, env: Env) -> list[Flow]:
    root = member_at(c.root, group[0], env, group)
    return [Flow((root,), group, local_elements(c.src, env), c.src.name)]


@register_exchange(Scatter)
def _scatter(c: Scatter, group: Group, env: Env) -> list[Flow]:
    root = member_at(c.root, group[0], env, group)
    size = _part(local_elements(c.src, env), len(group))
    return [Flow((root,), (q,), size, f"{c.src.name} chunk {p}") for p, q in enumerate(group)]


@register_exchange(Gather)
def _gather(c: Gather, group: Group, env: Env) -> list[Flow]:
    root = member_at(c.root, group[0], env, group)
    return [Flow(group, (root,), local_elements(c.src, env), c.src.name)]


@register_exchange(Reduce)
def _reduce(c: Reduce, group: Group, env: Env) -> list[Flow]:
    root = member_at(c.root, group[0], env, group)
    return [Flow(group, (root,), local_elements(c.src, env), f"{c.src.name} ({c.op.value})")]


@register_exchange(SendRecv)
def _send_recv(c: SendRecv, group: Group, env: Env) -> list[Flow]:
    sender, receiver = (member_at(p, group[0], env, group) for p in (c.sender, c.receiver))
    return [Flow((sender,), (receiver,), local_elements(c.src, env), c.src.name)]


@register_exchange(CollectivePermute)
def _permute(c: CollectivePermute, group: Group, env: Env) -> list[Flow]:
    size = local_elements(c.src, env)
    return [Flow((r,), (member_at(c.send_peer, r, env, group),), size, c.src.name) for r in group]


@register_exchange(AllToAllV)
def _all_to_all_v(c: AllToAllV, group: Group, env: Env) -> list[Flow]:
    """The boxes the exchange moves (``T0 [0:4, 2:4]``), from the two block layouts."""
    if c.src.sharding is None or c.out.sharding is None:
        raise HostIrError(f"AllToAllV of {c.src.name}: both operands need a sharding")
    suffix = f" ({c.op.value})" if c.op is not None else ""
    try:
        src, out = (
            Operand(v.name, v.sharding, tuple(int(evaluate_scalar(e, env)) for e in v.shape))
            for v in (c.src, c.out)
        )
    except HostIrError:  # the pattern needs the global extents: every pair may exchange
        return [Flow(group, group, None, c.src.name + suffix)]
    pieces = group_pieces(src, out, c.team, group, c.op is not None)
    return [
        Flow(
            (group[p.source],),
            (group[p.destination],),
            volume(p.box),
            f"{c.src.name} {print_box(p.box)}{suffix}",
        )
        for p in pieces
    ]


UNIFORM_ROUTING = "uniform routing assumed"
"""What a RaggedAllToAll's flows say of themselves: its counts are known only at run time."""


@register_exchange(RaggedAllToAll)
def _ragged_all_to_all(c: RaggedAllToAll, group: Group, env: Env) -> list[Flow]:
    """The counts are read at run time, so the count assumes *uniform routing*: each member
    sends an equal share of its rows to every member (itself included), as a balanced
    router does; a run-time extent its rows read (the way back's ``n0``) is taken from
    ``env`` (``hostir traffic --bind n0=...``), else the flow is symbolic."""
    share = _part(local_elements(c.src, env), len(group))
    return [Flow(group, group, share, f"{c.src.name} ({UNIFORM_ROUTING})")]
