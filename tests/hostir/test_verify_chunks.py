"""check_chunk_uniformity (hostir.check.verify_chunks): in a loop whose chunks rotate with the
rank (a swizzled ``shard_by_stream`` index, ``(j + coord(M, a)) % S``), a collective over
a team spanning mesh axis ``a`` would mix different chunks of its members (fuzz seed 6025
at 8 ranks: a wrong result, no error). Programs are written by hand and parsed without
the verifier, so the check is called directly."""

from __future__ import annotations

import pathlib

import pytest

from hostir import Mesh, MeshAxis, VerifyError, parse
from hostir.check.verify_chunks import check_chunk_uniformity, team_splits_coordinate
from hostir.ir.team import Team

DATA = pathlib.Path(__file__).parent.parent / "data"

SEED_6025 = """%HostIrContainer {
  mesh M0 = [[7, 4], [3, 1]]
  input T0 : float32[8, 8, 8] @M0 {0: [x, 4]}
  input T1 : float32[8, 8] @M0 {1: [y, 4]}
  allocate T4 : float32[8, 8] @M0 {0: [x, 4]}
  main = get_current_stream()
  for j0 in range(0, 2) {
    set_current_stream(stream(j0))
    synchronize(main)
    T0_c : float32[8, 4, 8] @M0 {0: [x, 4]} = shard_by_stream(T0, axis=1, index=(j0 + coord(M0, y)) % 2)
    T2_c : float32[8, 4, 8] @M0 {0: [x, 4]} = set(T0_c)
    deallocate T0_c
    T3_c : float32[8, 4, 8] @M0 {0: [x, 4], 2: [y, 4]} = matmul(T2_c, T1)
    deallocate T2_c
    T5_c : float32[8, 4] @M0 {0: [x, 4]} partial{y: sum} = shard_by_stream(T4, axis=1, index=(j0 + coord(M0, y)) % 2)
    sum(T3_c, dims=[2], keepdim=false, out=T5_c)
    deallocate T3_c
    T4_c : float32[8, 4] @M0 {0: [x, 4]} = shard_by_stream(T4, axis=1, index=(j0 + coord(M0, y)) % 2)
    R0 = Allreduce(T5_c, team=M0(y), op=sum, out=T4_c)
    pipeline_stage(depth=1)
    wait R0
    deallocate T5_c
    deallocate T4_c
  }
  set_current_stream(main)
  for j1 in range(0, 2) {
    synchronize(stream(j1))
  }
  output T4
}
"""  # noqa: E501  (the lowering's program, verbatim)


def _row_sums(team: str) -> str:
    """Rows of T0 in 2 chunks swizzled over mesh_y of a 2x2 mesh, summed over dim 1 (sharded
    over ``team``'s axis), the partial sums reduced over ``team`` into a fresh value."""
    return f"""%HostIrContainer {{
  mesh M0 = [[0, 1], [2, 3]]
  input T0 : float32[8, 8] @M0 {{1: [{team}, 4]}}
  for j0 in range(0, 2) {{
    T0_c : float32[4, 8] @M0 {{1: [{team}, 4]}} = shard_by_stream(T0, axis=0, index=(j0 + coord(M0, y)) % 2)
    T2_c : float32[4] @M0 partial{{{team}: sum}} = sum(T0_c, dims=[1], keepdim=false)
    T3_c : float32[4] @M0, R0 = Allreduce(T2_c, team=M0({team}), op=sum)
    wait R0
  }}
}}
"""  # noqa: E501


WRITES_A_SWIZZLED_CHUNK = """%HostIrContainer {
  mesh M0 = [[0, 1], [2, 3]]
  input T0 : float32[8, 8] @M0 {1: [y, 4]}
  allocate T1 : float32[8] @M0
  for j0 in range(0, 2) {
    T0_c : float32[4, 8] @M0 {1: [y, 4]} = shard_by_stream(T0, axis=0, index=j0)
    T2_c : float32[4] @M0 partial{y: sum} = sum(T0_c, dims=[1], keepdim=false)
    T1_c : float32[4] @M0 = shard_by_stream(T1, axis=0, index=(j0 + coord(M0, y)) % 2)
    R0 = Allreduce(T2_c, team=M0(y), op=sum, out=T1_c)
    wait R0
  }
  output T1
}
"""  # noqa: E501


def _check(text: str) -> None:
    check_chunk_uniformity(parse(text, verify_program=False))


def test_seed_6025_is_refused_at_its_allreduce():
    """The lowered 6025 program: the Allreduce over M0(y) reads T5_c, chunk
    (j0 + coord(M0, y)) % 2 of T4; the path points at it (body[2], the loop; its
    instruction 11)."""
    with pytest.raises(
        VerifyError, match=r"Allreduce over team M0\(y\) reads T5_c, whose chunk depends on"
    ) as caught:
        _check(SEED_6025)
    assert caught.value.path == (2, 11)


def test_a_swizzled_collective_permute_ring_is_accepted():
    """The ring all-gather exchanges rotating chunks with CollectivePermute: what the
    swizzle is for."""
    _check((DATA / "ring_allgather.hir").read_text())


def test_a_collective_over_another_axis_is_accepted():
    """Members of a mesh_x team share their mesh_y coordinate: the same chunk."""
    _check(_row_sums("x"))


def test_a_value_computed_from_a_swizzled_chunk_is_refused():
    """T2_c is no alias, but computed from the swizzled T0_c."""
    with pytest.raises(VerifyError, match=r"reads T2_c \(computed from T0_c\), whose chunk"):
        _check(_row_sums("y"))


def test_writing_a_swizzled_chunk_is_refused():
    """The Allreduce reads chunk j0 but writes T1_c, chunk (j0 + coord(M0, y)) % 2."""
    with pytest.raises(VerifyError, match=r"Allreduce over team M0\(y\) writes T1_c, whose"):
        _check(WRITES_A_SWIZZLED_CHUNK)


IN_PLACE_SLOTS = """%HostIrContainer {
  mesh M0 = [0, 1, 2, 3]
  input T0 : float32[8, 3] @M0 partial{x: sum}
  allocate T1 : float32[16, 3] @M0
  for j0 in range(0, 2) {
    T1_c : float32[8, 3] @M0 = shard_by_stream(T1, axis=0, index=j0)
    T1_own : float32[8, 3] @M0 {0: [x, 2]} = shard_by_stream(T1_c, axis=0, index=coord(M0, x))
    R0 = ReduceScatter(T0, team=M0(x), axis=0, op=sum, out=T1_own)
    wait R0
    R1 = Allgather(T1_own, team=M0(x), axis=0, out=T1_c)
    wait R1
  }
  output T1
}
"""


def test_each_members_own_slot_is_not_a_swizzled_chunk():
    """``index=coord(M0, x)`` without a loop index is the member's own slot, as lowered
    in-place ReduceScatter and Allgather write it (thousands of lowered programs do)."""
    _check(IN_PLACE_SLOTS)


PERMUTED_THEN_BROADCAST = """%HostIrContainer {
  mesh M0 = [0, 1]
  input T0 : float32[4, 8] @M0 {0: [x, 2]}
  for j0 in range(0, 2) {
    T3_c : float32[2, 8] @M0, R0 = CollectivePermute(T0, team=M0(x), send_peer=(coord(M0, x) - j0) % 2, recv_peer=(coord(M0, x) + j0) % 2)
    wait R0
    T4_c : float32[2, 8] @M0 = relu(T3_c)
    T5_c : float32[2, 8] @M0, R1 = Broadcast(T4_c, team=M0(x), root=0)
    wait R1
  }
}
"""  # noqa: E501


def test_a_chunk_received_by_a_rotating_permute_is_swizzled():
    """T3_c holds the chunk of member (coord + j0) % 2: broadcasting (a value computed
    from) it over mesh_x hands every member the root's chunk in place of its own."""
    with pytest.raises(
        VerifyError,
        match=r"Broadcast over team M0\(x\) reads T4_c \(computed from T3_c\).*T3_c's"
        r" recv_peer is \(coord\(M0, x\) \+ j0\) % 2",
    ):
        _check(PERMUTED_THEN_BROADCAST)


def test_teams_on_another_mesh_are_compared_by_device():
    """A team of another mesh splits the coordinate where two members of a group differ
    in it (a device outside the mesh differs from those in it)."""
    mesh = Mesh(shape=(2, 2), devices=[0, 1, 2, 3])  # x: the inner dim, coord(1) = 1
    x = MeshAxis.X

    def splits(devices: list[int]) -> bool:
        team = Team(mesh=Mesh(shape=(len(devices),), devices=devices), axes=(x,))
        return team_splits_coordinate(team, mesh, x)

    assert splits([0, 1])
    assert not splits([0, 2])
    assert splits([0, 5])
