"""How parsing and verifying scale with a program's size.

Builds programs of about 10^3, 10^4 and 10^5 instructions by repeating the body of
``tests/data/every_instruction.hir`` (allocations, computes, every collective with
its ``wait``, stream loops with bodies, deallocations) with its values renamed per
copy, and prints, as a Markdown table, the median time of ``--repeat`` runs to parse
the text (``hostir.parse(text, verify_program=False)``), to verify the program
(``hostir.check.verify.verify``) and to do both (``hostir.parse(text)``), and the first two
per instruction (flat per-instruction times mean linear scaling). The load average is
printed before and after: on a shared machine, other work inflates the times.

Run it with::

    python benchmarks/parse_verify_scale.py
    python benchmarks/parse_verify_scale.py --sizes 1000,10000 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import time

import hostir
from hostir.check.verify import verify

SOURCE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "every_instruction.hir"
SHARED = {"T0", "T1", "s0"}  # the inputs every copy reads
_RENAMED = re.compile(r"\b(T\d+(?:_c)?|R\d+|j1?|main)\b")


def build_text(instructions: int) -> str:
    """A program of about ``instructions`` instructions: copies of the source's body."""
    lines = SOURCE.read_text().splitlines()
    header = [line for line in lines if line.startswith(("  mesh ", "  input "))]
    body = [
        line for line in lines[1:-1] if not line.startswith(("  mesh ", "  input ", "  output "))
    ]
    per_copy = sum(1 for line in body if line.strip() != "}")
    outputs = [line for line in lines if line.startswith("  output ")]
    copies = max(1, round(instructions / per_copy))
    out = [lines[0], *header]
    for copy in range(copies):
        out.extend(_RENAMED.sub(lambda m, c=copy: _rename(m.group(1), c), line) for line in body)
    out.extend(_RENAMED.sub(lambda m: _rename(m.group(1), 0), line) for line in outputs)
    return "\n".join([*out, "}"]) + "\n"


def _rename(name: str, copy: int) -> str:
    return name if name in SHARED else f"{name}_{copy}"


def count_instructions(body) -> int:
    """Instructions in ``body``, loop bodies included."""
    return sum(1 + count_instructions(getattr(i, "body", ())) for i in body)


def _median_time(function, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)\n")
    print("| instructions | lines | parse | verify | `hostir.parse` (both) | per instruction |")
    print("|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        text = build_text(size)
        program = hostir.parse(text)  # also checks the generated program is well formed
        count = count_instructions(program.body)
        parse = _median_time(lambda t=text: hostir.parse(t, verify_program=False), args.repeat)
        check = _median_time(lambda p=program: verify(p), args.repeat)
        both = _median_time(lambda t=text: hostir.parse(t), args.repeat)
        print(
            f"| {count:,} | {text.count(chr(10)):,} | {parse:.2f} s | {check:.2f} s"
            f" | {both:.2f} s | {parse / count * 1e6:.1f} + {check / count * 1e6:.1f} µs |"
        )
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
