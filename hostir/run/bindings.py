"""Input bindings prepared once per input signature.

Binding a run's inputs checks every tensor against its declared type and sharding,
binds the symbolic extents, and checks the extents (``hostir.check.extent_checks``):
the same work, with the same outcome, for every run whose inputs have the same local
shapes, dtypes and devices (and scalar inputs the same values) on the same rank of the
same world. A :class:`Bindings` keeps what a successful binding gave, by that signature,
so a later run with the signature only looks it up (one dictionary lookup) and applies
it. A binding that fails is never kept: its run raises, and the next one checks again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import torch

from hostir.comm.communicator import Communicator
from hostir.comm.world import world_token
from hostir.ir.container import ScalarInput
from hostir.ir.values import TensorValue
from hostir.run.context import RunContext

MAX_SIGNATURES = 64
"""How many signatures an evaluator keeps bindings for, and ``HostIrEvaluator.run`` and
``FusionDefinition.execute`` prepared calls for; past that, a new signature is bound every
run (a float scalar input that changes every call must not grow the cache without
bound). ``FusionDefinition`` also keeps its lowered programs, its evaluators and its CUDA
graphs for at most this many signatures, the most recently used (a :class:`RecentlyUsed`
each): a signature dropped is lowered and prepared again when it comes back (a definition
run with 3,000 shapes used to keep 3,000 of each, 55 MB)."""


def call_key(inputs: Any, *fixed: Any) -> tuple | None:
    """What a prepared call (``HostIrEvaluator.prepared_call``) depends on: the caller's
    ``fixed`` values (its own settings), the default process group
    (hostir.comm.world.world_token) and each input tensor's type, shape, dtype and device;
    None for inputs that are not a list or tuple of tensors (scalars are checked every
    call). ``HostIrEvaluator.run`` and ``FusionDefinition.execute`` key theirs with it."""
    if type(inputs) is not list and type(inputs) is not tuple:
        return None
    try:  # a scalar has no shape: it is checked every call
        signature = [(x.__class__, x.shape, x.dtype, x.device) for x in inputs]
    except AttributeError:
        return None
    return (*fixed, world_token(), *signature)


Entry = TypeVar("Entry")


class RecentlyUsed(Generic[Entry]):
    """A mapping that keeps its ``size`` (default :data:`MAX_SIGNATURES`, read when it is
    made) most recently used entries: a lookup that finds an entry, or a store, makes it the
    most recent; a store past ``size`` drops the least recently used one."""

    def __init__(self, size: int | None = None) -> None:
        self.size = MAX_SIGNATURES if size is None else size
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()

    def get(self, key: Hashable) -> Entry | None:
        """The entry for ``key`` (now the most recent), or None."""
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def __setitem__(self, key: Hashable, entry: Entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)

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


class Bindings:
    """An evaluator's bindings, by signature (see the module docstring)."""

    def __init__(self) -> None:
        self._by_signature: dict[tuple, Binding] = {}

    @staticmethod
    def signature(
        inputs: Sequence[Any], device: torch.device, communicator: Communicator
    ) -> tuple | None:
        """What a binding depends on: the run's device, the rank and world size, each
        tensor's local shape, dtype and device, each scalar's type and value, None for an
        input passed as None. None for inputs of other kinds (the full binding names what
        is wrong with them)."""
        found: list[Any] = [device, communicator.rank, communicator.world_size]
        for given in inputs:
            if isinstance(given, torch.Tensor):
                found.append((tuple(given.shape), given.dtype, given.device))
            elif isinstance(given, bool | int | float):
                found.append((type(given), given))
            elif given is None:  # an input this rank does not hold (else binding refuses it)
                found.append(None)
            else:
                return None
        return tuple(found)

    def get(self, signature: tuple | None) -> Binding | None:
        """The binding kept for ``signature``, if any."""
        return None if signature is None else self._by_signature.get(signature)

    def keep(
        self,
        signature: tuple | None,
        context: RunContext,
        values: Sequence[TensorValue | ScalarInput],
    ) -> None:
        """Keeps what binding ``context``'s inputs gave (call only after it succeeded)."""
        if signature is not None and len(self._by_signature) < MAX_SIGNATURES:
            self._by_signature[signature] = Binding(context, values)
