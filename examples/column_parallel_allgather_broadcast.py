"""A column-parallel linear fed by a stream-parallel all-gather, as one Broadcast per chunk.

The same fusion as examples/column_parallel_allgather_permute.py without
``swizzle1d``: ``x`` is sharded over its tokens and ``w``, ``b`` over the output
features; the gathered tensor is split into one stream chunk per rank, and
iteration ``j`` of the stream loop broadcasts rank ``j``'s shard to its team
(root ``j``) and multiplies that chunk, so the matmul of one chunk overlaps the
broadcast of the next. Every rank computes the chunks in the same order; the
swizzled variant rotates the order per rank and sends ``d - 1`` point-to-point
messages instead. See docs/streams.md. Run on 4 local CPU ranks with::

    hostir run examples/column_parallel_allgather_broadcast.py --nproc 4

Rank 0 prints the host IR program; every rank checks its output shard against
the same slice of a single-device torch reference and the script exits
non-zero on a mismatch.
"""

from __future__ import annotations

import sys

# The script's own folder is on sys.path, however it is launched.
from column_parallel_allgather_permute import define, main

from frontend import FusionDefinition


def fusion(world_size: int = 4) -> FusionDefinition:
    """What ``hostir dump``, ``viz`` and ``traffic`` lower (docs/cli.md): the unswizzled
    fusion for ``world_size`` ranks, not run; 4 by default, as in the run above."""
    return define(world_size, swizzle=False)[0]


if __name__ == "__main__":
    sys.exit(main(swizzle=False))
