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

from tests.test_docs import EXAMPLES, MAIN_JOB

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
