"""The generator's model of a case's tensors: their axes, dtype and data facts."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Axis:
    """A logical axis as the generator tracks it: concrete extent, symbolic, reduced."""

    extent: int
    symbolic: bool = False
    reduction: bool = False


@dataclass
class Tensor:
    """A tensor of the case being built."""

    name: str
    axes: list[Axis]
    """The logical domain, reduction axes included (as the frontend has it)."""
    dtype: torch.dtype
    positive: bool = False
    is_input: bool = False

    @property
    def data(self) -> list[Axis]:
        return [a for a in self.axes if not a.reduction]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.extent for a in self.data)
