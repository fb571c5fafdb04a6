"""Choosing how to split tables: which tables, row-wise or column-wise, into how many shards.

A table whose cost exceeds a target (by default the per-device mean of the task's least work,
:func:`autoshard.bounds.lower_bound_ms`) caps any table-wise plan at its own cost.
:func:`split_heavy_tables` prices, through the cost model, every candidate split of each such
table (column-wise into 2, 4, 8... blocks of equal width; row-wise over 2..N devices), each
shard with the share of its rows in HBM that the bound's relaxation gives its table (capped at
one device's HBM: a table too big for one device's HBM pays for it until split), and keeps
per table the cheapest split (least total work) whose dearest shard meets the target, else the
split with the cheapest dearest shard. Sharders then place the shards like tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard import kinds
from autoshard.bounds import Relaxation, relax
from autoshard.cost import CostModel
from autoshard.kinds import split_kind
from autoshard.shards import (
    ShardGeometry,
    even_split,
    shard_task,
    whole_tables,
)
from autoshard.task import ShardingTask


@dataclass(frozen=True)
class SplitChoice:
    """Shards of every table, and the prices behind the choice.

    Args:
        geometry: The shards, tables in task order (a table not split is one whole shard).
        whole_ms: Each table's cost whole, with its relaxed share of rows in HBM ([T]).
        hbm_share: That share of each table's rows, from the bound's relaxation ([T]).
        target_ms: The cost above which a table was split.
    """

    geometry: ShardGeometry
    whole_ms: np.ndarray
    hbm_share: np.ndarray
    target_ms: float

    @property
    def split_tables(self) -> np.ndarray:
        """Indices of the tables that were split."""
        g = self.geometry
        return np.unique(g.table[g.parts > 1])


def _price_at_share(task: ShardingTask, cost_model: CostModel, g: ShardGeometry,
                    share: np.ndarray) -> np.ndarray:
    """Each shard's total cost with the hottest ``share`` (per shard) of its rows in HBM (at
    most what one device's HBM holds), on device 0."""
    sub = shard_task(task, g, named=False)
    a = sub.table_arrays
    # No shard holds more HBM rows than one device's HBM can.
    fit = np.floor(float(task.device_arrays.hbm_capacity.max()) / a.memory_bytes_per_row)
    rows = np.minimum(np.floor(share * a.rows), fit)
    return cost_model.price(sub, np.arange(g.num_shards), np.zeros(g.num_shards, dtype=np.int64),
                            rows).total_ms


def candidate_splits(task: ShardingTask, table: int, max_parts: int, node_local: bool = False
                     ) -> list[ShardGeometry]:
    """Into 2, 4, 8... equal column blocks and into row ranges over 2..``max_parts`` devices;
    with ``node_local`` on hardware of several nodes, also into row ranges over 2..(devices per
    node) devices of one node (for sharders that keep such shards on one node). On a task
    whose runtime routes row splits in fixed blocks
    (:attr:`autoshard.reservation.Reservation.fixed_row_blocks`: TorchRec's) the row splits are
    those it routes: over every device (when ``max_parts`` allows), or every device of a
    node."""
    a = task.table_arrays
    dim, rows = int(a.dim[table]), int(a.rows[table])
    out = []
    k = 2
    while k <= min(dim, max_parts):
        if dim % k == 0:
            out.append(even_split(task, table, split_kind(rows=False), k))
        k *= 2
    local = min(task.hardware.devices_per_node, task.num_devices)
    over_world = list(range(2, min(rows, max_parts) + 1))
    over_node = list(range(2, min(rows, max_parts, local) + 1))
    if task.reservation.fixed_row_blocks:
        over_world = [k for k in over_world if k == task.num_devices]
        over_node = [k for k in over_node if k == local]
    out += [even_split(task, table, split_kind(rows=True), k) for k in over_world]
    if node_local and local < task.num_devices:
        out += [even_split(task, table, split_kind(rows=True, node_local=True), k)
                for k in over_node]
    return out


def _whole_prices(task: ShardingTask, cost_model: CostModel, target_ms: float | None,
                  relaxed: Relaxation | None) -> tuple[np.ndarray, np.ndarray, float]:
    """Each table's cost whole at its relaxed HBM share, that share, and the split target."""
    relaxed = relaxed or relax(task, cost_model)
    a = task.table_arrays
    share = np.minimum(relaxed.hbm_bytes / (a.rows * a.memory_bytes_per_row), 1.0)
    whole = _price_at_share(task, cost_model, whole_tables(task), share)
    target = (float(relaxed.cost_ms.sum()) / task.num_devices if target_ms is None
              else target_ms)
    return whole, share, target


def dominant_tables(task: ShardingTask, cost_model: CostModel) -> np.ndarray:
    """Which tables cost more whole than the per-device mean of the least work (bool, [T]):
    the tables :func:`split_heavy_tables` splits by default."""
    whole, _, target = _whole_prices(task, cost_model, None, None)
    return whole > target


def split_heavy_tables(task: ShardingTask, cost_model: CostModel, target_ms: float | None = None,
                       max_parts: int | None = None, relaxed: Relaxation | None = None,
                       node_local: bool = False, rows_only: bool = False,
                       reachable: bool = False) -> SplitChoice:
    """Splits every table dearer than ``target_ms`` (default: the spread-work bound, the
    per-device mean of the least work).

    Args:
        task: The task.
        cost_model: Prices the candidates.
        target_ms: Cost above which a table is split.
        max_parts: Most shards per table (default: the device count).
        relaxed: The task's :func:`autoshard.bounds.relax` (computed when not given).
        node_local: Also offer node-local row splits (:func:`candidate_splits`); only for
            sharders that keep each such table's shards on one node.
        rows_only: Offer row splits only (no column block holds a fraction of the ids, so
            none keeps the whole batch's input buffers, where HBM is reserved per shard).
        reachable: Raise the target to the dearest shard the dearest table can be split
            into (no plan costs less, so no other table need be split finer than that): each
            table then takes its least-work split under that. Where a cost model makes every
            split dear (TorchRec's estimator prices every cached or narrow shard high), this
            keeps tables whole or coarsely split instead of cut into many narrow blocks.
    """
    whole, share, target = _whole_prices(task, cost_model, target_ms, relaxed)
    parts = task.num_devices if max_parts is None else max_parts
    priced: dict[int, tuple[list[ShardGeometry], np.ndarray, np.ndarray]] = {}
    for t in np.flatnonzero(whole > target).tolist():
        options = candidate_splits(task, t, parts, node_local) if parts > 1 else []
        if rows_only:
            options = [o for o in options if not kinds.splits_cols(o.kind[0])]
        if not options:
            continue
        joined = ShardGeometry.concat(options)
        cost = _price_at_share(task, cost_model, joined, np.full(joined.num_shards, share[t]))
        starts = np.cumsum([0] + [o.num_shards for o in options[:-1]])
        priced[t] = (options, np.maximum.reduceat(cost, starts), np.add.reduceat(cost, starts))
    if reachable and priced:
        target = max(target, max(min(float(d.min()), float(whole[t]))
                                 for t, (_, d, _) in priced.items()))
    pieces: list[ShardGeometry] = []
    for t in range(task.num_tables):
        if t not in priced or whole[t] <= target:
            pieces.append(whole_tables(task, np.array([t])))
            continue
        options, dearest, total = priced[t]
        ok = np.flatnonzero(dearest <= target)
        pick = int(ok[np.argmin(total[ok])]) if ok.size else int(np.argmin(dearest))
        pieces.append(options[pick])
    return SplitChoice(ShardGeometry.concat(pieces), whole, share, target)
