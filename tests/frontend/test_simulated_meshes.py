"""The README's MLP on a 2-d (8x8) and a 3-d (4x4x4) mesh of 64 simulated ranks
(benchmarks/simulated_meshes.py; the benchmark runs them at 512): every rank's output is
its rows of the single-device reference, the program has the Allreduces the schedule
asks for (over mesh rows in 2-d; over ``mesh_y`` then ``mesh_x`` teams in 3-d), and the
traffic the world measured is the static count of those, link by link."""

from __future__ import annotations

import pytest
import torch

from benchmarks.simulated_meshes import MeshShapeError, define, run_mlp, sizes
from hostir.analysis.traffic import count_traffic
from hostir.errors import HostIrError
from hostir.run.compiled_runs import compiled_checking_enabled

TEAMS = {2: ["M0(x)"], 3: ["M0(y)", "M0(x)"]}
"""The teams of the program's Allreduces, in program order, by mesh rank."""


def _allreduce_teams(program) -> list[str]:
    lines = [line for line in str(program).splitlines() if "Allreduce(" in line]
    return [line.split("team=")[1].split(",")[0] for line in lines]


def _same_team(source: int, destination: int, shape: tuple[int, ...]) -> bool:
    """Whether two ranks share a team of one of the program's Allreduces: they differ in
    one coordinate, and not the data-parallel one (mesh dim 0)."""
    a = torch.tensor(torch.unravel_index(torch.tensor(source), shape))
    b = torch.tensor(torch.unravel_index(torch.tensor(destination), shape))
    differ = (a != b).nonzero().flatten().tolist()
    return len(differ) == 1 and differ[0] != 0


@pytest.mark.parametrize("shape", [(8, 8), (4, 4, 4)], ids=["8x8", "4x4x4"])
def test_every_rank_of_a_64_rank_mesh_gets_its_reference_rows(shape):
    """64 ranks on a 2-d and a 3-d mesh: the outputs, the collectives, the traffic."""
    done = run_mlp(shape, seed=1)
    assert done.wrong_ranks == []
    assert done.world_size == 64
    fd, _ = define(shape)
    program = fd.host_ir()
    assert _allreduce_teams(program) == TEAMS[len(shape)]
    tokens, _ = sizes(shape)
    static = count_traffic(program, 64, {"i0": tokens}).links
    measured = done.run.links
    assert static.sum() > 0
    runs = 2 if compiled_checking_enabled() else 1  # the suite's check runs each program twice
    assert torch.equal(measured, static * runs)
    for source, destination in measured.nonzero().tolist():
        assert _same_team(source, destination, shape), (source, destination)


def test_a_mesh_the_mlp_cannot_use_is_named():
    """4 dims, a zero size, or more mesh_y devices than hidden features: MeshShapeError
    (a HostIrError) naming the shape and what was expected."""
    with pytest.raises(MeshShapeError, match=r"\(2, 2, 2, 2\): expected 1 to 3 positive"):
        define((2, 2, 2, 2))
    with pytest.raises(MeshShapeError, match=r"\(4, 0\): expected 1 to 3 positive"):
        define((4, 0))
    with pytest.raises(HostIrError, match=r"\(2, 32, 2\): mesh_y shares the 16 hidden"):
        define((2, 32, 2))
