"""``fd.ops.argsort`` (declared in ``hostir/ir/indexing.py``, implemented in
``hostir/run/indexing.py``, its method made from the declaration; docs/extending.md's
"Adding an op"): torch's positions on random data, its refusals, its text and JSON, and
how it shards (the sorted dim whole, as cumsum's)."""

from __future__ import annotations

import pytest
import torch

import hostir
from frontend import DataType, DeviceMesh, FusionDefinition, OperandError, ParallelType
from frontend import shard_tensor as shard
from frontend.ops import Ops
from hostir import HostIrContainer, HostIrError, HostIrEvaluator, VerifyError


def _argsorted(x: torch.Tensor, dim: int, **options) -> tuple[FusionDefinition, list]:
    """A definition of ``argsort`` of a tensor of ``x``'s shape and dtype."""
    with FusionDefinition() as fd:
        tx = fd.define_tensor(tuple(x.shape), dtype=x.dtype)
        out = fd.ops.argsort(tx, dim, **options)
        fd.add_output(out)
    return fd, [tx, out]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.int64])
@pytest.mark.parametrize(("dim", "descending"), [(0, False), (1, True), (-1, False)])
def test_positions_match_torch(dtype: torch.dtype, dim: int, descending: bool) -> None:
    """Int positions equal to ``torch.argsort``'s (stable, so ties in the int data are
    broken alike), compiled and interpreted."""
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 7, generator=generator) * 4).to(dtype)
    fd, (_, out) = _argsorted(x, dim, descending=descending, stable=True)
    assert out.dtype is DataType.Int
    want = torch.argsort(x, dim=dim, descending=descending, stable=True)
    (got,) = fd.execute([x])
    assert got.dtype is torch.int64 and torch.equal(got, want)
    (interpreted,) = HostIrEvaluator(fd.host_ir(), compiled=False).run([x])
    assert torch.equal(interpreted, want)


def test_unstable_sort_of_distinct_values() -> None:
    """The defaults (ascending, not stable) on data without ties."""
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    fd, _ = _argsorted(x, 1)
    (got,) = fd.execute([x])
    assert torch.equal(got, torch.argsort(x, dim=1))


def test_its_method_is_made_from_the_declaration_and_refuses_by_name() -> None:
    """No method is written for it; the made one has nvFuser's signature and refuses a dim
    out of range, a non-tensor and a non-bool flag, naming the op."""
    import inspect

    assert inspect.signature(Ops.argsort).parameters.keys() == {
        "self",
        "arg",
        "dim",
        "descending",
        "stable",
    }
    with FusionDefinition() as fd:
        t = fd.define_tensor((4, 6))
        with pytest.raises(OperandError, match="argsort: dim 2 is out of range for T0"):
            fd.ops.argsort(t, 2)
        with pytest.raises(OperandError, match="argsort: arg must be a TensorView"):
            fd.ops.argsort([t], 0)
        with pytest.raises(OperandError, match="argsort: descending must be True or False"):
            fd.ops.argsort(t, 0, descending=1)
        fd.add_output(fd.ops.argsort(t, 0))


TEXT = """%HostIrContainer {
  input T0 : float32[4, 6]
  T1 : int64[4, 6] = argsort(T0, dim=1, descending=true, stable=false)
  output T1
}
"""


def test_text_json_and_the_verifier() -> None:
    """The lowered program prints as above, parses back and round-trips through JSON; the
    verifier refuses a dim out of range and a result that is not Int."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(2))
    fd, _ = _argsorted(x, 1, descending=True)
    program = fd.host_ir()
    assert str(program) == TEXT
    assert hostir.parse(TEXT) == program
    assert HostIrContainer.from_json(program.to_json()) == program
    with pytest.raises(VerifyError, match="argsort: dim 2 is out of range for T0 with 2 dims"):
        hostir.parse(TEXT.replace("dim=1", "dim=2"))
    with pytest.raises(VerifyError, match="int32"):
        hostir.parse(TEXT.replace("T1 : int64", "T1 : int32"))


@pytest.mark.world_sizes(2)
def test_sharded(multidevice_test) -> None:
    """Rows split over 2 ranks: sorted along dim 1, each rank sorts its rows (no
    communication); sorted along the split dim 0, which it computes whole, the input is
    gathered first (one Allgather) and each rank keeps its rows of the positions."""
    d, rank = multidevice_test.size, multidevice_test.rank
    x = torch.randn(2 * d, 6, generator=torch.Generator().manual_seed(3))
    mesh = DeviceMesh(torch.arange(d))
    for dim, gathers in ((1, 0), (0, 1)):
        fd, tvs = _argsorted(x, dim)
        for tv in tvs:
            tv.set_device_mesh(mesh)
            tv.outer_split(0, d)
            tv.axis(0).parallelize(ParallelType.mesh_x)
        (got,) = fd.execute([shard(x, tvs[0], rank)])
        assert torch.equal(got, shard(torch.argsort(x, dim=dim), tvs[1], rank)), dim
        text = str(fd.host_ir())
        assert text.count("Allgather") == gathers, text
        assert "Allreduce" not in text and "AllToAll" not in text, text


def test_a_stream_split_of_the_sorted_dim_is_refused() -> None:
    """Chunk by chunk along the sorted dim, each chunk would be sorted alone: refused by
    name (as cumsum's and topk's); split along the other dim it runs chunk by chunk."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(4))
    for dim in (0, 1):
        fd, (_, out) = _argsorted(x, 0)
        out.outer_split(dim, 2)
        out.axis(dim).parallelize(ParallelType.stream)
        if dim == 0:
            with pytest.raises(HostIrError, match=r"T1 = argsort\(...\): its axis 0"):
                fd.execute([x])
            continue
        assert "for " in str(fd.host_ir())
        (got,) = fd.execute([x])
        assert torch.equal(got, torch.argsort(x, dim=0))
