"""A Megatron-style tensor-parallel transformer block, forward (nvFuser's
``transformer_forward_definition`` in tests/python/multidevice/test_transformer.py of
NVIDIA/Fuser, without dropout):

    x1  = x + proj(attention(qkv(layernorm0(x))))     # attention, heads sharded
    out = x1 + linear1(tanh_gelu(linear0(layernorm1(x1))))  # MLP, 4E sharded

Each layernorm is written from ``var_mean`` (eps 1e-5, a weight and a bias), in Float. The
QKV linear is column-parallel (its weight and bias sharded over their 3E output features,
laid out head by head as in nvFuser's test, so each rank holds whole heads): its output is
reshaped to ``[B, S, H, 3E/H]``, sliced into q, k and v and permuted to ``[B, H, S, E/H]``,
each rank attending over its own heads (causal ``sdpfa_fwd``). The out-projection is
row-parallel (its weight sharded over its input features): each rank's product is partial
and one Allreduce sums it, the bias added after. The MLP is the same pair: a
column-parallel linear to 4E, tanh GELU, a row-parallel linear and its Allreduce. So the
program has exactly 2 Allreduces on more than one rank, and on one rank none (each sum
is over a one-device team: a local copy). In bf16 the inputs, weights,
linears and attention are bf16 and the layernorms, GELU and residuals Float, with casts
where nvFuser's test puts them. Run on 4 local CPU ranks with::

    hostir run examples/tensor_parallel_block.py --nproc 4

(1, 2 or 4 ranks: the rank count must divide the 4 heads.) Rank 0 prints the host IR
program; every rank checks its output against a single-device torch reference
(``F.layer_norm``, ``F.linear``, ``F.scaled_dot_product_attention``, ``F.gelu``) and the
script exits non-zero on a mismatch, or if the program has other than 2 Allreduces (0 on
one rank). ``define(d, dtype, saved=True)`` also outputs what the backward
(examples/tensor_parallel_block_backward.py, docs/transformer_block.md) reads.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import default_communicator

BATCH, SEQUENCE, EMBEDDING, HEADS = 2, 16, 32, 4
EPS = 1e-5


def input_specs(
    batch: int = BATCH, sequence: int = SEQUENCE, embedding: int = EMBEDDING
) -> tuple[tuple[str, tuple[int, ...], int | None], ...]:
    """The block's inputs in order for these sizes: name, shape and the dim sharded over
    the mesh (None: replicated). Column-parallel weights and biases are sharded on their
    output features, row-parallel weights on their input features."""
    e = embedding
    return (
        ("x", (batch, sequence, e), None),
        ("ln0_weight", (e,), None),
        ("ln0_bias", (e,), None),
        ("qkv_weight", (3 * e, e), 0),
        ("qkv_bias", (3 * e,), 0),
        ("proj_weight", (e, e), 1),
        ("proj_bias", (e,), None),
        ("ln1_weight", (e,), None),
        ("ln1_bias", (e,), None),
        ("mlp0_weight", (4 * e, e), 0),
        ("mlp0_bias", (4 * e,), 0),
        ("mlp1_weight", (e, 4 * e), 1),
        ("mlp1_bias", (e,), None),
    )


INPUTS = input_specs()
"""The block's inputs at this example's sizes (:func:`input_specs`)."""

SAVED = (
    ("ln0_mean", (BATCH, SEQUENCE), None, DataType.Float),
    ("ln0_rstd", (BATCH, SEQUENCE), None, DataType.Float),
    ("qkv", (BATCH, SEQUENCE, 3 * EMBEDDING), 2, None),
    ("attention", (BATCH, HEADS, SEQUENCE, EMBEDDING // HEADS), 1, None),
    ("logsumexp", (BATCH, HEADS, SEQUENCE), 1, DataType.Float),
    ("philox_seed", (2,), None, DataType.UInt64),
    ("philox_offset", (), None, DataType.UInt64),
    ("x1", (BATCH, SEQUENCE, EMBEDDING), None, DataType.Float),
    ("ln1_mean", (BATCH, SEQUENCE), None, DataType.Float),
    ("ln1_rstd", (BATCH, SEQUENCE), None, DataType.Float),
    ("linear0", (BATCH, SEQUENCE, 4 * EMBEDDING), 2, None),
)
"""What ``define(..., saved=True)`` outputs after the block's output, for the backward
(examples/tensor_parallel_block_backward.py), as nvFuser's forward test saves them: name,
shape, the dim sharded over the mesh (None: replicated) and dtype (None: the block's).
Each layernorm's mean and rstd (Float, ``[B, S]``); the QKV linear's output (its 3E
sharded: whole heads); attention's output ``[B, H, S, E/H]`` and logsumexp (heads
sharded) and its philox seed and offset as ``sdpfa_fwd`` returns them (0: no dropout);
``x1``, the residual after attention (Float, the second layernorm's input); and the
MLP's first linear before GELU (4E sharded)."""


def _cast(fd: FusionDefinition, tv, dtype: DataType):
    """``tv`` cast to ``dtype``, or ``tv`` itself when it has that dtype already (float32
    runs have no casts)."""
    return tv if tv.dtype == dtype else fd.ops.cast(tv, dtype)


def _layernorm(fd: FusionDefinition, x, weight, bias, shape: list[int] | None = None):
    """nvFuser's layernorm over the last dim of ``x`` (in Float, of ``shape``, this
    example's ``[B, S, E]`` by default): ``var_mean``, ``rsqrt``, then the weight and bias
    (cast to Float). Returns the output, the mean and the rstd (the last two are what the
    backward reads)."""
    b, s, e = shape or (BATCH, SEQUENCE, EMBEDDING)
    var, mean = fd.ops.var_mean(x, dims=[2], correction=0, keepdim=False)
    rstd = fd.ops.rsqrt(fd.ops.add(var, fd.define_scalar(EPS, dtype=DataType.Double)))
    centered = fd.ops.sub(x, fd.ops.broadcast_in_dim(mean, shape=[b, s, e], broadcast_dims=[0, 1]))
    normed = fd.ops.mul(
        centered, fd.ops.broadcast_in_dim(rstd, shape=[b, s, e], broadcast_dims=[0, 1])
    )
    weight, bias = _cast(fd, weight, DataType.Float), _cast(fd, bias, DataType.Float)
    return fd.ops.add(fd.ops.mul(normed, weight), bias), mean, rstd


def define(
    d: int,
    dtype: torch.dtype = torch.float32,
    saved: bool = False,
    *,
    sequence: int = SEQUENCE,
    embedding: int = EMBEDDING,
) -> tuple[FusionDefinition, list]:
    """The block in ``dtype`` (float32 or bfloat16), scheduled over a 1-d mesh of ``d``
    devices; returns the fusion and its inputs' tensors, in :data:`INPUTS`' order. With
    ``saved`` the fusion also outputs, after the block's output, what the backward reads
    (:data:`SAVED`, in order); without it the program is the block's alone. ``sequence``
    and ``embedding`` size the block otherwise (:func:`input_specs`; benchmarks/layers.py
    times it so; :data:`SAVED`'s shapes are those of the defaults)."""
    b, s, e, h = BATCH, sequence, embedding, HEADS
    specs = input_specs(b, s, e)
    dt = DataType.from_torch(dtype)
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(shape, dtype=dt) for _, shape, _ in specs]
        x, ln0_w, ln0_b, qkv_w, qkv_b, proj_w, proj_b = tvs[:7]
        ln1_w, ln1_b, mlp0_w, mlp0_b, mlp1_w, mlp1_b = tvs[7:]
        x_float = _cast(fd, x, DataType.Float)
        normed, ln0_mean, ln0_rstd = _layernorm(fd, x_float, ln0_w, ln0_b, [b, s, e])
        normed = _cast(fd, normed, dt)
        qkv = fd.ops.linear(normed, qkv_w, qkv_b)  # [b, s, 3e], 3e sharded
        heads = fd.ops.reshape(qkv, [b, s, h, 3 * e // h])  # h sharded
        q, k, v = (
            fd.ops.permute(
                fd.ops.slice(heads, [0, 0, 0, i * e // h], [b, s, h, (i + 1) * e // h]),
                [0, 2, 1, 3],
            )
            for i in range(3)
        )  # [b, h, s, e/h]
        causal = fd.define_scalar(True, dtype=DataType.Bool)
        sdpa, logsumexp, seed, offset = fd.ops.sdpfa_fwd(q, k, v, is_causal=causal)
        attention = fd.ops.reshape(fd.ops.permute(sdpa, [0, 2, 1, 3]), [b, s, e])
        projected = fd.ops.linear(attention, proj_w)  # partial: Allreduce
        projected = fd.ops.add(projected, proj_b)
        x1 = fd.ops.add(x_float, _cast(fd, projected, DataType.Float))
        normed, ln1_mean, ln1_rstd = _layernorm(fd, x1, ln1_w, ln1_b, [b, s, e])
        normed = _cast(fd, normed, dt)
        linear0 = fd.ops.linear(normed, mlp0_w, mlp0_b)  # [b, s, 4e], 4e sharded
        hidden = _cast(fd, fd.ops.gelu(_cast(fd, linear0, DataType.Float), "tanh"), dt)
        mlp = fd.ops.add(fd.ops.linear(hidden, mlp1_w), mlp1_b)  # partial: Allreduce
        out = _cast(fd, fd.ops.add(x1, _cast(fd, mlp, DataType.Float)), dt)
        fd.add_output(out)
        if saved:
            add_saved(
                fd,
                {
                    "ln0_mean": ln0_mean,
                    "ln0_rstd": ln0_rstd,
                    "qkv": qkv,
                    "attention": sdpa,
                    "logsumexp": logsumexp,
                    "philox_seed": seed,
                    "philox_offset": offset,
                    "x1": x1,
                    "ln1_mean": ln1_mean,
                    "ln1_rstd": ln1_rstd,
                    "linear0": linear0,
                },
            )
    shard_inputs(tvs, [dim for _, _, dim in specs], mesh)
    return fd, tvs


def add_saved(fd: FusionDefinition, tensors: dict) -> None:
    """Outputs what the backward reads, in :data:`SAVED`'s order (the one place that order is
    written): ``tensors`` maps each SAVED name to the forward's tensor."""
    for name, _, _, _ in SAVED:
        fd.add_output(tensors[name])


def shard_inputs(tvs: list, dims: list[int | None], mesh: DeviceMesh) -> None:
    """Schedules each of ``tvs`` on the 1-d ``mesh``, its dim in ``dims`` (None:
    replicated) split over the mesh's devices and parallelized on ``mesh_x``."""
    for tv, dim in zip(tvs, dims, strict=True):
        tv.set_device_mesh(mesh)
        if dim is not None:
            tv.outer_split(dim, mesh.size)
            tv.axis(dim).parallelize(ParallelType.mesh_x)


def fusion(world_size: int = 4) -> FusionDefinition:
    """What ``hostir dump``, ``viz`` and ``traffic`` lower (docs/cli.md): the scheduled
    fusion for ``world_size`` ranks, not run; 4 by default, as in the run above."""
    return define(world_size)[0]


def random_inputs(
    dtype: torch.dtype = torch.float32, seed: int = 0, specs=INPUTS
) -> list[torch.Tensor]:
    """Full (unsharded) inputs of ``specs`` (:func:`input_specs`): activations ``randn``,
    weights scaled by 1/sqrt(fan-in), layernorm weights near 1 and biases near 0, in
    ``dtype``; the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    full = []
    for name, shape, _ in specs:
        t = torch.randn(shape, generator=generator)
        if name.endswith("weight") and len(shape) == 2:
            t = t / shape[1] ** 0.5
        elif name.startswith("ln") and name.endswith("weight"):
            t = 1 + 0.1 * t
        elif name.endswith("bias"):
            t = 0.1 * t
        full.append(t.to(dtype))
    return full


def reference(full: list[torch.Tensor], heads: int = HEADS) -> torch.Tensor:
    """The block on one device with torch's own ops, with the dtype flow of :func:`define`:
    layernorms, GELU and residuals in Float, linears and attention in the inputs' dtype;
    ``x`` of any shape ``[B, S, E]``, ``heads`` attention heads."""
    (b, s, e), h = full[0].shape, heads
    x, ln0_w, ln0_b, qkv_w, qkv_b, proj_w, proj_b, ln1_w, ln1_b = full[:9]
    mlp0_w, mlp0_b, mlp1_w, mlp1_b = full[9:]
    dtype = x.dtype

    def layernorm(t, weight, bias):
        return F.layer_norm(t, (e,), weight.float(), bias.float(), EPS).to(dtype)

    x = x.float()
    heads = F.linear(layernorm(x, ln0_w, ln0_b), qkv_w, qkv_b).view(b, s, h, 3 * e // h)
    q, k, v = (t.transpose(1, 2) for t in heads.split(e // h, dim=-1))
    attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    attention = attention.transpose(1, 2).reshape(b, s, e)
    x1 = x + (F.linear(attention, proj_w) + proj_b).float()
    hidden = F.linear(layernorm(x1, ln1_w, ln1_b), mlp0_w, mlp0_b)
    hidden = F.gelu(hidden.float(), approximate="tanh").to(dtype)
    return (x1 + (F.linear(hidden, mlp1_w) + mlp1_b).float()).to(dtype)


def tolerance(expected: torch.Tensor) -> dict[str, float]:
    """How close a rank's output must be to the reference ``expected``: float32 to 1e-5
    (relative and absolute); bf16 to torch's bf16 ``rtol`` (1.6e-2) and, as ``atol``, one
    bf16 epsilon (2^-7) of the output's largest magnitude: the linears round their
    activations (and a row-parallel rank its partial sums) to bf16, so an output near 0
    carries the rounding of values as large as the others (measured on 20 seeds at 1, 2
    and 4 ranks: at most 0.8 of that ``atol`` beyond the ``rtol``)."""
    if expected.dtype == torch.bfloat16:
        return {"rtol": 1.6e-2, "atol": 2**-7 * expected.abs().max().item()}
    return {"rtol": 1e-5, "atol": 1e-5}


def run(dtype: torch.dtype = torch.float32) -> bool:
    """Runs the block on this rank in ``dtype``, checks it and prints one line; returns
    whether the output matched the reference and the program had its 2 Allreduces (none
    on one rank, where each is a local copy)."""
    world = default_communicator()  # joins the launcher's process group, if any
    d, rank = world.world_size, world.rank
    full = random_inputs(dtype)
    fd, tvs = define(d, dtype)
    (y,) = fd.execute([shard_tensor(t, tv) for t, tv in zip(full, tvs, strict=True)])
    program = str(fd.host_ir())
    if rank == 0 and dtype == torch.float32:
        print(program)
    allreduces = program.count(" = Allreduce(")
    expected = reference(full)
    error = (y.float() - expected.float()).abs().max().item()
    close = y.dtype == dtype and torch.allclose(y.float(), expected.float(), **tolerance(expected))
    ok = close and allreduces == (2 if d > 1 else 0)
    print(
        f"rank {rank}/{d}: {str(dtype).removeprefix('torch.')} output {tuple(y.shape)},"
        f" {allreduces} Allreduces, max error {error:.2e}, {'OK' if ok else 'MISMATCH'}\n",
        end="",  # one write: ranks share the terminal or pipe, lines must not interleave
        flush=True,
    )
    return ok


def main() -> int:
    """Runs the example in float32, then bf16, on this rank; returns the exit status."""
    results = [run(dtype) for dtype in (torch.float32, torch.bfloat16)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
