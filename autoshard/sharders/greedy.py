"""The greedy family of DreamShard's baselines: sort by a cost key, place on the least loaded."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from autoshard.cost import CostModel
from autoshard.placement import PlacementState
from autoshard.plan import Plan
from autoshard.task import ShardingTask


class GreedySharder:
    """Sorts tables by :meth:`keys` (descending) and puts each on the device with the lowest
    accumulated key among those where it fits whole in HBM; a table that fits in no device's
    free HBM is split (hottest rows that fit in HBM, the rest in host memory)."""

    name: ClassVar[str] = "greedy"
    summary: ClassVar[str] = ""

    def keys(self, task: ShardingTask) -> np.ndarray:
        raise NotImplementedError

    def shard(self, task: ShardingTask, cost_model: CostModel) -> Plan:
        keys = self.keys(task)
        state = PlacementState(task, cost_model)
        accumulated = np.zeros(task.num_devices)
        for t in np.argsort(-keys, kind="stable"):
            t = int(t)
            fits = np.flatnonzero(state.full_fit(t))
            if fits.size:
                device, rows = int(fits[np.argmin(accumulated[fits])]), int(task.tables[t].rows)
            else:
                device, rows = state.best_split(t)
            state.place(t, device, rows)
            accumulated[device] += keys[t]
        return state.to_plan(self.name)


class SizeGreedy(GreedySharder):
    name: ClassVar[str] = "size_greedy"
    summary: ClassVar[str] = "greedy by table size (rows x dim x bytes)"

    def keys(self, task: ShardingTask) -> np.ndarray:
        a = task.table_arrays
        return a.rows * a.row_bytes


class DimGreedy(GreedySharder):
    name: ClassVar[str] = "dim_greedy"
    summary: ClassVar[str] = "greedy by embedding dimension"

    def keys(self, task: ShardingTask) -> np.ndarray:
        return task.table_arrays.dim.astype(np.float64)


class LookupGreedy(GreedySharder):
    name: ClassVar[str] = "lookup_greedy"
    summary: ClassVar[str] = "greedy by dim x pooling factor"

    def keys(self, task: ShardingTask) -> np.ndarray:
        a = task.table_arrays
        return a.dim * a.pooling_factor * a.coverage


class SizeLookupGreedy(GreedySharder):
    name: ClassVar[str] = "size_lookup_greedy"
    summary: ClassVar[str] = "greedy by dim x pooling factor x log10(rows)"

    def keys(self, task: ShardingTask) -> np.ndarray:
        a = task.table_arrays
        return a.dim * a.pooling_factor * a.coverage * np.log10(np.maximum(a.rows, 2))
