"""Shards as rows: a plan's shards in flat arrays, and the task whose "tables" are those shards.

Every cost model prices (table, device, HBM rows) rows of a task. A split plan is priced by the
same call on a :class:`ShardTask`: one row per shard, with the shard's rows, dim and lookups
derived from its table, and a per-shard communication descriptor the analytical communication
term reads. So a shard is priced exactly like a small table, and there is one pricing path.

How a shard derives from its table (ids are hashed, so hot rows spread evenly over row ranges):
a row shard holding a share f of the rows sees f of the lookups and the table's access curve
and writes partial pooled sums of the full dim; a column block of width w sees every lookup
with w/dim of the row bytes, and keeps its own row-wise optimizer state; a grid shard, a row
range of a column block, is both (f of the lookups, w/dim of the bytes, partial sums of its
block's w columns); a replica (one per device) holds every row in HBM and sees its device's
share of the batch, 1/world of the lookups, and in training pays its table's gradient
all-reduce and dense update (:func:`autoshard.pricing.shard_terms.replica_terms`). How partial sums
are reduced and which ids a shard receives are its kind's rules (:mod:`autoshard.layout.kinds`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from autoshard.errors import InputError, PlannerError, gib
from autoshard.layout import kinds
from autoshard.layout.kinds import WHOLE, ShardingKind, split_kind
from autoshard.layout.plan import Placement, Plan, Shard, check_devices, check_placement, hbm_use
from autoshard.pricing.cost import CostModel, Pricing
from autoshard.tables import Table
from autoshard.task import ShardingTask, TableArrays


@dataclass(frozen=True, eq=False)
class ShardGeometry:
    """What each shard holds, one entry per shard (all shaped [S]).

    Args:
        table: Index of the shard's table in the task.
        kind: Its table's sharding, as a code (:attr:`autoshard.layout.kinds.ShardingKind.code`).
        parts: How many shards its table has.
        row_start: First row (inclusive).
        row_end: Last row (exclusive).
        col_start: First column (inclusive).
        col_end: Last column (exclusive).
    """

    table: np.ndarray
    kind: np.ndarray
    parts: np.ndarray
    row_start: np.ndarray
    row_end: np.ndarray
    col_start: np.ndarray
    col_end: np.ndarray

    @property
    def num_shards(self) -> int:
        return int(self.table.size)

    @property
    def rows(self) -> np.ndarray:
        return self.row_end - self.row_start

    @property
    def cols(self) -> np.ndarray:
        return self.col_end - self.col_start

    def take(self, idx: np.ndarray) -> ShardGeometry:
        """The shards at ``idx``, in that order."""
        return ShardGeometry(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @classmethod
    def concat(cls, parts: list[ShardGeometry]) -> ShardGeometry:
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                      for f in fields(cls)})


def same_split(a: ShardGeometry, b: ShardGeometry) -> bool:
    """Whether two geometries split the same tables the same way (table, kind, parts)."""
    return a.num_shards == b.num_shards and all(
        bool((getattr(a, f) == getattr(b, f)).all()) for f in ("table", "kind", "parts"))


def column_blocks(g: ShardGeometry) -> np.ndarray:
    """[S]: each shard's column block, an index shared by the shards of one table that hold
    the same columns (all of a table's shards where its columns are not cut)."""
    key = g.table * (int(g.col_start.max(initial=0)) + 1) + g.col_start
    return np.unique(key, return_inverse=True)[1].ravel()


def row_parts(g: ShardGeometry) -> np.ndarray:
    """[S]: how many row shards hold each shard's columns: a row-split table's shards, a
    grid's shards of one column block, 1 for a column block or a whole table."""
    block = column_blocks(g)
    return np.bincount(block)[block]


def one_per_device(task: ShardingTask, g: ShardGeometry) -> np.ndarray:
    """[S]: the shards that go one per device (:func:`autoshard.layout.kinds.one_per_device`, where
    the task's runtime may route row splits in fixed blocks:
    :attr:`autoshard.reservation.Reservation.fixed_row_blocks`)."""
    return kinds.one_per_device(g.kind, task.reservation.fixed_row_blocks)


def fixed_shards(task: ShardingTask, g: ShardGeometry) -> np.ndarray:
    """[S]: the shards that must stay on their device once placed: replicas, grid shards
    (:func:`autoshard.layout.kinds.fills_node`) and, where the runtime routes row splits in fixed
    blocks, those of :func:`one_per_device` (they fill their world or node, so no move keeps
    that)."""
    return ((one_per_device(task, g) & task.reservation.fixed_row_blocks)
            | kinds.replicated(g.kind) | kinds.fills_node(g.kind))


def held_shards(task: ShardingTask, g: ShardGeometry) -> np.ndarray:
    """[S]: the shards a search around a placed plan leaves on their device: those that must
    stay (:func:`fixed_shards`) and node-local ones (kept on their node's devices), which
    include every shard :func:`split_pins` pins."""
    return fixed_shards(task, g) | kinds.node_local(g.kind)


def split_pins(task: ShardingTask, g: ShardGeometry) -> np.ndarray | None:
    """A device per shard for the shards whose device the split itself fixes (-1 for the
    others; None when there are none).

    - node-local row shards (:attr:`autoshard.layout.kinds.ShardingKind.node_local`): each column
      block's shards (a table-row-wise table's all) on consecutive devices of the node with
      the fewest shards pinned so far, from where the last one there ended (so that they
      spread over the nodes' devices), a grid's blocks on nodes its other blocks do not use
      while there are such; with fixed row blocks, or a grid's, one shard per device of the
      node, they fill it.
    - replicas, and the other row shards with fixed row blocks: shard j on device j (its
      shards are alike, one per device of the world).
    """
    bound = one_per_device(task, g)
    if not bound.any():
        return None
    local_kind = kinds.node_local(g.kind)
    rw = np.flatnonzero(bound & ~local_kind)
    pins = np.full(g.num_shards, -1, dtype=np.int64)
    for t in np.unique(g.table[rw]):
        idx = np.flatnonzero(g.table == t)
        pins[idx] = np.arange(idx.size) % task.num_devices
    local = task.hardware.node_devices
    nodes = max(task.num_devices // local, 1)
    taken = np.zeros(nodes, dtype=np.int64)  # shards pinned to each node so far
    block = column_blocks(g)
    used: dict[int, set[int]] = {}  # nodes each table's blocks use so far
    for b in np.unique(block[bound & local_kind]):
        idx = np.flatnonzero(block == b)
        mine = used.setdefault(int(g.table[idx[0]]), set())
        free = [n for n in range(nodes) if n not in mine] or list(range(nodes))
        node = min(free, key=lambda n: (taken[n], n))
        pins[idx] = node * local + (taken[node] + np.arange(idx.size)) % local
        taken[node] += idx.size
        mine.add(node)
    return pins


def whole_tables(task: ShardingTask, tables: np.ndarray | None = None) -> ShardGeometry:
    """Each table (all, or those at ``tables``) as one shard holding every row and column."""
    a = task.table_arrays
    t = np.arange(task.num_tables) if tables is None else np.asarray(tables, dtype=np.int64)
    zero = np.zeros(t.size, dtype=np.int64)
    return ShardGeometry(t, zero + WHOLE.code, zero + 1, zero, a.rows[t], zero.copy(), a.dim[t])


def replicas(task: ShardingTask, table: int) -> ShardGeometry:
    """``table`` replicated: one shard per device of the task, each holding every row and
    column (:attr:`autoshard.layout.kinds.REPLICATED`)."""
    a = task.table_arrays
    n = task.num_devices
    zero = np.zeros(n, dtype=np.int64)
    return ShardGeometry(zero + table, zero + kinds.REPLICATED.code, zero + n, zero.copy(),
                         zero + int(a.rows[table]), zero.copy(), zero + int(a.dim[table]))


def even_split(task: ShardingTask, table: int, sharding: ShardingKind, parts: int
               ) -> ShardGeometry:
    """``table`` split into ``parts`` near-equal row ranges or column blocks (a kind that cuts
    both: :func:`grid_split`).

    Raises:
        InputError: The table has fewer rows (or columns) than ``parts``.
    """
    assert not (sharding.splits_rows and sharding.splits_cols), "rectangles: grid_split"
    a = task.table_arrays
    rows, dim = int(a.rows[table]), int(a.dim[table])
    extent = rows if sharding.splits_rows else dim
    if not 1 <= parts <= extent:
        raise InputError(f"cannot split {extent} {'rows' if extent == rows else 'columns'} "
                         f"of table '{task.tables[table].name}' into {parts}",
                         field="parts", value=parts)
    edges = (np.arange(parts + 1, dtype=np.int64) * extent) // parts
    n = np.full(parts, table, dtype=np.int64)
    zero = np.zeros(parts, dtype=np.int64)
    if sharding.splits_rows:
        return ShardGeometry(n, zero + sharding.code, zero + parts, edges[:-1], edges[1:],
                             zero.copy(), zero + dim)
    return ShardGeometry(n, zero + sharding.code, zero + parts, zero.copy(), zero + rows,
                         edges[:-1], edges[1:])


def grid_split(task: ShardingTask, table: int, blocks: int, local: int) -> ShardGeometry:
    """``table`` cut into ``blocks`` near-equal column blocks, each into ``local`` near-equal
    row ranges (one per device of a node; TorchRec's grid sharding): shards block-major, each
    block's rows in order.

    Raises:
        InputError: The table has fewer columns than ``blocks`` or fewer rows than ``local``.
    """
    a = task.table_arrays
    rows, dim = int(a.rows[table]), int(a.dim[table])
    for name, count, extent in (("blocks", blocks, dim), ("local", local, rows)):
        if not 1 <= count <= extent:
            raise InputError(f"cannot cut {rows} rows x {dim} columns of table "
                             f"'{task.tables[table].name}' into {blocks} column blocks of "
                             f"{local} row ranges", field=name, value=count)
    c = (np.arange(blocks + 1, dtype=np.int64) * dim) // blocks
    r = (np.arange(local + 1, dtype=np.int64) * rows) // local
    n = np.zeros(blocks * local, dtype=np.int64)
    code = split_kind(rows=True, cols=True, node_local=True).code
    return ShardGeometry(n + table, n + code, n + blocks * local, np.tile(r[:-1], blocks),
                         np.tile(r[1:], blocks), np.repeat(c[:-1], local),
                         np.repeat(c[1:], local))


@dataclass(frozen=True, eq=False)
class ShardLayout:
    """A plan as flat per-shard arrays: what each shard holds, its device and its HBM rows."""

    geometry: ShardGeometry
    device: np.ndarray
    hbm_rows: np.ndarray

    @property
    def num_shards(self) -> int:
        return self.geometry.num_shards

    def even_shares(self, task: ShardingTask) -> ShardLayout:
        """The layout with every split table's shards keeping one share of their rows in HBM:
        TorchRec holds one cache load factor per table, so shards with different shares would
        be exported with their mean and overfill the ranks of the shards below it.

        Table by table, the share is the shards' mean (by bytes, the export's load factor),
        lowered to what the free HBM of the devices of the shards below it holds
        (:func:`autoshard.layout.plan.hbm_use`), and never below the least of theirs; rounded down.
        Whole tables are kept. Only where the task's runtime keeps one share per table
        (:attr:`autoshard.reservation.Reservation.one_share_per_table`): elsewhere each shard
        keeps its own rows.
        """
        g = self.geometry
        if not task.reservation.one_share_per_table or not (g.parts > 1).any():
            return self
        priced = pricing_task(task, g)
        per_row = priced.table_arrays.hbm_bytes_per_row
        rows = self.hbm_rows.copy()
        free = task.device_arrays.hbm_capacity - hbm_use(priced, self.device, rows)
        for t in np.unique(g.table[g.parts > 1]):
            idx = np.flatnonzero(g.table == t)
            share = rows[idx] / g.rows[idx]
            # The share each device of the table's shards can hold (all its shards there).
            on = self.device[idx]
            held = np.bincount(on, weights=rows[idx] * per_row[idx], minlength=free.size)
            full = np.bincount(on, weights=g.rows[idx] * per_row[idx], minlength=free.size)
            used = np.unique(on)
            reach = (held[used] + np.maximum(free[used], 0.0)) / full[used]
            mean = float((rows[idx] * g.cols[idx]).sum() / (g.rows[idx] * g.cols[idx]).sum())
            target = max(min(mean, float(reach.min())), float(share.min()))
            new = np.minimum(np.floor(target * g.rows[idx] + 1e-9), g.rows[idx]).astype(np.int64)
            np.subtract.at(free, self.device[idx], (new - rows[idx]) * per_row[idx])
            rows[idx] = new
        return ShardLayout(g, self.device, rows)

    def to_plan(self, task: ShardingTask, sharder: str = "") -> Plan:
        """The plan of these shards (tables in task order, each table's shards block-major:
        by column block, then by rows; a table placed whole is a whole-table placement)."""
        g = self.geometry
        order = np.lexsort((g.row_start, g.col_start, g.table))
        placements = []
        start = 0
        while start < order.size:
            t = int(g.table[order[start]])
            stop = start
            while stop < order.size and g.table[order[stop]] == t:
                stop += 1
            idx = order[start:stop]
            sharding = ShardingKind.of(g.kind[idx[0]])
            name = task.tables[t].name
            if not sharding.is_split:
                assert idx.size == 1, "a whole table has one shard"
                placements.append(Placement(name, int(self.device[idx[0]]),
                                            int(self.hbm_rows[idx[0]])))
            else:
                placements.append(Placement.split(name, sharding, tuple(
                    Shard(int(self.device[i]), int(g.row_start[i]), int(g.row_end[i]),
                          int(g.col_start[i]), int(g.col_end[i]), int(self.hbm_rows[i]))
                    for i in idx)))
            start = stop
        return Plan(tuple(placements), sharder, task.workload, task.hardware.name)


def plan_layout(plan: Plan, task: ShardingTask, source: str = "plan") -> ShardLayout:
    """A plan's shards as flat arrays, in task order; checks the plan against the task.

    Raises:
        PlannerError: A table is unknown, placed twice or left unplaced.
        InputError: A shard does not fit its table (ranges, HBM rows) or its devices do not
            fit the hardware (:func:`autoshard.layout.plan.check_devices`; the field is named, e.g.
            ``placements[3].shards[1].device``).
    """
    by_table: dict[int, tuple[int, Placement]] = {}
    for i, p in enumerate(plan.placements):
        t = task.index.get(p.table)
        if t is None:
            raise PlannerError("invalid_plan", f"plan places unknown table '{p.table}'")
        if t in by_table:
            raise PlannerError("invalid_plan", f"table '{p.table}' is placed twice")
        by_table[t] = (i, p)
    if len(by_table) < task.num_tables:
        missing = [x.name for t, x in enumerate(task.tables) if t not in by_table]
        raise PlannerError("invalid_plan", f"plan leaves {len(missing)} table(s) unplaced, "
                           f"first '{missing[0]}'")
    node = task.device_arrays.node
    cols: dict[str, list[int]] = {f.name: [] for f in fields(ShardGeometry)}
    device: list[int] = []
    hbm: list[int] = []
    for t in range(task.num_tables):
        i, p = by_table[t]
        table = task.tables[t]
        where = f"placements[{i}]"
        check_placement(p, where, source, table.rows, table.dim)
        pieces = p.pieces(table.rows, table.dim)
        check_devices(p, pieces, where, source, node, task.hardware.name)
        for s in pieces:
            for name, value in (("table", t), ("kind", p.sharding.code),
                                ("parts", len(pieces)), ("row_start", s.row_start),
                                ("row_end", s.row_end), ("col_start", s.col_start),
                                ("col_end", s.col_end)):
                cols[name].append(value)
            device.append(s.device)
            hbm.append(s.hbm_rows)
    geometry = ShardGeometry(**{k: np.array(v, dtype=np.int64) for k, v in cols.items()})
    return ShardLayout(geometry, np.array(device, dtype=np.int64), np.array(hbm, dtype=np.int64))


@dataclass(frozen=True, eq=False)
class ShardTask(ShardingTask):
    """A task whose rows are shards of another task's tables (see the module docstring).

    ``tables`` holds each shard as a table of its own name, rows and dim; :attr:`table_arrays`
    holds the shards' derived columns (the access curve is its table's).

    Args:
        parent: The task whose tables were split.
        geometry: What each shard holds.
        a2a_scale: Per shard, the share of its own pooled output (and in train its gradient)
            that it sends over the all-to-all (:func:`autoshard.layout.kinds.comm_shares`).
        reduce_scale: Per shard, bytes it sends over intra-node links to reduce partial sums
            within its node, as a share of its own pooled output.
    """

    parent: ShardingTask | None = None
    geometry: ShardGeometry | None = None
    a2a_scale: np.ndarray | None = None
    reduce_scale: np.ndarray | None = None

    def __post_init__(self) -> None:
        assert self.parent is not None and self.geometry is not None


def shard_task(task: ShardingTask, geometry: ShardGeometry, named: bool = True) -> ShardTask:
    """The task whose rows are the shards in ``geometry``, for pricing.

    Args:
        task: The task whose tables are split.
        geometry: The shards.
        named: Give each shard a table of its own name, rows and dim (for sharders that place
            shards as tables); False: each shard's ``tables`` entry is its table, for pricing
            only (much cheaper for many candidate shards).
    """
    a = task.table_arrays
    g = geometry
    t = g.table
    rows = g.rows
    local = task.hardware.node_devices
    ids = kinds.id_share(g.kind, task.num_devices, local)
    rep = kinds.replicated(g.kind)
    share = np.where(rep, ids, rows / a.rows[t])  # of the table's lookups
    row_bytes = a.row_bytes[t] * g.cols / a.dim[t]
    hbm_per_row, reserved = task.reservation.hbm_terms(
        rows, g.cols, a.dim[t], np.rint(a.row_bytes[t] / a.dim[t]), a.optimizer_bytes[t],
        a.lookups[t] / task.workload.batch_size, ids, train=task.workload.train,
        batch_size=task.workload.batch_size, world=task.num_devices,
        output_share=np.where(rep, 1.0 / task.num_devices, 1.0))
    arrays = TableArrays(
        rows=rows,
        dim=g.cols,
        row_bytes=row_bytes,
        optimizer_bytes=a.optimizer_bytes[t],
        memory_bytes_per_row=a.memory_bytes_per_row[t] - a.row_bytes[t] + row_bytes,
        hbm_bytes_per_row=hbm_per_row,
        hbm_reserved_bytes=reserved,
        lookups=a.lookups[t] * share,
        pooling_factor=a.pooling_factor[t] * share,
        coverage=a.coverage[t],
        rows_used=np.minimum(np.ceil(a.rows_used[t] * np.where(rep, 1.0, share) - 1e-9),
                             rows).astype(np.int64),
        curves=a.curves[t],
        hbm_least=np.where(rep, rows, np.ceil(a.hbm_least[t] / a.rows[t] * rows - 1e-9)
                           ).astype(np.int64),
        hbm_most=np.where(rep, rows, np.floor(a.hbm_most[t] / a.rows[t] * rows + 1e-9)
                          ).astype(np.int64),
    )
    tables = (_shard_tables(task, g, arrays) if named
              else tuple(task.tables[i] for i in t.tolist()))
    a2a, reduce = kinds.comm_shares(g.kind, row_parts(g))
    sub = ShardTask(tables, task.hardware, task.workload, task.reservation,
                    parent=task, geometry=g, a2a_scale=a2a, reduce_scale=reduce)
    sub.__dict__["table_arrays"] = arrays
    return sub


def _shard_tables(task: ShardingTask, g: ShardGeometry, arrays: TableArrays
                  ) -> tuple[Table, ...]:
    """Each shard as a table named ``<table>@<row_start>:<col_start>``, with its rows, dim and
    lookups (so sharders that read tables see shards)."""
    out = []
    for i, t in enumerate(g.table.tolist()):
        table = task.tables[t]
        if g.kind[i] == WHOLE.code:
            out.append(table)
            continue
        used = None if table.rows_used is None else max(int(arrays.rows_used[i]), 1)
        out.append(replace(table, name=f"{table.name}@{g.row_start[i]}:{g.col_start[i]}",
                           rows=int(arrays.rows[i]), dim=int(arrays.dim[i]),
                           pooling_factor=float(arrays.pooling_factor[i]), pooling_std=None,
                           rows_used=used, reuse_hist=None))
    return tuple(out)


def is_whole(task: ShardingTask, geometry: ShardGeometry) -> bool:
    """Whether the shards are the task's tables, whole and in order."""
    return (geometry.num_shards == task.num_tables
            and bool((geometry.table == np.arange(task.num_tables)).all())
            and bool((geometry.kind == WHOLE.code).all()))


def pricing_task(task: ShardingTask, geometry: ShardGeometry) -> ShardingTask:
    """The task to price these shards on: ``task`` itself when they are its whole tables in
    order (so cost models keep their per-task caches), else their :class:`ShardTask`."""
    return task if is_whole(task, geometry) else shard_task(task, geometry)


def price_layout(task: ShardingTask, cost_model: CostModel, layout: ShardLayout) -> Pricing:
    """Per-shard prices of a layout (one cost-model call)."""
    priced = pricing_task(task, layout.geometry)
    return cost_model.price(priced, np.arange(layout.num_shards), layout.device,
                            layout.hbm_rows)


def shard_memory(task: ShardingTask, layout: ShardLayout) -> tuple[np.ndarray, np.ndarray]:
    """Bytes used per device in (HBM, host) by a layout's shards, optimizer state included in
    train mode."""
    per_row = pricing_task(task, layout.geometry).table_arrays.memory_bytes_per_row
    d = task.num_devices
    hbm = np.bincount(layout.device, weights=layout.hbm_rows * per_row, minlength=d)
    host = np.bincount(layout.device, weights=(layout.geometry.rows - layout.hbm_rows) * per_row,
                       minlength=d)
    return hbm, host


def check_layout(plan: Plan, task: ShardingTask, source: str = "plan") -> ShardLayout:
    """:func:`plan_layout`, then every device's HBM and host memory checked against capacity.

    Raises:
        PlannerError: A tier is over capacity (the message names the device and the bytes).
    """
    layout = plan_layout(plan, task, source)
    used_hbm, used_host = shard_memory(task, layout)
    dev = task.device_arrays
    for tier, used, cap in (("HBM", used_hbm, dev.hbm_capacity),
                            ("host", used_host, dev.host_capacity)):
        over = np.flatnonzero(used > cap + 1e-6)
        if over.size:
            d = int(over[0])
            on = layout.geometry.table[layout.device == d]
            names = [task.tables[i].name for i in dict.fromkeys(on.tolist())][:5]
            raise PlannerError("capacity", f"device {d} {tier} holds {gib(used[d])} but has "
                               f"{gib(cap[d])} (tables {', '.join(names)}...)")
    return layout


__all__ = ["ShardGeometry", "ShardLayout", "ShardTask", "check_layout", "column_blocks",
           "even_split", "grid_split", "plan_layout", "price_layout", "pricing_task",
           "replicas", "row_parts", "shard_memory", "shard_task", "whole_tables"]
