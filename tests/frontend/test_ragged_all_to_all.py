"""``fd.ops.ragged_all_to_all`` (frontend/expert_ops.py, lowering/emit_run_time.py): rows by
counts each device computes, out and back, at 1, 2 and 4 ranks against torch; the program's
communications; bad counts named on every rank; what the frontend and lowering refuse.
"""

from __future__ import annotations

import pytest
import torch

from frontend import DataType, DeviceMesh, FusionDefinition, OperandError, ParallelType
from hostir import RunTimeExtentError
from lowering.errors import LoweringError

ROWS, WIDTH = 5, 3


def define(d: int, mesh: bool = True) -> FusionDefinition:
    """Each device's row of counts in, rows out by them, doubled, a second tensor (their
    row numbers) by the same counts, and everything back."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([d, ROWS, WIDTH])
        counts = fd.define_tensor([d, d], dtype=DataType.Int)
        received = fd.ops.ragged_all_to_all(x, counts)
        arrived = fd.ops.size(received, 1)
        numbers = fd.ops.broadcast_in_dim(fd.ops.iota(ROWS, dtype=DataType.Int), [d, ROWS], [1])
        numbered = fd.ops.ragged_all_to_all(numbers, counts, extent=arrived)
        back = fd.ops.ragged_all_to_all(fd.ops.mul(received, 2.0), counts, True, ROWS)
        for out in (received, numbered, back):
            fd.add_output(out)
    if mesh:
        for tv in (x, counts, numbers):
            tv.set_device_mesh(DeviceMesh(torch.arange(d)))
            tv.outer_split(0, d)
            tv.axis(0).parallelize(ParallelType.mesh_x)
    return fd


def counts_of(d: int, generator: torch.Generator) -> torch.Tensor:
    rows = []
    for _ in range(d):
        cuts = torch.randint(0, ROWS + 1, (d - 1,), generator=generator).sort().values
        edges = torch.cat([torch.tensor([0]), cuts, torch.tensor([ROWS])])
        rows.append(edges[1:] - edges[:-1])
    return torch.stack(rows)


@pytest.mark.world_sizes(1, 2, 4)
def test_rows_go_out_and_back_by_the_devices_counts(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    fd = define(d)
    generator = torch.Generator().manual_seed(11)
    for _ in range(4):
        counts, data = counts_of(d, generator), torch.randn(d, ROWS, WIDTH, generator=generator)
        received, numbered, back = fd.execute([data[rank : rank + 1], counts[rank : rank + 1]])
        starts = [int(counts[p, :rank].sum()) for p in range(d)]
        pieces = [data[p, s : s + int(counts[p, rank])] for p, s in enumerate(starts)]
        assert torch.equal(received[0], torch.cat(pieces))
        numbers = [torch.arange(s, s + int(counts[p, rank])) for p, s in enumerate(starts)]
        assert torch.equal(numbered[0], torch.cat(numbers))
        assert torch.equal(back[0], data[rank] * 2)
    text = str(fd.host_ir())
    assert text.count("= to_host(") == 1 and text.count("= RaggedAllToAll(") == 3
    assert text.count("= Allgather(") == (1 if d > 1 else 0)  # each device's row of counts


@pytest.mark.world_sizes(2, 4)
def test_a_bad_count_is_named_on_every_rank(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    fd = define(d)
    counts = torch.zeros(d, d, dtype=torch.int64)
    counts[:, 0] = ROWS
    counts[1, 0], counts[1, d - 1] = ROWS + 1, -1  # device 1 sends -1 rows to the last
    with pytest.raises(RunTimeExtentError, match=f"member 1 sends -1 rows to member {d - 1}"):
        fd.execute([torch.randn(1, ROWS, WIDTH), counts[rank : rank + 1]])


def test_what_is_refused_by_name():
    with FusionDefinition() as fd:
        x = fd.define_tensor([2, ROWS, WIDTH])
        with pytest.raises(OperandError, match="transpose=True needs it"):
            fd.ops.ragged_all_to_all(x, fd.define_tensor([2, 2], dtype=DataType.Int), True)
        with pytest.raises(OperandError, match=r"expected counts \[D, D\]"):
            fd.ops.ragged_all_to_all(x, fd.define_tensor([3, 2], dtype=DataType.Int))
        fd.add_output(x)
    with pytest.raises(LoweringError, match="its dim 0 is on no mesh"):
        define(1, mesh=False).host_ir()
