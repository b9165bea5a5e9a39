"""The race checker: a listener that fails a run whose buffer accesses a GPU could reorder.

``HostIrEvaluator(program, listeners=[RaceChecker()])`` raises
:class:`~hostir.errors.RaceError` at the first access to a buffer that is not
ordered after an earlier conflicting access (same bytes, at least one a write).
On CPU the evaluator runs everything in program order, so the checker models
what a GPU would do; on CUDA it checks the real schedule's constraints.

The model:

- **Streams** are ``"main"`` (where the run starts) and the pool's stream
  indices. Each has a *vector clock* (stream -> count). An instruction that
  touches memory ticks its stream's own component and stamps its accesses with
  that tick. A stream never seen before starts with an empty clock: a fresh
  pool stream is *not* ordered after ``main`` until it synchronizes with it.
- ``synchronize(s)`` on the current stream C sets C's clock to the elementwise
  maximum of C's and s's clocks. ``set_current_stream`` only changes which
  stream the following accesses belong to.
- An access by stream S is ordered after an access stamped (T, k) iff S is T
  or S's clock has ``clock[T] >= k``.
- **Accesses.** An instruction reads its tensor operands (``INS``) and writes
  the tensors it defines and its preallocated ``out`` (in place through torch's
  ``out=``, or as a copy of its result: an ``out`` sharing memory with an operand
  always gets the copy, ``hostir.run.implementations.write_call``, so an
  instruction's own read and write of one buffer never interleave, and one
  stamp orders them). An instruction whose
  every defined tensor is a view of one of its operands (``shard_by_stream``,
  ``permute`` without ``out=``, ...) touches no memory. ``allocate`` writes its
  buffer. The inputs count as written by ``main`` before the first instruction
  (the caller produced them there); :meth:`RaceChecker.finish` reads the
  outputs on ``main`` after the run (the caller consumes them there).
  ``deallocate T`` frees T's buffer, which conflicts like a write, unless
  another bound tensor still aliases it (then no memory is released). Tensors
  a rank does not hold (None) are skipped.
- **Communications** (instructions defining a ``request``) read ``src`` and
  write ``out`` on a virtual stream of their own, whose clock starts as a copy
  of the posting stream's; ``wait(request)`` on C joins that clock into C. So
  reading a collective's ``out``, or writing or freeing its ``src``, before
  the ``wait`` is a race.
- **Buffers** are identified by their storage and the bytes a tensor spans, so
  aliases conflict exactly when their elements overlap (strided views of a
  common layout are compared element-exactly, anything else by byte span).

Each storage keeps only the accesses that may still conflict with a later one:
an access ordered after an earlier one and covering its bytes replaces it (a
write replaces anything, a read replaces reads), so a storage holds about one
write and the reads since it per region, and a program's length does not make
the checker slower per instruction. A storage's records are dropped when torch
frees it. The checker resets itself at the start of each run; one checker
checks one run at a time.

The clocks, byte regions and access records live in :mod:`hostir.run.race_records`;
this module holds the :class:`RaceChecker` listener that applies the model.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from hostir.errors import RaceError
from hostir.ir.communications import Wait
from hostir.ir.instructions import (
    Deallocate,
    ForLoop,
    Instruction,
    defined_values,
)
from hostir.ir.streams import GetCurrentStream, SetCurrentStream, Synchronize
from hostir.ir.values import TensorValue
from hostir.run.context import Listener, RunContext
from hostir.run.race_records import (
    Clock,
    _Access,
    _Buffer,
    _contains,
    _message,
    _overlap,
    _Posted,
    _region,
    _Stamp,
)
from hostir.run.stream_pool import MAIN
from hostir.settings import flag_setting

ENVIRONMENT_VARIABLE = "HOSTIR_CHECK_RACES"
"""Set to ``1`` to check every run for races (hostir.run.self_checks)."""


def race_checking_enabled() -> bool:
    """Whether ``HOSTIR_CHECK_RACES=1`` asks for a race checker on every run (``0`` or
    unset: no; SettingError for any other value)."""
    return flag_setting(ENVIRONMENT_VARIABLE)


_NO_ACCESS = (Deallocate, ForLoop, GetCurrentStream, SetCurrentStream)
"""Instructions whose ``after`` touches no memory (deallocate is checked in ``before``)."""


def stream_name(stream: Any) -> str:
    """How messages name a stream id: ``main``, ``stream(2)``."""
    if stream == MAIN:
        return "main"
    if isinstance(stream, int):
        return f"stream({stream})"
    return str(stream)


class RaceChecker(Listener):
    """Raises :class:`RaceError` at the first access to a buffer that no ``synchronize``
    or ``wait`` orders after an earlier conflicting access (see the module docstring).

    ``HostIrEvaluator(program, listeners=[RaceChecker()]).run(inputs)``; the message
    names the tensor(s), both instructions and both streams.
    """

    def __init__(self) -> None:
        self._run: weakref.ref | None = None
        self._reset()

    def _reset(self) -> None:
        self._clocks: dict[Any, Clock] = {MAIN: {}}
        self._buffers: dict[tuple[torch.device, int], _Buffer] = {}
        self._bound: dict[str, _Buffer] = {}
        self._posted: dict[tuple, _Posted] = {}
        self._loops: list[str] = []
        self._serial = 0

    # -- Listener -----------------------------------------------------------------

    def before(self, instruction: Instruction, context: RunContext, operands: dict) -> None:
        """Starts a run's bookkeeping; checks a deallocation (the handler unbinds it)."""
        self._begin(context)
        if isinstance(instruction, Deallocate):
            self._free(instruction, context)
        elif isinstance(instruction, ForLoop):
            self._loops.append(instruction.index.name)

    def after(self, instruction: Instruction, context: RunContext, operands: dict) -> None:
        """Applies the instruction's ordering edges or checks and records its accesses."""
        self._begin(context)
        if isinstance(instruction, Synchronize):
            self._join(self._clock(context.current_stream), self._clocks.get(operands["stream"]))
        elif isinstance(instruction, Wait):
            self._wait(self._request_key(instruction.request.name, context), context.current_stream)
        elif isinstance(instruction, ForLoop):
            if self._loops:
                self._loops.pop()
        elif not isinstance(instruction, _NO_ACCESS):
            self._accesses(instruction, context, operands)

    def finish(self, context: RunContext) -> None:
        """At the end of a run: the caller reads the outputs on ``main``, so every
        output must be ordered after the streams and communications that wrote it.
        (The evaluator calls this once the body has run, where it supports it.)"""
        self._begin(context)
        stamp = self._tick(MAIN, context)
        for value in context.program.outputs:
            tensor = context.tensors.get(value.name)
            if isinstance(tensor, torch.Tensor):
                access = (value.name, tensor, False, "read")
                self._record(stamp, access, f"the caller (output {value.name})")

    # -- Runs, clocks and buffers ----------------------------------------------------

    def _begin(self, context: RunContext) -> None:
        """Resets at a new run; the inputs count as written by ``main``."""
        if self._run is not None and self._run() is context:
            return
        self._reset()
        self._run = weakref.ref(context)
        clock = self._clocks[MAIN]
        clock[MAIN] = 1
        for name, value in context.tensors.items():
            if isinstance(value, torch.Tensor):
                self._bind(name, value)
                self._record(
                    _Stamp(MAIN, "main", 1, clock, (), context.rank),
                    (name, value, True, "written"),
                    f"input {name}",
                )

    def _clock(self, stream: Any) -> Clock:
        return self._clocks.setdefault(stream, {})

    @staticmethod
    def _join(clock: Clock, other: Clock | None) -> None:
        for stream, tick in (other or {}).items():
            if clock.get(stream, 0) < tick:
                clock[stream] = tick

    def _tick(self, stream: Any, context: RunContext) -> _Stamp:
        clock = self._clock(stream)
        tick = clock[stream] = clock.get(stream, 0) + 1
        return _Stamp(
            stream, stream_name(stream), tick, clock, self._loop_values(context), context.rank
        )

    def _request_key(self, name: str, context: RunContext) -> tuple:
        """A request of one iteration: a pipelined loop waits for iteration ``j``'s while
        iteration ``j + 1``'s, of the same name, is in flight (hostir.run.pipelined_loops)."""
        return (name, self._loop_values(context))

    def _loop_values(self, context: RunContext) -> tuple[tuple[str, Any], ...]:
        return tuple((name, context.scalars.get(name)) for name in self._loops)

    def _locate(self, tensor: torch.Tensor) -> _Buffer | None:
        """The record of ``tensor``'s storage (None for empty or storage-less tensors)."""
        if tensor.numel() == 0:
            return None
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return None  # tensor subclasses without a plain storage: nothing to track
        key = (tensor.device, storage.data_ptr())
        buffer = self._buffers.get(key)
        if buffer is not None and buffer.ref() is storage:
            return buffer
        buffers = self._buffers

        def forget(ref: weakref.ref, key: tuple = key) -> None:
            # The storage was freed: its address may be reused by a new buffer.
            known = buffers.get(key)
            if known is not None and known.ref is ref:
                del buffers[key]

        buffer = self._buffers[key] = _Buffer(weakref.ref(storage, forget))
        return buffer

    def _bind(self, name: str, tensor: torch.Tensor) -> _Buffer | None:
        """Notes that ``name`` is now bound to a view of ``tensor``'s storage."""
        old = self._bound.pop(name, None)
        if old is not None:
            old.names.discard(name)
        buffer = self._locate(tensor)
        if buffer is not None:
            buffer.names.add(name)
            self._bound[name] = buffer
        return buffer

    # -- Accesses --------------------------------------------------------------------

    def _accesses(self, instruction: Instruction, context: RunContext, operands: dict) -> None:
        reads = [
            (getattr(instruction, name).name, operands[name], False, "read")
            for name in instruction.INS
            if isinstance(operands.get(name), torch.Tensor)
        ]
        writes = []
        if getattr(instruction, "preallocated", False):
            if isinstance(operands.get("out"), torch.Tensor):
                writes.append((instruction.out.name, operands["out"], True, "written"))
        else:
            read_buffers = {id(self._locate(tensor)) for _, tensor, _, _ in reads}
            views = True
            for value in defined_values(instruction):
                tensor = context.tensors.get(value.name)
                if isinstance(value, TensorValue) and isinstance(tensor, torch.Tensor):
                    views &= id(self._bind(value.name, tensor)) in read_buffers
                    writes.append((value.name, tensor, True, "written"))
            if writes and views:
                return  # a view of an operand: no memory is touched
        request = getattr(instruction, "request", None)
        if request is None:
            stamp = self._tick(context.current_stream, context)
            for access in writes + reads:
                self._record(stamp, access, instruction)
            return
        self._serial += 1
        stream = ("request", self._serial)
        clock = dict(self._clock(context.current_stream))
        clock[stream] = 1
        posted = self._posted[self._request_key(request.name, context)] = _Posted(stream, clock)
        stamp = _Stamp(
            stream, f"request {request.name}", 1, clock, self._loop_values(context), context.rank
        )
        for access in writes + reads:
            record = self._record(stamp, access, instruction)
            if record is not None:
                posted.accesses.append(record)

    def _record(
        self, stamp: _Stamp, access: tuple, instruction: Instruction | str
    ) -> _Access | None:
        """Checks one access against the storage's records, then records it."""
        name, tensor, write, verb = access
        buffer = self._locate(tensor)
        if buffer is None:
            return None
        new = _Access(
            stamp.stream,
            stamp.tick,
            write,
            _region(tensor),
            name,
            verb,
            instruction,
            stamp.loops,
            stamp.label,
        )
        clock, stream = stamp.clock, stamp.stream
        for old in buffer.accesses:
            if (
                (old.write or write)
                and old.stream != stream
                and clock.get(old.stream, 0) < old.tick
                and _overlap(old.region, new.region)
            ):
                raise RaceError(_message(old, new, stamp.rank))
        buffer.accesses = [
            old
            for old in buffer.accesses
            if not (
                (write or not old.write)
                and (old.stream == stream or clock.get(old.stream, 0) >= old.tick)
                and _contains(new.region, old.region)
            )
        ]
        buffer.accesses.append(new)
        return new

    def _free(self, instruction: Deallocate, context: RunContext) -> None:
        """``deallocate T``: a write of T's bytes if it releases the storage."""
        name = instruction.tensor.name
        tensor = context.tensors.get(name)
        buffer = self._bind(name, tensor) if isinstance(tensor, torch.Tensor) else None
        if buffer is None:
            self._bound.pop(name, None)
            return
        storage = buffer.ref()
        buffer.names = {
            other
            for other in buffer.names
            if isinstance(context.tensors.get(other), torch.Tensor)
            and context.tensors[other].untyped_storage() is storage
        }
        buffer.names.discard(name)
        del self._bound[name]
        if buffer.names:
            return  # another tensor still views the storage: nothing is released
        stamp = self._tick(context.current_stream, context)
        self._record(stamp, (name, tensor, True, "freed"), instruction)

    def _wait(self, request: tuple, stream: Any) -> None:
        """``wait``: the current stream joins the communication's clock. The
        communication's accesses are restamped as the current stream's at this tick,
        so clocks never carry a component per communication. A request is waited once
        (the verifier's rule), so its record goes: a loop's posted records do not pile up
        with its iterations."""
        posted = self._posted.pop(request, None)
        if posted is None:
            return
        clock = self._clock(stream)
        del posted.clock[posted.stream]
        self._join(clock, posted.clock)
        tick = clock[stream] = clock.get(stream, 0) + 1
        for access in posted.accesses:
            access.stream, access.tick = stream, tick
