"""What writing stream chunks in place saves: each program's chunks written through torch's
``out=`` forms (``in place``, the runtime's default) against the same program with every
op's result computed and then copied into its chunk (``copied``, what hostir did before
issue 33's item 5: each implementation's ``into`` taken away while the program is
prepared).

Programs (world size 1, no mesh), each one op whose output is a fusion output split in
``--streams`` stream chunks, so each chunk is written into the output:

- ``matmul``: ``[m, k] @ [k, n]`` split on the output's columns (nvFuser's stream-parallel
  matmul test: a strided chunk, one ``aten::mm`` each);
- ``linear``: ``linear(x, w, bias)`` split on the output's features;
- ``relu``: ``relu`` of ``[m, n]`` split on the columns;
- ``sum``: ``sum`` over dim 1 of ``[m, n, 16]`` split on the rows.

``copied MB`` is what one call copies (``aten.copy_`` as the runtime calls it, counted with
a ``TorchDispatchMode``); the times are medians over ``--runs`` runs of ``--batch`` calls
each, the versions interleaved; ``A/A`` times ``in place`` against a second copy of
itself: how far from 1.00 a ratio strays by noise alone. Results are checked against
torch before anything is timed::

    python benchmarks/chunk_writes.py
    python benchmarks/chunk_writes.py --size 512 --runs 15 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frontend import FusionDefinition, ParallelType  # noqa: E402
from hostir.run import implementations  # noqa: E402


def _fusion(program: str, size: int, streams: int) -> tuple[FusionDefinition, list, object]:
    """(fusion, inputs, torch's result) of ``program`` at ``size``."""
    m = k = n = size
    generator = torch.Generator().manual_seed(0)
    shapes = {
        "matmul": [(m, k), (k, n)],
        "linear": [(m, k), (n, k), (n,)],
        "relu": [(m, n)],
        "sum": [(m, n, 16)],
    }[program]
    inputs = [torch.randn(s, generator=generator) for s in shapes]
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(s) for s in shapes]
        if program == "matmul":
            out, expected = fd.ops.matmul(*tvs), inputs[0] @ inputs[1]
        elif program == "linear":
            out, expected = fd.ops.linear(*tvs), torch.nn.functional.linear(*inputs)
        elif program == "relu":
            out, expected = fd.ops.relu(tvs[0]), inputs[0].relu()
        else:
            out, expected = fd.ops.sum(tvs[0], [1]), inputs[0].sum(1)
        fd.add_output(out)
    dim = 0 if program == "sum" else 1
    out.outer_split(dim, streams)
    out.axis(dim).parallelize(ParallelType.stream)
    return fd, inputs, expected


@contextlib.contextmanager
def _copying() -> Iterator[None]:
    """Every implementation without its in-place write while a program is prepared."""
    kept = dict(implementations.IMPLEMENTATIONS)
    for name, implementation in kept.items():
        implementations.IMPLEMENTATIONS[name] = dataclasses.replace(implementation, into=None)
    try:
        yield
    finally:
        implementations.IMPLEMENTATIONS.update(kept)


class _CopiedBytes(TorchDispatchMode):
    """Counts the bytes ``aten.copy_`` writes, as the runtime calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.copy_.default:
            self.bytes += args[0].numel() * args[0].element_size()
        return func(*args, **(kwargs or {}))


def _version(program: str, args: argparse.Namespace, copied: bool) -> tuple[Callable, float]:
    """A call running ``program`` prepared (its executable made, compiled, replayed once)
    in place or copied, and the MB one call copies."""
    fd, inputs, expected = _fusion(program, args.size, args.streams)
    with _copying() if copied else contextlib.nullcontext():
        for _ in range(3):  # lowers and runs; compiles; replays
            (result,) = fd.execute(inputs)
    torch.testing.assert_close(result, expected, rtol=1e-4, atol=1e-4)
    with _CopiedBytes() as counted:
        fd.execute(inputs)
    return (lambda: fd.execute(inputs)), counted.bytes / 1e6


def _timed(call: Callable, batch: int) -> float:
    start = time.perf_counter()
    for _ in range(batch):
        call()
    return (time.perf_counter() - start) / batch * 1e3


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", default="matmul,linear,relu,sum")
    parser.add_argument("--size", type=int, default=1024, help="m = k = n (default 1024)")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"size {args.size}, {args.streams} chunks, {args.runs} runs x {args.batch} calls,"
        f" {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    print("| program | MB copied: in place | copied | ms: in place | copied | ratio | A/A |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for program in args.programs.split(","):
        place, place_mb = _version(program, args, copied=False)
        copy, copy_mb = _version(program, args, copied=True)
        again, _ = _version(program, args, copied=False)
        versions = [place, copy, again]
        times: list[list[float]] = [[], [], []]
        for run in range(args.runs):
            for i in range(len(versions)):
                k = (run + i) % len(versions)
                times[k].append(_timed(versions[k], args.batch))
        ms = [statistics.median(t) for t in times]
        print(
            f"| {program} | {place_mb:.1f} | {copy_mb:.1f} | {ms[0]:.2f} | {ms[1]:.2f}"
            f" | {ms[1] / ms[0]:.2f} | {ms[2] / ms[0]:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
