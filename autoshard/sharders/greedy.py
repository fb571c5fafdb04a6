"""The greedy family of DreamShard's baselines: sort by a cost key, place on the least loaded."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from autoshard.errors import PlannerError
from autoshard.layout.placement import PlacementState
from autoshard.layout.shards import ShardLayout, pricing_task, split_pins
from autoshard.layout.splitting import split_heavy_tables
from autoshard.pricing.cost import CostModel
from autoshard.sharders.base import Sharded, Sharder
from autoshard.task import ShardingTask


class GreedySharder(Sharder):
    """Sorts tables by :meth:`keys` (descending) and puts each on the device with the lowest
    accumulated key among those where it fits whole in HBM; a table that fits in no device's
    free HBM is split (hottest rows that fit in HBM, the rest in host memory).

    Args:
        split: First split every table whose cost exceeds the per-device mean of the least work
            (:func:`autoshard.layout.splitting.split_heavy_tables`), then place the shards as
            tables. Off by default: the greedy family is the table-wise baseline.
    """

    name: ClassVar[str] = "greedy"
    summary: ClassVar[str] = ""

    def __init__(self, split: bool = False) -> None:
        self.split = split

    def keys(self, task: ShardingTask) -> np.ndarray:
        raise NotImplementedError

    def solve(self, task: ShardingTask, cost_model: CostModel) -> Sharded[None]:
        if not self.split:
            return Sharded(self._place(task, cost_model).to_plan(self.name), None)
        choice = split_heavy_tables(task, cost_model)
        g = choice.geometry
        # A shard keeps at most its table's share of HBM rows in the bound's relaxation, so
        # that the first-placed shards do not take every device's HBM.
        cap = np.where(g.parts > 1, np.floor(choice.hbm_share[g.table] * g.rows), -1)
        state = self._place(pricing_task(task, g), cost_model, cap.astype(np.int64),
                            split_pins(task, g))
        layout = ShardLayout(g, state.device, state.hbm_rows).even_shares(task)
        return Sharded(layout.to_plan(task, self.name), None)

    def _place(self, task: ShardingTask, cost_model: CostModel,
               hbm_cap: np.ndarray | None = None, pins: np.ndarray | None = None
               ) -> PlacementState:
        """Places every table; a table with ``hbm_cap[t] >= 0`` keeps at most that many rows
        in HBM, on the least loaded device where they fit; one with ``pins[t] >= 0`` goes to
        that device (:func:`autoshard.layout.shards.split_pins`) with the most HBM rows that fit."""
        keys = self.keys(task)
        state = PlacementState(task, cost_model)
        accumulated = np.zeros(task.num_devices)
        for t in np.argsort(-keys, kind="stable"):
            t = int(t)
            fits = np.flatnonzero(state.full_fit(t))
            capped = hbm_cap is not None and hbm_cap[t] >= 0
            if pins is not None and pins[t] >= 0:
                device = int(pins[t])
                limit = int(hbm_cap[t]) if hbm_cap is not None else -1
                rows = _pinned_rows(state, t, device, limit)
            elif capped:
                assert hbm_cap is not None
                want = np.minimum(state.max_hbm_rows(t), hbm_cap[t])
                ok = np.flatnonzero(state.fits(t, want))
                if ok.size:
                    device = int(ok[np.argmin(accumulated[ok])])
                    rows = int(want[device])
                else:
                    device, rows = state.best_split(t)
            elif fits.size:
                device, rows = int(fits[np.argmin(accumulated[fits])]), int(task.tables[t].rows)
            else:
                device, rows = state.best_split(t)
            state.place(t, device, rows)
            accumulated[device] += keys[t]
        return state


def _pinned_rows(state: PlacementState, table: int, device: int, cap: int) -> int:
    """The most HBM rows of ``table`` (at most ``cap`` when >= 0) that fit on ``device``.

    Raises:
        PlannerError: The table fits there in neither tier.
    """
    want = int(state.max_hbm_rows(table)[device])
    want = min(want, cap) if cap >= 0 else want
    for rows in (want, 0):
        if state.fits(table, np.full(state.task.num_devices, rows))[device]:
            return rows
    name = state.task.tables[table].name
    raise PlannerError("capacity", f"shard '{name}' must go to device {device} (one row shard "
                       f"per device) and fits there in neither HBM nor host memory")


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


class SplitLookupGreedy(LookupGreedy):
    """``lookup_greedy`` after splitting the tables dearer than the per-device mean."""

    name: ClassVar[str] = "split_lookup_greedy"
    summary: ClassVar[str] = "lookup_greedy after splitting tables dearer than the device mean"

    def __init__(self, split: bool = True) -> None:
        super().__init__(split)
