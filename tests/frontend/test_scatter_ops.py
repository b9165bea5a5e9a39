"""``fd.ops.scatter``, ``scatter_add``, ``index_add`` and ``bincount`` (declared in
``hostir/ir/scatter_ops.py``, implemented in ``hostir/run/scatter_ops.py``, their methods
made from the declarations): torch's results on random data with repeated indices, every
dim, an empty index; out-of-range data refused by name; the refusals of bad operands;
text and JSON; how they shard (rows computed locally, the written dim gathered, a
sharded ``bincount`` summed by one Allreduce)."""

from __future__ import annotations

import re

import pytest
import torch

import hostir
from frontend import DataType, DeviceMesh, FusionDefinition, OperandError, ParallelType
from frontend import shard_tensor as shard
from hostir import HostIrContainer, IndexDataError, VerifyError

_DTYPES = {torch.int64: DataType.Int, torch.int32: DataType.Int32}


def _index(shape: tuple[int, ...], high: int, seed: int, dtype=torch.int64) -> torch.Tensor:
    """Random indices in ``[0, high)``: with more entries than ``high``, some repeat."""
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _shape(x: torch.Tensor) -> tuple[int, ...]:
    """``x``'s extents for ``define_tensor``: an empty dim symbolic (-1)."""
    return tuple(n or -1 for n in x.shape)


def _define(op: str, arg: torch.Tensor, index: torch.Tensor, src, dim: int) -> FusionDefinition:
    """A definition of ``op(arg, index, src, dim)`` (``src`` a tensor or a number)."""
    with FusionDefinition() as fd:
        a = fd.define_tensor(_shape(arg), dtype=DataType.of(arg.dtype))
        i = fd.define_tensor(_shape(index), dtype=_DTYPES[index.dtype])
        s = fd.define_tensor(_shape(src)) if isinstance(src, torch.Tensor) else src
        fd.add_output(getattr(fd.ops, op)(a, i, s, dim))
    return fd


def _inputs(arg, index, src) -> list:
    return [arg, index] + ([src] if isinstance(src, torch.Tensor) else [])


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_scatter_and_scatter_add_match_torch(dim: int, index_dtype: torch.dtype) -> None:
    """Random ``[5, 6]`` data, a ``[4, 3]`` index (extents below ``arg``'s and ``src``'s off
    ``dim`` too) whose entries repeat along ``dim``: ``scatter_add`` sums the repeats in
    index order (bitwise torch's), ``scatter`` of a permutation and of a scalar."""
    arg, src = _randn(5, 6, seed=1), _randn(4, 6, seed=2)
    high = arg.shape[dim]
    index = _index((4, 3), high, seed=3, dtype=index_dtype)
    assert len(index.unique()) < index.numel()  # repeats
    want = torch.scatter_add(arg, dim, index.long(), src)
    (got,) = _define("scatter_add", arg, index, src, dim).execute(_inputs(arg, index, src))
    assert torch.equal(got, want)
    # scatter with distinct positions along dim: every value is determined
    rows = torch.argsort(torch.rand(high, 3, generator=torch.Generator().manual_seed(4)), dim=0)
    unique = (rows[:4] if dim == 0 else rows[:3].T[:4]).to(index_dtype)
    for value in (src, -2.5):
        fd = _define("scatter", arg, unique, value, dim)
        (got,) = fd.execute(_inputs(arg, unique, value))
        assert torch.equal(got, torch.scatter(arg, dim, unique.long(), value)), value


def test_scatter_of_repeated_positions_writes_one_of_their_values() -> None:
    """Of several values for one position (torch leaves which unspecified) one is written;
    positions no index names keep ``arg``'s value."""
    arg, src = _randn(3, 4, seed=5), _randn(6, 4, seed=6)
    index = _index((6, 4), 3, seed=7)
    (got,) = _define("scatter", arg, index, src, 0).execute([arg, index, src])
    for j in range(4):
        for i in range(3):
            written = src[index[:, j] == i, j]
            assert got[i, j] in written if len(written) else got[i, j] == arg[i, j]


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_index_add_matches_torch(dim: int) -> None:
    """``index_add`` along each dim of a ``[3, 4, 5]`` tensor with a repeating index, and an
    empty index (``arg`` unchanged)."""
    arg = _randn(3, 4, 5, seed=8)
    for count in (7, 0):
        index = _index((count,), arg.shape[dim], seed=9)
        shape = list(arg.shape)
        shape[dim] = count
        src = _randn(*shape, seed=10)
        (got,) = _define("index_add", arg, index, src, dim).execute([arg, index, src])
        assert torch.equal(got, torch.index_add(arg, dim, index, src)), count


def _bincount(n: int, length, dtype=DataType.Int) -> tuple[FusionDefinition, list]:
    with FusionDefinition() as fd:
        values = fd.define_tensor((n,), dtype=dtype)
        counts = fd.ops.bincount(values, length)
        fd.add_output(counts)
    return fd, [values, counts]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_bincount_matches_torch(dtype: torch.dtype) -> None:
    """Exactly ``length`` Int counts, values 0 and ``length - 1`` included, an empty input
    all zeros; ``length`` may be a size of a tensor."""
    values = torch.cat([torch.tensor([0, 6]), _index((30,), 7, seed=11)]).to(dtype)
    fd, (_, counts) = _bincount(32, 7, _DTYPES[dtype])
    assert counts.dtype is DataType.Int
    (got,) = fd.execute([values])
    assert got.dtype is torch.int64 and torch.equal(got, torch.bincount(values, minlength=7))
    fd, _ = _bincount(-1, 5)
    assert torch.equal(fd.execute([torch.empty(0, dtype=torch.int64)])[0], torch.zeros(5).long())
    with FusionDefinition() as fd:
        values = fd.define_tensor((-1,), dtype=DataType.Int)
        table = fd.define_tensor((-1, 2))
        fd.add_output(fd.ops.bincount(values, table.size(0)))
    (got,) = fd.execute([values_ := _index((9,), 4, seed=12), torch.zeros(4, 2)])
    assert torch.equal(got, torch.bincount(values_, minlength=4))


def test_out_of_range_data_is_refused_by_name() -> None:
    """An index past the written dim, a negative one, a value past ``length``: an
    IndexDataError naming the op, the tensor, the position and the range (torch's bincount
    would give a longer result, its scatter its own message)."""
    arg, src = _randn(4, 3, seed=13), _randn(2, 3, seed=14)
    index = torch.tensor([[0, 1, 2], [3, 4, 0]])
    for op in ("scatter", "scatter_add"):
        with pytest.raises(
            IndexDataError,
            match=rf"{op} defining T3: index T1 holds 4 at \[1, 1\], out of range: expected"
            r" 0 <= index < 4 \(the extent of T0 dim 0\)",
        ):
            _define(op, arg, index, src, 0).execute([arg, index, src])
    with pytest.raises(IndexDataError, match=r"index_add defining T3: index T1 holds -1 at \[2\]"):
        index, rows = torch.tensor([0, 2, -1]), _randn(4, 3, seed=15)
        _define("index_add", arg, index, rows, 1).execute([arg, index, rows])
    fd, _ = _bincount(5, 3)
    with pytest.raises(
        IndexDataError,
        match=r"bincount defining T1: src T0 holds 3 at \[4\], out of range: expected 0 <= src < 3",
    ):
        fd.execute([torch.tensor([0, 1, 2, 2, 3])])


def test_bad_operands_are_refused_by_name() -> None:
    """Dtypes, dims and extents that torch would refuse, refused when the op is defined,
    naming the tensors."""
    with FusionDefinition() as fd:
        a = fd.define_tensor((4, 3))
        i = fd.define_tensor((2, 3), dtype=DataType.Int)
        f = fd.define_tensor((2, 3))
        h = fd.define_tensor((2, 3), dtype=DataType.Half)
        cases = {
            "scatter: the index T2 is Float; indices are Int or Int32": lambda: fd.ops.scatter(
                a, f, f, 0
            ),
            "scatter: src T3 is Half and T0 Float; they must have one dtype": lambda: (
                fd.ops.scatter(a, i, h, 0)
            ),
            "scatter_add: src 1.0 must be a tensor": lambda: fd.ops.scatter_add(a, i, 1.0, 0),
            "scatter: dim 2 is out of range for T0": lambda: fd.ops.scatter(a, i, f, 2),
            r"scatter: the index T\d+ has 1 dims and T0 2": lambda: fd.ops.scatter(
                a, fd.define_tensor((2,), dtype=DataType.Int), f, 0
            ),
            r"scatter: dim 0 of the index T1 \(2\) is larger than src T\d+'s \(1\)": lambda: (
                fd.ops.scatter(a, i, fd.define_tensor((1, 3)), 0)
            ),
            r"index_add: dim 0 of src T2 is 2; it must be the index T\d+'s length \(5\)": lambda: (
                fd.ops.index_add(a, fd.define_tensor((5,), dtype=DataType.Int), f)
            ),
            "index_add: the index T1 has 2 dims; it must be 1-d": lambda: fd.ops.index_add(a, i, f),
            "bincount: T0 is Float with 2 dims; bincount counts a 1-d Int or Int32": lambda: (
                fd.ops.bincount(a, 4)
            ),
        }
        cases["bincount: length must be a non-negative int, got -1"] = lambda: fd.ops.bincount(
            i, -1
        )
        for message, define in cases.items():
            with pytest.raises(OperandError, match=message):
                define()
        fd.add_output(fd.ops.scatter(a, i, f, 0))


def test_bincount_takes_its_length_from_a_scalar_input():
    """``length`` bound at execute, as ``topk``'s ``k``: one lowering, each value counted."""
    with FusionDefinition() as fd:
        values = fd.define_tensor((-1,), dtype=DataType.Int)
        length = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.bincount(values, length))
    generator = torch.Generator().manual_seed(5)
    for n in (4, 7):
        data = torch.randint(0, 4, (9,), generator=generator)
        (out,) = fd.execute([data, n])
        assert torch.equal(out, torch.bincount(data, minlength=n))


TEXT = """%HostIrContainer {
  input T0 : float32[4, 6]
  input T1 : int64[3, 6]
  input T2 : float32[3, 6]
  input T4 : int64[3]
  T3 : float32[4, 6] = scatter_add(T0, T1, src=T2, dim=0)
  T5 : float32[4, 6] = index_add(T3, T4, src=T2, dim=0)
  deallocate T3
  T6 : int64[7] = bincount(T4, length=7)
  output T5
  output T6
}
"""


def test_text_json_and_the_verifier() -> None:
    """The lowered program prints as above, parses back and round-trips through JSON; the
    verifier refuses a wrong result dtype, and an index_add src of another length than
    the index, in the frontend's words."""
    with FusionDefinition() as fd:
        a = fd.define_tensor((4, 6))
        i = fd.define_tensor((3, 6), dtype=DataType.Int)
        s = fd.define_tensor((3, 6))
        added = fd.ops.scatter_add(a, i, s, 0)
        j = fd.define_tensor((3,), dtype=DataType.Int)
        fd.add_output(fd.ops.index_add(added, j, s, 0))
        fd.add_output(fd.ops.bincount(j, 7))
    program = fd.host_ir()
    assert str(program) == TEXT
    assert hostir.parse(TEXT) == program
    assert HostIrContainer.from_json(program.to_json()) == program
    with pytest.raises(VerifyError, match="int32"):
        hostir.parse(TEXT.replace("T6 : int64", "T6 : int32"))
    with pytest.raises(
        VerifyError,
        match=r"index_add: dim 0 of src T2 is 3; it must be the index T4's length \(5\)",
    ):
        hostir.parse(TEXT.replace("T4 : int64[3]", "T4 : int64[5]"))


def _collectives(text: str) -> list[str]:
    return re.findall(r"= ([A-Z]\w+)\(", text)


@pytest.mark.world_sizes(2, 4)
def test_sharded(multidevice_test) -> None:
    """Rows split over the ranks. ``scatter_add`` and ``index_add`` along dim 1 compute each
    rank's rows (no communication); along the split dim 0 the operands are gathered first
    (Allgathers only), as along dim 1 with an index of fewer rows than ``arg``.
    ``bincount`` of a split input: each rank counts its shard, one
    Allreduce sums the counts (a ReduceScatter where the counts are split too)."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    arg, src = _randn(2 * d, 6, seed=16), _randn(2 * d, 6, seed=17)
    for dim, gathered in ((1, False), (0, True)):
        index = _index((2 * d, 6), arg.shape[dim], seed=18 + dim)
        line = _index((6,), arg.shape[dim], seed=20)
        with FusionDefinition() as fd:
            a = fd.define_tensor((2 * d, 6))
            i = fd.define_tensor((2 * d, 6), dtype=DataType.Int)
            s = fd.define_tensor((2 * d, 6))
            j = fd.define_tensor((6,), dtype=DataType.Int)
            t = fd.define_tensor((2 * d, 6) if dim == 1 else (6, 6))
            added = fd.ops.scatter_add(a, i, s, dim)
            summed = fd.ops.index_add(a, j, t, dim)
            fd.add_output(added)
            fd.add_output(summed)
        for tv in (a, i, s, added, summed) + ((t,) if dim == 1 else ()):
            tv.set_device_mesh(mesh)
            tv.outer_split(0, d)
            tv.axis(0).parallelize(ParallelType.mesh_x)
        for tv in (j,) + (() if dim == 1 else (t,)):
            tv.set_device_mesh(mesh)
        table = src if dim == 1 else _randn(6, 6, seed=22)
        inputs = [shard(x, tv, rank) for x, tv in ((arg, a), (index, i), (src, s), (line, j))]
        outs = fd.execute([*inputs, shard(table, t, rank)])
        assert torch.equal(outs[0], shard(torch.scatter_add(arg, dim, index, src), added, rank))
        want = torch.index_add(arg, dim, line, table)
        assert torch.equal(outs[1], shard(want, summed, rank)), dim
        kinds = set(_collectives(str(fd.host_ir())))
        assert kinds == ({"Allgather"} if gathered else set()), (dim, kinds)
    # index and src of d rows: their row r is arg's row r, not row r of a rank's shard, so
    # the rows are computed whole (gathered), though scattered along dim 1
    index, few = _index((d, 6), 6, seed=23), _randn(d, 6, seed=24)
    with FusionDefinition() as fd:
        a = fd.define_tensor((2 * d, 6))
        i = fd.define_tensor((d, 6), dtype=DataType.Int)
        s = fd.define_tensor((d, 6))
        out = fd.ops.scatter_add(a, i, s, 1)
        fd.add_output(out)
    for tv in (a, i, s, out):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, d)
        tv.axis(0).parallelize(ParallelType.mesh_x)
    (got,) = fd.execute([shard(arg, a, rank), shard(index, i, rank), shard(few, s, rank)])
    assert torch.equal(got, shard(torch.scatter_add(arg, 1, index, few), out, rank))
    assert set(_collectives(str(fd.host_ir()))) == {"Allgather"}
    values = _index((4 * d,), 2 * d, seed=21)
    with FusionDefinition() as fd:
        tv = fd.define_tensor((4 * d,), dtype=DataType.Int)
        counts, scattered = fd.ops.bincount(tv, 2 * d), fd.ops.bincount(tv, 2 * d)
        fd.add_output(counts)
        fd.add_output(scattered)
    for sharded in (tv, scattered):  # scattered: its counts split as its input's values
        sharded.set_device_mesh(mesh)
        sharded.outer_split(0, d)
        sharded.axis(0).parallelize(ParallelType.mesh_x)
    got = fd.execute([shard(values, tv, rank)])
    want = torch.bincount(values, minlength=2 * d)
    assert torch.equal(got[0], want) and torch.equal(got[1], shard(want, scattered, rank))
    text = str(fd.host_ir())
    assert _collectives(text) == ["Allreduce", "ReduceScatter"], text
