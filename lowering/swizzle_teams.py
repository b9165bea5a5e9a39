"""Which communication a swizzled stream loop may hold.

``swizzle1d(a, mesh_p)`` makes iteration ``j`` of a stream loop handle chunk
``(j + coord(mesh, p)) % S``: ranks that differ on ``mesh_p`` hold different
chunks in the same iteration. That is right for the loop's own
CollectivePermute (the swizzled gather of a ``mesh_p``-sharded tensor, whose
peers follow the same rotation), and for communication over a team whose
members share their ``mesh_p`` coordinate. Any other communication in the loop
(an Allreduce of partial sums over ``mesh_p``, a ReduceScatter, an Allgather,
a Broadcast, ...) would combine unrelated chunks: a wrong result without an
error (fuzz seed 6025 at 8 ranks). The lowering refuses it by name;
``hostir.check.verify_chunks`` refuses the same in any program.
"""

from __future__ import annotations

from collections.abc import Sequence

from hostir import Mesh, MeshAxis
from hostir.check.verify_chunks import team_splits_coordinate
from hostir.ir.catalog import COMMUNICATING, declaration_of
from hostir.ir.instructions import Instruction, keyword
from lowering.errors import LoweringError
from lowering.snapshot import LoweringOp


def check_swizzled_communication(
    op: LoweringOp,
    emitted: Sequence[Instruction],
    swizzle: tuple[MeshAxis, Mesh],
    swizzled: str,
    count: int,
) -> None:
    """Raises LoweringError if an instruction ``op`` emitted inside a loop swizzled over
    ``swizzle`` (set by ``swizzle1d`` on tensor ``swizzled``; ``count`` chunks)
    communicates over a team whose members differ in that coordinate."""
    axis, mesh = swizzle
    for instruction in emitted:
        if declaration_of(type(instruction)).kind not in COMMUNICATING:
            continue
        team = instruction.team
        if not team_splits_coordinate(team, mesh, axis):
            continue
        team_axes = ", ".join(f"mesh_{a.value}" for a in team.axes)
        what = keyword(instruction)
        raise LoweringError(
            f"{op.output} = {keyword(op.instruction)}({', '.join(op.inputs)}) needs {what}"
            f" over the team of {team_axes} of mesh {team.mesh} inside the stream loop that"
            f" swizzle1d over mesh_{axis.value} on {swizzled} rotates (iteration j handles"
            f" chunk (j + r) % {count}, r the rank's mesh_{axis.value} coordinate): the team's"
            f" members differ on mesh_{axis.value}, so they hold different chunks in the same"
            f" iteration and the {what} would mix data of different chunks. swizzle1d is for a"
            f" set that gathers a tensor sharded over mesh_{axis.value} (exchanged with"
            f" CollectivePermute); drop swizzle1d from {swizzled} (each iteration then handles"
            " the same chunk on every rank)"
        )
