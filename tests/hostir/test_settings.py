"""Settings from the environment: every bad value is a SettingError naming the variable,
its text and what is expected, at once (hostir.settings).

They used to give a ValueError from ``int()`` (``HOSTIR_STREAMS=²`` passes
``str.isdigit``; ``RANK=abc``), an OverflowError from ``datetime.timedelta``
(``HOSTIR_TIMEOUT=1e14``), a wait for the whole timeout (``RANK=3 WORLD_SIZE=2``), or
silently the default (``HOSTIR_CHECK_RACES=true``).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from hostir import default_communicator
from hostir.comm.timeouts import MAX_TIMEOUT_S, collective_timeout
from hostir.comm.world import init_process_group_from_env
from hostir.errors import SettingError
from hostir.run.pipelined_loops import pipeline_checking_enabled
from hostir.run.race_checker import race_checking_enabled
from hostir.run.stream_pool import MAX_STREAMS, stream_count
from hostir.text.round_trip import round_trip_checking_enabled
from tests.child_runs import Python, Run

LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "HOSTIR_BACKEND",
)


@pytest.mark.parametrize(
    "variable, text, read, expected",
    [
        ("HOSTIR_STREAMS", "²", stream_count, "a positive integer up to 32 (ASCII digits)"),
        ("HOSTIR_STREAMS", "٣", stream_count, "a positive integer up to 32"),
        ("HOSTIR_STREAMS", "1_0", stream_count, "a positive integer up to 32"),
        ("HOSTIR_STREAMS", str(MAX_STREAMS + 1), stream_count, "a positive integer up to 32"),
        ("HOSTIR_STREAMS", "9" * 5000, stream_count, "a positive integer up to 32"),
        ("HOSTIR_TIMEOUT", "1e14", collective_timeout, "seconds, from 0.001 to 604800"),
        ("HOSTIR_TIMEOUT", "1_0", collective_timeout, "seconds, from 0.001 to 604800"),
        ("HOSTIR_TIMEOUT", "nan", collective_timeout, "seconds, from 0.001 to 604800"),
        ("HOSTIR_TIMEOUT", "1e-9", collective_timeout, "seconds, from 0.001 to 604800"),
        ("HOSTIR_CHECK_PIPELINE", "2", pipeline_checking_enabled, "0 or 1"),
        ("HOSTIR_CHECK_RACES", "true", race_checking_enabled, "0 or 1"),
        ("HOSTIR_CHECK_ROUND_TRIP", "on", round_trip_checking_enabled, "0 or 1"),
    ],
    ids=lambda value: value[:12] if isinstance(value, str) else None,
)
def test_a_bad_setting_is_named_with_its_text(monkeypatch, variable, text, read, expected):
    monkeypatch.setenv(variable, text)
    shown = repr(text) if len(text) < 40 else repr(text)[:37] + "..."
    with pytest.raises(SettingError, match=f"^{variable}={shown}: expected") as info:
        read()
    assert expected in str(info.value)


def test_settings_follow_the_environment(monkeypatch):
    """Parsed once per text: a changed variable is seen at once, a bad text is refused
    after a good one was read (a cache by variable would miss both); blanks and empty are
    allowed (empty is unset)."""
    monkeypatch.setenv("HOSTIR_STREAMS", " 3 ")
    assert stream_count() == 3
    monkeypatch.setenv("HOSTIR_STREAMS", "5")
    assert stream_count() == 5
    monkeypatch.setenv("HOSTIR_STREAMS", "٣")
    with pytest.raises(SettingError, match="HOSTIR_STREAMS='٣'"):
        stream_count()
    monkeypatch.setenv("HOSTIR_STREAMS", "")
    assert stream_count() == 4
    monkeypatch.setenv("HOSTIR_CHECK_RACES", "0")
    assert not race_checking_enabled()
    monkeypatch.setenv("HOSTIR_TIMEOUT", str(MAX_TIMEOUT_S))
    assert collective_timeout().total_seconds() == MAX_TIMEOUT_S


@pytest.mark.parametrize("value", [1e308, 10**400, 1e-9], ids=["1e308", "10**400", "1e-9"])
def test_a_bad_timeout_argument_is_named(value):
    """``execute(timeout=1e308)`` overflowed datetime.timedelta (OverflowError), 10**400
    overflowed math.isfinite, 1e-9 became a zero timeout."""
    with pytest.raises(SettingError, match=r"^timeout: expected a positive number of seconds"):
        collective_timeout(value)


@pytest.fixture
def launcher(monkeypatch):
    """Sets launcher variables (none set before); a short timeout bounds what a wrongly
    accepted world would wait for."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOSTIR_TIMEOUT", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")

    def set_variables(**values: str) -> None:
        for name, text in values.items():
            monkeypatch.setenv(name, text)

    return set_variables


@pytest.mark.parametrize(
    "variables, message",
    [
        ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK='3': expected a rank in [0, 2)"),
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc': expected a whole number >= 0"),
        ({"RANK": "0", "WORLD_SIZE": "abc"}, "WORLD_SIZE='abc': expected a positive integer"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0': expected a positive integer"),
        ({"RANK": "1"}, "RANK is set but WORLD_SIZE is not"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2"},
            "LOCAL_RANK='2': expected a local rank in [0, 2)",
        ),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "99999"},
            "MASTER_PORT='99999': expected a positive integer up to 65535",
        ),
        (
            {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "2"},
            "OMPI_COMM_WORLD_RANK='5': expected a rank in [0, 2)",
        ),
    ],
    ids=[
        "rank-outside",
        "rank-text",
        "size-text",
        "size-0",
        "rank-alone",
        "local-rank",
        "port",
        "ompi",
    ],
)
def test_launcher_variables_are_refused_before_anything_waits(launcher, variables, message):
    """``RANK=3 WORLD_SIZE=2`` used to wait out the whole timeout for peers that cannot
    exist; now every bad launcher variable is refused before the process group is made."""
    launcher(**variables)
    with pytest.raises(SettingError) as info:
        if dist.is_initialized():  # under torchrun: the default communicator is its group's
            init_process_group_from_env(use_cuda=False)  # what it calls without a group
        else:
            default_communicator()
    assert message in str(info.value)


UNRESOLVABLE = """
import os, time
from hostir import default_communicator
from hostir.errors import SettingError

for size, rank in (("1", "0"), ("2", "1")):
    os.environ.update(WORLD_SIZE=size, RANK=rank)
    started = time.monotonic()
    try:
        default_communicator()
    except SettingError as error:
        print(f"{size} {time.monotonic() - started:.1f} {error}", flush=True)
"""


def test_an_unresolvable_rendezvous_host_is_one_line_at_once(child_runs):
    """``MASTER_ADDR=no.such.host.invalid`` made a world of one (and each rank of more)
    wait out the timeout twice while torch's store retried, printing pages of C++ traces,
    then a CommunicationError blaming a stalled peer. Now a SettingError names the
    variable and its text before anything waits. In a child process: no group may be
    made in the test's own."""
    timeout_s = 60.0  # the wait it used to take, twice per world
    run = Run(
        "unresolvable MASTER_ADDR",
        Python("code", UNRESOLVABLE),
        env=(("MASTER_ADDR", "no.such.host.invalid"), ("HOSTIR_TIMEOUT", str(timeout_s))),
    )
    done = child_runs.result(run)
    assert done.returncode == 0 and done.killed is None, done.describe()
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["1", "2"], done.describe()
    for line in lines:
        _, seconds, message = line.split(" ", 2)
        assert float(seconds) < timeout_s / 2, line
        assert message.startswith("MASTER_ADDR='no.such.host.invalid': the rendezvous host")
    assert "c10d" not in done.stderr and "frame #" not in done.stderr, done.stderr


def test_hostir_dump_is_strict(monkeypatch, capsys):
    """HOSTIR_DUMP=hostir (a typo) used to be ignored silently; host_ir prints the program."""
    import torch

    from frontend import FusionDefinition

    with FusionDefinition() as fd:
        x = fd.define_tensor((4,))
        fd.add_output(fd.ops.relu(x))
    a = torch.randn(4)
    monkeypatch.setenv("HOSTIR_DUMP", "hostir")
    with pytest.raises(SettingError, match=r"HOSTIR_DUMP='hostir': expected host_ir"):
        fd.execute([a])
    monkeypatch.setenv("HOSTIR_DUMP", "host_ir")
    (out,) = fd.execute([a])
    torch.testing.assert_close(out, a.relu())
    assert "T1 : float32[4] = relu(T0)" in capsys.readouterr().out


def environment_reads(tree) -> list[tuple[int, str]]:
    """Where ``tree`` reads the environment: ``os.environ.get``, ``os.getenv``,
    ``os.environ[...]`` and ``dict(os.environ)``, with their text (``setdefault`` writes)."""
    import ast

    found = []
    for node in ast.walk(tree):
        reads = (
            isinstance(node, ast.Subscript)
            and ast.unparse(node.value) == "os.environ"
            or isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("os.environ.get", "os.getenv")
            or isinstance(node, ast.Call)
            and [ast.unparse(a) for a in node.args] == ["os.environ"]
        )
        if reads:
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_every_environment_read_goes_through_the_settings_module():
    """docs/reliability.md says every setting hostir reads goes through hostir/settings.py
    (strict parsing, named errors): no other module of the three packages reads the
    environment, but for the named reads below, which parse nothing."""
    import ast
    import pathlib

    allowed = {
        ("hostir/comm/world.py", "os.environ['MASTER_ADDR']"),  # a host name, shown in a message
        ("hostir/comm/world.py", "os.environ['MASTER_PORT']"),  # checked by settings before
        ("hostir/comm/launcher.py", "dict(os.environ)"),  # the environment of the ranks it starts
    }
    root = pathlib.Path(__file__).resolve().parents[2]
    found = []
    for package in ("hostir", "lowering", "frontend"):
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            if name == "hostir/settings.py":
                continue
            for line, text in environment_reads(ast.parse(path.read_text())):
                if (name, text) not in allowed:
                    found.append(f"{name}:{line}: {text}")
    assert not found, "environment read outside hostir/settings.py:\n" + "\n".join(found)
    sample = ast.parse("import os\nx = os.environ.get('A')\ny = os.environ['B']\n")
    assert [text for _, text in environment_reads(sample)] == [
        "os.environ.get('A')",
        "os.environ['B']",
    ]
