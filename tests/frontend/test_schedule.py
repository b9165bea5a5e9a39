"""Scheduling a TensorView: loop/logical/allocation domains, parallel types, and errors.

Errors must be specific (ScheduleError / MeshError, both HostIrError) and name the
tensor (``T0``), the axis, the extent and factor, or the mesh. Checks that depend on
input extents run at execute time; those tests run a fusion in this single process
(world size 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
import torch.distributed as dist

import hostir
from frontend import (
    DataType,
    DeviceMesh,
    FusionDefinition,
    IterDomain,
    MeshError,
    ParallelType,
    ScheduleError,
    TensorView,
    tensor_sharding,
)
from hostir import Const
from hostir.ir.scalars import evaluate_scalar

X = ParallelType.mesh_x
Y = ParallelType.mesh_y
STREAM = ParallelType.stream
SERIAL = ParallelType.serial


@pytest.fixture
def single_process() -> None:
    """Skips the test when it runs inside a multi-rank process group (e.g. torchrun)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        pytest.skip("needs a single-process world")


def make_tv(shape: Sequence[int], dtype: DataType = DataType.Float) -> TensorView:
    """A fusion input ``T0`` of ``shape`` (-1: symbolic), not yet scheduled."""
    with FusionDefinition() as fd:
        tv = fd.define_tensor(list(shape), dtype=dtype)
        fd.add_output(fd.ops.set(tv))
    assert tv.name == "T0"
    return tv


def make_copy(shape: Sequence[int]) -> tuple[FusionDefinition, TensorView, TensorView]:
    """``T1 = set(T0)`` with ``T0`` of ``shape``, both unscheduled."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(list(shape))
        y = fd.ops.set(x)
        fd.add_output(y)
    assert (x.name, y.name) == ("T0", "T1")
    return fd, x, y


def const_extents(axes: Sequence[IterDomain]) -> list[int]:
    """The constant extents of ``axes`` (fails if one is symbolic)."""
    extents = []
    for axis in axes:
        assert isinstance(axis.extent, Const), axis
        extents.append(axis.extent.value)
    return extents


def loop_extents(tv: TensorView, env: dict[str, int] | None = None) -> list[int]:
    """The loop extents of ``tv``, symbols evaluated in ``env``."""
    return [int(evaluate_scalar(axis.extent, env or {})) for axis in tv.get_loop_domain()]


# ----- domains -----


def test_outer_split_loop_domain():
    """outer_split(0, 4) of [8, 6] makes the loop domain [4, 2, 6]; logical stays [8, 6]."""
    tv = make_tv((8, 6))
    logical = tv.get_logical_domain()
    tv.outer_split(0, 4)
    assert const_extents(tv.get_loop_domain()) == [4, 2, 6]
    assert tv.ndim == 3
    assert tv.get_logical_domain() == logical
    assert const_extents(tv.get_logical_domain()) == [8, 6]
    assert tv.get_loop_domain()[2] is logical[1]  # untouched axes are kept


def test_inner_split_loop_domain():
    """inner_split(1, 3) of [8, 6] makes [8, 2, 3]; split(..., inner_split=False) is outer."""
    tv = make_tv((8, 6))
    tv.inner_split(1, 3)
    assert const_extents(tv.get_loop_domain()) == [8, 2, 3]
    tv.split(0, 2, inner_split=False)
    assert const_extents(tv.get_loop_domain()) == [2, 4, 2, 3]
    tv.split(0, 2)  # inner split by default
    assert const_extents(tv.get_loop_domain()) == [1, 2, 4, 2, 3]
    assert const_extents(tv.get_logical_domain()) == [8, 6]


def test_negative_axis_index():
    """Negative axis indices count from the end of the loop domain."""
    tv = make_tv((8, 6))
    tv.outer_split(-1, 2)
    assert const_extents(tv.get_loop_domain()) == [8, 2, 3]
    assert tv.axis(-1) is tv.get_loop_domain()[2]


def test_symbolic_split_extents():
    """Splitting a symbolic extent gives symbolic pieces that evaluate to e/f and f."""
    tv = make_tv((-1, 6))
    symbol = tv.get_logical_domain()[0].extent
    assert isinstance(symbol, hostir.Symbol)
    tv.outer_split(0, 4)
    tv.inner_split(1, 3)
    assert tv.axis(0).extent == Const(value=4)
    assert tv.axis(2).extent == Const(value=3)
    assert loop_extents(tv, {symbol.name: 24}) == [4, 2, 3, 6]
    assert loop_extents(tv, {symbol.name: 48}) == [4, 4, 3, 6]


def test_parallel_types():
    """Axes start serial; parallelize sets the parallel type of exactly that loop axis."""
    tv = make_tv((8, 6))
    tv.set_device_mesh(DeviceMesh([[0, 1], [2, 3]]))
    assert all(axis.parallel_type is SERIAL for axis in tv.get_loop_domain())
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(Y)
    tv.outer_split(2, 2)
    tv.axis(2).parallelize(X)
    tv.axis(3).parallelize(STREAM)
    types = [axis.parallel_type for axis in tv.get_loop_domain()]
    assert types == [Y, SERIAL, X, STREAM]
    assert [axis.is_device_dim() for axis in tv.get_loop_domain()] == [True, False, True, False]
    assert tv.axis(3).is_stream()
    assert tv.device_mesh == DeviceMesh([[0, 1], [2, 3]])


def test_set_device_mesh_accepts_mesh_like():
    """set_device_mesh takes a DeviceMesh; without one the tensor has no mesh."""
    tv = make_tv((4,))
    assert tv.device_mesh is None
    tv.set_device_mesh(DeviceMesh(range(2)))
    assert tv.device_mesh == DeviceMesh([0, 1])


def test_reduction_axis_of_sum():
    """The output of sum keeps the reduced axis in its logical domain as a reduction axis."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6))
        s = fd.ops.sum(x, [1])
        fd.add_output(s)
    assert [axis.is_reduction() for axis in s.get_logical_domain()] == [False, True]
    assert not s.axis(0).is_reduction()
    assert s.axis(1).is_reduction()
    assert const_extents(s.get_logical_domain()) == [4, 6]
    assert not any(axis.is_reduction() for axis in x.get_logical_domain())


def test_split_of_reduction_axis_stays_reduction():
    """Both pieces of a split reduction axis are reduction axes."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6))
        s = fd.ops.sum(x, [1])
        fd.add_output(s)
    s.outer_split(1, 2)
    assert [axis.is_reduction() for axis in s.get_loop_domain()] == [False, True, True]


@pytest.mark.parametrize(
    ("old_to_new", "expected"),
    [
        ({0: 1}, "bac"),
        ({1: 0}, "bac"),
        ({0: 2}, "bca"),
        ({2: 0}, "cab"),
        ({-1: 0}, "cab"),
        ({0: 2, 2: 0}, "cba"),
        ({0: 1, 1: 2, 2: 0}, "cab"),
        ({1: 1}, "abc"),
        ({}, "abc"),
    ],
)
def test_reorder(old_to_new, expected):
    """reorder({old: new}) on [a, b, c] places named axes, the rest keep their order."""
    tv = make_tv((2, 3, 5))
    a, b, c = tv.get_loop_domain()
    names = {a: "a", b: "b", c: "c"}
    tv.reorder(old_to_new)
    assert "".join(names[axis] for axis in tv.get_loop_domain()) == expected
    assert tv.get_logical_domain() == [a, b, c]


def test_reorder_after_split():
    """reorder indexes the current loop domain, including split pieces."""
    tv = make_tv((8, 6))
    tv.outer_split(1, 2)  # [8, 2, 3]
    tv.reorder({1: 0})
    assert const_extents(tv.get_loop_domain()) == [2, 8, 3]


def test_allocation_domain():
    """The allocation domain defaults to the logical domain and can be set to loop axes."""
    tv = make_tv((8, 6))
    assert tv.get_allocation_domain() == tv.get_logical_domain()
    tv.outer_split(0, 2)
    loop = tv.get_loop_domain()
    tv.set_allocation_domain([loop[1], loop[0], loop[2]], True)
    assert tv.get_allocation_domain() == [loop[1], loop[0], loop[2]]
    assert tv.get_logical_domain() != tv.get_allocation_domain()


def test_allocation_domain_errors():
    """A foreign axis or a wrong number of contiguity flags raises ScheduleError naming T0."""
    tv = make_tv((8, 6))
    other = make_tv((8, 6))
    with pytest.raises(ScheduleError, match="T0"):
        tv.set_allocation_domain(other.get_logical_domain(), True)
    with pytest.raises(ScheduleError, match=r"T0.*2 axes.*3 contiguity"):
        tv.set_allocation_domain(tv.get_logical_domain(), [True, True, True])


# ----- errors at schedule time -----


def test_error_hierarchy():
    """ScheduleError and MeshError are HostIrErrors importable from frontend."""
    assert issubclass(ScheduleError, hostir.HostIrError)
    assert issubclass(MeshError, hostir.HostIrError)


@pytest.mark.parametrize(
    "schedule",
    [
        lambda tv: tv.split(3, 2),
        lambda tv: tv.outer_split(3, 2),
        lambda tv: tv.inner_split(-4, 2),
        lambda tv: tv.axis(3).parallelize(X),
        lambda tv: tv.axis(-4),
        lambda tv: tv.swizzle1d(3, X),
        lambda tv: tv.reorder({3: 0}),
        lambda tv: tv.reorder({0: 3}),
    ],
    ids=[
        "split",
        "outer_split",
        "inner_split-negative",
        "axis",
        "axis-negative",
        "swizzle1d",
        "reorder-old",
        "reorder-new",
    ],
)
def test_axis_out_of_range(schedule):
    """An out-of-range loop axis raises ScheduleError naming the tensor, axis and domain size."""
    tv = make_tv((2, 3, 5))
    tv.set_device_mesh(DeviceMesh([0, 1]))
    with pytest.raises(ScheduleError, match=r"axis -?[34]\b.*T0.*3 axes"):
        schedule(tv)


def test_reorder_two_axes_to_one_place():
    """reorder mapping two axes to one position raises ScheduleError naming T0."""
    tv = make_tv((2, 3, 5))
    with pytest.raises(ScheduleError, match="T0"):
        tv.reorder({0: 1, 2: 1})


@pytest.mark.parametrize("factor", [0, -2, 2.0, True])
def test_bad_split_factor(factor):
    """A split factor that is not a positive int raises ScheduleError naming it."""
    tv = make_tv((8,))
    with pytest.raises(ScheduleError, match=f"factor.*{factor!r}"):
        tv.outer_split(0, factor)


def test_parallelize_needs_parallel_type():
    """parallelize with a string raises ScheduleError naming the value."""
    tv = make_tv((8,))
    with pytest.raises(ScheduleError, match="'mesh_x'"):
        tv.axis(0).parallelize("mesh_x")


@pytest.mark.parametrize("parallel_type", [STREAM, SERIAL])
def test_swizzle1d_needs_mesh_parallel_type(parallel_type):
    """swizzle1d over stream or serial raises ScheduleError naming the tensor and the type."""
    tv = make_tv((8,))
    tv.outer_split(0, 2)
    with pytest.raises(ScheduleError, match=rf"T0.*{parallel_type.name}"):
        tv.swizzle1d(0, parallel_type)


def test_parallelize_extent_mismatch_immediate():
    """With a mesh set, a constant extent that differs from the mesh axis fails at once."""
    tv = make_tv((8,))
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.outer_split(0, 4)
    with pytest.raises(ScheduleError, match=r"T0.*extent 4.*mesh_x.*\[0, 1\].*2 devices"):
        tv.axis(0).parallelize(X)


def test_parallelize_unsplit_axis_extent_mismatch():
    """Parallelizing a whole axis of extent 2 over a 3-device mesh fails naming both sizes."""
    tv = make_tv((2, 6))
    tv.set_device_mesh(DeviceMesh([0, 1, 2]))
    with pytest.raises(ScheduleError, match=r"T0.*extent 2.*mesh_x.*\[0, 1, 2\].*3 devices"):
        tv.axis(0).parallelize(X)


def test_parallelize_extent_mismatch_at_set_device_mesh():
    """Parallelized before the mesh is known, the mismatch is reported by set_device_mesh."""
    tv = make_tv((8,))
    tv.outer_split(0, 4)
    tv.axis(0).parallelize(X)  # no mesh yet: nothing to check
    with pytest.raises(ScheduleError, match=r"T0.*extent 4.*mesh_x.*\[0, 1\].*2 devices"):
        tv.set_device_mesh(DeviceMesh([0, 1]))


def test_same_mesh_axis_twice():
    """Parallelizing two axes of one tensor over mesh_x raises ScheduleError naming both."""
    tv = make_tv((4, 6))
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(X)
    tv.outer_split(2, 2)
    with pytest.raises(ScheduleError, match=r"T0.*two axes.*mesh_x"):
        tv.axis(2).parallelize(X)


def test_same_mesh_axis_twice_in_one_dim_before_mesh():
    """Both pieces of one dim over mesh_x is caught when the mesh is set."""
    tv = make_tv((8,))
    tv.outer_split(0, 2)
    tv.outer_split(1, 2)
    tv.axis(0).parallelize(X)
    tv.axis(1).parallelize(X)
    with pytest.raises(ScheduleError, match=r"T0.*two axes.*mesh_x"):
        tv.set_device_mesh(DeviceMesh([0, 1]))


def test_mesh_y_on_1d_mesh():
    """Parallelizing over mesh_y on a 1-d mesh raises MeshError naming the mesh and axis."""
    tv = make_tv((4,))
    tv.set_device_mesh(DeviceMesh([0, 1]))
    tv.outer_split(0, 2)
    with pytest.raises(MeshError, match=r"\[0, 1\].*1-d.*mesh_y"):
        tv.axis(0).parallelize(Y)


def test_mesh_y_on_1d_mesh_set_later():
    """A mesh_y axis on a tensor later placed on a 1-d mesh fails at set_device_mesh."""
    tv = make_tv((4,))
    tv.outer_split(0, 2)
    tv.axis(0).parallelize(Y)
    with pytest.raises(MeshError, match=r"\[0, 1\].*1-d.*mesh_y"):
        tv.set_device_mesh(DeviceMesh([0, 1]))


# ----- errors at execute time -----


def test_non_divisible_split_at_execute(single_process):
    """outer_split(0, 4) of extent 6 is accepted when scheduled and rejected at execute."""
    fd, x, y = make_copy((6, 4))
    for tv in (x, y):
        tv.outer_split(0, 4)  # no error yet
    with pytest.raises(ScheduleError, match=r"T0.*outer_split.*extent 6.*factor 4"):
        fd.execute([torch.zeros(6, 4)])


def test_non_divisible_split_symbolic_at_execute(single_process):
    """outer_split(0, 4) of a symbolic extent bound to 6 at execute raises ScheduleError."""
    fd, x, y = make_copy((-1, 4))
    for tv in (x, y):
        tv.outer_split(0, 4)
    with pytest.raises(ScheduleError, match=r"T0.*extent 6.*factor 4"):
        fd.execute([torch.zeros(6, 4)])


def test_non_divisible_inner_split_symbolic_at_execute(single_process):
    """inner_split by 3 of a symbolic extent bound to 8 raises ScheduleError naming both."""
    fd, x, y = make_copy((-1,))
    for tv in (x, y):
        tv.inner_split(0, 3)
    with pytest.raises(ScheduleError, match=r"T0.*inner_split.*extent 8.*factor 3"):
        fd.execute([torch.arange(8.0)])


def test_divisible_split_executes(single_process):
    """A divisible schedule on a one-device mesh runs and returns the input."""
    fd, x, y = make_copy((-1, 4))
    for tv in (x, y):
        tv.set_device_mesh(DeviceMesh([0]))
        tv.outer_split(0, 1)
        tv.axis(0).parallelize(X)
        tv.inner_split(1, 3)
    t = torch.randn(6, 4)
    (out,) = fd.execute([t])
    assert torch.equal(out, t)


def test_non_divisible_split_of_local_part_at_execute(single_process):
    """inner_split by 3 of the local part of a sharded symbolic extent 8 raises ScheduleError."""
    fd, x, y = make_copy((-1,))
    for tv in (x, y):
        tv.set_device_mesh(DeviceMesh([0]))
        tv.outer_split(0, 1)  # [x, i0]
        tv.axis(0).parallelize(X)
        tv.inner_split(1, 3)  # the local part, 8 long, by 3
    with pytest.raises(ScheduleError, match=r"T0.*inner_split.*extent 8.*factor 3"):
        fd.execute([torch.arange(8.0)])


def test_parallelize_symbolic_extent_mismatch_at_execute(single_process):
    """A device axis i0 // 4 on a 1-device mesh is only checked at execute, naming T1."""
    fd, x, y = make_copy((-1,))
    mesh = DeviceMesh([0])
    x.set_device_mesh(mesh)
    y.set_device_mesh(mesh)
    y.inner_split(0, 4)
    y.axis(0).parallelize(X)  # extent i0 // 4: unknown until execute
    with pytest.raises(ScheduleError, match=r"T1.*extent 2.*mesh_x.*\[0\].*1 devices?"):
        fd.execute([torch.arange(8.0)])


def test_parallelize_symbolic_input_extent_mismatch_at_execute(single_process):
    """An input's device axis i0 // 4 on a 1-device mesh with i0 = 8 raises ScheduleError."""
    fd, x, y = make_copy((-1,))
    for tv in (x, y):
        tv.set_device_mesh(DeviceMesh([0]))
        tv.inner_split(0, 4)
        tv.axis(0).parallelize(X)
    with pytest.raises(ScheduleError, match=r"T0.*extent 2.*mesh_x.*\[0\]"):
        fd.execute([torch.arange(8.0)])


def test_parallelized_without_mesh_at_execute(single_process):
    """A device-parallel axis on a fusion with no mesh at all raises MeshError naming T0."""
    fd, x, y = make_copy((4,))
    for tv in (x, y):
        tv.outer_split(0, 2)
        tv.axis(0).parallelize(X)
    with pytest.raises(MeshError, match=r"T0.*mesh_x.*no device mesh"):
        fd.execute([torch.zeros(2)])


def test_mesh_larger_than_world(single_process):
    """A fusion on DeviceMesh([0, 1]) run in a one-process world raises MeshError naming it."""
    fd, x, y = make_copy((8,))
    for tv in (x, y):
        tv.set_device_mesh(DeviceMesh([0, 1]))
        tv.outer_split(0, 2)
        tv.axis(0).parallelize(X)
    with pytest.raises(MeshError, match=r"mesh \[2\] : \[1\] needs device 1.*1 rank"):
        fd.execute([torch.zeros(4)])
    with pytest.raises(MeshError, match=r"mesh \[2\] : \[1\] needs device 1"):
        fd.host_ir(world_size=1)


def test_a_symbolic_device_axis_is_its_mesh_axis_in_the_sharding(single_process):
    """inner_split(0, 4) of i0 parallelizes i0 // 4, which execute checks against the mesh
    axis; the sharding gives that part the mesh axis's size, as the program text reads it
    back, so the program round-trips (found by the fuzzer, seed 26 at 4 ranks)."""
    fd, x, y = make_copy((-1,))
    for tv in (x, y):
        tv.set_device_mesh(DeviceMesh([0]))
        tv.inner_split(0, 4)
        tv.axis(0).parallelize(X)
    assert tensor_sharding(x).dims[0][0].extent == Const(value=1)
    program = fd.host_ir()
    assert hostir.parse(str(program)) == program
    (out,) = fd.execute([torch.arange(4.0)])
    assert torch.equal(out, torch.arange(4.0))
