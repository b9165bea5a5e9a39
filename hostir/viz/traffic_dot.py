"""The traffic picture of a host IR program as a graphviz digraph; nothing here renders or runs.

:func:`to_traffic_dot`, the *traffic view*: for one communication, or every
communication of one loop, the ranks as nodes (a ring per team group) and an
arrow per transfer, labelled and coloured by iteration. (The program view is
:func:`hostir.viz.dot.to_dot`.)

It returns a ``graphviz.Digraph``: render it with ``pipe(format="svg")`` or
``render(...)``. The picture names its layout engine (neato, for the fixed ring
positions) in its source, so ``dot -Tsvg`` draws it as well. Drawing is a pure
function of the program: the same program gives the same source.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import graphviz

from hostir.analysis.exchanges import exchange
from hostir.analysis.traffic import Occurrence, communications
from hostir.errors import HostIrError, SettingError
from hostir.ir.catalog import COMMUNICATING, declaration_of
from hostir.ir.container import HostIrContainer
from hostir.ir.instructions import ForLoop, Instruction, keyword
from hostir.ir.mesh_names import MeshNames, mesh_names
from hostir.ir.team import print_team
from hostir.text.printer import print_instruction
from hostir.viz.dot_style import FONT

ITERATION_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")
"""Arrow colours of the traffic view, one per iteration (cycled)."""

Iteration = tuple[tuple[str, int | range], ...]
"""The loop indices of one iteration, outer first: ``(("j0", 1),)``; a loop whose
communications do not read its index stands whole, as its range (every iteration moves
the same)."""

Transfer = tuple[int, int, str]
"""One arrow: sending rank, receiving rank, what moves."""


def to_traffic_dot(
    program: HostIrContainer,
    *,
    instruction_index: int | None = None,
    world_size: int | None = None,
) -> graphviz.Digraph:
    """The traffic view: who sends what to whom, per iteration.

    ``instruction_index`` picks a top-level instruction of ``program.body``: a
    communication, or a loop holding communications (default: the first one).
    Loop bounds must be constant; peers and roots are evaluated for each rank
    of the team's mesh at each iteration, up to hostir.analysis.traffic's
    MAX_COUNTED_ITERATIONS in all; past that, a loop whose communications do not read
    its index is drawn once, labelled with its whole range (``j0=0..999``), and
    one whose communications read it is refused by name. Ranks are ``0 .. world_size - 1``
    (default: every rank of the meshes involved). A transfer from a rank to
    itself (a CollectivePermute's local copy) is listed in the caption, not drawn.
    An ``instruction_index`` out of range, or one that communicates nothing, is a
    SettingError (a bad option: ``hostir viz --instruction K`` exits 2).
    """
    index = _select(program, instruction_index)
    meshes = mesh_names(program)
    steps = list(communications((program.body[index],), {}, first=index, each=True))
    if not steps:  # the caller's pick, as the index below: a bad option
        raise SettingError(
            f"instruction {index} has no communication to draw: "
            + print_instruction(program.body[index], meshes)[0]
        )
    ranks = _ranks([step.instruction for step in steps], world_size)
    arrows, local = _collect_transfers(steps)
    caption = _caption(program.body[index], [step.instruction for step in steps], local, meshes)
    graph = graphviz.Digraph(
        name="traffic",
        engine="neato",
        graph_attr={"layout": "neato", "splines": "line", "fontname": FONT},
        node_attr={"fontname": FONT, "fontsize": "11", "shape": "circle", "fixedsize": "true"},
        edge_attr={"fontname": FONT, "fontsize": "10", "arrowsize": "0.8"},
    )
    graph.attr(label=caption, labelloc="t", fontsize="13")
    positions = _draw_ranks(graph, steps[0].instruction.team.groups, ranks)  # type: ignore[attr-defined]
    order = list(dict.fromkeys(step.loops for step in steps))
    for (source, target, what), iterations in arrows.items():
        colours = [ITERATION_COLOURS[order.index(i) % len(ITERATION_COLOURS)] for i in iterations]
        tail, head = _ports(positions[source], positions[target])
        graph.edge(
            f"rank{source}:{tail}",
            f"rank{target}:{head}",
            label=_label_of(iterations, what),
            color=":".join(colours),
            fontcolor=colours[0] if len(set(colours)) == 1 else "black",
        )
    return graph


def _collect_transfers(
    steps: list[Occurrence],
) -> tuple[dict[Transfer, list[Iteration]], list[Iteration]]:
    """The iterations of each distinct transfer, and the iterations with local copies."""
    arrows: dict[Transfer, list[Iteration]] = {}
    local: list[Iteration] = []
    for step in steps:
        iteration = step.loops
        for source, target, what in _transfers(step.instruction, step.env):
            if source != target:
                arrows.setdefault((source, target, what), []).append(iteration)
            elif iteration not in local:
                local.append(iteration)
    return arrows, local


def _select(program: HostIrContainer, instruction_index: int | None) -> int:
    if instruction_index is None:
        for index, instruction in enumerate(program.body):
            if _communicates(instruction):
                return index
        raise HostIrError("the program has no communication to draw")
    if not 0 <= instruction_index < len(program.body):
        raise SettingError(
            f"instruction index {instruction_index} is out of range: the program body has "
            f"{len(program.body)} top-level instructions"
        )
    return instruction_index


def _communicates(instruction: Instruction) -> bool:
    """Whether ``instruction`` is a communication or a loop holding one."""
    if isinstance(instruction, ForLoop):
        return any(_communicates(inner) for inner in instruction.body)
    return declaration_of(type(instruction)).kind in COMMUNICATING


def _ranks(communications: list[Instruction], world_size: int | None) -> list[int]:
    devices = sorted({d for c in communications for d in c.team.mesh.devices})  # type: ignore[union-attr]
    if world_size is None:
        return devices
    if devices and devices[-1] >= world_size:
        raise HostIrError(f"device {devices[-1]} is not in a world of {world_size} ranks")
    return list(range(world_size))


def _transfers(instruction: Instruction, env: Mapping[str, int]) -> list[Transfer]:
    """The transfers of one communication at one iteration, group by group, from its
    exchange function (:mod:`hostir.analysis.exchanges`); a local copy is a rank's transfer to
    itself."""
    transfers: list[Transfer] = []
    for group in instruction.team.groups:  # type: ignore[union-attr]
        for flow in exchange(instruction, group, env):
            if flow.local_copy:
                transfers.append((flow.sources[0], flow.sources[0], flow.what))
            transfers.extend((s, d, flow.what) for s, d in flow.transfers())
    return transfers


def _caption(
    selected: Instruction,
    communications: list[Instruction],
    local: list[Iteration],
    meshes: MeshNames,
) -> str:
    lines = []
    if isinstance(selected, ForLoop):
        lines.append(print_instruction(selected, meshes)[0].removesuffix(" {"))
    for c in dict.fromkeys(communications):
        team = print_team(c.team, meshes.name)  # type: ignore[union-attr]
        lines.append(f"{keyword(c)}  team={team}: {c.src.name} -> {c.out.name}")  # type: ignore[union-attr]
    if local:
        at = _iterations_text(local)
        lines.append("local copies, not drawn" + (f": {at}" if at else ""))
    return "".join(line + "\\n" for line in lines)


def _iterations_text(iterations: list[Iteration]) -> str:
    """``j0=1`` for one iteration, ``j0=0,1,2`` for several of one loop, ``j0=0..7`` for
    a loop that stands whole."""
    names = {tuple(name for name, _ in i) for i in iterations}
    if len(names) == 1 and len(next(iter(names))) == 1:
        name = iterations[0][0][0]
        return f"{name}=" + ",".join(_value_text(i[0][1]) for i in iterations)
    return "; ".join(" ".join(f"{n}={_value_text(v)}" for n, v in i) for i in iterations)


def _value_text(value: int | range) -> str:
    """A loop index's value, or its whole range as ``first..last``."""
    return f"{value.start}..{value.stop - 1}" if isinstance(value, range) else str(value)


def _label_of(iterations: list[Iteration], what: str) -> str:
    text = _iterations_text(iterations)
    return f"{text}: {what}" if text else what


def _draw_ranks(
    graph: graphviz.Digraph, groups: tuple[tuple[int, ...], ...], ranks: list[int]
) -> dict[int, tuple[float, float]]:
    """A ring of rank nodes per group (clockwise from the top, in group order), side by
    side; ranks in no group in a row below. Returns each rank's position in inches."""
    radius = max(1.0, 0.4 * max(len(g) for g in groups))
    positions: dict[int, tuple[float, float]] = {}
    for k, group in enumerate(groups):
        centre = k * (2 * radius + 1.6)
        with graph.subgraph(name=f"cluster_group{k}") as cluster:
            cluster.attr(label="", style="rounded,dashed", color="gray60")
            for p, rank in enumerate(group):
                angle = math.radians(90 - 360 * p / len(group))
                positions[rank] = (centre + radius * math.cos(angle), radius * math.sin(angle))
                _rank_node(cluster, rank, positions[rank])
            members = " ".join(str(r) for r in group)
            cluster.node(
                f"group{k}",
                label=f"group ({members})",
                shape="plaintext",
                fixedsize="false",
                pos=_pos((centre, -radius - 0.75)),
            )
    others = [r for r in ranks if r not in positions]
    for k, rank in enumerate(others):
        positions[rank] = (k * 1.2, -radius - 1.9)
        _rank_node(graph, rank, positions[rank], fillcolor="gray92")
    return positions


def _rank_node(
    graph: graphviz.Digraph, rank: int, position: tuple[float, float], fillcolor: str = "white"
) -> None:
    graph.node(
        f"rank{rank}",
        label=f"rank {rank}",
        pos=_pos(position),
        width="0.75",
        style="filled",
        fillcolor=fillcolor,
    )


def _pos(position: tuple[float, float]) -> str:
    """A pinned neato position in inches (``-0.00`` printed as ``0.00``)."""
    return ",".join(f"{round(c, 2) + 0.0:.2f}" for c in position) + "!"


_COMPASS = ("e", "ne", "n", "nw", "w", "sw", "s", "se")


def _ports(source: tuple[float, float], target: tuple[float, float]) -> tuple[str, str]:
    """Compass ports that shift an arrow to the right of its direction, so that the
    arrows a -> b and b -> a run side by side instead of on top of each other."""
    direction = math.degrees(math.atan2(target[1] - source[1], target[0] - source[0]))

    def compass(angle: float) -> str:
        return _COMPASS[round((angle % 360) / 45) % 8]

    return compass(direction - 45), compass(direction - 135)
