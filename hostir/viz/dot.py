"""The program picture of a host IR program as a graphviz digraph; nothing here renders or runs.

:func:`to_dot`, the *program view*: one node per instruction in program order,
loops as clusters, the stream an instruction runs on as its fill colour,
communications as distinct shapes labelled with kind and team, and data
dependencies as edges (from the instruction that defines or last wrote a tensor
or request to the instructions that use it).

The *traffic view* (rank-to-rank arrows per iteration) lives in
:mod:`hostir.viz.traffic_dot`; :func:`to_traffic_dot` is importable from here too.
Both return a ``graphviz.Digraph``: render it with ``pipe(format="svg")`` or
``render(...)``. Drawing is a pure function of the program: the same program
gives the same source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import graphviz

from hostir.ir.catalog import Kind, declaration_of
from hostir.ir.communications import Wait
from hostir.ir.container import HostIrContainer
from hostir.ir.instructions import (
    Deallocate,
    ForLoop,
    Instruction,
    ShardByStream,
    defined_values,
    keyword,
    used_values,
)
from hostir.ir.mesh_names import MeshNames
from hostir.ir.streams import SetCurrentStream
from hostir.ir.team import print_team
from hostir.ir.values import RequestValue
from hostir.text.printer import print_declaration, print_instruction
from hostir.text.printer import print_stream as _print_stream
from hostir.viz.dot_style import CODE_FONT, FONT
from hostir.viz.traffic_dot import ITERATION_COLOURS as ITERATION_COLOURS  # re-exported
from hostir.viz.traffic_dot import to_traffic_dot as to_traffic_dot  # re-exported

WRAP = 46
"""Characters per line of an instruction's label before it is wrapped."""

STREAM_COLOURS = ("#e6e6e6", "#cfe2ff", "#ffdfb0", "#cdeccd", "#f5cfe0", "#e2d6f5", "#fff0a0")
"""Fill colours of streams, in order of first appearance (``main`` is usually first)."""

_SHAPES: dict[Kind, str] = {
    Kind.COLLECTIVE: "hexagon",
    Kind.POINT_TO_POINT: "cds",
    Kind.HOST_SYNC: "invhouse",
}
"""Node shape by the kind an instruction is declared with (waits are octagons); anything
else is a box."""

_STYLES: dict[Kind, str] = {
    Kind.COLLECTIVE: "filled,bold",
    Kind.POINT_TO_POINT: "filled,bold",
    Kind.MEMORY: "filled,dashed",
    Kind.STREAM: "filled,dotted",
    Kind.HOST_SYNC: "filled,bold",
}
"""Node style by kind; anything else (compute) is a filled rounded box."""


def _shape(instruction: Instruction) -> str | None:
    if isinstance(instruction, Wait):
        return "octagon"
    return _SHAPES.get(declaration_of(type(instruction)).kind)


def _style(instruction: Instruction) -> str:
    if isinstance(instruction, Wait):
        return "filled,bold"
    return _STYLES.get(declaration_of(type(instruction)).kind, "filled,rounded")


_LEGEND_SHAPES = (
    ("hexagon", "collective"),
    ("cds", "permute / send-recv"),
    ("octagon", "wait"),
    ("invhouse", "to_host (device-to-host sync)"),
)


@dataclass
class _ProgramDrawing:
    """What the walk over the program has seen so far."""

    meshes: MeshNames = field(default_factory=MeshNames)
    stream: str = "main"
    colours: dict[str, str] = field(default_factory=dict)
    writers: dict[str, str] = field(default_factory=dict)  # value name -> node id
    buffers: dict[str, str] = field(default_factory=dict)  # alias name -> buffer name
    order: list[str] = field(default_factory=list)  # instruction node ids, in order
    edges: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    loops: int = 0

    def colour(self, stream: str) -> str:
        """The fill colour of ``stream``, assigned on its first appearance."""
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
    shape = _shape(instruction)
    graph.node(
        node,
        label=instruction_label(instruction, drawing.meshes),
        shape=shape or "box",
        style=_style(instruction),
        fillcolor=drawing.colour(drawing.stream),
        penwidth="2" if shape else "1",
        margin="0.3,0.1" if shape else "0.12,0.04",
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


def instruction_label(instruction: Instruction, meshes: MeshNames) -> str:
    """The node label of ``instruction``: its printed line, wrapped and left-justified;
    a communication's first line is its kind and team (``Allgather  team=M0(x)``)."""
    lines = wrap(print_instruction(instruction, meshes)[0])
    label = "".join(line + "\\l" for line in lines)
    team = getattr(instruction, "team", None)
    if team is not None:
        label = f"{keyword(instruction)}  team={print_team(team, meshes.name)}\\n" + label
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
