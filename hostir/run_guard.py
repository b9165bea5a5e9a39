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

Which run holds the guard is kept per thread by :func:`one_run_per_world`, the
decorator of ``HostIrEvaluator.run``: what a run entered (:func:`enter_for_run`)
is left when the run returns or raises, whatever it raised.
"""

from __future__ import annotations

import functools
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


# -- Runs: what a run entered is left when it ends ------------------------------------

_RUNS = threading.local()


@dataclass
class _Exit:
    """What a run entered, with how to leave it: ``leave()`` returns the calls refused
    meanwhile; ``tell`` posts the overlap to the other ranks."""

    leave: Callable[[], list[str]]
    what: str
    where: str
    tell: Callable[[str], None]


def enter_for_run(guard: WorldGuard, what: str, where: str, tell: Callable[[str], None]) -> None:
    """Enters ``guard`` until the enclosing :func:`one_run_per_world` call ends."""
    guard.enter(what, where)
    _RUNS.exits[-1].append(_Exit(guard.leave, what, where, tell))


def hold_for_run(lock: threading.RLock) -> None:
    """Acquires ``lock`` until the enclosing :func:`one_run_per_world` call ends (it
    blocks: for state that runs may share in turn, never for a world's collectives)."""
    lock.acquire()

    def release() -> list[str]:
        lock.release()
        return []

    _RUNS.exits[-1].append(_Exit(release, "", "", lambda message: None))


def occupy_world(
    communicator: Any, digest: Callable[[], str], alone: threading.RLock | None = None
) -> None:
    """What a run does before anything communicates: in a world of more than one rank,
    enters its guard (naming the program by ``digest()``'s first 12 digits); in a world
    of one, holds ``alone`` (a lock for state runs share in turn), if given."""
    if communicator.world_size > 1:
        what = f"program {digest()[:12]}"
        tell = communicator.post_failure
        enter_for_run(communicator.run_guard(), what, communicator.where(), tell)
    elif alone is not None:
        hold_for_run(alone)


def one_run_per_world(run: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates a run method: what the run entered is left however it ends, and a run
    that returns after another thread's call was refused during it raises instead."""

    @functools.wraps(run)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        stack = _RUNS.__dict__.setdefault("exits", [])
        stack.append([])
        try:
            result = run(*args, **kwargs)
        except BaseException:
            _leave_all(stack.pop(), tell=False)  # the peers hear of the run's own error
            raise
        overlap = _leave_all(stack.pop())
        if overlap is not None:
            raise overlap
        return result

    return guarded


def _leave_all(exits: list[_Exit], tell: bool = True) -> ConcurrentRunError | None:
    """Leaves what a run entered, last first; the error for a run that overlapped (told to
    the other ranks if ``tell``)."""
    error = None
    for entry in reversed(exits):
        refused = entry.leave()
        if refused and error is None:
            error = ConcurrentRunError(
                f"{entry.where}: {thread_name()} ran {entry.what} while"
                f" {', '.join(refused)} tried to run on the same world and was refused; the"
                " other ranks may have paired this run's collectives with that thread's, so"
                f" its result is not returned. {ADVICE[0].upper()}{ADVICE[1:]}"
            )
            if tell:
                entry.tell(f"ConcurrentRunError: {error}")
    return error
