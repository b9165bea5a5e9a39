"""``fd.ops`` attention and MoE ops: ``sdpfa_fwd``, ``sdpfa_bwd``, ``grouped_mm`` and
``embedding_fwd``, with nvFuser's signatures, shapes and dtypes (``csrc/ops/composite.cpp``,
``csrc/ops/arith.cpp``, ``python/python_direct/ops.cpp`` of NVIDIA/Fuser).

Each is recorded from its declaration (``hostir.ir.attention``, ``frontend.recording``):
``sdpfa_fwd``'s output and logsumexp are one expression (one instruction), its philox
seed and offset two ``sdpfa_philox`` ones; ``sdpfa_bwd``'s three gradients are one
expression. Everything the ops refuse, they refuse when the fusion is defined: ranks,
extents, dtypes (the declarations' rules, which the verifier applies too), dropout, and
scalars that are not constants (argument forms, here). docs/ops.md ("Attention and MoE
ops") says how each op shards.
"""

from __future__ import annotations

from typing import Any

from frontend.errors import OperandError
from frontend.exprs import ScalarVal
from frontend.recording import record
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import Const
from hostir.ir.attention import (
    EMBEDDING_FWD,
    GROUPED_MM,
    SDPA_BWD,
    SDPA_FWD,
    SDPA_PHILOX,
    PhiloxResult,
)
from hostir.ir.scalars import print_scalar

# ----- argument checks -------------------------------------------------------------------


def _tensor(op: str, value: Any, role: str) -> TensorView:
    if not isinstance(value, TensorView):
        raise OperandError(f"{op}: {role} must be a TensorView, got {value!r}")
    return value


def _constant(op: str, role: str, value: Any, kinds: tuple[type, ...]) -> Any:
    """The value of a constant scalar argument (a Python number or a ``define_scalar``
    constant); an input scalar is refused: the op's form is chosen when it is defined."""
    if isinstance(value, ScalarVal):
        if value.value is None:
            raise OperandError(
                f"{op}: {role} {value.name} is a fusion input; hostir takes {role} as a"
                " constant only (define_scalar(value) or a Python number)"
            )
        value = value.value
    if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
        wanted = " or ".join(kind.__name__ for kind in kinds)
        raise OperandError(f"{op}: {role} must be a {wanted} constant, got {value!r}")
    return value


def _dropout_p(op: str, dropout_p: Any) -> float | None:
    """The dropout probability: None for None or 0 (no dropout), else a constant in (0, 1)."""
    if dropout_p is None:
        return None
    p = _constant(op, "dropout_p", dropout_p, (float, int))
    if p == 0:
        return None
    if not 0 < p < 1:
        raise OperandError(f"{op}: dropout_p = {p} is out of range; expected 0 <= dropout_p < 1")
    return float(p)


def _flag_fields(op: str, is_causal: Any, scale: Any) -> dict[str, Any]:
    """``is_causal`` and ``scale`` as constants: the declaration's attribute fields."""
    causal = False if is_causal is None else _constant(op, "is_causal", is_causal, (bool,))
    scale_value = None if scale is None else float(_constant(op, "scale", scale, (float, int)))
    return {"is_causal": causal, "scale": None if scale_value is None else Const(value=scale_value)}


def _dropout_fields(p: float, seed: TensorView, offset: TensorView) -> dict[str, Any]:
    """A dropout's fields: its probability (a constant in (0, 1)) and the philox seed and
    offset tensors (UInt64 ``[2]`` and ``[]``) that choose the mask."""
    return {"dropout_p": Const(value=p), "philox_seed": seed, "philox_offset": offset}


# ----- sdpfa_fwd / sdpfa_bwd -------------------------------------------------------------


def _philox(ops: Any, query: TensorView, result: PhiloxResult, dropout: bool) -> TensorView:
    """A philox projection (torch 2.7's form: the seed result UInt64 ``[2]``, the offset ``[]``),
    placed on the query's mesh."""
    operands = {"result": result, "dropout": dropout}
    return record(ops._fusion, SDPA_PHILOX, operands, mesh_from=(query,))[0]


def sdpfa_fwd(
    self: Any,
    query: TensorView,
    key: TensorView,
    value: TensorView,
    bias: TensorView | None = None,
    mask: TensorView | None = None,
    dropout_p: Any = None,
    is_causal: Any = None,
    scale: Any = None,
) -> tuple[TensorView, TensorView, TensorView, TensorView]:
    """nvFuser's scaled dot-product flash attention forward: query ``[*N, H, L, E]``, key and
    value ``[*N, H, S, E]`` -> (output ``[*N, H, L, E]`` in the query's dtype, logsumexp
    ``[*N, H, L]`` Float, philox_seed UInt64 ``[2]``, philox_offset UInt64 ``[]``: torch
    2.7's form, as nvFuser gives it there).

    ``dropout_p``: None or 0 (no dropout; the philox tensors are 0), or a constant in
    (0, 1): the seed is drawn from torch's default generator at each run, the offset is 0,
    and the mask is a function of them and of each weight's global index (docs/ops.md).
    ``is_causal`` (default False) and ``scale`` (default
    ``1/sqrt(E)``) constants. ``bias`` and ``mask`` are refused. Batch and head dims
    shard locally; a sharded sequence or head size is gathered first (docs/ops.md)."""
    op = "sdpfa_fwd"
    q, k, v = (
        _tensor(op, t, role) for t, role in ((query, "query"), (key, "key"), (value, "value"))
    )
    for role, extra in (("bias", bias), ("mask", mask)):
        if extra is not None:
            raise OperandError(f"{op}: {role} is not supported (leave it None)")
    p = _dropout_p(op, dropout_p)
    operands = {"query": q, "key": k, "value": v, **_flag_fields(op, is_causal, scale)}
    if p is None:  # the philox tensors after the results, as before dropout existed
        output, logsumexp = record(self._fusion, SDPA_FWD, operands)
        seed = _philox(self, q, PhiloxResult.SEED, False)
        return output, logsumexp, seed, _philox(self, q, PhiloxResult.OFFSET, False)
    seed = _philox(self, q, PhiloxResult.SEED, True)  # the forward reads them: first
    offset = _philox(self, q, PhiloxResult.OFFSET, True)
    operands.update(_dropout_fields(p, seed, offset))
    output, logsumexp = record(self._fusion, SDPA_FWD, operands)
    return output, logsumexp, seed, offset


def _check_philox(op: str, role: str, value: Any, dropout: bool) -> TensorView:
    """A philox seed or offset. Without dropout it is not read: a tensor of any dtype and
    shape (nvFuser checks no more). With dropout it chooses the mask: it must be in
    sdpfa_fwd's form, torch 2.7's (nvFuser's there, and the peer tests'
    ``create_sdpa_rng_tensors``): the seed a UInt64 ``[2]`` tensor (seed, offset), the
    offset a UInt64 ``[]`` one."""
    tensor = _tensor(op, value, role)
    if not dropout:
        return tensor
    expected = "[2]" if role == "philox_seed" else "[]"
    extents = [axis.extent for axis in tensor.shape_domain()]
    shown = "[" + ", ".join(print_scalar(e) for e in extents) + "]"
    if tensor.dtype is not DataType.UInt64 or shown != expected:
        raise OperandError(
            f"{op}: {role} {tensor.name} is {tensor.dtype.name} {shown}; with dropout it must"
            f" be sdpfa_fwd's, torch 2.7's form: a UInt64 {expected} tensor"
        )
    return tensor


def sdpfa_bwd(
    self: Any,
    grad_output: TensorView,
    query: TensorView,
    key: TensorView,
    value: TensorView,
    output: TensorView,
    logsumexp: TensorView,
    dropout_p: Any,
    is_causal: Any,
    philox_seed: TensorView,
    philox_offset: TensorView,
    scale: Any,
) -> tuple[TensorView, TensorView, TensorView]:
    """nvFuser's flash attention backward: (grad_query, grad_key, grad_value), each of its
    input's shape and dtype. ``output`` and ``logsumexp`` are ``sdpfa_fwd``'s. Without
    dropout the philox tensors (any dtype and shape, as nvFuser) are not read; with
    ``dropout_p`` (a constant in (0, 1)) they are sdpfa_fwd's and regenerate its mask.
    Shards as ``sdpfa_fwd``."""
    op = "sdpfa_bwd"
    named = {
        "grad_output": grad_output,
        "query": query,
        "key": key,
        "value": value,
        "output": output,
    }
    named = {role: _tensor(op, t, role) for role, t in named.items()}
    lse = _tensor(op, logsumexp, "logsumexp")
    p = _dropout_p(op, dropout_p)
    seed = _check_philox(op, "philox_seed", philox_seed, p is not None)
    offset = _check_philox(op, "philox_offset", philox_offset, p is not None)
    operands = {**named, "logsumexp": lse, **_flag_fields(op, is_causal, scale)}
    if p is not None:
        operands.update(_dropout_fields(p, seed, offset))
    grad_query, grad_key, grad_value = record(self._fusion, SDPA_BWD, operands)
    return grad_query, grad_key, grad_value


# ----- grouped_mm ------------------------------------------------------------------------


def grouped_mm(self: Any, mat1: TensorView, mat2: TensorView, offsets: TensorView) -> TensorView:
    """nvFuser's ``grouped_mm(mat1, mat2, offsets)`` (``torch._grouped_mm``), ``offsets`` the
    Int32 cumulative group ends: ``[M, K] x [G, K, N] -> [M, N]`` (groups of mat1's rows),
    ``[G, M, K] x [K, N] -> [M, N]`` (groups of mat2's columns), ``[M, K] x [K, N] ->
    [G, M, N]`` (groups of K). The result has mat1's dtype. A sharded grouped dim is
    gathered first; a sharded K leaves partial sums (docs/ops.md)."""
    op = "grouped_mm"
    a, b = _tensor(op, mat1, "mat1"), _tensor(op, mat2, "mat2")
    offs = _tensor(op, offsets, "offsets")
    return record(self._fusion, GROUPED_MM, {"mat1": a, "mat2": b, "offsets": offs})[0]


# ----- embedding_fwd ---------------------------------------------------------------------


def embedding_fwd(
    self: Any,
    input: TensorView,
    weight: TensorView,
    padding_idx: Any = None,
    max_norm: Any = None,
    norm_type: Any = None,
    scale_grad_by_freq: Any = None,
    sparse: Any = None,
) -> TensorView:
    """nvFuser's ``embedding_fwd``: ``input`` indices (Int or Int32, any rank) pick rows of
    ``weight`` ``[V, D]``: the result is ``[*input, D]`` in the weight's dtype.
    ``padding_idx``, ``scale_grad_by_freq`` and ``sparse`` change only the gradient (torch)
    and are checked, not used; ``max_norm`` (which rewrites the weight) is refused. A
    sharded D or index dim computes locally; a vocabulary-sharded weight is gathered
    first (docs/ops.md)."""
    op = "embedding_fwd"
    indices, table = _tensor(op, input, "input"), _tensor(op, weight, "weight")
    if max_norm is not None:
        raise OperandError(f"{op}: max_norm is not supported (it renormalizes the weight in place)")
    if padding_idx is not None:
        index = _constant(op, "padding_idx", padding_idx, (int,))
        dims = table.shape_domain()
        rows = dims[0].extent if len(dims) == 2 else None  # else the declaration refuses it
        if isinstance(rows, Const) and not -rows.value <= index < rows.value:
            raise OperandError(f"{op}: padding_idx {index} is out of range for {rows.value} rows")
    for role, flag in (("scale_grad_by_freq", scale_grad_by_freq), ("sparse", sparse)):
        if flag is not None:
            _constant(op, role, flag, (bool,))
    if norm_type is not None:
        _constant(op, "norm_type", norm_type, (float, int))
    return record(self._fusion, EMBEDDING_FWD, {"input": indices, "weight": table})[0]


ATTENTION_OPS = {
    "sdpfa_fwd": sdpfa_fwd,
    "sdpfa_bwd": sdpfa_bwd,
    "grouped_mm": grouped_mm,
    "embedding_fwd": embedding_fwd,
}
"""The ``fd.ops`` methods of this module, by name (``frontend.ops`` attaches them)."""
