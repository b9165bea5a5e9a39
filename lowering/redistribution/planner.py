"""``Planner``: builds a resharding plan step by step; the planning rules share it."""

from __future__ import annotations

from hostir import Sharding, TensorValue
from hostir.ir.mesh_names import MeshNames
from hostir.ir.team import Team
from hostir.text.printer import print_sharding
from lowering.errors import ReshardingError
from lowering.redistribution.distribution import Distribution
from lowering.redistribution.plan import Step


class Planner:
    """Builds a plan step by step, tracking where the data is (``current``) as a
    :class:`~lowering.redistribution.distribution.Distribution`: the planner's one representation of
    "the mesh axes of a dim"; steps record the sharding each leaves."""

    def __init__(self, src: TensorValue, dst: TensorValue) -> None:
        self.src, self.dst = src, dst
        self.shape = dst.shape
        self.steps: list[Step] = []
        self.notes: list[str] = []
        # The candidates the cost model compared, one line each (``hostir plan --explain``).
        self.considered: list[str] = []
        if src.sharding is None or dst.sharding is None:
            raise self.fail("both tensors need a mesh")
        try:  # a layout that is not in blocks (cyclic) has no Distribution
            self.current, self.target = (Distribution.from_sharding(v.sharding) for v in (src, dst))
        except ReshardingError as error:
            raise self.fail(str(error)) from None

    def fail(self, why: str) -> ReshardingError:
        """A ReshardingError naming both tensors, their shardings and the meshes."""
        names = MeshNames()
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
        """Records a fusion applied or refused, for ``ExplainedPlan.explain``."""
        self.notes.append(text)
