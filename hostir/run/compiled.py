"""Compiled host programs: a program as generated Python source, for one rank.

The interpreter (``HostIrEvaluator.run_instruction``) decides per instruction and per
run what the program and the rank already fix: whether this rank runs the instruction,
how to resolve each operand, which handler to call, which results to bind. A compiled
program decides it once: :func:`compile_program` writes straight-line Python per
instruction that does exactly what the interpreter does, without the deciding:

- an instruction this rank does not run (it is on a mesh without the rank) binds what
  it defines to None (or raises, where the rank holds it: ``hostir.run.steps.skipped_failure``);
- operands are expressions: ``t["T1"]`` for a tensor (``t`` is ``ctx.tensors``, so
  compiled and interpreted code share the run's values), constants written inline,
  scalar expressions as Python arithmetic on ``s`` (``ctx.scalars``);
- the handler is called directly (``H3``, with the instruction as ``I3``: globals of
  the generated code), its results bound, a posted request recorded;
- a ``for`` loop is a Python loop over a function holding its body, setting the index
  in ``ctx.scalars`` and popping it after; a pipelined loop, when loops run pipelined,
  goes to the interpreter's handler (its stages interleave iterations).

A failure raises what the interpreter raises for that instruction (a failed operand
is resolved again by the interpreter's code, so it names the same cause), with a note
naming the instruction's line in the program's text form (``str(program)``).
``hostir dump --python`` prints the source: a comment per instruction gives its line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from hostir.analysis.pipeline_stages import is_pipelined
from hostir.ir.container import HostIrContainer
from hostir.ir.instructions import ForLoop, Instruction
from hostir.ir.mesh_names import MeshNames, mesh_names
from hostir.ir.scalars import BinaryExpr, Const, MeshCoordinate, Symbol
from hostir.ir.values import NAMED_VALUES, StreamValue
from hostir.run.context import RunContext
from hostir.run.steps import Step, skipped_failure, step_failure
from hostir.text.printer import print_instruction

LINE_NOTE = "host IR line "
"""How the note naming a failed instruction's line begins."""

INDENT = "    "


class Unresolved(Exception):
    """Raised by generated code where an operand does not resolve (a tensor this rank
    does not hold): the interpreter's resolution then says why."""


def unresolved() -> NoReturn:
    """Raises :class:`Unresolved` (an expression's way to fail, in generated code)."""
    raise Unresolved


def _fresh(failure: Exception, note: str) -> Callable[[], Exception]:
    """A maker of copies of ``failure`` with ``note`` (generated code raises a new one in
    each run)."""

    def make() -> Exception:
        error = type(failure)(str(failure))
        error.add_note(note)
        return error

    return make


class CompiledProgram:
    """A program compiled for one rank: ``run(context)`` runs its body in ``context``.

    ``source`` is the generated Python; ``sites`` holds, per instruction in the order
    the source numbers them, the instruction, its prepared step and its line note.
    """

    def __init__(self, source: str, sites: list[tuple[Instruction, Step, str]], names: dict):
        self.source = source
        self.sites = sites
        namespace = {**names, "fail": self.fail, "Unresolved": Unresolved}
        namespace["unresolved"] = unresolved
        exec(compile(source, "<hostir compiled program>", "exec"), namespace)
        self.run: Callable[[RunContext], None] = namespace["run_program"]

    def fail(self, position: int, error: Exception, context: RunContext) -> NoReturn:
        """Raises what the interpreter raises when instruction ``position`` fails with
        ``error``, with a note naming its line (inner loop lines stay as they are)."""
        instruction, step, note = self.sites[position]
        resolved = True
        try:
            step.resolve(context)  # the interpreter resolves first: its error comes first
        except Exception as resolving:
            error, resolved = resolving, False
        failure = step_failure(error, instruction, step, context)
        notes = [n for n in getattr(error, "__notes__", ()) if n.startswith(LINE_NOTE)]
        if failure is not error:
            for inner in notes:
                failure.add_note(inner)
        if not notes:
            failure.add_note(note)
        if failure is not error:
            raise failure from error
        if not resolved:
            raise failure from None  # not the generated code's Unresolved or KeyError
        raise failure


def compile_program(
    program: HostIrContainer,
    rank: int,
    pipelined: bool,
    step_of: Callable[[Instruction], Step],
) -> CompiledProgram:
    """``program`` compiled for ``rank`` (loops with stages ``pipelined`` or not);
    ``step_of`` gives each instruction's prepared step (its handler and operands)."""
    writer = _Writer(program, rank, pipelined, step_of)
    return CompiledProgram(writer.source(), writer.sites, writer.names)


class _Writer:
    """Writes the source of one compiled program (see the module docstring)."""

    def __init__(
        self,
        program: HostIrContainer,
        rank: int,
        pipelined: bool,
        step_of: Callable[[Instruction], Step],
    ):
        self.program = program
        self.rank = rank
        self.pipelined = pipelined
        self.step_of = step_of
        self.meshes: MeshNames = mesh_names(program)
        self.sites: list[tuple[Instruction, Step, str]] = []
        self.names: dict[str, Any] = {}  # the generated code's globals besides the helpers
        self.functions: list[list[str]] = []  # the loop bodies' functions, in order

    def source(self) -> str:
        """The whole module: ``run_program(ctx)`` and one function per loop body."""
        mode = "pipelined" if self.pipelined else "unpipelined"
        header = [
            f"# A host IR program compiled for rank {self.rank} (loops {mode}) by"
            " hostir.run.compiled.",
            "# Each block runs one instruction as HostIrEvaluator.run_instruction does;",
            "# the comment gives its line in the program's text form.",
        ]
        # The first instruction's line: the opening brace, the meshes, the inputs.
        first = 2 + len(self.meshes.names) + len(self.program.inputs)
        main = self._function("run_program(ctx)", self.program.body, first)
        blocks = [main] + self.functions
        return "\n".join(header + [line for block in blocks for line in [""] + block]) + "\n"

    def _function(self, signature: str, body: Sequence[Instruction], line: int) -> list[str]:
        """``def signature:`` running ``body``, whose first instruction is on ``line``."""
        lines = [f"def {signature}:"]
        if signature.startswith("run_program"):
            lines += [INDENT + "t = ctx.tensors", INDENT + "s = ctx.scalars"]
        for instruction in body:
            text = print_instruction(instruction, self.meshes)
            lines += self._instruction(instruction, line, text[0])
            line += len(text)
        if len(lines) == 1:
            lines.append(INDENT + "pass")
        return lines

    def _instruction(self, instruction: Instruction, line: int, text: str) -> list[str]:
        """The block running one instruction, indented once."""
        k, step, code = self._site(instruction, line, text)
        if step.mesh is not None and not step.mesh.contains(self.rank):
            return [INDENT + c for c in self._absent(k, step, code)]
        self.names[f"I{k}"] = instruction
        checks, operands = self._operands(step)
        body = [f"{name} = {expression}" for name, expression in checks]
        if checks:
            body.append(f"if {' or '.join(f'{name} is None' for name, _ in checks)}:")
            body.append(INDENT + "raise Unresolved")
        if isinstance(instruction, ForLoop) and not (self.pipelined and is_pipelined(instruction)):
            body += self._loop(instruction, k, line)
        else:
            if isinstance(instruction, ForLoop):
                code[0] += "  (pipelined: the interpreter runs its stages)"
            body += self._handler_call(k, step, operands)
        code += ["try:"] + [INDENT + b for b in body]
        code += ["except Exception as e:", INDENT + f"fail({k}, e, ctx)"]
        return [INDENT + c for c in code]

    def _site(self, instruction: Instruction, line: int, text: str) -> tuple[int, Step, list]:
        """Numbers ``instruction`` (on ``line``, printed ``text``) among the sites: its
        number, its prepared step, and the comment opening its block."""
        step = self.step_of(instruction)
        k = len(self.sites)
        self.sites.append((instruction, step, f"{LINE_NOTE}{line}: {text}"))
        return k, step, [f"# [{k}] line {line}: {text}"]

    def _target(self, name: str) -> str:
        """Where the generated code binds value ``name``: ``t[name]`` (``ctx.tensors``)."""
        return f"t[{name!r}]"

    def _absent(self, k: int, step: Step, code: list[str]) -> list[str]:
        """The block (``code``: its opening comment) of instruction ``k``, which this rank
        does not run: the comment says so, and what it defines is None here; or, where the
        rank holds what it defines, the block raises (``hostir.run.steps.skipped_failure``,
        as the interpreter does)."""
        code[0] += "  (not on this rank)"
        instruction, _, note = self.sites[k]
        failure = skipped_failure(instruction, self.rank, self.program)
        if failure is not None:
            self.names[f"X{k}"] = _fresh(failure, note)
            return code + [f"raise X{k}()"]
        return code + ([f"{self._target(name)} = None" for name in step.defined] or ["pass"])

    def _handler_call(self, k: int, step: Step, operands: Sequence[tuple[str, str]]) -> list[str]:
        """The statements calling instruction ``k``'s handler on ``operands`` (field name,
        expression) and binding its results, a posted request recorded."""
        self.names[f"H{k}"] = step.handler
        call = f"H{k}(ctx, I{k}, {{{', '.join(f'{n!r}: {e}' for n, e in operands)}}})"
        code = [f"r = {call}" if step.binds else call]
        code += [f"{self._target(name)} = r[{index}]" for index, name in step.binds]
        if step.posts is not None:
            code.append(f"ctx.posted[{step.posts!r}] = I{k}")
        return code

    def _loop(self, loop: ForLoop, k: int, line: int) -> list[str]:
        """The statements of a ``for`` loop run as the interpreter's handler runs it."""
        name = f"loop_{k}"
        slot = len(self.functions)
        self.functions.append([])  # the outer loop's function before the inner ones
        self.functions[slot] = self._function(f"{name}(ctx, t, s)", loop.body, line + 1)
        start, stop = self._whole(loop.start), self._whole(loop.stop)
        index = loop.index.name
        return [
            f"for i in range({start}, {stop}):",
            INDENT + f"s[{index!r}] = i",
            INDENT + f"{name}(ctx, t, s)",
            f"s.pop({index!r}, None)",
        ]

    def _whole(self, expr: Any) -> str:
        """``int(expr)``, as the loop handler takes a bound (an int constant as it is)."""
        if isinstance(expr, Const) and type(expr.value) is int:
            return repr(expr.value)
        return f"int({self._scalar(expr)})"

    def _operands(self, step: Step) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """The tensors to check for None (local name, expression), and every operand
        (field name, expression), as ``Step.resolve`` resolves them."""
        checks, operands = [], []
        for name, operand in step.operands:
            expression = self._operand(operand)
            if isinstance(operand, NAMED_VALUES) and not step.optional:
                local = f"o_{name}"
                checks.append((local, expression))
                expression = local
            operands.append((name, expression))
        return checks, operands

    def _operand(self, operand: Any) -> str:
        """The expression for one operand (see hostir.run.steps.resolve_operand)."""
        if operand is None:
            return "None"
        if isinstance(operand, StreamValue):
            if operand.index is not None:
                return f"ctx.stream_pool.stream_id(int({self._scalar(operand.index)}))"
            return f"t[{operand.name!r}]"
        if isinstance(operand, NAMED_VALUES):
            return f"t[{operand.name!r}]"
        if isinstance(operand, Const | Symbol | MeshCoordinate | BinaryExpr):
            return self._scalar(operand)
        return self._constant(operand)

    def _scalar(self, expr: Any) -> str:
        """A scalar expression as Python (``hostir.ir.scalars.evaluate_scalar``'s
        arithmetic; a division by zero or an unbound symbol fails, and the interpreter's
        resolution then names it)."""
        if isinstance(expr, Const):
            return self._constant(expr.value)
        if isinstance(expr, Symbol):
            return f"s[{expr.name!r}]"
        if isinstance(expr, MeshCoordinate):
            coordinate = expr.mesh.coordinate(self.rank, expr.axis)  # fixed for the rank
            return "unresolved()" if coordinate is None else repr(coordinate)
        return f"({self._scalar(expr.lhs)} {expr.op.value} {self._scalar(expr.rhs)})"

    def _constant(self, value: Any) -> str:
        """``value`` written inline where its ``repr`` reads back as the same value,
        else as a global of the generated code (``K0``: a NaN, an infinity, an object)."""
        if type(value) in (int, bool) or (type(value) is float and math.isfinite(value)):
            return repr(value)
        name = f"K{len(self.names)}"
        self.names[name] = value
        return name
