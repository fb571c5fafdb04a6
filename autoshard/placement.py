"""Incremental placement: the free memory and load of each device while a plan is being built.

Used by the greedy family, the random and round-robin sharders and the Gymnasium environment,
so that all of them share one notion of what fits.
"""

from __future__ import annotations

import numpy as np

from autoshard.cost import CostModel
from autoshard.errors import PlannerError, gib
from autoshard.plan import Plan
from autoshard.task import ShardingTask


class PlacementState:
    """Devices' free HBM and host bytes and accumulated cost while tables are placed one by one.

    Args:
        task: The task being planned.
        cost_model: Prices each placement (its total goes into :attr:`load_ms`).
    """

    def __init__(self, task: ShardingTask, cost_model: CostModel) -> None:
        self.task = task
        self.cost_model = cost_model
        dev = task.device_arrays
        self.free_hbm = dev.hbm_capacity.copy()
        self.free_host = dev.host_capacity.copy()
        self.load_ms = np.zeros(task.num_devices)
        self.device = np.full(task.num_tables, -1, dtype=np.int64)
        self.hbm_rows = np.zeros(task.num_tables, dtype=np.int64)

    def max_hbm_rows(self, table: int) -> np.ndarray:
        """Per device, the most rows of ``table`` its free HBM can hold (capped at the table)."""
        a = self.task.table_arrays
        fit = np.floor(np.maximum(self.free_hbm, 0.0) / a.memory_bytes_per_row[table])
        return np.minimum(fit, a.rows[table]).astype(np.int64)

    def fits(self, table: int, hbm_rows: np.ndarray) -> np.ndarray:
        """Per device, whether ``hbm_rows[d]`` hot rows in HBM and the rest in host memory fit."""
        a = self.task.table_arrays
        per_row = a.memory_bytes_per_row[table]
        hbm_rows = np.asarray(hbm_rows)
        return ((hbm_rows * per_row <= self.free_hbm + 1e-6)
                & ((a.rows[table] - hbm_rows) * per_row <= self.free_host + 1e-6))

    def full_fit(self, table: int) -> np.ndarray:
        """Per device, whether the whole table fits in its free HBM."""
        return self.max_hbm_rows(table) >= self.task.table_arrays.rows[table]

    def best_split(self, table: int) -> tuple[int, int]:
        """The tier-split fallback: the device with the most free HBM rows whose host memory
        holds the rest; returns (device, hbm_rows).

        Raises:
            PlannerError: No device can hold the table in HBM and host memory together.
        """
        k = self.max_hbm_rows(table)
        ok = self.fits(table, k)
        if not ok.any():
            t = self.task.tables[table]
            per_row = self.task.table_arrays.memory_bytes_per_row[table]
            raise PlannerError(
                "capacity",
                f"table '{t.name}' needs {gib(t.rows * per_row)}; the largest free HBM is "
                f"{gib(self.free_hbm.max())} and the largest free host memory "
                f"{gib(self.free_host.max())}, and no device has room for both parts")
        candidates = np.flatnonzero(ok)
        best = candidates[np.lexsort((self.load_ms[candidates], -k[candidates]))[0]]
        return int(best), int(k[best])

    def place(self, table: int, device: int, hbm_rows: int, price: float | None = None) -> float:
        """Puts ``table`` on ``device`` with ``hbm_rows`` in HBM; returns its price (ms).

        ``price`` is this placement's total from the same cost model, when the caller already
        priced it (e.g. in one vectorised call for many candidates); otherwise it is priced here.
        """
        assert self.device[table] < 0, "table placed twice"
        a = self.task.table_arrays
        per_row = a.memory_bytes_per_row[table]
        self.free_hbm[device] -= hbm_rows * per_row
        self.free_host[device] -= (a.rows[table] - hbm_rows) * per_row
        if price is None:
            price = float(self.cost_model.price(self.task, np.array([table]), np.array([device]),
                                                np.array([hbm_rows])).total_ms[0])
        self.load_ms[device] += price
        self.device[table] = device
        self.hbm_rows[table] = hbm_rows
        return price

    def to_plan(self, sharder: str) -> Plan:
        assert (self.device >= 0).all(), "unplaced tables"
        return Plan.from_arrays(self.task, self.device, self.hbm_rows, sharder)
