"""The permute-then-rules candidates of the same-mesh planner: one CollectivePermute that
relabels mesh axes of equal size, then the rules from the relabelled layout.

Where the rules take three or more collectives, relabelling first can leave a layout the
rules finish in one fused collective: ``S0S0S1 -> RS1R`` on a 2x2x2 mesh is an
Allgather, an AllToAll and an Allgather by the rules, but after swapping mesh axes x and
y (one CollectivePermute; the ranks whose x and y coordinates agree keep their block) it
is one Allgather over the flattened team (z, x), the same bytes in two collectives (what
XLA's SPMD partitioner plans). :mod:`lowering.redistribution.same_mesh_candidates` costs
these beside the rules.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator

from hostir import Mesh, MeshAxis
from lowering.errors import ReshardingError
from lowering.redistribution.distribution import Distribution
from lowering.redistribution.plan import Step
from lowering.redistribution.planner import Planner
from lowering.redistribution.same_mesh_rules import (
    _permute_by,
    _plan_by_rules,
    _slice_axes,
    _swaps,
    relabelled,
)

MAX_RELABELLINGS = 23
"""Every relabelling is tried while there are at most this many (4! - 1: a mesh of four
equal-size axes); beyond, only the swaps of two axes, so the candidates grow with the
square of the mesh's rank, not its factorial."""

Candidate = tuple[str, Callable[[bool], tuple[Step, ...]]]


def relabellings(mesh: Mesh, fixed: set[MeshAxis]) -> Iterator[dict[MeshAxis, MeshAxis]]:
    """The bijections sigma of ``mesh``'s axes (target axis -> source axis) that map each
    axis to one of equal size, fix the axes in ``fixed`` (partial sums stay in place) and
    are not the identity: all of them on a mesh of up to four equal axes (on a 3-d mesh at
    most 3! - 1 = 5), else the swaps of two equal-size axes."""
    free = [a for a in mesh.axes() if a not in fixed]
    groups = [
        [a for a in free if mesh.axis_size(a) == size]
        for size in dict.fromkeys(mesh.axis_size(a) for a in free)
    ]
    identity = {a: a for a in mesh.axes()}
    if math.prod(math.factorial(len(g)) for g in groups) - 1 > MAX_RELABELLINGS:
        for group in groups:
            for a, b in itertools.combinations(group, 2):
                yield {**identity, a: b, b: a}
        return
    found = []
    for images in itertools.product(*(itertools.permutations(g) for g in groups)):
        sigma = dict(identity)
        for group, image in zip(groups, images, strict=True):
            sigma.update(zip(group, image, strict=True))
        if sigma != identity:
            found.append(sigma)
    # Fewest axes moved first (ties keep the first): a swap of two axes leaves more ranks
    # their own block (a local copy) than a cycle of three.
    yield from sorted(found, key=lambda s: sum(a != b for a, b in s.items()))


def permute_then_rules(
    planner: Planner, source: Distribution, target: Distribution, calls: int
) -> list[Candidate]:
    """For each relabelling sigma (:func:`relabellings`): the slices the rules make at once,
    one CollectivePermute by sigma, then the rules to ``target``; kept (labelled) only
    where that takes fewer than ``calls`` collectives, the rules' count, since it cannot
    beat them otherwise (the rules reach the byte lower bound without partial sums)."""
    found: list[Candidate] = []
    for sigma in relabellings(source.mesh, {p.axis for p in source.partial}):
        scratch = planner.scratch(source)
        for dim in range(len(target.dims)):
            _slice_axes(scratch, target, dim, ready_only=True)
        after = relabelled(scratch.current, sigma)
        _permute_by(
            scratch,
            sigma,
            after,
            f"relabel mesh axes {_swaps(sigma)} first (each rank sends its block to the rank"
            " that holds it after the relabelling): the rules then need fewer collectives",
        )
        try:
            _plan_by_rules(scratch, target)
        except ReshardingError:
            continue
        steps = tuple(scratch.steps)
        if sum(s.team is not None for s in steps) < calls:
            found.append((f"permute ({_swaps(sigma)}) then the rules", lambda exact, s=steps: s))
    return found
