"""Where a plan puts each table, and what each piece costs: one record per shard (a whole table
is one shard), with its device, rows and columns, HBM rows, price by part and memory.

The prices are the cost model's own for each shard (:func:`autoshard.layout.shards.price_layout`,
the call the evaluator makes); a device's total in the cost report may differ from the sum of
its shards' where the model prices a device's set of tables as a whole (the set model). The
memory is the evaluator's too: a shard's rows' weights (and optimizer state in training) in
each tier, and the HBM its runtime keeps beside them (the task's reservation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.layout.kinds import ShardingKind
from autoshard.layout.plan import Plan
from autoshard.layout.shards import plan_layout, price_layout, pricing_task
from autoshard.pricing.cost import CostModel
from autoshard.task import ShardingTask


@dataclass(frozen=True)
class ShardCost:
    """One shard of a plan (a whole table is one shard).

    Args:
        table: The table's name.
        device: The device that holds it.
        sharding: How its table is split (the plan's sharding kind).
        parts: Shards of its table.
        row_start: First row it holds (of its table's hashed id space).
        row_end: One past its last row.
        col_start: First column it holds.
        col_end: One past its last column.
        table_rows: Rows of its table.
        hbm_rows: Its rows kept in HBM (the hottest), the rest in host memory (UVM).
        hbm_ms: Its work served from HBM, ms per step.
        uvm_ms: Its work served from host memory, ms per step.
        comm_ms: Its share of the device's all-to-all, ms per step.
        hbm_bytes: Bytes of its rows in HBM (weights, and optimizer state in training).
        host_bytes: Bytes of its rows in host memory.
        reserved_bytes: HBM its runtime keeps beside the rows (the task's reservation).
    """

    table: str
    device: int
    sharding: ShardingKind
    parts: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int
    table_rows: int
    hbm_rows: int
    hbm_ms: float
    uvm_ms: float
    comm_ms: float
    hbm_bytes: float
    host_bytes: float
    reserved_bytes: float

    @property
    def total_ms(self) -> float:
        """Its price, ms per step."""
        return self.hbm_ms + self.uvm_ms + self.comm_ms

    @property
    def rows(self) -> int:
        """Rows it holds."""
        return self.row_end - self.row_start

    @property
    def hbm_share(self) -> float:
        """Share of its rows kept in HBM."""
        return self.hbm_rows / self.rows if self.rows else 1.0


def shard_costs(plan: Plan, task: ShardingTask, cost_model: CostModel,
                source: str = "plan") -> tuple[ShardCost, ...]:
    """Every shard of ``plan`` with its price and memory, in task order (a table's shards
    together).

    Raises:
        PlannerError: The plan does not place the task's tables (:func:`plan_layout`).
        InputError: A shard does not fit its table or its device the hardware.
    """
    layout = plan_layout(plan, task, source)
    g = layout.geometry
    priced = price_layout(task, cost_model, layout)
    arrays = pricing_task(task, g).table_arrays
    hbm = layout.hbm_rows * arrays.memory_bytes_per_row
    host = (g.rows - layout.hbm_rows) * arrays.memory_bytes_per_row
    reserved = arrays.hbm_bytes(slice(None), layout.hbm_rows) - hbm  # as the evaluator counts
    rows = task.table_arrays.rows
    return tuple(
        ShardCost(task.tables[int(g.table[i])].name, int(layout.device[i]),
                  ShardingKind.of(g.kind[i]), int(g.parts[i]), int(g.row_start[i]),
                  int(g.row_end[i]), int(g.col_start[i]), int(g.col_end[i]),
                  int(rows[g.table[i]]), int(layout.hbm_rows[i]), float(priced.hbm_ms[i]),
                  float(priced.uvm_ms[i]), float(priced.comm_ms[i]), float(hbm[i]),
                  float(host[i]), float(max(reserved[i], 0.0)))
        for i in range(layout.num_shards))


def by_device(shards: tuple[ShardCost, ...], devices: int) -> list[list[ShardCost]]:
    """The shards of each device, dearest first."""
    out: list[list[ShardCost]] = [[] for _ in range(devices)]
    for s in shards:
        out[s.device].append(s)
    return [sorted(held, key=lambda s: -s.total_ms) for held in out]


@dataclass(frozen=True)
class TableCost:
    """One table of a plan: its shards' devices and figures summed.

    Args:
        table: Its name.
        sharding: How it is split.
        devices: The devices of its shards, in order.
        rows: Its rows.
        hbm_share: Share of its elements kept in HBM, over its shards (each shard's HBM rows
            weighed by its columns; every replica counts).
        total_ms: Its shards' prices summed, ms per step.
        hbm_bytes: Its shards' bytes in HBM.
        host_bytes: Its shards' bytes in host memory.
    """

    table: str
    sharding: ShardingKind
    devices: tuple[int, ...]
    rows: int
    hbm_share: float
    total_ms: float
    hbm_bytes: float
    host_bytes: float


def by_table(shards: tuple[ShardCost, ...]) -> list[TableCost]:
    """Each table's shards summed, dearest first."""
    grouped: dict[str, list[ShardCost]] = {}
    for s in shards:
        grouped.setdefault(s.table, []).append(s)
    def share(held: list[ShardCost]) -> float:
        cols = [s.col_end - s.col_start for s in held]
        whole = sum(s.rows * c for s, c in zip(held, cols, strict=True))
        return sum(s.hbm_rows * c for s, c in zip(held, cols, strict=True)) / max(whole, 1)

    tables = [TableCost(name, held[0].sharding, tuple(s.device for s in held),
                        held[0].table_rows, share(held),
                        float(np.sum([s.total_ms for s in held])),
                        float(np.sum([s.hbm_bytes for s in held])),
                        float(np.sum([s.host_bytes for s in held])))
              for name, held in grouped.items()]
    return sorted(tables, key=lambda t: -t.total_ms)
