"""Pictures: the program view and the traffic view of lowered programs.

Programs come from fusions lowered in this process (``fd.host_ir()`` needs no
running ranks). Every picture must be accepted by graphviz's ``dot -Tsvg``; the
DOT source is read back to check nodes, clusters, shapes, colours and edges.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType
from hostir import ForLoop, HostIrContainer, HostIrError, parse, to_dot, to_traffic_dot
from hostir.ir.communications import COLLECTIVES

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is missing")

# ---------------------------------------------------------------------------
# Fusions (from tests/lowering/test_stream_loops.py and test_communication.py)


def shard(tv, mesh: DeviceMesh, dim: int, parallel_type=ParallelType.mesh_x) -> None:
    """Places ``tv`` on ``mesh`` (if not yet) and block-shards ``dim`` over the axis."""
    if tv.device_mesh is None:
        tv.set_device_mesh(mesh)
    tv.outer_split(dim, mesh.axis_size(parallel_type))
    tv.axis(dim).parallelize(parallel_type)


def column_parallel(d: int, swizzle: bool) -> HostIrContainer:
    """An all-gather, one chunk per iteration, feeding a column-parallel linear."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((-1, 8))
        w = fd.define_tensor((4 * d, 8))
        ag = fd.ops.set(inp)
        fd.add_output(fd.ops.linear(ag, w))
    for tv in (inp, w):
        shard(tv, mesh, 0)
    ag.set_device_mesh(mesh)
    ag.outer_split(0, d)
    if swizzle:
        ag.swizzle1d(0, ParallelType.mesh_x)
    ag.axis(0).parallelize(ParallelType.stream)
    return fd.host_ir()


def row_parallel(d: int, streams: int) -> HostIrContainer:
    """``x @ w.T`` with the contraction over mesh_x and the tokens in stream chunks."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 16 * d))
        w = fd.define_tensor((4, 16 * d))
        y = fd.ops.linear(x, w)
        fd.add_output(y)
    for tv in (x, w):
        shard(tv, mesh, 1)
    for tv in (x, y):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, streams)
        tv.axis(0).parallelize(ParallelType.stream)
    return fd.host_ir()


def data_and_tensor_parallel_mlp() -> HostIrContainer:
    """Tokens over mesh_y, hidden features over mesh_x of a 2x2 mesh: one Allreduce."""
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 8))
        w1 = fd.define_tensor((16, 8))
        w2 = fd.define_tensor((8, 16))
        fd.add_output(fd.ops.linear(fd.ops.relu(fd.ops.linear(x, w1)), w2))
    shard(x, mesh, 0, ParallelType.mesh_y)
    shard(w1, mesh, 0)
    shard(w2, mesh, 1)
    return fd.host_ir()


def resharding(src_mesh, dst_mesh, src_dim: int | None, dst_dim: int | None) -> HostIrContainer:
    """``set`` from a tensor on ``src_mesh`` to one on ``dst_mesh`` (dims sharded or None)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 4))
        y = fd.ops.set(x)
        fd.add_output(y)
    x.set_device_mesh(src_mesh)
    y.set_device_mesh(dst_mesh)
    if src_dim is not None:
        shard(x, src_mesh, src_dim)
    if dst_dim is not None:
        shard(y, dst_mesh, dst_dim)
    return fd.host_ir()


def reduce_to_one_device() -> HostIrContainer:
    """A sum over the sharded dim lands on device 0 only: one Reduce."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 3))
        s = fd.ops.sum(x, [0])
        fd.add_output(s)
    shard(x, DeviceMesh([0, 1, 2, 3]), 0)
    s.set_device_mesh(DeviceMesh([0]))
    return fd.host_ir()


NESTED = """%HostIrContainer {
  mesh M0 = [4] : [1]
  input T0 : float32[8, 4] @M0 {0: [x, 2]}
  for j0 in range(0, 2) {
    for j1 in range(1, 3) {
      T1 : float32[8, 4] @M0 {0: [x, 2]}, R0 = CollectivePermute(T0, team=M0(x), \
send_peer=(coord(M0, x) + j0 + j1) % 4, recv_peer=(coord(M0, x) - j0 - j1) % 4)
      wait R0
      deallocate T1
    }
  }
  output T0
}
"""

PROGRAMS = {
    "permute-d4": lambda: column_parallel(4, swizzle=True),
    "broadcast-d4": lambda: column_parallel(4, swizzle=False),
    "permute-d2": lambda: column_parallel(2, swizzle=True),
    "row-parallel-d2": lambda: row_parallel(2, streams=3),
    "mlp-2x2": data_and_tensor_parallel_mlp,
    "allgather": lambda: resharding(DeviceMesh([0, 1, 2, 3]), DeviceMesh([0, 1, 2, 3]), 0, None),
    "scatter": lambda: resharding(DeviceMesh([1]), DeviceMesh([0, 1, 2, 3]), None, 0),
    "gather": lambda: resharding(DeviceMesh([0, 1, 2, 3]), DeviceMesh([3]), 0, None),
    "send-recv": lambda: resharding(DeviceMesh([0, 1]), DeviceMesh([2, 3]), 0, 0),
    "reduce": reduce_to_one_device,
    "nested-loops": lambda: parse(NESTED),
}

# ---------------------------------------------------------------------------
# Reading DOT source back

NODE = re.compile(r"^\s*(\w+) \[(.*)\]$")
EDGE = re.compile(r"^\s*(\w+)(?::\w+)? -> (\w+)(?::\w+)? \[(.*)\]$")


def attribute(attributes: str, name: str) -> str | None:
    """The value of ``name`` in a DOT attribute list (quotes removed)."""
    match = re.search(rf'(?:^|\s){name}=("(?:[^"\\]|\\.)*"|\S+)', attributes)
    return None if match is None else match[1].strip('"')


def nodes(graph) -> dict[str, str]:
    """Node id -> its attribute list, for the nodes declared in the source."""
    return {m[1]: m[2] for m in map(NODE.match, graph.source.splitlines()) if m}


def edges(graph) -> list[tuple[str, str, str]]:
    """(tail, head, attributes) of every visible edge."""
    found = [(m[1], m[2], m[3]) for m in map(EDGE.match, graph.source.splitlines()) if m]
    return [edge for edge in found if attribute(edge[2], "style") != "invis"]


def instruction_nodes(graph) -> dict[str, str]:
    """The nodes that stand for instructions (``i<n>``), in program order."""
    return {name: attrs for name, attrs in nodes(graph).items() if re.fullmatch(r"i\d+", name)}


def unwrapped(label: str) -> str:
    """A wrapped node label as one line."""
    return re.sub(r"\\[nl]\s*", " ", label).strip()


def node_labelled(graph, text: str) -> str:
    """The one instruction node whose (unwrapped) label contains ``text``."""
    found = [
        n for n, a in instruction_nodes(graph).items() if text in unwrapped(attribute(a, "label"))
    ]
    assert len(found) == 1, (text, found)
    return found[0]


def flatten(body) -> list:
    """Every instruction of ``body``, loops included, in program order."""
    flat = []
    for instruction in body:
        flat.append(instruction)
        if isinstance(instruction, ForLoop):
            flat.extend(flatten(instruction.body))
    return flat


def traffic(graph) -> set[tuple[int, int, str]]:
    """(sender, receiver, label) of every arrow of a traffic view."""
    return {
        (int(tail.removeprefix("rank")), int(head.removeprefix("rank")), attribute(a, "label"))
        for tail, head, a in edges(graph)
    }


def svg_of(source: str) -> str:
    """``dot -Tsvg`` of the source, as the acceptance criterion runs it."""
    result = subprocess.run(
        ["dot", "-Tsvg"], input=source, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# ---------------------------------------------------------------------------
# Every picture renders


def pictures(program: HostIrContainer) -> list:
    """The program view, and the traffic view of each top-level instruction that has one."""
    found = [to_dot(program, title="a program")]
    for index, instruction in enumerate(program.body):
        if any(type(i) in COLLECTIVES for i in flatten([instruction])):
            found.append(to_traffic_dot(program, instruction_index=index))
    return found


@needs_dot
@pytest.mark.parametrize("name", PROGRAMS)
def test_dot_accepts_every_picture(name):
    program = PROGRAMS[name]()
    graphs = pictures(program)
    assert len(graphs) >= 2, "every program here communicates"
    for graph in graphs:
        assert "<svg" in graph.pipe(format="svg", encoding="utf-8")
        assert "<svg" in svg_of(graph.source)


@pytest.mark.parametrize("name", PROGRAMS)
def test_pictures_are_deterministic(name):
    """Two lowerings of the same fusion draw byte-identical sources."""
    first, second = pictures(PROGRAMS[name]()), pictures(PROGRAMS[name]())
    assert [g.source for g in first] == [g.source for g in second]


# ---------------------------------------------------------------------------
# The program view


@pytest.mark.parametrize("name", PROGRAMS)
def test_one_node_per_instruction_and_a_cluster_per_loop(name):
    program = PROGRAMS[name]()
    graph = to_dot(program)
    flat = flatten(program.body)
    loops = [i for i in flat if isinstance(i, ForLoop)]
    assert len(instruction_nodes(graph)) == len(flat) - len(loops)
    assert len(re.findall(r"subgraph cluster_loop\d+ \{", graph.source)) == len(loops)
    declared = nodes(graph)
    assert [attribute(declared[f"in{k}"], "shape") for k in range(len(program.inputs))] == [
        "note"
    ] * len(program.inputs)
    assert attribute(declared["out0"], "shape") == "note"


def test_nested_loops_nest_as_clusters():
    source = to_dot(parse(NESTED)).source
    outer = source.index("subgraph cluster_loop1 {")
    inner = source.index("subgraph cluster_loop2 {")
    assert outer < inner < source.index("CollectivePermute")
    assert 'label="for j0 in range(0, 2)"' in source
    assert 'label="for j1 in range(1, 3)"' in source


def test_the_collective_permute_loop():
    """Shapes, labels, stream colours and data edges of the column-parallel linear."""
    graph = to_dot(column_parallel(4, swizzle=True), title="column parallel")
    declared = instruction_nodes(graph)
    permute = node_labelled(graph, "= CollectivePermute(")
    wait = node_labelled(graph, "wait R0")
    linear = node_labelled(graph, "linear(")
    allocate = node_labelled(graph, "allocate T3 :")
    switch = node_labelled(graph, "set_current_stream(stream(j0))")
    assert attribute(declared[permute], "shape") == "cds"
    assert attribute(declared[permute], "label").startswith("CollectivePermute  team=M0(x)")
    assert attribute(declared[wait], "shape") == "octagon"
    assert attribute(declared[linear], "shape") == "box"
    main, stream = (attribute(declared[n], "fillcolor") for n in (allocate, switch))
    assert main != stream
    assert attribute(declared[linear], "fillcolor") == stream
    assert attribute(declared[node_labelled(graph, "set_current_stream(main)")], "fillcolor") == (
        main
    )
    data = {(tail, head, attribute(a, "label")) for tail, head, a in edges(graph)}
    assert (permute, linear, "T2_c") in data, "the linear reads the permuted chunk"
    assert (permute, wait, "R0") in data, "the wait consumes the request"
    assert ("in0", permute, "T0") in data and ("in1", linear, "T1") in data
    assert (linear, "out0", "T3") in data, "the output was last written by the linear"
    assert 'label="column parallel"' in graph.source
    assert 'label="stream(j0)"' in graph.source, "the legend names the streams"


def test_collectives_are_hexagons_labelled_with_kind_and_team():
    graph = to_dot(data_and_tensor_parallel_mlp())
    allreduce = node_labelled(graph, "= Allreduce(")
    attributes = instruction_nodes(graph)[allreduce]
    assert attribute(attributes, "shape") == "hexagon"
    assert attribute(attributes, "label").startswith("Allreduce  team=M0(x)")


def test_long_lines_are_wrapped():
    graph = to_dot(column_parallel(4, swizzle=True))
    for attributes in instruction_nodes(graph).values():
        lines = re.split(r"\\[nl]", attribute(attributes, "label"))
        assert max(len(line) for line in lines) <= 60, lines


# ---------------------------------------------------------------------------
# The traffic view


def test_permute_traffic_is_a_shift_per_iteration():
    """At iteration i rank r sends its shard to (r - i) mod 4; iteration 0 copies locally."""
    program = column_parallel(4, swizzle=True)
    loop = next(k for k, i in enumerate(program.body) if isinstance(i, ForLoop))
    graph = to_traffic_dot(program)  # the default: the first loop that communicates
    assert graph.source == to_traffic_dot(program, instruction_index=loop).source
    expected = {(r, (r - i) % 4, f"j0={i}: T0") for i in range(1, 4) for r in range(4)}
    assert traffic(graph) == expected
    assert len(edges(graph)) == 12
    colours = {attribute(a, "label")[:4]: attribute(a, "color") for _, _, a in edges(graph)}
    assert len(set(colours.values())) == 3, "one colour per iteration"
    assert "local copies, not drawn: j0=0" in graph.source
    assert {f"rank{r}" for r in range(4)} <= set(nodes(graph))
    assert 'label="rank 2"' in graph.source


def test_broadcast_traffic_is_from_root_i_at_iteration_i():
    graph = to_traffic_dot(column_parallel(4, swizzle=False))
    expected = {(i, r, f"j0={i}: T0") for i in range(4) for r in range(4) if r != i}
    assert traffic(graph) == expected


def test_repeated_transfers_are_one_arrow_per_pair():
    """Three Allreduces on two ranks: one arrow per pair and message, listing the
    iterations; an Allreduce is drawn as its reduce-scatter then its all-gather."""
    graph = to_traffic_dot(row_parallel(2, streams=3))
    assert traffic(graph) == {
        (0, 1, "j0=0,1,2: T3_c chunk 1 (sum)"),
        (1, 0, "j0=0,1,2: T3_c chunk 0 (sum)"),
        (1, 0, "j0=0,1,2: T3_c chunk 1 (reduced)"),
        (0, 1, "j0=0,1,2: T3_c chunk 0 (reduced)"),
    }
    assert all(len(attribute(a, "color").split(":")) == 3 for _, _, a in edges(graph))


def test_allreduce_traffic_stays_in_each_group():
    graph = to_traffic_dot(data_and_tensor_parallel_mlp())
    assert {(s, r) for s, r, _ in traffic(graph)} == {(0, 1), (1, 0), (2, 3), (3, 2)}
    assert 'label="group (0 1)"' in graph.source and 'label="group (2 3)"' in graph.source
    assert len(re.findall(r"subgraph cluster_group\d+ \{", graph.source)) == 2


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("scatter", {(1, r, f"T0 chunk {r}") for r in (0, 2, 3)}),
        ("gather", {(r, 3, "T0") for r in (0, 1, 2)}),
        ("reduce", {(r, 0, "T2 (sum)") for r in (1, 2, 3)}),
        ("allgather", {(r, q, "T0") for r in range(4) for q in range(4) if r != q}),
    ],
)
def test_rooted_and_gathering_traffic(name, expected):
    program = PROGRAMS[name]()
    assert traffic(to_traffic_dot(program)) == expected, str(program)


def test_send_recv_pairs_the_meshes():
    """[0, 1] -> [2, 3]: the AllToAll on the source mesh first, then 0 -> 2 and 1 -> 3."""
    program = PROGRAMS["send-recv"]()
    send_recv = next(k for k, i in enumerate(program.body) if type(i).__name__ == "SendRecv")
    graph = to_traffic_dot(program, instruction_index=send_recv, world_size=5)
    assert {(s, r) for s, r, _ in traffic(graph)} == {(0, 2), (1, 3)}
    assert "rank4" in nodes(graph), "every rank of the world is drawn"


def test_nested_loops_evaluate_every_index():
    graph = to_traffic_dot(parse(NESTED))
    shifts = {(s, r): a for s, r, a in traffic(graph)}
    assert shifts[(0, 1)] == "j0=0 j1=1: T0"
    assert shifts[(0, 2)] == "j0=0 j1=2; j0=1 j1=1: T0"
    assert shifts[(0, 3)] == "j0=1 j1=2: T0"


def test_traffic_errors_name_the_problem():
    program = column_parallel(4, swizzle=True)
    with pytest.raises(HostIrError, match="no communication to draw: allocate T3"):
        to_traffic_dot(program, instruction_index=0)
    with pytest.raises(HostIrError, match="out of range"):
        to_traffic_dot(program, instruction_index=len(program.body))
    with pytest.raises(HostIrError, match="not in a world of 2 ranks"):
        to_traffic_dot(program, world_size=2)
    local = parse(
        "%HostIrContainer {\n  input T0 : float32[4]\n  T1 : float32[4] = relu(T0)\n"
        "  output T1\n}\n"
    )
    with pytest.raises(HostIrError, match="the program has no communication to draw"):
        to_traffic_dot(local)
    symbolic = NESTED.replace("range(0, 2)", "range(0, i0)").replace(
        "input T0 : float32[8, 4]", "input i0 : int64\n  input T0 : float32[8, 4]"
    )
    with pytest.raises(HostIrError, match="loop j0 needs constant bounds"):
        to_traffic_dot(parse(symbolic))
