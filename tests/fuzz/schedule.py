"""Random schedules for fuzz cases: meshes, mesh and stream splits, swizzles, reorders.

Each tensor (input, intermediate or output) is scheduled by the user with some
probability and otherwise left to sharding propagation. A scheduled tensor is placed
on the case's mesh (or, rarely, a second one) and gets 0 to 3 mesh axes on random
logical dims, reduction dims included (partial sums), by ``outer_split`` or
``inner_split`` with the outer or the inner part parallelized (block or cyclic), so a
dim may take several mesh axes. Some cases split one tensor's dim into stream chunks,
and some schedule a ``set`` as a stream all-gather of its sharded source, with or
without ``swizzle1d``. A loop model mirrors the frontend's loop domain so that every
emitted axis index is the one the frontend expects.

In a ragged case (``tests/fuzz/generate.py``) a symbolic dim may also be split by a mesh
axis or into stream chunks that do not divide its value (features ``ragged_mesh``,
``ragged_stream``; ``one_per_device`` when a mesh axis leaves one index per device), and
stream splits are drawn more often, on symbolic dims first.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.fuzz.case import Case
    from tests.fuzz.generate import Builder, Tensor

MESH_SHAPES = {
    1: {1: [(1,)]},
    2: {1: [(2,)], 2: [(1, 2), (2, 1)], 3: [(1, 1, 2)]},
    4: {1: [(4,), (2,)], 2: [(2, 2), (1, 4), (4, 1), (1, 2)], 3: [(1, 2, 2), (2, 1, 2), (2, 2, 1)]},
    8: {
        1: [(8,), (4,)],
        2: [(2, 4), (4, 2), (2, 2), (1, 8)],
        3: [(2, 2, 2), (1, 2, 4), (2, 4, 1), (2, 1, 2)],
    },
}
PTYPES = ("mesh_x", "mesh_y", "mesh_z")
STYLES = {"block_outer": 0.6, "block_inner": 0.25, "cyclic_inner": 0.075, "cyclic_outer": 0.075}


@dataclass(frozen=True)
class MeshChoice:
    name: str
    shape: tuple[int, ...]
    devices: tuple[int, ...]

    def expression(self) -> str:
        if len(self.shape) == 1:
            return f"DeviceMesh({list(self.devices)})"
        nested: list = list(self.devices)
        for size in reversed(self.shape[1:]):
            nested = [nested[i : i + size] for i in range(0, len(nested), size)]
        return f"DeviceMesh(torch.tensor({nested}))"

    def axes(self) -> list[tuple[str, int]]:
        """(parallel type, size) of each mesh axis, mesh_x first."""
        return [(PTYPES[i], self.shape[-1 - i]) for i in range(len(self.shape))]


@dataclass
class Leaf:
    dim: int
    extent: int
    symbolic: bool
    ptype: str = "serial"


class Loop:
    """The frontend's loop domain of one tensor, mirrored: splits and parallelization.

    ``ragged``: symbolic leaves may be split by factors that do not divide them (the
    frontend cannot check that before the inputs bind them); ``features`` collects what
    such splits made.
    """

    def __init__(
        self,
        tensor: Tensor,
        rng: random.Random,
        ragged: bool = False,
        features: set[str] | None = None,
    ) -> None:
        self.name = tensor.name
        self.rng = rng
        self.ragged = ragged
        self.features = features if features is not None else set()
        self.leaves = [Leaf(i, a.extent, a.symbolic) for i, a in enumerate(tensor.axes)]

    def divides(self, index: int, factor: int) -> bool:
        """Whether leaf ``index`` splits into whole parts of ``factor``."""
        extent = self.leaves[index].extent
        return extent > 0 and extent % factor == 0

    def may_cut(self, index: int) -> bool:
        """Whether leaf ``index`` may be split by a factor that does not divide it."""
        return self.ragged and self.leaves[index].symbolic

    def split(self, index: int, factor: int, inner: bool) -> str:
        leaf = self.leaves[index]
        rest = leaf.extent // factor
        if inner:
            parts = [Leaf(leaf.dim, rest, leaf.symbolic), Leaf(leaf.dim, factor, False)]
        else:
            parts = [Leaf(leaf.dim, factor, False), Leaf(leaf.dim, rest, leaf.symbolic)]
        self.leaves[index : index + 1] = parts
        return f"{self.name}.{'inner' if inner else 'outer'}_split({index}, {factor})"

    def parallelize(self, index: int, ptype: str) -> str:
        self.leaves[index].ptype = ptype
        return f"{self.name}.axis({index}).parallelize(ParallelType.{ptype})"

    def shard(self, dim: int, ptype: str, size: int, style: str) -> tuple[str, ...] | None:
        """Puts mesh axis ``ptype`` (``size`` devices) on logical ``dim`` in ``style``."""
        candidates = [
            i
            for i, leaf in enumerate(self.leaves)
            if leaf.dim == dim
            and leaf.ptype == "serial"
            and (self.divides(i, size) or self.may_cut(i))
        ]
        if not candidates:
            return None
        index = self.rng.choice(candidates)
        extent = self.leaves[index].extent
        if not self.divides(index, size):  # factors that do not depend on the extent
            self.features.add("ragged_mesh")
            style = "block_outer" if style.startswith("block") else "cyclic_inner"
        elif self.may_cut(index) and extent == size:
            self.features.add("one_per_device")
        if style == "block_outer":
            return self.split(index, size, inner=False), self.parallelize(index, ptype)
        if style == "block_inner":
            return self.split(index, extent // size, inner=True), self.parallelize(index, ptype)
        if style == "cyclic_inner":
            return self.split(index, size, inner=True), self.parallelize(index + 1, ptype)
        return self.split(index, extent // size, inner=False), self.parallelize(index + 1, ptype)

    def stream(self, dim: int, chunks: int, swizzle: str | None) -> tuple[str, ...] | None:
        """Splits the outermost local part of ``dim`` into ``chunks`` stream chunks."""
        index = next(
            (i for i, leaf in enumerate(self.leaves) if leaf.dim == dim and leaf.ptype == "serial"),
            None,
        )
        if index is None:
            return None
        exact = self.divides(index, chunks)
        if not exact and not self.may_cut(index):
            return None
        if not exact:
            self.features.add("ragged_stream")
        extent = self.leaves[index].extent
        if exact and self.rng.random() < 0.1 and extent != chunks:  # the same, by an inner split
            lines = [self.split(index, extent // chunks, inner=True)]
        else:
            lines = [self.split(index, chunks, inner=False)]
        if swizzle is not None:
            lines.append(f"{self.name}.swizzle1d({index}, ParallelType.{swizzle})")
        lines.append(self.parallelize(index, "stream"))
        return tuple(lines)

    def reorder(self) -> tuple[str, ...] | None:
        order = list(range(len(self.leaves)))
        self.rng.shuffle(order)
        moves = {old: new for new, old in enumerate(order) if old != new}
        if not moves:
            return None
        leaves = list(self.leaves)
        for old, new in moves.items():
            leaves[new] = self.leaves[old]
        self.leaves = leaves
        return (f"{self.name}.reorder({moves})",)


def choose_mesh(rng: random.Random, world_size: int, name: str = "m0") -> MeshChoice:
    shapes = (
        MESH_SHAPES.get(world_size) or MESH_SHAPES[max(k for k in MESH_SHAPES if k <= world_size)]
    )
    ndim = rng.choice(sorted(shapes))
    full = [s for s in shapes[ndim] if _size(s) == world_size]
    shape = rng.choice(full if full and rng.random() < 0.8 else shapes[ndim])
    size = _size(shape)
    roll = rng.random()
    if roll < 0.55:
        devices = tuple(range(size))
    elif roll < 0.8:
        devices = tuple(rng.sample(range(world_size), size))
    else:
        devices = tuple(sorted(rng.sample(range(world_size), size)))
    return MeshChoice(name, shape, devices)


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def second_mesh(rng: random.Random, main: MeshChoice, world_size: int) -> MeshChoice:
    """Another mesh: disjoint of the same shape, one device, or the same devices reordered."""
    rest = [d for d in range(world_size) if d not in main.devices]
    roll = rng.random()
    if len(rest) >= len(main.devices) and roll < 0.6:
        return MeshChoice("m1", main.shape, tuple(rest[: len(main.devices)]))
    if roll < 0.8:
        return MeshChoice("m1", (1,), (rng.randrange(world_size),))
    return MeshChoice("m1", main.shape, tuple(rng.sample(main.devices, len(main.devices))))


def mesh_steps(
    loop: Loop, tensor: Tensor, mesh: MeshChoice, b: Builder, features: set[str]
) -> list[tuple[str, ...]]:
    """0 to 3 mesh axes of ``mesh`` on random dims of ``tensor`` (reductions too)."""
    rng = loop.rng
    axes = mesh.axes()
    count = min(rng.choices([0, 1, 2, 3], weights=[0.15, 0.45, 0.3, 0.1])[0], len(axes))
    data = [i for i, a in enumerate(tensor.axes) if not a.reduction]
    reductions = [i for i, a in enumerate(tensor.axes) if a.reduction]
    same_dim = rng.random() < 0.3
    steps, dims_used = [], []
    for ptype, size in rng.sample(axes, count):
        if same_dim and dims_used:
            dim = dims_used[-1]
        elif reductions and rng.random() < 0.35:
            dim = rng.choice(reductions)
        elif data:
            dim = rng.choice(data)
        else:
            continue
        style = rng.choices(list(STYLES), list(STYLES.values()))[0]
        step = loop.shard(dim, ptype, size, style)
        if step is None:
            continue
        steps.append(step)
        features.add("inner_split" if "inner_split" in step[0] else "outer_split")
        features.update({"cyclic"} if style.startswith("cyclic") and size > 1 else set())
        if dim in dims_used:
            features.add("multi_axis_dim")
        dims_used.append(dim)
        if tensor.axes[dim].reduction:
            features.add("partial")
        elif (tensor.name, data.index(dim)) in b.reduced:
            features.add("reduced_dim_sharded")
    return steps


def gather_steps(
    b: Builder, mesh: MeshChoice, src: str, dst: str, features: set[str]
) -> tuple[list, list] | None:
    """Schedules ``dst = set(src)`` as a stream all-gather of ``src``'s block-sharded dim."""
    rng = b.rng
    source, target = b.tensors[src], b.tensors[dst]
    axes = [(p, n) for p, n in mesh.axes() if n > 1]
    if not axes:
        return None
    ptype, size = rng.choice(axes)
    data = [i for i, a in enumerate(source.axes) if not a.reduction]
    dims = [d for d in range(len(data)) if source.axes[data[d]].extent % size == 0]
    if not dims:
        return None
    dim = rng.choice(dims)
    src_loop = Loop(source, rng, b.ragged, features)
    dst_loop = Loop(target, rng, b.ragged, features)
    src_steps = [(f"{src}.set_device_mesh({mesh.name})",)]
    dst_steps = [(f"{dst}.set_device_mesh({mesh.name})",)]
    src_steps.append(src_loop.shard(data[dim], ptype, size, "block_outer"))
    others = [(p, n) for p, n in mesh.axes() if p != ptype]
    if others and rng.random() < 0.4:  # another dim sharded alike on both sides
        other, other_size = rng.choice(others)
        rest = [d for d in range(len(data)) if d != dim and source.data[d].extent % other_size == 0]
        if rest:
            d = rng.choice(rest)
            src_steps.append(src_loop.shard(data[d], other, other_size, "block_outer"))
            dst_steps.append(dst_loop.shard(d, other, other_size, "block_outer"))
    swizzle = ptype if rng.random() < 0.5 else None
    stream = dst_loop.stream(dim, size, swizzle)
    if stream is None:
        return None
    dst_steps.append(stream)
    features.update({"gather_loop", "stream"} | ({"swizzle"} if swizzle else set()))
    return src_steps, dst_steps


def schedule_case(case: Case, b: Builder, rng: random.Random) -> Case:
    """``case`` with meshes, schedules and features drawn from ``rng``."""
    features = set(b.features)
    main = choose_mesh(rng, case.world_size)
    features.add(f"mesh{len(main.shape)}d")
    if len(main.devices) < case.world_size:
        features.add("subset")
    if list(main.devices) != sorted(main.devices):
        features.add("permuted")
    meshes = [main]
    if rng.random() < 0.1:
        meshes.append(second_mesh(rng, main, case.world_size))
    fixed: dict[str, list] = {}
    for src, dst in b.gathers:
        if src in fixed or dst in fixed or rng.random() < 0.5:
            continue
        made = gather_steps(b, main, src, dst, features)
        if made is not None:
            fixed[src], fixed[dst] = made
    names = [s.name for s in case.inputs if s.value is None] + [s.name for s in case.statements]
    stream_target = _stream_target(b, names, fixed, rng)
    schedules = []
    for name in names:
        if name in fixed:
            schedules.append((name, tuple(fixed[name])))
            continue
        steps = _tensor_steps(b, name, meshes, stream_target, features)
        if steps:
            schedules.append((name, tuple(steps)))
    schedules = _place_every_component(case, b, main, schedules, features)
    if len(meshes) > 1 and any(f"({meshes[1].name})" in s[0][0] for _, s in schedules):
        features.add("multi_mesh")
    return dataclasses.replace(
        case,
        meshes=tuple((m.name, m.expression()) for m in meshes),
        schedules=tuple(schedules),
        features=tuple(sorted(features)),
    )


def _place_every_component(case, b, main: MeshChoice, schedules: list, features) -> list:
    """``schedules`` with the first input of each group of connected tensors that has no
    mesh yet placed on ``main`` (propagation would have nothing to give them)."""
    names = [s.name for s in case.inputs if s.value is None] + [s.name for s in case.statements]
    placed = {name for name, steps in schedules if "set_device_mesh" in steps[0][0]}
    for component in _components(case):
        if placed & component:
            continue
        first = next(s.name for s in case.inputs if s.name in component and s.value is None)
        loop = Loop(b.tensors[first], b.rng, b.ragged, features)
        steps = [(f"{first}.set_device_mesh({main.name})",)]
        steps += mesh_steps(loop, b.tensors[first], main, b, features)
        schedules = [(first, tuple(steps))] + [s for s in schedules if s[0] != first]
    return sorted(schedules, key=lambda s: names.index(s[0]))


def _components(case: Case) -> list[set[str]]:
    """The tensors of ``case`` grouped by connection through ops."""
    group = {s.name: {s.name} for s in case.inputs}
    for statement in case.statements:
        merged = {statement.name}
        for name in statement.uses:
            merged |= group[name]
        for name in merged:
            group[name] = merged
    return list({id(g): g for g in group.values()}.values())


def _stream_target(b: Builder, names: list[str], fixed: dict, rng: random.Random):
    """(tensor, dim, chunks) to split into stream chunks, or None; a ragged case streams
    more often, a symbolic dim where it has one."""
    if rng.random() >= (0.6 if b.ragged else 0.25):
        return None
    candidates = [n for n in names if n not in fixed and b.tensors[n].data]
    if b.ragged:
        candidates = [n for n in candidates if _symbolic_dims(b.tensors[n])] or candidates
    if not candidates:
        return None
    name = rng.choice(candidates)
    tensor = b.tensors[name]
    data = [i for i, a in enumerate(tensor.axes) if not a.reduction]
    if b.ragged:
        data = _symbolic_dims(tensor) or data
    return name, rng.choice(data), rng.choice((2, 2, 4))


def _symbolic_dims(tensor: Tensor) -> list[int]:
    """The symbolic data dims of ``tensor`` (indices into its axes)."""
    return [i for i, a in enumerate(tensor.axes) if a.symbolic and not a.reduction]


def _tensor_steps(b, name, meshes, stream_target, features) -> list[tuple[str, ...]]:
    rng = b.rng
    tensor = b.tensors[name]
    user = rng.random() < (0.6 if tensor.is_input else 0.35)
    streamed = stream_target is not None and stream_target[0] == name
    if not user and not streamed:
        return []
    loop = Loop(tensor, rng, b.ragged, features)
    steps: list[tuple[str, ...]] = []
    if user:
        mesh = meshes[1] if len(meshes) > 1 and rng.random() < 0.3 else meshes[0]
        steps.append((f"{name}.set_device_mesh({mesh.name})",))
        steps += mesh_steps(loop, tensor, mesh, b, features)
    if streamed:
        _, dim, chunks = stream_target
        step = loop.stream(dim, chunks, None) or loop.stream(dim, 2, None)
        if step is not None:
            steps.append(step)
            features.update({"stream"} | (set() if user else {"stream_without_mesh"}))
    if user and rng.random() < 0.1:
        step = loop.reorder()
        if step is not None:
            steps.append(step)
            features.add("reorder")
    return steps
