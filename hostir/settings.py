"""Settings read from the environment, parsed strictly and in one place.

Every environment variable hostir reads goes through a reader here (the
frontend's ``HOSTIR_DUMP`` aside), so every bad value is a
:class:`~hostir.errors.SettingError` that names the variable, its text and what
is expected, instead of a ``ValueError`` from ``int()`` or a silent default.

*Parsed once*: a reader looks the variable up on every call (a dict lookup) and
parses and checks each distinct text once per process (a cache keyed by the
variable and its text), so a setting changed by a test (``monkeypatch.setenv``)
or by the program itself is seen at once, and a value is never half-checked.

*Strictly*: numbers are ASCII digits (``str.isdigit`` and ``int`` accept ``²``,
``٣`` and ``1_0``), within a range each setting documents; flags are ``0`` or
``1``; an empty value is the same as an unset one.
"""

from __future__ import annotations

import functools
import os
import re
import socket
from dataclasses import dataclass

from hostir.errors import SettingError

DEFAULT_MAXIMUM = 1_000_000
"""The largest whole number a setting takes unless it names its own maximum."""

MAX_WORLD_SIZE = 1 << 20
"""The largest ``WORLD_SIZE`` accepted: more ranks than any job runs today, and far below
where torch's C ints would overflow."""

MAX_PORT = 65535

MIN_SECONDS = 0.001
"""The shortest duration a setting takes: the backends count timeouts in milliseconds
(``datetime.timedelta`` would round a microsecond's fraction down to a zero timeout)."""

_INTEGER = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
FLAGS = ("0", "1")


def count_setting(variable: str, default: int, minimum: int, maximum: int = DEFAULT_MAXIMUM) -> int:
    """The whole number in environment variable ``variable`` (``default`` when unset or
    empty); SettingError naming the variable and its text unless it is written in ASCII
    digits and lies in ``[minimum, maximum]``."""
    text = _text(variable)
    if text is None:
        return default
    return _parsed_count(variable, text, minimum, maximum)


def flag_setting(variable: str, default: bool = False) -> bool:
    """Whether environment variable ``variable`` is ``1`` (``default`` when unset or
    empty); SettingError for anything but ``0`` or ``1``."""
    text = _text(variable)
    if text is None:
        return default
    return _parsed_choice(variable, text, FLAGS) == "1"


def choice_setting(variable: str, choices: tuple[str, ...]) -> str | None:
    """The value of ``variable`` if it is one of ``choices`` (None when unset or empty);
    SettingError naming the choices otherwise."""
    text = _text(variable)
    return None if text is None else _parsed_choice(variable, text, choices)


def seconds_setting(variable: str, maximum: float) -> float | None:
    """The number of seconds in ``variable`` (None when unset or empty), from MIN_SECONDS
    to ``maximum``; SettingError for anything else (``inf``, ``nan``, ``1_0``, ``-3``)."""
    text = _text(variable)
    return None if text is None else _parsed_seconds(variable, text, maximum)


TORCH_TRUE = frozenset({"1", "y", "yes", "t", "true", "on"})
"""The texts torch's own boolean variables read as true (case aside)."""


def torch_flag(variable: str) -> bool:
    """Whether a boolean variable that torch reads (``TORCH_NCCL_BLOCKING_WAIT``, say) is
    on, by torch's rules (:data:`TORCH_TRUE`, case aside). Never a SettingError: torch
    parses it, hostir only looks (to refuse what the setting would break)."""
    text = _text(variable)
    return text is not None and text.lower() in TORCH_TRUE


def checked_count(value: object, name: str, minimum: int, maximum: int) -> int:
    """``value`` if it is an int (not a bool) in ``[minimum, maximum]``; SettingError
    naming ``name`` otherwise. For options given in code (``streams=``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise SettingError(
            f"{name}: expected {_lowest(minimum)}, got {_shown(value)} (at most {maximum})"
        )
    return value


def checked_seconds(value: object, name: str, maximum: float) -> float:
    """``value`` as a float if it is a number of seconds from MIN_SECONDS to ``maximum``;
    SettingError naming ``name`` otherwise. For ``timeout=`` options."""
    # Comparisons alone: NaN fails them, and math.isfinite(10**400) would overflow.
    wrong_type = isinstance(value, bool) or not isinstance(value, int | float)
    if wrong_type or not MIN_SECONDS <= value <= maximum:
        raise SettingError(f"{name}: expected {_seconds_text(maximum)}, got {_shown(value)}")
    return float(value)


def parse_count(text: str, name: str, minimum: int, maximum: int) -> int:
    """The whole number written in ``text`` (ASCII digits, an optional ``-``) if it lies in
    ``[minimum, maximum]``; SettingError naming ``name`` otherwise. For command-line
    values as well as environment variables."""
    # The length first: int() refuses more than 4300 digits with a ValueError of its own.
    if len(text) > 20 or not _INTEGER.fullmatch(text) or not minimum <= int(text) <= maximum:
        raise SettingError(f"{name}={_shown(text)}: expected {expected_count(minimum, maximum)}")
    return int(text)


# -- The launcher's variables --------------------------------------------------------


@dataclass(frozen=True)
class LauncherWorld:
    """This process's place in a launched job: what torchrun or Open MPI set."""

    rank: int
    world_size: int
    local_rank: int
    source: str  # "torchrun" or "Open MPI": which variables said so


_LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    (
        "Open MPI",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
)


def launcher_world() -> LauncherWorld | None:
    """The rank, world size and local rank a launcher set (torchrun's variables first,
    then Open MPI's), None when neither set any. SettingError, at once and naming the
    variable, for a rank outside ``[0, world size)``, a world size below 1, a variable
    set without its partner, or text that is not a whole number; likewise ``MASTER_PORT``
    when set."""
    for source, rank_var, size_var, local_var, local_size_var in _LAUNCHERS:
        rank_text, size_text = _text(rank_var), _text(size_var)
        if rank_text is None and size_text is None:
            continue
        if rank_text is None or size_text is None:
            missing, given = (rank_var, size_var) if rank_text is None else (size_var, rank_var)
            raise SettingError(
                f"{given} is set but {missing} is not: a launcher sets both ({source}); set"
                f" both, or neither for a world of one process"
            )
        world_size = _parsed_count(size_var, size_text, 1, MAX_WORLD_SIZE)
        rank = _parsed_count(rank_var, rank_text, 0, MAX_WORLD_SIZE)
        if rank >= world_size:
            raise SettingError(
                f"{rank_var}={_shown(rank_text)}: expected a rank in [0, {world_size}) since"
                f" {size_var}={_shown(size_text)}"
            )
        local_rank = _local_rank(local_var, local_size_var, world_size)
        master_port()  # checked here too, before any rank waits for a peer
        return LauncherWorld(rank, world_size, local_rank, source)
    return None


def _local_rank(variable: str, size_variable: str, world_size: int) -> int:
    """The local rank (0 when unset), below the local world size when that is set."""
    local_size = count_setting(size_variable, world_size, 1, world_size)
    text = _text(variable)
    if text is None:
        return 0
    local_rank = _parsed_count(variable, text, 0, MAX_WORLD_SIZE)
    if local_rank >= local_size:
        raise SettingError(
            f"{variable}={_shown(text)}: expected a local rank in [0, {local_size}) (the ranks on"
            f" this machine: {size_variable}, else the world size)"
        )
    return local_rank


def master_port() -> int | None:
    """``MASTER_PORT`` (None when unset): a TCP port in [1, 65535]."""
    text = _text("MASTER_PORT")
    return None if text is None else _parsed_count("MASTER_PORT", text, 1, MAX_PORT)


def rendezvous_host(default: str) -> str:
    """``MASTER_ADDR`` (``default`` when unset or empty) if it resolves to an address;
    SettingError naming the variable and its text otherwise. Looked up on every call (a
    name may start resolving later): call it once, before joining the world. Without it,
    torch's store retried an unresolvable name until the collective timeout, printing
    pages of C++ traces, even in a world of one process."""
    text = _text("MASTER_ADDR")
    host = default if text is None else text
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as error:  # gaierror; idna: a label too long
        reason = getattr(error, "strerror", None) or str(error)
        raise SettingError(
            f"MASTER_ADDR={_shown(host)}: the rendezvous host does not resolve ({reason});"
            " expected the name or address of the machine of rank 0 (127.0.0.1 on this"
            " machine)"
        ) from None
    return host


# -- Parsing, once per variable and text ---------------------------------------------


def _text(variable: str) -> str | None:
    """The variable's text without surrounding blanks; None when unset or empty."""
    text = os.environ.get(variable, "").strip()
    return text or None


@functools.lru_cache(maxsize=256)
def _parsed_count(variable: str, text: str, minimum: int, maximum: int) -> int:
    return parse_count(text, variable, minimum, maximum)


@functools.lru_cache(maxsize=256)
def _parsed_choice(variable: str, text: str, choices: tuple[str, ...]) -> str:
    if text not in choices:
        raise SettingError(f"{variable}={_shown(text)}: expected {' or '.join(choices)}")
    return text


@functools.lru_cache(maxsize=256)
def _parsed_seconds(variable: str, text: str, maximum: float) -> float:
    written = len(text) <= 40 and _DECIMAL.fullmatch(text)
    if not written or not MIN_SECONDS <= float(text) <= maximum:
        raise SettingError(f"{variable}={_shown(text)}: expected {_seconds_text(maximum)}")
    return float(text)


def _lowest(minimum: int) -> str:
    return "a positive integer" if minimum == 1 else f"a whole number >= {minimum}"


def expected_count(minimum: int, maximum: int) -> str:
    """What a whole-number setting in ``[minimum, maximum]`` expects, for messages."""
    return f"{_lowest(minimum)} up to {maximum} (ASCII digits)"


def _seconds_text(maximum: float) -> str:
    return f"a positive number of seconds, from {MIN_SECONDS:g} to {maximum:g}"


def _shown(value: object) -> str:
    """``repr(value)``, cut short: a message stays one readable line."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
