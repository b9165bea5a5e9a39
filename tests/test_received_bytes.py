"""The received-bytes measure of benchmarks/redistribute_vs_dtensor.py.

``received_bytes`` is checked on constructed calls (the formula of each kind);
``ProcessGroupRecorder`` on 4 real gloo ranks: ``torch.distributed``'s
functions (what our programs call) and the functional collectives (what
DTensor calls) are each recorded once, with their group's size and this
rank's position in it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from benchmarks.redistribute_vs_dtensor import (
    ProcessGroupCall,
    ProcessGroupRecorder,
    UnmeasuredCallError,
    _process_group_calls,
    received_bytes,
    sweep_pairs,
)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (ProcessGroupCall("all_gather", 4, 0, nbytes=256), 768),
        (ProcessGroupCall("all_gather", 1, 0, nbytes=256), 0),
        (ProcessGroupCall("reduce_scatter", 2, 1, nbytes=512), 512),
        (ProcessGroupCall("all_reduce", 2, 0, nbytes=1024), 1024),
        (ProcessGroupCall("all_reduce", 4, 3, nbytes=1024), 1536),
        (ProcessGroupCall("all_reduce", 8, 0, nbytes=1024), 1792),
        (ProcessGroupCall("all_reduce", 3, 0, nbytes=100), 2 * 67),  # ring parts rounded up
        (ProcessGroupCall("all_to_all", 4, 0, from_each=(64, 16, 16, 16)), 48),
        (ProcessGroupCall("all_to_all", 4, 2, from_each=(0, 16, 32, 16)), 32),
        (ProcessGroupCall("broadcast", 4, 1, nbytes=64, root=1), 0),
        (ProcessGroupCall("broadcast", 4, 0, nbytes=64, root=1), 64),
        (ProcessGroupCall("scatter", 4, 2, nbytes=64, root=0), 64),
        (ProcessGroupCall("gather", 4, 0, nbytes=64, root=0), 192),
        (ProcessGroupCall("gather", 4, 1, nbytes=64, root=0), 0),
        (ProcessGroupCall("reduce", 4, 0, nbytes=64, root=0), 96),
        (ProcessGroupCall("reduce", 4, 3, nbytes=64, root=0), 48),
        (ProcessGroupCall("recv", 2, 0, nbytes=40), 40),
        (ProcessGroupCall("send", 2, 1), 0),
        (ProcessGroupCall("barrier", 4, 1), 0),
    ],
)
def test_received_bytes_formula(call, expected):
    assert received_bytes(call) == expected


def test_received_bytes_refuses_an_unknown_kind():
    with pytest.raises(UnmeasuredCallError, match="no formula for a 'permute' call"):
        received_bytes(ProcessGroupCall("permute", 2, 0))


def test_the_recorder_refuses_an_unknown_process_group_op():
    """An op of a communication namespace without a rule stops the measure, named."""
    op = SimpleNamespace(_schema=SimpleNamespace(name="c10d::mystery_", arguments=[]))
    with pytest.raises(UnmeasuredCallError, match="no rule for the process-group op c10d::myst"):
        _process_group_calls(op, (), {})


@pytest.mark.real_ranks(reason="records torch.distributed's own collectives")
@pytest.mark.world_sizes(4)
def test_recorder_sees_both_entry_points(multidevice_test):
    rank, size = multidevice_test.rank, multidevice_test.size
    pairs = dist.new_group([0, 1]), dist.new_group([2, 3])  # every rank makes both
    splits = [rank + peer + 1 for peer in range(size)]  # rows to and from each peer
    recorder = ProcessGroupRecorder()
    with recorder:
        x = torch.ones(4, 8)  # 128 B
        dist.all_gather_into_tensor(torch.empty(4 * size, 8), x)  # c10d (ours) over all 4
        dist.all_reduce(x)
        dist.all_to_all_single(torch.empty(sum(splits)), torch.ones(sum(splits)), splits, splits)
        pair = pairs[rank // 2]  # the functional collectives (DTensor's) over a pair
        halves = funcol.wait_tensor(funcol.all_gather_tensor(x, 0, pair))
        reduced = funcol.wait_tensor(funcol.reduce_scatter_tensor(halves, "sum", 0, pair))
        dist.broadcast(x, src=1)
    assert reduced.shape == (4, 8)
    kinds = [(c.kind, c.group_size, c.group_rank) for c in recorder.calls]
    assert kinds == [
        ("all_gather", 4, rank),
        ("all_reduce", 4, rank),
        ("all_to_all", 4, rank),
        ("all_gather", 2, rank % 2),
        ("reduce_scatter", 2, rank % 2),
        ("broadcast", 4, rank),
    ]
    own = splits[rank]  # the rows this rank keeps
    broadcast = 0 if rank == 1 else 128  # nothing arrives at the root
    expected = [3 * 128, 2 * 3 * 128 // 4, 4 * (sum(splits) - own), 128, 128, broadcast]
    assert [received_bytes(c) for c in recorder.calls] == expected


@pytest.mark.parametrize("k", [2, 3])
def test_a_sampled_sweep_takes_every_source_and_every_target(k):
    """``--per-source 2``: two targets per source, every target among them; on 2x2x2 the
    same 128 pairs as the sweep test's numeric subset; all pairs without it."""
    every = sweep_pairs(k)
    sampled = sweep_pairs(k, per_source=2)
    assert len(every) == 4**k * 3**k and set(sampled) <= set(every)
    assert {s for s, _ in sampled} == {s for s, _ in every}
    assert {d for _, d in sampled} == {d for _, d in every}
    assert len(sampled) == len(set(sampled)) == 2 * 4**k
