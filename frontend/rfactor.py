"""``tv.rfactor(axes)``: split a reduction into a local part and the rest, as nvFuser's.

nvFuser's rfactor makes a new tensor that the reduction's definition now writes (the
reduction over ``axes``, on each device's data) and redefines ``tv`` as the reduction of
that tensor over the remaining reduction axes. Here a tensor's sharded reduction axis
already means "partial results over that mesh axis", so the rfactored tensor is the same
op with ``tv``'s logical axes and schedule (its reduction axes included), and ``tv``
becomes a ``set`` of it that maps only the data axes: where the rfactored tensor's
reduction axis is parallelized over a mesh axis (``local.axis(-2).parallelize(mesh_x)``,
as nvFuser's tests write it) it holds partial results, and the ``set`` finishes them
with the collective ``tv``'s own schedule asks for (an Allreduce when ``tv`` is
replicated, a ReduceScatter when ``tv`` is sharded on that mesh axis).
"""

from __future__ import annotations

from typing import Any

from frontend.arguments import int_list
from frontend.errors import ScheduleError
from frontend.exprs import Expr, FusionOp, placeholder
from frontend.iter_domain import IterDomain, Split
from frontend.tensor_view import TensorView
from hostir.ir.layout_ops import SET


def _replay(old: IterDomain, new: IterDomain, mapped: dict[int, IterDomain], tv: TensorView):
    """Replays ``old``'s transform tree onto ``new``, recording each axis's counterpart."""
    new.parallel_type = old.parallel_type
    mapped[id(old)] = new
    if old.use is None:
        return
    if not isinstance(old.use, Split):
        raise ScheduleError(
            f"rfactor of {tv.name}: axis {old} is swizzled ({old.use}); rfactor replays splits"
            " only: rfactor before swizzling"
        )
    split = Split(new, old.use.factor, old.use.inner_split)
    _replay(old.use.outer, split.outer, mapped, tv)
    _replay(old.use.inner, split.inner, mapped, tv)


def rfactor(fusion: Any, tv: TensorView, axes: Any) -> TensorView:
    """The rfactored tensor of ``tv`` (see the module docstring); ``axes`` are loop axis
    indices of ``tv``, each a reduction axis. ScheduleError naming ``tv`` otherwise."""
    indices = int_list(ScheduleError, f"rfactor of {tv.name}", "axes", axes, allow_int=True)
    loop = tv.get_loop_domain()
    if not indices:
        raise ScheduleError(f"rfactor of {tv.name}: axes is empty; name a reduction loop axis")
    for index in indices:
        axis = tv.axis(index)  # raises for an index out of range, naming tv
        if not axis.is_reduction():
            raise ScheduleError(
                f"rfactor of {tv.name}: loop axis {index} ({axis}) is not a reduction axis;"
                f" the loop domain is {loop}"
            )
    definition: Expr | None = tv.definition
    if definition is None:
        raise ScheduleError(f"rfactor of {tv.name}: {tv.name} is not defined by an op")
    logical = tv.get_logical_domain()
    local = fusion.new_tensor(tv.dtype, [IterDomain(a.extent, a.iter_type) for a in logical])
    mapped: dict[int, IterDomain] = {}
    for old, new in zip(logical, local.get_logical_domain(), strict=True):
        _replay(old, new, mapped, tv)
    local._loop = [mapped[id(axis)] for axis in loop]
    for axis in local._loop:
        axis.owner = local
    local.device_mesh = tv.device_mesh
    local.mesh_set_by_user = tv.mesh_set_by_user
    # The definition now writes the rfactored tensor, its axes mapped to the copies.
    definition.output = local
    definition.axis_map = {
        producer: [(mapped[id(out_axis)], in_axis) for out_axis, in_axis in pairs]
        for producer, pairs in definition.axis_map.items()
    }
    local.definition = definition
    # tv is now a set of it over the data axes only: the reduction axes are not mapped, so
    # the set reduces whatever partial results the rfactored tensor holds. The set is the
    # expression fd.ops.set records (frontend.recording), but defining tv itself, which the
    # user holds and scheduled, where recording would make a new tensor.
    pairs = [(axis, mapped[id(axis)]) for axis in logical if not axis.is_reduction()]
    instruction = SET.cls(**SET.fixed, out=placeholder(tv), src=placeholder(local))
    finish = FusionOp(
        tv, axis_map={local: pairs}, instruction=instruction, decl=SET, operands=(local,)
    )
    fusion.insert_after(definition, finish)
    tv.schedule_clock.tick()
    return local
