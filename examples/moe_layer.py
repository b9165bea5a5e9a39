"""An expert-parallel mixture-of-experts layer: tokens dispatched to the device that holds
their expert by counts known only at run time, each device's experts computed locally,
the results combined with the router's weights.

Every tensor has a leading dim of ``D`` split over the mesh: ``x[p]`` is device p's tokens,
``w1[p]``, ``w2[p]`` its experts (expert ``e`` is ``w1[e // L, e % L]``, ``L = ceil(E /
D)``; with E not a multiple of D the last device's trailing slots hold padding experts the
router never picks). Per device, in order:

1. **route**: ``softmax(x @ router.T)``, ``topk`` (any k >= 1): k experts and weights per
   token;
2. **sort** the ``t * k`` (token, choice) pairs by expert (a stable ``argsort``): rows bound
   for one device are consecutive, device by device;
3. **count** the rows bound for each device (``[D, D]``, row p device p's) and **dispatch**:
   ``ragged_all_to_all`` sends each device its rows and, by the same counts, their expert
   ids: device q receives ``r`` rows, a run-time extent (lowering gathers the counts with
   one Allgather, reads them to the host once, and emits two ``RaggedAllToAll``);
4. **experts**: the received rows sorted by local expert, its group ends counted, and a
   ``gelu`` MLP as two batched ``grouped_mm`` on the device's own experts (no gather);
5. **combine**: rows put back in arrival order, sent back by the transposed counts, put
   back in (token, choice) order, weighted by the router's weights and summed over the k
   choices.

Run it on 4 local CPU ranks with::

    hostir run examples/moe_layer.py --nproc 4

(any rank count). Rank 0 prints the host IR program; every rank checks its dispatched
rows and its output against a single-device torch reference, bitwise, and the script
exits non-zero on a mismatch. ``hostir dump``, ``viz`` and ``traffic`` read
``fusion(world_size)``; ``traffic`` counts the exchanges under uniform routing
(docs/run_time_extents.md).
"""

from __future__ import annotations

import sys

import torch

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType
from hostir import default_communicator

TOKENS, HIDDEN, FFN, EXPERTS, TOP_K = 8, 16, 32, 6, 2
"""Per device: tokens; the model's sizes; experts in all; experts each token picks."""


def slots(d: int, experts: int = EXPERTS) -> int:
    """Experts per device, ``ceil(experts / d)`` (padding slots where it does not divide)."""
    return -(-experts // d)


def _cast(fd: FusionDefinition, tv, dtype: DataType):
    """``tv`` cast to ``dtype``, or ``tv`` itself when it has that dtype already."""
    return tv if tv.dtype == dtype else fd.ops.cast(tv, dtype)


def _softmax(fd: FusionDefinition, logits, dim: int):
    """``softmax`` along ``dim`` written from nvFuser's ops (max, exp, sum, div)."""
    shape = fd.ops.shape(logits)
    kept = [i for i in range(len(shape)) if i != dim]
    biggest = fd.ops.broadcast_in_dim(fd.ops.max(logits, dims=[dim]), shape, kept)
    exps = fd.ops.exp(fd.ops.sub(logits, biggest))
    total = fd.ops.broadcast_in_dim(fd.ops.sum(exps, dims=[dim]), shape, kept)
    return fd.ops.div(exps, total)


def _count(fd: FusionDefinition, ids, length: int):
    """``[D, n]`` ids in ``[0, length)`` -> ``[D, length]`` Int counts of each id per row
    (``eq`` against an ``iota``, summed: every device counts its own row)."""
    d, n = fd.ops.shape(ids)
    wide = [d, n, length]
    hits = fd.ops.eq(
        fd.ops.broadcast_in_dim(ids, wide, [0, 1]),
        fd.ops.broadcast_in_dim(fd.ops.iota(length, dtype=DataType.Int), wide, [2]),
    )
    return fd.ops.sum(fd.ops.cast(hits, DataType.Int), dims=[1])


def _rows(fd: FusionDefinition, tv, index):
    """``tv [D, n, c]`` rows picked along dim 1 by ``index [D, m]``: ``[D, m, c]``."""
    d, m = fd.ops.shape(index)
    picked = fd.ops.broadcast_in_dim(index, [d, m, 1], [0, 1])
    return fd.ops.take_along_axis(tv, picked, 1)


def define(
    d: int, dtype: torch.dtype = torch.float32, k: int = TOP_K, experts: int = EXPERTS
) -> tuple[FusionDefinition, list]:
    """The layer for ``d`` devices in ``dtype`` (float32 or bfloat16; the router in Float),
    each token routed to ``k`` of ``experts``; returns the fusion and its inputs ``x [D, t,
    H]``, ``router [E, H]``, ``w1 [D, L, H, F]``, ``w2 [D, L, F, H]``. Outputs: the layer's
    ``[D, t, H]``, then the rows each device received ``[D, r, H]`` (the dispatch)."""
    dt, per = DataType.from_torch(dtype), slots(d, experts)
    tk = TOKENS * k
    with FusionDefinition() as fd:
        x = fd.define_tensor([d, TOKENS, HIDDEN], dtype=dt)
        router = fd.define_tensor([experts, HIDDEN], dtype=DataType.Float)
        w1 = fd.define_tensor([d, per, HIDDEN, FFN], dtype=dt)
        w2 = fd.define_tensor([d, per, FFN, HIDDEN], dtype=dt)
        # 1. route
        logits = fd.ops.linear(_cast(fd, x, DataType.Float), router)
        weights, chosen = fd.ops.topk(_softmax(fd, logits, 2), k, dim=2, sorted=True)
        # 2. sort the (token, choice) pairs by expert
        flat = fd.ops.reshape(chosen, [d, tk])
        order = fd.ops.argsort(flat, dim=1, stable=True)
        expert = fd.ops.take_along_axis(flat, order, 1)
        token = fd.ops.div(order, k)
        rows = _rows(fd, x, token)
        # 3. count and dispatch
        counts = _count(fd, fd.ops.div(expert, per), d)
        received = fd.ops.ragged_all_to_all(rows, counts)
        arrived = fd.ops.size(received, 1)
        ids = fd.ops.ragged_all_to_all(
            fd.ops.broadcast_in_dim(expert, [d, tk, 1], [0, 1]), counts, extent=arrived
        )
        ids = fd.ops.reshape(ids, [d, arrived])
        # 4. the device's experts
        local = fd.ops.sub(ids, fd.ops.mul(fd.ops.div(ids, per), per))
        grouping = fd.ops.argsort(local, dim=1, stable=True)
        ends = fd.ops.cast(fd.ops.cumsum(_count(fd, local, per), 1), DataType.Int32)
        hidden = fd.ops.grouped_mm(_rows(fd, received, grouping), w1, ends)
        hidden = _cast(fd, fd.ops.gelu(_cast(fd, hidden, DataType.Float)), dt)
        y = fd.ops.grouped_mm(hidden, w2, ends)
        # 5. combine
        y = _rows(fd, y, fd.ops.argsort(grouping, dim=1))  # arrival order
        y = fd.ops.ragged_all_to_all(y, counts, transpose=True, extent=tk)
        y = _rows(fd, y, fd.ops.argsort(order, dim=1))  # (token, choice) order
        y = fd.ops.reshape(_cast(fd, y, DataType.Float), [d, TOKENS, k, HIDDEN])
        scale = fd.ops.broadcast_in_dim(weights, [d, TOKENS, k, HIDDEN], [0, 1, 2])
        out = _cast(fd, fd.ops.sum(fd.ops.mul(y, scale), dims=[2]), dt)
        fd.add_output(out)
        fd.add_output(received)
    mesh = DeviceMesh(torch.arange(d))
    for tv, split in ((x, True), (router, False), (w1, True), (w2, True)):
        tv.set_device_mesh(mesh)
        if split:
            tv.outer_split(0, d)
            tv.axis(0).parallelize(ParallelType.mesh_x)
    return fd, [x, router, w1, w2]


def fusion(world_size: int = 4) -> FusionDefinition:
    """What ``hostir dump``, ``viz`` and ``traffic`` lower (docs/cli.md): the scheduled
    fusion for ``world_size`` ranks, not run."""
    return define(world_size)[0]


def make_inputs(
    d: int, seed: int, dtype: torch.dtype = torch.float32, experts: int = EXPERTS
) -> list[torch.Tensor]:
    """The global inputs for ``d`` devices, the same on every rank for one ``seed``; the
    padding experts' weights are zeros (no token reaches them). Every fourth seed skews the
    router toward expert 0 (most tokens pick it first: one device receives most rows)."""
    generator = torch.Generator().manual_seed(seed)
    per = slots(d, experts)
    x = torch.randn(d, TOKENS, HIDDEN, generator=generator).to(dtype)
    router = torch.randn(experts, HIDDEN, generator=generator)
    if seed % 4 == 3:
        router[0] = x.float().mean((0, 1)) * 20
    w1 = torch.zeros(d * per, HIDDEN, FFN)
    w2 = torch.zeros(d * per, FFN, HIDDEN)
    w1[:experts] = torch.randn(experts, HIDDEN, FFN, generator=generator) / HIDDEN**0.5
    w2[:experts] = torch.randn(experts, FFN, HIDDEN, generator=generator) / FFN**0.5
    w1, w2 = w1.reshape(d, per, HIDDEN, FFN), w2.reshape(d, per, FFN, HIDDEN)
    return [x, router, w1.to(dtype), w2.to(dtype)]


def reference(
    inputs: list[torch.Tensor], k: int = TOP_K, experts: int = EXPERTS
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The layer on one device, written as a user would in torch: the output ``[D, t, H]``
    and, per device, the rows it receives. Each expert's rows are multiplied as one block
    in the order the layer sends them (by source device, then by (token, choice)), so the
    products are bitwise those of the layer."""
    x, router, w1, w2 = inputs
    d, per = x.shape[0], w1.shape[1]
    dtype = x.dtype
    logits = torch.nn.functional.linear(x.float(), router)
    # softmax as the layer writes it (max, exp, sum, div): torch.softmax's fused kernel
    # rounds differently in the last bit, and the check is bitwise
    exps = (logits - logits.amax(2, keepdim=True)).exp()
    probs = exps / exps.sum(2, keepdim=True)
    weights, chosen = torch.topk(probs, k, dim=2, sorted=True)
    flat = chosen.reshape(d, -1)
    order = torch.argsort(flat, dim=1, stable=True)
    experts_sorted, tokens_sorted = torch.gather(flat, 1, order).tolist(), (order // k).tolist()
    # every (source device, position in its sorted rows) by expert, in sending order
    picks: list[list[tuple[int, int]]] = [[] for _ in range(experts)]
    for p in range(d):
        for i, e in enumerate(experts_sorted[p]):
            picks[e].append((p, i))
    outputs = torch.zeros(d, TOKENS * k, HIDDEN, dtype=dtype)
    for e, chosen_rows in enumerate(picks):
        if not chosen_rows:
            continue
        rows = torch.stack([x[p, tokens_sorted[p][i]] for p, i in chosen_rows])
        hidden = (rows @ w1[e // per, e % per]).float()
        y = torch.nn.functional.gelu(hidden).to(dtype) @ w2[e // per, e % per]
        for (p, i), row in zip(chosen_rows, y, strict=True):
            outputs[p, order[p, i]] = row
    out = (outputs.float().reshape(d, TOKENS, k, HIDDEN) * weights[..., None]).sum(2)
    dispatched = []
    for q in range(d):  # arrival order: by source device, then its sorted rows
        mine = [
            x[p, tokens_sorted[p][i]]
            for p in range(d)
            for i, e in enumerate(experts_sorted[p])
            if e // per == q
        ]
        dispatched.append(torch.stack(mine) if mine else x.new_zeros(0, HIDDEN))
    return out.to(dtype), dispatched


def check(d: int, rank: int, seed: int, dtype=torch.float32, k: int = TOP_K, fd=None) -> list[str]:
    """Runs the layer on this rank for routing ``seed``; the mismatches with the reference
    (empty when the rank's output and dispatched rows equal it bitwise)."""
    if fd is None:
        fd = define(d, dtype, k)[0]
    inputs = make_inputs(d, seed, dtype)
    x, router, w1, w2 = inputs
    mine = [x[rank : rank + 1], router, w1[rank : rank + 1], w2[rank : rank + 1]]
    out, received = fd.execute(mine)
    expected, dispatched = reference(inputs, k)
    problems = []
    if not torch.equal(received[0], dispatched[rank]):
        problems.append(f"seed {seed}: rank {rank} received other rows than the reference's")
    if not torch.equal(out[0], expected[rank]):
        error = (out[0].float() - expected[rank].float()).abs().max().item()
        problems.append(f"seed {seed}: rank {rank} output differs, max error {error:.2e}")
    return problems


def main() -> int:
    """Runs the layer on this rank over 4 routings, k = 1 and 2, float32 and bf16; returns
    the exit status."""
    world = default_communicator()
    d, rank = world.world_size, world.rank
    problems = []
    for dtype in (torch.float32, torch.bfloat16):
        for k in (1, 2):
            fd = define(d, dtype, k)[0]
            for seed in range(4):
                problems += check(d, rank, seed, dtype, k, fd)
            if rank == 0 and dtype is torch.float32 and k == TOP_K:
                print(fd.host_ir())
    status = "OK" if not problems else "MISMATCH: " + "; ".join(problems[:3])
    print(
        f"rank {rank}/{d}: {slots(d)} expert slots, 16 runs (float32 and bf16, k = 1 and 2)"
        f" bitwise equal to the reference: {status}\n",
        end="",  # one write: ranks share the terminal or pipe, lines must not interleave
        flush=True,
    )
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
