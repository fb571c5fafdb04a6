"""Plans as TorchRec sharding plans, both ways, and the TorchRec objects they are checked against.

Every table becomes a ``ParameterSharding`` of the same geometry: a whole table ``table_wise`` on
its rank; column blocks ``column_wise``; row shards ``row_wise`` (one shard per rank of the world,
in rank order, as TorchRec's row-wise bucketing has them; ranks the plan gives no rows hold an
empty shard) or ``table_row_wise`` (the same over the ranks of one node). The HBM rows map onto
TorchRec's compute kernels:

- all rows in HBM: ``fused``;
- no row in HBM: ``fused_uvm`` (the table in host memory, reached over UVM);
- otherwise: ``fused_uvm_caching`` with cache load factor = the table's share of rows in HBM
  (an HBM cache of that many rows over the table in host memory). TorchRec has one load factor
  per table, so shards of one table that keep different shares in HBM are exported with their
  table's share.

Writing the description needs no TorchRec; turning it back into a ``ShardingPlan`` object
(:func:`load_sharding_plan`) and checking it (:func:`check_sharding_plan`) do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError, PlannerError
from autoshard.fileio import SCHEMA_VERSION, check_schema, read_structured, write_structured
from autoshard.memory import check_pipeline, pipeline_of
from autoshard.plan import COLUMN_WISE, ROW_WISE, Plan
from autoshard.tables import Table
from autoshard.task import ShardingTask

TORCHREC_EXTRA = ('pip install "autoshard[torchrec]" (torchrec 1.8.0 with fbgemm-gpu-cpu 1.8.0 '
                  "and torch 2.13 on CPU machines; fbgemm-gpu on GPU machines)")
FUSED, FUSED_UVM, FUSED_UVM_CACHING = "fused", "fused_uvm", "fused_uvm_caching"
KERNELS = (FUSED, FUSED_UVM, FUSED_UVM_CACHING)
#: TorchRec's cache load factor when a plan gives none (planner/constants.py UVM_CACHING_RATIO).
DEFAULT_CACHE_LOAD_FACTOR = 0.2
_DATA_TYPES = {4: "FP32", 2: "FP16", 1: "INT8"}


def torchrec_unavailable(load: bool = False) -> str | None:
    """Why TorchRec cannot be used here (None when it can).

    By default only checks that the packages are installed (fast: importing TorchRec takes
    seconds); with ``load`` imports them, which also catches native libraries that fail to load.
    """
    import importlib.util

    try:
        for name in ("fbgemm_gpu", "torchrec"):
            if importlib.util.find_spec(name) is None:
                raise ImportError(f"No module named '{name}'")
        if load:
            import fbgemm_gpu  # noqa: F401
            import torchrec.distributed.planner  # noqa: F401
    except Exception as exc:  # ImportError, or a native library that fails to load
        return f"install the torchrec extra: {TORCHREC_EXTRA} ({type(exc).__name__}: {exc})"
    return None


SHARDING_TYPES = ("table_wise", "row_wise", "table_row_wise", "column_wise",
                  "table_column_wise")
_ROW_SPLIT = ("row_wise", "table_row_wise")


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
        """Rows of ``shard`` in HBM: all (fused), none (fused_uvm) or its cache."""
        if self.compute_kernel == FUSED:
            return shard.rows
        if self.compute_kernel == FUSED_UVM:
            return 0
        return round((self.cache_load_factor or 0.0) * shard.rows)

    @property
    def hbm_rows(self) -> int:
        """Rows of the table in HBM (over its row shards; column blocks hold the same rows)."""
        if self.sharding_type not in _ROW_SPLIT:
            return self.shard_hbm_rows(self.shards[0])
        return sum(self.shard_hbm_rows(s) for s in self.shards)


def whole_table(name: str, rows: int, dim: int, data_type: str, rank: int, kernel: str,
                cache_load_factor: float | None) -> TableSharding:
    """A table-wise sharding: the whole table on ``rank``."""
    return TableSharding(name, rows, dim, data_type, "table_wise", kernel, cache_load_factor,
                         (ShardSpec(rank, 0, rows, 0, dim),))


def data_type(table: Table) -> str:
    """TorchRec's data type of a table's elements.

    Raises:
        InputError: Not 1, 2 or 4 bytes per element.
    """
    if table.bytes_per_element not in _DATA_TYPES:
        raise InputError("TorchRec tables hold 1, 2 or 4 bytes per element",
                         field=f"{table.name}.bytes_per_element", value=table.bytes_per_element)
    return _DATA_TYPES[table.bytes_per_element]


def table_shardings(plan: Plan, task: ShardingTask) -> list[TableSharding]:
    """The plan's tables as TorchRec shardings, in task order (validated against the task).

    Whole tables are ``table_wise``; column blocks ``column_wise``; row shards ``row_wise`` or
    ``table_row_wise`` as TorchRec's runtime routes them: one even block per rank of the world
    (or of the node), in rank order (:func:`_rank_ordered_rows`, which rejects other layouts).
    A table keeps one compute kernel and cache load factor in TorchRec: its share of rows (of
    bytes, for column blocks) in HBM.
    """
    from autoshard.shards import check_layout

    layout = check_layout(plan, task)
    g = layout.geometry
    by_place = {p.table: p for p in plan.placements}
    local = min(task.hardware.devices_per_node, task.num_devices)
    out = []
    for i, t in enumerate(task.tables):
        dtype = data_type(t)
        idx = np.flatnonzero(g.table == i)
        p = by_place[t.name]
        kernel, clf = table_kernel(g.rows[idx], g.cols[idx], layout.hbm_rows[idx], t.rows)
        if not p.is_split:
            out.append(whole_table(t.name, t.rows, t.dim, dtype, p.device, kernel, clf))
            continue
        if p.sharding == COLUMN_WISE:
            shards = tuple(ShardSpec(int(layout.device[j]), 0, t.rows, int(g.col_start[j]),
                                     int(g.cols[j])) for j in idx)
        else:
            ranks = (range(task.num_devices) if p.sharding == ROW_WISE else
                     _node_ranks(int(layout.device[idx[0]]), local, task.num_devices))
            shards = _rank_ordered_rows(t.name, layout.device[idx], g.rows[idx], ranks, t.dim)
        out.append(TableSharding(t.name, t.rows, t.dim, dtype, p.sharding, kernel, clf, shards))
    return out


def to_plan(shardings: list[TableSharding], task: ShardingTask, sharder: str = "") -> Plan:
    """Our plan of TorchRec shardings (one per task table): each shard's rows, columns and
    rank, a cache of load factor f over a shard of n rows as its round(f * n) hottest rows in
    HBM; empty row shards dropped; ``table_column_wise`` is column-wise in our plans."""
    from autoshard.plan import TABLE_WISE, Placement, Shard

    by_name = {s.table: s for s in shardings}
    placements = []
    for t in task.tables:
        s = by_name.get(t.name)
        if s is None:
            raise PlannerError("invalid_plan", f"the TorchRec plan leaves table '{t.name}' out")
        pieces = tuple(Shard(x.rank, x.row_offset, x.row_offset + x.rows, x.col_offset,
                             x.col_offset + x.cols, s.shard_hbm_rows(x))
                       for x in sorted(s.shards, key=lambda x: (x.row_offset, x.col_offset))
                       if x.rows * x.cols > 0)
        if s.sharding_type == TABLE_WISE:
            placements.append(Placement(t.name, pieces[0].device, pieces[0].hbm_rows))
        else:
            kind = COLUMN_WISE if s.sharding_type == "table_column_wise" else s.sharding_type
            placements.append(Placement.split(t.name, kind, pieces))
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
    shards = tuple(ShardSpec(int(m.placement.rank()), int(m.shard_offsets[0]),
                             int(m.shard_sizes[0]), int(m.shard_offsets[1]),
                             int(m.shard_sizes[1])) for m in ps.sharding_spec.shards)
    return TableSharding(table, rows, dim, data_type, ps.sharding_type, ps.compute_kernel, clf,
                         shards)


def table_kernel(rows: np.ndarray, cols: np.ndarray, hbm: np.ndarray, table_rows: int
                 ) -> tuple[str, float | None]:
    """One kernel and cache load factor for a table of ``table_rows`` rows whose shards
    (``rows`` x ``cols`` each) keep ``hbm`` rows in HBM: ``fused`` when all are in HBM,
    ``fused_uvm`` when none are, else ``fused_uvm_caching`` at the shards' share of bytes in
    HBM, kept within [1 / table_rows, 1 - 1 / table_rows]."""
    if (hbm >= rows).all():
        return FUSED, None
    if (hbm <= 0).all():
        return FUSED_UVM, None
    share = float((hbm * cols).sum()) / float((rows * cols).sum())
    return FUSED_UVM_CACHING, min(max(share, 1.0 / table_rows), 1.0 - 1.0 / table_rows)


def _node_ranks(rank: int, local: int, world: int) -> range:
    first = rank // local * local
    return range(first, min(first + local, world))


def even_blocks(rows: int, parts: int) -> list[int]:
    """TorchRec's row-wise shard sizes: ``parts`` blocks of ceil(rows / parts) rows in rank
    order, the last ones shorter or empty (its runtime sends id i to block i // that size)."""
    block = -(-rows // parts)
    return [min(block, max(rows - i * block, 0)) for i in range(parts)]


def _rank_ordered_rows(table: str, devices: np.ndarray, rows: np.ndarray, ranks: range,
                       dim: int) -> tuple[ShardSpec, ...]:
    """Row shards laid out as TorchRec's row-wise sharding routes them: one block per rank of
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
        shards.append(ShardSpec(r, offset, n, 0, dim))
        offset += n
    return tuple(shards)


def _shard_doc(s: ShardSpec) -> dict[str, int]:
    return {"rank": s.rank, "row_offset": s.row_offset, "rows": s.rows,
            "col_offset": s.col_offset, "cols": s.cols}


def export_doc(plan: Plan, task: ShardingTask) -> dict[str, Any]:
    """A JSON/YAML-ready description of the TorchRec ShardingPlan of ``plan``."""
    return {
        "schema_version": SCHEMA_VERSION, "kind": "torchrec_sharding_plan",
        "sharder": plan.sharder, "world_size": task.num_devices,
        "local_world_size": min(task.hardware.devices_per_node, task.num_devices),
        "device_type": "cuda", "module_path": "", "pipeline": pipeline_of(task.overhead),
        "tables": [{"table": s.table, "rows": s.rows, "dim": s.dim, "data_type": s.data_type,
                    "sharding_type": s.sharding_type, "compute_kernel": s.compute_kernel,
                    "cache_load_factor": s.cache_load_factor,
                    "shards": [_shard_doc(x) for x in s.shards]}
                   for s in table_shardings(plan, task)],
    }


def write_export(path: str | Path, plan: Plan, task: ShardingTask) -> dict[str, Any]:
    doc = export_doc(plan, task)
    write_structured(path, doc)
    return doc


def read_export(source: str | Path | dict[str, Any]) -> tuple[dict[str, Any],
                                                              list[TableSharding]]:
    """An exported description (a file or its parsed content) and its table shardings.

    Raises:
        InputError: A field is missing or malformed, a kernel or sharding type unknown, a rank
            outside the world, or shards that do not tile their table exactly (the field
            named).
    """
    where = str(source) if not isinstance(source, dict) else "<torchrec plan>"
    doc = read_structured(source) if not isinstance(source, dict) else source
    doc = check_schema(doc, "torchrec_sharding_plan", where)
    world = doc.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise InputError("must be an integer >= 1", source=where, field="world_size", value=world)
    local = doc.get("local_world_size") or world
    check_pipeline(doc.get("pipeline", "none"), "pipeline", where)
    out = []
    for i, t in enumerate(doc.get("tables") or []):
        s = _read_table(t, f"tables[{i}]", where)
        check_shards(s, world, int(local), where, f"tables[{i}]")
        out.append(s)
    if not out:
        raise InputError("no tables", source=where, field="tables")
    return doc, out


def _read_table(t: Any, field: str, where: str) -> TableSharding:
    try:
        rows, dim = int(t["rows"]), int(t["dim"])
        if "shards" in t:
            shards = tuple(ShardSpec(int(x["rank"]), int(x["row_offset"]), int(x["rows"]),
                                     int(x["col_offset"]), int(x["cols"]))
                           for x in t["shards"])
        else:  # table-wise descriptions written before shards were described
            shards = (ShardSpec(int(t["rank"]), 0, rows, 0, dim),)
        clf = t.get("cache_load_factor")
        s = TableSharding(str(t["table"]), rows, dim, str(t.get("data_type", "FP32")),
                          str(t.get("sharding_type", "table_wise")), str(t["compute_kernel"]),
                          None if clf is None else float(clf), shards)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"bad table entry ({exc})", source=where, field=field) from exc
    if s.compute_kernel not in KERNELS:
        raise InputError(f"compute kernel must be one of {', '.join(KERNELS)}",
                         source=where, field=f"{field}.compute_kernel", value=s.compute_kernel)
    if s.sharding_type not in SHARDING_TYPES:
        raise InputError(f"sharding type must be one of {', '.join(SHARDING_TYPES)}",
                         source=where, field=f"{field}.sharding_type", value=s.sharding_type)
    if s.compute_kernel == FUSED_UVM_CACHING and not 0 < (s.cache_load_factor or 0) < 1:
        raise InputError("fused_uvm_caching needs a cache load factor in (0, 1)",
                         source=where, field=f"{field}.cache_load_factor",
                         value=s.cache_load_factor)
    return s


def check_shards(s: TableSharding, world: int, local: int, where: str, field: str) -> None:
    """Checks that ``s``'s shards tile its table as its sharding type says, on ranks < world.

    Row-wise types split rows (each shard all columns), column-wise types split columns (each
    shard all rows); table-wise has one shard; table_row_wise keeps its shards in one node of
    ``local`` ranks, table_column_wise is column-wise by another name.

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
    if s.sharding_type == "table_wise" and len(s.shards) != 1:
        raise InputError("a table-wise table has exactly one shard", source=where,
                         field=f"{field}.shards", value=len(s.shards))
    rows_split = s.sharding_type in _ROW_SPLIT
    _check_tiling(s, rows_split, where, field)
    if s.sharding_type == "table_row_wise" and len({x.rank // local for x in s.shards}) > 1:
        raise InputError(f"table_row_wise shards must lie in one node of {local} ranks",
                         source=where, field=f"{field}.shards", value=s.ranks)
    if rows_split:  # TorchRec routes ids in even blocks, block r on the r-th rank in order
        ranks = (list(range(world)) if s.sharding_type == "row_wise" else
                 list(_node_ranks(s.shards[0].rank, local, world)))
        got = [(x.rank, x.rows) for x in sorted(s.shards, key=lambda x: x.row_offset)]
        want = list(zip(ranks, even_blocks(s.rows, len(ranks)), strict=True))
        if got != want:
            raise InputError(f"{s.sharding_type} shards must be TorchRec's even blocks, one per "
                             f"rank in rank order: (rank, rows) {want}", source=where,
                             field=f"{field}.shards", value=got)


def _check_tiling(s: TableSharding, rows_split: bool, where: str, field: str) -> None:
    full = (0, s.dim) if rows_split else (0, s.rows)
    extent = s.rows if rows_split else s.dim
    spans = []
    for j, x in enumerate(s.shards):
        along = (x.row_offset, x.rows) if rows_split else (x.col_offset, x.cols)
        across = (x.col_offset, x.cols) if rows_split else (x.row_offset, x.rows)
        if across != full or along[1] < (0 if rows_split else 1) or along[0] < 0:
            what = "row" if rows_split else "column"
            raise InputError(f"a {what} shard must span the table's other axis whole (a "
                             f"column block holds at least one column)", source=where,
                             field=f"{field}.shards[{j}]", value=_shard_doc(x))
        spans.append((along[0], along[0] + along[1], j))
    end = 0
    for lo, hi, j in sorted(spans):
        if lo != end:
            raise InputError(f"shards leave a gap or overlap at {min(lo, end)} of {extent}",
                             source=where, field=f"{field}.shards[{j}]",
                             value=_shard_doc(s.shards[j]))
        end = hi
    if end != extent:
        raise InputError(f"shards cover {end} of {extent}", source=where,
                         field=f"{field}.shards", value=len(s.shards))


def meta_collection(tables: list[tuple[str, int, int, str]]) -> Any:
    """A TorchRec EmbeddingBagCollection on the meta device (no memory) of (name, rows, dim,
    data type) tables, one feature per table named like the table."""
    import torch
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r,
                                  feature_names=[n], data_type=DataType[dt])
               for n, r, d, dt in tables]
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


def load_sharding_plan(source: str | Path | dict[str, Any]) -> Any:
    """The exported description as a ``torchrec.distributed.types.ShardingPlan``.

    Each table becomes a ``ParameterSharding`` with its sharding type, compute kernel, ranks, an
    ``EnumerableShardingSpec`` of its shards (offsets, sizes and placements as TorchRec's own
    ``construct_module_sharding_plan`` writes them) and its cache load factor.
    """
    reason = torchrec_unavailable(load=True)
    if reason:
        raise PlannerError("unavailable", reason)
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.sharding_plan import placement
    from torchrec.distributed.types import (
        CacheParams,
        EmbeddingModuleShardingPlan,
        ParameterSharding,
        ShardingPlan,
    )

    doc, shardings = read_export(source)
    local = int(doc.get("local_world_size") or doc["world_size"])
    device_type = str(doc.get("device_type", "cuda"))
    module_plan = EmbeddingModuleShardingPlan()
    for s in shardings:
        spec = EnumerableShardingSpec([
            ShardMetadata(shard_offsets=[x.row_offset, x.col_offset],
                          shard_sizes=[x.rows, x.cols],
                          placement=placement(device_type, x.rank, local))
            for x in s.shards])
        cache = (CacheParams(load_factor=s.cache_load_factor,
                             prefetch_pipeline=doc.get("pipeline") == "prefetch")
                 if s.compute_kernel == FUSED_UVM_CACHING else None)
        module_plan[s.table] = ParameterSharding(
            sharding_type=s.sharding_type, compute_kernel=s.compute_kernel, ranks=s.ranks,
            sharding_spec=spec, cache_params=cache)
    return ShardingPlan({str(doc.get("module_path", "")): module_plan})


def check_sharding_plan(plan: Any, module: Any, world_size: int,
                        local_world_size: int | None = None) -> None:
    """Checks a ShardingPlan against a module with TorchRec's sharder for it: every parameter
    planned, sharding type and compute kernel among those the sharder offers on CUDA, ranks in
    range, and shards tiling the parameter exactly as the sharding type says.

    Raises:
        PlannerError: The first mismatch found.
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    sharder = EmbeddingBagCollectionSharder()
    params = sharder.shardable_parameters(module)
    module_plan = plan.get_plan_for_module("")
    if module_plan is None or set(module_plan) != set(params):
        raise PlannerError("invalid_plan", "the TorchRec plan does not cover the module's "
                           "tables exactly")
    for name, ps in module_plan.items():
        allowed = sharder.compute_kernels(ps.sharding_type, "cuda")
        if ps.sharding_type not in sharder.sharding_types("cuda") or ps.compute_kernel not in (
                allowed):
            raise PlannerError("invalid_plan", f"table '{name}': {ps.sharding_type} with "
                               f"{ps.compute_kernel} is not offered (kernels: {allowed})")
        rows, dim = (int(v) for v in params[name].shape)
        metas = ps.sharding_spec.shards
        ranks = [int(m.placement.rank()) for m in metas]
        if list(ps.ranks) != ranks:
            raise PlannerError("invalid_plan", f"table '{name}': ranks {ps.ranks} differ from "
                               f"its shards' placements {ranks}")
        shards = tuple(ShardSpec(r, int(m.shard_offsets[0]), int(m.shard_sizes[0]),
                                 int(m.shard_offsets[1]), int(m.shard_sizes[1]))
                       for r, m in zip(ranks, metas, strict=True))
        try:
            check_shards(TableSharding(name, rows, dim, "FP32", ps.sharding_type,
                                       ps.compute_kernel, None, shards),
                         world_size, local_world_size or world_size, "<torchrec plan>",
                         name)
        except InputError as exc:
            raise PlannerError("invalid_plan", f"table '{name}': {exc.reason} "
                               f"(shape {[rows, dim]}, {world_size} ranks)") from exc
