"""The shape ops (``reshape``, ``slice``, ``pad``, ``cat``, ``squeeze``, ``expand``,
``stride_order``) against torch: unsharded, their refusals, and sharded over 1, 2 and 4
ranks, where a reshape keeps a sharded dim's blocks (no communication) or the dim is
gathered first (an Allgather in the program)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from frontend import DataType, DeviceMesh, FusionDefinition, OperandError, ParallelType
from frontend.exprs import FusionOp
from frontend.sharding import shard_tensor
from hostir import HostIrError, HostIrEvaluator, VerifyError, parse
from hostir.ir.shape_ops import CAT, PAD, RESHAPE, SLICE
from lowering import LoweringError


def _data(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-50, 50, shape, generator=generator, dtype=dtype)
    return torch.randn(shape, generator=generator).to(dtype)


def _run(build: Callable, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(tuple(t.shape), dtype=t.dtype) for t in inputs]
        for out in build(fd, *tvs):
            fd.add_output(out)
    return fd.execute(inputs)


# ----- unsharded ----------------------------------------------------------------------------


def test_reshape_splits_merges_and_infers() -> None:
    """Splits, merges, a regrouping ([6, 4] -> [4, 6]), a -1, sizes as entries."""
    x = _data((2, 6, 4), 1)

    def build(fd, t):
        return [
            fd.ops.reshape(t, [2, 6, 2, 2]),
            fd.ops.reshape(t, [fd.ops.mul(t.size(0), t.size(1)), -1]),
            fd.ops.reshape(t, (2, 4, 6)),
            fd.ops.reshape(t, [-1]),
            fd.ops.reshape(t, [1, 2, 24, 1]),
        ]

    outs = _run(build, [x])
    expected = [x.reshape(2, 6, 2, 2), x.reshape(12, 4), x.reshape(2, 4, 6), x.reshape(48)]
    expected.append(x.reshape(1, 2, 24, 1))
    for out, want in zip(outs, expected, strict=True):
        assert torch.equal(out, want)


def test_reshape_of_symbolic_extents() -> None:
    """A tensor of extents known at execute: [b, s, e] -> [b * s, e] -> [b, s, e]."""
    x = _data((3, 5, 4), 2)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, -1, -1])
        b, s, e = t.shape()
        flat = fd.ops.reshape(t, [b * s, e])  # Python's * on sizes, as nvFuser's Vals take
        back = fd.ops.reshape(flat, [t.size(0), 1 * s, -1])
        fd.add_output(flat)
        fd.add_output(back)
    flat_out, back_out = fd.execute([x])
    assert torch.equal(flat_out, x.reshape(15, 4)) and torch.equal(back_out, x)


def test_slice_pad_cat_squeeze_expand_stride_order() -> None:
    """Each against torch; nvFuser's clamping of an end past the extent; dtypes kept."""
    x, y = _data((4, 6), 3), _data((4, 2), 4)
    ints, flags = _data((4, 6), 5, torch.int32), _data((4, 6), 6, torch.bool)

    def build(fd, a, b, i, f):
        return [
            fd.ops.slice(a, [1, 2], [3, 100]),  # the end is clamped to the extent 6
            fd.ops.slice(a, [0, 1], [4, 5], strides=[1, 1], manual_normalization=True),
            fd.ops.pad(a, [1, 2]),
            fd.ops.pad(a, [0, 1, 2, 0], value=-1.5),
            fd.ops.pad(i, [1, 1], 7),
            fd.ops.pad(f, [1, 0], True),
            fd.ops.cat([a, b, a], dim=1),
            fd.ops.cat([i, i], dim=0),
            fd.ops.squeeze(fd.ops.broadcast(a, [False, True, False]), [1]),
            fd.ops.squeeze(fd.ops.broadcast_in_dim(a, [4, 3, 6], [0, 2]), [1], True),
            fd.ops.expand(fd.ops.broadcast(a, [True, False, False]), [3, -1, 6]),
            fd.ops.stride_order(a, [0, 1]),
        ]

    outs = _run(build, [x, y, ints, flags])
    pad = torch.nn.functional.pad
    expected = [
        x[1:3, 2:],
        x[:, 1:5],
        pad(x, [1, 2]),
        pad(x, [0, 1, 2, 0], value=-1.5),
        pad(ints, [1, 1], value=7),
        pad(flags, [1, 0], value=True),
        torch.cat([x, y, x], 1),
        torch.cat([ints, ints], 0),
        x,
        x,
        x.expand(3, 4, 6),
        x,
    ]
    for out, want in zip(outs, expected, strict=True):
        assert out.dtype == want.dtype
        assert torch.equal(out, want)


def _defined(build: Callable) -> None:
    with FusionDefinition() as fd:
        t = fd.define_tensor((4, 6))
        s = fd.define_tensor([-1, 6])
        i = fd.define_tensor((4, 6), dtype=DataType.Int32)
        build(fd, t, s, i)
        fd.add_output(t)


REFUSALS = [
    (lambda fd, t, s, i: fd.ops.reshape(t, [5, 5]), ("reshape of T0", "do not match")),
    (lambda fd, t, s, i: fd.ops.reshape(t, [-1, -1]), ("at most one -1",)),
    (lambda fd, t, s, i: fd.ops.reshape(t, [5, -1]), ("no whole extent for its -1",)),
    (
        lambda fd, t, s, i: fd.ops.reshape(t, [fd.define_scalar(dtype=DataType.Double), 6]),
        ("new_shape[0] = s0 must be an integer scalar",),
    ),
    # Counts that certainly differ; where the symbols cannot tell ([i0, 6] -> [4, 6], or
    # a scalar input), the reshape requires them equal at execute (test_scalar_extents.py).
    (lambda fd, t, s, i: fd.ops.reshape(s, [s.size(0) * 2, 6]), ("do not match",)),
    (lambda fd, t, s, i: fd.ops.slice(t, [0, 0], [4, 6], [1, 2]), ("strides[1] = 2",)),
    (lambda fd, t, s, i: fd.ops.slice(t, [0, 3], [4, 2]), ("before start",)),
    (lambda fd, t, s, i: fd.ops.slice(t, [-1, 0], [4, 6]), ("T0 dim 0", "start -1 is negative")),
    (lambda fd, t, s, i: fd.ops.slice(t, [0], [4]), ("1 start_indices", "2 dims")),
    (lambda fd, t, s, i: fd.ops.slice(t, [0, 0], [4, 7], None, True), ("past the extent",)),
    (lambda fd, t, s, i: fd.ops.slice(s, [0, 0], [2, 6]), ("known only at execute",)),
    (lambda fd, t, s, i: fd.ops.pad(t, [1]), ("even number",)),
    (lambda fd, t, s, i: fd.ops.pad(t, [1, -1]), ("T0 dim 1", "right width -1 is negative")),
    (lambda fd, t, s, i: fd.ops.pad(t, [1, 1], 0), ("tensor's kind", "float")),
    (lambda fd, t, s, i: fd.ops.pad(i, [1, 1], 0.5), ("tensor's kind", "int")),
    (lambda fd, t, s, i: fd.ops.cat([t, i], 0), ("one dtype",)),
    (lambda fd, t, s, i: fd.ops.cat([t, fd.ops.slice(t, [0, 0], [4, 3])], 0), ("dim 1",)),
    (lambda fd, t, s, i: fd.ops.cat([t, t], 0, True), ("manual_padding",)),
    (lambda fd, t, s, i: fd.ops.cat([], 0), ("empty",)),
    (lambda fd, t, s, i: fd.ops.squeeze(t, [0]), ("not a broadcast dim",)),
    (
        lambda fd, t, s, i: fd.ops.squeeze(fd.ops.broadcast_in_dim(t, [4, 3, 6], [0, 2]), [1]),
        ("squeeze_expanded",),
    ),
    (lambda fd, t, s, i: fd.ops.squeeze(t, [2]), ("out of range",)),
    (lambda fd, t, s, i: fd.ops.expand(t, [4]), ("1 entries", "2 dims")),
    (lambda fd, t, s, i: fd.ops.stride_order(t, [0, 0]), ("permutation",)),
]


@pytest.mark.parametrize(("build", "fragments"), REFUSALS)
def test_refusals(build: Callable, fragments: tuple[str, ...]) -> None:
    """Each refused when the op is defined, by an OperandError naming what is wrong."""
    with pytest.raises(OperandError) as caught:
        _defined(build)
    assert isinstance(caught.value, HostIrError)
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


# ----- sharded ------------------------------------------------------------------------------


def _shard(tv, mesh: DeviceMesh, dim: int, d: int) -> None:
    tv.set_device_mesh(mesh)
    tv.outer_split(dim, d)
    tv.axis(dim).parallelize(ParallelType.mesh_x)


def _check(fd, outs: list[torch.Tensor], expected: list[torch.Tensor], rank: int) -> None:
    for value, out, want in zip(fd.host_ir().outputs, outs, expected, strict=True):
        torch.testing.assert_close(out, shard_tensor(want, value, rank), rtol=0, atol=0)


@pytest.mark.world_sizes(1, 2, 4)
def test_transformer_reshapes_stay_local(multidevice_test) -> None:
    """test_transformer.py's reshapes, sharded as there: [b, s, 3e] sharded on 3e to
    [b, s, h, 3e/h] (h sharded), sliced on the last dim into q, k, v, joined back (cat on
    the last dim, stride_order) and merged to [b, s, 3e]; [b*s, 4e] -> [b, s, 4e] with 4e
    sharded; [b, s, e] -> [b*s, e] with b sharded, and with s sharded when b is 1 (sequence
    parallel): each rank reshapes its own shard, and nothing is communicated."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    b, s, h, e = 4, 4, 8, 16
    qkv, mlp, act = _data((b, s, 3 * e), 7), _data((b * s, 4 * e), 8), _data((b, s, e), 9)
    seq = _data((1, s, e), 10)
    with FusionDefinition() as fd:
        qkv_tv = fd.define_tensor((b, s, 3 * e))
        mlp_tv = fd.define_tensor((b * s, 4 * e))
        act_tv = fd.define_tensor((b, s, e))
        seq_tv = fd.define_tensor((1, s, e))
        heads = fd.ops.reshape(qkv_tv, [b, s, h, 3 * e // h])
        q, k, v = (
            fd.ops.slice(heads, [0, 0, 0, i * e // h], [b, s, h, (i + 1) * e // h])
            for i in range(3)
        )
        joined = fd.ops.stride_order(fd.ops.cat([q, k, v], dim=3), [3, 2, 1, 0])
        merged = fd.ops.reshape(joined, [b, s, 3 * e])
        unflat = fd.ops.reshape(mlp_tv, [b, s, 4 * e])
        flat = fd.ops.reshape(act_tv, [b * s, e])
        seq_flat = fd.ops.reshape(seq_tv, [s, e])
        for out in (heads, q, merged, unflat, flat, seq_flat):
            fd.add_output(out)
    _shard(qkv_tv, mesh, 2, d)
    _shard(mlp_tv, mesh, 1, d)
    _shard(act_tv, mesh, 0, d)
    _shard(seq_tv, mesh, 1, d)
    pairs = ((qkv, qkv_tv), (mlp, mlp_tv), (act, act_tv), (seq, seq_tv))
    outs = fd.execute([shard_tensor(t, tv, rank) for t, tv in pairs])
    text = str(fd.host_ir())
    assert "Allgather" not in text and "AllToAll" not in text, text
    outputs = fd.host_ir().outputs
    for output, dim in zip(outputs, (2, 2, 2, 2, 0, 0), strict=True):
        assert output.sharding.mesh_axes_of(dim), (output, dim)
    heads_ref = qkv.reshape(b, s, h, 3 * e // h)
    expected = [heads_ref, heads_ref[..., : e // h], qkv, mlp.reshape(b, s, 4 * e)]
    expected += [act.reshape(b * s, e), seq.reshape(s, e)]
    _check(fd, outs, expected, rank)


@pytest.mark.world_sizes(1, 2, 4)
def test_reshapes_that_gather_first(multidevice_test) -> None:
    """A merge with its inner dim sharded ([b, s, e] -> [b*s, e], s sharded), a split whose
    outer extent the devices do not divide ([2, 16] sharded on 16 to [2, 2, 8] over 4), a
    slice, a pad and a cat of a sharded dim: the dim is gathered first (an Allgather), and
    the values are right."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    x, y = _data((3, 4, 5), 10), _data((2, 16), 11)
    with FusionDefinition() as fd:
        x_tv = fd.define_tensor((3, 4, 5))
        y_tv = fd.define_tensor((2, 16))
        merged = fd.ops.reshape(x_tv, [12, 5])
        split = fd.ops.reshape(y_tv, [2, 2, 8])
        sliced = fd.ops.slice(y_tv, [0, 1], [2, 9])
        padded = fd.ops.pad(y_tv, [1, 1])
        joined = fd.ops.cat([y_tv, y_tv], dim=1)
        beside = fd.ops.cat([y_tv, y_tv], dim=0)  # along an unsharded dim: local
        for out in (merged, split, sliced, padded, joined, beside):
            fd.add_output(out)
    _shard(x_tv, mesh, 1, d)
    _shard(y_tv, mesh, 1, d)
    outs = fd.execute([shard_tensor(x, x_tv, rank), shard_tensor(y, y_tv, rank)])
    text = str(fd.host_ir())
    assert ("Allgather" in text) == (d > 1), text  # on one device, a local copy instead
    assert fd.host_ir().outputs[5].sharding.mesh_axes_of(1) or d == 1
    pad = torch.nn.functional.pad
    expected = [x.reshape(12, 5), y.reshape(2, 2, 8), y[:, 1:9], pad(y, [1, 1])]
    expected += [torch.cat([y, y], 1), torch.cat([y, y], 0)]
    _check(fd, outs, expected, rank)


@pytest.mark.world_sizes(1, 2, 4)
def test_ops_beside_a_sharded_dim_stay_local(multidevice_test) -> None:
    """A tensor sharded on dim 0, each op acting on dims beside it: slice, pad and cat of
    dim 1, squeeze and expand of a new broadcast dim, stride_order and permute: every
    rank computes its own rows (the program communicates nothing) and the shards are
    torch's."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    x = _data((2 * d, 6), 13)
    with FusionDefinition() as fd:
        a = fd.define_tensor((2 * d, 6))
        outs = [
            fd.ops.slice(a, [0, 1], [2 * d, 5]),
            fd.ops.pad(a, [1, 2]),
            fd.ops.cat([a, a], dim=1),
            fd.ops.squeeze(fd.ops.broadcast(a, [False, True, False]), [1]),
            fd.ops.expand(fd.ops.broadcast(a, [False, True, False]), [-1, 3, -1]),
            fd.ops.stride_order(a, [0, 1]),
            fd.ops.permute(a, [1, 0]),
        ]
        for out in outs:
            fd.add_output(out)
    _shard(a, mesh, 0, d)
    results = fd.execute([shard_tensor(x, a, rank)])
    text = str(fd.host_ir())
    for collective in ("Allgather", "Allreduce", "Broadcast", "AllToAll", "Permute", "Send"):
        assert collective not in text, text
    expected = [
        x[:, 1:5],
        torch.nn.functional.pad(x, [1, 2]),
        torch.cat([x, x], 1),
        x,
        x.unsqueeze(1).expand(-1, 3, -1),
        x,
        x.T,
    ]
    rows = slice(2 * rank, 2 * rank + 2)
    for out, want in zip(results, expected, strict=True):
        local = want[:, rows] if want is expected[-1] else want[rows]
        torch.testing.assert_close(out, local, rtol=0, atol=0)


@pytest.mark.world_sizes(1, 2, 4)
def test_privatize_squeeze(multidevice_test) -> None:
    """nvFuser's test_multidevice.py::test_privatize_squeeze: broadcast then squeeze of a
    tensor sharded on dim 0, then sums over the sharded dim (an Allreduce) and another."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        inp_tv = fd.define_tensor((-1, -1, -1), dtype=DataType.BFloat16)
        tv1 = fd.ops.broadcast(inp_tv, [True, False, False, False])
        tv2 = fd.ops.squeeze(tv1, dims=[0])
        tv3 = fd.ops.cast(tv2, dtype=DataType.Float)
        fd.add_output(fd.ops.sum(tv3, dims=[0]))
        fd.add_output(fd.ops.sum(tv3, dims=[1]))
    _shard(inp_tv, mesh, 0, d)
    inp_ref = _data((d * 3, 5, 6), 12, torch.bfloat16)
    inp = shard_tensor(inp_ref, inp_tv, rank)
    out1, out2 = fd.execute([inp])
    torch.testing.assert_close(out1, inp_ref.float().sum(0))
    torch.testing.assert_close(out2, inp.float().sum(1))


# ----- host IR: the instructions' verifier rules --------------------------------------------

BAD_PROGRAMS = [
    (
        "input T0 : float32[4, 6]\n  T1 : float32[5, 5] = reshape(T0)\n  output T1",
        "reshape of T0: from [4, 6] to [5, 5]: the extents do not match",
    ),
    (
        "input T0 : float32[4, 6]\n  T1 : int32[4, 6] = reshape(T0)\n  output T1",
        "T1 is declared int32, but the op gives float32",
    ),
    (
        "mesh M0 = [2] : [1]\n  input T0 : float32[4, 6] @M0 {0: [x, 2]}\n"
        "  T1 : float32[2, 6] @M0 = slice(T0, dim=0, start=0, stop=2)\n  output T1",
        "slice: dim 0 of T0 is sharded; it must be whole on each rank",
    ),
    (
        "input T0 : float32[4, 6]\n  T1 : float32[4, 3] = slice(T0, dim=1, start=1, stop=3)\n"
        "  output T1",
        "slice: T1 is declared with extents [4, 3], but the op gives [4, 2]",
    ),
    (
        "input T0 : float32[4, 6]\n  input T1 : int32[4, 6]\n"
        "  T2 : float32[8, 6] = cat(T0, T1, dim=0)\n  output T2",
        "cat: T1 is int32 but T0 is float32; nvFuser concatenates tensors of one dtype",
    ),
    (
        "input T0 : float32[4, 6]\n  T1 : float32[4, 9] = pad(T0, dim=1, left=1, right=1,"
        " value=0.5)\n  output T1",
        "pad: T1 is declared with extents [4, 9], but the op gives [4, 8]",
    ),
    (  # the frontend's rule, now the declaration's: the verifier reads it too
        "input T0 : int32[4, 6]\n  T1 : int32[4, 8] = pad(T0, dim=1, left=1, right=1,"
        " value=0.5)\n  output T1",
        "pad of T0: value 0.5 is a float, but T0 is int32: the value must be of the tensor's",
    ),
    (
        "mesh M0 = [2] : [1]\n  input T0 : float32[4, 6] @M0 {0: [x, 2]}\n"
        "  T1 : float32[24] @M0 = reshape(T0)\n  output T1",
        "T1 = reshape(T0): the local shards hold different numbers of elements",
    ),
]


@pytest.mark.parametrize(("body", "message"), BAD_PROGRAMS)
def test_verifier_refuses(body: str, message: str) -> None:
    """A shape instruction whose dtype, extents or sharding do not fit is refused by name."""
    with pytest.raises(VerifyError) as caught:
        parse(f"%HostIrContainer {{\n  {body}\n}}\n")
    assert message in str(caught.value), str(caught.value)


def test_the_shape_ops_are_recorded_from_their_declarations() -> None:
    """``fd.ops`` records reshape, slice, pad and cat from their declarations
    (``hostir.ir.shape_ops``): the fusion holds their instructions, the dim an op changes
    is a new axis computed whole, and only a reshape keeps sharded blocks."""
    with FusionDefinition() as fd:
        t = fd.define_tensor((4, 6))
        ops = [
            fd.ops.reshape(t, [2, 12]),
            fd.ops.slice(t, [0, 1], [4, 3]),
            fd.ops.pad(t, [1, 1]),
            fd.ops.cat([t, t], dim=1),
        ]
        for out in ops:
            fd.add_output(out)
    exprs = [out.definition for out in ops]
    assert [type(e) for e in exprs] == [FusionOp] * 4
    assert [e.decl for e in exprs] == [RESHAPE, SLICE, PAD, CAT]
    text = str(fd.fusion)
    assert "T2 = slice(T0, dim=1, start=1, stop=3)" in text, text
    for expr in exprs:
        (result,) = expr.decl.infer_of(expr.instruction)
        whole = [i for i, axis in enumerate(result.axes) if axis.whole]
        assert whole == [1] if expr.decl is not RESHAPE else [0, 1], (expr.decl.name, whole)
    assert [d.sharding.keeps_blocks for d in (RESHAPE, SLICE, PAD, CAT)] == [True] + [False] * 3


def test_a_stream_split_of_a_changed_dim_is_refused_by_name() -> None:
    """A slice whose sliced dim is stream-split, on no mesh: its declaration computes that
    dim whole, so the lowering refuses the stream split by name (it lowered a program the
    verifier refused, its chunk's extents wrong)."""
    with FusionDefinition() as fd:
        t = fd.define_tensor((4, 6))
        out = fd.ops.slice(t, [0, 1], [4, 5])
        fd.add_output(out)
    out.outer_split(1, 2)
    out.axis(1).parallelize(ParallelType.stream)
    with pytest.raises(LoweringError, match=r"T1 = slice\(...\): its axis 1 is stream-parallel"):
        fd.execute([torch.zeros(4, 6)])


def test_instructions_run_as_written() -> None:
    """pad, reshape, slice and cat in host IR text, run against torch."""
    program = parse(
        "%HostIrContainer {\n  input T0 : float32[4, 6]\n"
        "  T1 : float32[4, 8] = pad(T0, dim=1, left=1, right=1, value=0.5)\n"
        "  T2 : float32[2, 2, 8] = reshape(T1)\n"
        "  T3 : float32[2, 2, 3] = slice(T2, dim=2, start=2, stop=5)\n"
        "  T4 : float32[2, 2, 11] = cat(T2, T3, dim=2)\n  output T4\n}\n"
    )
    x = _data((4, 6), 13)
    (out,) = HostIrEvaluator(program).run([x])
    padded = torch.nn.functional.pad(x, [1, 1], value=0.5).reshape(2, 2, 8)
    assert torch.equal(out, torch.cat([padded, padded[..., 2:5]], 2))


def test_slice_takes_manual_normalization_as_0_or_1() -> None:
    """nvFuser's transformer backward passes ``manual_normalization=0``: pybind11 converts 0
    and 1 to bool, so they are False and True here; another int is refused by name."""
    torch.manual_seed(31)
    with FusionDefinition() as fd:
        a = fd.define_tensor([4, 6])
        fd.add_output(fd.ops.slice(a, [0, 2], [4, 6], manual_normalization=0))
        with pytest.raises(OperandError, match="manual_normalization must be True or False"):
            fd.ops.slice(a, [0, 2], [4, 6], manual_normalization=2)
    data = torch.randn(4, 6)
    torch.testing.assert_close(fd.execute([data])[0], data[:, 2:])
