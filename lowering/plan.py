"""Resharding plans: their steps, and the builder the planning rules share."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hostir import Allgather, Const, DType, MeshAxis, Sharding, ShardPart, TensorValue
from hostir.catalog import declaration_of
from hostir.printer import _MeshNames, print_sharding
from hostir.scalars import Scalar, floordiv, mul
from hostir.team import Team
from hostir.values import RequestValue
from lowering.errors import ReshardingError


@dataclass(frozen=True, kw_only=True)
class Step:
    """One instruction of a plan: its host IR class (``Allgather``, ``LocalShard``, ``Set``),
    its ``team`` (None for local steps) and the other fields it is built with, under the
    instruction's own names (``attrs``); ``after`` is the data's sharding once it ran."""

    kind: type
    after: Sharding
    team: Team | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""

    @property
    def name(self) -> str:
        """The instruction's keyword (``Allgather``, ``local_shard``)."""
        return declaration_of(self.kind).keyword

    def get(self, name: str) -> Any:
        """The field ``name`` the instruction is built with (None if not given)."""
        return self.attrs.get(name)

    def instruction(self, src: TensorValue, out: TensorValue, request: Any = None) -> Any:
        """The host IR instruction this step is, from ``src`` to ``out``; ``request`` (a
        RequestValue) for a step with a team, which communicates."""
        given = {"out": out, "src": src, **self.attrs}
        if self.team is not None:
            given.update(team=self.team, request=request)
        return self.kind(**given)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The steps from ``src`` to ``dst`` (empty when only a copy is needed)."""

    src: Sharding
    dst: Sharding
    steps: tuple[Step, ...]
    shape: tuple[Scalar, ...] = ()
    itemsize: int = 4
    notes: tuple[str, ...] = ()

    def before(self, k: int) -> Sharding:
        """The data's sharding before step ``k``."""
        return self.steps[k - 1].after if k else self.src

    def in_output_from(self) -> int:
        """The first step of the trailing run that is built inside the output buffer: every
        later step is an Allgather on one mesh whose input is this rank's slot of its
        output, so the steps from here on write straight into ``dst`` (or a view of it;
        every instruction the planner emits can write into an existing ``out``).
        ``len(steps) - 1`` when there is no such run (the last step alone writes ``dst``)."""
        head = len(self.steps) - 1
        while (
            head > 0
            and self.steps[head].kind is Allgather
            and self.steps[head - 1].after.mesh == self.steps[head].after.mesh
        ):
            head -= 1
        return head

    def instruction(self, k: int) -> Any:
        """Step ``k``'s instruction on stand-ins for its input and output (``src``, ``out``):
        what the cost models ask hostir about."""
        step = self.steps[k]
        src, out = (
            TensorValue(name=name, dtype=DType.FLOAT32, shape=self.shape, sharding=sharding)
            for name, sharding in (("src", self.before(k)), ("out", step.after))
        )
        return step.instruction(src, out, RequestValue(name="R"))

    def explain(self) -> str:
        """One line per step: what runs over which team, bytes and memory per rank, why;
        then the fusions applied or refused."""
        from lowering.explain_plan import explain_plan  # formatting lives apart

        return explain_plan(self)


def local_elements(sharding: Sharding, shape: tuple[Scalar, ...]) -> Scalar:
    """Elements of one device's shard (a scalar expression for symbolic shapes)."""
    total: Scalar = Const(value=1)
    for dim, extent in enumerate(shape):
        total = mul(total, floordiv(extent, sharding.shard_factor(dim)))
    return total


class Planner:
    """Builds a plan step by step, tracking the current sharding."""

    def __init__(self, src: TensorValue, dst: TensorValue) -> None:
        self.src, self.dst = src, dst
        self.shape = dst.shape
        self.current = src.sharding
        self.steps: list[Step] = []
        self.notes: list[str] = []

    def fail(self, why: str) -> ReshardingError:
        """A ReshardingError naming both tensors, their shardings and the meshes."""
        names = _MeshNames()
        return ReshardingError(
            f"cannot reshard {self.src.name} {print_sharding(self.src.sharding, names)} to"
            f" {self.dst.name} {print_sharding(self.dst.sharding, names)}"
            f" (meshes: {', '.join(f'{n} = {m}' for m, n in names.names.items())}): {why}"
        )

    def add(
        self, kind: type, after: Sharding, team: Team | None = None, reason: str = "", **attrs
    ) -> None:
        """Appends a step (see :class:`Step`); the data is laid out as ``after`` once it ran."""
        self.steps.append(Step(kind=kind, after=after, team=team, attrs=attrs, reason=reason))
        self.current = after

    def note(self, text: str) -> None:
        """Records a fusion applied or refused, for ``Plan.explain``."""
        self.notes.append(text)

    # ----- block layouts -----
    def axes(self, sharding: Sharding, dim: int) -> tuple[MeshAxis, ...]:
        """The mesh axes of ``dim``, outer first; raises unless they come before local data."""
        parts = sharding.dims[dim]
        mesh_parts = [p.axis for p in parts if p.axis is not None]
        if mesh_parts and any(p.axis is None for p in parts[: len(mesh_parts)]):
            raise self.fail(f"dim {dim} is not laid out in blocks (mesh axes first)")
        return tuple(mesh_parts)

    def with_dim(self, sharding: Sharding, dim: int, axes: tuple[MeshAxis, ...]) -> Sharding:
        """``sharding`` with ``dim`` laid out in blocks over ``axes``."""
        mesh = sharding.mesh
        factor = math.prod(mesh.axis_size(a) for a in axes)
        parts = [ShardPart(axis=a, extent=Const(value=mesh.axis_size(a))) for a in axes]
        local: Scalar = floordiv(self.shape[dim], factor)
        if not (axes and local == Const(value=1)):
            parts.append(ShardPart(axis=None, extent=local))
        dims = list(sharding.dims)
        dims[dim] = tuple(parts)
        return replace(sharding, dims=tuple(dims))

    def dim_of(self, sharding: Sharding, axis: MeshAxis) -> int | None:
        """The dim ``sharding`` shards over ``axis``, if any."""
        for dim in range(len(sharding.dims)):
            if axis in self.axes(sharding, dim):
                return dim
        return None
