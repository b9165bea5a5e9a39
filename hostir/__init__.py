"""hostir: the host IR, its evaluator, printer and tools.

This package stands alone: it imports neither ``frontend`` nor ``lowering``.
A program (:class:`HostIrContainer`) can be printed, run and inspected
without the fusion it came from.
"""

from hostir.comm.communicator import Communicator, LocalCommunicator
from hostir.comm.torch_communicator import TorchCommunicator
from hostir.comm.world import default_communicator
from hostir.errors import (
    BoundRequirementError,
    CommunicationError,
    ConcurrentRunError,
    CudaGraphError,
    EvaluationError,
    ExtentError,
    HostIrError,
    IndexDataError,
    InputError,
    LoopBoundError,
    MeshError,
    ParseError,
    RaceError,
    RequirementError,
    RunTimeExtentError,
    VerifyError,
)
from hostir.ir.communications import (
    COLLECTIVES,
    ROOTED,
    Allgather,
    Allreduce,
    AllToAll,
    AllToAllV,
    Broadcast,
    CollectivePermute,
    Gather,
    LocalShard,
    RaggedAllToAll,
    Reduce,
    ReduceScatter,
    Scatter,
    SendRecv,
    Wait,
)
from hostir.ir.container import HostIrContainer, ScalarInput
from hostir.ir.creation import Distribution, Full, Iota, Random
from hostir.ir.dtypes import DType
from hostir.ir.host_reads import ToHost
from hostir.ir.indexing import Cumsum, GatherAlong, GatherKind, IndexSelect, TopK
from hostir.ir.instructions import (
    COMPUTE,
    INSTRUCTIONS,
    Allocate,
    Binary,
    BinaryOpKind,
    BroadcastInDim,
    Cast,
    Deallocate,
    ForLoop,
    Linear,
    Matmul,
    Permute,
    PipelineStage,
    Reduction,
    ReductionOpKind,
    Set,
    ShardByStream,
    Ternary,
    TernaryOpKind,
    Unary,
    UnaryOpKind,
)
from hostir.ir.scalars import BinaryExpr, Const, MeshCoordinate, Scalar, ScalarOp, Symbol
from hostir.ir.sharding import (
    Mesh,
    MeshAxis,
    PartialAxis,
    ReduceOp,
    Sharding,
    ShardPart,
    slice_global_tensor,
)
from hostir.ir.streams import GetCurrentStream, SetCurrentStream, Synchronize
from hostir.ir.team import Team
from hostir.ir.values import HostValue, RequestValue, StreamValue, TensorValue
from hostir.run.context import Listener, RunContext
from hostir.run.evaluator import HostIrEvaluator
from hostir.run.race_checker import RaceChecker
from hostir.run.self_checks import SelfChecks
from hostir.text.parser import parse
from hostir.text.printer import print_program
from hostir.viz.dot import to_dot
from hostir.viz.traffic_dot import to_traffic_dot

__all__ = [
    # the creation and indexing instructions (hostir.ir.creation, hostir.ir.indexing)
    "Cumsum",
    "Distribution",
    "Full",
    "GatherAlong",
    "GatherKind",
    "IndexSelect",
    "Iota",
    "Random",
    "TopK",
    "COLLECTIVES",
    "ROOTED",
    "AllToAll",
    "AllToAllV",
    "HostValue",
    "RaggedAllToAll",
    "RunTimeExtentError",
    "ToHost",
    "Allgather",
    "Allreduce",
    "Broadcast",
    "CollectivePermute",
    "Gather",
    "GetCurrentStream",
    "MeshCoordinate",
    "SetCurrentStream",
    "Synchronize",
    "LocalShard",
    "Reduce",
    "ReduceScatter",
    "RequestValue",
    "Scatter",
    "SendRecv",
    "Team",
    "Wait",
    "COMPUTE",
    "INSTRUCTIONS",
    "Allocate",
    "Binary",
    "BinaryExpr",
    "BinaryOpKind",
    "BroadcastInDim",
    "Cast",
    "CommunicationError",
    "ConcurrentRunError",
    "BoundRequirementError",
    "CudaGraphError",
    "Communicator",
    "Const",
    "DType",
    "Deallocate",
    "EvaluationError",
    "ForLoop",
    "PipelineStage",
    "HostIrContainer",
    "HostIrError",
    "HostIrEvaluator",
    "ExtentError",
    "IndexDataError",
    "InputError",
    "LoopBoundError",
    "Linear",
    "Listener",
    "LocalCommunicator",
    "Matmul",
    "Mesh",
    "MeshAxis",
    "MeshError",
    "ParseError",
    "PartialAxis",
    "RaceChecker",
    "SelfChecks",
    "RaceError",
    "RequirementError",
    "Permute",
    "ReduceOp",
    "Reduction",
    "ReductionOpKind",
    "RunContext",
    "Scalar",
    "ScalarInput",
    "ScalarOp",
    "Set",
    "ShardByStream",
    "ShardPart",
    "Sharding",
    "StreamValue",
    "Symbol",
    "TensorValue",
    "TorchCommunicator",
    "Ternary",
    "TernaryOpKind",
    "Unary",
    "UnaryOpKind",
    "VerifyError",
    "default_communicator",
    "parse",
    "print_program",
    "slice_global_tensor",
    "to_dot",
    "to_traffic_dot",
]
