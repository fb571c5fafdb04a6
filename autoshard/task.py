"""A sharding task: tables, hardware and workload, with vectorised views for pricing."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property

import numpy as np

from autoshard.access import GRID
from autoshard.errors import InputError
from autoshard.hardware import HardwareProfile
from autoshard.layout.constraints import NO_CONSTRAINTS, Constraints
from autoshard.limits import MAX_BATCH_SIZE, MAX_TABLES, int_in
from autoshard.reservation import NO_RESERVATION, Reservation
from autoshard.tables import Table, check_unique_names

MODES = ("train", "infer")


@dataclass(frozen=True)
class Workload:
    """What one step does.

    Args:
        batch_size: Global batch size (samples per step, all devices together).
        mode: ``train`` (forward, backward, optimizer) or ``infer`` (forward only).
    """

    batch_size: int = 65536
    mode: str = "train"

    def __post_init__(self) -> None:
        if not int_in(self.batch_size, 1, MAX_BATCH_SIZE):
            raise InputError(f"must be an integer in [1, {MAX_BATCH_SIZE:,}]",
                             field="batch_size", value=self.batch_size)
        if self.mode not in MODES:
            raise InputError(f"must be one of {', '.join(MODES)}", field="mode", value=self.mode)

    @property
    def train(self) -> bool:
        return self.mode == "train"

    @classmethod
    def from_dict(cls, doc: object, source: str, field: str = "workload") -> Workload:
        """A workload from a file's mapping of ``batch_size`` and ``mode``.

        Raises:
            InputError: Not a mapping, another key, or a bad value, named under ``field``.
        """
        if not isinstance(doc, dict):
            raise InputError("expected a mapping", source=source, field=field, value=doc)
        try:
            return cls(**doc)
        except InputError as exc:
            raise exc.located(source, field) from exc
        except TypeError as exc:
            raise InputError("expected only batch_size and mode", source=source, field=field,
                             value=doc) from exc


@dataclass(frozen=True)
class TableArrays:
    """Per-table columns, in task order (all shaped [T])."""

    rows: np.ndarray
    dim: np.ndarray
    row_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    memory_bytes_per_row: np.ndarray  # weights (+ optimizer state in train mode)
    hbm_bytes_per_row: np.ndarray  # a row kept in HBM, as the runtime counts it (reservation)
    hbm_reserved_bytes: np.ndarray  # HBM the table takes wherever it lives (reservation)
    lookups: np.ndarray  # lookups per step: batch * pooling factor * coverage
    pooling_factor: np.ndarray
    coverage: np.ndarray
    rows_used: np.ndarray
    curves: np.ndarray  # [T, len(GRID)] lookup share of the hottest GRID fraction of rows
    hbm_least: np.ndarray  # rows that must stay in HBM (constraints; every row of a replica)
    hbm_most: np.ndarray  # rows that may be in HBM (constraints)

    def hbm_bytes(self, idx: np.ndarray | slice | int, hbm_rows: np.ndarray | int
                  ) -> np.ndarray:
        """HBM bytes of the tables at ``idx`` with ``hbm_rows`` of their rows in HBM: the rows
        and the table's reservation, as the runtime counts them (:mod:`autoshard.reservation`);
        every
        capacity check of a placement goes through it."""
        return (self.hbm_reserved_bytes[idx]
                + np.asarray(hbm_rows) * self.hbm_bytes_per_row[idx])

    def hbm_rows_within(self, idx: np.ndarray | slice | int, free_bytes: np.ndarray
                        ) -> np.ndarray:
        """The most rows of each table at ``idx`` that ``free_bytes`` of HBM hold beside its
        reservation (0 when not even that fits; at most its rows, and at most
        :attr:`hbm_most`)."""
        room = np.maximum(np.asarray(free_bytes) - self.hbm_reserved_bytes[idx], 0.0)
        fit = np.floor(room / self.hbm_bytes_per_row[idx] + 1e-9)
        return np.minimum(fit, self.hbm_most[idx]).astype(np.int64)

    def fill_rows(self, idx: int, max_rows: np.ndarray) -> np.ndarray:
        """The rows of table ``idx`` worth filling into HBM where at most ``max_rows`` fit:
        the rows ever used, but never fewer than :attr:`hbm_least` (a replica keeps every
        row), and at most ``max_rows``."""
        want = max(int(self.rows_used[idx]), int(self.hbm_least[idx]))
        return np.minimum(np.asarray(max_rows), want).astype(np.int64)

    def hbm_rows_allowed(self, idx: np.ndarray | slice | int, hbm_rows: np.ndarray
                         ) -> np.ndarray:
        """``hbm_rows`` of the tables at ``idx`` brought within [:attr:`hbm_least`,
        :attr:`hbm_most`]."""
        return np.clip(hbm_rows, self.hbm_least[idx], self.hbm_most[idx]).astype(np.int64)


@dataclass(frozen=True)
class DeviceArrays:
    """Per-device columns, in rank order (all shaped [D])."""

    hbm_capacity: np.ndarray
    host_capacity: np.ndarray
    hbm_gbps: np.ndarray
    host_gbps: np.ndarray
    node: np.ndarray
    intra_share: np.ndarray  # share of a device's all-to-all peers in its own node
    inter_share: np.ndarray  # share in other nodes


@dataclass(frozen=True)
class ShardingTask:
    """Tables to place on a cluster for a workload.

    Args:
        tables: The tables.
        hardware: The cluster.
        workload: What one step does.
        reservation: HBM the runtime keeps per table or shard beyond its rows
            (:mod:`autoshard.reservation`): TorchRec's (I/O buffers, cache state), as the
            suites, :func:`autoshard.workloads.constrained_task` and the CLI build tasks, or
            none (the weights alone: hand-checked cases, runtimes without TorchRec).
        constraints: What each table may be (:mod:`autoshard.layout.constraints`: allowed kinds,
            share of rows in HBM, narrowest column block), as a user of TorchRec's planner sets
            them; none by default.
    """

    tables: tuple[Table, ...]
    hardware: HardwareProfile
    workload: Workload = Workload()
    reservation: Reservation = NO_RESERVATION
    constraints: Constraints = NO_CONSTRAINTS

    def __post_init__(self) -> None:
        if not isinstance(self.reservation, Reservation):
            raise TypeError(f"reservation must be a Reservation, not {self.reservation!r} "
                            "(autoshard.reservation.get_reservation gives one by name)")
        if not self.tables:
            raise InputError("a task needs at least one table", field="tables", value=0)
        if len(self.tables) > MAX_TABLES:
            raise InputError(f"a task takes at most {MAX_TABLES:,} tables", field="tables",
                             value=len(self.tables))
        check_unique_names(self.tables)

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def num_devices(self) -> int:
        return self.hardware.num_devices

    @cached_property
    def index(self) -> dict[str, int]:
        """Table name -> position in :attr:`tables`."""
        return {t.name: i for i, t in enumerate(self.tables)}

    @cached_property
    def table_arrays(self) -> TableArrays:
        t = self.tables
        train = self.workload.train
        rows = np.array([x.rows for x in t], dtype=np.int64)
        access = [x.access_curve() for x in t]  # built once per table (a Zipf curve is dear)
        curves = np.stack([c.on_grid() for c in access])
        used = np.array([c.used_fraction for c in access]) * rows
        hbm_per_row, reserved = self._hbm_terms()
        return TableArrays(
            rows=rows,
            dim=np.array([x.dim for x in t], dtype=np.int64),
            row_bytes=np.array([x.row_bytes for x in t], dtype=np.float64),
            optimizer_bytes=np.array([x.optimizer_bytes_per_row for x in t], dtype=np.float64),
            memory_bytes_per_row=np.array([x.memory_bytes_per_row(train) for x in t],
                                          dtype=np.float64),
            hbm_bytes_per_row=hbm_per_row,
            hbm_reserved_bytes=reserved,
            lookups=np.array([x.lookups_per_sample for x in t]) * self.workload.batch_size,
            pooling_factor=np.array([x.pooling_factor for x in t]),
            coverage=np.array([x.coverage for x in t]),
            rows_used=np.minimum(np.ceil(used - 1e-9), rows).astype(np.int64),
            curves=curves,
            **self._hbm_bounds(rows),
        )

    def _hbm_bounds(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Each table's least and most rows in HBM, from its constraints."""
        c = self.constraints
        share = np.array([c.of(t.name).hbm_share for t in self.tables]).reshape(-1, 2)
        return {"hbm_least": np.ceil(share[:, 0] * rows - 1e-9).astype(np.int64),
                "hbm_most": np.floor(share[:, 1] * rows + 1e-9).astype(np.int64)}

    def _hbm_terms(self) -> tuple[np.ndarray, np.ndarray]:
        """Each whole table's HBM bytes per HBM row and reserved bytes (its reservation)."""
        t = self.tables
        dim = np.array([x.dim for x in t], dtype=np.int64)
        return self.reservation.hbm_terms(
            np.array([x.rows for x in t], dtype=np.int64), dim, dim,
            np.array([x.bytes_per_element for x in t]),
            np.array([x.optimizer_bytes_per_row for x in t], dtype=np.float64),
            np.array([x.lookups_per_sample for x in t]), 1.0, train=self.workload.train,
            batch_size=self.workload.batch_size, world=self.num_devices)

    @cached_property
    def device_arrays(self) -> DeviceArrays:
        devs = self.hardware.devices
        node = np.array([d.node for d in devs], dtype=np.int64)
        peers = max(len(devs) - 1, 1)
        same = np.array([np.count_nonzero(node == n) - 1 for n in node], dtype=np.float64)
        return DeviceArrays(
            hbm_capacity=np.array([d.hbm.capacity_bytes for d in devs], dtype=np.float64),
            host_capacity=np.array([d.host.capacity_bytes for d in devs], dtype=np.float64),
            hbm_gbps=np.array([d.hbm.bandwidth_gbps for d in devs]),
            host_gbps=np.array([d.host.bandwidth_gbps for d in devs]),
            node=node,
            intra_share=same / peers,
            inter_share=(len(devs) - 1 - same) / peers,
        )

    def hbm_share(self, table_idx: np.ndarray, hbm_rows: np.ndarray) -> np.ndarray:
        """Share of each table's lookups served by its ``hbm_rows`` hottest rows (vectorised)."""
        a = self.table_arrays
        return curve_share(a.curves, a.rows, np.asarray(table_idx), hbm_rows)

    def subset(self, indices: np.ndarray, hardware: HardwareProfile | None = None) -> ShardingTask:
        """The task of the tables at ``indices`` (in that order), on ``hardware`` if given.

        Reuses this task's per-table arrays (sliced) instead of recomputing the access curves,
        which makes drawing many tasks from one table pool cheap.
        """
        idx = np.asarray(indices, dtype=np.int64)
        sub = ShardingTask(tuple(self.tables[i] for i in idx), hardware or self.hardware,
                           self.workload, self.reservation, self.constraints)
        a = self.table_arrays
        # cached_property stores in the instance dict; seed it with the sliced arrays.
        sliced = TableArrays(**{f.name: getattr(a, f.name)[idx] for f in fields(TableArrays)})
        if sub.num_devices != self.num_devices:  # the buffers depend on the world size
            per_row, reserved = sub._hbm_terms()
            sliced = replace(sliced, hbm_bytes_per_row=per_row, hbm_reserved_bytes=reserved)
        sub.__dict__["table_arrays"] = sliced
        return sub

    def with_reservation(self, reservation: Reservation) -> ShardingTask:
        """This task with ``reservation`` kept in HBM per table (its per-table arrays reused,
        only their HBM terms recomputed; the task itself when it keeps that already)."""
        if reservation == self.reservation:
            return self
        out = ShardingTask(self.tables, self.hardware, self.workload, reservation,
                           self.constraints)
        if "table_arrays" in self.__dict__:
            per_row, reserved = out._hbm_terms()
            out.__dict__["table_arrays"] = replace(
                self.table_arrays, hbm_bytes_per_row=per_row, hbm_reserved_bytes=reserved)
        return out

    def with_workload(self, workload: Workload) -> ShardingTask:
        return ShardingTask(self.tables, self.hardware, workload, self.reservation,
                            self.constraints)


def curve_share(curves: np.ndarray, rows: np.ndarray, idx: np.ndarray,
                hbm_rows: np.ndarray) -> np.ndarray:
    """Share of lookups served by the ``hbm_rows`` hottest rows of the tables ``idx`` of
    ``curves`` ([tables, len(GRID)]) and ``rows`` ([tables]); ``idx`` and ``hbm_rows`` broadcast
    (so several tasks' tables gathered into one ``curves`` array are priced in one call)."""
    # np.minimum/np.maximum rather than np.clip: the same values at a fraction of the call
    # overhead, which dominates for the few rows the environment prices per step.
    frac = np.minimum(np.maximum(np.asarray(hbm_rows, dtype=np.float64) / rows[idx], 0.0), 1.0)
    j = np.minimum(np.maximum(GRID.searchsorted(frac, side="right") - 1, 0), GRID.size - 2)
    up = j + 1
    below = GRID[j]
    w = (frac - below) / (GRID[up] - below)
    lo = curves[idx, j]
    hi = curves[idx, up]
    return lo + (hi - lo) * w
