"""The program recorder (tests/program_recorder.py) and its comparison
(scripts/record_programs.py): a lowering recorded into a folder, and the comparison
finding what changed in a copy."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

import lowering
from frontend import DeviceMesh, FusionDefinition, ParallelType
from hostir import to_dot
from lowering import pipeline
from tests import program_recorder
from tests.program_recorder import RECORD_VARIABLE

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location(
        "record_programs", ROOT / "scripts" / "record_programs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fusion(op: str) -> FusionDefinition:
    """A column-parallel linear on two devices, then ``op``: an Allgather to count."""
    with FusionDefinition() as fd:
        x, w = fd.define_tensor((4, 8)), fd.define_tensor((6, 8))
        y = getattr(fd.ops, op)(fd.ops.linear(x, w))
        z = fd.ops.set(y)
        fd.add_output(z)
    mesh = DeviceMesh([0, 1])
    for tv in (x, w, y, z):
        tv.set_device_mesh(mesh)
    w.outer_split(0, 2)
    w.axis(0).parallelize(ParallelType.mesh_x)
    y.outer_split(1, 2)
    y.axis(1).parallelize(ParallelType.mesh_x)
    return fd


@pytest.fixture
def recording(monkeypatch, request):
    """Installs the recorder for this test only; returns a function that records the
    fusions it is given into a folder (each folder counts its lowerings from 0)."""
    monkeypatch.setattr(pipeline, "lower_fusion", pipeline.lower_fusion)  # undone after
    monkeypatch.setattr(lowering, "lower_fusion", lowering.lower_fusion)
    monkeypatch.delenv("HOSTIR_RECORD_RUN", raising=False)
    program_recorder.install()

    def record(folder: pathlib.Path, *fusions: FusionDefinition) -> list:
        monkeypatch.setenv(RECORD_VARIABLE, str(folder))
        monkeypatch.setattr(program_recorder, "_ordinals", {})
        return [fd.host_ir() for fd in fusions]

    return record


def test_a_lowering_is_recorded_and_a_changed_copy_compared(tmp_path, recording, request, capsys):
    before, after = tmp_path / "before", tmp_path / "after"
    relu, gelu = _fusion("relu"), _fusion("gelu")
    program, again = recording(before, relu, _fusion("relu"))  # kept once
    assert str(again) == str(program)

    (folder,) = (before / "programs").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == sorted(program_recorder.ARTIFACTS)
    assert (folder / "program.hir").read_text() == str(program)
    assert (folder / "program.json").read_text() == program.to_json()
    assert (folder / "program.dot").read_text() == to_dot(program).source
    traffic = (folder / "traffic.txt").read_text()
    assert traffic.startswith("at 2 ranks\n") and "Allgather" in traffic, traffic
    entries = [json.loads(p.read_text()) for p in (before / "manifest").iterdir()]
    assert sorted(entries, key=lambda e: e["ordinal"]) == [
        {
            "test": request.node.nodeid,
            "process": program_recorder._process,
            "rank": 0,
            "ordinal": ordinal,
            "program": folder.name,
        }
        for ordinal in (0, 1)
    ]

    script = _script()
    assert script.main(["compare", str(before), str(before)]) == 0
    assert capsys.readouterr().out.endswith("no differences\n")

    # The first lowering now gives another program; the second's traffic changed.
    recording(after, gelu, _fusion("relu"))
    (after / "programs" / folder.name / "traffic.txt").write_text("at 2 ranks\nother\n")
    assert script.main(["compare", str(before), str(after)]) == 1
    out = capsys.readouterr().out
    assert "programs by text: 1 in both, 0 only before, 1 only after" in out
    assert "whose JSON, DOT or traffic differ: 1\n  traffic: 1" in out
    assert "2 in both (1 with another program), 0 only before, 0 only after" in out
    assert "text, JSON, DOT differ: 1 lowerings" in out
    assert "-  T3 : float32[4, 6] @M0 {1: [x, 3]} = relu(T2)\n+  T3" in out  # the text diff
    assert '-     "value": "relu"\n+     "value": "gelu"' in out  # the JSON diff
    assert "-busiest link: rank 0 -> rank 1, 48 B" in out and "+other" in out
    assert out.endswith("3 differences\n")
