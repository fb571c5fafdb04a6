"""Sharding kinds: how a table is cut into shards, and every rule that depends on the kind.

A table is placed whole (``table_wise``: one device) or split into shards:

- ``row_wise``: row ranges covering ``[0, rows)``, every column, on several devices. Ids are
  hashed, so each shard sees its share of the lookups and the table's access curve; it writes
  partial pooled sums of the full dim, reduced across the table's devices over the all-to-all
  like a whole table's output, forward and backward.
- ``table_row_wise``: row-wise with every shard on one node; the partial sums are first
  reduce-scattered within the node over intra-node links, then only a 1/k part of the output
  goes through the all-to-all.
- ``column_wise``: column blocks covering ``[0, dim)``, every row; each block sees every lookup
  and sends its block of the pooled output through the all-to-all.
- ``grid_shard``: rectangles: the columns cut into blocks, and each block cut into row ranges
  over the devices of one node, one on each, like a table-row-wise table of its own (TorchRec's
  grid sharding); different blocks may live on different nodes. Each shard receives 1/local of
  the ids, and a block's partial sums are reduce-scattered within its node, then 1/k of them go
  through the all-to-all.
- ``data_parallel``: the whole table replicated, one replica on every device, all its rows in
  HBM. Each replica serves its own device's share of the batch (1/world of the lookups) and
  sends nothing through the all-to-all; in training the replicas' gradients are all-reduced and
  every replica updates the whole table (:func:`replica_sync_bytes`).

Each kind's rules are said here once and every other module asks: which axes it splits, which
share of its table's input ids a shard receives, whether its shards (each column block's) stay
in one node, whether they go one per device (and fill their node whatever the runtime), and
what share of the communication each shard carries. The rules are also given over arrays of
kind codes (:attr:`ShardingKind.code`, the form plans take inside the sharders), so that
thousands of shards are asked at once.
"""

from __future__ import annotations

from enum import Enum

import numpy as np

from autoshard.errors import InputError


class ShardingKind(Enum):
    """How a table is split; the value is its name in plan files."""

    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    COLUMN_WISE = "column_wise"
    DATA_PARALLEL = "data_parallel"
    GRID_SHARD = "grid_shard"

    @property
    def code(self) -> int:
        """The kind's index, as shard arrays hold it."""
        return _CODES[self]

    @property
    def is_split(self) -> bool:
        """Whether the table is cut into several shards."""
        return self is not ShardingKind.TABLE_WISE

    @property
    def replicated(self) -> bool:
        """Whether every device holds the whole table (one shard per device, every row in HBM)."""
        return self is ShardingKind.DATA_PARALLEL

    @property
    def splits_rows(self) -> bool:
        """Whether shards cut the table's rows: row ranges (holding every column, unless the
        kind also :attr:`splits_cols`)."""
        return self in (ShardingKind.ROW_WISE, ShardingKind.TABLE_ROW_WISE,
                        ShardingKind.GRID_SHARD)

    @property
    def splits_cols(self) -> bool:
        """Whether shards cut the table's columns: column blocks (holding every row, unless the
        kind also :attr:`splits_rows`)."""
        return self in (ShardingKind.COLUMN_WISE, ShardingKind.GRID_SHARD)

    @property
    def node_local(self) -> bool:
        """Whether each column block's shards live on one node (all of a table's shards, where
        its columns are not cut)."""
        return self in (ShardingKind.TABLE_ROW_WISE, ShardingKind.GRID_SHARD)

    @property
    def fills_node(self) -> bool:
        """Whether each column block's row shards go one on each device of its node, whatever
        the runtime (TorchRec's grid: a block row-sharded over a host's local ranks)."""
        return self is ShardingKind.GRID_SHARD

    @property
    def abbreviation(self) -> str:
        """The kind's short name in listings (TorchRec's abbreviations: TW, RW, TWRW, CW, DP;
        GRID for its grid sharding)."""
        return _ABBREVIATIONS[self]

    @classmethod
    def parse(cls, value: object, field: str = "sharding", source: str | None = None
              ) -> ShardingKind:
        """The kind named ``value``.

        Raises:
            InputError: Not a kind's name, naming ``field`` and the names known.
        """
        for kind in cls:
            if value == kind.value:
                return kind
        raise InputError(f"must be one of {', '.join(NAMES)}", source=source, field=field,
                         value=value)

    @classmethod
    def of(cls, code: int | np.integer) -> ShardingKind:
        """The kind whose :attr:`code` is ``code``."""
        return _BY_CODE[int(code)]


_ABBREVIATIONS = {ShardingKind.TABLE_WISE: "TW", ShardingKind.ROW_WISE: "RW",
                  ShardingKind.TABLE_ROW_WISE: "TWRW", ShardingKind.COLUMN_WISE: "CW",
                  ShardingKind.DATA_PARALLEL: "DP", ShardingKind.GRID_SHARD: "GRID"}
_BY_CODE = tuple(ShardingKind)
_CODES = {kind: i for i, kind in enumerate(_BY_CODE)}
#: Every kind's name, as plan files write it.
NAMES = tuple(kind.value for kind in ShardingKind)
#: The kind of a table placed whole.
WHOLE = ShardingKind.TABLE_WISE
#: The kinds that split a table.
SPLITS = tuple(kind for kind in ShardingKind if kind.is_split and not kind.replicated)
#: The kind that replicates a table on every device.
REPLICATED = ShardingKind.DATA_PARALLEL


def split_kind(rows: bool, node_local: bool = False, cols: bool | None = None
               ) -> ShardingKind:
    """The kind that splits a table by rows if ``rows``, by columns if ``cols`` (default: not
    ``rows``; both: rectangles), each column block's shards in one node if ``node_local``."""
    by_cols = not rows if cols is None else cols
    return next(k for k in SPLITS if k.splits_rows == rows and k.splits_cols == by_cols
                and k.node_local == node_local)


def _table(rule: str) -> np.ndarray:
    return np.array([getattr(kind, rule) for kind in _BY_CODE])


_SPLITS_ROWS = _table("splits_rows")
_SPLITS_COLS = _table("splits_cols")
_NODE_LOCAL = _table("node_local")
_FILLS_NODE = _table("fills_node")
_REPLICATED = _table("replicated")


def splits_rows(codes: np.ndarray) -> np.ndarray:
    """Per kind code, whether its shards are row ranges."""
    return _SPLITS_ROWS[codes]


def splits_cols(codes: np.ndarray) -> np.ndarray:
    """Per kind code, whether its shards are column blocks."""
    return _SPLITS_COLS[codes]


def node_local(codes: np.ndarray) -> np.ndarray:
    """Per kind code, whether each column block's shards live on one node."""
    return _NODE_LOCAL[codes]


def fills_node(codes: np.ndarray) -> np.ndarray:
    """Per kind code, whether each column block's shards go one on each device of its node
    whatever the runtime (so they stay where they are placed)."""
    return _FILLS_NODE[codes]


def replicated(codes: np.ndarray) -> np.ndarray:
    """Per kind code, whether its shards are replicas of the whole table."""
    return _REPLICATED[codes]


def id_parts(codes: np.ndarray, world: int, local: int) -> np.ndarray:
    """Over how many devices a table's input ids are divided, per kind code: the world's
    ``world`` for row ranges and replicas (each serves its own device's share of the batch),
    the node's ``local`` for node-local row ranges (a grid shard's too: its block's ids are
    divided over its node), 1 otherwise (a whole table or a column block sees every
    lookup)."""
    codes = np.asarray(codes)
    rows = splits_rows(codes)
    return np.where(rows & node_local(codes), local,
                    np.where(rows | replicated(codes), world, 1))


def id_share(codes: np.ndarray, world: int, local: int) -> np.ndarray:
    """Share of its table's input ids each shard receives: 1 / :func:`id_parts`."""
    return 1.0 / id_parts(codes, world, local)


def one_per_device(codes: np.ndarray, fixed_row_blocks: bool) -> np.ndarray:
    """Per kind code, whether a table's shards go one per device: replicas (one on every
    device), node-local row shards (table-row-wise ones, a grid's of each column block: within
    their node) and, where the runtime routes row splits in fixed blocks (one per device of the
    world), row-wise ones."""
    codes = np.asarray(codes)
    rows = splits_rows(codes)
    return (rows & (node_local(codes) | fixed_row_blocks)) | replicated(codes)


def comm_shares(codes: np.ndarray, row_parts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per shard, (its share of its own pooled output's all-to-all bytes, the share of that
    output it sends over intra-node links), given the ``row_parts`` k of its column block (the
    row shards that hold the block's columns). A node-local block of k row shards
    (table-row-wise: the whole table; a grid: each column block) reduces its partial sums
    within the node, (k-1)/k over the intra-node links, and sends 1/k each through the
    all-to-all; a replica sends nothing (its device's own batch stays there); every other
    shard sends its output through the all-to-all."""
    codes = np.asarray(codes)
    local = node_local(codes)
    k = np.asarray(row_parts, dtype=np.float64)
    a2a = np.where(replicated(codes), 0.0, np.where(local, 1.0 / k, 1.0))
    return a2a, np.where(local, (k - 1.0) / k, 0.0)


def replica_sync_bytes(codes: np.ndarray, weight_bytes: np.ndarray, optimizer_bytes: np.ndarray,
                       world: int) -> tuple[np.ndarray, np.ndarray]:
    """Per shard, in a training step, (bytes it sends in the all-reduce of its table's
    gradient, bytes its device's HBM moves to update it): for a replica of ``weight_bytes``
    (the whole table) a ring all-reduce sends 2 (world - 1) / world of the gradient, and the
    dense update reads the gradient, the weights and the optimizer state (``optimizer_bytes``)
    and writes the weights and the state back; 0 for other shards (their sparse update is
    priced with their lookups)."""
    rep = replicated(np.asarray(codes))
    w = np.asarray(weight_bytes, dtype=np.float64)
    ring = 2.0 * (world - 1) / world * w
    update = 3.0 * w + 2.0 * np.asarray(optimizer_bytes, dtype=np.float64)
    return np.where(rep, ring, 0.0), np.where(rep, update, 0.0)
