"""The sharder interface."""

from __future__ import annotations

from typing import ClassVar, Protocol

from autoshard.layout.plan import Plan
from autoshard.pricing.cost import CostModel
from autoshard.task import ShardingTask


class Sharder(Protocol):
    """Turns a task into a plan, pricing through the given cost model.

    Implementations also define ``summary`` (one line for listings) and a classmethod
    ``unavailable() -> str | None`` returning why the sharder cannot run here (None if it can).
    """

    name: ClassVar[str]
    summary: ClassVar[str]

    def shard(self, task: ShardingTask, cost_model: CostModel) -> Plan:
        ...
