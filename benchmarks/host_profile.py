"""Where a repeated ``fd.execute`` spends its host time: cProfile over many calls of the
README's MLP (benchmarks/host_overhead.py's ``mlp``) at one size, eager and, on CUDA, as a
CUDA graph; the functions with the most own time, and the same for the hand-written
version (what torch itself costs per call).

    python benchmarks/host_profile.py                       # CPU, small
    python benchmarks/host_profile.py --device cuda --size medium
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

import host_overhead
import torch


def profile(label: str, call, calls: int, top: int) -> None:
    """Prints the ``top`` functions by own time over ``calls`` calls of ``call``."""
    for _ in range(20):
        call()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    if host_overhead.DEVICE.startswith("cuda"):
        torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    per_call = stats.total_tt / calls * 1e6
    print(f"== {label}: {per_call:.1f} µs per call under cProfile ({calls} calls)")
    print("\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default="small", choices=sorted(host_overhead.SIZES))
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--top", type=int, default=18)
    args = parser.parse_args(argv)
    host_overhead.DEVICE = args.device
    fd, inputs, hand = host_overhead.mlp(args.size, 1, 0)
    fd.execute(inputs)
    profile("ours", lambda: fd.execute(inputs), args.calls, args.top)
    if args.device.startswith("cuda"):
        fd.execute(inputs, cuda_graph=True)
        profile("graph", lambda: fd.execute(inputs, cuda_graph=True), args.calls, args.top)
    profile("hand", hand, args.calls, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
