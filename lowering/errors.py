"""Errors raised while lowering a fusion to host IR."""

from __future__ import annotations

from hostir.errors import HostIrError


class LoweringError(HostIrError):
    """A fusion cannot be lowered as scheduled."""


class ReshardingError(LoweringError):
    """A producer and consumer are sharded in a way the lowering cannot connect."""
