"""Static traffic: the bytes each rank sends and receives in a program, without running it.

:func:`count_traffic` walks the program (loops with constant bounds, each
iteration), asks each communication's exchange function
(:mod:`hostir.analysis.exchanges`) for its flows in every group of its team, and adds
them into a rank-by-rank matrix of bytes. A rank's copy to itself is not
traffic. The flows are compact (an all-gather over ``n`` ranks is one flow),
so a program on 4096 ranks counts in well under a second; ``hostir traffic``
prints the summary (:func:`traffic_report`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

from hostir.analysis.exchanges import exchange
from hostir.analysis.pipeline_stages import in_flight, is_pipelined
from hostir.errors import HostIrError
from hostir.ir.catalog import COMMUNICATING, declaration_of, keyword
from hostir.ir.container import HostIrContainer
from hostir.ir.instructions import ForLoop, Instruction
from hostir.ir.scalars import evaluate_scalar


def communications(
    body: tuple[Instruction, ...], env: Mapping[str, int], path: str = "body"
) -> Iterator[tuple[str, Instruction, Mapping[str, int]]]:
    """Each communication of ``body`` (its path, e.g. ``body[3].body[1]``) at each
    iteration of the loops around it, with ``env`` and that iteration's loop indices."""
    for index, instruction in enumerate(body):
        where = f"{path}[{index}]"
        if declaration_of(type(instruction)).kind in COMMUNICATING:
            yield where, instruction, env
        elif isinstance(instruction, ForLoop):
            name = instruction.index.name
            for value in loop_range(instruction, env):
                yield from communications(instruction.body, {**env, name: value}, f"{where}.body")


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
    for path, instruction, iteration_env in communications(program.body, env):
        team = instruction.team  # type: ignore[attr-defined]
        if team.mesh.max_device() >= world_size:
            raise HostIrError(
                f"{path} ({keyword(instruction)}): its team's mesh reaches device"
                f" {team.mesh.max_device()}, outside a world of {world_size} ranks"
            )
        itemsize = instruction.src.dtype.to_torch().itemsize  # type: ignore[attr-defined]
        received = torch.zeros(world_size, dtype=torch.float64)
        for group in team.groups:
            for flow in exchange(instruction, group, iteration_env):
                if flow.elements is None:
                    raise HostIrError(
                        f"{path} ({keyword(instruction)} of {instruction.src.name}): its extents"  # type: ignore[attr-defined]
                        " are symbolic; give them with --bind NAME=VALUE"
                    )
                if flow.local_copy:
                    continue
                _add(links, received, flow.sources, flow.destinations, flow.elements * itemsize)
        text, count, most = by_communication.get(path, (_describe(instruction), 0, 0))
        by_communication[path] = (text, count + 1, max(most, int(received.max())))
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
) -> None:
    """Adds ``size`` bytes from every source to every destination but itself."""
    s = torch.tensor(sources)
    d = torch.tensor(destinations)
    links[s.unsqueeze(1), d] += size
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


def traffic_report(traffic: Traffic) -> str:
    """The summary ``hostir traffic`` prints: per-rank min, median and max bytes received
    and sent, the busiest link, and each communication's most bytes received by a rank."""
    world = traffic.links.shape[0]
    lines = []
    for name, per_rank in (("received", traffic.received), ("sent", traffic.sent)):
        values = per_rank.tolist()
        busiest = int(per_rank.argmax())
        lines.append(
            f"{name} per rank: min {_bytes(min(values))}, median"
            f" {_bytes(statistics.median(values))}, max {_bytes(values[busiest])} (rank {busiest})"
        )
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
