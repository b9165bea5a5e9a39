"""Binding a run's inputs, and what a binding gives, kept per input signature.

Binding a run's inputs checks every tensor against its declared type and sharding,
binds the symbolic extents, and checks the extents and loop trip counts
(``hostir.check.extent_checks``, ``hostir.check.loop_counts``): the same work, with the
same outcome, for every run whose inputs have the same exact signature
(``hostir.run.signature.call_key``) on the same rank of the same world. A
:class:`Binding` keeps what a successful binding gave; the executable prepared for the
signature (``hostir.run.executable``) applies it to every later run of the signature. A
binding that fails is never kept: its run raises, and the next one checks again.

:class:`RecentlyUsed` bounds what the runtime and the frontend keep per signature.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import torch

from hostir.check.extent_checks import ExtentChecks
from hostir.check.loop_counts import LoopCounts
from hostir.errors import HostIrError, InputError
from hostir.ir.container import HostIrContainer, ScalarInput
from hostir.ir.dtypes import INT_RANGES, DType
from hostir.ir.values import TensorValue
from hostir.run.context import RunContext
from hostir.run.inputs import bind_input_tensor

MAX_SIGNATURES = 64
"""How many signatures an evaluator keeps executables (so bindings) for, and
``FusionDefinition`` its executables, lowered programs and evaluators, the most recently
used (a :class:`RecentlyUsed` each): a signature dropped is bound (or lowered) and
prepared again when it comes back. A float scalar input that changes every call must not
grow the caches without bound (a definition run with 3,000 shapes used to keep 3,000 of
each, 55 MB)."""


Entry = TypeVar("Entry")


class RecentlyUsed(Generic[Entry]):
    """A mapping that keeps its ``size`` (default :data:`MAX_SIGNATURES`, read when it is
    made) most recently used entries: a lookup that finds an entry, or a store, makes it the
    most recent; a store past ``size`` drops the least recently used one. The most recent
    key is compared before anything is hashed (a call repeating the last signature, the
    common case, costs one tuple comparison)."""

    def __init__(self, size: int | None = None) -> None:
        self.size = MAX_SIGNATURES if size is None else size
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self._last: tuple[Hashable, Entry] | None = None  # the most recent key and entry

    def get(self, key: Hashable) -> Entry | None:
        """The entry for ``key`` (now the most recent), or None."""
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        found = self._entries.get(key)
        if found is not None:
            try:
                self._entries.move_to_end(key)
            except KeyError:  # another thread's store dropped it meanwhile: found stands
                pass
            self._last = (key, found)
        return found

    def __setitem__(self, key: Hashable, entry: Entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        self._last = (key, entry)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
            if not self._entries:  # a size of 0 keeps nothing
                self._last = None

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._entries)

    def values(self) -> list[Entry]:
        """The entries, least recently used first."""
        return list(self._entries.values())


class Binding:
    """What binding one signature's inputs gave: every bound scalar (the rank, the
    extents, the scalar inputs), which tensor inputs this rank holds no shard of, and
    the local shapes of the program's values, filled as runs ask for them."""

    __slots__ = ("scalars", "absent", "shapes")

    def __init__(self, context: RunContext, values: Sequence[TensorValue | ScalarInput]):
        self.scalars = dict(context.scalars)
        self.absent = frozenset(
            v.name for v in values if isinstance(v, TensorValue) and context.tensors[v.name] is None
        )
        self.shapes = context.shape_cache  # shapes depend only on what the inputs bind

    def apply(
        self, context: RunContext, values: Sequence[TensorValue | ScalarInput], inputs: list
    ) -> None:
        """Binds ``inputs`` in ``context`` as the first run of this signature did."""
        context.scalars.update(self.scalars)
        tensors = context.tensors
        for value, given in zip(values, inputs, strict=True):
            if isinstance(value, TensorValue):
                tensors[value.name] = None if value.name in self.absent else given
        context.shape_cache = self.shapes


class InputChecks:
    """Binds and checks a program's inputs in a run's context (see the module docstring);
    the loop and extent checks are built at the first binding."""

    def __init__(self, program: HostIrContainer) -> None:
        self.program = program
        self._loop_counts: LoopCounts | None = None
        self._extent_checks: ExtentChecks | None = None

    def bind(self, context: RunContext, inputs: list[Any]) -> HostIrError | None:
        """Binds every input and checks the extents; the first error instead of raising
        it (the agreement tells the other ranks about it before this rank raises it)."""
        return self._bind_inputs(context, inputs) or self._check_extents(context)

    def _bind_inputs(self, context: RunContext, inputs: list[Any]) -> HostIrError | None:
        values = self.program.inputs
        if len(inputs) != len(values):
            names = ", ".join(v.name for v in values)
            return InputError(f"expected {len(values)} inputs ({names}), got {len(inputs)}")
        try:
            for value, given in zip(values, inputs, strict=True):
                _bind_input(context, value, given)
        except HostIrError as error:
            return error
        for value in values:
            tensor = context.tensors.get(value.name)
            if isinstance(tensor, torch.Tensor) and not same_device(tensor.device, context.device):
                return InputError(
                    f"input {value.name} is on {tensor.device}, but this run is on"
                    f" {context.device} (the device of the first tensor input, or the"
                    " evaluator's device): pass every tensor on one device"
                )
        return None

    def _check_extents(self, context: RunContext) -> HostIrError | None:
        """Checks the loops' trip counts and the extents the inputs bound; the error
        instead of raising it."""
        if self._loop_counts is None:
            self._loop_counts = LoopCounts(self.program)
        if self._extent_checks is None:
            self._extent_checks = ExtentChecks(self.program)
        try:
            self._loop_counts.check(context.scalars, context.rank)
            self._extent_checks.check(context.scalars, context.rank)
        except HostIrError as error:
            return error
        return None


def _bind_input(context: RunContext, value: Any, given: Any) -> None:
    if isinstance(value, ScalarInput):
        if isinstance(given, torch.Tensor) or not isinstance(given, int | float | bool):
            raise InputError(
                f"input {value.name} is a {value.dtype.value} scalar, got {type(given).__name__}"
            )
        context.scalars[value.name] = coerce_scalar(value, given)
        return
    if not context.participates(value):
        context.tensors[value.name] = None
        return
    context.tensors[value.name] = bind_input_tensor(value, given, context.scalars)


def coerce_scalar(value: ScalarInput, given: int | float | bool) -> int | float | bool:
    """``given`` as a Python value of ``value``'s declared dtype (an int passed for a
    float input becomes a float, so results have the declared dtype)."""
    if value.dtype is DType.BOOL:
        if not isinstance(given, bool):
            raise InputError(f"input {value.name} is a bool scalar, got {given!r}")
        return given
    if value.dtype in (DType.INT64, DType.INT32):
        if isinstance(given, float) and not given.is_integer():
            raise InputError(f"input {value.name} is an {value.dtype.value} scalar, got {given!r}")
        low, high = INT_RANGES[value.dtype]
        if not low <= int(given) <= high:
            raise InputError(
                f"input {value.name} is an {value.dtype.value} scalar, got {given!r}, outside"
                f" its range [{low}, {high}]"
            )
        return int(given)
    try:
        return float(given)
    except OverflowError:  # an int beyond a float's range
        raise InputError(
            f"input {value.name} is a {value.dtype.value} scalar, got an int too large for it"
        ) from None


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether ``a`` and ``b`` are one device (``cuda`` without an index is the current one)."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def device_of(inputs: Sequence[Any]) -> torch.device:
    """The device of the first tensor input (CPU if there is none): a run's device when
    neither the caller nor the evaluator names one."""
    for given in inputs:
        if isinstance(given, torch.Tensor):
            return given.device
    return torch.device("cpu")
