"""hostir's ``torch.distributed`` process groups and its keys in the default store.

hostir's collectives run on process groups of its own, never on the default
group: the world as one group, one group per team group a program uses, and a
gloo group for the agreement before a program's first run (hostir.comm.agreement).
So a user's own collectives on the default group never meet ours, hostir's
timeout (HOSTIR_TIMEOUT, ``execute(timeout=)``) applies to hostir's groups only,
and a rank still in an earlier program's collectives cannot mix its messages
with an agreement.

:data:`GROUPS` keeps the groups by member tuple in team order (and the agreement's), one
cache for every :class:`~hostir.comm.torch_communicator.TorchCommunicator` of the
process, as :data:`WORLD_GUARD` is one guard; the store holds, per rank, how many
agreements it entered (to name a rank missing from one) and the last failure it posted.
"""

from __future__ import annotations

import atexit
import datetime
from typing import Any

import torch.distributed as dist

from hostir.comm.backend_hooks import Group, Work
from hostir.comm.run_guard import WorldGuard
from hostir.errors import CommunicationError

AGREEMENT = "agreement"
"""The key of the agreement's group in the group cache."""

ARRIVALS = "hostir/agreement-arrivals/"
"""Store key prefix: per rank, how many agreements it has entered (to name a missing rank)."""

NOTICES = "hostir/failure/"
"""Store key prefix: per rank, ``<time.time()>|<error>`` of its last failure."""


class GroupCache:
    """hostir's process groups by member tuple in team order (and the agreement's), for one
    default group, with the timeout they were last given.

    Shared by every TorchCommunicator of this process: all ranks prepare the same
    groups in the same order, so their caches stay in step. A re-initialized world
    starts afresh.
    """

    def __init__(self) -> None:
        self.world: Any = None
        self.groups: dict[Group | str, Any] = {}
        self.timeout: datetime.timedelta | None = None
        self.failure: CommunicationError | None = None  # the first backend failure
        self.announced: Work | None = None  # an agreement message sent without waiting

    def current(self) -> dict[Group | str, Any]:
        """The groups of the current default group (emptied if that group changed)."""
        world = dist.group.WORLD
        if self.world is not world:
            if self.world is None:
                atexit.register(self.release)
            self.groups = {}
            self.timeout = None
            self.failure = None
            self.announced = None
            self.world = world  # holding it keeps its id from being reused
        return self.groups

    def release(self) -> None:
        """Destroys our groups of the current world (at exit: left to interpreter teardown,
        gloo's threads are sometimes destroyed while joinable, which aborts the process)."""
        if not dist.is_initialized() or dist.group.WORLD is not self.world:
            return
        for group in self.groups.values():
            if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)
        self.groups = {}


GROUPS = GroupCache()

WORLD_GUARD = WorldGuard()
"""One thread at a time communicates on the default group (hostir.comm.run_guard): shared by
every TorchCommunicator of this process, as the group is."""


# -- The store: agreement arrivals and failure notices ---------------------------------


def _arrive(rank: int) -> int | None:
    """Counts this rank into one more agreement in the store; its count (None: no store)."""
    try:
        store = dist.distributed_c10d._get_default_store()
        return int(store.add(f"{ARRIVALS}{rank}", 1))
    except Exception:  # noqa: BLE001 - naming a missing rank is a courtesy, never a failure
        return None


def _notice(store: Any, rank: int) -> tuple[float, str] | None:
    """(time, message) of the last failure ``rank`` posted in ``store`` (None: none)."""
    key = f"{NOTICES}{rank}"
    if not store.check([key]):
        return None
    stamp, _, message = store.get(key).decode(errors="replace").partition("|")
    return float(stamp), message


def _missing(world_size: int, arrivals: int | None) -> list[int]:
    """The ranks that have entered fewer agreements than this one (empty if unknown)."""
    if arrivals is None:
        return []
    try:
        store = dist.distributed_c10d._get_default_store()
        return [r for r in range(world_size) if int(store.add(f"{ARRIVALS}{r}", 0)) < arrivals]
    except Exception:  # noqa: BLE001 - the store may be gone with a failed rank 0
        return []
