"""The runtime: the one run path (an executable prepared per program and input signature,
``hostir.run.executable``), the evaluator (interpreting a program, or running it compiled
to Python for its rank), its handlers for compute, communications and streams, pipelined
loops, the race checker and the self-checks.

Importing it registers every declared op's torch implementation
(``hostir.run.implementations``) and checks that none is missing.
"""

from hostir.run import (  # noqa: F401 - implementations
    attention_dropout,
    contraction,
    creation,
    indexing,
    layout_ops,
    pointwise,
    ragged_exchange,
    reductions,
    scatter_ops,
    shape_ops,
)
from hostir.run.implementations import check_complete

check_complete()
