"""Where stream chunks land, for one binding: a ``shard_by_stream``'s indices in range, and
the writes into an allocated buffer covering it whole.

:class:`~hostir.check.extent_checks.ExtentChecks` collects the chunkings (:class:`_Chunking`)
and the writes into each buffer (:class:`_Buffer`, :class:`_Write`) once per program and
checks them with these functions once per binding. The indices a chunking takes and the
region a write covers are computed in closed form where the loops form a box and the
chunk indices have a span (:mod:`hostir.check.index_spans`); otherwise the loops'
iterations are enumerated one at a time, each taking one from a :class:`_Budget`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from hostir.check.index_spans import loop_box, span
from hostir.errors import ExtentError
from hostir.ir.instructions import ForLoop, ShardByStream
from hostir.ir.scalars import (
    RANK,
    Const,
    Scalar,
    add,
    evaluate_scalar,
    mul,
    print_scalar,
    symbols_of,
)
from hostir.ir.values import TensorValue, local_shape, value_symbols

Env = Mapping[str, int | float | bool]


@dataclass(frozen=True)
class _Write:
    """A write into an allocated buffer: the chain of ``shard_by_stream`` aliases from the
    buffer to the written value (outermost first) and the loops around the write."""

    chain: tuple[ShardByStream, ...]
    loops: tuple[ForLoop, ...]

    def symbols(self, depth: int = 0) -> set[str]:
        """The symbols the region it writes reads (chunk indices and sizes, loop bounds),
        besides the indices of its loops from ``depth`` in, and the rank."""
        inner = self.loops[depth:]
        names = _free_symbols(None, inner)
        for sbs in self.chain:
            names |= _free_symbols(sbs, inner)
        return names


@dataclass
class _Buffer:
    """An allocated tensor, the loops around its ``allocate`` and the writes into it."""

    value: TensorValue
    loops: tuple[ForLoop, ...]
    is_output: bool
    writes: list[_Write] = field(default_factory=list)

    def symbols(self) -> set[str]:
        """The symbols its coverage reads, besides the indices of the loops around it."""
        names = value_symbols(self.value)
        for write in self.writes:
            names |= write.symbols()
        return names


@dataclass(frozen=True)
class _Chunking:
    """A ``shard_by_stream`` and the loops around it."""

    instruction: ShardByStream
    loops: tuple[ForLoop, ...]


class _Budget:
    """How many more loop iterations the checks may enumerate."""

    def __init__(self, left: int) -> None:
        self.left = left

    def take(self) -> None:
        """Counts one iteration; raises _BudgetSpent past the budget."""
        self.left -= 1
        if self.left < 0:
            raise _BudgetSpent


class _BudgetSpent(Exception):
    """The checks enumerated MAX_ENUMERATED_ITERATIONS loop iterations."""


def _free_symbols(sbs: ShardByStream | None, loops: Sequence[ForLoop]) -> set[str]:
    """The symbols a chunk index and its loops' ranges read, besides the loop indices and
    the rank."""
    names = set()
    if sbs is not None:
        names |= symbols_of(sbs.index) | value_symbols(sbs.src) | value_symbols(sbs.out)
    for loop in loops:
        names |= symbols_of(loop.start) | symbols_of(loop.stop)
    return names - {loop.index.name for loop in loops} - {RANK}


def _holds(value: TensorValue, env: Env) -> bool:
    """Whether this rank (``env[RANK]``) holds a shard of ``value``."""
    return value.sharding is None or value.sharding.mesh.contains(int(env[RANK]))


def _chunk_count(sbs: ShardByStream, env: Env) -> int | None:
    """How many chunks of ``sbs.out``'s size ``sbs.src`` holds along the axis (None: the
    source is empty there, and any index picks an empty chunk)."""
    whole = local_shape(sbs.src, env)[sbs.axis]
    chunk = local_shape(sbs.out, env)[sbs.axis]
    if whole == 0:
        return None  # empty chunks of an empty tensor: every index reads nothing
    if chunk == 0 or whole % chunk != 0:
        raise ExtentError(
            f"shard_by_stream defining {sbs.out.name}: {sbs.src.name}'s local extent {whole}"
            f" along axis {sbs.axis} is not a whole number of chunks of {chunk}"
        )
    return whole // chunk


def _indices_in_range(sbs: ShardByStream, count: int, loops: Sequence[ForLoop], env: Env) -> bool:
    """Whether every index ``sbs`` takes over ``loops`` is below ``count`` and not negative,
    in closed form (index_spans); raises ExtentError at an iteration whose index is out of
    range; False where the closed form cannot tell (the caller enumerates)."""
    box = loop_box(loops, env)
    if box is None:
        return False
    if not all(box.values()):
        return True  # no iteration runs
    found = span(sbs.index, box, env)
    if found is None:
        return False
    for index, at in ((found.lo, found.lo_at), (found.hi, found.hi_at)):
        if not 0 <= index < count and at is not None:
            raise ExtentError(_index_message(sbs, index, count, {**env, **at}, loops))
    return 0 <= found.lo and found.hi < count


def _index_message(
    sbs: ShardByStream, index: object, count: int, env: Env, loops: Sequence[ForLoop]
) -> str:
    at = ", ".join(f"{loop.index.name} = {env[loop.index.name]}" for loop in loops)
    return (
        f"shard_by_stream defining {sbs.out.name}: index {print_scalar(sbs.index)} = {index}"
        f"{' at ' + at if at else ''} is out of range: {sbs.src.name} has {count} chunks along"
        f" axis {sbs.axis} (indices 0 to {count - 1}) on rank {env[RANK]}"
    )


def _iterations(loops: Sequence[ForLoop], env: Env, budget: _Budget) -> Iterator[Env]:
    """``env`` with the indices of ``loops`` (outer first) bound, for every iteration they
    run, one at a time; every iteration of every loop takes one from the budget (an outer
    loop whose inner loops are empty too), so this stops once the budget is spent
    (_BudgetSpent)."""
    if not loops:
        yield env
        return
    loop, inner = loops[0], loops[1:]
    start = int(evaluate_scalar(loop.start, env))
    stop = int(evaluate_scalar(loop.stop, env))
    for index in range(start, stop):
        budget.take()
        yield from _iterations(inner, {**env, loop.index.name: index}, budget)


def _box(chain: Sequence[ShardByStream], shape: list[int], env: Env) -> tuple:
    """The region of the buffer (``shape``) that a write through ``chain`` covers."""
    box = [(0, n) for n in shape]
    for sbs in chain:
        size = local_shape(sbs.out, env)[sbs.axis]
        lo = box[sbs.axis][0] + int(evaluate_scalar(sbs.index, env)) * size
        box[sbs.axis] = (lo, lo + size)
    return tuple(box)


def _closed_boxes(
    writes: Sequence[_Write], depth: int, shape: list[int], env: Env
) -> list[tuple] | None:
    """The region each write covers over all the iterations of its loops below ``depth``,
    one box per write, in closed form (index_spans); None where a write's regions are not
    one box that way (the caller enumerates)."""
    boxes = []
    for write in writes:
        box = loop_box(write.loops[depth:], env)
        if box is None:
            return None
        if not all(box.values()):
            continue  # the write never runs
        region = _closed_region(write.chain, shape, box, env)
        if region is None:
            return None
        boxes.append(region)
    return boxes


def _closed_region(
    chain: Sequence[ShardByStream], shape: list[int], box: Mapping[str, range], env: Env
) -> tuple | None:
    """The region of the buffer (``shape``) a write through ``chain`` covers over
    ``box``: along each axis the chain chunks, the chunks its offset (in chunks of the
    innermost size) spans, if it spans a whole run of them; the axes must read distinct
    loop indices, so that their runs combine into one box. None otherwise."""
    levels: dict[int, list[tuple[Scalar, int]]] = {}
    for sbs in chain:
        if value_symbols(sbs.out) & box.keys():
            return None  # a chunk size that changes from one iteration to the next
        levels.setdefault(sbs.axis, []).append((sbs.index, local_shape(sbs.out, env)[sbs.axis]))
    region = [(0, n) for n in shape]
    moved: set[str] = set()
    for axis, chunks in levels.items():
        size = chunks[-1][1]
        if size == 0 or any(outer % size for _, outer in chunks):
            return None
        offset: Scalar = Const(value=0)
        for index, outer in chunks:
            offset = add(offset, mul(index, outer // size))
        reads = symbols_of(offset) & box.keys()
        found = span(offset, box, env)
        if reads & moved or found is None or not found.whole:
            return None
        moved |= reads
        region[axis] = (found.lo * size, (found.hi + 1) * size)
    return tuple(region)


MAX_GRID_CELLS = 1 << 16
"""Above this many cells, coverage is judged by volume (distinct writes assumed disjoint)."""


def _first_gap(boxes: list[tuple], shape: list[int]) -> tuple | None:
    """A region of ``shape`` that no box covers (None if they cover it all)."""
    full = tuple((0, n) for n in shape)
    if any(n == 0 for n in shape) or full in boxes:
        return None
    if not boxes:
        return full
    cuts = []
    for dim, n in enumerate(shape):
        ends = {0, n, *(box[dim][0] for box in boxes), *(box[dim][1] for box in boxes)}
        cuts.append(sorted(c for c in ends if 0 <= c <= n))
    cells = math.prod(len(c) - 1 for c in cuts)
    if cells > MAX_GRID_CELLS:
        volume = sum(math.prod(hi - lo for lo, hi in box) for box in set(boxes))
        return None if volume >= math.prod(shape) else full
    for cell in itertools.product(*(zip(c, c[1:], strict=False) for c in cuts)):
        if not any(_inside(cell, box) for box in boxes):
            return cell
    return None


def _inside(cell: tuple, box: tuple) -> bool:
    return all(blo <= lo and hi <= bhi for (lo, hi), (blo, bhi) in zip(cell, box, strict=True))
