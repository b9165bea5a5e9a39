"""``collector_paused``: Python's cycle collector off while a large program is read or checked."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off inside the block (parsing, verifying and lowering
    run in one): parsing and verifying build many small objects and no cycles, and the
    collector's repeated scans of a growing program took about half the time of reading
    10^4 instructions (``benchmarks/parse_verify_scale.py``). Garbage in cycles, if any,
    is collected after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
