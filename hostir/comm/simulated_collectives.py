"""What a collective does once every member of its group posted it, in a simulated world.

:mod:`hostir.comm.simulated_world` pairs the members' posts of one collective (the k-th
post of each member on one group, as torch.distributed pairs them) and hands them here,
in group order: :func:`mismatch` says, naming ranks, why the posts cannot be one
collective (a real run would hang or deliver garbage), :func:`complete` moves the data
into the members' buffers, and :func:`sent_elements` says how many elements each member
sent each other member.

The element counts follow the same logical model as ``hostir traffic``'s static count
(hostir.analysis.exchanges), written here again from the buffers the members posted, not
from the program: an Allreduce is a reduce-scatter then an all-gather of ``numel // n``
elements per chunk, a Reduce sends every member's whole buffer to the root, a broadcast
sends the root's to every member, an alltoallv sends what its splits say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hostir.comm.rank_text import describe_group
from hostir.ir.sharding import ReduceOp

Group = tuple[int, ...]


@dataclass
class Post:
    """One member's call of a collective: its kind, its tensors and options by name, the
    rank that posted it, and the program run it belongs to (where counted)."""

    rank: int
    kind: str
    args: dict[str, Any] = field(default_factory=dict)
    run: Any = None  # the program run it belongs to, where the world counts by run

    def options(self) -> tuple:
        """What every member must pass alike: the kind, and its root, op or peers."""
        return (self.kind, self.args.get("root"), self.args.get("op"))


def mismatch(posts: Sequence[Post], group: Group, index: int) -> str | None:
    """Why the members' posts (in group order) are not one collective, or None."""
    where = f"their collective number {index + 1} on group {describe_group(group)}"
    first = posts[0]
    for post in posts[1:]:
        if post.options() != first.options():
            return (
                f"rank {first.rank} posted {_call(first)} and rank {post.rank} posted"
                f" {_call(post)} as {where}"
            )
    kind = first.kind
    if kind in ("allgather", "allreduce", "reduce", "broadcast", "gather", "all_to_all"):
        key = "tensor" if kind in ("allreduce", "reduce", "broadcast") else "inp"
        for post in posts[1:]:
            a, b = first.args[key], post.args[key]
            if a.shape != b.shape or a.dtype != b.dtype:
                return (
                    f"{kind} over {describe_group(group)}: rank {first.rank} posts"
                    f" {describe_tensor(a)} and rank {post.rank} {describe_tensor(b)} as {where}"
                )
    if kind == "all_to_all_v":
        for p, sender in enumerate(posts):
            for q, receiver in enumerate(posts):
                sent, expected = sender.args["in_splits"][q], receiver.args["out_splits"][p]
                if sent != expected:
                    return (
                        f"all_to_all_v over {describe_group(group)}: rank {sender.rank} sends"
                        f" {sent} elements to rank {receiver.rank}, which expects {expected},"
                        f" as {where}"
                    )
    if kind == "reduce_scatter":
        shapes = {(tuple(p.args["inp"].shape), p.args["inp"].dtype) for p in posts}
        if len(shapes) > 1:
            return (
                f"reduce_scatter over {describe_group(group)}: the members post inputs of"
                f" different shapes or dtypes ({sorted(map(str, shapes))}) as {where}"
            )
    return None


def _call(post: Post) -> str:
    root, op = post.args.get("root"), post.args.get("op")
    extra = [f"root {root}"] if root is not None else []
    extra += [f"op {op.value}"] if op is not None else []
    return post.kind + (f" ({', '.join(extra)})" if extra else "")


def describe_tensor(tensor: torch.Tensor) -> str:
    """``float32[2, 3]``: a posted buffer's dtype and shape, for messages."""
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"


def complete(posts: Sequence[Post]) -> None:
    """Moves the data of one collective whose members posted ``posts`` (group order),
    every member's results computed before any is written (buffers may alias: an
    Allreduce works in place)."""
    COMPLETE[posts[0].kind]([post.args for post in posts])


def _allgather(args: list[dict]) -> None:
    sent = [b["inp"].clone() for b in args]  # an input may be a view of its rank's out
    for a in args:
        for p, piece in enumerate(sent):
            a["out"][p].copy_(piece)


def _reduce_scatter(args: list[dict]) -> None:
    op = args[0]["op"]
    results = [_reduce([b["inp"][q] for b in args], op) for q in range(len(args))]
    for a, result in zip(args, results, strict=True):
        a["out"].copy_(result)


def _allreduce(args: list[dict]) -> None:
    result = _reduce([a["tensor"] for a in args], args[0]["op"])
    for a in args:
        a["tensor"].copy_(result)


def _broadcast(args: list[dict]) -> None:
    root = args[0]["root"]
    source = args[root]["tensor"].clone()
    for p, a in enumerate(args):
        if p != root:
            a["tensor"].copy_(source)


def _reduce_to_root(args: list[dict]) -> None:
    root = args[0]["root"]  # the others keep their tensor: "scratch", as in a real run
    args[root]["tensor"].copy_(_reduce([a["tensor"] for a in args], args[0]["op"]))


def _gather(args: list[dict]) -> None:
    out = args[args[0]["root"]]["out"]
    sent = [a["inp"].clone() for a in args]  # the root's input may be a view of its out
    for p, piece in enumerate(sent):
        out[p].copy_(piece)


def _scatter(args: list[dict]) -> None:
    inp = args[args[0]["root"]]["inp"]
    pieces = [inp[q].clone() for q in range(len(args))]
    for a, piece in zip(args, pieces, strict=True):
        a["out"].copy_(piece)


def _all_to_all(args: list[dict]) -> None:
    n = len(args)
    pieces = [[b["inp"][q].clone() for b in args] for q in range(n)]
    for a, received in zip(args, pieces, strict=True):
        for p, piece in enumerate(received):
            a["out"][p].copy_(piece)


def _all_to_all_v(args: list[dict]) -> None:
    n = len(args)
    sent = [torch.split(a["inp"], a["in_splits"]) for a in args]
    received = [[sent[p][q].clone() for p in range(n)] for q in range(n)]
    for a, pieces in zip(args, received, strict=True):
        a["out"].copy_(torch.cat(pieces))


def _everyone(args: list[dict]) -> None:
    everyone = [a["value"] for a in args]  # one list, read by every rank
    for a in args:
        a["result"] = everyone


COMPLETE = {
    "allgather": _allgather,
    "reduce_scatter": _reduce_scatter,
    "allreduce": _allreduce,
    "broadcast": _broadcast,
    "reduce": _reduce_to_root,
    "gather": _gather,
    "scatter": _scatter,
    "all_to_all": _all_to_all,
    "all_to_all_v": _all_to_all_v,
    "exchange_codes": _everyone,
    "exchange_objects": _everyone,
    "barrier": lambda args: None,
}
"""How each kind of collective moves its data, given its members' arguments in group order."""


def _reduce(tensors: Sequence[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    """The ``op``-reduction of ``tensors`` in member order, in their dtype (as a backend
    reduces; the order of a sum may differ from a real run's in the last bits)."""
    result = tensors[0].clone()
    for tensor in tensors[1:]:
        if op is ReduceOp.SUM:
            result += tensor
        elif op is ReduceOp.PROD:
            result *= tensor
        elif op is ReduceOp.MAX:
            torch.maximum(result, tensor, out=result)
        else:
            torch.minimum(result, tensor, out=result)
    return result


def sent_elements(posts: Sequence[Post]) -> torch.Tensor | None:
    """``m[p, q]``: the elements member ``p`` sends member ``q`` in this collective
    (``hostir traffic``'s model, see the module docstring; the diagonal is a member's
    copy to itself, which the caller drops); None for the agreement's exchanges, which
    are no program traffic."""
    kind, n = posts[0].kind, len(posts)
    args = [post.args for post in posts]
    m = torch.zeros(n, n, dtype=torch.float64)
    if kind == "allgather":
        m[:] = args[0]["inp"].numel()
    elif kind in ("reduce_scatter", "all_to_all"):
        m[:] = args[0]["inp"].numel() // n
    elif kind == "allreduce":
        m[:] = 2 * (args[0]["tensor"].numel() // n)
    elif kind == "broadcast":
        m[args[0]["root"], :] = args[0]["tensor"].numel()
    elif kind in ("reduce", "gather"):
        key = "tensor" if kind == "reduce" else "inp"
        m[:, args[0]["root"]] = args[0][key].numel()
    elif kind == "scatter":
        m[args[0]["root"], :] = args[0]["out"].numel()
    elif kind == "all_to_all_v":
        m[:] = torch.tensor([a["in_splits"] for a in args], dtype=torch.float64)
    else:
        return None
    return m
