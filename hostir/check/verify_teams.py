"""Where a communication's team lies: on the devices of the tensors it reads and writes.

A communication runs on the devices of its team's mesh (``hostir.run.steps.placement``);
a rank outside that mesh skips it, and what it defines is None there. So, for every
instruction with a team (the built-in communications and those declared outside the
package):

- each device that holds ``out`` takes part: it is a member of the team; where only
  one member of each group receives (a Reduce's or a Gather's root, a SendRecv's
  receiver, at a constant position) and ``out`` is fresh, it is that member (another
  would return a buffer nothing wrote). A preallocated ``out`` may be written by other
  instructions too (a loop of Gathers to each root in turn), so membership is enough;
- each device that sends holds ``src``: every member of the other built-in collectives
  (:data:`~hostir.ir.communications.COLLECTIVES`), the root of a Broadcast or a Scatter
  and the sender of a SendRecv (at a constant position);
- each member holds ``src`` or ``out``: a member that holds neither has nothing to do
  there (a Broadcast from one device to a mesh without it is a team of the device and
  the mesh, as the lowering writes it: legal);
- each constant position (``root``, ``sender``, ``receiver``, the peers) is one of the
  team's, 0 to its group size - 1.

A value without a mesh is on every rank: whether every rank is in the team depends on
the world, and the evaluator refuses a rank that would hold it without running the
instruction (``hostir.run.steps.skipped_failure``). Positions that are expressions (a
stream loop's ``root=j``) are checked where they are evaluated
(``hostir.run.communication_handlers``). The device sets are computed once per pair of
meshes (and per team and position), not per instruction.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

from hostir.ir.communications import COLLECTIVES, POSITION_FIELDS, RECEIVER_FIELD, SENDER_FIELD
from hostir.ir.mesh import Mesh, describe_devices
from hostir.ir.scalars import Const
from hostir.ir.team import Team, print_team
from hostir.ir.values import TensorValue

MeshNamer = Callable[[Mesh], str]
Devices = Mesh | frozenset[int]
"""A set of devices: a whole mesh, or the members at one position of a team's groups."""


def team_problem(instruction: Any, mesh_name: MeshNamer = str) -> str | None:
    """What is wrong with where ``instruction``'s team lies (module docstring), as a
    sentence naming the team, the tensor and their devices (meshes named by
    ``mesh_name``); None if nothing is, or it has no team."""
    team = getattr(instruction, "team", None)
    if not isinstance(team, Team):
        return None
    where = _Where(instruction, team, mesh_name)
    return where.positions() or where.receivers() or where.senders() or where.idle_members()


class _Where:
    """One instruction's team and operands, and the sentences that describe them."""

    def __init__(self, instruction: Any, team: Team, mesh_name: MeshNamer) -> None:
        self.instruction, self.team, self.mesh_name = instruction, team, mesh_name
        self.kind = type(instruction)
        self.src = _held(getattr(instruction, "src", None))
        self.out = _held(getattr(instruction, "out", None))

    def positions(self) -> str | None:
        """A constant position outside the team's groups."""
        for name in POSITION_FIELDS:
            position = _constant(getattr(self.instruction, name, None))
            if position is None:
                continue
            size = self.team.size
            if not 0 <= position < size:
                return (
                    f"{name} {position} is not a member of team {self.team_text()}: its groups"
                    f" have {size} member(s); expected a position from 0 to {size - 1}"
                )
        return None

    def receivers(self) -> str | None:
        """A device that holds ``out`` but receives nothing."""
        if self.out is None:
            return None
        out, holders = self.out, self.out.sharding.mesh
        field = RECEIVER_FIELD.get(self.kind)
        position = _constant(getattr(self.instruction, field, None)) if field else None
        if position is None or getattr(self.instruction, "preallocated", False):
            device = _first_outside(holders, (self.team.mesh,))
            if device is None:
                return None
            return (
                f"{out.name} is on {self.mesh_text(holders)}, but team {self.team_text()} is"
                f" on devices {_listed(self.team.mesh)}: device {device} would hold"
                f" {out.name} without taking part; expected {out.name}'s devices in the team"
            )
        receivers = _members_at(self.team, position)
        device = _first_outside(holders, (receivers,))
        if device is None:
            return None
        return (
            f"{out.name} is on {self.mesh_text(holders)}, but only the {field} of each group of"
            f" team {self.team_text()} receives it (devices {_listed(receivers)}): device"
            f" {device} would hold {out.name} unwritten; expected {out.name} on those devices"
        )

    def senders(self) -> str | None:
        """A device that sends ``src`` but does not hold it."""
        if self.src is None:
            return None
        field = SENDER_FIELD.get(self.kind)
        if field is not None:
            position = _constant(getattr(self.instruction, field))
            if position is None:
                return None
            senders: Devices = _members_at(self.team, position)
        elif self.kind in COLLECTIVES:
            senders = self.team.mesh
        else:
            return None  # a communication declared elsewhere: who sends is its own
        device = _first_outside(senders, (self.src.sharding.mesh,))
        if device is None:
            return None
        src, team = self.src, self.team_text()
        who = f"the {field} of each group of" if field else "every member of"
        return (
            f"{who} team {team} (devices {_listed(senders)}) sends {src.name}, which is on"
            f" {self.mesh_text(src.sharding.mesh)}: device {device} does not hold it; expected"
            f" the senders on {src.name}'s devices"
        )

    def idle_members(self) -> str | None:
        """A member of the team that holds neither ``src`` nor ``out``."""
        tensors = [getattr(self.instruction, name, None) for name in ("src", "out")]
        values = [v for v in tensors if isinstance(v, TensorValue)]
        if not values or any(v.sharding is None for v in values):
            return None  # a value on every rank: every member holds it
        meshes = tuple(v.sharding.mesh for v in values)
        device = _first_outside(self.team.mesh, meshes)
        if device is None:
            return None
        held = " nor ".join(
            f"{v.name} (on {self.mesh_name(v.sharding.mesh)}: devices {_listed(v.sharding.mesh)})"
            for v in values
        )
        held = f"holds neither {held}" if len(values) > 1 else f"does not hold {held}"
        return (
            f"device {device} of team {self.team_text()} {held}; expected the team on the"
            " devices of the tensors it reads and writes"
        )

    def team_text(self) -> str:
        return print_team(self.team, self.mesh_name)

    def mesh_text(self, mesh: Mesh) -> str:
        return f"mesh {self.mesh_name(mesh)} (devices {_listed(mesh)})"


def _held(value: Any) -> TensorValue | None:
    """``value`` if it is a tensor on a mesh (one without a mesh is on every rank)."""
    return value if isinstance(value, TensorValue) and value.sharding is not None else None


def _constant(scalar: Any) -> int | None:
    return scalar.value if isinstance(scalar, Const) and type(scalar.value) is int else None


def _holds(place: Devices, device: int) -> bool:
    return place.contains(device) if isinstance(place, Mesh) else device in place


def _devices(place: Devices) -> Iterable[int]:
    return place.devices if isinstance(place, Mesh) else sorted(place)


def _listed(place: Devices) -> str:
    """``[0, 1]``: the devices of ``place``, short at any size."""
    return describe_devices(tuple(_devices(place)))


@lru_cache(maxsize=1024)
def _first_outside(place: Devices, within: tuple[Devices, ...]) -> int | None:
    """The first device of ``place`` that no place of ``within`` holds; None if there is
    none. Cached: a program's communications use few meshes, and a mesh's devices are
    listed once per pair."""
    if place in within:
        return None
    return next((d for d in _devices(place) if not any(_holds(w, d) for w in within)), None)


@lru_cache(maxsize=1024)
def _members_at(team: Team, position: int) -> frozenset[int]:
    """The device at ``position`` in each of ``team``'s groups (its coordinates on the
    team axes are ``position``'s digits, row-major; the other coordinates range over
    the mesh)."""
    mesh = team.mesh
    coords = [0] * mesh.ndim
    for axis in reversed(team.axes):
        size = mesh.axis_size(axis)
        coords[axis.dim(mesh.ndim)] = position % size
        position //= size
    fixed = {axis.dim(mesh.ndim) for axis in team.axes}
    others = [d for d in range(mesh.ndim) if d not in fixed]
    members = set()
    for values in itertools.product(*(range(mesh.shape[d]) for d in others)):
        for d, value in zip(others, values, strict=True):
            coords[d] = value
        members.add(mesh.device(coords))
    return frozenset(members)
