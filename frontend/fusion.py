"""``Fusion``: the container of a fusion's tensors, scalars and expressions."""

from __future__ import annotations

import itertools
from typing import Any

from frontend.errors import OperandError, OperandRequirementError
from frontend.exprs import Expr, ScalarVal
from frontend.iter_domain import IterDomain
from frontend.rfactor import rfactor
from frontend.schedule_clock import ScheduleClock
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import Scalar, Symbol
from hostir.ir.requirements import Requirement, explain, refuted, symbols_read

_numbers = itertools.count(1)


class Fusion:
    """Tensors and expressions in definition order, plus inputs and outputs.

    Names are deterministic: tensors ``T0, T1, ...``, scalars ``s0, ...``,
    symbolic extents ``i0, ...`` in creation order. ``finished`` is set when the
    definition ends (the ``with`` block exits, or the first ``execute``): no tensor
    or op can be added after that. ``number`` tells fusions apart in messages (names
    such as ``T0`` repeat in every fusion); each tensor and scalar knows its fusion (as a
    ``tensor_view.ValueOwner``), and each tensor the expressions defining and using it.
    """

    def __init__(self) -> None:
        self.number = next(_numbers)
        self.schedule = ScheduleClock()
        self.finished = False
        self._inputs: list[TensorView | ScalarVal] = []
        self._outputs: list[TensorView] = []
        self._exprs: list[Expr] = []
        self._tensors: list[TensorView] = []
        self._scalars: list[ScalarVal] = []
        self._symbols = 0
        self._run_time_symbols = 0
        self._requires: dict[Requirement, None] = {}  # ordered, without repeats

    def new_tensor(self, dtype: DataType, logical: list[IterDomain]) -> TensorView:
        """A new TensorView named ``T<n>``."""
        tv = TensorView(f"T{len(self._tensors)}", dtype, logical)
        tv.schedule_clock = self.schedule
        tv.fusion = self
        self._tensors.append(tv)
        return tv

    def new_scalar(
        self, dtype: DataType, value: int | float | bool | None, extent: Scalar | None = None
    ) -> ScalarVal:
        """A new scalar named ``s<n>``: a constant (``value``), an extent (``extent``: a size,
        or arithmetic on sizes), or with neither an input (``define_scalar`` registers it)."""
        scalar = ScalarVal(f"s{len(self._scalars)}", dtype, value, extent=extent)
        scalar.fusion = self
        self._scalars.append(scalar)
        return scalar

    def new_symbol(self) -> Symbol:
        """A new symbolic extent ``i<n>``."""
        symbol = Symbol(name=f"i{self._symbols}")
        self._symbols += 1
        return symbol

    def new_run_time_symbol(self) -> Symbol:
        """A new run-time extent ``r<n>``: bound as the program runs (the rows an exchange
        by run-time counts receives), not by the inputs (docs/run_time_extents.md)."""
        symbol = Symbol(name=f"r{self._run_time_symbols}")
        self._run_time_symbols += 1
        return symbol

    def add_input(self, value: TensorView | ScalarVal) -> None:
        """Registers a fusion input."""
        self._inputs.append(value)

    def add_output(self, tv: TensorView) -> None:
        """Registers a fusion output."""
        self._outputs.append(tv)

    def add_expr(self, expr: Expr) -> None:
        """Records ``expr`` and links it to its operands and outputs."""
        self._exprs.append(expr)
        for tv in expr.outputs():
            tv.definition = expr
        for tv in expr.tensor_inputs():
            tv.uses.append(expr)

    def require(self, requirements: tuple[Requirement, ...], carry: bool = False) -> None:
        """Raises OperandRequirementError (an OperandError) with the first of
        ``requirements`` (an op's rules on its values, ``hostir.ir.requirements``) that
        constants break. With ``carry``, the ones over symbols go into the program
        (``HostIrContainer.requires``), to be checked on the values the inputs bind; without
        it the op's instruction shows them and the runtime reads them there."""
        for requirement in requirements:
            if refuted(requirement):
                raise OperandRequirementError(explain(requirement, {}))
            if carry and symbols_read(requirement):
                self._requires[requirement] = None

    def requires(self) -> list[Requirement]:
        """The requirements the program carries (see :meth:`require`), in definition order."""
        return list(self._requires)

    def insert_after(self, before: Expr, expr: Expr) -> None:
        """Records ``expr`` right after ``before`` (``rfactor``: the op finishing the
        rfactored reduction, before any use of its output), linking it as ``add_expr``."""
        self._exprs.insert(self._exprs.index(before) + 1, expr)
        expr.output.definition = expr
        for tv in expr.tensor_inputs():
            tv.uses.append(expr)

    def rfactor(self, tv: TensorView, axes: Any) -> TensorView:
        """``tv.rfactor(axes)`` (``frontend.rfactor``)."""
        return rfactor(self, tv, axes)

    def check_owns(
        self, where: str, value: Any, role: str = "operand", error: type = OperandError
    ) -> None:
        """Raises ``error`` if ``value``, a tensor or scalar, was defined in another fusion:
        used here it would silently stand for this fusion's value of the same name (``T0``)."""
        if not isinstance(value, TensorView | ScalarVal) or value.fusion is self:
            return
        owner = value.fusion.describe() if value.fusion is not None else "no FusionDefinition"
        raise error(
            f"{where}: {role} {value.name} belongs to another FusionDefinition ({owner}), not"
            f" to this one ({self.describe()}); define it in this one (define_tensor,"
            " define_scalar) and pass its data to execute"
        )

    def describe(self) -> str:
        """``fusion #2 (inputs T0, T1)``: which fusion, in a message."""
        names = [value.name for value in self._inputs]
        shown = ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
        return f"fusion #{self.number} (inputs {shown or 'none'})"

    def inputs(self) -> list[TensorView | ScalarVal]:
        """Fusion inputs in definition order."""
        return list(self._inputs)

    def outputs(self) -> list[TensorView]:
        """Fusion outputs in the order they were added."""
        return list(self._outputs)

    def exprs(self) -> list[Expr]:
        """Expressions in definition order (a topological order)."""
        return list(self._exprs)

    def tensors(self) -> list[TensorView]:
        """Every TensorView in creation order."""
        return list(self._tensors)

    def __str__(self) -> str:
        lines = ["Fusion {"]
        for value in self._inputs:
            lines.append(f"  input {value!r}")
        for expr in self._exprs:
            lines.append(f"  {expr.describe()}")
            lines += [f"    {tv!r}" for tv in expr.outputs()]
        lines.append("  outputs " + ", ".join(tv.name for tv in self._outputs))
        lines.append("}")
        return "\n".join(lines)
