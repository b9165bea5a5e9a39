"""The evaluator on hand-written programs: compute, allocation, loops, aliases, errors."""

from __future__ import annotations

import pytest
import torch

import hostir
from hostir import (
    INSTRUCTIONS,
    Allocate,
    Binary,
    BinaryOpKind,
    BroadcastInDim,
    Cast,
    Communicator,
    Deallocate,
    DType,
    EvaluationError,
    ForLoop,
    HostIrContainer,
    HostIrEvaluator,
    InputError,
    Linear,
    Listener,
    Matmul,
    Mesh,
    MeshError,
    Permute,
    Reduction,
    ReductionOpKind,
    ScalarInput,
    Set,
    ShardByStream,
    Symbol,
    Unary,
    UnaryOpKind,
    VerifyError,
)
from hostir.ir.instructions import keyword
from hostir.ir.opdecl import op_named
from hostir.ir.scalars import add, floordiv, mod, mul, sub
from hostir.run.evaluator import HANDLERS
from hostir.run.implementations import IMPLEMENTATIONS, Implementation
from tests.hostir.programs import block_sharded, c, tensor


def test_every_instruction_has_a_keyword_handler_printer_parser_and_json_tag():
    """Catalog completeness: each declared class is known to every table that is not derived
    from its declaration (its handler, its verifier rule) unless each of its ops is declared
    and implemented (``argsort``: the evaluator runs its implementation, the verifier its
    declaration); its keywords find it, its statements have their parser, and the JSON
    codec knows its tag."""
    from hostir.check.verify_communication import COMMUNICATION_RULES
    from hostir.check.verify_compute import COMPUTE_RULES
    from hostir.ir.catalog import Kind, by_keyword, declaration_of, instruction_classes
    from hostir.text.json_format import node_class
    from hostir.text.parser import _Builder

    statements = {"allocate": "allocate", "deallocate": "deallocate", "wait": "wait"}
    statements["for"] = "for_loop"
    assert set(INSTRUCTIONS) <= set(instruction_classes())
    for cls in INSTRUCTIONS:
        declaration = declaration_of(cls)
        declared = all(op_named(word) is not None for word in declaration.keywords())
        assert declared or cls in HANDLERS, cls
        if declared:
            assert all(op_named(word).name in IMPLEMENTATIONS for word in declaration.keywords())
        assert node_class(cls.__name__) is cls, cls
        for word in declaration.keywords():
            assert by_keyword(word)[0].cls is cls, word
            if word in statements:
                assert hasattr(_Builder, f"stmt_{statements[word]}"), cls
        if declaration.kind is Kind.COMPUTE:
            assert declared or cls in COMPUTE_RULES, cls
        if declaration.kind in (Kind.COLLECTIVE, Kind.POINT_TO_POINT, Kind.LOCAL_RESHARD):
            assert cls in COMMUNICATION_RULES, cls
    assert keyword(Unary(op=UnaryOpKind.NEG, out=tensor("a", 1), src=tensor("b", 1))) == "neg"


def test_chunked_loop_writes_into_preallocated_output():
    """A for-loop over chunks: ShardByStream aliases, compute writes with out=."""
    x, w = tensor("x", "n", 4), tensor("w", 3, 4)
    out = tensor("out", "n", 3)
    i = Symbol(name="i")
    x_chunk, out_chunk = tensor("x_i", "m", 4), tensor("out_i", "m", 3)
    body = (
        ShardByStream(out=x_chunk, src=x, axis=0, index=mod(add(i, 1), 3)),
        ShardByStream(out=out_chunk, src=out, axis=0, index=i),
        Linear(out=out_chunk, input=x_chunk, weight=w, preallocated=True),
        Deallocate(tensor=x_chunk),
        Deallocate(tensor=out_chunk),
    )
    program = HostIrContainer(
        inputs=(x, w, ScalarInput(name="m", dtype=DType.INT64)),
        outputs=(out,),
        body=(Allocate(out=out), ForLoop(index=i, start=c(0), stop=c(3), body=body)),
    )
    torch.manual_seed(0)
    xs, ws = torch.randn(6, 4), torch.randn(3, 4)
    (result,) = HostIrEvaluator(program).run([xs, ws, 2])
    # Iteration i reads x's chunk (i + 1) % 3 into out's chunk i: a chunk index that picked
    # the wrong chunk (reversed, say) would pass if both sides used the same index.
    rows = xs.chunk(3)
    torch.testing.assert_close(result, torch.cat([rows[1], rows[2], rows[0]]) @ ws.T)
    text = str(program)
    assert "for i in range(0, 3) {" in text
    assert "    linear(x_i, w, out=out_i)" in text


@pytest.mark.parametrize("preallocated", [False, True])
def test_each_compute_instruction(preallocated):
    """Every compute kind, defining its output or writing into a preallocated one."""
    torch.manual_seed(1)
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    m = torch.randn(3, 2)
    ta, tb, tm = tensor("a", 2, 3), tensor("b", 2, 3), tensor("m", 3, 2)
    cases = [
        (Set(out=tensor("o", 2, 3), src=ta), a.clone()),
        (Unary(op=UnaryOpKind.RELU, out=tensor("o", 2, 3), src=ta), torch.relu(a)),
        (Binary(op=BinaryOpKind.DIV, out=tensor("o", 2, 3), lhs=ta, rhs=tb), a / b),
        (Binary(op=BinaryOpKind.SUB, out=tensor("o", 2, 3), lhs=c(2), rhs=ta), 2 - a),
        (Cast(out=tensor("o", 2, 3, dtype=DType.FLOAT64), src=ta), a.double()),
        (
            Reduction(op=ReductionOpKind.SUM, out=tensor("o", 2), src=ta, dims=(1,)),
            a.sum(1),
        ),
        (
            Reduction(op=ReductionOpKind.MAX, out=tensor("o", 3), src=ta, dims=(0,)),
            a.amax(0),
        ),
        (Matmul(out=tensor("o", 2, 2), lhs=ta, rhs=tm), a @ m),
        (Permute(out=tensor("o", 3, 2), src=ta, dims=(1, 0)), a.T),
        (
            BroadcastInDim(out=tensor("o", 4, 2, 3), src=ta, broadcast_dims=(1, 2)),
            a.expand(4, 2, 3),
        ),
    ]
    for instruction, expected in cases:
        out = instruction.out
        body = (instruction,)
        if preallocated:
            import dataclasses

            body = (Allocate(out=out), dataclasses.replace(instruction, preallocated=True))
        program = HostIrContainer(inputs=(ta, tb, tm), outputs=(out,), body=body)
        (result,) = HostIrEvaluator(program).run([a, b, m])
        torch.testing.assert_close(result, expected, msg=str(program))


def test_scalar_expressions_in_loop_bounds_and_indices():
    """Loop bounds and chunk indices are scalar expressions over bound symbols: the loop
    runs n // 2 times, iteration i reads x's chunk (2 i + 1) % 3 and writes out's chunk
    (n // 2 - 1) - i. Read and write indices differ and neither permutation commutes with
    reversing the chunks, so a chunk index taken from the wrong end shows."""
    x = tensor("x", "n")
    out = tensor("out", "n")
    i, n = Symbol(name="i"), Symbol(name="n")
    chunk_in, chunk_out = tensor("xi", 2), tensor("oi", 2)
    stop = floordiv(n, 2)
    body = (
        ShardByStream(out=chunk_in, src=x, axis=0, index=mod(add(mul(i, 2), 1), 3)),
        ShardByStream(out=chunk_out, src=out, axis=0, index=sub(sub(stop, 1), i)),
        Unary(op=UnaryOpKind.NEG, out=chunk_out, src=chunk_in, preallocated=True),
        Deallocate(tensor=chunk_in),
        Deallocate(tensor=chunk_out),
    )
    program = HostIrContainer(
        inputs=(x,),
        outputs=(out,),
        body=(Allocate(out=out), ForLoop(index=i, start=c(0), stop=stop, body=body)),
    )
    xs = torch.randn(6, generator=torch.Generator().manual_seed(2))
    (result,) = HostIrEvaluator(program).run([xs])
    # i = 0, 1, 2 reads chunks 1, 0, 2 into chunks 2, 1, 0.
    rows = xs.chunk(3)
    torch.testing.assert_close(result, -torch.cat([rows[2], rows[0], rows[1]]))
    text = str(program)
    assert "for i in range(0, n // 2) {" in text, text
    assert "index=(i * 2 + 1) % 3" in text and "index=n // 2 - 1 - i" in text, text


def test_use_after_deallocate_is_an_error():
    """A tensor used after it was freed fails with a message naming it."""
    x = tensor("x", 2)
    y = tensor("y", 2)
    program = HostIrContainer(
        inputs=(x,),
        outputs=(y,),
        body=(
            Set(out=tensor("t", 2), src=x),
            Deallocate(tensor=tensor("t", 2)),
            Set(out=y, src=tensor("t", 2)),
        ),
    )
    with pytest.raises(VerifyError, match=r"body\[2\] \(set defining y\): set uses t after its"):
        HostIrEvaluator(program)  # refused before it runs


def test_input_errors_name_the_input():
    """Wrong count, dtype, rank and extent each raise InputError naming the input."""
    x = tensor("x", "n", 4)
    program = HostIrContainer(inputs=(x,), outputs=(x,), body=())
    run = HostIrEvaluator(program).run
    with pytest.raises(InputError, match=r"expected 1 inputs \(x\), got 2"):
        run([torch.randn(2, 4), torch.randn(2, 4)])
    with pytest.raises(InputError, match="input x must have dtype float32, got float64"):
        run([torch.randn(2, 4, dtype=torch.float64)])
    with pytest.raises(InputError, match="input x must have 2 dims"):
        run([torch.randn(2)])
    with pytest.raises(InputError, match="input x dim 1: expected a local extent of 4"):
        run([torch.randn(2, 5)])
    with pytest.raises(InputError, match="must be a torch.Tensor"):
        run([[1.0]])


def test_sharded_input_extent_binding_and_divisibility():
    """A sharded input's global extent is its local extent times the shard factor."""
    sharding = block_sharded([0], 1, 0, 6)
    x = tensor("x", 6, sharding=sharding)
    program = HostIrContainer(inputs=(x,), outputs=(x,), body=())
    (out,) = HostIrEvaluator(program).run([torch.arange(6.0)])
    torch.testing.assert_close(out, torch.arange(6.0))
    with pytest.raises(InputError, match="expected a local extent of 6"):
        HostIrEvaluator(program).run([torch.arange(4.0)])


def test_mesh_larger_than_world_is_refused():
    """A program on devices the world lacks fails before running, naming the mesh."""
    x = tensor("x", 12, sharding=block_sharded([0, 1, 2], 1, 0, 4))
    program = HostIrContainer(inputs=(x,), outputs=(x,), body=())
    with pytest.raises(MeshError, match=r"mesh \[3\] : \[1\] needs device 2, but the world has 1"):
        HostIrEvaluator(program).run([torch.randn(4)])


class StandIn(Communicator):
    """One rank of a world of two that agrees with itself and moves no data."""

    def _exchange_codes(self, codes):
        return [list(codes)] * self.world_size


def test_rank_outside_the_mesh_skips_compute():
    """Rank 0 is outside mesh [1]: its input is ignored and its output is None."""
    sharding = block_sharded([1], 1, 0, 3)
    x, y = tensor("x", 3, sharding=sharding), tensor("y", 3, sharding=sharding)
    program = HostIrContainer(
        inputs=(x,), outputs=(y,), body=(Unary(op=UnaryOpKind.NEG, out=y, src=x),)
    )
    rank0 = StandIn(rank=0, world_size=2)
    assert HostIrEvaluator(program, communicator=rank0).run(["ignored"]) == [None]
    rank1 = StandIn(rank=1, world_size=2)
    (out,) = HostIrEvaluator(program, communicator=rank1).run([torch.ones(3)])
    torch.testing.assert_close(out, -torch.ones(3))


ON_DEVICE_0 = """%HostIrContainer {
  mesh M0 = [1] : [1]
  input T0 : float32[4]
  T1 : float32[4], R0 = Allreduce(T0, team=M0(x), op=sum)
  wait R0
  output T1
}
"""


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "interpreted"])
def test_a_rank_outside_the_team_that_holds_its_output_raises(compiled):
    """T1 has no mesh (every rank holds it) but its Allreduce's team is device 0 alone:
    rank 1 of 2 skips the Allreduce and used to return None for T1. It now raises by name,
    in every run; rank 0 (a team of one) gets its input back."""
    program = hostir.parse(ON_DEVICE_0)
    rank1 = HostIrEvaluator(program, compiled=compiled, communicator=StandIn(rank=1, world_size=2))
    for _ in range(2):  # the second run of a signature replays
        with pytest.raises(EvaluationError) as info:
            rank1.run([torch.randn(4)])
        assert str(info.value) == (
            "Allreduce defining T1 runs on its team M0(x) (devices [0]), without rank 1, but T1"
            " is on every rank: rank 1 holds T1 and would have no value for it; expected every"
            " device that holds T1 among those that run it"
        )
    rank0 = StandIn(rank=0, world_size=2)
    x = torch.randn(4)
    (out,) = HostIrEvaluator(program, compiled=compiled, communicator=rank0).run([x])
    torch.testing.assert_close(out, x)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "interpreted"])
def test_an_output_left_none_on_a_rank_that_holds_it_raises(monkeypatch, compiled):
    """A handler (registered for an op, as extensions do) that gives no value for an
    output this rank holds used to make the run return None; the run now raises, naming
    the output. With the real handler the same program computes torch's result."""
    program = hostir.parse(
        "%HostIrContainer {\n  input T0 : float32[4]\n  T1 : float32[4] = neg(T0)\n  output T1\n}\n"
    )
    x = torch.randn(4)
    (out,) = HostIrEvaluator(program, compiled=compiled).run([x])
    torch.testing.assert_close(out, -x)
    # neg is a declared op: its handler is its implementation's (hostir.run.implementations)
    silent = Implementation(decl=op_named("neg"), handler=lambda context, i, operands: [None])
    monkeypatch.setitem(IMPLEMENTATIONS, "neg", silent)
    with pytest.raises(EvaluationError, match=r"^rank 0 holds output T1 \(it is on every rank\)"):
        HostIrEvaluator(program, compiled=compiled).run([x])


def test_a_root_expression_outside_the_team_is_refused_by_name():
    """``root=j`` reaches 1 in a team of one member: the handler indexed its group with it
    and raised IndexError; the run now names the root and the team. One iteration runs
    and copies the root's source."""
    text = """%HostIrContainer {
  mesh M0 = [1] : [1]
  input T0 : float32[4] @M0
  allocate T1 : float32[4] @M0
  for j in range(0, 2) {
    R0 = Broadcast(T0, team=M0(x), root=j, out=T1)
    wait R0
  }
  output T1
}
"""
    x = torch.randn(4)
    (out,) = HostIrEvaluator(hostir.parse(text.replace("range(0, 2)", "range(0, 1)"))).run([x])
    torch.testing.assert_close(out, x)
    with pytest.raises(EvaluationError, match=r"^Broadcast of T0: root 1 is not a member of"):
        HostIrEvaluator(hostir.parse(text)).run([x])


def test_torch_failures_become_evaluation_errors():
    """A torch error inside an instruction names the instruction and its output."""
    a, b = tensor("a", "n"), tensor("b", "m")
    out = tensor("o", "n")
    program = HostIrContainer(
        inputs=(a, b),
        outputs=(out,),
        body=(Binary(op=BinaryOpKind.ADD, out=out, lhs=a, rhs=b),),
    )
    with pytest.raises(EvaluationError, match="add defining o failed on rank 0"):
        HostIrEvaluator(program).run([torch.randn(3), torch.randn(4)])


def test_listeners_and_profiler_ranges_see_every_instruction():
    """Listeners observe each instruction; each runs in a hir::<keyword> profiler range."""
    x = tensor("x", 2)
    y, z = tensor("y", 2), tensor("z", 2)
    program = HostIrContainer(
        inputs=(x,),
        outputs=(z,),
        body=(Unary(op=UnaryOpKind.RELU, out=y, src=x), Set(out=z, src=y)),
    )
    seen = []

    class Recorder(Listener):
        def after(self, instruction, context, operands):
            seen.append(keyword(instruction))

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        HostIrEvaluator(program, listeners=[Recorder()]).run([torch.randn(2)])
    assert seen == ["relu", "set"]
    names = [event.name for event in prof.events()]
    assert names.count("hir::relu") == 1 and names.count("hir::set") == 1


def test_mesh_validation():
    """Mesh construction rejects duplicate and negative devices and bad shapes."""
    with pytest.raises(MeshError, match="distinct"):
        Mesh(devices=(0, 0), shape=(2,))
    with pytest.raises(MeshError, match="non-negative"):
        Mesh(devices=(-1,), shape=(1,))
    with pytest.raises(MeshError, match="needs 4 devices"):
        Mesh(devices=(0, 1), shape=(2, 2))


def test_a_product_with_a_1d_operand_lands_in_its_chunk_without_a_resize():
    """linear(x[16], W[16, 16]) stream-split on W's rows (fuzz seed 300090): torch's out=
    resized the [8] chunk to [1, 8], a deprecated resize that keeps the storage only while
    the sizes agree. The product is computed, then copied into the chunk."""
    import warnings

    from frontend import FusionDefinition, ParallelType

    with FusionDefinition() as fd:
        x, w = fd.define_tensor((16,)), fd.define_tensor((16, 16))
        y = fd.ops.linear(x, w)
        fd.add_output(y)
    y.outer_split(0, 2)
    y.axis(0).parallelize(ParallelType.stream)
    generator = torch.Generator().manual_seed(300090)
    a, b = torch.randn(16, generator=generator), torch.randn(16, 16, generator=generator)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (out,) = fd.execute([a, b])
    torch.testing.assert_close(out, torch.nn.functional.linear(a, b))
