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

Each kind's rules are said here once and every other module asks: which axis it splits, which
share of its table's input ids a shard receives, whether its shards stay in one node, whether
they go one per device, and what share of the communication each shard carries. The rules are
also given over arrays of kind codes (:attr:`ShardingKind.code`, the form plans take inside
the sharders), so that thousands of shards are asked at once.
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

    @property
    def code(self) -> int:
        """The kind's index, as shard arrays hold it."""
        return _CODES[self]

    @property
    def is_split(self) -> bool:
        """Whether the table is cut into several shards."""
        return self is not ShardingKind.TABLE_WISE

    @property
    def splits_rows(self) -> bool:
        """Whether shards are row ranges holding every column."""
        return self in (ShardingKind.ROW_WISE, ShardingKind.TABLE_ROW_WISE)

    @property
    def splits_cols(self) -> bool:
        """Whether shards are column blocks holding every row."""
        return self is ShardingKind.COLUMN_WISE

    @property
    def node_local(self) -> bool:
        """Whether all of a table's shards live on one node."""
        return self is ShardingKind.TABLE_ROW_WISE

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


_BY_CODE = tuple(ShardingKind)
_CODES = {kind: i for i, kind in enumerate(_BY_CODE)}
#: Every kind's name, as plan files write it.
NAMES = tuple(kind.value for kind in ShardingKind)
#: The kind of a table placed whole.
WHOLE = ShardingKind.TABLE_WISE
#: The kinds that split a table.
SPLITS = tuple(kind for kind in ShardingKind if kind.is_split)


def split_kind(rows: bool, node_local: bool = False) -> ShardingKind:
    """The kind that splits a table by rows (else by columns), its shards in one node if
    ``node_local``."""
    return next(k for k in SPLITS if k.splits_rows == rows and k.node_local == node_local)


def _table(rule: str) -> np.ndarray:
    return np.array([getattr(kind, rule) for kind in _BY_CODE])


_SPLITS_ROWS = _table("splits_rows")
_SPLITS_COLS = _table("splits_cols")
_NODE_LOCAL = _table("node_local")


def splits_rows(codes: np.ndarray) -> np.ndarray:
    """Per kind code, whether its shards are row ranges."""
    return _SPLITS_ROWS[codes]


def splits_cols(codes: np.ndarray) -> np.ndarray:
    """Per kind code, whether its shards are column blocks."""
    return _SPLITS_COLS[codes]


def node_local(codes: np.ndarray) -> np.ndarray:
    """Per kind code, whether its shards all live on one node."""
    return _NODE_LOCAL[codes]


def id_parts(codes: np.ndarray, world: int, local: int) -> np.ndarray:
    """Over how many devices a table's input ids are divided, per kind code: the world's
    ``world`` for row ranges, the node's ``local`` for node-local row ranges, 1 otherwise (a
    whole table or a column block sees every lookup)."""
    codes = np.asarray(codes)
    rows = splits_rows(codes)
    return np.where(rows & node_local(codes), local, np.where(rows, world, 1))


def id_share(codes: np.ndarray, world: int, local: int) -> np.ndarray:
    """Share of its table's input ids each shard receives: 1 / :func:`id_parts`."""
    return 1.0 / id_parts(codes, world, local)


def one_per_device(codes: np.ndarray, fixed_row_blocks: bool) -> np.ndarray:
    """Per kind code, whether a table's shards go one per device: table-row-wise shards
    (within their node) and, where the runtime routes row splits in fixed blocks (one per
    device of the world), row-wise ones."""
    codes = np.asarray(codes)
    rows = splits_rows(codes)
    return rows & (node_local(codes) | fixed_row_blocks)


def comm_shares(codes: np.ndarray, parts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per shard, (its share of a whole table's all-to-all bytes, the share of a whole table's
    pooled output it sends over intra-node links). A table-row-wise table of k shards reduces
    its partial sums within the node, (k-1)/k over the intra-node links, and sends 1/k each
    through the all-to-all; every other shard sends its output through the all-to-all."""
    local = node_local(np.asarray(codes))
    k = np.asarray(parts, dtype=np.float64)
    return np.where(local, 1.0 / k, 1.0), np.where(local, (k - 1.0) / k, 0.0)
