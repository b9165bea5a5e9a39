"""lowering: passes from a scheduled fusion to a host IR program."""

from lowering.errors import LoweringError, ReshardingError
from lowering.pipeline import lower_fusion

__all__ = ["LoweringError", "ReshardingError", "lower_fusion"]
