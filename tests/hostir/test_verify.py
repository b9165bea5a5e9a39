"""The verifier (hostir.check.verify): ill-formed programs are refused before anything runs them,
from text (``line:col``), JSON (the JSON path), Python (the instruction) and ``hostir check``.

Each fault of the Reliability issue has its program here; each used to be accepted (and
the evaluator ran it). Every well-formed program the suite lowers is verified too: the
suite parses every program it lowers back (``HOSTIR_CHECK_ROUND_TRIP``), and parsing
verifies.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Callable

import pytest
import torch

from hostir import (
    Allocate,
    BinaryExpr,
    Const,
    DType,
    ForLoop,
    HostIrContainer,
    HostIrEvaluator,
    ScalarInput,
    ScalarOp,
    Symbol,
    TensorValue,
    Unary,
    UnaryOpKind,
    VerifyError,
    cli,
    parse,
)
from hostir.check.verify import verify
from hostir.errors import JsonFormatError
from hostir.text import json_format
from tests.hostir.programs import c

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"

HEAD = "%HostIrContainer {\n  mesh M0 = [2] : [1]\n"
TWO_MESHES = HEAD + "  mesh M1 = [2] : [1] + 2\n"  # devices 0, 1 and 2, 3

FAULTS = {
    "use after deallocate": (
        HEAD
        + "  input T0 : float32[4] @M0\n"
        + "  T1 : float32[4] @M0 = relu(T0)\n"
        + "  deallocate T1\n"
        + "  T2 : float32[4] @M0 = neg(T1)\n"
        + "  output T2\n}\n",
        (6, 3),
        "neg uses T1 after its deallocate",
    ),
    "double deallocate": (
        HEAD
        + "  input T0 : float32[4] @M0\n"
        + "  T1 : float32[4] @M0 = relu(T0)\n"
        + "  T2 : float32[4] @M0 = neg(T1)\n"
        + "  deallocate T1\n"
        + "  deallocate T1\n"
        + "  output T2\n}\n",
        (7, 3),
        "deallocate T1: T1 is deallocated twice",
    ),
    "result extent against its op": (
        HEAD
        + "  input T0 : float32[4, 8] @M0\n"
        + "  input T1 : float32[6, 8] @M0\n"
        + "  T2 : float32[4, 5] @M0 = linear(T0, T1)\n"
        + "  output T2\n}\n",
        (5, 3),
        "linear: T2 is declared with extents [4, 5], but the op gives [4, 6]",
    ),
    "result dtype against its op": (
        HEAD
        + "  input T0 : float32[4, 8] @M0\n"
        + "  input T1 : float32[6, 8] @M0\n"
        + "  T2 : float64[4, 6] @M0 = linear(T0, T1)\n"
        + "  output T2\n}\n",
        (5, 3),
        "T2 is declared float64, but the op gives float32",
    ),
    "contraction extents": (
        HEAD
        + "  input T0 : float32[4, 8] @M0\n"
        + "  input T1 : float32[6, 7] @M0\n"
        + "  T2 : float32[4, 6] @M0 = linear(T0, T1)\n"
        + "  output T2\n}\n",
        (5, 3),
        "linear: T0 dim 1 has extent 8 but T1 dim 1 has extent 7; they must be equal",
    ),
    "deallocate of an output": (
        HEAD
        + "  input T0 : float32[4] @M0\n"
        + "  T1 : float32[4] @M0 = relu(T0)\n"
        + "  deallocate T1\n"
        + "  output T1\n}\n",
        (5, 3),
        "deallocate T1: T1 is an output of the program",
    ),
    "empty loop as the only writer": (
        HEAD
        + "  input T0 : float32[4] @M0 {0: [x, 2]}\n"
        + "  allocate T1 : float32[4] @M0 {0: [x, 2]}\n"
        + "  for j in range(0, 0) {\n"
        + "    neg(T0, out=T1)\n"
        + "  }\n"
        + "  output T1\n}\n",
        (4, 3),
        "output T1 is allocated but never certainly written",
    ),
    "Allreduce of a tensor that is not partial": (
        HEAD
        + "  input T0 : float32[4] @M0\n"
        + "  T1 : float32[4] @M0, R0 = Allreduce(T0, team=M0(x), op=sum)\n"
        + "  wait R0\n"
        + "  output T1\n}\n",
        (4, 3),
        "Allreduce reduces T0 over (x) with sum, but T0 is not partial (sum) there",
    ),
    "a request never waited": (
        HEAD
        + "  input T0 : float32[4] @M0 {0: [x, 2]}\n"
        + "  T1 : float32[4] @M0, R0 = Allgather(T0, team=M0(x), axis=0)\n"
        + "  output T1\n}\n",
        (4, 3),
        "request R0 is never waited in the program",
    ),
    "a request waited twice": (
        HEAD
        + "  input T0 : float32[4] @M0 {0: [x, 2]}\n"
        + "  T1 : float32[4] @M0, R0 = Allgather(T0, team=M0(x), axis=0)\n"
        + "  wait R0\n"
        + "  wait R0\n"
        + "  output T1\n}\n",
        (6, 3),
        "wait R0: R0 is waited twice",
    ),
    "a sharding that does not make up its extent": (
        HEAD + "  input T0 : float32[8] @M0 {0: [x, 3]}\n  output T0\n}\n",
        (3, 3),  # the input's line (was the output's: the verifier's error had no place)
        "T0 dim 0: the parts [x, 3] do not make up its extent 8",
    ),
    "a loop body deallocating what it did not define": (
        HEAD
        + "  input T0 : float32[4] @M0\n"
        + "  T1 : float32[4] @M0 = relu(T0)\n"
        + "  for j in range(0, 2) {\n"
        + "    deallocate T1\n"
        + "  }\n"
        + "  output T0\n}\n",
        (6, 5),
        "a loop body deallocates T1, which it did not define",
    ),
    # Where an integer is meant, a float or a bool used to be truncated by int() when run.
    "a fractional loop bound": (
        HEAD + "  input T0 : float32[4] @M0\n  for j in range(0, 2.5) {\n  }\n  output T0\n}\n",
        (4, 3),
        "for: stop: expected an integer, got the constant 2.5",
    ),
    "a fractional chunk index": (
        HEAD
        + "  input T0 : float32[4] @M0\n"
        + "  for j in range(0, 2) {\n"
        + "    T1 : float32[2] @M0 = shard_by_stream(T0, axis=0, index=j * 0.5)\n"
        + "  }\n"
        + "  output T0\n}\n",
        (5, 5),
        "shard_by_stream: index: expected an integer, got the constant 0.5",
    ),
    # Issue 32: a team off its tensors' devices used to verify; at 4 ranks ranks 0 and 1
    # returned None for T1 (on their mesh) while ranks 2 and 3 raised.
    "a team on another mesh than its tensors": (
        TWO_MESHES
        + "  input T0 : float32[4] @M0 {0: [x, 2]}\n"
        + "  T1 : float32[4] @M0, R0 = Allgather(T0, team=M1(x), axis=0)\n"
        + "  wait R0\n"
        + "  output T1\n}\n",
        (5, 3),
        "Allgather: T1 is on mesh M0 (devices [0, 1]), but team M1(x) is on devices [2, 3]:"
        " device 0 would hold T1 without taking part; expected T1's devices in the team",
    ),
    "a team whose members do not all hold what they send": (
        HEAD
        + "  mesh M1 = [4] : [1]\n"
        + "  input T0 : float32[4] @M0 partial{x: sum}\n"
        + "  T1 : float32[4] @M1, R0 = Allreduce(T0, team=M1(x), op=sum)\n"
        + "  wait R0\n"
        + "  output T1\n}\n",
        (5, 3),
        "every member of team M1(x) (devices [0, 1, 2, 3]) sends T0, which is on mesh M0"
        " (devices [0, 1]): device 2 does not hold it",
    ),
    # Only the root of a Gather receives: rank 1 used to return uninitialized memory.
    "a gathered output on members that receive nothing": (
        HEAD
        + "  input T0 : float32[4] @M0 {0: [x, 2]}\n"
        + "  T1 : float32[4] @M0, R0 = Gather(T0, team=M0(x), axis=0, root=0)\n"
        + "  wait R0\n"
        + "  output T1\n}\n",
        (4, 3),
        "Gather: T1 is on mesh M0 (devices [0, 1]), but only the root of each group of team"
        " M0(x) receives it (devices [0]): device 1 would hold T1 unwritten",
    ),
    "a team with a member that holds neither tensor": (
        HEAD
        + "  mesh M1 = [4] : [1]\n"
        + "  input T0 : float32[4] @M0\n"
        + "  T1 : float32[4] @M0, R0 = Broadcast(T0, team=M1(x), root=0)\n"
        + "  wait R0\n"
        + "  output T1\n}\n",
        (5, 3),
        "Broadcast: device 2 of team M1(x) holds neither T0 (on M0: devices [0, 1]) nor T1 (on"
        " M0: devices [0, 1]); expected the team on the devices of the tensors it reads",
    ),
    "a root outside its team": (
        HEAD
        + "  input T0 : float32[4] @M0\n"
        + "  T1 : float32[4] @M0, R0 = Broadcast(T0, team=M0(x), root=2)\n"
        + "  wait R0\n"
        + "  output T1\n}\n",
        (4, 3),
        "Broadcast: root 2 is not a member of team M0(x): its groups have 2 member(s);"
        " expected a position from 0 to 1",
    ),
    "a root given as a bool": (
        HEAD
        + "  input T0 : float32[4] @M0\n"
        + "  T1 : float32[4] @M0, R0 = Broadcast(T0, team=M0(x), root=true)\n"
        + "  wait R0\n"
        + "  output T1\n}\n",
        (4, 3),
        "Broadcast: root: expected an integer, got the constant true",
    ),
}


@pytest.mark.parametrize("name", FAULTS)
def test_parse_refuses_at_the_line_and_column_of_the_instruction(name):
    text, (line, col), message = FAULTS[name]
    with pytest.raises(VerifyError) as info:
        parse(text)
    assert (info.value.line, info.value.col) == (line, col)
    assert str(info.value).startswith(f"{line}:{col}: ") and message in str(info.value)


@pytest.mark.parametrize("name", FAULTS)
def test_hostir_check_prints_file_line_col(name, tmp_path, capsys):
    text, (line, col), message = FAULTS[name]
    path = tmp_path / "bad.hir"
    path.write_text(text)
    assert cli.main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:{line}:{col}: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("name", FAULTS)
def test_the_evaluator_refuses_the_same_program_built_in_python(name):
    """The program read without verification (JSON's codec) and handed to the evaluator."""
    text, _, message = FAULTS[name]
    program = _unverified(text)
    where = r"^(body\[\d+\]|(in|out)puts\[\d+\]|the program)"
    with pytest.raises(VerifyError, match=where) as info:
        HostIrEvaluator(program)
    assert message in str(info.value)


@pytest.mark.parametrize("name", FAULTS)
def test_from_json_refuses_with_the_json_path(name):
    text, _, message = FAULTS[name]
    document = _unverified(text).to_json()
    where = r"^program((\.body\[\d+\])*|\.(in|out)puts\[\d+\]): "
    with pytest.raises(JsonFormatError, match=where) as info:
        HostIrContainer.from_json(document)
    assert message in str(info.value)


def test_a_json_document_with_a_renamed_definition_is_refused():
    """Every use in JSON carries its value: a definition renamed alone leaves uses of a value
    nothing defines."""
    program = parse(
        HEAD
        + "  input T0 : float32[4] @M0\n"
        + "  T1 : float32[4] @M0 = relu(T0)\n"
        + "  T2 : float32[4] @M0 = neg(T1)\n"
        + "  output T2\n}\n"
    )
    document = json.loads(program.to_json())
    document["program"]["body"][0]["out"]["name"] = "T9"
    with pytest.raises(JsonFormatError, match=r"^program\.body\[1\]: neg uses T1 before it"):
        HostIrContainer.from_json(json.dumps(document))
    document = json.loads(program.to_json())
    document["program"]["body"][1]["src"]["dtype"]["value"] = "float64"
    with pytest.raises(JsonFormatError, match=r"^program\.body\[1\]: neg uses T1 as a value"):
        HostIrContainer.from_json(json.dumps(document))


DECLARED = (
    HEAD
    + "  input T0 : float32[4] @M0\n"
    + "  input T1 : float32[4] @M0 {0: [x, 2]}\n"
    + "  T2 : float32[4] @M0 = neg(T0)\n"
    + "  output T2\n"
    + "  output T1\n}\n"
)


def _set(where: list, value) -> Callable[[dict], None]:
    """A change of the JSON document of DECLARED: the field at ``where`` becomes ``value``."""

    def change(document: dict) -> None:
        node = document["program"]
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "path", "words", "message"),
    [
        (
            _set(["inputs", 1, "name"], "T0"),
            "program.inputs[1]",
            "inputs[1] (T0)",
            "input T0 is declared twice",
        ),
        (
            _set(["inputs", 1, "shape", 0, "value"], 6),
            "program.inputs[1]",
            "inputs[1] (T1)",
            "T1 dim 0: the parts [x, 2] do not make up its extent 6",
        ),
        (
            _set(["outputs", 1, "name"], "T9"),
            "program.outputs[1]",
            "outputs[1] (T9)",
            "output T9 uses T9 before it is defined",
        ),
        (
            _set(["outputs", 1, "dtype", "value"], "float64"),
            "program.outputs[1]",
            "outputs[1] (T1)",
            "output T1 uses T1 as a value other than the one defined at the inputs",
        ),
        (
            _set(["body", 0, "out", "name"], "T1"),
            "program.body[0]",
            "body[0] (neg defining T1)",
            "neg defines T1 a second time",
        ),
    ],
    ids=["input twice", "input's sharding", "undefined output", "output differs", "defined twice"],
)
def test_a_refused_declaration_is_named_where_it_is(change, path, words, message):
    """A JSON program listing an input twice (or an input the verifier refuses) used to be
    refused at ``program.outputs``, and in words at "the program's outputs"; an output at
    fault at ``program.outputs`` without its index. Each now names the field at fault."""
    document = json.loads(parse(DECLARED).to_json())
    change(document)
    with pytest.raises(JsonFormatError) as info:
        HostIrContainer.from_json(json.dumps(document))
    assert str(info.value).startswith(f"{path}: {message}")
    unverified = json_format.read_document(json.dumps(document))
    with pytest.raises(VerifyError) as info:
        HostIrEvaluator(unverified)
    assert str(info.value).startswith(f"{words}: {message}")


def test_text_refuses_an_input_at_its_own_line():
    """An input whose sharding does not make up its extent used to be refused at the line of
    the first output (or at 1:1 in a program without outputs)."""
    text = DECLARED.replace("float32[4] @M0 {0: [x, 2]}", "float32[6] @M0 {0: [x, 2]}")
    for program in (text, text.replace("  output T1\n", "").replace("  output T2\n", "")):
        with pytest.raises(VerifyError, match=r"^4:3: T1 dim 0: the parts \[x, 2\] do not"):
            parse(program)


@pytest.mark.world_sizes(2)
def test_an_empty_loop_that_left_its_output_uninitialized_is_refused_on_every_rank(
    multidevice_test,
):
    """The 2-rank program whose only writer is a loop of no iterations used to return
    uninitialized memory; both ranks now refuse it, and the same program with one
    iteration runs and matches torch."""
    text = FAULTS["empty loop as the only writer"][0]
    with pytest.raises(VerifyError, match=r"^4:3: output T1 is allocated but never"):
        parse(text)
    program = parse(text.replace("range(0, 0)", "range(0, 1)"))
    torch.manual_seed(0)
    full = torch.randn(4)
    mine = full.chunk(2)[multidevice_test.rank]
    (out,) = HostIrEvaluator(program).run([mine])
    torch.testing.assert_close(out, -mine)


def test_world_size_check_names_a_mesh_larger_than_the_world(tmp_path, capsys):
    path = tmp_path / "four.hir"
    path.write_text(
        "%HostIrContainer {\n  mesh M0 = [4] : [1]\n  input T0 : float32[8] @M0 {0: [x, 2]}\n"
        "  output T0\n}\n"
    )
    assert cli.main(["check", str(path), "--world-size", "4"]) == 0
    assert cli.main(["check", str(path), "--world-size", "2"]) == 1
    err = capsys.readouterr().err
    assert f"{path}: mesh [4] : [1] needs device 3, but the world has 2 rank(s)" in err


@pytest.mark.parametrize("path", sorted(DATA.glob("*.hir")), ids=lambda p: p.name)
def test_every_program_of_the_test_data_verifies(path):
    """The hand-written programs (but the one that is broken on purpose) are well formed."""
    if path.name == "cli_broken.hir":
        with pytest.raises(Exception, match="unknown instruction"):
            parse(path.read_text())
        return
    parse(path.read_text())


def test_symbolic_extents_compare_in_their_normal_form():
    """``2 * (i0 // 2)`` parts make up ``i0``; extents over other symbols may agree at run
    time and are not refused; constant ones that differ are."""
    text = (
        HEAD
        + "  input T0 : float32[i0, 8] @M0 {0: [x, i0 // 2]}\n"
        + "  input T1 : float32[i1, 8] @M0 {0: [x, i1 // 2]}\n"
        + "  T2 : float32[i0, 8] @M0 {0: [x, i0 // 2]} = add(T0, T1)\n"
        + "  output T2\n}\n"
    )
    parse(text)
    with pytest.raises(VerifyError, match=r"T2 is declared with extents \[i0, 9\]"):
        parse(text.replace("T2 : float32[i0, 8]", "T2 : float32[i0, 9]"))


def _unverified(text: str) -> HostIrContainer:
    """The program ``text`` describes, read without the verifier."""
    return parse(text, verify_program=False)


# ----- what text cannot write, and programs nested past the limits ----------------------


def _loop_over(stop, body=()) -> ForLoop:
    return ForLoop(index=Symbol(name="i"), start=Const(value=0), stop=stop, body=body)


def _program(*body, inputs=()) -> HostIrContainer:
    return HostIrContainer(inputs=inputs, outputs=(), body=body)


@pytest.mark.parametrize(
    ("stop", "message"),
    [
        (Symbol(name="inf"), "for: stop: a symbol is named 'inf', which reads as something"),
        (Symbol(name="i 0"), "for: stop: a symbol is named 'i 0'"),
        (Const(value="2"), "for: stop: a constant is an int, a float or a bool, got str"),
        (Const(value=10**4300), "for: stop: an int constant has more than 4300 digits"),
        (BinaryExpr(op=ScalarOp.MOD, lhs=Const(value=4), rhs=Const(value=0)), "by the constant 0"),
        (2, "for: stop: expected a scalar (a constant, a symbol, coord(...) or arithmetic)"),
    ],
    ids=["reserved name", "not a name", "str", "huge int", "modulo 0", "bare int"],
)
def test_scalars_text_cannot_write_are_refused(stop, message):
    """A program built in Python with these used to verify and then print text that reads
    back as another program (``inf`` is a constant) or does not print at all."""
    with pytest.raises(VerifyError, match=re.escape(message)):
        verify(_program(_loop_over(stop)))


def test_a_scalar_input_named_like_a_constant_is_refused():
    """``input inf : float64`` would print text that reads ``inf`` as infinity."""
    with pytest.raises(VerifyError, match="input inf: a symbol is named 'inf'"):
        verify(_program(inputs=(ScalarInput(name="inf", dtype=DType.FLOAT64),)))


def test_extents_of_python_built_tensors_are_whole_numbers():
    x = TensorValue(name="T0", dtype=DType.FLOAT32, shape=(Const(value=4), Const(value=7.9)))
    with pytest.raises(VerifyError, match=r"T0 dim 1: an extent must be a whole number >= 0"):
        verify(_program(inputs=(x,)))


def test_loops_nested_past_the_limit_are_refused_by_name():
    """33 nested loops are refused at the 33rd; 2000 (which used to raise RecursionError)
    too."""
    for depth in (33, 2000):
        body: tuple = ()
        for k in reversed(range(depth)):
            body = (ForLoop(index=Symbol(name=f"i{k}"), start=c(0), stop=c(1), body=body),)
        with pytest.raises(VerifyError, match="loops nest deeper than 32") as info:
            verify(_program(*body))
        assert info.value.path == (0,) * 33


def test_expressions_nested_past_the_limit_are_refused_by_name():
    """A loop bound 100 operators deep verifies; 101, or 5000 (which the evaluator's and the
    printer's recursive helpers could not take), is refused."""
    for depth, ok in ((100, True), (101, False), (5000, False)):
        stop: object = Const(value=1)
        for _ in range(depth):
            stop = BinaryExpr(op=ScalarOp.ADD, lhs=stop, rhs=Const(value=1))
        if ok:
            verify(_program(_loop_over(stop)))
            continue
        with pytest.raises(VerifyError, match="the expression nests deeper than 100 operators"):
            verify(_program(_loop_over(stop)))


def test_a_program_at_every_limit_prints_reads_back_and_runs():
    """32 nested loops, the innermost one's bound 100 operators deep: the limits leave room
    for the printer, the parser, the JSON codec (its nesting bound) and the evaluator, and
    the program computes what torch does."""
    stop: object = Const(value=1)
    for _ in range(100):
        stop = BinaryExpr(op=ScalarOp.ADD, lhs=stop, rhs=Const(value=0))
    x, y = (TensorValue(name=n, dtype=DType.FLOAT32, shape=(Const(value=4),)) for n in "xy")
    body: tuple = (Unary(op=UnaryOpKind.NEG, out=y, src=x, preallocated=True),)
    for k in reversed(range(32)):
        bound = stop if k == 31 else Const(value=1)
        body = (ForLoop(index=Symbol(name=f"i{k}"), start=Const(value=0), stop=bound, body=body),)
    program = HostIrContainer(inputs=(x,), outputs=(y,), body=(Allocate(out=y), *body))
    assert parse(str(program)) == program
    assert HostIrContainer.from_json(program.to_json()) == program
    value = torch.randn(4)
    (out,) = HostIrEvaluator(program).run([value])
    torch.testing.assert_close(out, -value)
