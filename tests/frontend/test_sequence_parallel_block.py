"""examples/sequence_parallel_block.py's block: its communication inside pipelined
stream loops at 1, 2, 4 and 8 ranks with 2, 4 and 8 chunks, with and without
``swizzle1d`` (lowering only: it needs no running ranks), and run in the warm pools at
1, 2 and 4 ranks against the single-device torch reference on random data, float32 and
bf16, its collectives counted by the profiler; and its backward against autograd.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from frontend import shard_tensor
from hostir import MeshAxis

# The example imports tensor_parallel_block as its sibling, as under `hostir run`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import tensor_parallel_block_backward as tpb  # noqa: E402
from sequence_parallel_block import (  # noqa: E402
    BACKWARD_COLLECTIVES,
    communication_in_loops,
    define,
    random_inputs,
    reference,
    saving_forward,
)
from tensor_parallel_block import tolerance  # noqa: E402

GATHERS = ("Broadcast", "CollectivePermute")


def _loops(text: str) -> list[str]:
    """The bodies of the program's stream loops (the top-level ``for`` blocks whose body
    switches streams), each as its text."""
    bodies, current = [], None
    for line in text.splitlines():
        if line.startswith("  for j"):
            current = []
        elif current is not None and line == "  }":
            if any("set_current_stream(stream(" in body for body in current):
                bodies.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return bodies


@pytest.mark.parametrize("d", [1, 2, 4, 8])
@pytest.mark.parametrize("chunks", [2, 4, 8])
def test_communication_sits_in_pipelined_loops(d: int, chunks: int) -> None:
    """Lowered for ``d`` ranks with Allgather and ReduceScatter loops of ``chunks`` chunks
    each, and swizzled (Allgather loops in ``d`` chunks, one CollectivePermute each): four
    loops, gather, gather, scatter, scatter in block order; every collective of the
    program is inside one of them, after which the loop is split into pipeline stages;
    each gather loop receives all of its chunk (``chunks // d`` Broadcasts of a shard's
    slice, or ``d // chunks`` of whole shards); each scatter loop reduce-scatters its
    chunk once; attention runs after the first loop, on the whole sequence."""
    for swizzle in (False, True):
        fd, _ = define(
            d, gather_chunks=None if swizzle else chunks, scatter_chunks=chunks, swizzle=swizzle
        )
        text = str(fd.host_ir())
        assert communication_in_loops(text, d), text
        loops = _loops(text)
        kinds = [
            "gather" if any(f"= {g}(" in body for g in GATHERS) else "scatter" for body in loops
        ]
        if d == 1:  # one device: every chunk a local copy, no collective (checked above)
            continue
        assert kinds == ["gather", "scatter", "gather", "scatter"], text
        for body in loops:
            assert "pipeline_stage(depth=1)" in body, body
            if "ReduceScatter(" in body:
                assert body.count("= ReduceScatter(") == 1, body
                assert re.search(rf"range\(0, {chunks}\)", body) is None  # the header's
                assert f"range(0, {chunks})" in text
        gather = loops[0]
        if swizzle:
            assert gather.count("= CollectivePermute(") == 1, gather
        else:
            assert gather.count("= Broadcast(") == max(1, d // chunks), gather
        (attention,) = [line for line in text.splitlines() if "sdpfa_fwd(" in line]
        assert attention.startswith("  T"), attention  # at the top level: the loop ended


@pytest.mark.world_sizes(1, 2, 4)
@pytest.mark.parametrize(
    ("dtype", "loops"),
    [(torch.float32, (2, 2, False)), (torch.bfloat16, (None, 4, True))],
    ids=["f32-2-chunks", "bf16-swizzled-4-chunks"],
)
def test_block_matches_torch(multidevice_test, dtype, loops) -> None:
    """Each rank's shard of the output equals its shard of torch's block on one device
    (float32 to 1e-5, bf16 to the example's tolerance), unswizzled with 2 chunks per loop
    (float32) and swizzled with 4 per scatter loop (bf16; the example's main() runs the
    other two combinations at 1 and 4 ranks); the profiler counts, per run, 2 x the gather
    chunk count Broadcasts (or CollectivePermutes), 2 x the scatter chunk count
    ReduceScatters and no Allgather, Allreduce or whole-tensor ReduceScatter; on one
    rank, no collective at all (a copy per chunk)."""
    d, rank = multidevice_test.size, multidevice_test.rank
    full = random_inputs(dtype, seed=1)
    expected_full = reference(full)
    gather_chunks, scatter_chunks, swizzle = loops
    fd, tvs = define(
        d, dtype, gather_chunks=gather_chunks, scatter_chunks=scatter_chunks, swizzle=swizzle
    )
    local = [shard_tensor(t, tv, rank) for t, tv in zip(full, tvs, strict=True)]
    fd.execute(local)  # warm: lowering and teams
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        (out,) = fd.execute(local)
    expected = shard_tensor(expected_full, fd.host_ir().outputs[0], rank)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, **tolerance(expected))
    names = [event.name for event in prof.events() if event.name.startswith("hir::")]
    if d == 1:  # one device: each chunk a local copy (hir::set), no collective
        issued = {"hir::Broadcast", "hir::CollectivePermute", "hir::ReduceScatter"}
        assert issued.isdisjoint(names) and "hir::set" in names, names
        assert not [e.name for e in prof.events() if e.name.startswith("gloo:")]
        return
    gathers = gather_chunks or d
    gather_kinds = ["hir::CollectivePermute" if swizzle else "hir::Broadcast"]
    # One per chunk, or one per shard where a chunk holds several shards.
    assert sum(names.count(kind) for kind in gather_kinds) == 2 * max(gathers, d), names
    assert names.count("hir::ReduceScatter") == 2 * scatter_chunks, names
    assert "hir::Allreduce" not in names, names
    assert "hir::Allgather" not in names, names


@pytest.mark.world_sizes(2, 4)  # one rank: the example's main() under plain python
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_backward_matches_autograd(multidevice_test, dtype) -> None:
    """The block in stream loops saves what the backward reads; the backward of
    tensor_parallel_block_backward.py scheduled sequence-parallel gives each rank its
    shard of every gradient, equal to torch autograd's of the single-device block (float32
    to 1e-5, bf16 to that example's tolerance), the activations' gradients sharded over the
    sequence; at more than one rank exactly 4 Allgathers, 2 ReduceScatters and 6
    Allreduces (the example's BACKWARD_COLLECTIVES), at one rank none."""
    d, rank = multidevice_test.size, multidevice_test.rank
    grads, expected, backward = tpb.run_both(d, rank, dtype, seed=1, forward_define=saving_forward)
    for got, want in zip(grads, expected, strict=True):
        assert got.dtype == dtype
        torch.testing.assert_close(got, want, **tpb.tolerance(want))
    program = backward.host_ir()
    grad_x = program.outputs[0]
    assert grad_x.sharding.mesh_axes_of(1) == (MeshAxis.X,), grad_x  # sequence-sharded
    text = str(program)
    counts = {kind: text.count(f" = {kind}(") for kind in BACKWARD_COLLECTIVES}
    # One rank: a one-device team's collectives are local copies.
    assert counts == (BACKWARD_COLLECTIVES if d > 1 else dict.fromkeys(counts, 0)), text
