"""The backward of examples/tensor_parallel_block.py's Megatron tensor-parallel block,
written as a fusion, as nvFuser's ``transformer_backward_definition`` (NVIDIA/Fuser's
tests/python/multidevice/test_transformer.py) writes it, without dropout.

The forward, run with ``define(d, dtype, saved=True)``, outputs what the backward reads
(its ``SAVED``: each layernorm's mean and rstd, the QKV linear's output, attention's output,
logsumexp and philox seed and offset, the residual ``x1`` and the MLP's first linear
before GELU). The backward takes the block's input ``x``, the weights it needs, those
saved tensors and the output's gradient, and gives the gradients of ``x`` and of every
weight and bias, in the forward's input order:

- each layernorm backward is written from the saved mean and rstd, in Float;
- the tanh GELU backward from its formula, in Float;
- each linear's input gradient by ``matmul`` with its weight and its weight gradient by
  ``matmul`` of the output gradient (transposed, batch and sequence flattened) with the
  linear's input, its bias gradient a ``sum`` over batch and sequence in Float;
- attention by ``sdpfa_bwd`` on each rank's own heads, its three gradients joined back
  into the QKV layout by ``cat``.

Sharding follows the forward: the gradients of the column-parallel weights and biases
(QKV, MLP0) are sharded on their output features and those of the row-parallel weights
(projection, MLP1) on their input features, as the weights are, computed with no
communication. The input gradients of the two column-parallel linears contract their
sharded features, so each is partial and one Allreduce sums it: exactly 2 Allreduces at
more than one rank. Everything else is computed from replicated values (the layernorms'
and the replicated biases' gradients too) and needs no collective. Run on 4 local CPU
ranks with::

    hostir run examples/tensor_parallel_block_backward.py --nproc 4

Every rank runs the forward and then the backward in float32 and bf16 and checks each
gradient's shard against torch autograd of the forward's single-device reference, and the
script exits non-zero on a mismatch, or if the backward has other than 2 Allreduces (0 on
one rank, where a one-device team's reductions are local copies).
"""

from __future__ import annotations

import sys

import torch
from tensor_parallel_block import (
    BATCH,
    EMBEDDING,
    HEADS,
    INPUTS,
    SAVED,
    SEQUENCE,
    define,
    random_inputs,
    reference,
    shard_inputs,
)

from frontend import DataType, DeviceMesh, FusionDefinition, shard_tensor
from hostir import default_communicator

USED_INPUTS = (
    "x",
    "ln0_weight",
    "ln0_bias",
    "qkv_weight",
    "proj_weight",
    "ln1_weight",
    "ln1_bias",
    "mlp0_weight",
    "mlp1_weight",
)
"""The forward's inputs the backward reads (the layernorms' biases to recompute their
outputs, the linears' inputs; the linears' biases are not needed)."""

GELU_C = (2 / torch.pi) ** 0.5  # tanh GELU: 0.5 x (1 + tanh(C (x + A x^3)))
GELU_A = 0.044715


def _cast(fd: FusionDefinition, tv, dtype: DataType):
    """``tv`` cast to ``dtype``, or ``tv`` itself when it has that dtype already."""
    return tv if tv.dtype == dtype else fd.ops.cast(tv, dtype)


def _bcast(fd: FusionDefinition, tv, dims: list[int]):
    """A ``[B, S]`` (``dims`` [0, 1]) or ``[E]`` (``dims`` [2]) tensor broadcast to
    ``[B, S, E]``."""
    return fd.ops.broadcast_in_dim(tv, shape=[BATCH, SEQUENCE, EMBEDDING], broadcast_dims=dims)


def _normalize(fd: FusionDefinition, x, mean, rstd, weight, bias):
    """The layernorm of ``x`` (Float) recomputed from its saved ``mean`` and ``rstd``:
    returns ``xhat = (x - mean) rstd`` and the output ``xhat w + b`` (Float), the next
    linear's input."""
    xhat = fd.ops.mul(fd.ops.sub(x, _bcast(fd, mean, [0, 1])), _bcast(fd, rstd, [0, 1]))
    weight, bias = _cast(fd, weight, DataType.Float), _cast(fd, bias, DataType.Float)
    return xhat, fd.ops.add(fd.ops.mul(xhat, _bcast(fd, weight, [2])), _bcast(fd, bias, [2]))


def _layernorm_backward(fd: FusionDefinition, grad, xhat, rstd, weight):
    """The layernorm's backward from its output's ``grad`` (cast to Float here), ``xhat``
    and the saved ``rstd``: returns the gradient of its input (Float) and of its weight and
    bias (Float sums over batch and sequence)."""
    grad = _cast(fd, grad, DataType.Float)
    grad_weight = fd.ops.sum(fd.ops.mul(grad, xhat), dims=[0, 1])
    grad_bias = fd.ops.sum(grad, dims=[0, 1])
    grad_xhat = fd.ops.mul(grad, _bcast(fd, _cast(fd, weight, DataType.Float), [2]))
    # dx = rstd (dxhat - mean_E(dxhat) - xhat mean_E(dxhat xhat))
    mean_grad = _bcast(fd, fd.ops.mean(grad_xhat, dims=[2]), [0, 1])
    mean_grad_xhat = _bcast(fd, fd.ops.mean(fd.ops.mul(grad_xhat, xhat), dims=[2]), [0, 1])
    centered = fd.ops.sub(fd.ops.sub(grad_xhat, mean_grad), fd.ops.mul(xhat, mean_grad_xhat))
    return fd.ops.mul(_bcast(fd, rstd, [0, 1]), centered), grad_weight, grad_bias


def _gelu_backward(fd: FusionDefinition, grad, x):
    """The gradient of tanh GELU's input ``x`` (Float) from its output's ``grad`` (Float):
    ``0.5 (1 + t) + 0.5 x (1 - t^2) C (1 + 3 A x^2)``, ``t = tanh(C (x + A x^3))``."""
    x2 = fd.ops.mul(x, x)
    t = fd.ops.tanh(fd.ops.mul(fd.ops.add(x, fd.ops.mul(fd.ops.mul(x2, x), GELU_A)), GELU_C))
    left = fd.ops.mul(fd.ops.add(t, 1.0), 0.5)
    slope = fd.ops.mul(fd.ops.add(fd.ops.mul(x2, 3 * GELU_A), 1.0), GELU_C)
    right = fd.ops.mul(fd.ops.mul(fd.ops.mul(x, 0.5), fd.ops.sub(1.0, fd.ops.mul(t, t))), slope)
    return fd.ops.mul(grad, fd.ops.add(left, right))


def _linear_backward(fd: FusionDefinition, grad, x, weight, dtype: DataType, bias=True):
    """A linear ``y = x W^T (+ b)``'s gradients from ``grad`` (``[B, S, N]`` in
    ``dtype``), ``x`` (``[B, S, K]``) and ``W`` (``[N, K]``): the input's ``grad W``
    (``[B, S, K]``), the weight's ``grad^T x`` over the flattened tokens (``[N, K]``), and,
    with ``bias``, the bias's (a Float sum over tokens cast to ``dtype``), else None."""
    n, k = weight.shape()
    tokens = BATCH * SEQUENCE
    grad_x = fd.ops.matmul(grad, weight)
    grad_2d = fd.ops.reshape(grad, [tokens, n])
    x_2d = fd.ops.reshape(_cast(fd, x, dtype), [tokens, k])
    grad_weight = fd.ops.matmul(fd.ops.permute(grad_2d, [1, 0]), x_2d)
    grad_bias = None
    if bias:
        grad_bias = _cast(fd, fd.ops.sum(_cast(fd, grad, DataType.Float), dims=[0, 1]), dtype)
    return grad_x, grad_weight, grad_bias


SEQUENCE_SHARDED = ("x", "ln0_mean", "ln0_rstd", "x1", "ln1_mean", "ln1_rstd", "grad_out")
"""The backward's inputs that the sequence-parallel forward (examples/sequence_parallel_block.py)
gives sharded over their sequence dim (dim 1): the activations and the layernorms'
statistics; the rest are laid out as in the tensor-parallel forward."""


def define_backward(
    d: int, dtype: torch.dtype = torch.float32, sequence_parallel: bool = False
) -> tuple[FusionDefinition, list]:
    """The block's backward in ``dtype`` over a 1-d mesh of ``d`` devices. Inputs: the
    forward's :data:`USED_INPUTS`, then its :data:`SAVED` tensors, then the output's
    gradient ``[B, S, E]``; each scheduled as the forward has it (with
    ``sequence_parallel``, :data:`SEQUENCE_SHARDED` over their sequence dim, as the
    sequence-parallel forward gives them). Outputs: the gradients of ``x`` and of every
    weight and bias, in :data:`INPUTS`' order. Returns the fusion and its inputs' tensors."""
    b, s, e, h = BATCH, SEQUENCE, EMBEDDING, HEADS
    dt = DataType.from_torch(dtype)
    f32 = DataType.Float
    shapes = {name: (shape, dim) for name, shape, dim in INPUTS}
    names = [*USED_INPUTS, *(name for name, _, _, _ in SAVED), "grad_out"]
    specs = [(*shapes[name], dt) for name in USED_INPUTS]
    specs += [(shape, dim, dt if kind is None else kind) for _, shape, dim, kind in SAVED]
    specs.append(((b, s, e), None, dt))
    if sequence_parallel:
        specs = [
            (shape, 1 if name in SEQUENCE_SHARDED else dim, kind)
            for name, (shape, dim, kind) in zip(names, specs, strict=True)
        ]
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(shape, dtype=kind) for shape, _, kind in specs]
        x, ln0_w, ln0_b, qkv_w, proj_w, ln1_w, ln1_b, mlp0_w, mlp1_w = tvs[:9]
        ln0_mean, ln0_rstd, qkv, sdpa, logsumexp, seed, offset = tvs[9:16]
        x1, ln1_mean, ln1_rstd, linear0, grad_out = tvs[16:]
        # out = x1 + mlp: the gradient of the Float sum is grad_out's, mlp's is grad_out
        grad_x1 = _cast(fd, grad_out, f32)
        # MLP: linear1 (row-parallel, no collective), GELU, linear0 (column-parallel)
        linear0_f = _cast(fd, linear0, f32)
        hidden = _cast(fd, fd.ops.gelu(linear0_f, "tanh"), dt)
        grad_hidden, grad_mlp1_w, grad_mlp1_b = _linear_backward(fd, grad_out, hidden, mlp1_w, dt)
        grad_linear0 = _gelu_backward(fd, _cast(fd, grad_hidden, f32), linear0_f)
        grad_linear0 = _cast(fd, grad_linear0, dt)
        xhat1, normed1 = _normalize(fd, x1, ln1_mean, ln1_rstd, ln1_w, ln1_b)
        grad_normed1, grad_mlp0_w, grad_mlp0_b = _linear_backward(
            fd, grad_linear0, normed1, mlp0_w, dt
        )  # grad_normed1 partial over the 4E features: Allreduce
        grad_x1_ln, grad_ln1_w, grad_ln1_b = _layernorm_backward(
            fd, grad_normed1, xhat1, ln1_rstd, ln1_w
        )
        grad_x1 = fd.ops.add(grad_x1, grad_x1_ln)
        # attention: x1 = x + proj(attention), proj row-parallel (no collective)
        grad_proj = _cast(fd, grad_x1, dt)
        attention = fd.ops.reshape(fd.ops.permute(sdpa, [0, 2, 1, 3]), [b, s, e])
        grad_attention, grad_proj_w, grad_proj_b = _linear_backward(
            fd, grad_proj, attention, proj_w, dt
        )
        grad_sdpa = fd.ops.permute(fd.ops.reshape(grad_attention, [b, s, h, e // h]), [0, 2, 1, 3])
        heads = fd.ops.reshape(qkv, [b, s, h, 3 * e // h])
        q, k, v = (
            fd.ops.permute(
                fd.ops.slice(heads, [0, 0, 0, i * e // h], [b, s, h, (i + 1) * e // h]),
                [0, 2, 1, 3],
            )
            for i in range(3)
        )
        causal = fd.define_scalar(True, dtype=DataType.Bool)
        grads_qkv = fd.ops.sdpfa_bwd(
            grad_sdpa, q, k, v, sdpa, logsumexp, None, causal, seed, offset, None
        )
        grad_heads = fd.ops.cat([fd.ops.permute(g, [0, 2, 1, 3]) for g in grads_qkv], dim=3)
        grad_qkv = fd.ops.reshape(grad_heads, [b, s, 3 * e])  # 3E sharded: whole heads
        x_f = _cast(fd, x, f32)
        xhat0, normed0 = _normalize(fd, x_f, ln0_mean, ln0_rstd, ln0_w, ln0_b)
        grad_normed0, grad_qkv_w, grad_qkv_b = _linear_backward(fd, grad_qkv, normed0, qkv_w, dt)
        # grad_normed0 partial over the 3E features: Allreduce
        grad_x_ln, grad_ln0_w, grad_ln0_b = _layernorm_backward(
            fd, grad_normed0, xhat0, ln0_rstd, ln0_w
        )
        grad_x = _cast(fd, fd.ops.add(grad_x1, grad_x_ln), dt)
        grads = (
            grad_x,
            *(_cast(fd, g, dt) for g in (grad_ln0_w, grad_ln0_b)),
            grad_qkv_w,
            grad_qkv_b,
            grad_proj_w,
            grad_proj_b,
            *(_cast(fd, g, dt) for g in (grad_ln1_w, grad_ln1_b)),
            grad_mlp0_w,
            grad_mlp0_b,
            grad_mlp1_w,
            grad_mlp1_b,
        )
        for grad in grads:
            fd.add_output(grad)
    shard_inputs(tvs, [dim for _, dim, _ in specs], mesh)
    return fd, tvs


def fusion(world_size: int = 4) -> FusionDefinition:
    """What ``hostir dump``, ``viz`` and ``traffic`` lower (docs/cli.md): the scheduled
    backward for ``world_size`` ranks, not run; 4 by default, as in the run above."""
    return define_backward(world_size)[0]


def reference_grads(full: list[torch.Tensor], grad_out: torch.Tensor) -> list[torch.Tensor]:
    """The full gradients of ``x`` and every weight and bias (:data:`INPUTS`' order) of the
    forward's single-device ``reference`` under torch autograd, for the output gradient
    ``grad_out``."""
    leaves = [t.detach().clone().requires_grad_(True) for t in full]
    reference(leaves).backward(grad_out)
    return [t.grad for t in leaves]


ATOL_EPS = 2
"""bf16 ``atol`` in bf16 epsilons (2^-7) of the gradient's largest magnitude. Each gradient
sums bf16-rounded products over the tokens or the features (and a column-parallel input
gradient is rounded to bf16 on each rank before the Allreduce sums it), so an entry near 0
carries the rounding of terms as large as the largest. Measured on seeds 0-19 at 1, 2 and
4 ranks: at most 0.92 epsilon beyond the ``rtol`` (the layernorm weights' gradients); 2
leaves room for other CPUs' bf16 kernels."""


def tolerance(expected: torch.Tensor) -> dict[str, float]:
    """How close a rank's gradient must be to autograd's ``expected``: float32 to 1e-5
    (relative and absolute; measured on the same seeds and ranks: at most 0.6 of it), bf16
    to torch's bf16 ``rtol`` (1.6e-2) and :data:`ATOL_EPS` epsilons of the gradient's
    largest magnitude as ``atol``."""
    if expected.dtype == torch.bfloat16:
        return {"rtol": 1.6e-2, "atol": ATOL_EPS * 2**-7 * expected.abs().max().item()}
    return {"rtol": 1e-5, "atol": 1e-5}


def grad_output(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A random (``randn``) gradient of the block's output, the same on every rank."""
    generator = torch.Generator().manual_seed(seed + 1000)  # not random_inputs' stream
    return torch.randn(BATCH, SEQUENCE, EMBEDDING, generator=generator).to(dtype)


def run_both(
    d: int, rank: int, dtype: torch.dtype, seed: int = 0, forward_define=None
) -> tuple[list[torch.Tensor], list[torch.Tensor], FusionDefinition]:
    """Runs the forward with ``saved`` and then the backward on ``rank`` of ``d`` in
    ``dtype`` on :func:`random_inputs` of ``seed``; returns this rank's gradients, the same
    shards of autograd's (:func:`reference_grads`, each sharded as the backward's output)
    and the backward fusion. ``forward_define(d, dtype)`` gives another forward with
    ``saved`` outputs (the sequence-parallel one: its backward is then scheduled
    ``sequence_parallel``); this example's ``define`` by default."""
    full, grad_out = random_inputs(dtype, seed), grad_output(dtype, seed)
    if forward_define is None:
        forward, tvs = define(d, dtype, saved=True)
    else:
        forward, tvs = forward_define(d, dtype)
    inputs = [shard_tensor(t, tv, rank) for t, tv in zip(full, tvs, strict=True)]
    _, *saved = forward.execute(inputs)
    backward, inputs = define_backward(d, dtype, sequence_parallel=forward_define is not None)
    names = [name for name, _, _ in INPUTS]
    used = [full[names.index(name)] for name in USED_INPUTS]
    local = [shard_tensor(t, tv, rank) for t, tv in zip(used, inputs, strict=False)]
    grads = backward.execute([*local, *saved, shard_tensor(grad_out, inputs[-1], rank)])
    outputs = backward.host_ir().outputs
    expected = [
        shard_tensor(t, out, rank)
        for t, out in zip(reference_grads(full, grad_out), outputs, strict=True)
    ]
    return grads, expected, backward


def mismatches(grads: list, expected: list, dtype: torch.dtype) -> list[str]:
    """The names (:data:`INPUTS`' order) of the gradients not of ``dtype`` or not within
    :func:`tolerance` of autograd's ``expected``."""
    names = [name for name, _, _ in INPUTS]
    return [
        name
        for name, got, want in zip(names, grads, expected, strict=True)
        if got.dtype != dtype or not torch.allclose(got.float(), want.float(), **tolerance(want))
    ]


def run(dtype: torch.dtype = torch.float32) -> bool:
    """Runs the forward and the backward on this rank in ``dtype``, checks every
    gradient's shard against autograd and prints one line; returns whether all matched and
    the backward had its 2 Allreduces."""
    world = default_communicator()  # joins the launcher's process group, if any
    d, rank = world.world_size, world.rank
    grads, expected, backward = run_both(d, rank, dtype)
    allreduces = str(backward.host_ir()).count(" = Allreduce(")
    bad = mismatches(grads, expected, dtype)
    error = max(
        ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        for got, want in zip(grads, expected, strict=True)
    )
    ok = not bad and allreduces == (2 if d > 1 else 0)
    print(
        f"rank {rank}/{d}: {str(dtype).removeprefix('torch.')} backward, {len(grads)}"
        f" gradients, {allreduces} Allreduces, max error {error:.2e} of the largest,"
        f" {'OK' if ok else 'MISMATCH ' + ' '.join(bad)}\n",
        end="",  # one write: ranks share the terminal or pipe, lines must not interleave
        flush=True,
    )
    return ok


def main() -> int:
    """Runs the forward and backward in float32, then bf16, on this rank; returns the exit
    status."""
    results = [run(dtype) for dtype in (torch.float32, torch.bfloat16)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
