"""frontend: the nvFuser-style fusion definition DSL with multi-device scheduling.

from frontend import FusionDefinition, DataType, ParallelType, DeviceMesh, shard_tensor
from frontend import execute_with_dtensors  # DTensors in and out (docs/dtensor.md)
"""

from frontend.dtensors import execute_with_dtensors, schedule_from_dtensors
from frontend.errors import (
    DefinitionError,
    FrontendError,
    HostIrError,
    InputError,
    MeshError,
    OperandError,
    OperandRequirementError,
    RequirementError,
    ScheduleError,
)
from frontend.exprs import Expr, ScalarVal
from frontend.fusion import Fusion
from frontend.fusion_definition import FusionDefinition
from frontend.iter_domain import IterDomain, IterType, Split, Swizzle1D
from frontend.mesh import DeviceMesh
from frontend.sharding import shard_tensor, tensor_sharding
from frontend.tensor_view import TensorView
from frontend.types import DataType, ParallelType

__all__ = [
    "DataType",
    "DefinitionError",
    "DeviceMesh",
    "Expr",
    "FrontendError",
    "Fusion",
    "FusionDefinition",
    "HostIrError",
    "InputError",
    "IterDomain",
    "IterType",
    "MeshError",
    "OperandError",
    "OperandRequirementError",
    "ParallelType",
    "ScalarVal",
    "RequirementError",
    "ScheduleError",
    "Split",
    "Swizzle1D",
    "TensorView",
    "execute_with_dtensors",
    "schedule_from_dtensors",
    "shard_tensor",
    "tensor_sharding",
]
