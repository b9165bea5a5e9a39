"""Every redistribution between simple distributions of a 2-d tensor, run against the
single-device reference: on a 2x2 mesh (4 ranks) all sources in {R, S0, S1, P}^2 to all
targets in {R, S0, S1}^2, and on a 2x4 mesh (8 ranks) all non-partial pairs plus partial
sources. Whatever the planner picks (fused collectives, permutations, AllToAll, AllToAllV,
local slices, building in the output), the numbers must be right; the race checker and
the text round trip run on every program (tests/conftest.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

from frontend import shard_tensor
from hostir import Mesh
from lowering.distribution import parse_notation
from tests.redistribution_programs import fusion_for, reference_local

SHAPE = (8, 8)
TARGETS = ["".join(p) for p in itertools.product(["R", "S0", "S1"], repeat=2)]
SOURCES = ["".join(p) for p in itertools.product(["R", "S0", "S1", "P"], repeat=2)]


def _check(multidevice_test, mesh: Mesh, src_text: str, dst_text: str, seed: int) -> None:
    src, dst = parse_notation(src_text, mesh), parse_notation(dst_text, mesh)
    fd = fusion_for(src, dst, SHAPE)
    parts = 1
    for p in src.partial:
        parts *= mesh.axis_size(p.axis)
    generator = torch.Generator().manual_seed(seed)
    values = torch.randint(-8, 8, (parts, *SHAPE) if src.partial else SHAPE, generator=generator)
    values = values.to(torch.float32)
    full = values.sum(0) if src.partial else values
    local = shard_tensor(values, fd.host_ir().inputs[0], multidevice_test.rank)
    (out,) = fd.execute([local.to(multidevice_test.device)])
    expected = reference_local(full, dst, multidevice_test.rank)
    assert torch.equal(out.cpu(), expected), (
        f"{src_text} -> {dst_text} on {mesh}, rank {multidevice_test.rank}:\n{fd.host_ir()}"
    )


@pytest.mark.world_sizes(4)
def test_every_pair_on_a_2x2_mesh(multidevice_test):
    mesh = Mesh(devices=(0, 1, 2, 3), shape=(2, 2))
    for seed, (src, dst) in enumerate(itertools.product(SOURCES, TARGETS)):
        _check(multidevice_test, mesh, src, dst, seed)


@pytest.mark.world_sizes(8)
def test_every_pair_on_a_2x4_mesh(multidevice_test):
    mesh = Mesh(devices=tuple(range(8)), shape=(2, 4))
    sources = [s for s in SOURCES if s.count("P") < 2]
    for seed, (src, dst) in enumerate(itertools.product(sources, TARGETS)):
        _check(multidevice_test, mesh, src, dst, seed)
