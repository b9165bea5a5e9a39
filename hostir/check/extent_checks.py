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

Indices and coverage (:mod:`hostir.check.chunk_coverage`) are computed in closed
form where the loops form a box and the chunk indices have a span
(:mod:`hostir.check.index_spans`: an index affine in the loop indices, or such an
index ``//`` or ``%`` a constant), in time independent of the trip counts. Other
loops' iterations are enumerated, one at a time, up to
:data:`MAX_ENUMERATED_ITERATIONS` per binding; past that, the remaining chunk
indices are checked as the loops run (``shard_by_stream``'s handler) and their
coverage is not checked (docs/reliability.md). How many iterations a call may run at
all is :mod:`hostir.check.loop_counts`' rule.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from fractions import Fraction

from hostir.check.chunk_coverage import (
    Env,
    _box,
    _Budget,
    _BudgetSpent,
    _Buffer,
    _chunk_count,
    _Chunking,
    _closed_boxes,
    _first_gap,
    _free_symbols,
    _holds,
    _index_message,
    _indices_in_range,
    _iterations,
    _Write,
)
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
    evaluate_scalar,
    print_scalar,
    symbols_of,
)
from hostir.ir.values import TensorValue, local_shape, value_symbols

MAX_ENUMERATED_ITERATIONS = 1 << 16
"""How many loop iterations, in all, the checks of one binding enumerate (where no closed
form applies)."""


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
