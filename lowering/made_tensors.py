"""Messages that name a tensor the lowering made say what it is for.

``decompose_resharding`` makes tensors the user never wrote (an input laid out for an
op, partial results before their reduction, a sum before its bias) and records on each
(``LoweringTensor.made_for``) which user's tensor it was made for and why. A refusal
raised by a later pass may name one of them, ``T73``, which the user cannot find in
their fusion: :func:`made_tensors_explained` adds to the message, for each such name
it mentions (chunks ``T73_c`` included), what it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from lowering.errors import LoweringError
from lowering.snapshot import LoweringFusion

_NAME = re.compile(r"\bT\d+(?=\b|_)")


def explain(message: str, fusion: LoweringFusion) -> str:
    """``message`` followed by what each tensor the lowering made that it names is for,
    in order of first mention; unchanged when it names none."""
    made = {t.name: t.made_for for t in fusion.tensors if t.made_for}
    named = dict.fromkeys(name for name in _NAME.findall(message) if name in made)
    if not named:
        return message
    notes = "; ".join(f"{name} is made by the lowering: {made[name]}" for name in named)
    return f"{message} ({notes})"


@contextmanager
def made_tensors_explained(fusion: LoweringFusion) -> Iterator[None]:
    """Re-raises a LoweringError raised inside with :func:`explain`'s message (the same
    error class, the same traceback)."""
    try:
        yield
    except LoweringError as error:
        if error.args and isinstance(error.args[0], str):
            error.args = (explain(error.args[0], fusion), *error.args[1:])
        raise
