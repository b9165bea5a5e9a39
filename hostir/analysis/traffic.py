"""Static traffic: the bytes each rank sends and receives in a program, without running it.

:func:`count_traffic` walks the program, asks each communication's exchange
function (:mod:`hostir.analysis.exchanges`) for its flows in every group of its
team, and adds them into a rank-by-rank matrix of bytes. A rank's copy to itself
is not traffic. The flows are compact (an all-gather over ``n`` ranks is one
flow), so a program on 4096 ranks counts in well under a second; ``hostir
traffic`` prints the summary (:func:`traffic_report`).

Loops (:func:`communications`) cost nothing for their trip count where they can:
a loop without communication is skipped, and a loop whose communications do not
read its index (nor do the bounds of the loops between) is counted once and
multiplied by its trip count. Only loops whose communications read their index
(a ring's peer ``(j + r) % n``, a broadcast's root ``j``) are walked index by
index, at most :data:`MAX_COUNTED_ITERATIONS` iterations in all; a walk past that
is refused by name (:class:`~hostir.errors.LoopBoundError`) before it starts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

from hostir.analysis.exchanges import exchange
from hostir.analysis.pipeline_stages import in_flight, is_pipelined
from hostir.errors import HostIrError, LoopBoundError
from hostir.ir.catalog import COMMUNICATING, declaration_of, keyword
from hostir.ir.container import HostIrContainer
from hostir.ir.instructions import ForLoop, Instruction, read_symbols
from hostir.ir.scalars import evaluate_scalar, print_scalar

MAX_COUNTED_ITERATIONS = 1 << 16
"""How many loop iterations, all loops together, the traffic count and the traffic picture
walk one by one: those of loops whose communications read their index (the others are
counted once, whatever their trip count)."""

MAX_EXACT_BYTES = 1 << 53
"""The most bytes, all links together, that a count keeps exactly (in float64)."""


@dataclass(frozen=True)
class Occurrence:
    """A communication at some iterations of the loops around it: ``env`` binds the
    symbols and the indices it reads; ``loops`` gives each loop around it, outer first,
    with its index's value, or its whole range where the communication does not read it
    (it then stands for every iteration of that loop)."""

    path: str
    instruction: Instruction
    env: Mapping[str, int]
    loops: tuple[tuple[str, int | range], ...] = ()

    @property
    def times(self) -> int:
        """How many iterations this stands for."""
        return math.prod(_trips(at) for _, at in self.loops if isinstance(at, range))


def communications(
    body: tuple[Instruction, ...],
    env: Mapping[str, int],
    path: str = "body",
    *,
    first: int = 0,
    each: bool = False,
) -> Iterator[Occurrence]:
    """Each communication of ``body`` (its path, e.g. ``body[3].body[1]``; ``body`` starts
    at index ``first`` of the body ``path`` names) at the iterations of the loops around
    it (see the module docstring and :class:`Occurrence`); LoopBoundError before walking
    more than MAX_COUNTED_ITERATIONS iterations. With ``each``, loops whose communications
    do not read their index are walked too while they fit in what is left of that (a
    picture draws each iteration)."""
    return _Walk(each).body(body, env, (), path, first)


class _Walk:
    """One walk over a program's communications: the iterations it may still walk, and
    what each loop's communications read."""

    def __init__(self, each: bool) -> None:
        self.each = each
        self.left = MAX_COUNTED_ITERATIONS
        self._reads: dict[int, set[str] | None] = {}  # by id: the program holds the loops

    def body(
        self,
        body: tuple[Instruction, ...],
        env: Mapping[str, int],
        loops: tuple,
        path: str,
        first: int = 0,
    ) -> Iterator[Occurrence]:
        for index, instruction in enumerate(body, first):
            where = f"{path}[{index}]"
            if declaration_of(type(instruction)).kind in COMMUNICATING:
                yield Occurrence(where, instruction, env, loops)
            elif isinstance(instruction, ForLoop) and self.reads(instruction) is not None:
                yield from self.loop(instruction, env, loops, where)

    def loop(
        self, loop: ForLoop, env: Mapping[str, int], loops: tuple, where: str
    ) -> Iterator[Occurrence]:
        iterations = loop_range(loop, env)
        trips = _trips(iterations)
        name, inner = loop.index.name, f"{where}.body"
        read = name in (self.reads(loop) or ())
        walk = read or (self.each and trips <= self.left)
        if not walk:
            if iterations:
                yield from self.body(loop.body, env, (*loops, (name, iterations)), inner)
            return
        if trips > self.left:
            raise LoopBoundError(_walk_message(loop, where, trips, self.left))
        self.left -= trips
        for value in iterations:
            yield from self.body(loop.body, {**env, name: value}, (*loops, (name, value)), inner)

    def reads(self, loop: ForLoop) -> set[str] | None:
        """The symbols the communications inside ``loop`` and the bounds of the loops
        holding them read; None where ``loop`` holds no communication."""
        key = id(loop)
        if key not in self._reads:
            found: set[str] | None = None
            for instruction in loop.body:
                inner = self.reads(instruction) if isinstance(instruction, ForLoop) else None
                if declaration_of(type(instruction)).kind in COMMUNICATING:
                    reads = read_symbols(instruction)
                elif inner is not None:
                    reads = inner | read_symbols(instruction)
                else:
                    continue
                found = reads if found is None else found | reads
            self._reads[key] = found
        return self._reads[key]


def _trips(iterations: range) -> int:
    """How many iterations a loop's range holds (``len`` fails past 2**63)."""
    return max(0, iterations.stop - iterations.start)


def _walk_message(loop: ForLoop, where: str, trips: int, left: int) -> str:
    walked = MAX_COUNTED_ITERATIONS - left
    return (
        f"loop {loop.index.name} in range({print_scalar(loop.start)}, {print_scalar(loop.stop)})"
        f" at {where} runs {trips} iterations, and its communications read its index,"
        f" so each is counted one by one: past the {MAX_COUNTED_ITERATIONS} iterations a"
        f" traffic count walks (MAX_COUNTED_ITERATIONS; {walked} walked before it)"
    )


def loop_range(loop: ForLoop, env: Mapping[str, int]) -> range:
    """The iterations of ``loop``, whose bounds must evaluate in ``env``."""
    try:
        return range(int(evaluate_scalar(loop.start, env)), int(evaluate_scalar(loop.stop, env)))
    except HostIrError as error:
        raise HostIrError(
            f"loop {loop.index.name} needs constant bounds to count its traffic: {error}"
        ) from None


@dataclass
class Traffic:
    """Bytes moved between ranks: ``links[s, d]`` from rank s to rank d, and per
    communication (by path) the most bytes one rank receives in it."""

    links: torch.Tensor
    by_communication: dict[str, tuple[str, int, int]]  # path -> (text, iterations, max bytes)
    in_flight: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    """Per pipelined loop (by path): its index, how many iterations' values are alive at
    once and the bytes one iteration allocates on a rank (``hostir.run.pipelined_loops``)."""

    @property
    def received(self) -> torch.Tensor:
        """Bytes each rank receives."""
        return self.links.sum(dim=0)

    @property
    def sent(self) -> torch.Tensor:
        """Bytes each rank sends."""
        return self.links.sum(dim=1)


def count_traffic(
    program: HostIrContainer, world_size: int, bindings: Mapping[str, int] | None = None
) -> Traffic:
    """The traffic of ``program`` on ``world_size`` ranks; ``bindings`` gives symbolic
    extents (``{"i0": 128}``). A HostIrError names what is unknown or out of the world."""
    env = dict(bindings or {})
    links = torch.zeros(world_size, world_size, dtype=torch.float64)  # exact below 2**53
    by_communication: dict[str, tuple[str, int, int]] = {}
    moved = 0  # the bytes added into links, in an int: whether they stay exact
    for occurrence in communications(program.body, env):
        path, instruction, times = occurrence.path, occurrence.instruction, occurrence.times
        team = instruction.team  # type: ignore[attr-defined]
        if team.mesh.max_device() >= world_size:
            raise HostIrError(
                f"{path} ({keyword(instruction)}): its team's mesh reaches device"
                f" {team.mesh.max_device()}, outside a world of {world_size} ranks"
            )
        itemsize = instruction.src.dtype.to_torch().itemsize  # type: ignore[attr-defined]
        received = torch.zeros(world_size, dtype=torch.float64)
        for group in team.groups:
            for flow in exchange(instruction, group, occurrence.env):
                if flow.elements is None:
                    raise HostIrError(
                        f"{path} ({keyword(instruction)} of {instruction.src.name}): its extents"  # type: ignore[attr-defined]
                        " are symbolic; give them with --bind NAME=VALUE"
                    )
                if flow.local_copy:
                    continue
                size = flow.elements * itemsize
                moved += size * times * len(flow.sources) * len(flow.destinations)
                if moved >= MAX_EXACT_BYTES:
                    raise HostIrError(
                        f"{path} ({keyword(instruction)}): the traffic comes to {moved} bytes"
                        f" or more ({times} iterations), past the {MAX_EXACT_BYTES} a count"
                        " keeps exactly"
                    )
                _add(links, received, flow.sources, flow.destinations, size, times)
        text, count, most = by_communication.get(path, (_describe(instruction), 0, 0))
        by_communication[path] = (text, count + times, max(most, int(received.max())))
    links.fill_diagonal_(0)  # a rank in both ends of a flow does not send to itself
    return Traffic(links, by_communication, _pipelined_loops(program.body, env))


def _pipelined_loops(
    body: tuple[Instruction, ...], env: Mapping[str, int], path: str = "body"
) -> dict[str, tuple[str, int, int]]:
    """The buffers each pipelined loop of ``body`` keeps in flight (see ``Traffic``)."""
    found = {}
    for index, instruction in enumerate(body):
        if not isinstance(instruction, ForLoop):
            continue
        where = f"{path}[{index}]"
        counted = in_flight(instruction, dict(env)) if is_pipelined(instruction) else None
        if counted is not None:
            found[where] = (instruction.index.name, *counted)
        found.update(_pipelined_loops(instruction.body, env, f"{where}.body"))
    return found


def _add(
    links: torch.Tensor,
    received: torch.Tensor,
    sources: tuple[int, ...],
    destinations: tuple[int, ...],
    size: int,
    times: int = 1,
) -> None:
    """Adds ``size`` bytes from every source to every destination but itself, ``times``
    times into ``links`` and once into ``received`` (one iteration's)."""
    s = torch.tensor(sources)
    d = torch.tensor(destinations)
    links[s.unsqueeze(1), d] += size * times
    senders = torch.full((len(destinations),), float(len(sources) * size), dtype=torch.float64)
    senders -= torch.isin(d, s).to(torch.float64) * size
    received.index_add_(0, d, senders)


def _describe(instruction: Instruction) -> str:
    team = instruction.team  # type: ignore[attr-defined]
    return (
        f"{keyword(instruction)} {instruction.src.name} -> {instruction.out.name}"  # type: ignore[attr-defined]
        f" over {len(team.groups)} group(s) of {team.size}"
    )


def _bytes(value: float) -> str:
    return f"{int(value)} B"


def per_rank_lines(links: torch.Tensor) -> list[str]:
    """``received per rank: min .., median .., max .. (rank r)`` and the same for ``sent``,
    from the rank-by-rank bytes ``links[s, d]`` (counted, or measured by a simulated run)."""
    lines = []
    for name, per_rank in (("received", links.sum(dim=0)), ("sent", links.sum(dim=1))):
        values = per_rank.tolist()
        busiest = int(per_rank.argmax())
        lines.append(
            f"{name} per rank: min {_bytes(min(values))}, median"
            f" {_bytes(statistics.median(values))}, max {_bytes(values[busiest])} (rank {busiest})"
        )
    return lines


def traffic_report(traffic: Traffic) -> str:
    """The summary ``hostir traffic`` prints: per-rank min, median and max bytes received
    and sent, the busiest link, and each communication's most bytes received by a rank."""
    world = traffic.links.shape[0]
    lines = per_rank_lines(traffic.links)
    flat = int(traffic.links.argmax())
    source, destination = divmod(flat, world)
    most = float(traffic.links[source, destination])
    if most > 0:
        lines.append(f"busiest link: rank {source} -> rank {destination}, {_bytes(most)}")
    else:
        lines.append("busiest link: none (no rank sends to another)")
    if not traffic.by_communication:
        lines.append("per communication: none (the program has no communication)")
    else:
        lines.append("per communication (the most bytes one rank receives, over its iterations):")
    for path, (text, count, most_received) in traffic.by_communication.items():
        times = f", {count} iterations" if count > 1 else ""
        lines.append(f"  {path} {text}: {_bytes(most_received)} per iteration at most{times}")
    if traffic.in_flight:
        lines.append("pipelined loops (what one rank's iterations in flight hold at once):")
    for path, (index, iterations, each) in traffic.in_flight.items():
        lines.append(
            f"  {path} for {index}: {iterations} iterations x {_bytes(each)} ="
            f" {_bytes(iterations * each)}"
        )
    return "\n".join(lines)
