"""What checking index data costs (hostir.run.index_checks): a call of the
``take_along_axis``, ``index_select`` and ``grouped_mm`` handlers with the check and with
it taken out, at a small and a medium size, on the CPU, and the check alone.

Each time is the median of ``--repeat`` timeit runs of about 10 ms each, per call; the
variants alternate (ABBA) so that drift hits both, and ``A/A`` times the checked call
against itself: the noise of the machine (on a loaded machine the difference of two calls
is noisier than the check alone). On CUDA the check is ``torch._assert_async`` (no host
sync; not measured here).

Run it with::

    python3 benchmarks/index_checks.py
    python3 benchmarks/index_checks.py --repeat 21 --threads 1
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import timeit
from collections.abc import Callable
from unittest import mock

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # this checkout's hostir

import hostir  # noqa: E402
from hostir.run import attention, index_checks, indexing  # noqa: E402


def _instruction(line: str, inputs: str) -> object:
    """The one instruction of a program with ``inputs`` and ``line``."""
    text = f"%HostIrContainer {{\n{inputs}\n  {line}\n  output T9\n}}\n"
    return hostir.parse(text).body[0]


Case = tuple[str, Callable[[], object], Callable[[], object], str]


def cases(generator: torch.Generator) -> list[Case]:
    """(name, the handler's call, the check's call, the handler module whose check is taken
    out) per op and size."""
    made = []
    for size, (rows, columns, picks) in (("small", (8, 64, 4)), ("medium", (1024, 1024, 64))):
        x = torch.randn(rows, columns, generator=generator)
        index = torch.randint(0, columns, (rows, picks), generator=generator)
        gather = _instruction(
            f"T9 : float32[{rows}, {picks}] = take_along_axis(T0, T1, dim=1)",
            f"  input T0 : float32[{rows}, {columns}]\n  input T1 : int64[{rows}, {picks}]",
        )
        operands = {"src": x, "index": index}
        made.append(
            (f"take_along_axis {size} {list(x.shape)}, index {list(index.shape)}",
             lambda i=gather, o=operands: indexing.run_gather(i, o, []),
             lambda i=gather, t=index, n=columns: index_checks.check_indices(
                 i, "index", t, "T0", 1, n), "indexing")
        )  # fmt: skip
    for size, (rows, columns, picks) in (("small", (64, 32, 16)), ("medium", (4096, 1024, 1024))):
        x = torch.randn(rows, columns, generator=generator)
        index = torch.randint(0, rows, (picks,), generator=generator)
        select = _instruction(
            f"T9 : float32[{picks}, {columns}] = index_select(T0, T1, dim=0)",
            f"  input T0 : float32[{rows}, {columns}]\n  input T1 : int64[{picks}]",
        )
        operands = {"src": x, "index": index}
        made.append(
            (f"index_select {size} {list(x.shape)}, index [{picks}]",
             lambda i=select, o=operands: indexing.run_index_select(i, o, []),
             lambda i=select, t=index, n=rows: index_checks.check_indices(
                 i, "index", t, "T0", 0, n), "indexing")
        )  # fmt: skip
    for size, (m, k, n, groups) in (("small", (64, 16, 16, 4)), ("medium", (4096, 256, 256, 8))):
        a = torch.randn(m, k, generator=generator)
        b = torch.randn(groups, k, n, generator=generator)
        ends = torch.linspace(0, m, groups + 1)[1:].round().to(torch.int32)
        grouped = _instruction(
            f"T9 : float32[{m}, {n}] = grouped_mm(T0, T1, T2)",
            f"  input T0 : float32[{m}, {k}]\n  input T1 : float32[{groups}, {k}, {n}]\n"
            f"  input T2 : int32[{groups}]",
        )
        operands = {"mat1": a, "mat2": b, "offsets": ends}
        made.append(
            (f"grouped_mm {size} [{m}, {k}] x [{groups}, {k}, {n}]",
             lambda i=grouped, o=operands: attention.run_grouped_mm(i, o, []),
             lambda i=grouped, t=ends, n=m: index_checks.check_offsets(
                 i, "offsets", t, "T0", 0, n), "attention")
        )  # fmt: skip
    return made


def per_call(call: Callable[[], object], number: int) -> float:
    """Seconds per call over ``number`` calls."""
    return timeit.timeit(call, number=number) / number


def measure(call: Callable[[], object], check: Callable[[], object], module: str) -> tuple:
    """Medians (µs per call) of the checked call, the unchecked one, the checked one again
    (A/A) and the check alone, alternating ABBA."""
    target = {"indexing": indexing, "attention": attention}[module]
    names = [n for n in ("check_indices", "check_offsets") if hasattr(target, n)]
    numbers = {c: max(1, int(SAMPLE_S / per_call(c, 3))) for c in (call, check)}

    def unchecked() -> float:
        with mock.patch.multiple(target, **{n: lambda *a: None for n in names}):
            return per_call(call, numbers[call])

    samples: dict[str, list[float]] = {"checked": [], "bare": [], "again": [], "check": []}
    runs = {
        "checked": lambda: per_call(call, numbers[call]),
        "bare": unchecked,
        "again": lambda: per_call(call, numbers[call]),
        "check": lambda: per_call(check, numbers[check]),
    }
    for turn in range(REPEAT):
        for name in runs if turn % 2 == 0 else reversed(runs):
            samples[name].append(runs[name]())
    return tuple(statistics.median(samples[n]) * 1e6 for n in runs)


REPEAT = 41
SAMPLE_S = 0.01
"""Seconds of calls per sample: short, so that the variants alternate often."""


def main() -> None:
    global REPEAT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=REPEAT)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    REPEAT = args.repeat
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), medians of {REPEAT}")
    print("| call | with the check (µs) | without (µs) | difference | the check alone | A/A |")
    print("|---|---|---|---|---|---|")
    for name, call, check, module in cases(torch.Generator().manual_seed(0)):
        call()  # warm up
        checked, bare, again, alone = measure(call, check, module)
        difference = f"{checked - bare:+.1f} µs ({checked / bare - 1:+.0%})"
        row = f"| {name} | {checked:.1f} | {bare:.1f} | {difference} | {alone:.1f} µs"
        print(f"{row} ({alone / bare:.0%}) | {again / checked:.3f} |")


if __name__ == "__main__":
    main()
