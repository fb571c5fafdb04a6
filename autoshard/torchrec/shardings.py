"""Plans as TorchRec table shardings, and TorchRec's shardings as plans.

Every table becomes one :class:`TableSharding` of the same geometry
(:mod:`autoshard.torchrec.mapping` names it in TorchRec's terms): a whole table on its rank;
column blocks with their ranks; row shards as TorchRec's runtime routes them, one even block
per rank of the world (or of the node), in rank order; a grid's column blocks in column order,
each its row shards as a table-row-wise table's; ranks the plan gives no rows hold an empty
block; a replicated table one whole replica per rank (TorchRec keeps no sharding spec
for it, only its ranks). A table keeps one compute kernel and cache load factor, so shards of
one table that keep different shares in HBM are exported with their table's share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autoshard.errors import InputError, PlannerError
from autoshard.layout.kinds import ShardingKind
from autoshard.layout.plan import Placement, Plan, Shard
from autoshard.layout.shards import check_layout
from autoshard.task import ShardingTask
from autoshard.torchrec.mapping import (
    DEFAULT_CACHE_LOAD_FACTOR,
    DENSE,
    FUSED,
    FUSED_UVM,
    FUSED_UVM_CACHING,
    KERNELS,
    SHARDING_TYPES,
    WHOLE_TYPE,
    block_ranks,
    data_type,
    even_blocks,
    kernel_of,
    kind_of,
    torchrec_name,
)


@dataclass(frozen=True)
class ShardSpec:
    """One shard of a table in TorchRec's terms: a block of rows and columns on ``rank``."""

    rank: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int


@dataclass(frozen=True)
class TableSharding:
    """One table in TorchRec's terms: its sharding type, shards (with ranks), compute kernel
    and cache load factor (one per table, as TorchRec has it)."""

    table: str
    rows: int
    dim: int
    data_type: str
    sharding_type: str
    compute_kernel: str
    cache_load_factor: float | None
    shards: tuple[ShardSpec, ...]

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.shards]

    @property
    def rank(self) -> int:
        """The rank of the first shard (the only one when table-wise)."""
        return self.shards[0].rank

    def shard_hbm_rows(self, shard: ShardSpec) -> int:
        """Rows of ``shard`` in HBM: all (fused, dense), none (fused_uvm) or its cache."""
        if self.compute_kernel in (FUSED, DENSE):
            return shard.rows
        if self.compute_kernel == FUSED_UVM:
            return 0
        return round((self.cache_load_factor or 0.0) * shard.rows)

    @property
    def kind(self) -> ShardingKind:
        """Our kind of its sharding type."""
        return kind_of(self.sharding_type)

    @property
    def hbm_rows(self) -> int:
        """Rows of the table in HBM (over the row shards of its first column block; column
        blocks hold the same rows)."""
        if not self.kind.splits_rows:
            return self.shard_hbm_rows(self.shards[0])
        first = self.shards[0].col_offset
        return sum(self.shard_hbm_rows(s) for s in self.shards if s.col_offset == first)


def shard_doc(s: ShardSpec) -> dict[str, int]:
    """A shard as the description file writes it."""
    return {"rank": s.rank, "row_offset": s.row_offset, "rows": s.rows,
            "col_offset": s.col_offset, "cols": s.cols}


def whole_table(name: str, rows: int, dim: int, data_type: str, rank: int, kernel: str,
                cache_load_factor: float | None) -> TableSharding:
    """The whole table on ``rank``."""
    return TableSharding(name, rows, dim, data_type, WHOLE_TYPE, kernel, cache_load_factor,
                         (ShardSpec(rank, 0, rows, 0, dim),))


def table_shardings(plan: Plan, task: ShardingTask) -> list[TableSharding]:
    """The plan's tables as TorchRec shardings, in task order (validated against the task).

    Each table keeps its kind (:func:`autoshard.torchrec.mapping.torchrec_name`); row shards
    are laid out as TorchRec's runtime routes them: one even block per rank of the world (or of
    the node), in rank order (:func:`_rank_ordered_rows`, which rejects other layouts). A table
    keeps one compute kernel and cache load factor in TorchRec: its share of rows (of bytes,
    for column blocks) in HBM.
    """
    layout = check_layout(plan, task)
    g = layout.geometry
    by_place = {p.table: p for p in plan.placements}
    local = task.hardware.node_devices
    out = []
    for i, t in enumerate(task.tables):
        dtype = data_type(t)
        idx = np.flatnonzero(g.table == i)
        p = by_place[t.name]
        kernel, clf = kernel_of(p.sharding, g.rows[idx], g.cols[idx], layout.hbm_rows[idx],
                                t.rows)
        if not p.is_split:
            out.append(whole_table(t.name, t.rows, t.dim, dtype, p.device, kernel, clf))
            continue
        if p.sharding.replicated:
            shards = tuple(ShardSpec(int(layout.device[j]), 0, t.rows, 0, t.dim)
                           for j in idx[np.argsort(layout.device[idx])])
        elif not p.sharding.splits_rows:
            shards = tuple(ShardSpec(int(layout.device[j]), 0, t.rows, int(g.col_start[j]),
                                     int(g.cols[j])) for j in idx)
        else:  # row shards of each column block (one block unless a grid), in column order
            shards = ()
            for c in np.unique(g.col_start[idx]):
                block = idx[g.col_start[idx] == c]
                ranks = block_ranks(p.sharding, int(layout.device[block[0]]), local,
                                    task.num_devices)
                shards += _rank_ordered_rows(t.name, layout.device[block], g.rows[block],
                                             ranks, (int(c), int(g.cols[block[0]])))
        out.append(TableSharding(t.name, t.rows, t.dim, dtype, torchrec_name(p.sharding),
                                 kernel, clf, shards))
    return out


def to_plan(shardings: list[TableSharding], task: ShardingTask, sharder: str = "") -> Plan:
    """Our plan of TorchRec shardings (one per task table): each shard's rows, columns and
    rank, a cache of load factor f over a shard of n rows as its round(f * n) hottest rows in
    HBM; empty row shards dropped; shards by column block, then rows; each sharding type as its
    kind in our plans (:func:`autoshard.torchrec.mapping.kind_of`)."""
    by_name = {s.table: s for s in shardings}
    placements = []
    for t in task.tables:
        s = by_name.get(t.name)
        if s is None:
            raise PlannerError("invalid_plan", f"the TorchRec plan leaves table '{t.name}' out")
        pieces = tuple(Shard(x.rank, x.row_offset, x.row_offset + x.rows, x.col_offset,
                             x.col_offset + x.cols, s.shard_hbm_rows(x))
                       for x in sorted(s.shards, key=lambda x: (x.col_offset, x.row_offset))
                       if x.rows * x.cols > 0)
        if not s.kind.is_split:
            placements.append(Placement(t.name, pieces[0].device, pieces[0].hbm_rows))
        else:
            placements.append(Placement.split(t.name, s.kind, pieces))
    return Plan(tuple(placements), sharder, task.workload, task.hardware.name)


def from_parameter_sharding(table: str, ps: Any, rows: int, dim: int,
                            data_type: str) -> TableSharding:
    """A TorchRec ``ParameterSharding`` of a ``rows`` x ``dim`` table as a TableSharding.

    Raises:
        PlannerError: Its sharding type or compute kernel is not one our plans can hold.
    """
    if ps.sharding_type not in SHARDING_TYPES or ps.compute_kernel not in KERNELS:
        raise PlannerError("torchrec", f"table '{table}': TorchRec chose {ps.sharding_type} / "
                           f"{ps.compute_kernel}, which our plans cannot hold")
    clf = None
    if ps.compute_kernel == FUSED_UVM_CACHING:
        clf = getattr(ps.cache_params, "load_factor", None) if ps.cache_params else None
        clf = DEFAULT_CACHE_LOAD_FACTOR if clf is None else float(clf)
    if kind_of(ps.sharding_type).replicated:  # no sharding spec: a whole replica per rank
        shards = tuple(ShardSpec(int(r), 0, rows, 0, dim) for r in ps.ranks)
    else:
        shards = tuple(ShardSpec(int(m.placement.rank()), int(m.shard_offsets[0]),
                                 int(m.shard_sizes[0]), int(m.shard_offsets[1]),
                                 int(m.shard_sizes[1])) for m in ps.sharding_spec.shards)
    return TableSharding(table, rows, dim, data_type, ps.sharding_type, ps.compute_kernel, clf,
                         shards)


def _rank_ordered_rows(table: str, devices: np.ndarray, rows: np.ndarray, ranks: range,
                       cols: tuple[int, int]) -> tuple[ShardSpec, ...]:
    """Row shards holding columns ``cols`` (offset, width: every column, or a grid's column
    block) laid out as TorchRec's row-wise sharding routes them: one block per rank of
    ``ranks`` in rank order, of TorchRec's even sizes (:func:`even_blocks`).

    The plan must have one row shard on every rank (ids are hashed, so which rows a shard
    holds is immaterial, and its near-equal share becomes TorchRec's block, a few rows apart at
    most), or exactly TorchRec's sizes per rank (a plan converted from TorchRec's, whose empty
    blocks it drops).

    Raises:
        PlannerError: Any other layout (shards on some ranks only, two on one rank, uneven
            shares), which TorchRec's training runtime would route wrongly.
    """
    count = dict.fromkeys(ranks, 0)
    shards_on = dict.fromkeys(ranks, 0)
    for d, n in zip(devices.tolist(), rows.tolist(), strict=True):
        if d not in count:
            raise PlannerError("invalid_plan", f"table '{table}': row shards on devices "
                               f"{devices.tolist()} are not all on ranks {list(ranks)}")
        count[d] += n
        shards_on[d] += 1
    total = sum(count.values())
    even = even_blocks(total, len(ranks))
    spread = all(n == 1 for n in shards_on.values()) and max(count.values()) - min(
        count.values()) <= 1
    if not spread and list(count.values()) != even:
        raise PlannerError(
            "invalid_plan", f"table '{table}': row shards of {list(count.values())} rows on "
            f"ranks {list(ranks)}; TorchRec routes a row-wise table's ids in even blocks of "
            f"{even[0]} rows, one per rank of the world (table-row-wise: of one node), so it "
            f"needs one near-equal shard on each (plan for TorchRec: --overhead torchrec)")
    shards, offset = [], 0
    for r, n in zip(ranks, even, strict=True):
        shards.append(ShardSpec(r, offset, n, *cols))
        offset += n
    return tuple(shards)


def check_shards(s: TableSharding, world: int, local: int, where: str, field: str) -> None:
    """Checks that ``s``'s shards tile its table as its sharding type says, on ranks < world.

    Each type tiles as its kind (:func:`autoshard.torchrec.mapping.kind_of`) says: row splits
    split rows (each shard all columns), column splits columns (each shard all rows), a grid
    both (column blocks covering the columns, each block's row shards its rows), a whole table
    has one shard, and a node-local kind keeps each column block's shards in one node of
    ``local`` ranks. Row shards are TorchRec's even blocks, one per rank in rank order.

    Raises:
        InputError: The first shard that breaks this, its field named.
    """
    if not s.shards:
        raise InputError("no shards", source=where, field=f"{field}.shards")
    if s.rows < 1 or s.dim < 1:
        raise InputError("rows and dim must be >= 1", source=where, field=f"{field}.rows",
                         value=(s.rows, s.dim))
    for j, x in enumerate(s.shards):
        if not 0 <= x.rank < world:
            raise InputError(f"rank must be in [0, {world})", source=where,
                             field=f"{field}.shards[{j}].rank", value=x.rank)
    kind = s.kind
    if kind.replicated:
        _check_replicas(s, world, where, field)
        return
    if not kind.is_split and len(s.shards) != 1:
        raise InputError("a whole table has exactly one shard", source=where,
                         field=f"{field}.shards", value=len(s.shards))
    if not kind.splits_rows:
        _check_tiling(s, False, where, field)
        return
    for idx in _column_blocks(s, where, field):
        block = [s.shards[j] for j in idx]
        if kind.node_local and len({x.rank // local for x in block}) > 1:
            raise InputError(f"{s.sharding_type} shards must lie in one node of {local} ranks "
                             "(each column block's)", source=where, field=f"{field}.shards",
                             value=[x.rank for x in block])
        # TorchRec routes ids in even blocks, block r on the r-th rank in order.
        ranks = list(block_ranks(kind, block[0].rank, local, world))
        got = [(x.rank, x.rows) for x in sorted(block, key=lambda x: x.row_offset)]
        want = list(zip(ranks, even_blocks(s.rows, len(ranks)), strict=True))
        if got != want:
            raise InputError(f"{s.sharding_type} shards must be TorchRec's even blocks, one per "
                             f"rank in rank order: (rank, rows) {want}", source=where,
                             field=f"{field}.shards", value=got)


def _column_blocks(s: TableSharding, where: str, field: str) -> list[list[int]]:
    """The shards (indices) of each column block of a row-split table, in column order, each
    block's row shards checked to tile the rows: one block of every column, or a grid's
    blocks, checked to tile the columns.

    Raises:
        InputError: Blocks or row shards that leave a gap or overlap.
    """
    if not s.kind.splits_cols:
        _check_tiling(s, True, where, field)
        return [list(range(len(s.shards)))]
    blocks: dict[tuple[int, int], list[int]] = {}
    for j, x in enumerate(s.shards):
        blocks.setdefault((x.col_offset, x.cols), []).append(j)
    end = 0
    for (offset, cols), idx in sorted(blocks.items()):
        if offset != end or cols < 1:
            raise InputError(f"column blocks leave a gap or overlap at {min(offset, end)} of "
                             f"{s.dim}", source=where, field=f"{field}.shards[{idx[0]}]",
                             value=shard_doc(s.shards[idx[0]]))
        _check_tiling(s, True, where, field, idx, (offset, cols))
        end = offset + cols
    if end != s.dim:
        raise InputError(f"column blocks cover {end} of {s.dim}", source=where,
                         field=f"{field}.shards", value=len(s.shards))
    return [idx for _, idx in sorted(blocks.items())]


def _check_replicas(s: TableSharding, world: int, where: str, field: str) -> None:
    """A replicated table: one whole replica on each of the ``world`` ranks."""
    for j, x in enumerate(s.shards):
        if (x.row_offset, x.rows, x.col_offset, x.cols) != (0, s.rows, 0, s.dim):
            raise InputError(f"a {s.sharding_type} replica holds the whole table", source=where,
                             field=f"{field}.shards[{j}]", value=shard_doc(x))
    if sorted(s.ranks) != list(range(world)):
        raise InputError(f"{s.sharding_type} places one replica on each of the {world} ranks",
                         source=where, field=f"{field}.shards", value=s.ranks)


def _check_tiling(s: TableSharding, rows_split: bool, where: str, field: str,
                  idx: list[int] | None = None, full: tuple[int, int] | None = None) -> None:
    """Checks that the shards at ``idx`` (default: all) tile the table's rows (else columns),
    each holding ``full`` (offset, size; default all) of the other axis."""
    full = full or ((0, s.dim) if rows_split else (0, s.rows))
    extent = s.rows if rows_split else s.dim
    spans = []
    for j in range(len(s.shards)) if idx is None else idx:
        x = s.shards[j]
        along = (x.row_offset, x.rows) if rows_split else (x.col_offset, x.cols)
        across = (x.col_offset, x.cols) if rows_split else (x.row_offset, x.rows)
        if across != full or along[1] < (0 if rows_split else 1) or along[0] < 0:
            what = "row" if rows_split else "column"
            raise InputError(f"a {what} shard must span the table's other axis whole (a "
                             f"grid's shard: its column block; a column block holds at least "
                             f"one column)", source=where, field=f"{field}.shards[{j}]",
                             value=shard_doc(x))
        spans.append((along[0], along[0] + along[1], j))
    end = 0
    for lo, hi, j in sorted(spans):
        if lo != end:
            raise InputError(f"shards leave a gap or overlap at {min(lo, end)} of {extent}",
                             source=where, field=f"{field}.shards[{j}]",
                             value=shard_doc(s.shards[j]))
        end = hi
    if end != extent:
        raise InputError(f"shards cover {end} of {extent}", source=where,
                         field=f"{field}.shards", value=len(spans))
