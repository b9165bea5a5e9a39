"""``execute_with_dtensors``: nvFuser's entry point for DTensors in and out.

Each input DTensor's placements on its mesh must be the fusion's schedule of that input
(its mesh and its mesh-parallel outer splits, as ``fd.host_ir().inputs`` shows them, the
sharding propagated to an input the user left unscheduled included); a fusion whose
tensors have no mesh at all is scheduled from the placements first (``Shard(d)``: an outer
split of dim ``d`` by the mesh dim's size, parallelized on that mesh dim's axis;
``Replicate()``: nothing; a ``Partial`` mesh dim: replicated). A ``Partial`` input is
reduced first into the layout its fusion input needs, by a resharding program of ours
(``frontend.partial_inputs``). The local shards run through ``fd.execute``; each output comes
back as a DTensor whose placements are the output's sharding (``Shard``, ``Replicate``,
``Partial`` for an output left partial), on the inputs' torch ``DeviceMesh`` when it is the
output's mesh.

DTensor mesh dim ``i`` of an ``n``-d mesh is our mesh axis ``n - 1 - i`` from the inside
(the last mesh dim is ``mesh_x``), as ``lowering.redistribution.Distribution`` maps them:
that mapping is read here, not restated (docs/dtensor.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from frontend.arguments import shown
from frontend.errors import InputError, ScheduleError
from frontend.execute_args import dtensor_class
from frontend.mesh import DeviceMesh
from frontend.partial_inputs import check_reducible, reduce_partial_input
from frontend.tensor_view import TensorView
from frontend.types import ParallelType
from hostir import MeshAxis

if TYPE_CHECKING:
    from frontend.fusion_definition import FusionDefinition

_PARALLEL_TYPES = {
    MeshAxis.X: ParallelType.mesh_x,
    MeshAxis.Y: ParallelType.mesh_y,
    MeshAxis.Z: ParallelType.mesh_z,
}


def _distribution() -> Any:
    """lowering's ``Distribution`` (DTensor placements <-> host IR shardings), imported
    late: lowering imports frontend (pyproject.toml's import contract names this import)."""
    from lowering.redistribution.distribution import Distribution

    return Distribution


def execute_with_dtensors(fd: FusionDefinition, in_dtensors: Iterable[Any]) -> list[Any]:
    """Runs ``fd`` on DTensor inputs and returns its outputs as DTensors (nvFuser's
    ``nvfuser_direct.execute_with_dtensors(fd, in_dtensors)``).

    A scalar input of the fusion takes a Python number in its place. An input whose
    placements are not the fusion's schedule of it is refused (InputError naming both). A
    ``Partial`` input is reduced first, by a resharding program of ours planned from its
    placements to the fusion's schedule of it (frontend.partial_inputs), since a fusion
    input holds whole values. An output a rank does not hold (outside its mesh) is None on
    that rank.
    """
    inputs = list(in_dtensors)
    tensors = _tensor_inputs(fd, inputs)
    program = fd.host_ir()
    if all(program.inputs[index].sharding is None for index, _ in tensors):
        _schedule_from_placements(fd, [(tv, inputs[index]) for index, tv in tensors])
        program = fd.host_ir()
    # Every input checked before any partial one is reduced (a program with collectives).
    layouts = [_layouts(index, tv, program.inputs[index], inputs[index]) for index, tv in tensors]
    local = list(inputs)  # scalars as given; each DTensor replaced by its local shard
    for (index, tv), (given, expected) in zip(tensors, layouts, strict=True):
        if given.partial:
            local[index] = reduce_partial_input(index, tv, inputs[index], given, expected)
        else:
            local[index] = inputs[index].to_local()
    outputs = fd.execute(local)
    meshes = [inputs[index].device_mesh for index, _ in tensors]
    return [
        _as_dtensor(out, value, meshes)
        for out, value in zip(outputs, fd.host_ir().outputs, strict=True)
    ]


def _tensor_inputs(fd: FusionDefinition, inputs: list[Any]) -> list[tuple[int, TensorView]]:
    """``fd``'s tensor inputs with their positions, once ``inputs`` has one value per
    fusion input and a DTensor for each tensor input (else InputError naming it)."""
    names = [value.name for value in fd.fusion.inputs()]
    if len(inputs) != len(names):
        raise InputError(
            f"execute_with_dtensors: expected {len(names)} inputs ({', '.join(names)}),"
            f" got {len(inputs)}"
        )
    dtensor = dtensor_class()
    tensors = [
        (index, tv) for index, tv in enumerate(fd.fusion.inputs()) if isinstance(tv, TensorView)
    ]
    for index, tv in tensors:
        if dtensor is None or not isinstance(inputs[index], dtensor):
            raise InputError(
                f"execute_with_dtensors: input {index} ({tv.name}) must be a DTensor, got"
                f" {type(inputs[index]).__name__ if inputs[index] is not None else shown(None)}"
            )
    return tensors


def _given(index: int, tv: TensorView, given: Any) -> Any:
    """The ``Distribution`` of DTensor ``given`` (its partial mesh axes included), or
    InputError naming what is not taken."""
    from lowering.errors import ReshardingError

    try:
        distribution = _distribution().from_placements(
            given.device_mesh, given.placements, ndim=given.ndim
        )
    except ReshardingError as error:
        raise InputError(f"execute_with_dtensors: input {index} ({tv.name}): {error}") from None
    return distribution


def schedule_from_dtensors(fd: FusionDefinition, in_dtensors: Iterable[Any]) -> None:
    """Schedules ``fd``'s tensor inputs as the DTensors ``in_dtensors`` (one per fusion
    input, a number for a scalar input) are placed, as ``execute_with_dtensors`` does for
    a fusion with no mesh: each input gets its DTensor's mesh and, per sharded dim, an
    outer split by each of its mesh dims' sizes (outer first), parallelized on that mesh
    dim's axis; a ``Partial`` mesh dim leaves the input replicated over it. Schedule other
    tensors after it (an output left partial, say). ScheduleError if an input has a mesh
    already; InputError as ``execute_with_dtensors`` refuses."""
    inputs = list(in_dtensors)
    tensors = _tensor_inputs(fd, inputs)
    for index, tv in tensors:
        if tv.device_mesh is not None:
            raise ScheduleError(
                f"schedule_from_dtensors: input {index} ({tv.name}) has a mesh already"
                f" ({tv.device_mesh!r}); it schedules inputs that have none"
            )
    _schedule_from_placements(fd, [(tv, inputs[index]) for index, tv in tensors])


def _schedule_from_placements(fd: FusionDefinition, pairs: list[tuple[TensorView, Any]]) -> None:
    """Schedules each input ``tv`` as its DTensor's placements say: its mesh, and per
    sharded dim an outer split by each of its mesh axes (outer first), parallelized."""
    for index, (tv, given) in enumerate(pairs):
        distribution = _given(index, tv, given)
        mesh = DeviceMesh.from_hostir(distribution.mesh)
        tv.set_device_mesh(mesh)
        for dim in reversed(range(distribution.ndim)):  # later dims first: no index shifts
            for offset, axis in enumerate(distribution.dims[dim]):
                parallel_type = _PARALLEL_TYPES[axis]
                tv.outer_split(dim + offset, mesh.axis_size(parallel_type))
                tv.axis(dim + offset).parallelize(parallel_type)


def _layouts(index: int, tv: TensorView, declared: Any, given: Any) -> tuple[Any, Any]:
    """The ``Distribution``s of DTensor ``given`` and of the program's input ``declared``
    (input ``index``, the fusion's ``tv``), once they are the same (else InputError naming
    both). A Partial DTensor is taken in any layout: it is reduced into ``declared``'s
    first (frontend.partial_inputs), which plans any change of layout with the reduction."""
    distribution = _given(index, tv, given)
    expected = _expected(index, tv, declared, given)
    if distribution.partial:
        check_reducible(index, tv, distribution)
    elif distribution != expected:
        raise InputError(
            f"execute_with_dtensors: input {index} ({tv.name}) is a DTensor with placements"
            f" {tuple(given.placements)} on {given.device_mesh!r} ({distribution}), but the"
            f" fusion's schedule of {tv.name} is {expected.to_placements()} ({expected}):"
            f" redistribute it (dt.redistribute) or schedule {tv.name} as the placements say"
        )
    return distribution, expected


def _expected(index: int, tv: TensorView, declared: Any, given: Any) -> Any:
    """The ``Distribution`` of the program's input ``declared`` (input ``index``, the
    fusion's ``tv``, given as DTensor ``given``); InputError where it has no mesh or a
    layout no placement describes."""
    from lowering.errors import ReshardingError

    if declared.sharding is None:
        raise InputError(
            f"execute_with_dtensors: input {index} ({tv.name}) has no mesh in the fusion's"
            f" schedule, while others do; the DTensor has {tuple(given.placements)}"
        )
    try:
        expected = _distribution().from_sharding(declared.sharding)
    except ReshardingError as error:
        raise InputError(
            f"execute_with_dtensors: input {index} ({tv.name}) is scheduled in a layout no"
            f" DTensor placement describes: {error}"
        ) from None
    return expected


def _as_dtensor(out: Any, value: Any, meshes: list[Any]) -> Any:
    """Output ``out`` (this rank's shard of the program's output ``value``) as a DTensor
    with ``value``'s sharding as placements; None stays None (a rank outside its mesh)."""
    from torch.distributed.tensor import DTensor, Replicate

    if out is None:
        return None
    mesh = meshes[0] if meshes else None
    if value.sharding is None:
        if mesh is None:
            raise InputError(f"execute_with_dtensors: output {value.name} has no mesh")
        return DTensor.from_local(out, mesh, [Replicate()] * mesh.ndim, run_check=False)
    distribution = _distribution().from_sharding(value.sharding)
    return DTensor.from_local(
        out, _torch_mesh(distribution.mesh, meshes), distribution.to_placements(), run_check=False
    )


def _torch_mesh(mesh: Any, meshes: list[Any]) -> Any:
    """The torch ``DeviceMesh`` of host IR ``mesh``: an input's when it is the same mesh
    (its dim names kept), else a new one on the inputs' device type (every rank builds it)."""
    from torch.distributed.device_mesh import DeviceMesh as TorchMesh

    from lowering.redistribution.distribution import as_mesh

    for candidate in meshes:
        if as_mesh(candidate) == mesh:
            return candidate
    device_type = meshes[0].device_type if meshes else "cpu"
    return TorchMesh(device_type, torch.tensor(mesh.devices).reshape(mesh.shape))
