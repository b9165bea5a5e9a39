"""Teams: the disjoint device groups a collective runs over.

A :class:`Team` is a mesh and the ordered mesh axes it spans, outer (major)
first. Its groups are the devices that share every coordinate off those axes;
inside a group, devices are ordered by their coordinates on the team axes in
the given order (row-major over ``axes``). So on the 2x4 mesh
``[[0, 1, 2, 3], [4, 5, 6, 7]]`` the team ``(x,)`` has groups ``(0 1 2 3)`` and
``(4 5 6 7)``, ``(y,)`` has ``(0 4) (1 5) (2 6) (3 7)``, ``(y, x)`` is one
group ``(0 1 2 3 4 5 6 7)`` and ``(x, y)`` the column-major ``(0 4 1 5 2 6 3 7)``.
The printed program stays short for large meshes; groups are derived.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property

from hostir.errors import MeshError
from hostir.ir.scalars import MeshCoordinate, MeshNamer, Scalar, add, mul
from hostir.ir.sharding import Mesh, MeshAxis


@dataclass(frozen=True, kw_only=True)
class Team:
    """Groups of ``mesh``'s devices along ``axes`` (outer first); see module docstring."""

    mesh: Mesh
    axes: tuple[MeshAxis, ...]

    def __post_init__(self) -> None:
        if len(set(self.axes)) != len(self.axes):
            raise MeshError(f"team axes {[a.value for a in self.axes]} repeat")
        for axis in self.axes:
            axis.dim(self.mesh.ndim)  # raises if the mesh lacks the axis

    @property
    def size(self) -> int:
        """Number of devices in each group."""
        return math.prod(self.mesh.axis_size(axis) for axis in self.axes)

    @cached_property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Every group, each in team order; groups ordered by their first device."""
        team_dims = [axis.dim(self.mesh.ndim) for axis in self.axes]
        other_dims = [d for d in range(self.mesh.ndim) if d not in team_dims]
        groups = []
        for fixed in itertools.product(*(range(self.mesh.shape[d]) for d in other_dims)):
            group = []
            for varying in itertools.product(*(range(self.mesh.shape[d]) for d in team_dims)):
                coords = [0] * self.mesh.ndim
                for d, c in zip(other_dims, fixed, strict=True):
                    coords[d] = c
                for d, c in zip(team_dims, varying, strict=True):
                    coords[d] = c
                group.append(self.mesh.device(coords))
            groups.append(tuple(group))
        return tuple(groups)

    def group_of(self, device: int) -> tuple[int, ...] | None:
        """The group holding ``device`` (in team order), or None if it is not in the mesh;
        computed from its coordinates, without listing the other groups, once per device
        (every run of a collective asks for its rank's group)."""
        known = self.__dict__.setdefault("_known_groups", {})  # beside the cached properties
        if device not in known:
            group = self._group_of(device)
            known[device] = group
            # Every member's group is this one: a simulated world's ranks, which all ask
            # in one process, then list each group once (O(devices), not O(devices²)).
            for member in group or ():
                known[member] = group
        return known[device]

    def _group_of(self, device: int) -> tuple[int, ...] | None:
        coords = self.mesh.coordinates(device)
        if coords is None:
            return None
        team_dims = [axis.dim(self.mesh.ndim) for axis in self.axes]
        group = []
        for varying in itertools.product(*(range(self.mesh.shape[d]) for d in team_dims)):
            member = list(coords)
            for d, c in zip(team_dims, varying, strict=True):
                member[d] = c
            group.append(self.mesh.device(member))
        return tuple(group)

    def position(self, device: int) -> int:
        """``device``'s index in its group: its coordinates on the team axes, row-major."""
        coords = self.mesh.coordinates(device)
        if coords is None:
            raise MeshError(f"device {device} is not in team {self}")
        index = 0
        for axis in self.axes:
            d = axis.dim(self.mesh.ndim)
            index = index * self.mesh.shape[d] + coords[d]
        return index

    def my_position(self) -> Scalar:
        """This rank's index in its group as a scalar expression (what :meth:`position`
        gives for a known device): its coordinates on the team axes, row-major."""
        index: Scalar = 0
        for axis in self.axes:
            coordinate = MeshCoordinate(mesh=self.mesh, axis=axis)
            index = add(mul(index, self.mesh.axis_size(axis)), coordinate)
        return index

    def __str__(self) -> str:
        axes = ", ".join(axis.value for axis in self.axes)
        return f"{self.mesh}({axes})"


def print_team(team: Team, mesh_name: MeshNamer = str) -> str:
    """``M0(y, x)``: the team's mesh (named by ``mesh_name``; the printer passes its
    ``M<n>`` names) and its axes, outer first."""
    return f"{mesh_name(team.mesh)}({', '.join(axis.value for axis in team.axes)})"
