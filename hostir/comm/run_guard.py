"""One thread at a time communicates on a world.

torch.distributed pairs the collectives of a process group across ranks by their
order on each rank, not by the thread that issued them. Two threads of one rank
running programs on the same world at once would interleave their collectives
in an order the other ranks cannot know, and the ranks would pair one thread's
messages with another's: wrong numbers, no error. So a world (a communicator's
ranks: every ``TorchCommunicator`` of a process shares the default group's) has
a :class:`WorldGuard`:

- a run of more than one rank *enters* it for its whole length, from before the
  agreement to its last wait; a call from another thread while it is held raises
  :class:`~hostir.errors.ConcurrentRunError` naming both threads and programs;
  the same thread may enter again (a run inside a run);
- the running call, once a call from another thread was refused during it, raises
  ConcurrentRunError too instead of returning: the other ranks may have started
  that thread's run and paired its collectives with this one's;
- the communicator's synchronous steps (the agreement's exchanges, creating
  groups) enter it for their own length, and posting a collective checks it, so a
  rank telling its peers about a failure outside a run is covered too.

Sequential calls from different threads are fine: the guard is free between runs.
A world of one rank has no collectives and no guard: there, threads may run
programs at once (see ``HostIrEvaluator``).

``HostIrEvaluator.run`` holds it with :func:`occupying_world`, which lets go
when the run returns or raises, whatever it raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hostir.errors import ConcurrentRunError

ADVICE = (
    "torch.distributed pairs collectives across ranks by their order, not by thread, so"
    " the ranks could mix the two runs' messages: run programs on one world from one"
    " thread at a time (a lock around execute or run)"
)


def thread_name() -> str:
    """The calling thread as messages name it: ``thread 'worker-1'``."""
    return f"thread {threading.current_thread().name!r}"


@dataclass
class _Holder:
    """The thread that holds a guard, what it runs, and the calls refused meanwhile."""

    ident: int
    name: str
    what: str
    depth: int = 1
    refused: list[str] = field(default_factory=list)


class WorldGuard:
    """Which thread communicates on one world now (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: _Holder | None = None

    def enter(self, what: str, where: str) -> None:
        """Holds the guard for the calling thread (again, if it holds it already);
        ConcurrentRunError if another thread holds it. ``what`` names the caller's work
        (``program 3f2a9c1b0d4e``), ``where`` the world (``rank 0 of 2``)."""
        with self._lock:
            holder = self._holder
            if holder is None:
                self._holder = _Holder(threading.get_ident(), thread_name(), what)
                return
            if holder.ident == threading.get_ident():
                holder.depth += 1
                return
            raise self._refusal(holder, what, where)

    def leave(self) -> list[str]:
        """Lets go of one enter of the calling thread; at the last, the calls refused while
        it held the guard (empty when none were)."""
        with self._lock:
            holder = self._holder
            if holder is None or holder.ident != threading.get_ident():
                return []
            holder.depth -= 1
            if holder.depth:
                return []
            self._holder = None
            return holder.refused

    def held_elsewhere(self) -> bool:
        """Whether a thread other than the caller holds the guard now (a lock-free glance,
        for the collectives' fast path; :meth:`check` decides under the lock)."""
        holder = self._holder
        return holder is not None and holder.ident != threading.get_ident()

    def check(self, what: str, where: str) -> None:
        """ConcurrentRunError if a thread other than the caller holds the guard (for a
        collective posted outside :meth:`enter`)."""
        with self._lock:
            holder = self._holder
            if holder is not None and holder.ident != threading.get_ident():
                raise self._refusal(holder, what, where)

    @contextmanager
    def holding(self, what: str, where: str) -> Iterator[None]:
        """Holds the guard while the ``with`` block runs."""
        self.enter(what, where)
        try:
            yield
        finally:
            self.leave()

    def _refusal(self, holder: _Holder, what: str, where: str) -> ConcurrentRunError:
        """Records the refused call on ``holder`` and returns the caller's error."""
        me = thread_name()
        holder.refused.append(f"{me} ({what})")
        return ConcurrentRunError(
            f"{where}: {me} cannot run {what}: {holder.name} is running {holder.what} on"
            f" the same world; {ADVICE}"
        )


# -- Runs -------------------------------------------------------------------------------


@contextmanager
def occupying_world(
    communicator: Any, digest: Callable[[], str], alone: threading.RLock | None = None
) -> Iterator[None]:
    """Holds what a run holds while the ``with`` block runs, from before anything
    communicates: in a world of more than one rank, its guard (naming the program by
    ``digest()``'s first 12 digits); in a world of one, ``alone`` (a lock for state runs
    share in turn; it blocks), if given. A block that ends normally after another
    thread's call was refused during it raises ConcurrentRunError instead, told to the
    other ranks; one that raises keeps its own error (the peers hear of that one)."""
    if communicator.world_size == 1:
        if alone is None:
            yield
            return
        with alone:
            yield
        return
    guard, what, where = communicator.run_guard(), f"program {digest()[:12]}", communicator.where()
    guard.enter(what, where)
    try:
        yield
    except BaseException:
        guard.leave()
        raise
    refused = guard.leave()
    if refused:
        error = ConcurrentRunError(
            f"{where}: {thread_name()} ran {what} while {', '.join(refused)} tried to run on"
            " the same world and was refused; the other ranks may have paired this run's"
            f" collectives with that thread's, so its result is not returned."
            f" {ADVICE[0].upper()}{ADVICE[1:]}"
        )
        communicator.post_failure(f"ConcurrentRunError: {error}")
        raise error
