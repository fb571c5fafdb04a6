"""Our plans in TorchRec's terms: its sharding types, compute kernels and data types.

Every name TorchRec gives a sharding kind, a kernel or an element type is said here once:

- sharding types: each of our kinds (:mod:`autoshard.layout.kinds`) is the TorchRec sharding type of
  the same name; TorchRec's ``table_column_wise`` (column blocks over one node's ranks) is
  column-wise in our plans;
- ``data_parallel`` tables (replicated) use the ``dense`` kernel, every row in HBM;
- compute kernels, from a table's rows in HBM: all of them ``fused``; none ``fused_uvm`` (the
  table in host memory, reached over UVM); otherwise ``fused_uvm_caching`` with cache load
  factor = the share of rows (of bytes, for column blocks) in HBM: an HBM cache of that many
  rows over the table in host memory. TorchRec has one load factor per table;
- row blocks: TorchRec's runtime routes a row-split table's ids in even blocks, one per rank of
  the world (of the node, for the node-local kinds: a table-row-wise table's, a grid's column
  block's), block r on the r-th rank;
- ``grid_shard``: TorchRec's planner enumerates it only for tables whose constraints name it
  (:data:`NAMED_ONLY`); its column blocks are TorchRec's column-wise block width
  (:func:`column_block_cols`), each row-sharded over one host's ranks.
"""

from __future__ import annotations

import numpy as np

from autoshard.errors import InputError
from autoshard.layout.kinds import REPLICATED, WHOLE, ShardingKind
from autoshard.tables import Table

#: TorchRec's name of each of our sharding kinds.
SHARDING_NAMES = {ShardingKind.TABLE_WISE: "table_wise", ShardingKind.ROW_WISE: "row_wise",
                  ShardingKind.TABLE_ROW_WISE: "table_row_wise",
                  ShardingKind.COLUMN_WISE: "column_wise",
                  ShardingKind.DATA_PARALLEL: "data_parallel",
                  ShardingKind.GRID_SHARD: "grid_shard"}
#: TorchRec's sharding types our plans hold, and the kind each is in our plans.
_KINDS = {**{name: kind for kind, name in SHARDING_NAMES.items()},
          "table_column_wise": ShardingKind.COLUMN_WISE}
SHARDING_TYPES = tuple(_KINDS)
#: TorchRec's sharding type of column blocks that all lie in one node (column-wise in ours).
NODE_COLUMN_TYPE = "table_column_wise"
#: TorchRec's name of a table placed whole, and of a replicated one.
WHOLE_TYPE = SHARDING_NAMES[WHOLE]
REPLICATED_TYPE = SHARDING_NAMES[REPLICATED]
#: TorchRec's grid sharding type (column blocks, each row-sharded over one host's ranks).
GRID_TYPE = SHARDING_NAMES[ShardingKind.GRID_SHARD]
#: The sharding types TorchRec's planner enumerates only for tables whose
#: ``ParameterConstraints.sharding_types`` name them (planner/enumerators.py
#: ``_filter_sharding_types``).
NAMED_ONLY = (GRID_TYPE,)
#: TorchRec's abbreviation of each sharding type in its planner's statistics table
#: (planner/stats.py ``_get_sharding_type_abbr``).
ABBREVIATIONS = {REPLICATED_TYPE: "DP", WHOLE_TYPE: "TW",
                 SHARDING_NAMES[ShardingKind.COLUMN_WISE]: "CW",
                 SHARDING_NAMES[ShardingKind.ROW_WISE]: "RW",
                 SHARDING_NAMES[ShardingKind.TABLE_ROW_WISE]: "TWRW", NODE_COLUMN_TYPE: "TWCW",
                 GRID_TYPE: "GS"}
#: TorchRec's narrowest column block when a table's constraints give no ``min_partition``
#: (planner/constants.py ``MIN_CW_DIM``).
MIN_BLOCK_COLS = 128

FUSED, FUSED_UVM, FUSED_UVM_CACHING = "fused", "fused_uvm", "fused_uvm_caching"
#: The kernel of a replicated (data-parallel) table: plain dense weights in HBM.
DENSE = "dense"
KERNELS = (FUSED, FUSED_UVM, FUSED_UVM_CACHING, DENSE)
#: TorchRec's cache load factor when a plan gives none (planner/constants.py UVM_CACHING_RATIO).
DEFAULT_CACHE_LOAD_FACTOR = 0.2
_DATA_TYPES = {4: "FP32", 2: "FP16", 1: "INT8"}


def torchrec_name(kind: ShardingKind) -> str:
    """TorchRec's sharding type of ``kind``."""
    return SHARDING_NAMES[kind]


def kind_of(sharding_type: str) -> ShardingKind:
    """Our kind of TorchRec's ``sharding_type`` (one of :data:`SHARDING_TYPES`)."""
    return _KINDS[sharding_type]


def data_type(table: Table) -> str:
    """TorchRec's data type of a table's elements.

    Raises:
        InputError: Not 1, 2 or 4 bytes per element.
    """
    if table.bytes_per_element not in _DATA_TYPES:
        raise InputError("TorchRec tables hold 1, 2 or 4 bytes per element",
                         field=f"{table.name}.bytes_per_element", value=table.bytes_per_element)
    return _DATA_TYPES[table.bytes_per_element]


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


def kernel_of(kind: ShardingKind, rows: np.ndarray, cols: np.ndarray, hbm: np.ndarray,
              table_rows: int) -> tuple[str, float | None]:
    """The kernel and cache load factor of a table of ``kind``: :data:`DENSE` for a
    replicated one, else :func:`table_kernel`."""
    if kind.replicated:
        return DENSE, None
    return table_kernel(rows, cols, hbm, table_rows)


def host_share(kernel: str, cache_load_factor: float | None) -> float:
    """Share of a table's rows in host memory under ``kernel``."""
    if kernel in (FUSED, DENSE):
        return 0.0
    if kernel == FUSED_UVM:
        return 1.0
    return 1.0 - float(cache_load_factor or 0.0)


def even_blocks(rows: int, parts: int) -> list[int]:
    """TorchRec's row-wise shard sizes: ``parts`` blocks of ceil(rows / parts) rows in rank
    order, the last ones shorter or empty (its runtime sends id i to block i // that size)."""
    block = -(-rows // parts)
    return [min(block, max(rows - i * block, 0)) for i in range(parts)]


def column_block_cols(dim: int, min_cols: int = MIN_BLOCK_COLS) -> int:
    """TorchRec's column block width for a ``dim``-wide table, from its narrowest block
    ``min_cols`` (sharding_plan.py ``_get_block_size_for_cw_shard``): the least divisor of
    ``dim`` from ``min_cols`` up that is a multiple of 4, else ``dim``."""
    return next((i for i in range(min_cols, dim) if dim % i == 0 and i % 4 == 0), dim)


def block_ranks(kind: ShardingKind, rank: int, local: int, world: int) -> range:
    """The ranks TorchRec lays a row-split table's (or a grid's column block's) row blocks
    on: every rank of the world, or for the node-local kinds every rank of the node holding
    ``rank``."""
    if not kind.node_local:
        return range(world)
    first = rank // local * local
    return range(first, min(first + local, world))
