"""Input signatures: what a prepared run depends on, and what the ranks agree on.

One notion, read three ways:

- :func:`call_key`, the *exact* signature: per input, a tensor's class, local shape,
  dtype and device, a scalar's type and text (so ``0.0`` and ``-0.0`` differ and ``nan``
  equals ``nan``), None for an input this rank does not hold; the default process group
  (hostir.comm.world.world_token: which communicator, so which rank and world size); and
  the caller's own fixed values (its options). A run whose key matches one that ran
  before binds the same extents, checks the same things with the same outcome and runs the
  same code: ``hostir.run.executable.Executable`` is prepared once per key, and a call of
  a known key is that key's lookup and the executable's call, nothing else.
- :func:`input_kinds`, the *coarse* signature: per input, a tensor's local shape, dtype
  and device type, any other value's type. ``FusionDefinition`` lowers once per kind and
  schedule: a scalar input is a symbol of the program, whatever its value.
- :func:`agreement_kinds`: the coarse signature and the value of each scalar input an
  extent reads (``full([s0, 4])``). The ranks agree once per such kind (the agreement
  compares programs, bound extents, those scalars and dtypes, hostir.comm.agreement), so a
  new value of ``s0`` is agreed on before it sizes a collective's buffers.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch

from hostir.comm.world import world_token

_TENSOR = operator.attrgetter("__class__", "shape", "dtype", "device")
"""A tensor's part of the exact signature, read in C (no Python frame per input)."""

_SCALARS = (bool, int, float)


def call_key(inputs: Any, *fixed: Any) -> tuple | None:
    """The exact signature of ``inputs`` (see the module docstring), led by ``fixed``;
    None where there is none: ``inputs`` is not a list or tuple, or holds a value that is
    neither a tensor, a bool, an int, a float nor None (the run's binding names what is
    wrong with it). Hashable only where ``fixed`` is."""
    if type(inputs) is not list and type(inputs) is not tuple:
        return None
    try:  # every input a tensor: the common case, read in C
        return (*fixed, world_token(), *map(_TENSOR, inputs))
    except AttributeError:
        pass
    found: list[Any] = []
    for given in inputs:
        if isinstance(given, torch.Tensor):
            found.append(_TENSOR(given))
        elif given is None:
            found.append(None)
        elif type(given) in _SCALARS:
            found.append((type(given), repr(given)))
        else:
            return None
    return (*fixed, world_token(), *found)


def input_kinds(inputs: Sequence[Any]) -> tuple:
    """The coarse signature of ``inputs`` (see the module docstring): per input, a tensor's
    local shape, dtype and device type, any other value's type."""
    return tuple(
        (tuple(x.shape), x.dtype, x.device.type) if isinstance(x, torch.Tensor) else type(x)
        for x in inputs
    )


def agreement_kinds(inputs: Sequence[Any], scalars: tuple[tuple[int, str], ...]) -> tuple:
    """What the ranks agree on once (see the module docstring): :func:`input_kinds` of
    ``inputs``, with the value of each scalar input at ``scalars``' positions
    (``hostir.run.agreements.extent_scalars``); the coarse signature alone where there is
    none, so a program whose extents read no scalar input pays nothing for them."""
    kinds = input_kinds(inputs)
    if not scalars:
        return kinds
    values = tuple(repr(inputs[p]) if p < len(inputs) else None for p, _ in scalars)
    return (kinds, values)
