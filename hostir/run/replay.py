"""Replays: a program compiled for one rank, for the input signatures it already ran.

The first run of an input signature binds and checks everything the signature fixes
(``hostir.run.bindings``) and runs the compiled program (``hostir.run.compiled``),
whose handlers check each result against its declared local shape. A later run with
the same signature has nothing left to find out, so it runs the *replay*: the same
program compiled leaner, its results exactly those of the compiled and interpreted
runs (the suite compares them bitwise, ``HOSTIR_CHECK_COMPILED``):

- tensors are Python locals, not entries of ``ctx.tensors``; the inputs arrive as
  arguments and the outputs leave as the return value;
- a compute instruction that defines a fresh tensor is its torch call
  (``hostir.run.implementations.plain_call``), without the handler's shape check: the
  inputs' shapes fix the results' shapes, and the signature's first run checked them (the
  call of an op of several results returns them all: ``v_T5, v_T6 = F3(v_T0, 3)``); a declared
  op's instruction that writes a preallocated ``out`` is its write
  (``hostir.run.implementations.write_call``: in place, or a copy), likewise;
- ``deallocate`` drops the local; a ``for`` loop is a Python loop in the same
  function; a wait is the request's ``wait()``;
- an Allreduce over a group of this rank alone returns its source itself where no one
  can tell the difference: the source is a fresh tensor of the program (not an input,
  not an output, not a view of another, never written in place) and the result is
  never written in place either; elsewhere it copies, as the handler does;
- on the CPU (a replay made with ``on_cpu``), the stream instructions are left out: there
  they only move the run's bookkeeping of the current stream, and execution stays in
  program order (``hostir.run.stream_handlers``);
- every other instruction calls its handler, as the compiled program does.

A program with a loop whose stages run pipelined (``hostir.run.pipelined_loops``
interleaves iterations) has no replay: its runs stay compiled; so has a program that binds
run-time extents (``hostir.ir.host_reads``). A failure inside a
replay raises what the interpreter raises, with the same line note
(``CompiledProgram.fail``, after the locals are put back into ``ctx.tensors``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from hostir.analysis.pipeline_stages import is_pipelined, stages
from hostir.ir.communications import Allreduce, Wait
from hostir.ir.container import HostIrContainer
from hostir.ir.instructions import (
    Deallocate,
    ForLoop,
    Instruction,
    ShardByStream,
    defined_values,
)
from hostir.ir.program_info import run_time_symbols, walk_instructions
from hostir.ir.values import NAMED_VALUES, StreamValue, TensorValue
from hostir.run.communication_handlers import run_wait
from hostir.run.compiled import INDENT, CompiledProgram, _Writer
from hostir.run.context import RunContext
from hostir.run.implementations import implementation_of
from hostir.run.implementations import plain_call as declared_call
from hostir.run.implementations import write_call as declared_write
from hostir.run.steps import Step
from hostir.run.stream_handlers import STREAM_HANDLERS, make_current
from hostir.text.printer import print_instruction


class ReplayProgram(CompiledProgram):
    """A replay (see the module docstring): ``run(ctx, inputs)`` returns the outputs.

    Where ``uses_context`` is False (no handler is called, no scalar read), ``ctx`` may
    instead be a function making the run's context, called only if an instruction
    fails (to say why, as the interpreter would).
    """

    uses_context = True

    def __init__(
        self,
        source: str,
        sites: list[tuple[Instruction, Step, str]],
        names: dict,
        locals_of: dict[str, str],
    ):
        self.locals_of = locals_of  # local variable -> the value it holds
        # run(ctx, inputs) -> outputs (the base class's run takes only ctx)
        super().__init__(source, sites, {**names, "fail_at": self.fail_at})

    def fail_at(
        self, position: int, error: Exception, context: RunContext, local: dict
    ) -> NoReturn:
        """:meth:`CompiledProgram.fail`, once the values bound so far (``local``: the
        replay's locals) are in ``context.tensors``, where the interpreter's resolution
        looks for them. ``context`` may be the function making it (see the class)."""
        if not isinstance(context, RunContext):
            context = context()
        for variable, name in self.locals_of.items():
            if variable in local:
                context.tensors[name] = local[variable]
        self.fail(position, error, context)


STREAM_INSTRUCTIONS = tuple(STREAM_HANDLERS)
"""The instructions that only switch or order streams."""


def replay_program(
    program: HostIrContainer,
    rank: int,
    pipelined: bool,
    step_of: Callable[[Instruction], Step],
    on_cpu: bool = False,
) -> ReplayProgram | None:
    """``program``'s replay for ``rank`` (for runs on the CPU alone with ``on_cpu``: no
    stream instructions); None if a loop run pipelined holds a loop, loops nest deeper
    than Python compiles, or the program binds run-time extents (``RaggedAllToAll``'s
    ``received``: a replay drops the shape checks that the first run of a signature made,
    but these extents change from run to run)."""
    if run_time_symbols(program):
        return None
    for loop in walk_instructions(program.body):
        if pipelined and isinstance(loop, ForLoop) and is_pipelined(loop):
            if any(isinstance(i, ForLoop) for i in walk_instructions(loop.body)):
                return None
    writer = _ReplayWriter(program, rank, pipelined, step_of)
    writer.on_cpu = on_cpu
    source = writer.source()
    try:
        replay = ReplayProgram(source, writer.sites, writer.names, writer.locals_of)
    except SyntaxError as error:
        # Loops nested deeper than Python's 20 nested blocks (each inlined loop takes
        # three): no replay; the compiled program, which runs loop bodies through their
        # handler, runs instead.
        if "too many statically nested blocks" in str(error):
            return None
        raise
    replay.uses_context = writer.uses_context
    return replay


class _ReplayWriter(_Writer):
    """Writes a replay's source: the compiled program's, with the changes the module
    docstring lists."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.variables: dict[str, str] = {}  # value name -> local variable
        self.locals_of: dict[str, str] = {}
        self.aliasable = _aliasable(self.program)
        # Values certainly bound to a tensor wherever they are read: inputs this rank
        # holds (the call's key says they are tensors) and results of torch calls. Their
        # reads need no check for None; a value the program binds anew elsewhere (in a
        # loop, or to None) leaves the set.
        self.present: set[str] = set()
        self.on_cpu = False  # leave the stream instructions out (see the module docstring)

    def variable(self, name: str) -> str:
        """The local variable holding value ``name``."""
        found = self.variables.get(name)
        if found is None:
            found = "v_" + re.sub(r"\W", "_", name)
            while found in self.locals_of:
                found += "_"
            self.variables[name], self.locals_of[found] = found, name
        return found

    def source(self) -> str:
        """``run_program(ctx, inputs)``, returning the outputs."""
        header = [
            f"# A host IR program's replay for rank {self.rank} by hostir.run.replay:",
            "# compiled for input signatures that already ran (see the module docstring).",
            "# Each block runs one instruction; the comment gives its line in the text form.",
        ]
        lines = ["def run_program(ctx, inputs):"]
        for index, value in enumerate(self.program.inputs):
            if isinstance(value, TensorValue):
                held = value.sharding is None or value.sharding.mesh.contains(self.rank)
                given = f"inputs[{index}]" if held else "None"
                if held:
                    self.present.add(value.name)
                lines.append(INDENT + f"{self.variable(value.name)} = {given}")
        first = 2 + len(self.meshes.names) + len(self.program.inputs)
        body = self._block(self.program.body, first, 1)
        # Only code that calls a handler or reads a scalar needs the run's context; a
        # failure's report (fail_at) makes one when it needs it.
        self.uses_context = any(
            re.search(r"\bctx\b|\bs\[", b.split("#")[0])
            for b in body
            if not b.lstrip().startswith("fail_at(")
        )
        if self.uses_context:
            lines.append(INDENT + "s = ctx.scalars")
        lines += body
        outputs = ", ".join(self.variable(v.name) for v in self.program.outputs)
        lines.append(INDENT + f"return [{outputs}]")
        return "\n".join(header + [""] + lines) + "\n"

    def _block(self, body: Sequence[Instruction], line: int, depth: int) -> list[str]:
        """The statements running ``body`` (first instruction on ``line``), at ``depth``."""
        lines = []
        for instruction in body:
            text = print_instruction(instruction, self.meshes)
            lines += [INDENT * depth + c for c in self._statement(instruction, line, text[0])]
            line += len(text)
        return lines or [INDENT * depth + "pass"]

    def _statement(self, instruction: Instruction, line: int, text: str) -> list[str]:
        """The statements running one instruction, unindented."""
        k, step, code = self._site(instruction, line, text)
        if step.mesh is not None and not step.mesh.contains(self.rank):
            return self._absent(k, step, code)
        if isinstance(instruction, Deallocate):
            return code + [f"{self.variable(instruction.tensor.name)} = None"]
        if self.on_cpu and isinstance(instruction, STREAM_INSTRUCTIONS):
            return code + ["pass  # a stream instruction: nothing to do on the CPU"]
        self.names[f"I{k}"] = instruction
        checks, operands = self._operands(step)
        body = [f"if {' or '.join(f'{e} is None' for e in checks)}:", INDENT + "raise Unresolved"]
        body = body if checks else []
        if isinstance(instruction, ForLoop) and self.pipelined and is_pipelined(instruction):
            body += self._pipelined(instruction, k, line)
        elif isinstance(instruction, ForLoop):
            body += self._for(instruction, line)
        else:
            body += self._call(instruction, step, k, dict(operands))
        code += ["try:"] + [INDENT + b for b in body]
        return code + ["except Exception as e:", INDENT + f"fail_at({k}, e, ctx, locals())"]

    def _call(self, instruction: Instruction, step: Step, k: int, operands: dict) -> list[str]:
        """The statements making the instruction's call and binding its results."""
        plain = _plain_call(instruction)
        if plain is not None:
            call, fields = plain
            self.names[f"F{k}"] = call
            arguments = ", ".join(operands[name] for name in fields)
            results = [getattr(instruction, name).name for name in instruction.OUTS]
            self.present.update(results)
            targets = ", ".join(self.variable(name) for name in results)
            return [f"{targets} = F{k}({arguments})"]  # an op of several results unpacks
        written = declared_write(instruction)
        if written is not None:
            write, fields = written
            self.names[f"F{k}"] = write
            arguments = ", ".join(operands[name] for name in ("out", *fields))
            return [f"F{k}({arguments})"]
        if type(instruction) is Wait and step.handler is run_wait:
            request = operands["request"]
            return [f"if {request} is not None:", INDENT + f"{request}.wait()"]
        if self._alone(instruction, step):
            src = operands["src"]
            out, request = self.variable(instruction.out.name), instruction.request.name
            self.present.add(instruction.out.name)
            # No request to wait for: a wait on None does nothing, as on a rank that
            # skipped a communication.
            return [
                f"if {src} is None:",
                INDENT + "raise Unresolved",
                f"{out} = {src} if {src}.is_contiguous() else {src}.contiguous()",
                f"{self.variable(request)} = None",
            ]
        return self._handler_call(k, step, list(operands.items()))

    def _target(self, name: str) -> str:
        """A replay binds value ``name`` to its local variable."""
        return self.variable(name)

    def _alone(self, instruction: Instruction, step: Step) -> bool:
        """Whether ``instruction`` is an Allreduce this rank makes alone whose result may
        be its source itself (see the module docstring)."""
        if type(instruction) is not Allreduce or instruction.preallocated:
            return False
        if step.handler.__name__ != "run_allreduce":  # a handler registered instead
            return False
        group = instruction.team.group_of(self.rank)
        out = instruction.out
        holds = out.sharding is None or out.sharding.mesh.contains(self.rank)
        return (
            group is not None
            and len(group) == 1
            and holds
            and {instruction.src.name, out.name} <= self.aliasable
        )

    def _for(self, loop: ForLoop, line: int) -> list[str]:
        """A ``for`` loop as the interpreter's handler runs it, its body inline."""
        index = loop.index.name
        start, stop = self._whole(loop.start), self._whole(loop.stop)
        # The try around the loop is the loop instruction's: its body's are inside.
        return [
            f"for i in range({start}, {stop}):",
            INDENT + f"s[{index!r}] = i",
            *self._block(loop.body, line + 1, 1),
            f"s.pop({index!r}, None)",
        ]

    def _pipelined(self, loop: ForLoop, k: int, line: int) -> list[str]:
        """A pipelined loop's stages interleaved as ``hostir.run.pipelined_loops`` runs
        them: at step ``t`` stage ``n`` runs iteration ``t - lag(n)``; an iteration's
        values (and current stream, and posted communications) are saved after each of
        its stages but the last and restored before the next."""
        index, staged = loop.index.name, stages(loop.body)
        names = sorted({v.name for i in loop.body for v in defined_values(i)})
        self.names["make_current"] = make_current
        self.names[f"N{k}"] = names
        lo, hi, saved = f"lo_{k}", f"hi_{k}", f"saved_{k}"
        code = [
            f"{lo}, {hi}, {saved} = {self._whole(loop.start)}, {self._whole(loop.stop)}, {{}}",
            f"for step in range({lo}, {hi} + {staged[-1][0]}):",
        ]
        body_line, defined = line + 1, []
        for number, (lag, body) in enumerate(staged):
            stage = [f"i = step - {lag}", f"if {lo} <= i < {hi}:"]
            inner = []
            if number:
                carried = ", ".join(self.variable(n) for n in defined) + ","
                inner += [
                    f"{carried} stream, posted = {saved}.pop(i)",
                    "ctx.posted.update(posted)",
                    "make_current(ctx, stream)",
                ]
            inner.append(f"s[{index!r}] = i")
            inner += self._block(body, body_line, 0)
            defined += [v.name for i in body for v in defined_values(i) if v.name in names]
            if number + 1 < len(staged):
                carried = ", ".join(self.variable(n) for n in defined) + ","
                posted = f"{{n: ctx.posted.pop(n) for n in N{k} if n in ctx.posted}}"
                inner.append(f"{saved}[i] = ({carried} ctx.current_stream, {posted})")
            stage += [INDENT + c for c in inner]
            code += [INDENT + c for c in stage]
            body_line += sum(len(print_instruction(i, self.meshes)) for i in body) + 1
        return code + [f"s.pop({index!r}, None)"]

    def _operands(self, step: Step) -> tuple[list[str], list[tuple[str, str]]]:
        """The variables to check for None, and every operand (field name, expression)."""
        checks, operands = [], []
        for name, operand in step.operands:
            expression = self._operand(operand)
            if isinstance(operand, NAMED_VALUES) and not step.optional:
                if operand.name not in self.present:
                    checks.append(expression)
            operands.append((name, expression))
        return checks, operands

    def _operand(self, operand: Any) -> str:
        """As the compiled program's, with tensors, requests and streams as locals."""
        if isinstance(operand, StreamValue) and operand.index is None:
            return self.variable(operand.name)
        if isinstance(operand, NAMED_VALUES):
            return self.variable(operand.name)
        return super()._operand(operand)


def _plain_call(instruction: Instruction) -> tuple[Callable, tuple[str, ...]] | None:
    """The torch call to make directly: a declared op's (``hostir.run.implementations``),
    not preallocated."""
    if getattr(instruction, "preallocated", True):
        return None
    return declared_call(instruction)


def _fresh(instruction: Instruction) -> bool:
    """Whether ``instruction``'s result is a new tensor, never a view: its declared op's
    implementation says it (``fresh``); an Allreduce's is."""
    implementation = implementation_of(instruction)
    if implementation is not None:
        return implementation.fresh
    return isinstance(instruction, Allreduce)


def _aliasable(program: HostIrContainer) -> set[str]:
    """Names of the fresh tensors (defined by a declared op's fresh instruction or an
    Allreduce, not preallocated) that are no program input or output, are never written in
    place (no preallocated instruction writes them) and of which no stream chunk is taken (a
    chunk written in place would write them)."""
    fresh, touched = set(), {v.name for v in (*program.inputs, *program.outputs)}
    for instruction in walk_instructions(program.body):
        if getattr(instruction, "preallocated", False):
            touched.add(instruction.out.name)
        elif _fresh(instruction):
            outs = (getattr(instruction, name) for name in instruction.OUTS)
            fresh.update(value.name for value in outs if isinstance(value, TensorValue))
        if isinstance(instruction, ShardByStream):
            touched.add(instruction.src.name)
    return fresh - touched
