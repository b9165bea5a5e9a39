"""The creation, random, indexing and scan ops (``frontend.creation_ops``,
``frontend.indexing_ops``) against torch: unsharded on random data, sharded over 1, 2 and 4
ranks (each shard the slice of the single-device result; a scanned or indexed sharded dim
gathered first), dtypes, the refusals, and ``dtype()`` / ``DataType.UInt64``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from frontend import DataType, DeviceMesh, FusionDefinition, OperandError, ParallelType
from frontend import shard_tensor as shard
from hostir import HostIrError
from tests.multidevice_simulated import every_ranks

I32, I64 = torch.int32, torch.int64


def _define(fd: FusionDefinition, t: torch.Tensor):
    return fd.define_tensor(tuple(t.shape), dtype=t.dtype)


def _shard_dim0(tvs, d: int) -> None:
    """Every tensor of ``tvs`` on a 1-d mesh of ``d`` ranks, dim 0 split over them."""
    mesh = DeviceMesh(torch.arange(d))
    for tv in tvs:
        tv.set_device_mesh(mesh)
        tv.outer_split(0, d)
        tv.axis(0).parallelize(ParallelType.mesh_x)


# ----- unsharded --------------------------------------------------------------------------


def test_factories_and_triu() -> None:
    """full (a float fill truncates into Int), iota of ints and floats and of a tensor's size,
    triu at several diagonals on Float, Int32 and Bool data."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=generator)
    n = torch.randint(-9, 9, (2, 4, 6), generator=generator, dtype=I32)
    b = torch.rand(4, 4, generator=generator) > 0.5
    with FusionDefinition() as fd:
        tx, tn, tb = _define(fd, x), _define(fd, n), _define(fd, b)
        outs = [
            fd.ops.full([2, 3], 2.7, DataType.Int),
            fd.ops.full([fd.ops.size(tx, 1)], -1.5, dtype=DataType.Half),
            fd.ops.iota(6, 3, -2, DataType.Int32),
            fd.ops.iota(4, 0.5, 0.25, DataType.Double),
            fd.ops.iota(tx.size(0)),
            fd.ops.triu(tx),
            fd.ops.triu(tx, -2),
            fd.ops.triu(tn, 3),
            fd.ops.triu(tb, 1),
        ]
        for out in outs:
            fd.add_output(out)
    results = fd.execute([x, n, b])
    expected = [
        torch.full((2, 3), 2, dtype=I64),
        torch.full((7,), -1.5, dtype=torch.float16),
        torch.arange(3, -9, -2, dtype=I32),
        torch.arange(4, dtype=torch.float64) * 0.25 + 0.5,
        torch.arange(5),
        torch.triu(x),
        torch.triu(x, -2),
        torch.triu(n, 3),
        torch.triu(b, 1),
    ]
    for got, want in zip(results, expected, strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _random_fusion(dtype: DataType = DataType.Float) -> FusionDefinition:
    """uniform and normal, each seeded by two scalar inputs (seed, offset)."""
    with FusionDefinition() as fd:
        seed, offset = fd.define_scalar(DataType.Int), fd.define_scalar(DataType.Int)
        u = fd.ops.uniform(-2.0, 3.0, [64, 32], rng_seed=seed, rng_offset=offset, dtype=dtype)
        g = fd.ops.normal(1.0, 0.5, [64, 32], rng_seed=seed, rng_offset=offset, dtype=dtype)
        fd.add_output(u)
        fd.add_output(g)
    return fd


def test_random_seeded_and_unseeded() -> None:
    """Seeded: a function of (seed, offset): equal across executes and fusions, different for
    another offset, in range, with about the asked mean and spread; BFloat16 and Double.
    Unseeded: a new draw each execute, reproduced by torch.manual_seed."""
    fd = _random_fusion()
    u, g = fd.execute([7, 0])
    again = _random_fusion().execute([7, 0])
    assert torch.equal(u, again[0]) and torch.equal(g, again[1])
    assert not torch.equal(u, fd.execute([7, 1])[0])
    assert u.dtype == torch.float32 and -2.0 <= u.min() and u.max() < 3.0
    assert abs(float(u.mean()) - 0.5) < 0.2 and abs(float(g.mean()) - 1.0) < 0.1
    assert abs(float(g.std()) - 0.5) < 0.1
    half, double = _random_fusion(DataType.BFloat16), _random_fusion(DataType.Double)
    assert half.execute([7, 0])[0].dtype == torch.bfloat16
    assert double.execute([7, 0])[1].dtype == torch.float64
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.uniform(0.0, 1.0, [16]))
    torch.manual_seed(3)
    first, second = fd.execute([])[0], fd.execute([])[0]
    torch.manual_seed(3)
    assert not torch.equal(first, second) and torch.equal(fd.execute([])[0], first)


def test_indexing_and_scans() -> None:
    """index_select (Int and Int32 and 0-d indices), gather with a smaller index,
    take_along_axis broadcasting, cumsum keeping Half and Int32, topk both ways."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, generator=generator)
    h = torch.randn(3, 5, generator=generator).half()
    n = torch.randint(-5, 5, (3, 5), generator=generator, dtype=I32)
    picks = torch.tensor([5, 0, 2, 2], dtype=I32)
    one = torch.tensor(3)
    small = torch.randint(0, 6, (2, 3), generator=generator)
    along = torch.randint(0, 4, (1, 6), generator=generator)
    with FusionDefinition() as fd:
        tx, th, tn = _define(fd, x), _define(fd, h), _define(fd, n)
        tp, to, ts, ta = (_define(fd, t) for t in (picks, one, small, along))
        values, indices = fd.ops.topk(tx, 3, dim=1, sorted=True)
        low, _ = fd.ops.topk(tx, 2, dim=0, largest=False, sorted=True)
        outs = [
            fd.ops.index_select(tx, tp, 1),
            fd.ops.index_select(tx, to, 1),
            fd.ops.gather(tx, ts, 1),
            fd.ops.take_along_axis(tx, ta, 0),
            fd.ops.cumsum(th, 1),
            fd.ops.cumsum(tn, -2),
            values,
            indices,
            low,
        ]
        for out in outs:
            fd.add_output(out)
    results = fd.execute([x, h, n, picks, one, small, along])
    top = torch.topk(x, 3, dim=1, sorted=True)
    expected = [
        x.index_select(1, picks),
        x.index_select(1, one.reshape(1)),
        torch.gather(x, 1, small),
        torch.take_along_dim(x, along, 0),
        torch.cumsum(h, 1, dtype=torch.float16),
        torch.cumsum(n, 0, dtype=I32),
        top.values,
        top.indices,
        torch.topk(x, 2, dim=0, largest=False, sorted=True).values,
    ]
    for got, want in zip(results, expected, strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    # Each topk is one instruction of two results; the second's indices, used by
    # nothing, are freed right after it.
    text = str(fd.host_ir())
    assert text.count("topk(") == 2 and "deallocate T10\n" in text, text


def test_dtype_method_and_uint64() -> None:
    """``tv.dtype()`` (nvFuser's spelling) is ``tv.dtype``; UInt64 tensors are defined,
    cast, permuted and output; arithmetic on them is refused at definition."""
    seed = torch.tensor([5, 2**63 + 3], dtype=torch.uint64)
    with FusionDefinition() as fd:
        t = fd.define_tensor([2], dtype=DataType.UInt64)
        assert t.dtype() is t.dtype is DataType.UInt64
        scalar = fd.define_scalar(1.5)
        assert scalar.dtype() is DataType.Double
        fd.add_output(fd.ops.cast(t, DataType.Double))
        fd.add_output(fd.ops.broadcast(t, [True, False]))
        with pytest.raises(OperandError, match="uint64"):
            fd.ops.add(t, 1)
    as_double, expanded = fd.execute([seed])
    torch.testing.assert_close(as_double, seed.to(torch.float64))
    assert expanded.dtype == torch.uint64 and torch.equal(expanded[0], seed)


def _tensor(fd: FusionDefinition, shape=(4, 6), dtype=DataType.Float):
    return fd.define_tensor(list(shape), dtype=dtype)


REFUSALS: list[tuple[Callable, str]] = [
    (lambda fd: fd.ops.full([2, -1], 1.0, DataType.Float), "shape[1] must be a non-negative"),
    (lambda fd: fd.ops.full([2], "a", DataType.Float), "fill_value must be a number"),
    (lambda fd: fd.ops.full([2], 2**40, DataType.Int32), "does not fit Int32"),
    (lambda fd: fd.ops.full([fd.define_scalar(DataType.Double)], 1, DataType.Int), "integer"),
    (lambda fd: fd.ops.iota(4, 1, 1, DataType.Float), "takes a float start"),
    (lambda fd: fd.ops.iota(4, 0.0, 0.5), "takes an int start"),
    (lambda fd: fd.ops.iota(4, 0, 0), "step must not be 0"),
    (lambda fd: fd.ops.iota(4, dtype=DataType.Bool), "neither an integer nor a float"),
    (lambda fd: fd.ops.iota(2.5), "length must be a non-negative int"),
    (lambda fd: fd.ops.full([2], 1, "float"), "expected a DataType"),
    (lambda fd: fd.ops.uniform(0, 1, [2], dtype=DataType.Int), "floating-point"),
    (lambda fd: fd.ops.normal(0, 1, [2], rng_seed=3), "provided together"),
    (lambda fd: fd.ops.uniform(0, 1, [2], rng_seed=1.5, rng_offset=0), "rng_seed must be an int"),
    (lambda fd: fd.ops.uniform(0, 1, [2], DataType.Float), "positional"),
    (lambda fd: fd.ops.triu(_tensor(fd, (4,))), "needs at least 2"),
    (lambda fd: fd.ops.index_select(_tensor(fd), _tensor(fd, (3,)), 1), "indices are Int"),
    (
        lambda fd: fd.ops.index_select(_tensor(fd), _tensor(fd, (3, 2), DataType.Int), 1),
        "must be 1-d",
    ),
    (lambda fd: fd.ops.index_select(_tensor(fd), _tensor(fd, (3,), DataType.Int), 2), "dim 2"),
    (lambda fd: fd.ops.gather(_tensor(fd), _tensor(fd, (5, 2), DataType.Int), 1), "larger"),
    (lambda fd: fd.ops.gather(_tensor(fd), _tensor(fd, (4,), DataType.Int), 0), "same number"),
    (
        lambda fd: fd.ops.take_along_axis(_tensor(fd), _tensor(fd, (3, 2), DataType.Int), 1),
        "must be equal",
    ),
    (lambda fd: fd.ops.cumsum(_tensor(fd), 1, init=1.0), "init=1.0 is not supported"),
    (lambda fd: fd.ops.cumsum(_tensor(fd, dtype=DataType.Bool), 0), "takes numbers"),
    (lambda fd: fd.ops.topk(_tensor(fd), 7), "larger than dim 1"),
    (lambda fd: fd.ops.topk(_tensor(fd), fd.define_scalar(DataType.Double)), "an integer"),
    (lambda fd: fd.ops.topk(_tensor(fd), 2, largest=1), "largest"),
]


@pytest.mark.parametrize(("build", "fragment"), REFUSALS)
def test_refusals(build: Callable, fragment: str) -> None:
    """Each bad call is refused when the op is defined, naming what is wrong."""
    with pytest.raises(OperandError) as caught, FusionDefinition() as fd:
        build(fd)
    assert fragment in str(caught.value), str(caught.value)


# ----- sharded ----------------------------------------------------------------------------


@pytest.mark.world_sizes(1, 2, 4)
def test_creation_sharded(multidevice_test) -> None:
    """full, iota, seeded uniform and normal, triu: each rank's shard is the slice of the
    single-device result, with no communication; a replicated unseeded uniform is the same
    on every rank."""
    d, rank = multidevice_test.size, multidevice_test.rank
    x = torch.randn(2 * d, 2 * d, generator=torch.Generator().manual_seed(2))

    def build(fd: FusionDefinition, tx, seed):
        return [
            fd.ops.full([2 * d, 3], 1.5, DataType.BFloat16),
            fd.ops.iota(4 * d, 5, 3),
            fd.ops.uniform(0.0, 1.0, [2 * d, 5], rng_seed=seed, rng_offset=3),
            fd.ops.normal(2.0, 3.0, [2 * d, 5], rng_seed=seed, rng_offset=3, dtype=DataType.Half),
            fd.ops.triu(tx, 1),
        ]

    with FusionDefinition() as reference:
        outs = build(reference, _define(reference, x), reference.define_scalar(DataType.Int))
        for out in outs:
            reference.add_output(out)
    expected = reference.execute([x, 11])
    with FusionDefinition() as fd:
        tx, seed = _define(fd, x), fd.define_scalar(DataType.Int)
        outs = build(fd, tx, seed)
        replicated = fd.ops.uniform(0.0, 1.0, [3])
        for out in [*outs, replicated]:
            fd.add_output(out)
    _shard_dim0([tx, *outs], d)
    replicated.set_device_mesh(DeviceMesh(torch.arange(d)))
    torch.manual_seed(0)  # an unseeded op draws its seed here: the same on every rank
    *results, drawn = fd.execute([shard(x, tx, rank), 11])
    for got, tv, want in zip(results, outs, expected, strict=True):
        assert torch.equal(got, shard(want, tv, rank)), tv.name
    text = str(fd.host_ir())
    assert "Allgather" not in text and "Broadcast" not in text, text
    if d > 1:
        assert all(torch.equal(drawn, other) for other in every_ranks(drawn))


@pytest.mark.world_sizes(1, 2, 4)
def test_indexing_sharded(multidevice_test) -> None:
    """Along an unsharded dim, index_select, gather, take_along_axis, cumsum and topk
    compute locally (no communication); along the sharded dim, the input is gathered
    first (an Allgather) and the result sliced back; a sharded index shards the result."""
    d, rank = multidevice_test.size, multidevice_test.rank
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2 * d, 6, generator=generator)
    picks = torch.randint(0, 6, (4,), generator=generator)
    rows = torch.randint(0, 2 * d, (2 * d,), generator=generator)
    along = torch.randint(0, 6, (2 * d, 3), generator=generator)

    def local(fd, tx, tp, ta):
        values, indices = fd.ops.topk(tx, 2, dim=1, sorted=True)
        return [
            fd.ops.index_select(tx, tp, 1),
            fd.ops.gather(tx, ta, 1),
            fd.ops.take_along_axis(tx, ta, 1),
            fd.ops.cumsum(tx, 1),
            values,
            indices,
        ]

    with FusionDefinition() as fd:
        tx, tp, ta = _define(fd, x), _define(fd, picks), _define(fd, along)
        outs = local(fd, tx, tp, ta)
        for out in outs:
            fd.add_output(out)
    _shard_dim0([tx, ta, *outs], d)
    tp.set_device_mesh(DeviceMesh(torch.arange(d)))
    results = fd.execute([shard(x, tx, rank), picks, shard(along, ta, rank)])
    top = torch.topk(x, 2, dim=1, sorted=True)
    expected = [
        x.index_select(1, picks),
        torch.gather(x, 1, along),
        torch.take_along_dim(x, along, 1),
        torch.cumsum(x, 1),
        top.values,
        top.indices,
    ]
    for got, tv, want in zip(results, outs, expected, strict=True):
        torch.testing.assert_close(got, shard(want, tv, rank))
    text = str(fd.host_ir())
    assert "Allgather" not in text and "Allreduce" not in text, text

    fewer = along[:d]  # gather's index may be smaller than arg: its rows do not line up
    with FusionDefinition() as fd:
        tx, tr, tf = _define(fd, x), _define(fd, rows), _define(fd, fewer)
        outs = [
            fd.ops.cumsum(tx, 0),
            fd.ops.topk(tx, 2, dim=0, sorted=True)[0],
            fd.ops.index_select(tx, tr, 0),
            fd.ops.gather(tx, tf, 1),
        ]
        for out in outs:
            fd.add_output(out)
    _shard_dim0([tx, tr, tf, outs[0], outs[2], outs[3]], d)
    outs[1].set_device_mesh(DeviceMesh(torch.arange(d)))
    results = fd.execute([shard(x, tx, rank), shard(rows, tr, rank), shard(fewer, tf, rank)])
    expected = [
        torch.cumsum(x, 0),
        torch.topk(x, 2, dim=0).values,
        x.index_select(0, rows),
        torch.gather(x, 1, fewer),
    ]
    for got, tv, want in zip(results, outs, expected, strict=True):
        torch.testing.assert_close(got, shard(want, tv, rank))
    text = str(fd.host_ir())
    # T0 gathered once for the four ops (a tensor several ops read in one layout is moved
    # once; before issue 34, once per op), and gather's index; on one rank each gather is
    # a local copy
    assert text.count("Allgather") == (2 if d > 1 else 0), text


@pytest.mark.world_sizes(2)
def test_a_bad_index_into_a_gathered_dim_is_refused_on_each_rank(multidevice_test) -> None:
    """take_along_axis of an input sharded along the dim it indexes (made whole first, by an
    AllToAll to the index's rows: the indices are global) by an index sharded by rows: good
    data gives torch's result; an
    index past the extent on rank 0's shard and a negative one on rank 1's, which torch's
    take_along_dim wrapped around, are each refused on their rank, naming the position in
    that rank's shard (then a replay of the prepared call)."""
    d, rank = multidevice_test.size, multidevice_test.rank
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(4, 6, generator=generator)
    along = torch.randint(0, 6, (4, 2), generator=generator)
    with FusionDefinition() as fd:
        tx, ta = _define(fd, x), _define(fd, along)
        out = fd.ops.take_along_axis(tx, ta, 1)
        fd.add_output(out)
    _shard_dim0([ta, out], d)
    tx.set_device_mesh(DeviceMesh(torch.arange(d)))
    tx.outer_split(1, d)
    tx.axis(1).parallelize(ParallelType.mesh_x)
    (got,) = fd.execute([shard(x, tx, rank), shard(along, ta, rank)])
    torch.testing.assert_close(got, shard(torch.take_along_dim(x, along, 1), out, rank))
    text = str(fd.host_ir())
    assert text.count("AllToAll(") == 1 and "Allgather" not in text, text
    bad = along.clone()
    bad[1, 1], bad[3, 0] = 7, -1  # row 1 is rank 0's (its [1, 1]), row 3 rank 1's ([1, 0])
    held = {0: "7 at [1, 1]", 1: "-1 at [1, 0]"}[rank]
    with pytest.raises(HostIrError) as caught:
        fd.execute([shard(x, tx, rank), shard(bad, ta, rank)])
    assert type(caught.value).__name__ == "IndexDataError"
    assert f"(this rank's shard) holds {held}, out of range: expected 0 <= index < 6" in str(
        caught.value
    )


@pytest.mark.world_sizes(2)
def test_uint64_sharded(multidevice_test) -> None:
    """A UInt64 tensor (a philox seed) sharded, gathered by a set, cast on every rank."""
    d, rank = multidevice_test.size, multidevice_test.rank
    seeds = torch.tensor([3, 2**63 + 1, 7, 2**64 - 1], dtype=torch.uint64)
    with FusionDefinition() as fd:
        t = fd.define_tensor([4], dtype=DataType.UInt64)
        whole = fd.ops.set(t)
        fd.add_output(whole)
    _shard_dim0([t], d)
    whole.set_device_mesh(DeviceMesh(torch.arange(d)))
    (got,) = fd.execute([shard(seeds, t, rank)])
    assert torch.equal(got, seeds)


@pytest.mark.parametrize(
    ("scan", "reference"),
    [
        (lambda fd, x: fd.ops.cumsum(x, 0), lambda t: torch.cumsum(t, 0)),
        # topk's values in no promised order (sorted=False): compared sorted
        (
            lambda fd, x: fd.ops.topk(x, 4, dim=0)[0],
            lambda t: torch.topk(t, 4, dim=0).values,
        ),
    ],
    ids=["cumsum", "topk"],
)
def test_a_scanned_dim_split_into_stream_chunks_is_refused(
    scan: Callable, reference: Callable
) -> None:
    """A stream loop ran cumsum along its own stream-split dim chunk by chunk: every chunk
    restarted the scan, a silent wrong result (found when the three rules for axes an op
    computes whole became one, lowering.op_layouts). Now a LoweringError names the op and
    the axis; the same op with the other dim stream-split still runs, chunk by chunk."""
    data = torch.randn(8, 4)
    for dim in (0, 1):
        with FusionDefinition() as fd:
            x = fd.define_tensor((8, 4))
            y = scan(fd, x)
            fd.add_output(y)
        y.outer_split(dim, 2)
        y.axis(dim).parallelize(ParallelType.stream)
        if dim == 0:
            with pytest.raises(HostIrError, match=r"T\d+ = (cumsum|topk)\(...\): its axis 0"):
                fd.execute([data])
            continue
        assert "for " in str(fd.host_ir())  # it does run as a stream loop
        got, want = fd.execute([data])[0], reference(data)
        torch.testing.assert_close(got.sort(0).values, want.sort(0).values)


def test_an_iota_step_bound_to_0_is_refused_as_a_constant_0_is():
    """A constant step of 0 is refused when the op is defined; a scalar input's 0 is refused
    by name when it runs (it used to return ``start`` repeated), and a good step matches
    torch."""
    with FusionDefinition() as fd:
        start, step = fd.define_scalar(DataType.Int), fd.define_scalar(DataType.Int)
        fd.add_output(fd.ops.iota(5, start, step))
    (out,) = fd.execute([2, 3])
    assert torch.equal(out, torch.arange(5, dtype=torch.int64) * 3 + 2)
    with pytest.raises(HostIrError, match=r"iota defining T\d+: step must not be 0"):
        fd.execute([2, 0])
