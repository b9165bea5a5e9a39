"""Pictures of host IR programs as graphviz digraphs; nothing here renders or runs.

- :func:`to_dot`, the *program view*: one node per instruction in program
  order, loops as clusters, the stream an instruction runs on as its fill
  colour, communications as distinct shapes labelled with kind and team, and
  data dependencies as edges (from the instruction that defines or last wrote a
  tensor or request to the instructions that use it).
- :func:`to_traffic_dot`, the *traffic view*: for one communication, or every
  communication of one loop, the ranks as nodes (a ring per team group) and an
  arrow per transfer, labelled and coloured by iteration.

Both return a ``graphviz.Digraph``: render it with ``pipe(format="svg")`` or
``render(...)``. The traffic view names its layout engine (neato, for the fixed
ring positions) in its source, so ``dot -Tsvg`` draws it as well. Drawing is a
pure function of the program: the same program gives the same source.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import graphviz

from hostir.blocks import Operand, all_to_all_v_pieces, print_box
from hostir.communications import (
    COLLECTIVES,
    Allgather,
    Allreduce,
    AllToAll,
    AllToAllV,
    Broadcast,
    CollectivePermute,
    Gather,
    Reduce,
    ReduceScatter,
    Scatter,
    SendRecv,
    Wait,
)
from hostir.container import HostIrContainer
from hostir.errors import HostIrError
from hostir.instructions import (
    Allocate,
    Deallocate,
    ForLoop,
    Instruction,
    ShardByStream,
    defined_values,
    keyword,
    used_values,
)
from hostir.printer import _MeshNames, print_declaration, print_instruction, print_team
from hostir.printer import print_stream as _print_stream
from hostir.scalars import RANK, Scalar, evaluate_scalar
from hostir.streams import GetCurrentStream, SetCurrentStream, Synchronize
from hostir.values import RequestValue

FONT = "Helvetica"
CODE_FONT = "Courier"
WRAP = 46
"""Characters per line of an instruction's label before it is wrapped."""

STREAM_COLOURS = ("#e6e6e6", "#cfe2ff", "#ffdfb0", "#cdeccd", "#f5cfe0", "#e2d6f5", "#fff0a0")
"""Fill colours of streams, in order of first appearance (``main`` is usually first)."""

ITERATION_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")
"""Arrow colours of the traffic view, one per iteration (cycled)."""

_P2P = frozenset({CollectivePermute, SendRecv})
_SHAPES: dict[type, str] = {
    **{cls: "hexagon" for cls in COLLECTIVES - _P2P},
    **{cls: "cds" for cls in _P2P},
    Wait: "octagon",
}
"""Node shape by instruction class; anything else is a box."""

_STYLES: dict[type, str] = {
    **{cls: "filled,bold" for cls in COLLECTIVES | {Wait}},
    **{cls: "filled,dashed" for cls in (Allocate, Deallocate, ShardByStream)},
    **{cls: "filled,dotted" for cls in (GetCurrentStream, SetCurrentStream, Synchronize)},
}
"""Node style by instruction class; anything else (compute) is a filled rounded box."""

_LEGEND_SHAPES = (("hexagon", "collective"), ("cds", "permute / send-recv"), ("octagon", "wait"))

# ---------------------------------------------------------------------------
# The program view


@dataclass
class _ProgramDrawing:
    """What the walk over the program has seen so far."""

    meshes: _MeshNames = field(default_factory=_MeshNames)
    stream: str = "main"
    colours: dict[str, str] = field(default_factory=dict)
    writers: dict[str, str] = field(default_factory=dict)  # value name -> node id
    buffers: dict[str, str] = field(default_factory=dict)  # alias name -> buffer name
    order: list[str] = field(default_factory=list)  # instruction node ids, in order
    edges: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    loops: int = 0

    def colour(self, stream: str) -> str:
        if stream not in self.colours:
            self.colours[stream] = STREAM_COLOURS[len(self.colours) % len(STREAM_COLOURS)]
        return self.colours[stream]


def to_dot(program: HostIrContainer, *, title: str | None = None) -> graphviz.Digraph:
    """The program view of ``program``: see the module docstring."""
    graph = graphviz.Digraph(
        name="program",
        graph_attr={"fontname": FONT, "nodesep": "0.3", "ranksep": "0.25"},
        node_attr={"fontname": CODE_FONT, "fontsize": "10"},
        edge_attr={"fontname": FONT, "fontsize": "8", "arrowsize": "0.6", "color": "gray35"},
    )
    if title is not None:
        graph.attr(label=title, labelloc="t", fontsize="16")
    drawing = _ProgramDrawing()
    drawing.colour("main")
    with graph.subgraph(name="inputs") as inputs:
        inputs.attr(rank="source")
        for k, value in enumerate(program.inputs):
            declaration = print_declaration(value, drawing.meshes).replace(" @", "\\l    @", 1)
            label = f"input {declaration}\\l"
            inputs.node(f"in{k}", label=label, shape="note", style="filled", fillcolor="white")
            drawing.writers[value.name] = f"in{k}"
    for k in range(1, len(program.inputs)):
        graph.edge(f"in{k - 1}", f"in{k}", style="invis")  # inputs left to right, in order
    _draw_body(graph, program.body, drawing)
    with graph.subgraph(name="outputs") as outputs:
        outputs.attr(rank="sink")
        for k, value in enumerate(program.outputs):
            outputs.node(f"out{k}", label=f"output {value.name}", shape="note")
            _add_use(drawing, value.name, f"out{k}", {"label": value.name})
    chain = [f"in{len(program.inputs) - 1}"] * bool(program.inputs) + drawing.order
    chain += ["out0"] * bool(program.outputs)
    for before, after in zip(chain, chain[1:], strict=False):
        graph.edge(before, after, style="invis", weight="20")  # keeps program order
    for tail, head, attributes in drawing.edges:
        graph.edge(tail, head, **attributes)
    _draw_legend(graph, drawing.colours)
    return graph


def _draw_body(
    graph: graphviz.Digraph, body: tuple[Instruction, ...], drawing: _ProgramDrawing
) -> None:
    for instruction in body:
        if isinstance(instruction, ForLoop):
            _draw_loop(graph, instruction, drawing)
        else:
            _draw_instruction(graph, instruction, drawing)


def _draw_loop(graph: graphviz.Digraph, loop: ForLoop, drawing: _ProgramDrawing) -> None:
    header = print_instruction(loop, drawing.meshes)[0].removesuffix(" {")
    drawing.loops += 1
    with graph.subgraph(name=f"cluster_loop{drawing.loops}") as cluster:
        cluster.attr(label=header, labeljust="l", fontname=CODE_FONT, fontsize="11")
        cluster.attr(style="rounded", color="gray45", penwidth="1.5")
        _draw_body(cluster, loop.body, drawing)


def _draw_instruction(
    graph: graphviz.Digraph, instruction: Instruction, drawing: _ProgramDrawing
) -> None:
    if isinstance(instruction, SetCurrentStream):
        drawing.stream = _print_stream(instruction.stream, drawing.meshes)
    node = f"i{len(drawing.order)}"
    drawing.order.append(node)
    cls = type(instruction)
    graph.node(
        node,
        label=instruction_label(instruction, drawing.meshes),
        shape=_SHAPES.get(cls, "box"),
        style=_STYLES.get(cls, "filled,rounded"),
        fillcolor=drawing.colour(drawing.stream),
        penwidth="2" if cls in _SHAPES else "1",
        margin="0.3,0.1" if cls in _SHAPES else "0.12,0.04",
    )
    for value in used_values(instruction):
        attributes = {"label": value.name}
        if isinstance(value, RequestValue):
            attributes["style"] = "dashed"
        if isinstance(instruction, Deallocate):
            attributes.update(style="dotted", color="gray65", fontcolor="gray50")
        _add_use(drawing, value.name, node, attributes)
    for value in defined_values(instruction):
        drawing.writers[value.name] = node
    if getattr(instruction, "preallocated", False):  # a write into an existing buffer
        out = instruction.out.name  # type: ignore[union-attr]
        drawing.writers[out] = node
        drawing.writers[drawing.buffers.get(out, out)] = node
    if isinstance(instruction, ShardByStream):
        drawing.buffers[instruction.out.name] = drawing.buffers.get(
            instruction.src.name, instruction.src.name
        )


def _add_use(drawing: _ProgramDrawing, name: str, node: str, attributes: dict[str, str]) -> None:
    writer = drawing.writers.get(name)
    if writer is not None:
        drawing.edges.append((writer, node, attributes))


def instruction_label(instruction: Instruction, meshes: _MeshNames) -> str:
    """The node label of ``instruction``: its printed line, wrapped and left-justified;
    a communication's first line is its kind and team (``Allgather  team=M0(x)``)."""
    lines = wrap(print_instruction(instruction, meshes)[0])
    label = "".join(line + "\\l" for line in lines)
    team = getattr(instruction, "team", None)
    if team is not None:
        label = f"{keyword(instruction)}  team={print_team(team, meshes)}\\n" + label
    return label


def wrap(line: str, width: int = WRAP) -> list[str]:
    """``line`` cut after ``, `` or ``= `` outside brackets (inside at most one pair of
    parentheses) into lines of about ``width`` characters; continuations indented."""
    pieces, start, parens, brackets = [], 0, 0, 0
    for i, char in enumerate(line):
        parens += {"(": 1, ")": -1}.get(char, 0)
        brackets += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == " " and i > 0 and line[i - 1] in ",=" and brackets == 0 and parens <= 1:
            pieces.append(line[start : i + 1])
            start = i + 1
    pieces.append(line[start:])
    lines = [""]
    for piece in pieces:
        if lines[-1].strip() and len(lines[-1]) + len(piece.rstrip()) > width:
            lines.append("    ")
        lines[-1] += piece
    return [text.rstrip() for text in lines]


def _draw_legend(graph: graphviz.Digraph, colours: Mapping[str, str]) -> None:
    with graph.subgraph(name="cluster_legend") as legend:
        legend.attr(label="legend", fontname=FONT, fontsize="10", style="rounded", color="gray70")
        legend.attr("node", fontname=FONT, fontsize="9", width="1.6", height="0.3")
        names = []
        for k, (stream, colour) in enumerate(colours.items()):
            names.append(f"legend_stream{k}")
            legend.node(names[-1], label=stream, shape="box", style="filled", fillcolor=colour)
        for k, (shape, label) in enumerate(_LEGEND_SHAPES):
            names.append(f"legend_shape{k}")
            legend.node(names[-1], label=label, shape=shape, style="filled", fillcolor="white")
        for before, after in zip(names, names[1:], strict=False):
            legend.edge(before, after, style="invis")


# ---------------------------------------------------------------------------
# The traffic view

Iteration = tuple[tuple[str, int], ...]
"""The loop indices of one iteration, outer first: ``(("j0", 1),)``."""

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
    of the team's mesh at each iteration. Ranks are ``0 .. world_size - 1``
    (default: every rank of the meshes involved). A transfer from a rank to
    itself (a CollectivePermute's local copy) is listed in the caption, not drawn.
    """
    index = _select(program, instruction_index)
    meshes = _mesh_names(program)
    steps = list(_communications((program.body[index],), {}))
    if not steps:
        raise HostIrError(
            f"instruction {index} has no communication to draw: "
            + print_instruction(program.body[index], meshes)[0]
        )
    ranks = _ranks([instruction for instruction, _ in steps], world_size)
    arrows, local = _collect_transfers(steps)
    caption = _caption(program.body[index], [i for i, _ in steps], local, meshes)
    graph = graphviz.Digraph(
        name="traffic",
        engine="neato",
        graph_attr={"layout": "neato", "splines": "line", "fontname": FONT},
        node_attr={"fontname": FONT, "fontsize": "11", "shape": "circle", "fixedsize": "true"},
        edge_attr={"fontname": FONT, "fontsize": "10", "arrowsize": "0.8"},
    )
    graph.attr(label=caption, labelloc="t", fontsize="13")
    positions = _draw_ranks(graph, steps[0][0].team.groups, ranks)  # type: ignore[union-attr]
    order = list(dict.fromkeys(iteration for _, iteration in steps))
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
    steps: list[tuple[Instruction, Iteration]],
) -> tuple[dict[Transfer, list[Iteration]], list[Iteration]]:
    """The iterations of each distinct transfer, and the iterations with local copies."""
    arrows: dict[Transfer, list[Iteration]] = {}
    local: list[Iteration] = []
    for instruction, iteration in steps:
        for source, target, what in _transfers(instruction, dict(iteration)):
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
        raise HostIrError(
            f"instruction index {instruction_index} is out of range: the program body has "
            f"{len(program.body)} top-level instructions"
        )
    return instruction_index


def _mesh_names(program: HostIrContainer) -> _MeshNames:
    """Mesh names as the printer assigns them (``M0``, ``M1``, ... by first appearance)."""
    meshes = _MeshNames()
    for value in program.inputs:
        print_declaration(value, meshes)
    for instruction in program.body:
        print_instruction(instruction, meshes)
    return meshes


def _communicates(instruction: Instruction) -> bool:
    """Whether ``instruction`` is a communication or a loop holding one."""
    if isinstance(instruction, ForLoop):
        return any(_communicates(inner) for inner in instruction.body)
    return type(instruction) in COLLECTIVES


def _communications(
    body: tuple[Instruction, ...], env: Mapping[str, int]
) -> Iterator[tuple[Instruction, Iteration]]:
    """Each communication of ``body`` with the loop indices of each of its iterations."""
    for instruction in body:
        if type(instruction) in COLLECTIVES:
            yield instruction, tuple(env.items())
        elif isinstance(instruction, ForLoop):
            name = instruction.index.name
            for value in _loop_range(instruction, env):
                yield from _communications(instruction.body, {**env, name: value})


def _loop_range(loop: ForLoop, env: Mapping[str, int]) -> range:
    try:
        return range(int(evaluate_scalar(loop.start, env)), int(evaluate_scalar(loop.stop, env)))
    except HostIrError as error:
        raise HostIrError(
            f"loop {loop.index.name} needs constant bounds to draw its traffic: {error}"
        ) from None


def _ranks(communications: list[Instruction], world_size: int | None) -> list[int]:
    devices = sorted({d for c in communications for d in c.team.mesh.devices})  # type: ignore[union-attr]
    if world_size is None:
        return devices
    if devices and devices[-1] >= world_size:
        raise HostIrError(f"device {devices[-1]} is not in a world of {world_size} ranks")
    return list(range(world_size))


def _position(expr: Scalar, member: int, env: Mapping[str, int], group: tuple[int, ...]) -> int:
    """Group member at position ``expr``, evaluated on rank ``member``."""
    position = int(evaluate_scalar(expr, {**env, RANK: member}))
    if not 0 <= position < len(group):
        raise HostIrError(f"position {position} is outside the group {list(group)}")
    return group[position]


def _permute(c: CollectivePermute, group: tuple[int, ...], env: Mapping[str, int]):
    return [(r, _position(c.send_peer, r, env, group), c.src.name) for r in group]


def _send_recv(c: SendRecv, group: tuple[int, ...], env: Mapping[str, int]):
    member = group[0]
    sender, receiver = (_position(p, member, env, group) for p in (c.sender, c.receiver))
    return [(sender, receiver, c.src.name)]


def _from_root(c: Broadcast | Scatter, group: tuple[int, ...], env: Mapping[str, int]):
    root = _position(c.root, group[0], env, group)
    chunk = isinstance(c, Scatter)
    return [
        (root, r, c.src.name + (f" chunk {p}" if chunk else ""))
        for p, r in enumerate(group)
        if r != root
    ]


def _to_root(c: Gather | Reduce, group: tuple[int, ...], env: Mapping[str, int]):
    root = _position(c.root, group[0], env, group)
    what = c.src.name + (f" ({c.op.value})" if isinstance(c, Reduce) else "")
    return [(r, root, what) for r in group if r != root]


def _all_pairs(c: Instruction, group: tuple[int, ...], env: Mapping[str, int]):
    """Every member to every other: whole ``src`` (Allgather), a reduction (Allreduce),
    or chunk ``p`` of ``src`` to the member at position ``p`` (AllToAll, ReduceScatter).
    What a member keeps of its own ``src`` is not a transfer."""
    name = c.src.name  # type: ignore[union-attr]
    op = getattr(c, "op", None)
    chunked = isinstance(c, AllToAll | ReduceScatter)
    suffix = f" ({op.value})" if op is not None and not chunked else ""
    return [
        (r, q, name + (f" chunk {p}" if chunked else "") + suffix)
        for r in group
        for p, q in enumerate(group)
        if q != r
    ]


def _pieces(c: AllToAllV, group: tuple[int, ...], env: Mapping[str, int]):
    """The boxes an AllToAllV moves (``T0 [0:4, 2:4]``); every pair when its shapes are
    not constant, since the pattern needs the global extents."""
    if c.src.sharding is None or c.out.sharding is None:
        return _all_pairs(c, group, env)
    try:
        src, out = (
            Operand(v.name, v.sharding, tuple(int(evaluate_scalar(e, env)) for e in v.shape))
            for v in (c.src, c.out)
        )
        pattern = all_to_all_v_pieces(src, out, c.team, group, c.op is not None)
    except HostIrError:
        return _all_pairs(c, group, env)
    suffix = f" ({c.op.value})" if c.op is not None else ""
    return [
        (group[p.source], group[p.destination], f"{c.src.name} {print_box(p.box)}{suffix}")
        for p in pattern.pieces
    ]


_TRAFFIC: dict[type, Callable[..., list[Transfer]]] = {
    CollectivePermute: _permute,
    SendRecv: _send_recv,
    Broadcast: _from_root,
    Scatter: _from_root,
    Gather: _to_root,
    Reduce: _to_root,
    Allgather: _all_pairs,
    AllToAll: _all_pairs,
    AllToAllV: _pieces,
    Allreduce: _all_pairs,
    ReduceScatter: _all_pairs,
}
"""Who sends what to whom, by communication class, within one group of its team."""


def _transfers(instruction: Instruction, env: Mapping[str, int]) -> list[Transfer]:
    """The transfers of one communication at one iteration, group by group."""
    traffic = _TRAFFIC[type(instruction)]
    return [t for g in instruction.team.groups for t in traffic(instruction, g, env)]  # type: ignore[union-attr]


def _caption(
    selected: Instruction,
    communications: list[Instruction],
    local: list[Iteration],
    meshes: _MeshNames,
) -> str:
    lines = []
    if isinstance(selected, ForLoop):
        lines.append(print_instruction(selected, meshes)[0].removesuffix(" {"))
    for c in dict.fromkeys(communications):
        team = print_team(c.team, meshes)  # type: ignore[union-attr]
        lines.append(f"{keyword(c)}  team={team}: {c.src.name} -> {c.out.name}")  # type: ignore[union-attr]
    if local:
        at = _iterations_text(local)
        lines.append("local copies, not drawn" + (f": {at}" if at else ""))
    return "".join(line + "\\n" for line in lines)


def _iterations_text(iterations: list[Iteration]) -> str:
    """``j0=1`` for one iteration, ``j0=0,1,2`` for several of one loop."""
    names = {tuple(name for name, _ in i) for i in iterations}
    if len(names) == 1 and len(next(iter(names))) == 1:
        name = iterations[0][0][0]
        return f"{name}=" + ",".join(str(i[0][1]) for i in iterations)
    return "; ".join(" ".join(f"{n}={v}" for n, v in i) for i in iterations)


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
