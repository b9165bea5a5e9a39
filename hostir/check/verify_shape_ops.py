"""The verifier's former rules for the shape ops, no longer reached: the ops are declared
(``hostir.ir.shape_ops``), and the verifier checks them with their declarations' ``check``
and ``infer`` (``hostir.check.verify_ops``). ``SHAPE_RULES`` stays in ``COMPUTE_RULES``
until the tables of every op family are removed."""

from __future__ import annotations

from typing import Any

from hostir.check.result_checks import result_problem, shape_text
from hostir.ir.extents import differ, local_extents
from hostir.ir.scalars import add, sub
from hostir.ir.shape_ops import Cat, Pad, Reshape, ReshapeError, Slice, reshape_groups
from hostir.ir.values import TensorValue


def _same_dtype(instruction: Any, op: str, src: TensorValue) -> str | None:
    if instruction.out.dtype is not src.dtype:
        return (
            f"{instruction.out.name} is declared {instruction.out.dtype.value}, but {op} keeps"
            f" {src.dtype.value}"
        )
    return None


def _product(normals: list) -> tuple:
    coefficient, atoms = 1, ()
    for c, a in normals:
        coefficient, atoms = coefficient * c, tuple(sorted(atoms + a, key=repr))
    return coefficient, atoms


def rule_reshape(instruction: Reshape, scalars: Any) -> str | None:
    """Same dtype; the global extents group (``reshape_groups``); as many local elements."""
    src, out = instruction.src, instruction.out
    problem = _same_dtype(instruction, "reshape", src)
    if problem is not None:
        return problem
    try:
        reshape_groups(src.shape, out.shape)
    except ReshapeError as error:
        return f"{out.name} = reshape({src.name}) {error}"
    mine, theirs = _product(local_extents(out)), _product(local_extents(src))
    if mine[1] == theirs[1] and mine[0] != theirs[0]:
        return (
            f"{out.name} = reshape({src.name}): the local shards hold different numbers of"
            " elements; a rank reshapes its own shard"
        )
    return None


def _dim_problem(instruction: Any, op: str, src: TensorValue, dim: int) -> str | None:
    if not 0 <= dim < src.ndim:
        return f"dim {dim} is out of range for {src.name} {shape_text(src)}"
    if src.sharding is not None and src.sharding.mesh_axes_of(dim):
        return f"dim {dim} of {src.name} is sharded; it must be whole on each rank"
    return None


def rule_slice(instruction: Slice, scalars: Any) -> str | None:
    """Same dtype; ``dim`` unsharded; ``out``'s extent at ``dim`` is ``stop - start``."""
    src = instruction.src
    problem = _dim_problem(instruction, "slice", src, instruction.dim)
    if problem is None:
        problem = _same_dtype(instruction, "slice", src)
    if problem is not None:
        return problem
    shape = list(src.shape)
    shape[instruction.dim] = sub(instruction.stop, instruction.start)
    return result_problem(instruction, op="slice", shape=tuple(shape))


def rule_pad(instruction: Pad, scalars: Any) -> str | None:
    """Same dtype; ``dim`` unsharded; ``out``'s extent at ``dim`` is ``left + extent +
    right``."""
    src = instruction.src
    problem = _dim_problem(instruction, "pad", src, instruction.dim)
    if problem is None:
        problem = _same_dtype(instruction, "pad", src)
    if problem is not None:
        return problem
    shape = list(src.shape)
    shape[instruction.dim] = add(
        add(instruction.left, src.shape[instruction.dim]), instruction.right
    )
    return result_problem(instruction, op="pad", shape=tuple(shape))


def rule_cat(instruction: Cat, scalars: Any) -> str | None:
    """Same dtypes; ``dim`` unsharded; other extents equal; ``dim``'s extents add up."""
    lhs, rhs = instruction.lhs, instruction.rhs
    problem = _dim_problem(instruction, "cat", lhs, instruction.dim) or _dim_problem(
        instruction, "cat", rhs, instruction.dim
    )
    if problem is None and lhs.dtype is not rhs.dtype:
        problem = f"{lhs.name} is {lhs.dtype.value}, {rhs.name} is {rhs.dtype.value}"
    if problem is None:
        problem = _same_dtype(instruction, "cat", lhs)
    if problem is not None:
        return problem
    if lhs.ndim != rhs.ndim or any(
        d != instruction.dim and differ(a, b)
        for d, (a, b) in enumerate(zip(lhs.shape, rhs.shape, strict=True))
    ):
        return f"{lhs.name} {shape_text(lhs)} and {rhs.name} {shape_text(rhs)} differ off dim"
    shape = list(lhs.shape)
    shape[instruction.dim] = add(lhs.shape[instruction.dim], rhs.shape[instruction.dim])
    return result_problem(instruction, op="cat", shape=tuple(shape))


SHAPE_RULES = {Reshape: rule_reshape, Slice: rule_slice, Pad: rule_pad, Cat: rule_cat}
"""The shape ops' rules (``hostir.check.verify_compute.COMPUTE_RULES`` takes them)."""
