"""The built-in local launcher behind ``hostir run SCRIPT --nproc N``.

It starts N Python processes on this machine with the same variables torchrun
sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``), so a script creates its process group from
them exactly as it would under torchrun. If one rank fails the others are
stopped: a rank waiting in a collective for a dead peer would otherwise hang.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

POLL_INTERVAL_S = 0.05
STOP_TIMEOUT_S = 5.0


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_environment(rank: int, nproc: int, port: int, backend: str) -> dict[str, str]:
    """The environment of local rank ``rank`` of ``nproc``: ours plus the launcher variables."""
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        HOSTIR_BACKEND=backend,
    )
    return env


def launch(script: str, nproc: int, args: list[str], backend: str = "gloo") -> int:
    """Runs ``script`` as ``nproc`` local ranks; returns 0, or the exit code of a failed rank.

    When a rank exits non-zero the others are terminated and its code is
    returned (negative if it was killed by a signal, as in ``subprocess``).
    """
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, script, *args], env=rank_environment(rank, nproc, port, backend)
        )
        for rank in range(nproc)
    ]
    try:
        return wait_all(procs)
    finally:
        stop(procs)  # no-op when all have exited; also covers Ctrl-C


def wait_all(procs: list[subprocess.Popen]) -> int:
    """Waits until every process exits (0) or the first one fails (its exit code)."""
    running = list(procs)
    while running:
        for proc in list(running):
            code = proc.poll()
            if code is None:
                continue
            if code != 0:
                return code
            running.remove(proc)
        time.sleep(POLL_INTERVAL_S)
    return 0


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
