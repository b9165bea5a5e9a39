"""Checking the extents that inputs bind, before anything runs.

A program's extents are expressions over symbols the inputs bind (``i0``), and
every division in them is a split that must divide exactly: ``i0 // 8`` over a
mesh axis of 8 devices, ``i0 // 8 // 2`` for two stream chunks of that. With
``i0 = 8``, ``i0 // 8 // 2`` is 0, and a loop would write chunks of 0 rows and
return its output unwritten. So, once per binding (the values of the symbols
the checks read, and the rank), :class:`ExtentChecks` checks:

- every extent of every tensor (shapes and sharding parts) is a whole number
  >= 0, every division in it divides exactly, and each sharded dim's parts
  make up its extent;
- every ``shard_by_stream`` index, over the iterations of its loops, is in
  range (the source splits into whole chunks and the index picks one of them);
- every allocated buffer that is written (through ``out=``, directly or through
  ``shard_by_stream`` aliases), and every allocated output, is written whole by
  the iterations its loops run: a loop whose symbolic range turns out empty, or
  shorter than the chunks it writes, leaves part of it unwritten.

First, the ops' rules on the bound values (a slice's bounds, a pad's widths, a
variance's count: :mod:`hostir.check.value_rules`). The evaluator runs the checks after
binding the inputs and before the ranks' agreement, so a failure reaches every rank
(hostir.comm.agreement). A failure is an
:class:`~hostir.errors.ExtentError` naming the tensor, the dim, the split, the
values bound and the divisor.

Indices and coverage are computed in closed form where the loops form a box
and the chunk indices have a span (:mod:`hostir.check.index_spans`: an index
affine in the loop indices, or such an index ``//`` or ``%`` a constant), in time
independent of the trip counts. Other loops' iterations are enumerated, one at a
time, up to :data:`MAX_ENUMERATED_ITERATIONS` per binding; past that, the
remaining chunk indices are checked as the loops run (``shard_by_stream``'s
handler) and their coverage is not checked (docs/reliability.md). How many
iterations a call may run at all is :mod:`hostir.check.loop_counts`' rule.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from hostir.check.index_spans import loop_box, span
from hostir.check.value_rules import ValueRules
from hostir.errors import EvaluationError, ExtentError
from hostir.ir.container import HostIrContainer
from hostir.ir.extents import normal_form
from hostir.ir.instructions import Allocate, ForLoop, Instruction, ShardByStream, defined_values
from hostir.ir.scalars import (
    RANK,
    BinaryExpr,
    Const,
    Scalar,
    ScalarOp,
    Symbol,
    add,
    evaluate_scalar,
    mul,
    print_scalar,
    symbols_of,
)
from hostir.ir.values import TensorValue, local_shape, value_symbols

Env = Mapping[str, int | float | bool]

MAX_ENUMERATED_ITERATIONS = 1 << 16
"""How many loop iterations, in all, the checks of one binding enumerate (where no closed
form applies)."""


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


class ExtentChecks:
    """What ``program``'s extents need of the values its inputs bind (collected once);
    :meth:`check` checks one binding (see the module docstring)."""

    def __init__(self, program: HostIrContainer) -> None:
        self.values: list[tuple[TensorValue, Instruction | None, frozenset[str]]] = []
        self.buffers: dict[str, _Buffer] = {}
        self.chunkings: list[_Chunking] = []
        self.origins: dict[str, str] = {}  # symbol -> "input T0 dim 1"
        self._collect(program)
        self.rules = ValueRules(program)  # the ops' rules on bound values, checked first
        reads: set[str] = set(self.rules.reads)
        for _, _, symbols in self.values:
            reads |= symbols
        for chunking in self.chunkings:
            reads |= _free_symbols(chunking.instruction, chunking.loops)
        self.reads = tuple(sorted(reads))
        self._passed: set[tuple] = set()

    # ----- collecting, once per program -----
    def _collect(self, program: HostIrContainer) -> None:
        outputs = {value.name for value in program.outputs}
        aliases: dict[str, ShardByStream] = {}
        seen: set[str] = set()
        for value in program.inputs:
            if isinstance(value, TensorValue):
                self._add_value(value, None, seen)
                for dim, extent in enumerate(value.shape):
                    if isinstance(extent, Symbol):
                        self.origins.setdefault(extent.name, f"input {value.name} dim {dim}")
        for instruction, loops in _walk(program.body):
            for value in defined_values(instruction):
                if isinstance(value, TensorValue):
                    self._add_value(value, instruction, seen)
            if isinstance(instruction, Allocate):
                out = instruction.out
                self.buffers[out.name] = _Buffer(out, loops, out.name in outputs)
            elif isinstance(instruction, ShardByStream):
                aliases[instruction.out.name] = instruction
                self.chunkings.append(_Chunking(instruction, loops))
            if getattr(instruction, "preallocated", False):
                self._add_write(instruction.out.name, loops, aliases)

    def _add_value(self, value: TensorValue, definer: Instruction | None, seen: set[str]) -> None:
        if value.name not in seen:
            seen.add(value.name)
            self.values.append((value, definer, frozenset(value_symbols(value))))

    def _add_write(self, target: str, loops: tuple[ForLoop, ...], aliases: dict) -> None:
        chain: list[ShardByStream] = []
        while target in aliases:
            chain.append(aliases[target])
            target = aliases[target].src.name
        buffer = self.buffers.get(target)
        if buffer is not None:
            buffer.writes.append(_Write(tuple(reversed(chain)), loops))

    # ----- checking, once per binding -----
    def check(self, scalars: Env, rank: int) -> None:
        """Raises ExtentError if the binding in ``scalars`` (on ``rank``) does not fit the
        program; remembers bindings that passed."""
        key = (rank, *(scalars.get(name) for name in self.reads))
        if key in self._passed:
            return
        env = {**scalars, RANK: rank}
        self.rules.check(env, self._bindings)
        budget = _Budget(MAX_ENUMERATED_ITERATIONS)
        for value, definer, symbols in self.values:
            # A rank binds only the symbols of the inputs it holds; the ranks that bound
            # the others check what reads them.
            if symbols <= env.keys():
                self._check_value(value, definer, env)
        try:
            for chunking in self.chunkings:
                self._check_indices(chunking, env, budget)
            for buffer in self.buffers.values():
                if buffer.writes or buffer.is_output:
                    self._check_coverage(buffer, env, budget)
        except _BudgetSpent:
            pass  # the rest is checked as it runs (shard_by_stream's handler), see above
        self._passed.add(key)

    def _bindings(self, exprs: Sequence[Scalar], env: Env) -> str:
        """``i0 = 8 (from input T1 dim 0)`` for the symbols ``exprs`` read."""
        names = sorted(set().union(*(symbols_of(e) for e in exprs)) - {RANK})
        shown = []
        for name in names:
            if name in env:
                origin = self.origins.get(name)
                shown.append(f"{name} = {env[name]}" + (f" (from {origin})" if origin else ""))
        return "; ".join(shown)

    def _check_value(self, value: TensorValue, definer: Instruction | None, env: Env) -> None:
        for dim, extent in enumerate(value.shape):
            total = self._whole(extent, value, dim, definer, env)
            if value.sharding is None:
                continue
            mesh = value.sharding.mesh
            sizes = []
            for part in value.sharding.dims[dim]:
                if part.axis is not None:
                    sizes.append(mesh.axis_size(part.axis))
                else:
                    sizes.append(self._whole(part.extent, value, dim, definer, env))
            if math.prod(sizes) != total:
                raise ExtentError(
                    f"{value.name} dim {dim}: its parts {_parts_text(value, dim)} on mesh"
                    f" {mesh} have sizes {sizes}, which do not make up its extent"
                    f" {print_scalar(extent)} = {total}; {self._bindings([extent], env)}"
                )

    def _whole(
        self, extent: Scalar, value: TensorValue, dim: int, definer: Instruction | None, env: Env
    ) -> int:
        """The value of ``extent``: a whole number >= 0 with every division exact."""
        try:
            result = _exact(extent, env)
        except _Inexact as inexact:
            split = _split_name(inexact.divisor, value, dim, definer)
            need = _multiple_needed(extent)
            raise ExtentError(
                f"{value.name} dim {dim}: extent {print_scalar(extent)} divides"
                f" {print_scalar(inexact.dividend)} = {inexact.value} by {inexact.divisor}"
                f" ({split}), which does not divide exactly"
                f"{need}; {self._bindings([extent], env)}"
            ) from None
        if isinstance(result, bool) or not isinstance(result, int) or result < 0:
            raise ExtentError(
                f"{value.name} dim {dim}: extent {print_scalar(extent)} = {result!r} is not a"
                f" whole number >= 0; {self._bindings([extent], env)}"
            )
        return result

    def _check_indices(self, chunking: _Chunking, env: Env, budget: _Budget) -> None:
        sbs = chunking.instruction
        if not _holds(sbs.src, env) or not _free_symbols(sbs, chunking.loops) <= env.keys():
            return
        count = _chunk_count(sbs, env)
        if count is None:
            return
        if _indices_in_range(sbs, count, chunking.loops, env):
            return
        for bound in _iterations(chunking.loops, env, budget):
            index = evaluate_scalar(sbs.index, bound)
            if not 0 <= index < count:
                raise ExtentError(_index_message(sbs, index, count, bound, chunking.loops))

    def _check_coverage(self, buffer: _Buffer, env: Env, budget: _Budget) -> None:
        value = buffer.value
        if not _holds(value, env) or not buffer.symbols() <= env.keys():
            return
        shape = local_shape(value, env)
        depth = len(buffer.loops)
        for allocated in self._allocations(buffer, env, budget):
            boxes = _closed_boxes(buffer.writes, depth, shape, allocated)
            if boxes is None:  # enumerated; a box written again is kept once
                enumerated = (
                    _box(write.chain, shape, bound)
                    for write in buffer.writes
                    for bound in _iterations(write.loops[depth:], allocated, budget)
                )
                boxes = list(dict.fromkeys(enumerated))
            gap = _first_gap(boxes, shape)
            if gap is not None:
                raise ExtentError(self._coverage_message(buffer, shape, gap, allocated))

    @staticmethod
    def _allocations(buffer: _Buffer, env: Env, budget: _Budget) -> Iterator[dict]:
        """The iterations of the loops around ``buffer``'s ``allocate`` whose coverage to
        check: only the first where no write reads those loops' indices (each then writes
        the same)."""
        allocations = _iterations(buffer.loops, env, budget)
        outer = {loop.index.name for loop in buffer.loops}
        depth = len(buffer.loops)
        if any(write.symbols(depth) & outer for write in buffer.writes):
            return allocations
        return itertools.islice(allocations, 1)

    def _coverage_message(self, buffer: _Buffer, shape: list[int], gap: tuple, env: Env) -> str:
        value = buffer.value
        what = "output" if buffer.is_output else "buffer"
        region = ", ".join(f"{lo}:{hi}" for lo, hi in gap)
        loops = {loop.index.name: loop for write in buffer.writes for loop in write.loops}
        ranges = []
        exprs: list[Scalar] = []
        for loop in loops.values():
            try:
                start, stop = evaluate_scalar(loop.start, env), evaluate_scalar(loop.stop, env)
            except EvaluationError:
                continue  # an inner loop whose range reads an outer index
            trips = max(0, stop - start)
            ranges.append(
                f"loop {loop.index.name} in range({print_scalar(loop.start)},"
                f" {print_scalar(loop.stop)}) runs {trips} iteration{'s' * (trips != 1)}"
            )
            exprs += [loop.start, loop.stop]
        for write in buffer.writes:
            exprs += [sbs.out.shape[sbs.axis] for sbs in write.chain]
        why = "; ".join(ranges) or "no write into it runs"
        return (
            f"{what} {value.name} (local shape {shape}) would not be written whole: its"
            f" elements [{region}] are never written ({why});"
            f" {self._bindings(exprs, env) or 'no symbols'}"
        )


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


class _Inexact(Exception):
    """A division in an extent that does not divide exactly."""

    def __init__(self, dividend: Scalar, value: int, divisor: int) -> None:
        super().__init__()
        self.dividend, self.value, self.divisor = dividend, value, divisor


def _exact(expr: Scalar, env: Env) -> int | float | bool:
    """``expr``'s value, raising _Inexact at a ``//`` that leaves a remainder (a division
    may sit anywhere in the expression: every one is checked)."""
    if not isinstance(expr, BinaryExpr):
        return evaluate_scalar(expr, env)
    lhs, rhs = _exact(expr.lhs, env), _exact(expr.rhs, env)
    if expr.op is ScalarOp.FLOORDIV and (rhs == 0 or lhs % rhs != 0):
        raise _Inexact(expr.lhs, lhs, rhs)
    return evaluate_scalar(BinaryExpr(op=expr.op, lhs=Const(value=lhs), rhs=Const(value=rhs)), env)


def _split_name(divisor: int, value: TensorValue, dim: int, definer: Instruction | None) -> str:
    """What a division by ``divisor`` in ``value``'s dim ``dim`` is: a mesh split or stream
    chunks (as far as the program says)."""
    if value.sharding is not None:
        mesh = value.sharding.mesh
        axes = value.sharding.mesh_axes_of(dim)
        sizes = [mesh.axis_size(a) for a in axes]
        if axes and divisor == math.prod(sizes):
            names = ", ".join(a.value for a in axes)
            return f"split over mesh axis {names} of mesh {mesh}, {divisor} devices"
    if isinstance(definer, ShardByStream) and definer.axis == dim:
        return f"{divisor} stream chunks: shard_by_stream of {definer.src.name} along axis {dim}"
    return f"a split into {divisor}"


def _multiple_needed(extent: Scalar) -> str:
    """`` (i0 must be a multiple of 16)`` when ``extent`` is one symbol over a constant."""
    coefficient, atoms = normal_form(extent)
    if len(atoms) == 1 and isinstance(atoms[0], Symbol) and coefficient.numerator == 1:
        return f" ({atoms[0].name} must be a multiple of {Fraction(1) / coefficient})"
    return ""


def _parts_text(value: TensorValue, dim: int) -> str:
    parts = value.sharding.dims[dim]
    shown = (p.axis.value if p.axis is not None else print_scalar(p.extent) for p in parts)
    return "[" + ", ".join(shown) + "]"


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


def _walk(body: Sequence[Instruction]) -> Iterator[tuple[Instruction, tuple[ForLoop, ...]]]:
    """Every instruction with the loops around it (outer first), in program order."""
    stack: list[tuple[Iterator[Instruction], tuple[ForLoop, ...]]] = [(iter(body), ())]
    while stack:
        instructions, loops = stack[-1]
        instruction = next(instructions, None)
        if instruction is None:
            stack.pop()
            continue
        yield instruction, loops
        if isinstance(instruction, ForLoop):
            stack.append((iter(instruction.body), (*loops, instruction)))
