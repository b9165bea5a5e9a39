"""The planner's analyses of an AllToAllV on a large mesh find their classes of members
and their busiest member from per-dim block geometry, broadcast over the mesh grid,
instead of a box per member: ``_class_members`` (one member per class of
``_profile_key``), ``least_kept`` (behind ``most_received`` and ``received_lower_bound``)
and ``_received_counts``. Each must give what a walk of every member in device order
gives (the walks they replaced, kept here as the reference): checked on every exchange
between the sweep's distributions (``test_exchange_profiles.exchange_cases``), over
every team of a 2-d mesh's axes and the whole of 3-d meshes whose axes differ in size,
sources replicated over some axes among them."""

from __future__ import annotations

import itertools
import math

import pytest

from hostir import CollectivePermute, Mesh
from hostir.analysis.boxes import (
    Operand,
    _boxes,
    _layout,
    _members,
    intersect,
    least_kept,
    most_missing,
    volume,
)
from hostir.analysis.exchange_profiles import (
    _class_members,
    _profile_key,
    _received_count,
    _received_counts,
    _swept,
)
from hostir.analysis.exchanges import busiest_received
from hostir.analysis.member_exchanges import _roles
from hostir.errors import HostIrError
from hostir.ir.team import Team
from lowering.redistribution.distribution import parse_notation
from lowering.redistribution.exchange_cost import _permute_received
from lowering.redistribution.plan_resharding import plan_resharding
from tests.lowering.test_exchange_profiles import _teams, exchange_cases
from tests.lowering.test_redistribution_sweep import SHAPES, _mesh, _plans, value

CASES = {(2, 3): (12, 12), (3, 4): (24, 36), (2, 3, 2): (24, 36)}


def _walked_classes(roles, shape):
    """The position of the first member (in device order) of each class of
    ``_profile_key``, member by member: the walk ``_class_members`` replaced."""
    swept, first = _swept(roles), {}
    for position, ((_, coords), src_box, out_box) in enumerate(
        zip(
            _members(Mesh(devices=tuple(range(math.prod(shape))), shape=shape)),
            _boxes(roles.src_layout, shape),
            _boxes(roles.out_layout, shape),
            strict=True,
        )
    ):
        first.setdefault(_profile_key(roles, coords, src_box, out_box, swept), position)
    return list(first.values())


def _walked_least_kept(src_layout, out_layout, shape):
    """(fewest kept elements, first position with that few), member by member."""
    kept = [
        volume(common) if (common := intersect(a, b)) else 0
        for a, b in zip(_boxes(src_layout, shape), _boxes(out_layout, shape), strict=True)
    ]
    return min(kept), kept.index(min(kept))


@pytest.mark.parametrize("mesh_shape", CASES, ids=lambda s: "x".join(map(str, s)))
def test_grid_analyses_match_a_walk_of_every_member(mesh_shape):
    mesh = Mesh(devices=tuple(range(math.prod(mesh_shape))), shape=mesh_shape)
    shape = CASES[mesh_shape]
    checked, problems = 0, []
    for pair, src, out in exchange_cases(mesh, shape):
        if len(mesh_shape) == 3 and "R" not in pair.split(" -> ")[0]:
            continue  # 3-d: the sources replicated over some axis (those by coordinates)
        for team in _teams(mesh):
            case = f"{pair} over {team}"
            try:
                roles = _roles(src, out, team, bool(src.sharding.partial))
            except HostIrError:
                continue
            checked += 1
            if _class_members(roles, mesh_shape, _swept(roles)) != _walked_classes(
                roles, mesh_shape
            ):
                problems.append(f"{case}: classes differ")
            walked = _walked_least_kept(roles.src_layout, roles.out_layout, mesh_shape)
            if least_kept(roles.src_layout, roles.out_layout, mesh_shape) != walked:
                problems.append(f"{case}: least kept differs from {walked}")
            counts = [_received_count(roles, b) for b in _boxes(roles.out_layout, mesh_shape)]
            if _received_counts(roles, mesh_shape).tolist() != counts:
                problems.append(f"{case}: received counts differ from {counts}")
        missing = max(  # received_lower_bound's walk: the most a target block lacks
            volume(b) - (volume(common) if (common := intersect(a, b)) else 0)
            for a, b in zip(
                _boxes(_layout(src, mesh), mesh_shape),
                _boxes(_layout(out, mesh), mesh_shape),
                strict=True,
            )
        )
        if not src.sharding.partial and most_missing(src.sharding, out.sharding, shape) != missing:
            problems.append(f"{pair}: most missing differs from {missing}")
    assert checked > 500 and not problems, "\n".join(problems[:20])


def test_classes_on_the_issues_mesh():
    """On 8x8x64 (the issue's mesh) ``PS0S1 -> S0S1R``: the members that keep no piece
    are one class, those that keep one are told apart by their coordinates on the
    reduced axis and the axis their sends run over (1 + 64 classes); as the walk finds
    them, in the same order."""
    mesh = Mesh(devices=tuple(range(4096)), shape=(8, 8, 64))
    shape = (16384, 16384)
    src, out = (
        Operand(n, parse_notation(t, mesh, ndim=2).to_sharding(shape), shape)
        for n, t in (("src", "PS0S1"), ("out", "S0S1R"))
    )
    roles = _roles(src, out, Team(mesh=mesh, axes=mesh.axes()), True)
    classes = _class_members(roles, mesh.shape, _swept(roles))
    assert len(classes) == 65 and classes == _walked_classes(roles, mesh.shape)
    src_boxes, out_boxes = (
        _boxes(layout, mesh.shape) for layout in (roles.src_layout, roles.out_layout)
    )
    boxes = zip(src_boxes, out_boxes, strict=True)
    kept = [i for i, (a, b) in enumerate(boxes) if intersect(a, b)]
    assert len(set(classes) & set(kept)) == 64


def test_permute_received_is_busiest_received():
    """``step_received`` takes a planned CollectivePermute's busiest rank from the first
    member that moves (``_permute_received``): on every permute of the sweep's plans on
    2x2, and of those between sources and targets sharded over every axis on 2x2x2
    (relabellings of equal axes: where permutes are), it must be what
    ``busiest_received`` finds over every member."""
    mesh, shape = _mesh("2x2x2"), SHAPES["2x2x2"]
    sharded = ["".join(p) for p in itertools.product(["S0", "S1"], repeat=3)]
    plans = [plan for *_, plan in _plans("2x2")] + [
        plan_resharding(
            *(value(n, parse_notation(t, mesh), shape) for n, t in zip("AB", pair, strict=True))
        )
        for pair in itertools.product(sharded, sharded)
    ]
    permutes = 0
    for plan in plans:
        for k, step in enumerate(plan.steps):
            if step.kind is not CollectivePermute:
                continue
            permutes += 1
            group = step.team.group_of(step.team.mesh.devices[0])
            instruction = plan.instruction(k)
            assert _permute_received(instruction, group) == busiest_received(
                instruction, group, {}
            ), f"{plan.explain()}"
    assert permutes > 10
