"""Static traffic (hostir.analysis.traffic, hostir traffic): the bytes each rank receives in every
collective, from the exchange functions, against what the collective's definition says
each rank must receive; programs on up to 4096 ranks."""

from __future__ import annotations

import pytest

import hostir
from hostir import cli
from hostir.analysis.traffic import count_traffic

N = 4
ROWS, COLS = 4 * N, 3  # float32: a block of 4 rows is 48 B
BLOCK = 4 * COLS * 4
WHOLE = ROWS * COLS * 4

# name -> (the statements, received bytes by rank): a tensor T0 sharded by rows, T1 whole,
# T2 holding partial sums, each on mesh M0 = [N].
COLLECTIVES = {
    "Allgather": (
        "T3 : float32[16, 3] @M0, R0 = Allgather(T0, team=M0(x), axis=0)",
        [WHOLE - BLOCK] * N,
    ),
    "AllToAll": (
        "T3 : float32[64, 3] @M0 {0: [x, 16]}, R0 = AllToAll(T1, team=M0(x), split_axis=0,"
        " concat_axis=0)",
        [WHOLE * (N - 1) // N] * N,
    ),
    "ReduceScatter": (
        "T3 : float32[16, 3] @M0 {0: [x, 4]}, R0 = ReduceScatter(T2, team=M0(x), axis=0, op=sum)",
        [BLOCK * (N - 1)] * N,
    ),
    "Allreduce": (
        "T3 : float32[16, 3] @M0, R0 = Allreduce(T2, team=M0(x), op=sum)",
        [2 * WHOLE * (N - 1) // N] * N,
    ),
    "Broadcast": (
        "T3 : float32[16, 3] @M0, R0 = Broadcast(T1, team=M0(x), root=2)",
        [WHOLE if r != 2 else 0 for r in range(N)],
    ),
    "Scatter": (
        "T3 : float32[16, 3] @M0 {0: [x, 4]}, R0 = Scatter(T1, team=M0(x), axis=0, root=1)",
        [BLOCK if r != 1 else 0 for r in range(N)],
    ),
    "Gather": (
        "T3 : float32[16, 3] @M1, R0 = Gather(T0, team=M0(x), axis=0, root=0)",
        [BLOCK * (N - 1) if r == 0 else 0 for r in range(N)],
    ),
    "Reduce": (
        "T3 : float32[16, 3] @M1, R0 = Reduce(T2, team=M0(x), root=0, op=sum)",
        [WHOLE * (N - 1) if r == 0 else 0 for r in range(N)],
    ),
    "SendRecv": (
        "T3 : float32[16, 3] @M1, R0 = SendRecv(T1, team=M0(x), sender=3, receiver=0)",
        [WHOLE if r == 0 else 0 for r in range(N)],
    ),
    "CollectivePermute": (
        "R0 = CollectivePermute(T0, team=M0(x), send_peer=(coord(M0, x) + 1) % 4,"
        " recv_peer=(coord(M0, x) + 3) % 4, out=T3)",
        [BLOCK] * N,
    ),
    "AllToAllV": (
        "T3 : float32[16, 4] @M0 {0: [x, 4]}, R0 = AllToAllV(T4, team=M0(x))",
        [12 * 4] * N,  # of its 4x4 target block a rank holds one column already
    ),
    "RaggedAllToAll": (  # counts known at run time: a quarter of each block to each rank
        "H0 = to_host(T5)\n  n0, T3 : float32[n0, 3] @M0, R0 = RaggedAllToAll(T0, team=M0(x),"
        " counts=H0)",
        [3 * BLOCK // 4] * N,
    ),
}


def _program(statement: str) -> hostir.HostIrContainer:
    allocate = "  allocate T3 : float32[16, 3] @M0 {0: [x, 4]}\n" if "out=T3" in statement else ""
    return hostir.parse(
        "%HostIrContainer {\n"
        "  mesh M0 = [4] : [1]\n"
        "  mesh M1 = [1] : [1]\n"
        "  input T0 : float32[16, 3] @M0 {0: [x, 4]}\n"
        "  input T1 : float32[16, 3] @M0\n"
        "  input T2 : float32[16, 3] @M0 partial{x: sum}\n"
        "  input T4 : float32[16, 4] @M0 {1: [x, 1]}\n"
        "  input T5 : int64[4, 4] @M0\n"
        f"{allocate}"
        f"  {statement}\n"
        "  wait R0\n"
        "  output T3\n"
        "}\n"
    )


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_each_collective_receives_what_its_definition_says(name):
    statement, expected = COLLECTIVES[name]
    traffic = count_traffic(_program(statement), N)
    assert [int(b) for b in traffic.received] == expected
    assert int(traffic.sent.sum()) == sum(expected), "every byte received was sent"
    assert all(int(traffic.links[r, r]) == 0 for r in range(N)), "no traffic to oneself"


def test_every_collective_class_has_an_exchange_function():
    from hostir.analysis.exchanges import EXCHANGES
    from hostir.ir.catalog import COMMUNICATING, classes_of_kind

    communicating = {cls for kind in COMMUNICATING for cls in classes_of_kind(kind)}
    assert communicating <= set(EXCHANGES)
    assert {cls.__name__ for cls in communicating} == set(COLLECTIVES)


def test_loops_count_every_iteration_and_symbols_need_bindings():
    text = (
        "%HostIrContainer {\n"
        "  mesh M0 = [4] : [1]\n"
        "  input T0 : float32[i0, 3] @M0 {0: [x, i0 // 4]}\n"
        "  for j in range(0, 3) {\n"
        "    T1 : float32[i0, 3] @M0, R0 = Allgather(T0, team=M0(x), axis=0)\n"
        "    wait R0\n"
        "    deallocate T1\n"
        "  }\n"
        "}\n"
    )
    program = hostir.parse(text)
    with pytest.raises(hostir.HostIrError, match="symbolic; give them with --bind"):
        count_traffic(program, 4)
    traffic = count_traffic(program, 4, {"i0": 8})
    assert [int(b) for b in traffic.received] == [3 * 6 * 3 * 4] * 4
    (path,) = traffic.by_communication
    assert path == "body[0].body[0]" and traffic.by_communication[path][1] == 3


def test_a_team_outside_the_world_is_named():
    statement, _ = COLLECTIVES["Allgather"]
    with pytest.raises(hostir.HostIrError, match="outside a world of 2 ranks"):
        count_traffic(_program(statement), 2)


def test_hostir_traffic_on_4096_ranks(tmp_path, capsys):
    """An all-gather over x and an all-reduce over (y, z) of a 16x16x16 mesh: the summary
    names the busiest rank and link and prints no device lists."""
    path = tmp_path / "big.hir"
    path.write_text(
        "%HostIrContainer {\n"
        "  mesh M0 = [16, 16, 16] : [256, 16, 1]\n"
        "  input T0 : float32[256, 8] @M0 {0: [z, 16]}\n"
        "  T1 : float32[256, 8] @M0, R0 = Allgather(T0, team=M0(z), axis=0)\n"
        "  wait R0\n"
        "  T2 : float32[256, 8] @M0 partial{x: sum} = set(T1)\n"
        "  deallocate T1\n"
        "  T3 : float32[256, 8] @M0, R1 = Allreduce(T2, team=M0(x), op=sum)\n"
        "  wait R1\n"
        "  deallocate T2\n"
        "  output T3\n"
        "}\n"
    )
    # In process (cli.main, as ``hostir traffic`` runs it): a fresh interpreter importing
    # torch cost about 3 s of the suite, and the command, not the launch, is under test.
    code = cli.main(["traffic", str(path), "--world-size", "4096"])
    out, err = capsys.readouterr()
    assert code == 0, err
    block, whole = 16 * 8 * 4, 256 * 8 * 4
    received = 15 * block + 2 * whole * 15 // 16
    assert f"received per rank: min {received} B, median {received} B, max {received} B" in out
    assert "busiest link: rank" in out
    assert len(out) < 2000, "a summary, not a list of devices"
