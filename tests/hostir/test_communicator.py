"""Communicator collectives at world sizes 1, 2 and 4 (see tests/multidevice.py).

Every rank draws every rank's data from the same seeds (small integers, so
sums and maxima are exact even in bfloat16), so each rank computes the
expected result of a collective locally. Groups come in team order: the world
in rank order and reversed, and at 4 ranks the rows and columns of the 2x2 mesh
``[[0, 1], [2, 3]]``, its column-major flattening, an arbitrary order and a
two-rank subset.
"""

from __future__ import annotations

import itertools
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from hostir.comm import torch_communicator, torch_groups
from hostir.comm.agreement import BoundExtent, RankFacts, agree
from hostir.comm.communicator import Communicator, LocalCommunicator
from hostir.comm.torch_communicator import TorchCommunicator
from hostir.comm.world import default_communicator
from hostir.errors import CommunicationError, DisagreementError, PeerFailureError
from hostir.ir.sharding import ReduceOp

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SHAPE = (2, 3)
REDUCE = {
    ReduceOp.SUM: lambda t: t.sum(0),
    ReduceOp.MAX: lambda t: t.amax(0),
    ReduceOp.MIN: lambda t: t.amin(0),
    ReduceOp.PROD: lambda t: t.prod(0),
}


def teams(size: int) -> list[tuple[tuple[int, ...], ...]]:
    """Teams (sets of disjoint groups, each in team order) to test at world ``size``."""
    world = tuple(range(size))
    found = [(world,), (world[::-1],)]
    if size == 4:
        found += [
            ((0, 1), (2, 3)),  # mesh_x: rows of the 2x2 mesh
            ((0, 2), (1, 3)),  # mesh_y: columns
            ((1, 0), (3, 2)),  # rows, each reversed
            ((0, 2, 1, 3),),  # the mesh flattened column-major (row-major is the world)
            ((3, 1, 0, 2),),  # an arbitrary order
            ((3, 1),),  # a subset: ranks 0 and 2 sit out
        ]
    return found


def all_groups(size: int) -> list[tuple[int, ...]]:
    return [group for team in teams(size) for group in team]


def make_communicator(multidevice_test) -> Communicator:
    if multidevice_test.size > 1:
        return default_communicator()  # the pool's TorchCommunicator, or a simulated rank
    return LocalCommunicator()


def cases(comm: Communicator, dtypes=DTYPES):
    """(salt, group, dtype) for each team this rank is in; prepares every group first.

    The salt depends on the team and dtype only, so all members agree on it.
    """
    comm.prepare(all_groups(comm.world_size))
    for t, team in enumerate(teams(comm.world_size)):
        for group in team:
            if comm.rank in group:
                for d, dtype in enumerate(dtypes):
                    yield 10 * t + d, group, dtype


def data(rank: int, salt: int, dtype: torch.dtype, shape=SHAPE) -> torch.Tensor:
    """Rank ``rank``'s input of case ``salt``: integers in [-8, 8], identical on all ranks."""
    generator = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(-8, 9, shape, generator=generator).to(dtype)


def reduced(tensors: list[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    return REDUCE[op](torch.stack([t.float() for t in tensors])).to(tensors[0].dtype)


def check(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=lambda m: f"{what}: {m}")


def blank(shape, dtype) -> torch.Tensor:
    """An output buffer whose stale contents would show (NaN)."""
    return torch.full(shape, float("nan"), dtype=dtype)


def test_allgather(multidevice_test):
    comm = make_communicator(multidevice_test)
    for salt, group, dtype in cases(comm):
        out = blank((len(group), *SHAPE), dtype)
        comm.allgather(out, data(comm.rank, salt, dtype), group).wait()
        expected = torch.stack([data(m, salt, dtype) for m in group])
        check(out, expected, f"allgather {group} {dtype}")


def test_reduce_scatter(multidevice_test):
    comm = make_communicator(multidevice_test)
    for salt, group, dtype in cases(comm):
        n, p = len(group), group.index(comm.rank)
        for op in (ReduceOp.SUM, ReduceOp.MAX):
            out = blank(SHAPE, dtype)
            inp = data(comm.rank, salt, dtype, (n, *SHAPE))
            comm.reduce_scatter(out, inp, group, op).wait()
            expected = reduced([data(m, salt, dtype, (n, *SHAPE))[p] for m in group], op)
            check(out, expected, f"reduce_scatter {op} {group} {dtype}")


def test_allreduce(multidevice_test):
    comm = make_communicator(multidevice_test)
    for salt, group, dtype in cases(comm):
        ops = [ReduceOp.SUM, ReduceOp.MAX]
        if dtype == torch.float32:  # products of 4 values in [-8, 8] are exact in fp32 only
            ops += [ReduceOp.MIN, ReduceOp.PROD]
        for op in ops:
            tensor = data(comm.rank, salt, dtype)
            comm.allreduce(tensor, group, op).wait()
            expected = reduced([data(m, salt, dtype) for m in group], op)
            check(tensor, expected, f"allreduce {op} {group} {dtype}")


def test_broadcast(multidevice_test):
    comm = make_communicator(multidevice_test)
    for salt, group, dtype in cases(comm):
        for root in range(len(group)):
            tensor = data(comm.rank, salt + root, dtype)
            comm.broadcast(tensor, group, root).wait()
            check(tensor, data(group[root], salt + root, dtype), f"broadcast {group} {root}")


def test_reduce(multidevice_test):
    comm = make_communicator(multidevice_test)
    for salt, group, dtype in cases(comm):
        for root, op in itertools.product(range(len(group)), (ReduceOp.SUM, ReduceOp.MAX)):
            tensor = data(comm.rank, salt, dtype)
            comm.reduce(tensor, group, root, op).wait()
            if comm.rank == group[root]:
                expected = reduced([data(m, salt, dtype) for m in group], op)
                check(tensor, expected, f"reduce {op} {group} root {root} {dtype}")


def test_gather(multidevice_test):
    comm = make_communicator(multidevice_test)
    for salt, group, dtype in cases(comm):
        for root in range(len(group)):
            is_root = comm.rank == group[root]
            out = blank((len(group), *SHAPE), dtype) if is_root else None
            comm.gather(out, data(comm.rank, salt + root, dtype), group, root).wait()
            if is_root:
                expected = torch.stack([data(m, salt + root, dtype) for m in group])
                check(out, expected, f"gather {group} root {root} {dtype}")


def test_scatter(multidevice_test):
    comm = make_communicator(multidevice_test)
    for salt, group, dtype in cases(comm):
        n, p = len(group), group.index(comm.rank)
        for root in range(n):
            chunks = data(group[root], salt, dtype, (n, *SHAPE))
            out = blank(SHAPE, dtype)
            comm.scatter(out, chunks if comm.rank == group[root] else None, group, root).wait()
            check(out, chunks[p], f"scatter {group} root {root} {dtype}")


def test_all_to_all(multidevice_test):
    comm = make_communicator(multidevice_test)
    for salt, group, dtype in cases(comm):
        n, p = len(group), group.index(comm.rank)
        out = blank((n, *SHAPE), dtype)
        comm.all_to_all(out, data(comm.rank, salt, dtype, (n, *SHAPE)), group).wait()
        expected = torch.stack([data(m, salt, dtype, (n, *SHAPE))[p] for m in group])
        check(out, expected, f"all_to_all {group} {dtype}")


def v_counts(n: int, salt: int) -> list[list[int]]:
    """``counts[p][q]``: how many elements position p sends to q (zeros included)."""
    return [[(p + 2 * q + salt) % 3 for q in range(n)] for p in range(n)]


def check_all_to_all_v(comm: Communicator, group, salt: int, dtype) -> None:
    n, p = len(group), group.index(comm.rank)
    counts = v_counts(n, salt)
    inp = data(comm.rank, salt, dtype, (sum(counts[p]),))
    out = blank((sum(row[p] for row in counts),), dtype)
    column = [row[p] for row in counts]
    comm.all_to_all_v(out, inp, column, counts[p], group).wait()
    expected = []
    for q, member in enumerate(group):  # member q's chunk for p, after its chunks for 0..p-1
        start = sum(counts[q][:p])
        expected.append(data(member, salt, dtype, (sum(counts[q]),))[start : start + counts[q][p]])
    check(out, torch.cat(expected), f"all_to_all_v {group} {dtype}")


def test_all_to_all_v(multidevice_test):
    """Uneven counts, some zero, on every team: chunk q of p's input lands at p's offset
    for q in q's output."""
    comm = make_communicator(multidevice_test)
    for salt, group, dtype in cases(comm):
        check_all_to_all_v(comm, group, salt, dtype)


def test_send_recv_between_every_pair_of_positions(multidevice_test):
    comm = make_communicator(multidevice_test)
    for salt, group, dtype in cases(comm, dtypes=(torch.float32,)):
        for sender, receiver in itertools.product(range(len(group)), repeat=2):
            sends, receives = comm.rank == group[sender], comm.rank == group[receiver]
            inp = data(comm.rank, salt, dtype) if sends else None
            out = blank(SHAPE, dtype) if receives else None
            comm.send_recv(out, inp, group, sender, receiver).wait()
            if receives:
                check(out, data(group[sender], salt, dtype), f"{group} {sender}->{receiver}")


def test_send_recv_ring_overlaps(multidevice_test):
    """Each member sends to the next position and receives from the previous: both in flight."""
    comm = make_communicator(multidevice_test)
    for salt, group, dtype in cases(comm):
        n, p = len(group), group.index(comm.rank)
        if n == 1:
            continue  # a one-rank ring is a local copy, covered above
        out = blank(SHAPE, dtype)
        sent = comm.send_recv(None, data(comm.rank, salt, dtype), group, p, (p + 1) % n)
        received = comm.send_recv(out, None, group, (p - 1) % n, p)
        received.wait()
        sent.wait()
        check(out, data(group[(p - 1) % n], salt, dtype), f"ring {group} {dtype}")


def test_collectives_overlap_and_fill_strided_buffers(multidevice_test):
    """Three collectives in flight on two groups, waited in reverse; outputs are views."""
    comm = make_communicator(multidevice_test)
    size, rank = comm.world_size, comm.rank
    comm.prepare(all_groups(size))
    world, rows = tuple(range(size))[::-1], tuple(range(size))
    if size == 4:
        rows = (0, 1) if rank < 2 else (2, 3)
    n, p = len(rows), rows.index(rank)
    gathered = blank((size, 2, *SHAPE), torch.bfloat16)[:, 1]  # strided view
    summed = data(rank, 1, torch.float32).t()  # non-contiguous, in place
    scattered = blank((2, 3), torch.float16)[:, :1]  # strided output
    works = [
        comm.allgather(gathered, data(rank, 2, torch.bfloat16), world),
        comm.allreduce(summed, rows, ReduceOp.SUM),
        comm.reduce_scatter(scattered, data(rank, 3, torch.float16, (n, 2, 1)), rows, ReduceOp.MAX),
    ]
    local = data(rank, 4, torch.float32) @ data(rank, 5, torch.float32).t()  # compute meanwhile
    for work in reversed(works):
        work.wait()
    works[0].wait()  # waiting twice is harmless
    check(gathered, torch.stack([data(m, 2, torch.bfloat16) for m in world]), "allgather")
    check(summed, reduced([data(m, 1, torch.float32) for m in rows], ReduceOp.SUM).t(), "sum")
    expected = reduced([data(m, 3, torch.float16, (n, 2, 1))[p] for m in rows], ReduceOp.MAX)
    check(scattered, expected, "reduce_scatter")
    assert local.shape == (2, 2)


@pytest.mark.real_ranks(reason="torch.distributed's groups themselves")
def test_prepare_creates_each_group_once(multidevice_test):
    """Groups are cached by their members in team order (one torch group per order, so no
    collective reorders data); our own world group comes first (hostir never communicates
    on the default group, see hostir/comm/torch_communicator.py)."""
    comm = make_communicator(multidevice_test)
    groups = all_groups(comm.world_size)
    if comm.world_size == 1:
        comm.prepare(groups)
        comm.prepare(groups)
        return
    with (
        mock.patch.object(torch_groups.GROUPS, "groups", {}),
        mock.patch.object(dist, "new_group", wraps=dist.new_group) as new_group,
    ):
        comm.prepare(groups)
        created = [call.args[0] for call in new_group.call_args_list]
        world = tuple(range(comm.world_size))
        expected = list(dict.fromkeys([world, *(tuple(g) for g in groups)]))
        assert created == [list(g) for g in expected]
        assert all(call.kwargs.get("sort_ranks") is False for call in new_group.call_args_list)
        comm.prepare(groups)
        TorchCommunicator().prepare(list(reversed(groups)))
        assert new_group.call_count == len(created)


def test_whole_outputs_land_in_strided_views(multidevice_test):
    """Broadcast, scatter and send_recv receive into a strided ``out`` as given (their
    handlers pass ``out`` as it is: hostir.run.handler_common.landing); the communicator
    receives into a contiguous buffer and copies it back at wait."""
    comm = make_communicator(multidevice_test)
    size, rank = comm.world_size, comm.rank
    world = tuple(range(size))
    comm.prepare([world])
    last = size - 1
    broadcast = data(rank, 6, torch.float32, (3, 2)).t()  # root 0's values reach everyone
    scattered = blank((2, 3, 2), torch.float32)[:, :, 0]
    chunks = data(rank, 7, torch.float32, (size, *SHAPE)) if rank == 0 else None
    received = blank((3, 2), torch.float32).t() if rank == last else None
    sent = data(rank, 8, torch.float32) if rank == 0 else None
    works = [
        comm.broadcast(broadcast, world, 0),
        comm.scatter(scattered, chunks, world, 0),
        comm.send_recv(received, sent, world, 0, last),
    ]
    for work in works:
        work.wait()
    assert not (broadcast.is_contiguous() or scattered.is_contiguous())
    check(broadcast, data(0, 6, torch.float32, (3, 2)).t(), "broadcast")
    check(scattered, data(0, 7, torch.float32, (size, *SHAPE))[rank], "scatter")
    if rank == last:
        check(received, data(0, 8, torch.float32), "send_recv")


@pytest.mark.real_ranks(reason="torch.distributed's groups themselves")
@pytest.mark.world_sizes(2, 4)
def test_torch_that_sorts_group_ranks_runs_ascending_teams_and_refuses_others(multidevice_test):
    """torch before 2.13 has no new_group(sort_ranks=False) and sorts a group's ranks: a
    team in ascending order still gathers in team order, one out of order is refused by
    name on every rank (instead of gathering into the wrong places)."""
    comm = make_communicator(multidevice_test)
    n = comm.world_size
    pairs = [(r - r % 2, r - r % 2 + 1) for r in range(0, n, 2)]  # ascending teams
    with (
        mock.patch.object(torch_communicator, "KEEPS_TEAM_ORDER", False),
        mock.patch.object(torch_groups.GROUPS, "groups", {}),
        mock.patch.object(dist, "new_group", wraps=dist.new_group) as new_group,
    ):
        comm.prepare(pairs)
        assert all("sort_ranks" not in call.kwargs for call in new_group.call_args_list)
        pair = pairs[comm.rank // 2]
        out = blank((2, *SHAPE), torch.float32)
        comm.allgather(out, data(comm.rank, 7, torch.float32), pair).wait()
        check(out, torch.stack([data(m, 7, torch.float32) for m in pair]), f"allgather {pair}")
        descending = tuple(reversed(range(n)))
        with pytest.raises(
            CommunicationError,
            match=rf"creating group \({', '.join(map(str, descending))}\) on rank"
            rf" {comm.rank}: its ranks are not in ascending order.*torch >= 2\.13",
        ):
            comm.prepare([descending])


@pytest.mark.real_ranks(reason="torch.distributed's groups themselves")
@pytest.mark.world_sizes(4)
def test_unprepared_group_is_refused(multidevice_test):
    comm = make_communicator(multidevice_test)
    pair = (0, 3) if comm.rank in (0, 3) else (1, 2)
    with mock.patch.object(torch_groups.GROUPS, "groups", {}):
        with pytest.raises(
            CommunicationError, match=r"group \(\d, \d\): the group was not prepared"
        ):
            comm.allreduce(torch.ones(2), pair, ReduceOp.SUM)


def test_agreement_names_what_differs(multidevice_test):
    """The agreement over a communicator: equal facts pass; a different program digest, a
    different extent and a failed rank raise the same named error on every rank."""
    comm = make_communicator(multidevice_test)
    same = RankFacts(digest="5f3a9c", extents=(BoundExtent("i0", "T0", 0, 8),))
    agree(comm, same)
    if comm.world_size == 1:
        return
    digest = "0bad" if comm.rank == 1 else "5f3a9c"
    with pytest.raises(DisagreementError, match=r"different programs .*rank 1 run 0bad"):
        agree(comm, RankFacts(digest=digest))
    rows = 12 if comm.rank == 1 else 8
    with pytest.raises(
        DisagreementError, match=r"extent i0 \(input T0 dim 0, global\): .*rank 1 bound 12"
    ):
        agree(comm, RankFacts(digest="5f3a9c", extents=(BoundExtent("i0", "T0", 0, rows),)))
    if comm.rank == 1:
        agree(comm, RankFacts.failed(ValueError("bad shard")))  # the failed rank goes on
    else:
        with pytest.raises(PeerFailureError, match=r"rank 1: ValueError: bad shard"):
            agree(comm, same)
    agree(comm, same)  # and the ranks still agree afterwards


@pytest.mark.world_sizes(1)
def test_arguments_are_checked_before_any_communication(multidevice_test):
    comm = make_communicator(multidevice_test)
    x = torch.ones(SHAPE)
    with pytest.raises(CommunicationError, match="names rank 1, but the world has 1"):
        comm.prepare([(0,), (0, 1)])
    with pytest.raises(CommunicationError, match=r"out has shape \[2, 2, 3\], expected \[1, 2, 3"):
        comm.allgather(torch.empty(2, *SHAPE), x, (0,))
    with pytest.raises(CommunicationError, match="root position 1 is outside 0..0"):
        comm.broadcast(x, (0,), 1)
    with pytest.raises(CommunicationError, match="lists a rank twice"):
        comm.allreduce(x, (0, 0), ReduceOp.SUM)
    stand_in = Communicator(rank=1, world_size=2)
    with pytest.raises(CommunicationError, match="rank 1 is not a member of group"):
        stand_in.allreduce(x, (0,), ReduceOp.SUM)
    with pytest.raises(CommunicationError, match="cannot reach other ranks"):
        stand_in.allgather(torch.empty(2, *SHAPE), x, (1, 0))
    flat = torch.ones(3)
    with pytest.raises(CommunicationError, match=r"inp splits \[2\] add up to 2, but inp has 3"):
        comm.all_to_all_v(flat, flat, [3], [2], (0,))
    with pytest.raises(CommunicationError, match="out must be a flat contiguous tensor"):
        comm.all_to_all_v(torch.ones(3, 1), flat, [3], [3], (0,))
    with pytest.raises(CommunicationError, match="alone sends itself 3 elements, but expects 2"):
        comm.all_to_all_v(torch.ones(2), flat, [2], [3], (0,))
    with pytest.raises(CommunicationError, match="cannot reach other ranks"):
        stand_in.all_to_all_v(flat, flat, [1, 2], [2, 1], (1, 0))
