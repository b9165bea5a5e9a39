"""The planner costs an AllToAllV from one rank per class of ranks with equal profiles
(``hostir.analysis.exchange_profiles.member_profiles``) and takes the most received from
block boxes alone (``hostir.analysis.exchange_profiles.most_received``), and bounds an
exchange's rounds from below by the busiest rank's profile
(``hostir.analysis.exchange_profiles.busiest_member_profile``): its profile must be that
rank's, and the most received its. All must match what every rank's own exchange says:
checked here on every rank of every exchange between the sweep's distributions, over every
team of mesh axes, with nesting orders other than the mesh's among them. So must each
rank's profile built directly (``member_profile``, without its absolute pieces)."""

from __future__ import annotations

import itertools
import math

import pytest

from hostir import Mesh
from hostir.analysis.boxes import Operand, volume
from hostir.analysis.exchange_profiles import (
    busiest_member_profile,
    member_profile,
    member_profiles,
    most_received,
    profile,
)
from hostir.analysis.member_exchanges import _roles, member_exchange
from hostir.errors import HostIrError
from hostir.ir.team import Team
from lowering.redistribution.distribution import parse_notation

ORDERS = {2: ["S0S0[1,0]", "S1S1[1,0]"], 3: ["S0S0S0[2,1,0]", "S0S0S0[1,0,2]", "S1S1S1[2,0,1]"]}
CASES = {  # mesh shape: tensor shape (blocks of different sizes meet unaligned in some)
    (2, 3): (12, 12),
    (2, 4): (8, 8),
    (4, 4): (16, 16),
    (3, 4): (24, 36),
    (2, 2, 2): (8, 8),
}


def _notations(k: int, placements: list[str]) -> list[str]:
    return ["".join(p) for p in itertools.product(placements, repeat=k)] + ORDERS[k]


def exchange_cases(mesh: Mesh, shape: tuple[int, int]):
    """(label, src, out) for every pair of the sweep's distributions on ``mesh`` of a
    ``shape`` tensor: sources ``R``, ``S0``, ``S1``, ``P`` per axis (and the orders of
    :data:`ORDERS`), targets without ``P``."""
    k = len(mesh.shape)
    for a, b in itertools.product(
        _notations(k, ["R", "S0", "S1", "P"]), _notations(k, ["R", "S0", "S1"])
    ):
        src = Operand("src", parse_notation(a, mesh, ndim=2).to_sharding(shape), shape)
        out = Operand("out", parse_notation(b, mesh, ndim=2).to_sharding(shape), shape)
        yield f"{a} -> {b}", src, out


def _teams(mesh: Mesh) -> list[Team]:
    axes = mesh.axes()
    if len(axes) > 2:  # the planner's team (every axis involved) keeps the case fast
        return [Team(mesh=mesh, axes=axes)]
    return [Team(mesh=mesh, axes=s) for r in (1, 2) for s in itertools.combinations(axes, r)]


@pytest.mark.parametrize("mesh_shape", CASES, ids=lambda s: "x".join(map(str, s)))
def test_profiles_and_most_received_match_every_rank(mesh_shape):
    mesh = Mesh(devices=tuple(range(math.prod(mesh_shape))), shape=mesh_shape)
    shape = CASES[mesh_shape]
    checked, problems = 0, []
    for pair, src, out in exchange_cases(mesh, shape):
        reduced = bool(src.sharding.partial)
        for team in _teams(mesh):
            try:
                every = [member_exchange(src, out, team, r, reduced) for r in mesh.devices]
            except HostIrError:
                continue
            checked += 1
            profiles = {profile(e) for e in every}
            # member_profile builds a member's profile without its absolute pieces: on
            # every exchange of the 2-d meshes and a quarter of 2x2x2's (its 2,000 pairs
            # cost a second)
            if mesh.ndim == 2 or checked % 4 == 0:
                roles = _roles(src, out, team, reduced)
                direct = [
                    member_profile(roles, mesh.shape, mesh.coordinates(r)) for r in mesh.devices
                ]
                if direct != [profile(e) for e in every]:
                    problems.append(f"{pair} over {team}: member_profile differs from profile")
            received = [
                sum(volume(p.box) for p in e.receives if p.source != e.member) for e in every
            ]
            most = max(received)
            (busiest,) = busiest_member_profile(src, out, team, reduced)
            if busiest != profile(every[received.index(most)]):
                problems.append(f"{pair} over {team}: not the busiest rank's profile")
            if set(member_profiles(src, out, team, reduced)) != profiles:
                problems.append(f"{pair} over {team}: profiles differ")
            if most_received(src, out, team, reduced) != most:
                problems.append(f"{pair} over {team}: most received differs from {most}")
    assert checked > 200 and not problems, "\n".join(problems[:20])
