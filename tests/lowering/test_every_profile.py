"""Where every member of an exchange is its own class (replicas take turns), the planner
gets every member's profile from the receiving side alone
(``hostir.analysis.exchange_profiles._every_profile``): each member's sends are the pieces
the others receive from it. That must be, member by member and in order, the profile of what
the member's own ``member_exchange`` computes: checked here on every member of every
exchange between the sweep's distributions, over every team (in every order) of a 2-d mesh's
axes and, on a 3-d mesh, the whole mesh in three orders (the distributions:
``tests.lowering.test_exchange_profiles.exchange_cases``)."""

from __future__ import annotations

import itertools
import math

import pytest

from hostir import Mesh
from hostir.analysis.exchange_profiles import _every_profile, profile
from hostir.analysis.member_exchanges import _roles, member_exchange
from hostir.errors import HostIrError
from hostir.ir.team import Team
from tests.lowering.test_exchange_profiles import exchange_cases

CASES = {(2, 3): (12, 12), (3, 4): (24, 36), (2, 2, 2): (8, 8)}


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
    for pair, src, out in exchange_cases(mesh, shape):
        for team in teams:
            reduced = bool(src.sharding.partial)
            try:
                every = [profile(member_exchange(src, out, team, r, reduced)) for r in mesh.devices]
            except HostIrError:
                continue
            checked += 1
            if _every_profile(_roles(src, out, team, reduced), team) != every:
                problems.append(f"{pair} over {team}")
    assert checked > 500 and not problems, "\n".join(problems[:20])
