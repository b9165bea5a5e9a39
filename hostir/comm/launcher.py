"""The built-in local launcher behind ``hostir run SCRIPT --nproc N``.

It starts N Python processes on this machine with the same variables torchrun
sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``) plus ``HOSTIR_BACKEND`` (``--backend``), so a
script creates its process group from them exactly as it would under torchrun.

A local run listens on loopback only. Like torchrun's agent, the launcher serves
the ranks' rendezvous store itself (``TORCHELASTIC_USE_AGENT_STORE=True``: every
rank, a script's own ``init_process_group`` included, is then a client of it), on
a socket it binds to 127.0.0.1 and hands to the store; left to rank 0, the store
would listen on every interface. The store also outlives a failed rank 0, so the
others still read its failure notice. Gloo's own sockets bind to the address
``MASTER_ADDR`` resolves to: 127.0.0.1.

When a rank fails the others are stopped (a rank waiting in a collective for a
dead peer would otherwise wait for the collective timeout), and the launch
reports the failure that caused the others: each rank's stderr passes through
unchanged while the launcher keeps its last lines, and among the ranks that
failed within :data:`SETTLE_S` of the first, one whose error is not a
consequence of another rank's failure (``PeerFailureError``, a lost peer) is
named, with its exit code and its error line; while every failure so far is
such a consequence, the launcher waits up to :data:`CAUSE_WAIT_S` for the
rank that caused it (on a busy machine its exit can lag by seconds).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import os
import re
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from hostir.settings import checked_count

POLL_INTERVAL_S = 0.05
STOP_TIMEOUT_S = 5.0
SETTLE_S = 1.0
"""After the first failure, how long the launcher waits for the ranks that fail with it,
so that it names the root cause rather than a peer that noticed it first."""
CAUSE_WAIT_S = 30.0
"""How long the launcher waits for a cause when every failure so far is a consequence."""
TAIL_LINES = 40
"""How many of each rank's last stderr lines the launcher keeps to find its error."""
MAX_NPROC = 256
"""The most local ranks: each is a Python process with torch loaded (hundreds of MB), so
more would exhaust a machine before any of them ran."""
LOOPBACK = "127.0.0.1"
STORE_TIMEOUT = datetime.timedelta(seconds=60)
"""The timeout of the launcher's own handle on the store, which makes no requests (each
rank's client waits as long as its collective timeout says)."""

_ERROR_LINE = re.compile(
    r"^(?:\[rank\d+\]:\s*)?((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b.*)$"
)
_CONSEQUENCES = ("PeerFailureError", "a peer closed its connection", "no answer from its peers")
"""Marks of an error that a rank raised because another rank failed first."""


@dataclasses.dataclass
class RankFailure:
    """How a rank ended when it failed: its exit code and the error it printed last."""

    rank: int
    code: int
    error: str

    @property
    def is_consequence(self) -> bool:
        """Whether the rank failed because another one did (it says so)."""
        return any(mark in self.error for mark in _CONSEQUENCES)

    def describe(self) -> str:
        """``rank 1 exited with code 1: hostir.errors.InputError: ...``."""
        ending = f"code {self.code}" if self.code >= 0 else f"signal {-self.code}"
        detail = f": {self.error}" if self.error else ""
        return f"rank {self.rank} exited with {ending}{detail}"


class _Rank:
    """One launched rank: its process and the tail of its stderr (forwarded as it comes)."""

    def __init__(self, rank: int, argv: list[str], env: dict[str, str]) -> None:
        self.rank = rank
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
        self.reader = threading.Thread(target=self._forward, daemon=True)
        self.reader.start()

    def _forward(self) -> None:
        for raw in iter(self.process.stderr.readline, b""):
            sys.stderr.buffer.write(raw)
            sys.stderr.buffer.flush()
            self.tail.append(raw.decode(errors="replace").rstrip("\n"))

    def failure(self) -> RankFailure:
        """The rank's failure (call once it exited non-zero)."""
        self.reader.join(timeout=2)  # the last lines arrive after the exit
        errors = [m.group(1) for m in map(_ERROR_LINE.match, self.tail) if m]
        return RankFailure(self.rank, self.process.returncode, errors[-1] if errors else "")


def loopback_store() -> Any:
    """A rendezvous store served by this process on 127.0.0.1 only (see the module
    docstring); its ``port`` is where the ranks find it."""
    import torch.distributed as dist  # only ``hostir run`` needs it

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    sock.listen(MAX_NPROC)
    port = sock.getsockname()[1]
    # The store takes the listening socket over: the port is never free for another.
    return dist.TCPStore(
        LOOPBACK,
        port,
        None,
        True,
        timeout=STORE_TIMEOUT,
        wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )


def rank_environment(rank: int, nproc: int, port: int, backend: str) -> dict[str, str]:
    """The environment of local rank ``rank`` of ``nproc``: ours plus the launcher variables
    (the rendezvous store at 127.0.0.1:``port``, served by the launcher)."""
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",
        HOSTIR_BACKEND=backend,
    )
    return env


def launch(script: str, nproc: int, args: list[str], backend: str = "gloo") -> int:
    """Runs ``script`` as ``nproc`` local ranks; returns 0, or the exit code of the failed rank
    it names (negative if killed by a signal, as in ``subprocess``).

    A failure is reported on stderr as ``hostir: rank R exited with code C: <error>``.
    """
    checked_count(nproc, "nproc", 1, MAX_NPROC)
    store = loopback_store()
    ranks: list[_Rank] = []
    try:
        for rank in range(nproc):
            env = rank_environment(rank, nproc, store.port, backend)
            ranks.append(_Rank(rank, [sys.executable, script, *args], env))
        failure = wait_all(ranks)
    finally:
        stop([rank.process for rank in ranks])  # no-op when all have exited; also Ctrl-C
        del store  # after the ranks: they may still post failure notices
    if failure is None:
        return 0
    print(f"hostir: {failure.describe()}", file=sys.stderr, flush=True)
    return failure.code


def wait_all(ranks: list[_Rank]) -> RankFailure | None:
    """Waits until every rank exits 0 (None) or one fails (the root cause, see the module
    docstring)."""
    running = list(ranks)
    while running:
        for rank in list(running):
            code = rank.process.poll()
            if code is None:
                continue
            if code != 0:
                return root_cause(rank, ranks)
            running.remove(rank)
        time.sleep(POLL_INTERVAL_S)
    return None


def root_cause(first: _Rank, ranks: list[_Rank]) -> RankFailure:
    """The failure to report: ``first``'s, unless a rank failing within SETTLE_S says why.
    While every failure so far is a consequence of another rank's (that rank is failing
    too, only slower: a busy machine can delay its exit by seconds), the launcher waits
    for it up to CAUSE_WAIT_S."""
    start = time.monotonic()
    while any(r.process.poll() is None for r in ranks):
        waited = time.monotonic() - start
        if waited >= CAUSE_WAIT_S or (waited >= SETTLE_S and _failures(first, ranks)[0]):
            break
        time.sleep(POLL_INTERVAL_S)
    causes, failures = _failures(first, ranks)
    return (causes or failures)[0]


def _failures(first: _Rank, ranks: list[_Rank]) -> tuple[list[RankFailure], list[RankFailure]]:
    """(the failures that are no other's consequence, every failure), ``first``'s first."""
    failures = [first.failure()] + [
        r.failure() for r in ranks if r is not first and r.process.poll() not in (None, 0)
    ]
    return [f for f in failures if not f.is_consequence], failures


def stop(procs: list[subprocess.Popen]) -> None:
    """Terminates the processes still running, and kills those that do not stop in time."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
