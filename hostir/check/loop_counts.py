"""How many loop iterations one call runs, counted before anything runs.

A loop's bounds are expressions, so host IR text may ask for ``range(0, 10**12)``
(or a bound an input makes huge): a run that cannot finish, and the iterations
nothing can enumerate. One call of a program runs at most
:data:`MAX_LOOP_ITERATIONS` loop iterations, all its loops together: an inner
loop's iterations count once for each iteration of the loops around it. When
the inputs bind their symbols, :class:`LoopCounts` counts them and refuses a
binding past the limit with a :class:`~hostir.errors.LoopBoundError` naming the
loop, its range, its trip count and the limit, before anything runs (the
evaluator checks it with the extents, before the ranks' agreement, so every rank
hears of it).

Counting does not enumerate what it can multiply: a loop whose inner loops'
bounds do not read its index counts ``trips * (1 + inner)``. Only a loop whose
inner bounds read its index is walked index by index, and every step of that
walk is an iteration counted, so the count stops, at the latest, once it passes
the limit: the work is bounded by the limit, never by the trip count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hostir.errors import EvaluationError, LoopBoundError
from hostir.ir.container import HostIrContainer
from hostir.ir.instructions import ForLoop, Instruction
from hostir.ir.scalars import RANK, evaluate_scalar, print_scalar, symbols_of

Env = Mapping[str, int | float | bool]

MAX_LOOP_ITERATIONS = 1 << 20
"""How many loop iterations one call runs at most, all loops together (1,048,576: a
program lowered from a fusion runs a few per stream axis; an interpreted iteration costs
microseconds, so this many is seconds of host time)."""


_MAX_KEPT = 64
"""How many bindings that passed a LoopCounts remembers."""


@dataclass(frozen=True)
class _Loop:
    """A loop of the program, where it is and the loops directly inside it."""

    loop: ForLoop
    path: str
    inner: tuple[_Loop, ...]
    walked: bool  # whether an inner loop's bounds read this loop's index

    def reads(self) -> set[str]:
        """The symbols the bounds of this loop and of the loops inside it read."""
        names = symbols_of(self.loop.start) | symbols_of(self.loop.stop)
        for inner in self.inner:
            names |= inner.reads()
        return names - {self.loop.index.name}


def _program_loops(body: Sequence[Instruction], path: str = "body") -> tuple[_Loop, ...]:
    """The loops of ``body`` (those of loop bodies inside them), as a tree."""
    found = []
    for index, instruction in enumerate(body):
        if isinstance(instruction, ForLoop):
            where = f"{path}[{index}]"
            inner = _program_loops(instruction.body, f"{where}.body")
            name = instruction.index.name
            walked = any(name in loop.reads() for loop in inner)
            found.append(_Loop(instruction, where, inner, walked))
    return tuple(found)


class LoopCounts:
    """The loops of ``program`` (collected once); :meth:`check` counts the iterations one
    call runs with a binding (see the module docstring)."""

    def __init__(self, program: HostIrContainer) -> None:
        self.loops = _program_loops(program.body)
        reads: set[str] = set()
        for loop in self.loops:
            reads |= loop.reads()
        self.reads = tuple(sorted(reads))
        self._passed: set[tuple] = set()

    def check(self, scalars: Env, rank: int) -> None:
        """Raises LoopBoundError if one call with the binding ``scalars`` (on ``rank``)
        would run more than MAX_LOOP_ITERATIONS loop iterations; remembers bindings that
        passed."""
        key = (rank, *(scalars.get(name) for name in self.reads))
        if key in self._passed:
            return
        env = {**scalars, RANK: rank}
        counted = 0
        for loop in self.loops:
            counted += _count(loop, env, MAX_LOOP_ITERATIONS - counted, counted)
        if len(self._passed) < _MAX_KEPT:  # a bound that changes every call is counted each
            self._passed.add(key)


def _bounds(loop: ForLoop, env: Env) -> tuple[int, int] | None:
    """``loop``'s bounds in ``env``; None where they read a symbol this rank did not bind
    (the ranks that bound it count the loop)."""
    try:
        return int(evaluate_scalar(loop.start, env)), int(evaluate_scalar(loop.stop, env))
    except EvaluationError:
        return None


def _count(node: _Loop, env: Env, left: int, before: int, times: int = 1) -> int:
    """The iterations ``node`` and the loops inside it run in ``env`` (``times`` times, for
    the loops around it that were multiplied, not walked); raises LoopBoundError as soon
    as they are more than ``left``, the iterations left to a call after the ``before``
    already counted."""
    bounds = _bounds(node.loop, env)
    if bounds is None:
        return 0
    start, stop = bounds
    trips = max(0, stop - start)
    if trips > left:
        raise LoopBoundError(_message(node, start, stop, before + times * trips, times, env))
    total = trips
    if not node.inner or not trips:
        return total
    if not node.walked:  # every iteration runs the same inner loops: multiply
        share = (left - trips) // trips
        for inner in node.inner:
            total += trips * _count(inner, env, share, before + times * total, times * trips)
            share = (left - total) // trips
        return total
    for index in range(start, stop):  # at most trips <= left steps: bounded by the limit
        bound = {**env, node.loop.index.name: index}
        for inner in node.inner:
            total += _count(inner, bound, left - total, before + times * total, times)
    return total


def _message(node: _Loop, start: int, stop: int, reached: int, times: int, env: Env) -> str:
    loop = node.loop
    trips = max(0, stop - start)
    bound = _bindings([loop.start, loop.stop], env)
    plural = "s" * (trips != 1)
    return (
        f"loop {loop.index.name} in range({print_scalar(loop.start)},"
        f" {print_scalar(loop.stop)}) at {node.path} would run {trips} iteration{plural}"
        + (f" ({bound})" if bound else "")
        + (f" for each of {times} iterations of the loops around it" if times > 1 else "")
        + f": one call runs at most {MAX_LOOP_ITERATIONS} loop iterations, all loops together"
        f" (MAX_LOOP_ITERATIONS); this one would reach at least {reached}"
    )


def _bindings(exprs: list, env: Env) -> str:
    """``i0 = 8`` for the symbols ``exprs`` read (the rank left out)."""
    names = sorted(set().union(*(symbols_of(e) for e in exprs)) - {RANK})
    return ", ".join(f"{name} = {env[name]}" for name in names if name in env)
