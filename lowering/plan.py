"""Resharding plans: their steps, and the builder the planning rules share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from hostir import Allgather, Allreduce, Const, DType, SendRecv, Sharding, TensorValue
from hostir.ir.catalog import declaration_of
from hostir.ir.scalars import Scalar, floordiv, mul
from hostir.ir.team import Team
from hostir.ir.values import RequestValue
from hostir.text.printer import _MeshNames, print_sharding
from lowering.distribution import Distribution
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
    """Builds a plan step by step, tracking where the data is (``current``) as a
    :class:`~lowering.distribution.Distribution`: the planner's one representation of
    "the mesh axes of a dim"; steps record the sharding each leaves."""

    def __init__(self, src: TensorValue, dst: TensorValue) -> None:
        self.src, self.dst = src, dst
        self.shape = dst.shape
        self.steps: list[Step] = []
        self.notes: list[str] = []
        if src.sharding is None or dst.sharding is None:
            raise self.fail("both tensors need a mesh")
        try:  # a layout that is not in blocks (cyclic) has no Distribution
            self.current, self.target = (Distribution.from_sharding(v.sharding) for v in (src, dst))
        except ReshardingError as error:
            raise self.fail(str(error)) from None

    def fail(self, why: str) -> ReshardingError:
        """A ReshardingError naming both tensors, their shardings and the meshes."""
        names = _MeshNames()
        return ReshardingError(
            f"cannot reshard {self.src.name} {print_sharding(self.src.sharding, names)} to"
            f" {self.dst.name} {print_sharding(self.dst.sharding, names)}"
            f" (meshes: {', '.join(f'{n} = {m}' for m, n in names.names.items())}): {why}"
        )

    def scratch(self, current: Distribution) -> Planner:
        """A planner for the same tensors starting from ``current``, with no steps: for
        building a candidate plan beside this one."""
        other = Planner(self.src, self.dst)
        other.current = current
        return other

    def sharding(self, distribution: Distribution) -> Sharding:
        """The block sharding of the tensor laid out as ``distribution``."""
        return distribution.to_sharding(self.shape)

    def add(
        self, kind: type, after: Distribution, team: Team | None = None, reason: str = "", **attrs
    ) -> None:
        """Appends a step (see :class:`Step`); the data is laid out as ``after`` once it ran."""
        sharding = self.sharding(after)
        self.steps.append(Step(kind=kind, after=sharding, team=team, attrs=attrs, reason=reason))
        self.current = after

    def note(self, text: str) -> None:
        """Records a fusion applied or refused, for ``Plan.explain``."""
        self.notes.append(text)
