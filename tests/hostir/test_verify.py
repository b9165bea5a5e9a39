"""The verifier (hostir.verify): ill-formed programs are refused before anything runs them,
from text (``line:col``), JSON (the JSON path), Python (the instruction) and ``hostir check``.

Each fault of the Reliability issue has its program here; each used to be accepted (and
the evaluator ran it). Every well-formed program the suite lowers is verified too: the
suite parses every program it lowers back (``HOSTIR_CHECK_ROUND_TRIP``), and parsing
verifies.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from hostir import (
    HostIrContainer,
    HostIrEvaluator,
    VerifyError,
    cli,
    parse,
)
from hostir.errors import JsonFormatError

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"

HEAD = "%HostIrContainer {\n  mesh M0 = [2] : [1]\n"

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
        "linear: the contraction extents differ: input T0 [4, 8] ends in 8, weight T1 [6, 7]",
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
        (4, 3),
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
    with pytest.raises(VerifyError, match=r"^(body\[\d+\]|the program|the inputs)") as info:
        HostIrEvaluator(program)
    assert message in str(info.value)


@pytest.mark.parametrize("name", FAULTS)
def test_from_json_refuses_with_the_json_path(name):
    text, _, message = FAULTS[name]
    document = _unverified(text).to_json()
    with pytest.raises(JsonFormatError, match=r"^program(\.body\[\d+\])*(\.outputs)?: ") as info:
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
