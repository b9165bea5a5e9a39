"""Command-line values of ``hostir``, read strictly: whole numbers in ASCII digits within
a documented range, ``--bind NAME=VALUE`` pairs naming the program's symbols, and the
world a traffic count may allocate for. Each bad value is one line naming the option.
"""

from __future__ import annotations

import argparse

from hostir.check.extent_checks import ExtentChecks
from hostir.errors import SettingError
from hostir.ir.container import HostIrContainer
from hostir.ir.program_info import program_meshes, run_time_symbols
from hostir.ir.scalars import RANK, symbols_of
from hostir.ir.values import TensorValue
from hostir.run.agreements import extent_scalars
from hostir.settings import MAX_WORLD_SIZE, parse_count

MAX_TRAFFIC_WORLD = 4096
"""The most ranks ``traffic`` and ``viz --traffic`` count or draw: the count holds a
rank-by-rank table of links (128 MB of float64 at 4096 ranks)."""

MAX_EXTENT = 1 << 62
"""The largest value ``--bind`` gives a symbolic extent (an int64 torch extent)."""

MAX_INTEGER = 1 << 62
"""The largest whole number an option is read as (its own range is checked after)."""


def integer(text: str) -> int:
    """An argparse ``type`` reading a whole number written in ASCII digits (``int`` would
    take ``²`` or ``1_0``); :func:`in_range` checks its range, naming the option."""
    try:
        return parse_count(text, "value", -MAX_INTEGER, MAX_INTEGER)
    except SettingError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number (ASCII digits), got {text!r}"
        ) from None


def in_range(value: int | None, option: str, minimum: int, maximum: int) -> int | None:
    """``value`` (None stays None) if it lies in ``[minimum, maximum]``; SettingError naming
    ``option`` otherwise."""
    if value is not None and value < minimum:
        raise SettingError(f"{option} must be at least {minimum}, got {value}")
    if value is not None and value > maximum:
        raise SettingError(f"{option} must be at most {maximum}, got {value}")
    return value


def world_size_option(value: int | None) -> int | None:
    """``--world-size``: 1 to hostir.settings.MAX_WORLD_SIZE ranks (None: not given)."""
    return in_range(value, "--world-size", 1, MAX_WORLD_SIZE)


def program_symbols(program: HostIrContainer) -> set[str]:
    """What ``--bind`` may name: the symbolic extents of the program's tensor inputs, its
    scalar inputs that extents read (``s0`` in ``full([s0, 4])``) and its run-time extents
    (``r0``, the rows a RaggedAllToAll receives: docs/run_time_extents.md)."""
    tensors = {
        name
        for value in program.inputs
        if isinstance(value, TensorValue)
        for extent in value.shape
        for name in symbols_of(extent)
    }
    return tensors | {name for _, name in extent_scalars(program)} | run_time_symbols(program)


def parse_bindings(items: list[str], program: HostIrContainer) -> dict[str, int]:
    """``--bind NAME=VALUE`` items as ``{name: value}``; SettingError for an item that is
    not NAME=WHOLE NUMBER, a value out of range, a name that is not a symbolic extent of
    the program (a typo would leave the extent unknown) or one bound to two values; once
    every symbol is bound, ExtentError for values the program cannot run with (``i0 = 3``
    split over 2 devices would count one-row shards)."""
    known = program_symbols(program)
    bindings: dict[str, int] = {}
    for item in items:
        name, equals, text = item.partition("=")
        if not equals or not name.isidentifier():
            raise SettingError(f"--bind {item!r}: expected NAME=VALUE, e.g. i0=128")
        if name not in known:
            symbols = ", ".join(sorted(known)) or "none"
            raise SettingError(
                f"--bind {item!r}: {name} is not a symbolic extent of the program (its"
                f" symbols: {symbols})"
            )
        value = parse_count(text.strip(), f"--bind {name}", 0, MAX_EXTENT)
        if bindings.get(name, value) != value:  # the last one used to win silently
            raise SettingError(f"--bind {name} is given twice: {bindings[name]} and {value}")
        bindings[name] = value
    if known and known <= set(bindings):
        ExtentChecks(program).check({**bindings, RANK: 0}, 0)
    return bindings


def traffic_world(world_size: int | None, program: HostIrContainer) -> int:
    """The world a traffic count runs over: ``world_size``, else the largest device of any
    mesh the program's tensors live on plus one (its inputs' meshes alone may be smaller, and
    a scalar input has none); SettingError above MAX_TRAFFIC_WORLD."""
    world = world_size or max(
        (mesh.max_device() + 1 for mesh in program_meshes(program)), default=1
    )
    if world > MAX_TRAFFIC_WORLD:
        origin = "--world-size" if world_size else "the program's meshes need"
        raise SettingError(
            f"{origin} {world} ranks: traffic counts and draws at most {MAX_TRAFFIC_WORLD}"
            " ranks (a rank-by-rank table of links)"
        )
    return world
