"""Lowering pauses Python's cycle collector while it runs and leaves it as it found it."""

from __future__ import annotations

import gc

import pytest
import torch

from frontend import FusionDefinition
from lowering import pipeline


@pytest.mark.parametrize("enabled", [True, False])
def test_lowering_leaves_the_collector_as_it_found_it(enabled, monkeypatch):
    """``host_ir`` and ``execute`` (which lowers) run the passes with the collector paused,
    restore its state, and compute what torch does."""
    seen = []
    real_lower = pipeline._lower

    def spying_lower(fusion):
        seen.append(gc.isenabled())
        return real_lower(fusion)

    monkeypatch.setattr(pipeline, "_lower", spying_lower)
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    with FusionDefinition() as fd:
        tx, tw = fd.define_tensor((4, 8)), fd.define_tensor((6, 8))
        fd.add_output(fd.ops.relu(fd.ops.linear(tx, tw)))
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        fd.host_ir()
        after_host_ir = gc.isenabled()
        (out,) = fd.execute([x, w])
        after_execute = gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()
    assert after_host_ir is enabled and after_execute is enabled
    assert seen and not any(seen), f"collector enabled during lowering: {seen}"
    torch.testing.assert_close(out, torch.relu(x @ w.T))
