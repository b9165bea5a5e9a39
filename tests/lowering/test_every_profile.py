"""Where every member of an exchange is its own class (replicas take turns), the planner
gets every member's profile from the receiving side alone
(``hostir.analysis.blocks._every_profile``): each member's sends are the pieces the others
receive from it. That must be, member by member and in order, the profile of what the
member's own ``member_exchange`` computes: checked here on every member of every exchange
between the sweep's distributions, over every team (in every order) of a 2-d mesh's axes
and, on a 3-d mesh, the whole mesh in every order."""

from __future__ import annotations

import itertools
import math

import pytest

from hostir import Mesh
from hostir.analysis.blocks import Operand, _every_profile, _roles, member_exchange, profile
from hostir.errors import HostIrError
from hostir.ir.team import Team
from lowering.redistribution.distribution import parse_notation

CASES = {(2, 3): (12, 12), (3, 4): (24, 36), (2, 2, 2): (8, 8)}
ORDERS = {2: ["S0S0[1,0]", "S1S1[1,0]"], 3: ["S0S0S0[2,1,0]", "S1S1S1[2,0,1]"]}


def _notations(k: int, placements: list[str]) -> list[str]:
    return ["".join(p) for p in itertools.product(placements, repeat=k)] + ORDERS[k]


@pytest.mark.parametrize("mesh_shape", CASES, ids=lambda s: "x".join(map(str, s)))
def test_every_profile_matches_each_member(mesh_shape):
    mesh = Mesh(devices=tuple(range(math.prod(mesh_shape))), shape=mesh_shape)
    shape, k = CASES[mesh_shape], len(mesh_shape)
    # In 3-d, the whole mesh in three orders (as it is, rotated, reversed; 2-d covers
    # teams with axes outside them and every order): every team in every order takes
    # too long for the suite.
    if k == 2:
        orders = [a for r in (1, 2) for a in itertools.permutations(mesh.axes(), r)]
    else:
        every = list(itertools.permutations(mesh.axes()))
        orders = [every[0], every[3], every[5]]
    teams = [Team(mesh=mesh, axes=axes) for axes in orders]
    checked, problems = 0, []
    for a, b in itertools.product(
        _notations(k, ["R", "S0", "S1", "P"]), _notations(k, ["R", "S0", "S1"])
    ):
        src = Operand("src", parse_notation(a, mesh, ndim=2).to_sharding(shape), shape)
        out = Operand("out", parse_notation(b, mesh, ndim=2).to_sharding(shape), shape)
        for team in teams:
            reduced = bool(src.sharding.partial)
            try:
                every = [profile(member_exchange(src, out, team, r, reduced)) for r in mesh.devices]
            except HostIrError:
                continue
            checked += 1
            if _every_profile(_roles(src, out, team, reduced), team) != every:
                problems.append(f"{a} -> {b} over {team}")
    assert checked > 500 and not problems, "\n".join(problems[:20])
