"""What each simulated rank holds: the bytes of the tensors its runs keep alive.

A run binds every value it holds in its context's ``tensors`` (the interpreter and the
compiled program alike; ``deallocate`` removes them). In a simulated world each run's
``tensors`` is a :class:`HeldTensors`, which counts the bytes of the values it refers to
(two names of one tensor count once; a shard that is a view of a whole tensor counts its
own bytes, as a real rank holding only the shard would) as values are bound and dropped,
and keeps the rank's peak in the world's :class:`MemoryMeter`. The meter also counts the
storages of every rank together, once each: what the process holds. An input a rank takes
whole (a replica: ``shard_tensor`` returns the tensor itself, or a view of it) is then
stored once for every rank that holds it, so the process's peak is below the sum of the
ranks' peaks.
"""

from __future__ import annotations

import threading
from typing import Any

import torch


class MemoryMeter:
    """Each rank's bytes held now and at peak, and the process's (storages counted once)."""

    def __init__(self, world_size: int) -> None:
        self.held = [0] * world_size
        self.peak = [0] * world_size
        self.process_held = 0
        self.process_peak = 0
        self._lock = threading.Lock()
        self._refs: dict[int, list[int]] = {}  # storage address -> [references, bytes]

    def add(self, rank: int, held: int, address: int, size: int) -> None:
        """A run of ``rank`` holds ``held`` more bytes, and refers to the storage at
        ``address`` of ``size`` bytes once more."""
        with self._lock:
            self.held[rank] += held
            self.peak[rank] = max(self.peak[rank], self.held[rank])
            entry = self._refs.get(address)
            if entry is None:
                self._refs[address] = [1, size]
                self.process_held += size
                self.process_peak = max(self.process_peak, self.process_held)
            else:
                entry[0] += 1

    def drop(self, rank: int, held: int, address: int) -> None:
        """A run of ``rank`` holds ``held`` bytes less, and refers to the storage at
        ``address`` once less."""
        with self._lock:
            self.held[rank] -= held
            entry = self._refs.get(address)
            if entry is not None:
                entry[0] -= 1
                if entry[0] == 0:
                    del self._refs[address]
                    self.process_held -= entry[1]


def _memory(value: Any) -> tuple[tuple[int, int], int, int] | None:
    """(the view: its address and bytes, its storage's address, the storage's bytes)."""
    if not isinstance(value, torch.Tensor):
        return None
    storage = value.untyped_storage()
    view = (value.data_ptr(), value.numel() * value.element_size())
    return view, storage.data_ptr(), storage.nbytes()


class HeldTensors(dict):
    """A run's tensors by name that tells ``meter`` what rank ``rank`` holds (see the
    module docstring). Only binding, ``pop`` and ``update`` change it in a run."""

    def __init__(self, meter: MemoryMeter, rank: int) -> None:
        super().__init__()
        self._meter, self._rank = meter, rank
        self._refs: dict[tuple[int, int], int] = {}  # view -> values of this run on it
        self._counting = True

    def _hold(self, value: Any) -> None:
        found = _memory(value) if self._counting else None
        if found is not None:
            view, address, size = found
            count = self._refs.get(view, 0)
            self._refs[view] = count + 1
            self._meter.add(self._rank, view[1] if count == 0 else 0, address, size)

    def _release(self, value: Any) -> None:
        found = _memory(value) if self._counting else None
        if found is not None:
            view, address, _ = found
            count = self._refs[view] - 1
            if count:
                self._refs[view] = count
            else:
                del self._refs[view]
            self._meter.drop(self._rank, view[1] if count == 0 else 0, address)

    def __setitem__(self, name: str, value: Any) -> None:
        old = self.get(name)
        super().__setitem__(name, value)
        self._hold(value)
        if name in self and old is not None:
            self._release(old)

    def __delitem__(self, name: str) -> None:
        self._release(self[name])
        super().__delitem__(name)

    def pop(self, name: str, *default: Any) -> Any:
        if name in self:
            value = super().pop(name)
            self._release(value)
            return value
        return super().pop(name, *default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for name, value in dict(*args, **kwargs).items():
            self[name] = value

    def release_all(self) -> None:
        """The run ended: what it still binds (its outputs, handed to the caller) is no
        longer counted as the run's; later changes are not counted."""
        for value in list(self.values()):
            self._release(value)
        self._counting = False
