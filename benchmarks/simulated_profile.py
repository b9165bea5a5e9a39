"""Where a simulated world's time goes: the README's MLP at N ranks under cProfile.

cProfile sees one thread; a simulated world runs one thread per rank. So each rank's
thread runs ``fd.execute`` under a profiler of its own (as ``fd.execute_simulated`` runs
it: hostir.comm.simulate, each rank its shard of the same full inputs), and the N
profiles are merged with ``pstats.Stats.add``. The main thread's profile (definition,
thread start and join) is reported apart. Only one rank runs at a time between waits, so
the merged cumulative times add up to about the run's wall time (profiling overhead
included: the absolute numbers are larger than an unprofiled run's, the split is what
counts). Used by ``benchmarks/simulated_world.py --profile N``.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import os
import pstats
import sys
import time

import torch

from frontend.sharding import shard_tensor
from hostir.comm.simulate import simulate

_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def profile(n: int, top: int = 30, script: bool = False, dump: str | None = None) -> str:
    """Runs the MLP at ``n`` simulated ranks, every rank profiled; the merged report (the
    ``top`` functions by cumulative and by own time) as text. ``script``: each rank runs
    the example's ``main`` (its own definition, lowering and check, as ``hostir run
    --simulate`` runs the script; its printing silenced) instead of ``fd.execute``.
    ``dump``: a file the merged ranks' stats are also written to (``pstats`` reads it)."""
    if _EXAMPLES not in sys.path:
        sys.path.insert(0, _EXAMPLES)
    import tensor_parallel_mlp

    main = cProfile.Profile()
    main.enable()
    start = time.perf_counter()
    fd, tvs = tensor_parallel_mlp.define(n)
    features = tensor_parallel_mlp.ffn(n)
    generator = torch.Generator().manual_seed(0)
    shapes = [(8, 16), (features, 16), (features,), (16, features), (16,)]
    full = [torch.randn(s, generator=generator) for s in shapes]
    profiles: list[cProfile.Profile | None] = [None] * n

    def rank_run(rank: int) -> list:
        mine = cProfile.Profile()
        profiles[rank] = mine
        mine.enable()
        try:
            if script:
                return [tensor_parallel_mlp.main()]
            return fd.execute([shard_tensor(t, tv, rank) for t, tv in zip(full, tvs, strict=True)])
        finally:
            mine.disable()

    with contextlib.redirect_stdout(io.StringIO()) if script else contextlib.nullcontext():
        run = simulate(rank_run, n)
    main.disable()
    wall = time.perf_counter() - start
    run.raise_first()
    expected = torch.relu(full[0] @ full[1].T + full[2]) @ full[3].T + full[4]
    if script:  # main() checked its rank's output: 0 when equal
        wrong = [r for r in range(n) if run.results[r] != [0]]
    else:
        wrong = [r for r in range(n) if not torch.allclose(run.results[r][0], expected, atol=1e-4)]
    ranks = pstats.Stats(profiles[0])
    for one in profiles[1:]:
        ranks.add(one)
    if dump:
        ranks.dump_stats(dump)
    text = io.StringIO()
    text.write(f"{n} ranks, profiled: {wall:.2f} s wall, {len(wrong)} ranks wrong\n")
    text.write(by_file(ranks, top))
    for title, stats, key in (
        ("every rank's thread, merged: by cumulative time (waits included)", ranks, "cumulative"),
        ("every rank's thread, merged: by own time", ranks, "tottime"),
        ("the main thread (definition, threads started and joined)", main, "cumulative"),
    ):
        text.write(f"\n=== {title} ===\n")
        stats = pstats.Stats(stats, stream=text) if isinstance(stats, cProfile.Profile) else stats
        stats.stream = text
        stats.strip_dirs().sort_stats(key).print_stats(top)
    return text.getvalue()


WAITS = ("acquire", "wait")
"""Built-ins a blocked rank's thread sits in (``lock.acquire``): time waiting for other
ranks' turns, not work."""


def by_file(stats: pstats.Stats, top: int) -> str:
    """The merged own time (``tottime``) per source file, waits left out: which modules
    the ranks' work is spent in, with the total work and the total waiting."""
    files: dict[str, float] = {}
    waiting = 0.0
    for (filename, _, name), (_, _, own, _, _) in stats.stats.items():
        if filename == "~" and any(w in name for w in WAITS):
            waiting += own
            continue
        key = os.path.join(*filename.split(os.sep)[-2:]) if filename != "~" else name
        files[key] = files.get(key, 0.0) + own
    work = sum(files.values())
    lines = [f"ranks' work {work:.2f} s (profiled), waiting {waiting:.2f} s; own time by file:"]
    for key, own in sorted(files.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"  {own:8.3f} s {own / work:6.1%}  {key}")
    return "\n".join(lines) + "\n"
