"""Choosing how to split tables: which tables, row-wise or column-wise, into how many shards.

A table whose cost exceeds a target (by default the per-device mean of the task's least work,
:func:`autoshard.pricing.bounds.lower_bound_ms`) caps any table-wise plan at its own cost.
:func:`split_heavy_tables` prices, through the cost model, every candidate split of each such
table (column-wise into 2, 4, 8... blocks of equal width; row-wise over 2..N devices; on
several nodes, for sharders that keep shards on a node, row-wise within a node and grids), each
shard with the share of its rows in HBM that the bound's relaxation gives its table (capped at
one device's HBM: a table too big for one device's HBM pays for it until split), and keeps
per table the cheapest split (least total work) whose dearest shard meets the target, else the
split with the cheapest dearest shard. Sharders then place the shards like tables.

:func:`replicate_tables` replicates, the other way, light tables whose replicas (one per
device, ``data_parallel``) do less work in all than the table whole (no all-to-all, each
replica a device's share of the lookups), within a share of every device's HBM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.errors import PlannerError
from autoshard.layout import kinds
from autoshard.layout.constraints import cols_allowed
from autoshard.layout.kinds import split_kind
from autoshard.layout.shards import (
    ShardGeometry,
    even_split,
    grid_split,
    replicas,
    shard_task,
    whole_tables,
)
from autoshard.pricing.bounds import Relaxation, relax
from autoshard.pricing.cost import CostModel
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
    node) devices of one node and into grids (:func:`grid_splits`), for sharders that keep
    such shards on one node. On a task
    whose runtime routes row splits in fixed blocks
    (:attr:`autoshard.reservation.Reservation.fixed_row_blocks`: TorchRec's) the row splits are
    those it routes: over every device (when ``max_parts`` allows), or every device of a
    node. Only the kinds and column blocks the table's constraints allow
    (:attr:`autoshard.task.ShardingTask.constraints`) are offered."""
    a = task.table_arrays
    dim, rows = int(a.dim[table]), int(a.rows[table])
    allowed = task.constraints.of(task.tables[table].name)
    out = []
    k = 2
    while k <= min(dim, max_parts) and allowed.allows(split_kind(rows=False)):
        if dim % k == 0 and cols_allowed(allowed, dim, k):
            out.append(even_split(task, table, split_kind(rows=False), k))
        k *= 2
    local = task.hardware.node_devices
    over_world = list(range(2, min(rows, max_parts) + 1))
    over_node = list(range(2, min(rows, max_parts, local) + 1))
    if task.reservation.fixed_row_blocks:
        over_world = [k for k in over_world if k == task.num_devices]
        over_node = [k for k in over_node if k == local]
    if not allowed.allows(split_kind(rows=True)):
        over_world = []
    if not allowed.allows(split_kind(rows=True, node_local=True)):
        over_node = []
    out += [even_split(task, table, split_kind(rows=True), k) for k in over_world]
    if node_local and task.hardware.spans_nodes:
        out += [even_split(task, table, split_kind(rows=True, node_local=True), k)
                for k in over_node]
        out += grid_splits(task, table, max_parts)
    return out


def grid_splits(task: ShardingTask, table: int, max_parts: int) -> list[ShardGeometry]:
    """Grids of ``table`` (:func:`autoshard.layout.shards.grid_split`): 2, 4, 8... equal column
    blocks, each cut into row ranges over the devices of one node, one on each, of at most
    ``max_parts`` shards in all (so, by default, at most a block per node); only where the
    table's constraints allow grids and the blocks' width."""
    a = task.table_arrays
    dim, rows = int(a.dim[table]), int(a.rows[table])
    allowed = task.constraints.of(task.tables[table].name)
    local = task.hardware.node_devices
    if not allowed.allows(split_kind(rows=True, cols=True, node_local=True)) or rows < local:
        return []
    out = []
    blocks = 2
    while blocks <= dim and blocks * local <= max_parts:
        if dim % blocks == 0 and cols_allowed(allowed, dim, blocks):
            out.append(grid_split(task, table, blocks, local))
        blocks *= 2
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


def _must_split(task: ShardingTask) -> np.ndarray:
    """[T]: the tables their constraints do not allow to stay whole."""
    c = task.constraints
    return np.array([bool(c) and c.must_split(t.name) for t in task.tables], dtype=bool)


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
        relaxed: The task's :func:`autoshard.pricing.bounds.relax` (computed when not given).
        node_local: Also offer node-local row splits and grids (:func:`candidate_splits`);
            only for sharders that keep each column block's such shards on one node.
        rows_only: Offer splits by rows only (grids included: each shard then receives a
            share of the ids, so none keeps the whole batch's input buffers, where HBM is
            reserved per shard; a column block would).
        reachable: Raise the target to the dearest shard the dearest table can be split
            into (no plan costs less, so no other table need be split finer than that): each
            table then takes its least-work split under that. Where a cost model makes every
            split dear (TorchRec's estimator prices every cached or narrow shard high), this
            keeps tables whole or coarsely split instead of cut into many narrow blocks.
    """
    whole, share, target = _whole_prices(task, cost_model, target_ms, relaxed)
    parts = task.num_devices if max_parts is None else max_parts
    priced: dict[int, tuple[list[ShardGeometry], np.ndarray, np.ndarray]] = {}
    forced = _must_split(task)
    for t in np.flatnonzero((whole > target) | forced).tolist():
        options = candidate_splits(task, t, parts, node_local) if parts > 1 else []
        if rows_only and not forced[t]:
            options = [o for o in options if kinds.splits_rows(o.kind[0])]
        if not options:
            if forced[t]:
                raise PlannerError("constraint", f"table '{task.tables[t].name}' may not stay "
                                   f"whole, and no split its constraints allow fits "
                                   f"{task.num_devices} devices")
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
        if t not in priced or (whole[t] <= target and not forced[t]):
            pieces.append(whole_tables(task, np.array([t])))
            continue
        options, dearest, total = priced[t]
        ok = np.flatnonzero(dearest <= target)
        pick = int(ok[np.argmin(total[ok])]) if ok.size else int(np.argmin(dearest))
        pieces.append(options[pick])
    return SplitChoice(ShardGeometry.concat(pieces), whole, share, target)


#: Most share of each device's HBM that :func:`replicate_tables` gives to replicas.
REPLICA_HBM_SHARE = 0.05
#: Least share of a table's total work its replicas must save to be chosen.
REPLICA_MIN_SAVING = 0.05


def replicate_tables(task: ShardingTask, cost_model: CostModel, g: ShardGeometry,
                     hbm_share: float = REPLICA_HBM_SHARE) -> ShardGeometry:
    """``g`` with the tables whose replicas pay replicated
    (:func:`autoshard.layout.shards.replicas`), ``g`` itself when none does.

    A table pays when its replicas' total cost, every row in HBM, is below the total cost of
    its pieces in ``g`` (whole or split), every row in HBM, by :data:`REPLICA_MIN_SAVING` of
    it: its all-to-all saved, less the all-reduce and dense update of a training step. Those
    chosen, by saving per byte, are those whose replicas fit ``hbm_share`` of the smallest
    device's HBM together. Only tables their constraints let replicate, on a task of several
    devices.
    """
    world = task.num_devices
    allowed = np.array([task.constraints.of(t.name).allows(kinds.REPLICATED)
                        for t in task.tables]) & ~_is_replicated(task, g)
    if world < 2 or not allowed.any():
        return g
    idx = np.flatnonzero(allowed)
    now = _total_at_full_hbm(task, cost_model, g)[idx]
    one = ShardGeometry.concat([replicas(task, int(t)).take(np.array([0])) for t in idx])
    sub = shard_task(task, one, named=False)
    b = sub.table_arrays
    rep = world * cost_model.price(sub, np.arange(idx.size), np.zeros(idx.size, dtype=np.int64),
                                   b.rows).total_ms
    held = b.rows * b.hbm_bytes_per_row + b.hbm_reserved_bytes
    saving = now - rep
    room = hbm_share * float(task.device_arrays.hbm_capacity.min())
    order = np.argsort(-saving / held, kind="stable")
    pays = saving[order] > REPLICA_MIN_SAVING * now[order]
    fits = np.cumsum(np.where(pays, held[order], 0.0)) <= room
    chosen = set(idx[order[pays & fits]].tolist())
    if not chosen:
        return g
    pieces = [replicas(task, t) if t in chosen else g.take(np.flatnonzero(g.table == t))
              for t in range(task.num_tables)]
    return ShardGeometry.concat(pieces)


def _is_replicated(task: ShardingTask, g: ShardGeometry) -> np.ndarray:
    """[T]: the tables ``g`` already replicates."""
    return np.bincount(g.table, weights=kinds.replicated(g.kind),
                       minlength=task.num_tables) > 0


def _total_at_full_hbm(task: ShardingTask, cost_model: CostModel, g: ShardGeometry
                       ) -> np.ndarray:
    """[T]: each table's pieces in ``g`` priced with every row in HBM, summed."""
    sub = shard_task(task, g, named=False)
    price = cost_model.price(sub, np.arange(g.num_shards), np.zeros(g.num_shards, dtype=np.int64),
                             sub.table_arrays.rows).total_ms
    return np.bincount(g.table, weights=price, minlength=task.num_tables)
