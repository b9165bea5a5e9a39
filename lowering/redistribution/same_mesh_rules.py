"""The rules of planning a resharding on one mesh, in order: the local slices that can be
made at once; the partial sums reduced while the data is smallest (ReduceScatter along a
dim the target extends by them, else Allreduce); a pure permutation of mesh axes as one
CollectivePermute; the axes a dim releases gathered (Allgather) or moved to the dim
that takes them next (AllToAll), inner dims first; then the slices the target adds.
Each fuses what it can into one collective over a flattened team (several mesh axes,
outer first: a group's rank order is the shard nesting order).
:mod:`lowering.redistribution.plan_same_mesh` runs them; docs/communication.md
tabulates them.
"""

from __future__ import annotations

from dataclasses import replace

from hostir import (
    Allgather,
    Allreduce,
    AllToAll,
    CollectivePermute,
    MeshAxis,
    ReduceOp,
    ReduceScatter,
)
from hostir.ir.communications import LocalShard
from hostir.ir.team import Team
from lowering.redistribution.distribution import Distribution
from lowering.redistribution.planner import Planner


def _plan_by_rules(planner: Planner, target: Distribution) -> None:
    for dim in range(len(target.dims)):  # first the slices that can be made now: less data
        _slice_axes(planner, target, dim, ready_only=True)
    _reduce_partials(planner, target)
    if not _permute(planner, target):
        # Inner dims first, on the smaller data: the last gather is then the outermost
        # dim's, which lands straight in the output buffer (no packing temporary).
        for dim in reversed(range(len(target.dims))):
            _release_axes(planner, target, dim)
        for dim in range(len(target.dims)):
            _slice_axes(planner, target, dim)
    if planner.current.dims != target.dims:
        raise planner.fail("the per-dim mesh axes do not match after planning")


def _team(planner: Planner, axes: tuple[MeshAxis, ...]) -> Team:
    return Team(mesh=planner.current.mesh, axes=axes)


def _in_mesh_order(planner: Planner, axes: list[MeshAxis]) -> tuple[MeshAxis, ...]:
    return tuple(a for a in planner.current.mesh.axes() if a in axes)


def _names(axes: tuple[MeshAxis, ...]) -> str:
    return "(" + ", ".join(a.value for a in axes) + ")"


# ----- rule 1: reductions -----
def _reduce_partials(planner: Planner, target: Distribution) -> None:
    todo = [p for p in planner.current.partial if p not in target.partial]
    if set(target.partial) - set(planner.current.partial):
        raise planner.fail("the target holds partial sums the source does not")
    for op in dict.fromkeys(p.op for p in todo):
        axes = [p.axis for p in todo if p.op is op]
        for dim, appended in _scatters(planner, target, axes):
            _reduce(planner, ReduceScatter, appended, op, dim)
            axes = [a for a in axes if a not in appended]
        if axes:
            _reduce(planner, Allreduce, _in_mesh_order(planner, axes), op, None)


def _scatters(
    planner: Planner, target: Distribution, axes: list[MeshAxis]
) -> list[tuple[int, tuple[MeshAxis, ...]]]:
    """Dims the target extends by partial ``axes`` only (after the source's axes)."""
    found = []
    for dim, (have, want) in enumerate(zip(planner.current.dims, target.dims, strict=True)):
        appended = want[len(have) :]
        if want[: len(have)] == have and appended and set(appended) <= set(axes):
            found.append((dim, appended))
    return found


def _reduce(
    planner: Planner,
    kind: type,
    axes: tuple[MeshAxis, ...],
    op: ReduceOp,
    dim: int | None,
    when: str = "first, while the data is smallest",
) -> None:
    current = planner.current
    partial = tuple(p for p in current.partial if not (p.axis in axes and p.op is op))
    after = replace(current, partial=partial)
    if dim is not None:
        after = after.with_dim(dim, current.dims[dim] + axes)
    where = f" along dim {dim}" if dim is not None else ""
    planner.add(
        kind,
        after,
        team=_team(planner, axes),
        reason=f"reduce the partial sums over {_names(axes)}{where} {when}",
        op=op,
        **({} if dim is None else {"axis": dim}),
    )
    if len(axes) > 1:
        planner.note(f"fused: one {planner.steps[-1].name} over the flattened team {_names(axes)}")


# ----- rule 2: permutations -----
def _axis_map(planner: Planner, target: Distribution) -> dict[MeshAxis, MeshAxis] | None:
    """sigma with: the target's axes of each dim are sigma-images of the source's, in
    order and of equal sizes, extended over the unused axes; None if there is none."""
    mesh = planner.current.mesh
    sigma = {p.axis: p.axis for p in planner.current.partial}  # partial sums stay in place
    for dim in range(len(target.dims)):
        want, have = target.dims[dim], planner.current.dims[dim]
        if len(want) != len(have):
            return None
        for a, b in zip(want, have, strict=True):
            if sigma.setdefault(a, b) != b or mesh.axis_size(a) != mesh.axis_size(b):
                return None
    if len(set(sigma.values())) != len(sigma):
        return None
    free_src = [b for b in mesh.axes() if b not in sigma.values()]
    for a in (a for a in mesh.axes() if a not in sigma):
        match = next((b for b in free_src if mesh.axis_size(b) == mesh.axis_size(a)), None)
        if match is None:
            return None
        free_src.remove(match)
        sigma[a] = match
    return sigma


def _permute(planner: Planner, target: Distribution) -> bool:
    """Rule 2: one CollectivePermute when the change is a relabelling of mesh axes (the
    partial ones, if any, fixed)."""
    if planner.current.partial != target.partial:
        return False
    sigma = _axis_map(planner, target)
    if sigma is None or all(a == b for a, b in sigma.items()):
        return False
    _permute_by(
        planner,
        sigma,
        target,
        f"every device needs one other device's block (mesh axes {_swaps(sigma)}): a pure"
        " permutation, nothing gathered",
    )
    planner.note("permutation: one CollectivePermute instead of gathering and re-slicing")
    return True


def relabelled(current: Distribution, sigma: dict[MeshAxis, MeshAxis]) -> Distribution:
    """``current`` after the CollectivePermute of :func:`_permute_by` by ``sigma``: each
    dim's mesh axis ``sigma(a)`` becomes ``a`` (the partial axes, which sigma fixes, stay)."""
    inverse = {b: a for a, b in sigma.items()}
    return replace(current, dims=tuple(tuple(inverse[b] for b in d) for d in current.dims))


def _swaps(sigma: dict[MeshAxis, MeshAxis]) -> str:
    return ", ".join(f"{a.value}->{b.value}" for a, b in sigma.items() if a != b)


def _permute_by(
    planner: Planner, sigma: dict[MeshAxis, MeshAxis], after: Distribution, reason: str
) -> None:
    """Adds one CollectivePermute over the whole mesh by the axis bijection ``sigma``
    (target axis -> source axis, equal sizes) that leaves the data laid out as ``after``:
    rule 2's step, and the first step of a permute-then-rules candidate
    (:mod:`lowering.redistribution.same_mesh_candidates`)."""
    # Peers as positions in the whole mesh, row-major: the one this rank receives from has
    # on each axis b this rank's coordinate on sigma^-1(b); the one it sends to has on
    # each axis a this rank's coordinate on sigma(a) (mapped axes have equal sizes).
    axes = planner.current.mesh.axes()
    inverse = {b: a for a, b in sigma.items()}
    recv = _team(planner, tuple(inverse[b] for b in axes)).my_position()
    send = _team(planner, tuple(sigma[a] for a in axes)).my_position()
    planner.add(
        CollectivePermute,
        after,
        team=_team(planner, axes),
        send_peer=send,
        recv_peer=recv,
        reason=reason,
    )


# ----- rule 3: releasing axes -----
def _release_axes(planner: Planner, target: Distribution, dim: int) -> None:
    """Gathers (or moves with AllToAll) the axes of ``dim`` beyond the target's prefix."""
    wanted = target.dims[dim]
    while True:
        have = planner.current.dims[dim]
        pairs = enumerate(zip(have, wanted, strict=False))  # keep their common prefix
        keep = next((i for i, (a, b) in pairs if a != b), min(len(have), len(wanted)))
        if len(have) == keep:
            return
        released = have[keep:]
        move = _move(planner.current, target, dim, released)
        if move is not None:
            destination, moved = move
            gathered = planner.current.with_dim(dim, have[: len(have) - len(moved)])
            dest_axes = planner.current.dims[destination]
            planner.add(
                AllToAll,
                gathered.with_dim(destination, dest_axes + moved),
                team=_team(planner, moved),
                split_axis=destination,
                concat_axis=dim,
                reason=f"mesh axes {_names(moved)} move from dim {dim} to dim {destination}: an"
                " all-to-all over their team, not a gather",
            )
            if len(moved) > 1:
                planner.note(f"fused: one AllToAll over the flattened team {_names(moved)}")
            continue
        planner.add(
            Allgather,
            planner.current.with_dim(dim, have[:keep]),
            team=_team(planner, released),
            axis=dim,
            reason=f"dim {dim} is no longer split over {_names(released)}",
        )
        if len(released) > 1:
            planner.note(
                f"fused: one Allgather over the flattened team {_names(released)} (the"
                f" nesting order of dim {dim})"
            )


def _move(
    current: Distribution, target: Distribution, dim: int, released: tuple
) -> tuple[int, tuple] | None:
    """The dim that takes innermost axes of ``dim`` next, and those axes: all of
    ``released`` when another dim takes exactly them next, in the same nesting order
    (``S0S0 -> S1S1``), else the innermost alone if it is the next axis of another dim;
    None if neither (a gather)."""
    for destination, axes in enumerate(current.dims):
        if len(released) > 1 and destination != dim and target.dims[destination] == axes + released:
            return destination, released
    destination = target.dim_of(released[-1])
    axes = () if destination is None else current.dims[destination]
    if destination not in (None, dim) and target.dims[destination][: len(axes) + 1] == (
        axes + released[-1:]
    ):
        return destination, released[-1:]
    return None


# ----- rule 4: slices -----
def _slice_axes(planner: Planner, target: Distribution, dim: int, ready_only: bool = False) -> None:
    """Local slices for the axes the target adds to ``dim``, outer first (``ready_only``:
    while the next is replicated and the dim's axes are a prefix of the target's)."""
    wanted = target.dims[dim]
    while planner.current.dims[dim] != wanted:
        have = planner.current.dims[dim]
        prefix = wanted[: len(have)] == have
        if ready_only and not (prefix and wanted[len(have)] in planner.current.replicated_axes()):
            return
        if not prefix:
            raise planner.fail(f"dim {dim} is sharded in an order that cannot be sliced into")
        axis = wanted[len(have)]
        if planner.current.dim_of(axis) is not None:
            raise planner.fail(f"mesh axis {axis.value} is still in use by another dim")
        after = planner.current.with_dim(dim, have + (axis,))
        planner.add(
            LocalShard,
            after,
            axis=dim,
            mesh_axis=axis,
            reason=f"replicated data split over {axis.value}: a local slice, no communication",
        )
