"""Communication instructions: collectives over teams, point-to-point, and waits.

Every communication reads ``src`` (this rank's local buffer, absent on ranks
that do not hold it), fills ``out`` and defines a ``request``: the
communication is posted asynchronously and ``out`` is valid only after the
``Wait`` of that request. It runs on the ranks of its team's mesh; each rank
uses the group of the team it belongs to. Roots, senders and receivers are
positions inside the group (scalar expressions).

Tensor-dim semantics: a gather along ``axis`` views the local dim as
``[outer, inner]`` (``inner`` None: the whole dim, ``outer`` 1) and produces
``[outer, team size, inner]`` flattened, group position as the middle digit; a
scatter or reduce-scatter is the inverse. When ``axis`` is not outermost the
evaluator packs and unpacks, so any axis works.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import COMMUNICATING, Kind, classes_of_kind, declare
from hostir.ir.scalars import Scalar, Symbol
from hostir.ir.sharding import MeshAxis, ReduceOp
from hostir.ir.team import Team
from hostir.ir.values import HostValue, RequestValue, TensorValue


@declare(kind=Kind.COLLECTIVE, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Allgather:
    """Every member gets all members' ``src`` concatenated along ``axis``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    team: Team
    axis: int
    inner: Scalar | None = None
    request: RequestValue
    preallocated: bool = False


@declare(kind=Kind.COLLECTIVE, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class ReduceScatter:
    """Reduce ``src`` over the group with ``op``; member p keeps chunk p along ``axis``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    team: Team
    axis: int
    inner: Scalar | None = None
    op: ReduceOp = ReduceOp.SUM
    request: RequestValue
    preallocated: bool = False


@declare(kind=Kind.COLLECTIVE, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Allreduce:
    """Every member gets the ``op``-reduction of all members' ``src``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    team: Team
    op: ReduceOp = ReduceOp.SUM
    request: RequestValue
    preallocated: bool = False


@declare(kind=Kind.COLLECTIVE, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Broadcast:
    """Every member gets the ``src`` of the member at position ``root``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src", "root")
    out: TensorValue
    src: TensorValue
    team: Team
    root: Scalar
    request: RequestValue
    preallocated: bool = False


@declare(kind=Kind.COLLECTIVE, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Reduce:
    """The member at ``root`` gets the ``op``-reduction of all members' ``src``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src", "root")
    out: TensorValue
    src: TensorValue
    team: Team
    root: Scalar
    op: ReduceOp = ReduceOp.SUM
    request: RequestValue
    preallocated: bool = False


@declare(kind=Kind.COLLECTIVE, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Gather:
    """The member at ``root`` gets all members' ``src`` concatenated along ``axis``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src", "root")
    out: TensorValue
    src: TensorValue
    team: Team
    axis: int
    root: Scalar
    request: RequestValue
    preallocated: bool = False


@declare(kind=Kind.COLLECTIVE, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Scatter:
    """Member p gets chunk p along ``axis`` of the ``src`` of the member at ``root``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src", "root")
    out: TensorValue
    src: TensorValue
    team: Team
    axis: int
    root: Scalar
    request: RequestValue
    preallocated: bool = False


@declare(kind=Kind.COLLECTIVE, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class AllToAll:
    """Member p sends chunk q of ``src`` along ``split_axis`` to member q, and
    concatenates what it receives along ``concat_axis`` in member order."""

    OUTS: ClassVar[tuple[str, ...]] = ("out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    team: Team
    split_axis: int
    concat_axis: int
    request: RequestValue
    preallocated: bool = False


@declare(kind=Kind.COLLECTIVE, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class AllToAllV:
    """MPI's alltoallv, driven by the block layouts of ``src`` and ``out`` (same mesh).

    Every member's ``out`` block receives, from the members whose ``src`` block
    overlaps it, the overlapping boxes of the global tensor; among replicas of a
    ``src`` block the member agreeing with the receiver on every team axis that
    neither shards ``src`` nor is reduced sends it. With ``op``, ``src`` may be
    partial over team axes ``out`` is not partial over: the pieces of the
    partial sums are combined with ``op`` in member order (replicas stay bitwise
    equal). ``rounds`` (default one) makes it that many alltoallv calls, each moving
    a slab of every piece, so that a member's buffers stay within its larger block
    (the planner picks the fewest that do). See :mod:`hostir.analysis.member_exchanges` for
    the pattern, :mod:`hostir.run.all_to_all_v` for the run time."""

    OUTS: ClassVar[tuple[str, ...]] = ("out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    team: Team
    request: RequestValue
    op: ReduceOp | None = None
    rounds: int | None = None
    preallocated: bool = False


@declare(kind=Kind.COLLECTIVE, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class RaggedAllToAll:
    """An all-to-all of rows whose counts are known only at run time (XLA's
    ragged-all-to-all, torch's ``all_to_all_single`` with split sizes): the dispatch and
    combine of an expert-parallel layer.

    ``counts`` is a host int64 ``[P, P]`` over the team's group positions (``to_host``):
    member p sends ``counts[p][q]`` rows to member q; with ``transpose``, ``counts[q][p]``
    (the way back). Rows run along dim ``axis`` (the dims before it hold one element on
    each member: a ``[D, rows, ...]`` tensor split over the team on dim 0). ``src``'s rows
    are grouped by receiver in member order; ``out``'s rows are what each member sent, in
    member order; the other dims are ``src``'s. The number of rows this member receives is
    bound to the symbol ``received``, which ``out``'s dim ``axis`` and later extents may
    read: a *run-time extent*, different from rank to rank. That dim may instead be an
    extent that does not read it (the way back into a buffer of known size): then the
    counts must fill it.
    Every member checks the whole counts matrix before anything is sent (no negative
    count, every row adding up to the rows its member sends, every column to what its
    receiver's buffer holds), so a bad count is a ``RunTimeExtentError`` on every member.
    See docs/run_time_extents.md."""

    OUTS: ClassVar[tuple[str, ...]] = ("received", "out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src", "counts")
    received: Symbol
    out: TensorValue
    src: TensorValue
    team: Team
    counts: HostValue
    transpose: bool = False
    axis: int = 0
    request: RequestValue
    preallocated: bool = False


@declare(kind=Kind.POINT_TO_POINT, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class SendRecv:
    """The member at ``sender`` sends ``src`` to the member at ``receiver``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src", "sender", "receiver")
    out: TensorValue
    src: TensorValue
    team: Team
    sender: Scalar
    receiver: Scalar
    request: RequestValue
    preallocated: bool = False


@declare(kind=Kind.POINT_TO_POINT, positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class CollectivePermute:
    """Each member sends ``src`` to the member at ``send_peer`` and receives into ``out``
    from the member at ``recv_peer`` (both positions in its group, usually functions of a
    loop index and the rank's coordinate); both peers self is a local copy."""

    OUTS: ClassVar[tuple[str, ...]] = ("out", "request")
    INS: ClassVar[tuple[str, ...]] = ("src", "send_peer", "recv_peer")
    out: TensorValue
    src: TensorValue
    team: Team
    send_peer: Scalar
    recv_peer: Scalar
    request: RequestValue
    preallocated: bool = False


@declare(kind=Kind.CONTROL, keyword="wait")
@dataclass(frozen=True, slots=True, kw_only=True)
class Wait:
    """Block until the communication that defined ``request`` completed."""

    OUTS: ClassVar[tuple[str, ...]] = ()
    INS: ClassVar[tuple[str, ...]] = ("request",)
    request: RequestValue


@declare(kind=Kind.LOCAL_RESHARD, keyword="local_shard", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class LocalShard:
    """``out`` is this rank's piece of ``src`` along ``axis``: the local dim viewed
    as ``[outer, size of mesh_axis, inner]``, this rank's coordinate on
    ``mesh_axis`` (of ``out``'s mesh) selected. No communication."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    axis: int
    mesh_axis: MeshAxis
    inner: Scalar | None = None
    preallocated: bool = False


COLLECTIVES = classes_of_kind(*COMMUNICATING)
"""The built-in instructions that communicate over a team and define a request
(``hostir.ir.catalog.classes_of_kind`` also finds classes declared later)."""

ROOTED = frozenset({Broadcast, Reduce, Gather, Scatter})
"""Collectives with a root member."""

SENDER_FIELD: dict[type, str] = {Broadcast: "root", Scatter: "root", SendRecv: "sender"}
"""Communications in which only the member at the position this field holds sends ``src``
(in each group); in the other :data:`COLLECTIVES` every member sends."""

RECEIVER_FIELD: dict[type, str] = {Reduce: "root", Gather: "root", SendRecv: "receiver"}
"""Communications in which only the member at the position this field holds receives
``out`` (in each group); in the other :data:`COLLECTIVES` every member receives."""

POSITION_FIELDS = ("root", "sender", "receiver", "send_peer", "recv_peer")
"""The scalar fields that hold a position inside the team's group (0 to its size - 1)."""
