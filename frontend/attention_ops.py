"""``fd.ops`` attention and MoE ops: ``sdpfa_fwd``, ``sdpfa_bwd``, ``grouped_mm`` and
``embedding_fwd``, with nvFuser's signatures, shapes and dtypes (``csrc/ops/composite.cpp``,
``csrc/ops/arith.cpp``, ``python/python_direct/ops.cpp`` of NVIDIA/Fuser).

Each result of a multi-result op is its own expression naming the result it takes (a
projection, ``hostir.ir.attention``); lowering drops a projection no output depends on
(``lowering.snapshot``). ``grouped_mm``, ``embedding_fwd`` and the philox projections
(``sdpfa_philox``) are recorded from their declarations (``hostir.ir.attention``,
``frontend.recording``; :class:`SdpaPhiloxExpr` is no longer made). Everything the ops
refuse, they refuse when the fusion is defined: ranks, extents, dtypes, dropout, and scalars
that are not constants (the rules on operands in ``hostir.ir.attention``, which the verifier
applies too; argument forms here). docs/ops.md ("Attention and MoE ops") says how each op
shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frontend.errors import OperandError
from frontend.exprs import Expr, Operand, ScalarVal
from frontend.iter_domain import IterDomain
from frontend.recording import placeholder, record
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import Const
from hostir.ir.attention import (
    EMBEDDING_FWD,
    GROUPED_MM,
    SDPA_PHILOX,
    PhiloxResult,
    SdpaBwdResult,
    SdpaFwdResult,
    attention_operands_problem,
    qkv_problem,
)
from hostir.ir.scalars import print_scalar

AxisPairs = list[tuple[IterDomain, IterDomain]]

# ----- expressions -----------------------------------------------------------------------


@dataclass(frozen=True)
class Dropout:
    """An attention's dropout: the probability ``p`` (a constant in (0, 1)) and the philox
    seed and offset tensors (Int, 0 dims) that choose the mask."""

    p: float
    seed: TensorView
    offset: TensorView


def _dropout_inputs(dropout: Dropout | None) -> list[Operand]:
    return [] if dropout is None else [dropout.seed, dropout.offset]


def _dropout_attribute(dropout: Dropout | None) -> str:
    return "" if dropout is None else f", dropout_p={dropout.p}"


@dataclass(eq=False)
class SdpaFwdExpr(Expr):
    """One result (``result``) of ``sdpfa_fwd``: the attention output or its logsumexp."""

    query: TensorView
    key: TensorView
    value: TensorView
    result: SdpaFwdResult
    is_causal: bool
    scale: float | None
    dropout: Dropout | None = None

    def inputs(self) -> list[Operand]:
        return [self.query, self.key, self.value, *_dropout_inputs(self.dropout)]

    def keyword(self) -> str:
        return "sdpfa_fwd"

    def attributes(self) -> str:
        return (
            f", result={self.result.value}, is_causal={self.is_causal}, scale={self.scale}"
            + _dropout_attribute(self.dropout)
        )


@dataclass(eq=False)
class SdpaPhiloxExpr(Expr):
    """``sdpfa_fwd``'s philox seed or offset. ``query`` is kept for its mesh only: the
    result reads no data (with ``dropout`` the seed is drawn at run time, else 0)."""

    query: TensorView
    result: PhiloxResult
    dropout: bool = False

    def inputs(self) -> list[Operand]:
        return [self.query]

    def keyword(self) -> str:
        return "sdpfa_philox"

    def attributes(self) -> str:
        return f", result={self.result.value}, dropout={self.dropout}"


@dataclass(eq=False)
class SdpaBwdExpr(Expr):
    """One gradient (``result``) of ``sdpfa_bwd``."""

    grad_output: TensorView
    query: TensorView
    key: TensorView
    value: TensorView
    attention: TensorView
    logsumexp: TensorView
    result: SdpaBwdResult
    is_causal: bool
    scale: float | None
    dropout: Dropout | None = None

    def inputs(self) -> list[Operand]:
        return [
            self.grad_output,
            self.query,
            self.key,
            self.value,
            self.attention,
            self.logsumexp,
            *_dropout_inputs(self.dropout),
        ]

    def keyword(self) -> str:
        return "sdpfa_bwd"

    def attributes(self) -> str:
        return (
            f", result={self.result.value}, is_causal={self.is_causal}, scale={self.scale}"
            + _dropout_attribute(self.dropout)
        )


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


def _flags(op: str, is_causal: Any, scale: Any) -> tuple[bool, float | None]:
    """``is_causal`` and ``scale`` as constants."""
    causal = False if is_causal is None else _constant(op, "is_causal", is_causal, (bool,))
    scale_value = None if scale is None else float(_constant(op, "scale", scale, (float, int)))
    return causal, scale_value


def _extent(axis: IterDomain) -> str:
    return print_scalar(axis.extent)


def _same_extent(op: str, a: TensorView, a_dim: int, b: TensorView, b_dim: int) -> None:
    """Refuses two constant extents that differ (symbolic ones are checked when bound)."""
    ea, eb = a.shape_domain()[a_dim].extent, b.shape_domain()[b_dim].extent
    if isinstance(ea, Const) and isinstance(eb, Const) and ea != eb:
        raise OperandError(
            f"{op}: {a.name} dim {a_dim} has extent {print_scalar(ea)} but {b.name} dim"
            f" {b_dim} has extent {print_scalar(eb)}; they must be equal"
        )


def _attention_tensors(op: str, named: dict[str, TensorView]) -> None:
    """One dtype (Half, BFloat16 or Float) and one rank (4 or more) for all of ``named``
    (``hostir.ir.attention``'s rule)."""
    problem = attention_operands_problem(op, {r: placeholder(tv) for r, tv in named.items()})
    if problem is not None:
        raise OperandError(problem)


def _check_qkv(op: str, query: TensorView, key: TensorView, value: TensorView) -> None:
    """Query ``[*N, H, L, E]``, key ``[*N, H, S, E]``, value ``[*N, H, S, E]``
    (``hostir.ir.attention``'s rule)."""
    problem = qkv_problem(op, placeholder(query), placeholder(key), placeholder(value))
    if problem is not None:
        raise OperandError(problem)


def _fresh(axis: IterDomain) -> IterDomain:
    return IterDomain(axis.extent, axis.iter_type)


def _rank(tv: TensorView) -> int:
    """The number of data dims of ``tv``."""
    return len(tv.shape_domain())


def _add_pairs(axis_map: dict[TensorView, AxisPairs], tv: TensorView, pairs: AxisPairs) -> None:
    """Adds ``pairs`` to ``tv``'s (a tensor passed as two operands maps through both)."""
    axis_map.setdefault(tv, []).extend(pairs)


# ----- sdpfa_fwd / sdpfa_bwd -------------------------------------------------------------


def _fwd_result(
    ops: Any,
    q: TensorView,
    k: TensorView,
    v: TensorView,
    result: SdpaFwdResult,
    flags: tuple,
    dropout: Dropout | None = None,
) -> TensorView:
    """The tensor of one ``sdpfa_fwd`` result: batch and head axes map to all of q, k, v,
    L to the query's, Ev (the output) to the value's. ``dropout`` (the output's only)
    adds the philox tensors, 0-d, as inputs."""
    qd, kd, vd = q.shape_domain(), k.shape_domain(), v.shape_domain()
    batch = _rank(q) - 2
    axes = [_fresh(axis) for axis in qd[: batch + 1]]  # *N, H and L
    axis_map: dict[TensorView, AxisPairs] = {}
    _add_pairs(axis_map, q, list(zip(axes, qd[: batch + 1], strict=True)))
    _add_pairs(axis_map, k, list(zip(axes[:batch], kd[:batch], strict=True)))
    _add_pairs(axis_map, v, list(zip(axes[:batch], vd[:batch], strict=True)))
    dtype = DataType.Float
    if result is SdpaFwdResult.OUTPUT:
        axes.append(_fresh(vd[-1]))
        _add_pairs(axis_map, v, [(axes[-1], vd[-1])])
        dtype = q.dtype
    for tensor in _dropout_inputs(dropout):
        _add_pairs(axis_map, tensor, [])
    out = ops._fusion.new_tensor(dtype, axes)
    causal, scale = flags
    expr = SdpaFwdExpr(
        out,
        axis_map=axis_map,
        query=q,
        key=k,
        value=v,
        result=result,
        is_causal=causal,
        scale=scale,
        dropout=dropout,
    )
    ops._fusion.add_expr(expr)
    return out


def _philox(ops: Any, query: TensorView, result: PhiloxResult, dropout: bool) -> TensorView:
    """A philox projection: an Int scalar tensor (nvFuser's form for torch before 2.7),
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
    ``[*N, H, L]`` Float, philox_seed, philox_offset (Int scalar tensors)).

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
    _attention_tensors(op, {"query": q, "key": k, "value": v})
    _check_qkv(op, q, k, v)
    p = _dropout_p(op, dropout_p)
    flags = _flags(op, is_causal, scale)
    if p is None:  # the philox tensors after the results, as before dropout existed
        output = _fwd_result(self, q, k, v, SdpaFwdResult.OUTPUT, flags)
        logsumexp = _fwd_result(self, q, k, v, SdpaFwdResult.LOGSUMEXP, flags)
        seed = _philox(self, q, PhiloxResult.SEED, False)
        return output, logsumexp, seed, _philox(self, q, PhiloxResult.OFFSET, False)
    seed = _philox(self, q, PhiloxResult.SEED, True)  # the output reads them: first
    offset = _philox(self, q, PhiloxResult.OFFSET, True)
    dropout = Dropout(p, seed, offset)
    return (
        _fwd_result(self, q, k, v, SdpaFwdResult.OUTPUT, flags, dropout),
        _fwd_result(self, q, k, v, SdpaFwdResult.LOGSUMEXP, flags),
        seed,
        offset,
    )


def _check_philox(op: str, role: str, value: Any, dropout: bool) -> TensorView:
    """A philox seed or offset. Without dropout it is not read: a tensor of any dtype and
    shape (sdpfa_fwd's Int ``[]``, or nvFuser's newer UInt64 ``[2]`` and ``[]`` forms);
    nvFuser checks no more. With dropout it chooses the mask: it must be sdpfa_fwd's form
    here, an Int tensor with 0 dims."""
    tensor = _tensor(op, value, role)
    if dropout and (tensor.dtype is not DataType.Int or _rank(tensor) != 0):
        raise OperandError(
            f"{op}: {role} {tensor.name} is {tensor.dtype.name} with {_rank(tensor)} dims; with"
            " dropout it must be sdpfa_fwd's (an Int tensor with 0 dims)"
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
    _attention_tensors(op, named)
    q, k, v = named["query"], named["key"], named["value"]
    _check_qkv(op, q, k, v)
    last = _rank(q) - 1
    for role in ("grad_output", "output"):
        for dim in range(last + 1):
            _same_extent(op, named[role], dim, q if dim < last else v, dim)
    if lse.dtype is not DataType.Float or _rank(lse) != last:
        raise OperandError(
            f"{op}: logsumexp {lse.name} must be sdpfa_fwd's logsumexp (Float, [*N, H, L]),"
            f" got {lse.dtype.name} with {_rank(lse)} dims"
        )
    for dim in range(last):
        _same_extent(op, lse, dim, q, dim)
    flags = _flags(op, is_causal, scale)
    dropout = None if p is None else Dropout(p, seed, offset)
    return tuple(  # type: ignore[return-value]
        _bwd_result(self, named, lse, result, flags, dropout) for result in SdpaBwdResult
    )


def _bwd_result(
    ops: Any,
    named: dict[str, TensorView],
    lse: TensorView,
    result: SdpaBwdResult,
    flags: tuple,
    dropout: Dropout | None,
) -> TensorView:
    """One gradient: its input's axes; batch and head axes map to every operand, the
    query's L to grad_output's, output's and logsumexp's."""
    source = named[result.value.removeprefix("grad_")]
    dims = source.shape_domain()
    axes = [_fresh(axis) for axis in dims]
    batch = _rank(source) - 2
    axis_map: dict[TensorView, AxisPairs] = {}
    for tv in [*named.values(), lse]:
        _add_pairs(axis_map, tv, list(zip(axes[:batch], tv.shape_domain()[:batch], strict=True)))
    _add_pairs(axis_map, source, list(zip(axes[batch:], dims[batch:], strict=True)))
    if result is SdpaBwdResult.GRAD_QUERY:  # L of the forward's output and logsumexp too
        for tv in (named["grad_output"], named["output"], lse):
            _add_pairs(axis_map, tv, [(axes[batch], tv.shape_domain()[batch])])
    for tensor in _dropout_inputs(dropout):
        _add_pairs(axis_map, tensor, [])
    out = ops._fusion.new_tensor(source.dtype, axes)
    causal, scale = flags
    expr = SdpaBwdExpr(
        out,
        axis_map=axis_map,
        grad_output=named["grad_output"],
        query=named["query"],
        key=named["key"],
        value=named["value"],
        attention=named["output"],
        logsumexp=lse,
        result=result,
        is_causal=causal,
        scale=scale,
        dropout=dropout,
    )
    ops._fusion.add_expr(expr)
    return out


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
