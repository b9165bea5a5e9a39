"""The agreement before a signature's first run, as the runtime takes part in it.

In a world of more than one rank, the first run of each kind of inputs
(``hostir.run.signature.agreement_kinds``: the coarse signature, and the value of each
scalar input an extent reads) of a program starts with the agreement
(``hostir.comm.agreement``): the ranks compare the program, the extents their inputs bound
(a tensor's, and a scalar input's that an extent reads: ``full([s0, 4])``) and their
dtypes, and whether one failed before communicating; all raise the same named error if
they differ. :func:`agree_on_run` is that step of a run; :func:`refuse_before_run`
is the same step for a rank that fails before it has a program to run (a bad argument, a
lowering error: the frontend's ``execute``). An :class:`AgreementLog` says whether the
ranks agreed on anything on a communicator, which decides how a failing rank tells its
peers: before any agreement they are entering one too, so it waits for them; after one,
they may be running an agreed signature, so it announces its failure and raises at once.
"""

from __future__ import annotations

from typing import Any

from hostir.comm.agreement import BoundExtent, RankFacts, agree, restate
from hostir.comm.communicator import Communicator
from hostir.comm.timeouts import collective_timeout
from hostir.errors import HostIrError
from hostir.ir.container import HostIrContainer, ScalarInput
from hostir.ir.instructions import ForLoop, defined_values
from hostir.ir.program_info import walk_instructions
from hostir.ir.scalars import Symbol, symbols_of
from hostir.ir.values import TensorValue, value_symbols
from hostir.run.context import RunContext


class AgreementLog:
    """The communicators on which the ranks agreed on a run of a program sharing this log:
    one per ``HostIrEvaluator`` by default, one per ``FusionDefinition`` for all its
    programs (the peers of a rank failing on one may be running another)."""

    def __init__(self) -> None:
        # by identity (a communicator may define __eq__); held so that ids stay theirs
        self._worlds: dict[int, Communicator] = {}

    def agreed_on(self, communicator: Communicator) -> bool:
        """Whether the ranks of ``communicator`` agreed on a run logged here."""
        return self._worlds.get(id(communicator)) is communicator

    def record(self, communicator: Communicator) -> None:
        """Logs that the ranks of ``communicator`` agreed on a run."""
        self._worlds[id(communicator)] = communicator


def agree_on_run(
    communicator: Communicator,
    agreed: set[tuple],
    log: AgreementLog,
    kinds: tuple,
    facts: RankFacts,
    failure: HostIrError | None,
) -> None:
    """The agreement of a run whose inputs are of ``kinds`` (none where ``agreed``, the
    kinds the program's ranks agreed on, holds them), given this rank's ``facts`` and the
    ``failure`` it stops with, if any. Raises the ranks' common error where they differ;
    restates ``failure`` with the ranks' one account where several failed. Records what
    was agreed in ``agreed`` and ``log``. For a world of more than one rank."""
    if kinds in agreed:
        if failure is not None:  # no agreement this time: the peers learn it so
            communicator.post_failure(f"{type(failure).__name__}: {failure}")
        return
    # A rank refusing a new signature after the ranks agreed on others does not wait: its
    # peers may be running one of those (hostir.comm.agreement).
    message = agree(communicator, facts, wait=not log.agreed_on(communicator))
    if failure is None:
        agreed.add(kinds)
        log.record(communicator)
    else:  # the ranks' one account where they failed for different reasons
        restate(failure, message)


def extent_scalars(program: HostIrContainer) -> tuple[tuple[int, str], ...]:
    """(position, name) of each scalar input of ``program`` that an extent reads (a tensor's
    shape or sharding, a loop's bounds: ``full([s0, 4])``): the ranks must pass it the same
    value, as they pass shards of the same global tensors. A scalar no extent reads (a
    pointwise operand) is not compared: its agreement costs nothing."""
    read: set[str] = set()
    for value in program.inputs:
        if isinstance(value, TensorValue):
            read |= value_symbols(value)
    for instruction in walk_instructions(program.body):
        if isinstance(instruction, ForLoop):
            read |= symbols_of(instruction.start) | symbols_of(instruction.stop)
        for value in defined_values(instruction):
            if isinstance(value, TensorValue):
                read |= value_symbols(value)
    return tuple(
        (position, value.name)
        for position, value in enumerate(program.inputs)
        if isinstance(value, ScalarInput) and value.name in read
    )


def run_facts(
    program: HostIrContainer,
    context: RunContext,
    digest: str,
    failure: HostIrError | None,
    scalars: tuple[tuple[int, str], ...] = (),
) -> RankFacts:
    """What this rank is about to run (``program``, digest ``digest``, its inputs bound in
    ``context``, and the values of ``scalars``, the scalar inputs extents read:
    :func:`extent_scalars`), for the agreement; a failed rank's facts where ``failure`` is
    given."""
    if failure is not None:
        return RankFacts.failed(failure, digest)
    extents: dict[str, BoundExtent] = {}
    for _, name in scalars:
        extents[name] = BoundExtent(name, name, None, int(context.scalars[name]))
    dtypes = []
    for value in program.inputs:
        tensor = context.tensors.get(value.name) if isinstance(value, TensorValue) else None
        if tensor is None:
            continue
        dtypes.append((value.name, value.dtype.value))
        for dim, extent in enumerate(value.shape):
            if isinstance(extent, Symbol) and extent.name not in extents:
                bound = int(context.scalars[extent.name])
                extents[extent.name] = BoundExtent(extent.name, value.name, dim, bound)
    return RankFacts(digest=digest, extents=tuple(extents.values()), dtypes=tuple(dtypes))


def refuse_before_run(error: Exception, communicator: Any, *, first: bool, wait: bool) -> None:
    """Lets the other ranks know this rank stops with ``error`` before it runs: through the
    agreement they are entering (``first``: a signature the ranks have not agreed on yet),
    else through a failure notice that names this rank in their communication errors.
    ``wait``: wait for the agreement (nothing agreed on ``communicator`` yet: the peers
    are entering it too, and the ranks that failed agree on one message, given to
    ``error``); else announce the failure and return at once (the peers may be running a
    signature agreed on before: hostir.comm.agreement)."""
    if communicator.world_size == 1:
        return
    if not first:
        communicator.post_failure(f"{type(error).__name__}: {error}")
        return
    try:
        communicator.set_timeout(collective_timeout())
    except HostIrError:
        pass  # a bad HOSTIR_TIMEOUT: the communicator keeps the timeout it has
    restate(error, agree(communicator, RankFacts.failed(error), wait=wait))
