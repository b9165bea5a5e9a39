"""``DeviceMesh``: an N-d arrangement of ranks, as in nvFuser and DTensor."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from frontend.arguments import check_rank, is_int, shown
from frontend.errors import MeshError
from frontend.types import ParallelType
from hostir import Mesh, MeshAxis
from hostir.comm.world import current_rank
from hostir.settings import MAX_WORLD_SIZE

SHOWN_DEVICES = 16
"""Up to this many devices, a DeviceMesh prints its device ids; beyond, its layout."""


def _shape_of(devices: Any, depth: int = 0) -> list[int]:
    """The shape of ``devices`` (a tensor, range or nested list of device ids) read from
    the lengths of its first rows: nothing is listed before the size is known to be small
    enough (``_leaves`` then checks that every row has that shape)."""
    if isinstance(devices, torch.Tensor):
        if devices.is_floating_point() or devices.is_complex() or devices.dtype == torch.bool:
            raise MeshError(f"mesh devices must be integers, got a {devices.dtype} tensor")
        return list(devices.shape)
    if isinstance(devices, range):
        return [len(devices)]
    if not isinstance(devices, list | tuple):
        raise MeshError(
            f"a mesh is made from a tensor, list or range of device ids, got {shown(devices)}"
        )
    if not devices or not isinstance(devices[0], list | tuple | range):
        return [len(devices)]
    if depth >= 3:
        raise MeshError("a mesh has 1 to 3 dims, got lists of device ids nested deeper")
    return [len(devices), *_shape_of(devices[0], depth + 1)]


def _flatten(devices: Any) -> tuple[list[int], list[int]]:
    """Flat device list and shape from a tensor, a (nested) list or a range; refuses more
    than MAX_WORLD_SIZE devices before listing them (a 99999 x 99999 mesh is a mistake,
    not a request for ten billion ints)."""
    shape = _shape_of(devices)
    size = math.prod(shape)
    if size > MAX_WORLD_SIZE:
        raise MeshError(
            f"a mesh of shape {tuple(shape)} has {size} devices; at most {MAX_WORLD_SIZE} are"
            " supported (the largest world size)"
        )
    if isinstance(devices, torch.Tensor):
        flat = devices.flatten().tolist()
    else:
        flat = _leaves(devices, shape, devices)
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in flat):
        raise MeshError(f"mesh devices must be integers, got {shown(devices)}")
    too_large = [d for d in flat if d >= MAX_WORLD_SIZE]
    if too_large:
        raise MeshError(
            f"mesh device {too_large[0]} is not a rank: ranks are below {MAX_WORLD_SIZE}"
            " (the largest world size)"
        )
    return flat, shape


def _leaves(rows: list | tuple | range, shape: list[int], whole: Any) -> list[Any]:
    """The entries of the nested list ``rows`` of ``shape``, row-major; raises MeshError if
    a row has another length (``whole``, the mesh argument, is shown)."""
    if len(shape) == 1:
        return list(rows)
    flat = []
    for row in rows:
        if not isinstance(row, list | tuple | range):
            raise MeshError(f"mesh devices must be integers in rows of lists, got {shown(whole)}")
        if len(row) != shape[1]:
            raise MeshError(f"mesh rows must all have the same shape, got {shown(whole)}")
        flat += _leaves(row, shape[1:], whole)
    return flat


class DeviceMesh:
    """Devices (ranks) arranged in 1 to 3 dims.

    ``DeviceMesh(torch.arange(4))`` is a 1-d mesh; ``DeviceMesh(torch.arange(8).
    reshape(2, 4))`` a 2x4 mesh whose ``mesh_x`` rows are ``(0 1 2 3)`` and
    ``(4 5 6 7)``. Device ids are distinct, non-negative, in any order; a mesh
    may name any subset of the world's ranks.
    """

    def __init__(self, devices: Any) -> None:
        flat, shape = _flatten(devices)
        if not flat:
            raise MeshError("a mesh needs at least one device, got none")
        try:
            self._mesh = Mesh(devices=tuple(flat), shape=tuple(shape))
        except MeshError as error:
            raise MeshError(f"invalid DeviceMesh {shown(flat)}: {error}") from None

    @staticmethod
    def from_hostir(mesh: Mesh) -> DeviceMesh:
        """The DeviceMesh of a host IR mesh."""
        return DeviceMesh(torch.tensor(mesh.devices).reshape(mesh.shape))

    def to_hostir(self) -> Mesh:
        """The host IR mesh."""
        return self._mesh

    @property
    def size(self) -> int:
        """Number of devices."""
        return len(self._mesh.devices)

    @property
    def shape(self) -> tuple[int, ...]:
        """Number of devices along each mesh dim."""
        return self._mesh.shape

    @property
    def ndim(self) -> int:
        """Number of mesh dims."""
        return self._mesh.ndim

    @property
    def devices(self) -> list[int]:
        """The device ids, flattened row-major."""
        return list(self._mesh.devices)

    def __contains__(self, device: object) -> bool:
        return is_int(device) and self._mesh.contains(device)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceMesh) and other._mesh == self._mesh

    def __hash__(self) -> int:
        return hash(self._mesh)

    def __repr__(self) -> str:
        # The devices themselves, as nvFuser and DTensor print them, while that stays short;
        # the layout (shape : strides) of a larger mesh, so no message grows with its size.
        if self._mesh.size <= SHOWN_DEVICES or not self._mesh.regular:
            devices = torch.tensor(self._mesh.devices).reshape(self._mesh.shape).tolist()
            return f"DeviceMesh({devices})"
        return f"DeviceMesh({self._mesh})"

    def _axis(self, parallel_type: ParallelType) -> MeshAxis:
        if not isinstance(parallel_type, ParallelType) or not parallel_type.is_device():
            raise MeshError(
                f"{self!r}: expected a mesh parallel type (mesh_x, mesh_y, mesh_z),"
                f" got {parallel_type!r}"
            )
        axis = parallel_type.mesh_axis()
        if list(MeshAxis).index(axis) >= self.ndim:
            raise MeshError(f"{self!r} is {self.ndim}-d and has no axis {parallel_type.name}")
        return axis

    def axis_size(self, parallel_type: ParallelType) -> int:
        """Number of devices along the mesh axis of ``parallel_type``."""
        return self._mesh.axis_size(self._axis(parallel_type))

    def coordinates(self, device: int) -> tuple[int, ...]:
        """``device``'s index along each mesh dim."""
        check_rank(f"{self!r}: device", device)
        coords = self._mesh.coordinates(device)
        if coords is None:
            raise MeshError(f"device {device} is not in {self!r}")
        return coords

    def index(self, device: int, parallel_type: ParallelType = ParallelType.mesh_x) -> int:
        """``device``'s coordinate along the mesh axis of ``parallel_type``."""
        self.axis_size(parallel_type)
        return self.coordinates(device)[self._axis(parallel_type).dim(self.ndim)]

    def team(self, device: int, parallel_type: ParallelType = ParallelType.mesh_x) -> list[int]:
        """The devices sharing all of ``device``'s coordinates except along ``parallel_type``."""
        self.axis_size(parallel_type)
        coords = list(self.coordinates(device))
        dim = self._axis(parallel_type).dim(self.ndim)
        grid = torch.tensor(self.devices).reshape(self.shape)
        index: list[Any] = [c for c in coords]
        index[dim] = slice(None)
        return [int(d) for d in grid[tuple(index)].tolist()]

    def teams(self, parallel_type: ParallelType = ParallelType.mesh_x) -> list[list[int]]:
        """Every team along ``parallel_type``: disjoint groups covering the mesh."""
        seen: list[list[int]] = []
        for device in self.devices:
            team = self.team(device, parallel_type)
            if team not in seen:
                seen.append(team)
        return seen

    def shard_tensor(
        self,
        t: torch.Tensor,
        dim: int,
        rank: int | None = None,
        parallel_type: ParallelType = ParallelType.mesh_x,
    ) -> torch.Tensor | None:
        """The chunk of ``t`` along ``dim`` that ``rank`` holds when ``dim`` is split
        evenly over the mesh axis of ``parallel_type`` (default ``mesh_x``).

        ``rank`` defaults to this process's rank (0 without torch.distributed).
        Returns None for a rank outside the mesh, as ``shard_tensor`` does.
        """
        rank = _current_rank() if rank is None else rank
        check_rank("shard_tensor: rank", rank)
        if not isinstance(t, torch.Tensor):
            raise MeshError(f"shard_tensor: expected a torch.Tensor to shard, got {shown(t)}")
        if rank not in self:
            return None
        size = self.axis_size(parallel_type)
        if not is_int(dim) or not -t.ndim <= dim < t.ndim:
            raise MeshError(f"dim {shown(dim)} is out of range for a {t.ndim}-d tensor")
        if t.shape[dim] % size != 0:
            raise MeshError(
                f"dim {dim} of extent {t.shape[dim]} does not divide over {size} devices"
                f" of {self!r}"
            )
        chunk = t.shape[dim] // size
        return t.narrow(dim, self.index(rank, parallel_type) * chunk, chunk).contiguous()


def _current_rank() -> int:
    return current_rank()  # a simulated rank's on its thread (hostir.comm.world)


def as_mesh(devices: DeviceMesh | Iterable[int] | torch.Tensor) -> DeviceMesh:
    """A DeviceMesh from a DeviceMesh or anything DeviceMesh accepts."""
    return devices if isinstance(devices, DeviceMesh) else DeviceMesh(devices)
