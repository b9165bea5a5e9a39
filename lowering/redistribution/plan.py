"""Resharding plans as data: their steps (``Step``) and the plan (``Plan``), with the
structural queries the cost, memory and explanation modules ask; nothing here imports
those modules or the planner, which all build on it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from hostir import Allgather, Allreduce, Const, DType, SendRecv, Sharding, TensorValue
from hostir.ir.catalog import declaration_of
from hostir.ir.scalars import Scalar, floordiv, mul
from hostir.ir.team import Team
from hostir.ir.values import RequestValue


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
    """The steps from ``src`` to ``dst`` (empty when only a copy is needed). ``plan_resharding``
    returns it as an ``ExplainedPlan`` (``lowering.redistribution.explain_plan``), which adds
    ``explain()``."""

    src: Sharding
    dst: Sharding
    steps: tuple[Step, ...]
    shape: tuple[Scalar, ...] = ()
    itemsize: int = 4
    notes: tuple[str, ...] = ()
    considered: tuple[str, ...] = ()
    """The cost model's comparisons of candidate plans, one line each (``explain(True)``)."""

    def before(self, k: int) -> Sharding:
        """The data's sharding before step ``k``."""
        return self.steps[k - 1].after if k else self.src

    def built_in(self) -> int:
        """The step whose output a run of gathers is built inside: the last (``dst``), or,
        before a final SendRecv to another mesh, the step whose output it sends."""
        last = len(self.steps) - 1
        return last - 1 if last > 0 and self.steps[last].kind is SendRecv else last

    def in_output_from(self) -> int:
        """The first step of the run built inside the output of step :meth:`built_in` (that
        step when there is none): each later step of it is an Allgather on one mesh whose
        input is its slot of the output, or an in-place Allreduce, and the step before can
        write into a view (its class has a ``preallocated`` field)."""
        head = self.built_in()
        while (
            head > 0
            and (self.steps[head].kind is Allgather or self.in_place(head))
            and "preallocated" in {f.name for f in fields(self.steps[head - 1].kind)}
            and self.steps[head - 1].after.mesh == self.steps[head].after.mesh
        ):
            head -= 1
        return head

    def in_place(self, k: int) -> bool:
        """Whether step ``k`` runs in place on its output: an Allreduce (of a tensor with
        dims, so its output can be aliased whole)."""
        return self.steps[k].kind is Allreduce and len(self.shape) > 0

    def instruction(self, k: int) -> Any:
        """Step ``k``'s instruction on stand-ins for its input and output (``src``, ``out``):
        what the cost models ask hostir about."""
        step = self.steps[k]
        src, out = (
            TensorValue(name=name, dtype=DType.FLOAT32, shape=self.shape, sharding=sharding)
            for name, sharding in (("src", self.before(k)), ("out", step.after))
        )
        return step.instruction(src, out, RequestValue(name="R"))


def local_elements(sharding: Sharding, shape: tuple[Scalar, ...]) -> Scalar:
    """Elements of one device's shard (a scalar expression for symbolic shapes)."""
    total: Scalar = Const(value=1)
    for dim, extent in enumerate(shape):
        total = mul(total, floordiv(extent, sharding.shard_factor(dim)))
    return total
