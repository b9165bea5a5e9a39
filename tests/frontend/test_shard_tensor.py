"""shard_tensor(t, tv, rank): the piece of an unsharded tensor each rank holds.

Every test asks for the piece of every rank of the mesh (single process, explicit
``rank=``) and compares it with a reference built by plain index arithmetic from
SPEC §3: a split axis's index is a mixed-radix number of its loop pieces, outer
first (``outer_split(f)``: ``i = o * (e / f) + r``; ``inner_split(f)``:
``i = o * f + r``), and a piece parallelized over a mesh axis is fixed to the
device's coordinate on that axis (``mesh_x`` = last mesh dim, ``mesh_y`` the
second to last, ``mesh_z`` the third to last). The reference never calls the
library's own slicing helpers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
import torch
import torch.distributed as dist

from frontend import (
    DataType,
    DeviceMesh,
    FusionDefinition,
    ParallelType,
    ScheduleError,
    TensorView,
    shard_tensor,
)

X = ParallelType.mesh_x
Y = ParallelType.mesh_y
Z = ParallelType.mesh_z

SYMBOLIC = pytest.mark.parametrize("symbolic", [False, True], ids=["const", "symbolic"])


# ----- helpers -----


def make_tv(
    shape: Sequence[int], symbolic: bool = False, dtype: DataType = DataType.Float
) -> TensorView:
    """A fusion input of ``shape`` (all extents -1 if ``symbolic``), not yet scheduled."""
    with FusionDefinition() as fd:
        tv = fd.define_tensor([-1] * len(shape) if symbolic else list(shape), dtype=dtype)
        fd.add_output(fd.ops.set(tv))
    return tv


def arange(*shape: int) -> torch.Tensor:
    """A tensor of ``shape`` whose elements are their own flat index (all distinct)."""
    n = 1
    for extent in shape:
        n *= extent
    return torch.arange(n, dtype=torch.float32).reshape(shape)


def digits_to_indices(extents: Sequence[int], fixed: dict[int, int]) -> list[int]:
    """Indices ``sum(d_k * prod(extents[k+1:]))`` with digits at ``fixed`` positions set;
    the free digits run over their range, outer first (the local order)."""
    free = [k for k in range(len(extents)) if k not in fixed]
    indices = []
    for combo in itertools.product(*(range(extents[k]) for k in free)):
        digits = {**fixed, **dict(zip(free, combo, strict=True))}
        index = 0
        for k, extent in enumerate(extents):
            index = index * extent + digits[k]
        indices.append(index)
    return indices


def take(t: torch.Tensor, indices: Sequence[Sequence[int] | None]) -> torch.Tensor:
    """``t`` restricted to the given index list per dim (None: the whole dim)."""
    for dim, index in enumerate(indices):
        if index is not None:
            t = t.index_select(dim, torch.tensor(index, dtype=torch.long))
    return t


def block(coordinate: int, size: int) -> list[int]:
    """The indices of block ``coordinate`` of ``size`` elements."""
    return [coordinate * size + j for j in range(size)]


def all_pieces(t: torch.Tensor, tv: TensorView, ranks: Sequence[int]) -> dict[int, torch.Tensor]:
    """The piece of every rank in ``ranks``."""
    return {rank: shard_tensor(t, tv, rank=rank) for rank in ranks}


def assert_exact_cover(t: torch.Tensor, pieces: Sequence[torch.Tensor]) -> None:
    """The pieces together hold every element of ``t`` (all distinct) exactly once."""
    held = torch.cat([p.flatten() for p in pieces]).sort().values
    assert torch.equal(held, t.flatten().sort().values)


def assert_piece(piece: torch.Tensor | None, expected: torch.Tensor) -> None:
    """``piece`` equals ``expected`` exactly, in dtype and shape too, and is contiguous."""
    assert piece is not None
    assert piece.dtype == expected.dtype
    assert piece.shape == expected.shape
    assert torch.equal(piece, expected)
    assert piece.is_contiguous()


# ----- no sharding -----


@SYMBOLIC
def test_no_mesh_returns_whole_tensor(symbolic):
    """A tensor without a mesh is not distributed: any rank gets the whole tensor."""
    tv = make_tv((4, 6), symbolic)
    t = arange(4, 6)
    for rank in range(3):
        assert_piece(shard_tensor(t, tv, rank=rank), t)


@SYMBOLIC
def test_replicated_on_mesh(symbolic):
    """A tensor on a mesh with no parallelized axis is whole on every rank of the mesh."""
    tv = make_tv((4, 6), symbolic)
    tv.set_device_mesh(DeviceMesh([0, 1, 2]))
    t = arange(4, 6)
    for piece in all_pieces(t, tv, range(3)).values():
        assert_piece(piece, t)


# ----- one sharded dim, 1-d mesh -----


@SYMBOLIC
def test_outer_split_dim0_blocks(symbolic):
    """outer_split(0, 4) with the outer piece on mesh_x: rank r holds rows 2r and 2r+1."""
    tv = make_tv((8, 3), symbolic)
    tv.set_device_mesh(DeviceMesh(range(4)))
    tv.outer_split(0, 4)
    tv.axis(0).parallelize(X)
    t = arange(8, 3)
    pieces = all_pieces(t, tv, range(4))
    for rank, piece in pieces.items():
        assert_piece(piece, t[[2 * rank, 2 * rank + 1]])
    assert torch.equal(torch.cat([pieces[r] for r in range(4)]), t)


@SYMBOLIC
@pytest.mark.parametrize("dim", [1, 2])
def test_outer_split_inner_dim_blocks(symbolic, dim):
    """outer_split of a non-outermost dim of a 3-d tensor gives contiguous blocks of that dim."""
    shape = (3, 4, 6)
    tv = make_tv(shape, symbolic)
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.outer_split(dim, 2)
    tv.axis(dim).parallelize(X)
    t = arange(*shape)
    pieces = all_pieces(t, tv, [0, 1])
    for rank, piece in pieces.items():
        index: list[list[int] | None] = [None, None, None]
        index[dim] = block(rank, shape[dim] // 2)
        assert_piece(piece, take(t, index))
    assert torch.equal(torch.cat([pieces[0], pieces[1]], dim=dim), t)


@SYMBOLIC
def test_inner_split_outer_piece_blocks(symbolic):
    """inner_split(0, 4) of extent 8 with the outer piece parallelized gives blocks of 4."""
    tv = make_tv((8,), symbolic)
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.inner_split(0, 4)
    tv.axis(0).parallelize(X)
    t = arange(8)
    pieces = all_pieces(t, tv, [0, 1])
    assert_piece(pieces[0], torch.tensor([0.0, 1, 2, 3]))
    assert_piece(pieces[1], torch.tensor([4.0, 5, 6, 7]))


@SYMBOLIC
def test_inner_split_inner_piece_cyclic(symbolic):
    """inner_split(0, 2) of extent 8 with the inner piece parallelized: device c holds c::2."""
    tv = make_tv((8,), symbolic)
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.inner_split(0, 2)
    tv.axis(1).parallelize(X)
    t = arange(8)
    pieces = all_pieces(t, tv, [0, 1])
    assert_piece(pieces[0], torch.tensor([0.0, 2, 4, 6]))
    assert_piece(pieces[1], torch.tensor([1.0, 3, 5, 7]))
    assert torch.equal(torch.stack([pieces[0], pieces[1]], dim=-1).flatten(), t)


@SYMBOLIC
def test_outer_split_inner_piece_cyclic_on_dim1(symbolic):
    """outer_split(1, 3) of extent 12 with the inner piece (4) on a 4-device mesh is cyclic."""
    tv = make_tv((2, 12), symbolic)
    tv.set_device_mesh(DeviceMesh(range(4)))
    tv.outer_split(1, 3)  # [2, 3, 4]: index = o * 4 + c
    tv.axis(2).parallelize(X)
    t = arange(2, 12)
    pieces = all_pieces(t, tv, range(4))
    for c, piece in pieces.items():
        assert_piece(piece, t[:, [c, 4 + c, 8 + c]])
    rebuilt = torch.stack([pieces[c] for c in range(4)], dim=-1).reshape(2, 12)
    assert torch.equal(rebuilt, t)


@SYMBOLIC
def test_split_with_inner_split_flag(symbolic):
    """split(axis, f, inner_split=False) is outer_split and split(axis, f) is inner_split."""
    t = arange(4, 6)
    outer = make_tv((4, 6), symbolic)
    outer.set_device_mesh(DeviceMesh([0, 1]))
    outer.split(1, 2, inner_split=False)  # [4, 2, 3]
    outer.axis(1).parallelize(X)
    inner = make_tv((4, 6), symbolic)
    inner.set_device_mesh(DeviceMesh([0, 1]))
    inner.split(1, 2)  # [4, 3, 2]
    inner.axis(2).parallelize(X)
    for c in range(2):
        assert_piece(shard_tensor(t, outer, rank=c), t[:, block(c, 3)])
        assert_piece(shard_tensor(t, inner, rank=c), t[:, [c, 2 + c, 4 + c]])


# ----- nested splits -----


@SYMBOLIC
def test_outer_then_inner_split_middle_piece(symbolic):
    """[24] -> outer_split 2 -> inner_split 3 -> [2, 4, 3]; the middle piece over 4 devices."""
    tv = make_tv((24,), symbolic)
    tv.set_device_mesh(DeviceMesh(range(4)))
    tv.outer_split(0, 2)
    tv.inner_split(1, 3)
    tv.axis(1).parallelize(X)
    t = arange(24)
    pieces = all_pieces(t, tv, range(4))
    for c, piece in pieces.items():
        expected = [3 * c, 3 * c + 1, 3 * c + 2, 12 + 3 * c, 12 + 3 * c + 1, 12 + 3 * c + 2]
        assert_piece(piece, t[expected])
    assert_exact_cover(t, list(pieces.values()))


@SYMBOLIC
def test_inner_split_then_split_outer_piece(symbolic):
    """[16] -> inner_split 4 -> [4, 4] -> outer_split of the outer piece -> [2, 2, 4]."""
    tv = make_tv((16,), symbolic)
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.inner_split(0, 4)
    tv.outer_split(0, 2)
    tv.axis(1).parallelize(X)  # index = a * 8 + b * 4 + c
    t = arange(16)
    pieces = all_pieces(t, tv, [0, 1])
    assert_piece(pieces[0], t[[0, 1, 2, 3, 8, 9, 10, 11]])
    assert_piece(pieces[1], t[[4, 5, 6, 7, 12, 13, 14, 15]])


@SYMBOLIC
def test_three_level_split_on_non_outer_dim(symbolic):
    """Dim 1 of extent 24 split to [2, 3, 2, 2]; the 3-piece over a 3-device mesh."""
    tv = make_tv((2, 24), symbolic)
    tv.set_device_mesh(DeviceMesh([0, 1, 2]))
    tv.outer_split(1, 2)  # [2, 2, 12]
    tv.outer_split(2, 3)  # [2, 2, 3, 4]
    tv.inner_split(3, 2)  # [2, 2, 3, 2, 2]
    tv.axis(2).parallelize(X)
    t = arange(2, 24)
    pieces = all_pieces(t, tv, range(3))
    for c, piece in pieces.items():
        assert_piece(piece, take(t, [None, digits_to_indices([2, 3, 2, 2], {1: c})]))
    assert_exact_cover(t, list(pieces.values()))


# ----- 2-d and 3-d meshes -----


@SYMBOLIC
def test_two_dims_on_2d_mesh(symbolic):
    """Dim 0 over mesh_y and dim 1 over mesh_x of a 2x3 mesh: rank (y, x) holds block (y, x)."""
    mesh = DeviceMesh(torch.arange(6).reshape(2, 3))
    tv = make_tv((4, 6), symbolic)
    tv.set_device_mesh(mesh)
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(Y)
    tv.outer_split(2, 3)
    tv.axis(2).parallelize(X)
    t = arange(4, 6)
    pieces = all_pieces(t, tv, range(6))
    for rank, piece in pieces.items():
        y, x = rank // 3, rank % 3
        assert_piece(piece, take(t, [block(y, 2), block(x, 2)]))
    rows = [torch.cat([pieces[3 * y + x] for x in range(3)], dim=1) for y in range(2)]
    assert torch.equal(torch.cat(rows, dim=0), t)


@SYMBOLIC
def test_two_dims_on_2d_mesh_swapped_axes(symbolic):
    """Dim 0 over mesh_x and dim 1 over mesh_y of a 2x3 mesh."""
    mesh = DeviceMesh(torch.arange(6).reshape(2, 3))
    tv = make_tv((6, 4), symbolic)
    tv.set_device_mesh(mesh)
    tv.outer_split(0, 3)
    tv.axis(0).parallelize(X)
    tv.outer_split(2, 2)
    tv.axis(2).parallelize(Y)
    t = arange(6, 4)
    pieces = all_pieces(t, tv, range(6))
    for rank, piece in pieces.items():
        y, x = rank // 3, rank % 3
        assert_piece(piece, take(t, [block(x, 2), block(y, 2)]))
    assert_exact_cover(t, list(pieces.values()))


@SYMBOLIC
def test_one_dim_on_both_mesh_axes_yx(symbolic):
    """Dim 0 split [y, x, 2] on a 2x3 mesh: index = y * 6 + x * 2 + j."""
    mesh = DeviceMesh(torch.arange(6).reshape(2, 3))
    tv = make_tv((12, 2), symbolic)
    tv.set_device_mesh(mesh)
    tv.outer_split(0, 2)  # [2, 6]
    tv.outer_split(1, 3)  # [2, 3, 2]
    tv.axis(0).parallelize(Y)
    tv.axis(1).parallelize(X)
    t = arange(12, 2)
    pieces = all_pieces(t, tv, range(6))
    for rank, piece in pieces.items():
        y, x = rank // 3, rank % 3
        assert_piece(piece, t[[y * 6 + x * 2, y * 6 + x * 2 + 1]])
    # y-major: concatenating in rank order (y outer, x inner) rebuilds the tensor
    assert torch.equal(torch.cat([pieces[r] for r in range(6)]), t)


@SYMBOLIC
def test_one_dim_on_both_mesh_axes_xy(symbolic):
    """Dim 0 split [x, y, 2] on a 2x3 mesh: index = x * 4 + y * 2 + j."""
    mesh = DeviceMesh(torch.arange(6).reshape(2, 3))
    tv = make_tv((12, 2), symbolic)
    tv.set_device_mesh(mesh)
    tv.outer_split(0, 3)  # [3, 4]
    tv.outer_split(1, 2)  # [3, 2, 2]
    tv.axis(0).parallelize(X)
    tv.axis(1).parallelize(Y)
    t = arange(12, 2)
    pieces = all_pieces(t, tv, range(6))
    for rank, piece in pieces.items():
        y, x = rank // 3, rank % 3
        assert_piece(piece, t[[x * 4 + y * 2, x * 4 + y * 2 + 1]])
    # x-major: x outer, y inner
    assert torch.equal(torch.cat([pieces[3 * y + x] for x in range(3) for y in range(2)]), t)


@SYMBOLIC
def test_2d_mesh_one_axis_replicates_over_other(symbolic):
    """Sharding only over mesh_x of a 2x2 mesh: the two rows of the mesh hold the same pieces."""
    mesh = DeviceMesh([[2, 0], [3, 1]])
    tv = make_tv((4, 2), symbolic)
    tv.set_device_mesh(mesh)
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(X)
    t = arange(4, 2)
    pieces = all_pieces(t, tv, range(4))
    # mesh_x coordinate: 2 -> 0, 0 -> 1, 3 -> 0, 1 -> 1
    for rank, x in {2: 0, 0: 1, 3: 0, 1: 1}.items():
        assert_piece(pieces[rank], t[block(x, 2)])


@SYMBOLIC
def test_3d_mesh_three_sharded_dims(symbolic):
    """2x2x2 mesh: dim 0 blocks over mesh_z, dim 1 cyclic over mesh_y, dim 2 blocks over mesh_x."""
    mesh = DeviceMesh(torch.arange(8).reshape(2, 2, 2))
    shape = (4, 6, 8)
    tv = make_tv(shape, symbolic)
    tv.set_device_mesh(mesh)
    tv.outer_split(0, 2)  # [z, 2, 6, 8]
    tv.axis(0).parallelize(Z)
    tv.inner_split(2, 2)  # [z, 2, 3, y, 8]
    tv.axis(3).parallelize(Y)
    tv.outer_split(4, 2)  # [z, 2, 3, y, x, 4]
    tv.axis(4).parallelize(X)
    t = arange(*shape)
    pieces = all_pieces(t, tv, range(8))
    for rank, piece in pieces.items():
        z, y, x = rank // 4, (rank // 2) % 2, rank % 2
        expected = take(t, [block(z, 2), [y, y + 2, y + 4], block(x, 4)])
        assert_piece(piece, expected)
    assert_exact_cover(t, list(pieces.values()))


@SYMBOLIC
def test_3d_mesh_z_and_x_on_one_dim(symbolic):
    """Dim 1 split [x, z, 2] on a 2x3x2 mesh; dim 0 over mesh_y; ranks differ only in y
    coordinate on dim 0."""
    mesh = DeviceMesh(torch.arange(12).reshape(2, 3, 2))
    tv = make_tv((6, 8), symbolic)
    tv.set_device_mesh(mesh)
    tv.outer_split(0, 3)  # [y, 2, 8]
    tv.axis(0).parallelize(Y)
    tv.outer_split(2, 2)  # [y, 2, x, 4]
    tv.outer_split(3, 2)  # [y, 2, x, z, 2]
    tv.axis(2).parallelize(X)
    tv.axis(3).parallelize(Z)
    t = arange(6, 8)
    pieces = all_pieces(t, tv, range(12))
    for rank, piece in pieces.items():
        z, y, x = rank // 6, (rank // 2) % 3, rank % 2
        columns = [x * 4 + z * 2, x * 4 + z * 2 + 1]
        assert_piece(piece, take(t, [block(y, 2), columns]))
    assert_exact_cover(t, list(pieces.values()))


# ----- device order, subsets -----


@SYMBOLIC
def test_mesh_not_in_rank_order(symbolic):
    """On DeviceMesh([3, 1, 0, 2]) the device at mesh position p holds block p."""
    tv = make_tv((8, 2), symbolic)
    tv.set_device_mesh(DeviceMesh([3, 1, 0, 2]))
    tv.outer_split(0, 4)
    tv.axis(0).parallelize(X)
    t = arange(8, 2)
    pieces = all_pieces(t, tv, range(4))
    for position, rank in enumerate([3, 1, 0, 2]):
        assert_piece(pieces[rank], t[block(position, 2)])
    assert torch.equal(torch.cat([pieces[r] for r in [3, 1, 0, 2]]), t)


@SYMBOLIC
def test_2d_mesh_not_in_rank_order(symbolic):
    """On [[2, 0], [3, 1]] with dim 0 over mesh_y and dim 1 over mesh_x, coordinates decide."""
    tv = make_tv((4, 6), symbolic)
    tv.set_device_mesh(DeviceMesh([[2, 0], [3, 1]]))
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(Y)
    tv.inner_split(2, 2)  # dim 1: [3, x] cyclic
    tv.axis(3).parallelize(X)
    t = arange(4, 6)
    coordinates = {2: (0, 0), 0: (0, 1), 3: (1, 0), 1: (1, 1)}
    pieces = all_pieces(t, tv, range(4))
    for rank, (y, x) in coordinates.items():
        assert_piece(pieces[rank], take(t, [block(y, 2), [x, x + 2, x + 4]]))
    assert_exact_cover(t, list(pieces.values()))


@SYMBOLIC
def test_subset_mesh(symbolic):
    """Ranks outside the mesh get None; the mesh's devices split the tensor among themselves."""
    tv = make_tv((4, 3), symbolic)
    tv.set_device_mesh(DeviceMesh([3, 1]))
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(X)
    t = arange(4, 3)
    for rank in (0, 2, 4, 100):
        assert shard_tensor(t, tv, rank=rank) is None
    assert_piece(shard_tensor(t, tv, rank=3), t[[0, 1]])
    assert_piece(shard_tensor(t, tv, rank=1), t[[2, 3]])


def test_subset_mesh_replicated():
    """A replicated tensor on a subset mesh is whole inside the mesh and None outside."""
    tv = make_tv((2, 2))
    tv.set_device_mesh(DeviceMesh([[4, 5], [6, 7]]))
    t = arange(2, 2)
    for rank in range(4):
        assert shard_tensor(t, tv, rank=rank) is None
    for rank in range(4, 8):
        assert_piece(shard_tensor(t, tv, rank=rank), t)


# ----- loop order, stream axes, swizzle -----


@SYMBOLIC
def test_reorder_before_parallelize(symbolic):
    """Moving the device axis to the front with reorder does not change what a device holds."""
    mesh = DeviceMesh(range(3))
    t = arange(4, 6)
    plain = make_tv((4, 6), symbolic)
    plain.set_device_mesh(mesh)
    plain.outer_split(1, 3)  # [4, 3, 2]
    plain.axis(1).parallelize(X)
    moved = make_tv((4, 6), symbolic)
    moved.set_device_mesh(mesh)
    moved.outer_split(1, 3)
    moved.reorder({1: 0})  # [3, 4, 2]
    moved.axis(0).parallelize(X)
    for rank in range(3):
        expected = t[:, block(rank, 2)]
        assert_piece(shard_tensor(t, plain, rank=rank), expected)
        assert_piece(shard_tensor(t, moved, rank=rank), expected)


@SYMBOLIC
def test_reorder_after_parallelize(symbolic):
    """Reordering loop axes after parallelizing, even across dims, keeps the pieces."""
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    tv = make_tv((4, 6), symbolic)
    tv.set_device_mesh(mesh)
    tv.inner_split(0, 2)  # [2, y, 6]
    tv.axis(1).parallelize(Y)
    tv.outer_split(2, 2)  # [2, y, x, 3]
    tv.axis(2).parallelize(X)
    tv.reorder({2: 0, 0: 3})  # [x, y, 3, 2]
    t = arange(4, 6)
    for rank in range(4):
        y, x = rank // 2, rank % 2
        assert_piece(shard_tensor(t, tv, rank=rank), take(t, [[y, y + 2], block(x, 3)]))


@SYMBOLIC
def test_stream_axes_keep_data_local(symbolic):
    """A stream-parallel axis is a host loop: without mesh axes every rank holds everything."""
    tv = make_tv((8, 4), symbolic)
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(ParallelType.stream)
    t = arange(8, 4)
    for rank in range(2):
        assert_piece(shard_tensor(t, tv, rank=rank), t)


@SYMBOLIC
def test_stream_axis_beside_mesh_axis(symbolic):
    """A stream axis on dim 0 and a mesh axis on dim 1: only dim 1 is divided."""
    tv = make_tv((8, 4), symbolic)
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.outer_split(0, 2)  # [stream, 4, 4]
    tv.axis(0).parallelize(ParallelType.stream)
    tv.outer_split(2, 2)  # [stream, 4, x, 2]
    tv.axis(2).parallelize(X)
    t = arange(8, 4)
    for rank in range(2):
        assert_piece(shard_tensor(t, tv, rank=rank), t[:, block(rank, 2)])


@SYMBOLIC
def test_stream_axis_inside_sharded_dim(symbolic):
    """Splitting a device's block further into a stream axis keeps the whole block local."""
    tv = make_tv((16,), symbolic)
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.outer_split(0, 2)  # [x, 8]
    tv.axis(0).parallelize(X)
    tv.outer_split(1, 4)  # [x, stream, 2]
    tv.axis(1).parallelize(ParallelType.stream)
    t = arange(16)
    for rank in range(2):
        assert_piece(shard_tensor(t, tv, rank=rank), t[block(rank, 8)])


@SYMBOLIC
def test_swizzled_stream_axis_keeps_data_local(symbolic):
    """swizzle1d only reorders iteration: a swizzled stream axis leaves the whole tensor local."""
    tv = make_tv((4, 3), symbolic)
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.outer_split(0, 2)
    tv.swizzle1d(0, X)
    tv.axis(0).parallelize(ParallelType.stream)
    t = arange(4, 3)
    for rank in range(2):
        assert_piece(shard_tensor(t, tv, rank=rank), t)


# ----- dtypes and random data -----


@SYMBOLIC
def test_bf16_random_data(symbolic):
    """bf16 data is sliced exactly and keeps its dtype (2x2 mesh, both dims sharded)."""
    generator = torch.Generator().manual_seed(0)
    t = torch.randn(4, 8, generator=generator).to(torch.bfloat16)
    tv = make_tv((4, 8), symbolic, dtype=DataType.BFloat16)
    tv.set_device_mesh(DeviceMesh([[0, 1], [2, 3]]))
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(Y)
    tv.inner_split(2, 2)
    tv.axis(3).parallelize(X)
    for rank in range(4):
        y, x = rank // 2, rank % 2
        expected = take(t, [block(y, 2), [x, x + 2, x + 4, x + 6]])
        assert_piece(shard_tensor(t, tv, rank=rank), expected)


def test_non_contiguous_input():
    """A transposed (non-contiguous) input is sliced by its logical indices."""
    t = arange(6, 4).t()  # shape (4, 6), not contiguous
    tv = make_tv((4, 6))
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.inner_split(1, 2)
    tv.axis(2).parallelize(X)
    for rank in range(2):
        assert_piece(shard_tensor(t, tv, rank=rank), t[:, [rank, rank + 2, rank + 4]].contiguous())


# ----- default rank and errors -----


def test_default_rank_is_zero_without_process_group():
    """Without torch.distributed, rank defaults to 0."""
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group exists: the default rank is the real one")
    tv = make_tv((4,))
    tv.set_device_mesh(DeviceMesh([1, 0]))
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(X)
    assert_piece(shard_tensor(arange(4), tv), torch.tensor([2.0, 3.0]))


def test_wrong_rank_of_tensor():
    """A tensor with the wrong number of dims raises ScheduleError naming the tensor."""
    tv = make_tv((4, 6))
    with pytest.raises(ScheduleError, match=r"T0.*2 dims.*3"):
        shard_tensor(arange(4, 6, 1), tv, rank=0)


def test_wrong_extent():
    """A tensor whose extent differs from a constant extent raises ScheduleError."""
    tv = make_tv((4, 6))
    with pytest.raises(ScheduleError, match=r"T0 dim 1 has extent 6.*5"):
        shard_tensor(arange(4, 5), tv, rank=0)


@pytest.mark.parametrize("symbolic", [False, True], ids=["const", "symbolic"])
def test_non_divisible_split(symbolic):
    """A split that does not divide the tensor's extent raises ScheduleError naming it."""
    tv = make_tv((6,), symbolic)
    tv.set_device_mesh(DeviceMesh(range(4)))
    tv.outer_split(0, 4)
    tv.axis(0).parallelize(X)
    with pytest.raises(ScheduleError, match=r"T0.*extent 6.*factor 4"):
        shard_tensor(arange(6), tv, rank=0)


def test_non_divisible_split_of_local_part():
    """inner_split by 3 of a device's 4-long block (symbolic extent 8) raises ScheduleError."""
    tv = make_tv((8,), symbolic=True)
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(X)
    tv.inner_split(1, 3)
    with pytest.raises(ScheduleError, match=r"T0.*extent 4.*factor 3"):
        shard_tensor(arange(8), tv, rank=0)


def test_symbolic_extent_mismatch_with_mesh():
    """A device axis whose symbolic extent resolves to a size other than the mesh's raises."""
    tv = make_tv((8,), symbolic=True)
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.inner_split(0, 2)  # [i0 // 2, 2]; i0 = 8 makes the device axis 4 long
    tv.axis(0).parallelize(X)
    with pytest.raises(ScheduleError, match=r"T0.*extent 4.*mesh_x.*2 devices"):
        shard_tensor(arange(8), tv, rank=0)
