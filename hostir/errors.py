"""The exception hierarchy shared by every layer of hostir.

Every error raised for bad user input derives from :class:`HostIrError`, so a
caller can catch one type. Messages name the offending object (tensor, axis,
mesh, instruction or ``line:col``) and say what was expected.
"""

from __future__ import annotations


class HostIrError(Exception):
    """Base class of every error hostir raises for bad input or a failed run."""


class VerifyError(HostIrError):
    """A host IR program is malformed (undefined value, wrong operand kind, ...).

    ``path`` (when the verifier knows it) is the offending instruction's index in the
    program's body, then in each enclosing loop's body; ``field`` names a declaration at
    fault that is no instruction, ``("inputs", 1)`` for the program's second input or
    ``("outputs", 0)`` for its first output; ``line`` and ``col`` are set when the program
    came from text, and then the message starts with ``line:col: ``.
    """

    def __init__(
        self,
        message: str,
        *,
        path: tuple[int, ...] | None = None,
        field: tuple[str, int] | None = None,
        line: int | None = None,
        col: int | None = None,
    ) -> None:
        super().__init__(f"{line}:{col}: {message}" if line is not None else message)
        self.message = message
        self.path = path
        self.field = field
        self.line = line
        self.col = col


class ParseError(HostIrError):
    """Host IR text does not parse; carries the 1-based ``line`` and ``col``."""

    def __init__(self, message: str, line: int, col: int) -> None:
        super().__init__(f"{line}:{col}: {message}")
        self.line = line
        self.col = col


class EvaluationError(HostIrError):
    """Running a program failed: a bad input, or an instruction that raised."""


class InputError(EvaluationError):
    """The inputs given to a program do not match its declared inputs."""


class ExtentError(InputError):
    """The extents the inputs bind do not fit the program: a division in an extent that
    does not divide exactly (a split over a mesh axis or into stream chunks), an extent
    that is negative, a loop shorter than the chunks it writes, a chunk index out of
    range. Raised on every rank when the symbols are bound, before anything runs; the
    message names the tensor, the dim, the split, the value bound and the divisor."""


class RunTimeExtentError(ExtentError):
    """Counts read to the host at run time (``to_host``) do not fit the exchange that uses
    them (``RaggedAllToAll``): a negative count, a row of counts that does not add up to
    the rows a member sends, or a column that does not add up to the rows a receiver's
    buffer holds. Every member of the exchange's team checks the whole counts matrix before
    anything is sent, so every member raises it, naming the member, the peer and the
    values; none waits for a peer that gave up."""


class RequirementError(HostIrError):
    """An op's rule on its values (``hostir.ir.requirements``: a slice's bounds, a pad's
    widths, topk's ``k``, a variance's correction) is broken. One class and one sentence
    whether constants break it when the op is defined (the frontend's
    ``OperandRequirementError``, also an ``OperandError``) or values the inputs bind break
    it when a signature is prepared (:class:`BoundRequirementError`)."""


class BoundRequirementError(ExtentError, RequirementError):
    """A requirement broken by the values the inputs bind: raised on every rank when the
    symbols are bound, before anything runs (``hostir.check.value_rules``)."""


class IndexDataError(EvaluationError):
    """Index data an op reads at run time is out of range: an index of ``index_select``,
    ``gather`` or ``take_along_axis``, an ``embedding_fwd`` input, or ``grouped_mm``'s
    offsets (negative, past the extent they index, or decreasing). torch would wrap some
    of them around or read past the data; the message names the op, the index tensor,
    the first bad position, its value and the range expected (hostir.run.index_checks)."""


class LoopBoundError(HostIrError):
    """A loop would run more iterations than a run or an analysis takes: one call runs at
    most ``hostir.check.loop_counts.MAX_LOOP_ITERATIONS`` loop iterations, all loops
    together, and the traffic count and picture evaluate at most
    ``hostir.analysis.traffic.MAX_COUNTED_ITERATIONS`` one by one (loops whose
    communications read their index). Raised before any of the work; the message names the
    loop, its range, its trip count and the limit."""


class MeshError(HostIrError):
    """A device mesh is malformed or does not fit the world it runs in."""


class CommunicationError(EvaluationError):
    """A collective failed or timed out: the message names the collective, its team, this
    rank and, where known, the rank that failed."""


class DisagreementError(CommunicationError):
    """The ranks disagree on what they are about to run: a different program, or a
    different extent or dtype bound from their inputs. Raised on every rank, before any
    collective of the program; the message names the ranks, the tensor, the dim and the
    values seen."""


class PeerFailureError(CommunicationError):
    """Another rank failed before it could communicate (a bad input, say); raised on the
    ranks that did not fail, naming the failed rank(s) and their error."""


class ConcurrentRunError(EvaluationError):
    """Two threads of one rank would communicate on the same world at once: torch.distributed
    pairs collectives across ranks by their order, not by thread, so their messages could
    mix. The message names both threads and their programs."""


class SettingError(HostIrError):
    """A setting (an environment variable or an option) has a value hostir cannot use."""


class RaceError(EvaluationError):
    """Two accesses to one buffer, at least one a write, on streams (or asynchronous
    communications) that no ``synchronize`` or ``wait`` orders: a race on a GPU."""


class JsonFormatError(VerifyError):
    """A host IR JSON document is malformed: not JSON, another format or version, or a
    node that does not fit the IR; the message names the JSON path (``program.body[3]``)."""


class CudaGraphError(HostIrError):
    """A run cannot be captured in a CUDA graph, or its capture or replay failed: the
    message names what stands in the way (no CUDA, an input not on CUDA, a backend other
    than NCCL, a listener, a handler hostir cannot vouch for) or what torch reported."""
