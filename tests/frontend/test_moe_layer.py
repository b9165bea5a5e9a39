"""The expert-parallel MoE layer (examples/moe_layer.py) over 20 random routings per world
size (1, 2, 4 and 8 ranks), k = 1 and 2: every rank's dispatched rows and output equal a
single-device torch reference bitwise. The routings include experts and ranks that receive
no token (6 experts: padding slots on 4 and 8 ranks; every fourth routing skewed toward
one expert), which the test asserts it saw. The program communicates exactly as the
layer says: one Allgather of the counts, one to_host, two RaggedAllToAll out and one back.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import moe_layer  # noqa: E402

ROUTINGS = 20


def _empty(d: int, seed: int, k: int) -> tuple[bool, bool]:
    """Whether routing ``seed`` leaves an expert without rows, and a rank without any."""
    inputs = moe_layer.make_inputs(d, seed)
    _, dispatched = moe_layer.reference(inputs, k)
    x, router = inputs[0], inputs[1]
    logits = torch.nn.functional.linear(x.float(), router)
    chosen = torch.topk(logits, k, dim=2).indices.unique().tolist()
    return len(chosen) < moe_layer.EXPERTS, any(len(rows) == 0 for rows in dispatched)


@pytest.mark.world_sizes(1, 2, 4, 8)
@pytest.mark.parametrize("k", [1, 2])
def test_the_layer_equals_the_reference_over_random_routings(multidevice_test, k):
    d, rank = multidevice_test.size, multidevice_test.rank
    fd = moe_layer.define(d, k=k)[0]
    problems = []
    for seed in range(ROUTINGS):
        problems += moe_layer.check(d, rank, seed, k=k, fd=fd)
    assert not problems, problems[:3]
    text = str(fd.host_ir())
    assert text.count("= Allgather(") == (1 if d > 1 else 0)
    assert text.count("= to_host(") == 1
    assert text.count("= RaggedAllToAll(") == 3
    assert text.count("transpose=true") == 1
    assert "Allreduce" not in text and "Broadcast" not in text


def test_the_routings_include_empty_experts_and_ranks():
    """What the sweep above claims it covers, checked on its own routings."""
    seen = {
        (d, k): [_empty(d, seed, k) for seed in range(ROUTINGS)] for d in (1, 4) for k in (1, 2)
    }
    assert any(expert for expert, _ in seen[1, 1])  # k = 1 on one rank: an expert unpicked
    assert all(rank for _, rank in seen[4, 1])  # 4 ranks: the padding slots' rank gets none
