"""``ScheduleClock``: the count of schedule changes of a fusion's tensors."""

from __future__ import annotations


class ScheduleClock:
    """Counts schedule changes of a fusion's tensors (meshes, splits, swizzles, reorders,
    parallelization, allocation domains), so that a program lowered from an earlier
    schedule is never run for a later one. Each tensor holds its fusion's clock."""

    __slots__ = ("version",)

    def __init__(self) -> None:
        self.version = 0

    def tick(self) -> None:
        """Records one schedule change."""
        self.version += 1
