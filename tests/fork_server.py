"""The fork server of the tests' child runs (its client is tests/child_runs.py).

``python -m tests.fork_server`` imports torch and the project once, then reads
requests, one JSON object a line, on stdin. For each it forks a child that
behaves like a fresh ``python`` process started with the request's command:

- ``kind`` ``"code"``: ``python -c`` of ``target`` (compiled as ``filename``),
  ``"script"``: ``python target``, ``"module"``: ``python -m target``; with
  ``argv``, ``cwd`` and ``env`` (the whole environment) as given;
- stdin is /dev/null; stdout and stderr go to the files named ``stdout`` and
  ``stderr``;
- the child starts a process group of its own (not a session: see
  tests/child_runs.py), so signalling the group its pid names reaches
  everything it starts;
- it exits as the interpreter would: ``SystemExit`` gives the exit code, an
  uncaught exception prints its traceback and gives 1, and ``atexit``
  handlers run. The interpreter's own teardown is skipped (it takes about a
  second with torch loaded); non-daemon threads are not waited for.

The server answers each request with the child's pid on a line of its own
and, once the child has exited, writes its exit code (negative: the signal
that killed it, as in ``subprocess``) to the file named ``status``. When its
stdin closes it kills the children still running and exits.

Torch is imported but never used here: a process that has run torch
operations (and so started thread pools) is not safe to fork.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import sys
import traceback
from typing import NoReturn

import torch  # noqa: F401  imported once: every child inherits these modules
import torch.distributed  # noqa: F401

import frontend  # noqa: F401
import hostir  # noqa: F401
import lowering  # noqa: F401

POLL_S = 0.05
"""How often the server reaps children while some are running."""
_OWN_FILES = (__file__, runpy.__file__, "<frozen runpy>")


def main() -> None:
    """Serves requests until stdin closes, then kills the children left."""
    children: dict[int, str] = {}  # pid -> the file its exit code goes to
    pending = b""
    while True:
        timeout = POLL_S if children else None
        readable, _, _ = select.select([0], [], [], timeout)
        if readable:
            data = os.read(0, 1 << 16)
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                request = json.loads(line)
                pid = _fork(request)
                children[pid] = request["status"]
                os.write(1, b"%d\n" % pid)
        _reap(children)
    for pid in children:
        _kill_group(pid)


def _fork(request: dict) -> int:
    """Forks the child that runs ``request``; returns its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(request)
    return pid


def _reap(children: dict[int, str]) -> None:
    """Writes the exit code of every child that has exited (atomically: write, rename)."""
    while children:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = children.pop(pid, None)
        if path is not None:
            with open(path + ".tmp", "w") as file:
                file.write(str(os.waitstatus_to_exitcode(wait_status)))
            os.replace(path + ".tmp", path)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:  # gone already
        pass


# ---------------------------------------------------------------------------
# In the child


def _child(request: dict) -> NoReturn:
    """Becomes the process the request describes, runs it and exits."""
    status = 1
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _redirect(request["stdout"], request["stderr"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        status = _run(request["kind"], request["target"], request.get("filename", "<string>"))
        atexit._run_exitfuncs()  # as the interpreter does when it exits
    except BaseException:  # a failure of the server's own code: say so, never return
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken stream: nothing more to save
                pass
        os._exit(status & 0xFF)  # what sys.exit(status) leaves of it


def _redirect(stdout: str, stderr: str) -> None:
    """stdin from /dev/null, stdout and stderr to the given files."""
    writing = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, stdout, writing),
        (2, stderr, writing),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)


def _run(kind: str, target: str, filename: str) -> int:
    """Runs the code, script or module as ``__main__``; returns the exit code."""
    try:
        if kind == "code":
            sys.path[0] = ""
            # dont_inherit: the code must not inherit this module's `from __future__ import
            # annotations` (string annotations break dataclasses declared in the code).
            code = compile(target, filename, "exec", dont_inherit=True)
            exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
        elif kind == "script":
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
        elif kind == "module":
            sys.path[0] = os.getcwd()
            sys.modules.pop(target, None)  # else runpy warns that it was imported already
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            raise ValueError(f"unknown kind of request: {kind!r}")
    except SystemExit as exit:
        return _exit_code(exit.code)
    except BaseException as error:
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
            tb = tb.tb_next  # the run's frames only, as the interpreter would show them
        traceback.print_exception(type(error), error, tb)
        return 1
    return 0


def _exit_code(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives: None is 0, an int itself, else 1 (printed)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
