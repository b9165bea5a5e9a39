"""Every example's job (its ``main``: the run on every rank, each rank checked against a
single-device torch reference) on 4 ranks of the warm test pools, as ``hostir run
EXAMPLE --nproc 4`` would run it. The launcher itself runs the README's main job
(tests/test_docs.py's ``test_example_runs``, ``MAIN_JOB``); the other examples' launches
would only repeat it at the cost of four fresh interpreters each. Every example also runs
with plain ``python`` (one rank) there."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.test_docs import BLOCKS, EXAMPLES, MAIN_JOB, POOL_BLOCKS

OTHER_EXAMPLES = [path.stem for path in EXAMPLES if path != MAIN_JOB]


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("name", OTHER_EXAMPLES)
def test_the_example_s_job_passes_on_four_ranks(name: str, multidevice_test) -> None:
    """``main()`` returns 0 on every rank: its shard equals the reference's slice."""
    path = MAIN_JOB.parent / f"{name}.py"
    sys.path.insert(0, str(path.parent))  # the examples import each other
    try:
        spec = importlib.util.spec_from_file_location(f"example_ranks_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.main() == 0
    finally:
        sys.path.remove(str(path.parent))


def test_the_main_job_is_an_example() -> None:
    """The README's quick start names an example that exists, and the other examples are
    the ones run here."""
    assert MAIN_JOB in EXAMPLES
    assert len(OTHER_EXAMPLES) == len(EXAMPLES) - 1


def _run_block(block_id: str) -> None:
    """Runs a docs block as its script would run under ``hostir run``: as ``__main__``,
    joining the world (here the pool's); a ``sys.exit`` other than 0 fails."""
    (block,) = [b for b in BLOCKS if b.id == block_id]
    code = compile(block.source(), str(block.path), "exec")
    try:
        exec(code, {"__name__": "__main__"})
    except SystemExit as done:
        assert done.code in (0, None), f"{block_id} exited with {done.code}"


def _pool_blocks(world_size: int) -> list[str]:
    return [b.id for b in BLOCKS if b.id in POOL_BLOCKS and world_size in b.nprocs]


@pytest.mark.world_sizes(2)
@pytest.mark.parametrize("block_id", _pool_blocks(2))
def test_a_docs_block_runs_on_two_ranks(block_id: str, multidevice_test) -> None:
    """The docs block (tests/test_docs.py's POOL_BLOCKS, nproc=2) runs on 2 pool ranks:
    each checks its own result (its asserts, or its exit status)."""
    _run_block(block_id)


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("block_id", _pool_blocks(4))
def test_a_docs_block_runs_on_four_ranks(block_id: str, multidevice_test) -> None:
    """The docs block (POOL_BLOCKS, nproc=4) runs on 4 pool ranks."""
    _run_block(block_id)


def test_the_pool_blocks_are_docs_blocks_with_ranks() -> None:
    """Every POOL_BLOCKS entry is a docs block that runs on ranks, so none is dropped."""
    for block_id in POOL_BLOCKS:
        assert [b.nprocs for b in BLOCKS if b.id == block_id][0], block_id
