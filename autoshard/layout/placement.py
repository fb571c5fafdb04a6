"""Incremental placement: the free memory and load of each device while a plan is being built.

Used by the greedy family, the random and round-robin sharders, the PPO policy's episodes and
the Gymnasium environment, so that all of them share one notion of what fits: a table's HBM rows
and its reservation (:meth:`autoshard.task.TableArrays.hbm_bytes`) within the device's HBM.
"""

from __future__ import annotations

import numpy as np

from autoshard.errors import PlannerError, gib
from autoshard.layout.plan import Plan
from autoshard.pricing.cost import CostModel
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
        self.price_ms = np.zeros(task.num_tables)
        # Items still to be placed (a planner that offers alternatives, e.g. a table whole or
        # as shards, clears the ones it did not choose; see ppo_choice).
        self.active = np.ones(task.num_tables, dtype=bool)
        # HBM the tables not yet placed reserve, kept back from HBM rows on every device in
        # proportion to its capacity, so that rows placed early leave room for them.
        self._pending = float(task.table_arrays.hbm_reserved_bytes.sum())
        self._share = dev.hbm_capacity / max(float(dev.hbm_capacity.sum()), 1.0)

    def kept_back(self, table: int | None = None) -> np.ndarray:
        """Per device, HBM that ``table``'s rows (None: rows already placed) leave free for the
        reservations of the other tables not yet placed: their sum shared in proportion to
        capacity, and at least the largest of them (so that every device can still take
        one)."""
        reserved = self.task.table_arrays.hbm_reserved_bytes
        own = reserved[table] if table is not None and self.device[table] < 0 else 0.0
        if self._pending - own <= 0:
            return np.zeros(self.task.num_devices)
        others = (self.device < 0) & self.active
        if table is not None:
            others[table] = False
        largest = float(reserved[others].max()) if others.any() else 0.0
        return np.maximum(max(self._pending - own, 0.0) * self._share, largest)

    def max_hbm_rows(self, table: int) -> np.ndarray:
        """Per device, the most rows of ``table`` its free HBM can hold beside the table's
        reservation and :meth:`kept_back` (capped at the table; 0 where they do not fit)."""
        return self.task.table_arrays.hbm_rows_within(table, self.free_hbm - self.kept_back(table))

    def fits(self, table: int, hbm_rows: np.ndarray) -> np.ndarray:
        """Per device, whether ``hbm_rows[d]`` hot rows in HBM (with the table's reservation,
        and, when any, beside :meth:`kept_back`; at least the rows it must keep there,
        :attr:`autoshard.task.TableArrays.hbm_least`) and the rest in host memory fit."""
        a = self.task.table_arrays
        hbm_rows = np.asarray(hbm_rows)
        keep = np.where(hbm_rows > 0, self.kept_back(table), 0.0)
        return ((a.hbm_bytes(table, hbm_rows) + keep <= self.free_hbm + 1e-6)
                & (hbm_rows >= a.hbm_least[table])
                & ((a.rows[table] - hbm_rows) * a.memory_bytes_per_row[table]
                   <= self.free_host + 1e-6))

    def full_fit(self, table: int) -> np.ndarray:
        """Per device, whether the whole table fits in its free HBM."""
        return self.max_hbm_rows(table) >= self.task.table_arrays.rows[table]

    def best_split(self, table: int) -> tuple[int, int]:
        """The tier-split fallback: the device with the most free HBM rows whose host memory
        holds the rest; returns (device, hbm_rows). Where no device's free HBM holds even the
        table's reservation, room is made for it (:meth:`make_room`).

        Raises:
            PlannerError: No device can hold the table in HBM and host memory together.
        """
        k = self.max_hbm_rows(table)
        ok = self.fits(table, k)
        if not ok.any():
            device = self.make_room(table)
            return device, int(self.max_hbm_rows(table)[device])
        candidates = np.flatnonzero(ok)
        best = candidates[np.lexsort((self.load_ms[candidates], -k[candidates]))[0]]
        return int(best), int(k[best])

    def make_room(self, table: int) -> int:
        """Frees HBM for ``table``'s reservation on the device that needs the fewest bytes
        freed, by moving HBM rows of the tables already there to host memory (each time the
        cut that loses the fewest looked-up bytes per byte freed, coldest rows first; they are
        re-priced); returns the device.

        Raises:
            PlannerError: No device's HBM rows and free HBM together hold the reservation with
                the table's rows in its host memory.
        """
        a = self.task.table_arrays
        need = float(a.hbm_reserved_bytes[table])
        placed = self.device >= 0
        held = np.bincount(self.device[placed], minlength=self.task.num_devices,
                           weights=(self.hbm_rows * a.hbm_bytes_per_row)[placed])
        # Rows moved out of HBM take at most the HBM bytes they free in host memory.
        host = a.rows[table] * a.memory_bytes_per_row[table] + np.maximum(need - self.free_hbm, 0)
        ok = np.flatnonzero((self.free_hbm + held >= need) & (self.free_host >= host))
        if not ok.size:
            t = self.task.tables[table]
            raise PlannerError(
                "capacity",
                f"table '{t.name}' needs {gib(t.rows * a.memory_bytes_per_row[table])} and "
                f"{gib(need)} of HBM reserved for it (TorchRec's buffers and cache state); the "
                f"largest free HBM is {gib(self.free_hbm.max())} (with HBM rows to move: "
                f"{gib((self.free_hbm + held).max())}) and the largest free host memory "
                f"{gib(self.free_host.max())}, and no device has room for both parts")
        d = int(ok[np.lexsort((self.load_ms[ok], -self.free_hbm[ok]))[0]])
        while self.free_hbm[d] < need - 1e-6:
            on = np.flatnonzero((self.device == d) & (self.hbm_rows > 0))
            per_row = a.hbm_bytes_per_row[on]
            cut = np.minimum(self.hbm_rows[on], np.ceil((need - self.free_hbm[d]) / per_row))
            keep = self.hbm_rows[on] - cut
            loss = a.lookups[on] * a.row_bytes[on] * (
                self.task.hbm_share(on, self.hbm_rows[on]) - self.task.hbm_share(on, keep))
            i = int(np.argmin(loss / (cut * per_row)))
            self._set_rows(int(on[i]), int(keep[i]))
        return d

    def _set_rows(self, table: int, hbm_rows: int) -> None:
        """Changes a placed table's HBM rows, its devices' free memory and its price."""
        a = self.task.table_arrays
        d = int(self.device[table])
        moved = self.hbm_rows[table] - hbm_rows
        self.free_hbm[d] += moved * a.hbm_bytes_per_row[table]
        self.free_host[d] -= moved * a.memory_bytes_per_row[table]
        price = float(self.cost_model.price(self.task, np.array([table]), np.array([d]),
                                            np.array([hbm_rows])).total_ms[0])
        self.load_ms[d] += price - self.price_ms[table]
        self.price_ms[table] = price
        self.hbm_rows[table] = hbm_rows

    def place(self, table: int, device: int, hbm_rows: int, price: float | None = None) -> float:
        """Puts ``table`` on ``device`` with ``hbm_rows`` in HBM; returns its price (ms).

        ``price`` is this placement's total from the same cost model, when the caller already
        priced it (e.g. in one vectorised call for many candidates); otherwise it is priced here.
        """
        assert self.device[table] < 0, "table placed twice"
        a = self.task.table_arrays
        self.free_hbm[device] -= a.hbm_bytes(table, hbm_rows)
        self.free_host[device] -= (a.rows[table] - hbm_rows) * a.memory_bytes_per_row[table]
        if price is None:
            price = float(self.cost_model.price(self.task, np.array([table]), np.array([device]),
                                                np.array([hbm_rows])).total_ms[0])
        self.load_ms[device] += price
        self.price_ms[table] = price
        self._pending -= float(a.hbm_reserved_bytes[table])
        self.device[table] = device
        self.hbm_rows[table] = hbm_rows
        return price

    def to_plan(self, sharder: str) -> Plan:
        assert (self.device >= 0).all(), "unplaced tables"
        return Plan.from_arrays(self.task, self.device, self.hbm_rows, sharder)
