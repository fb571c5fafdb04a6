"""Per-table constraints a user sets on a task: which sharding kinds a table may take, how much
of it must or may stay in HBM, and the narrowest column block.

They are what TorchRec's ``ParameterConstraints`` say in its terms (the TorchRec planner,
:mod:`autoshard.torchrec.autoshard_planner`, translates them): ``sharding_types`` become the allowed
kinds, ``compute_kernels`` and a cache's load factor the share of rows in HBM, and
``min_partition`` the narrowest column block. A task carries them; the split choice
(:mod:`autoshard.layout.splitting`) offers only the allowed kinds and splits a table that may not
stay whole, and :func:`autoshard.search.enforce.enforce` brings any plan's HBM rows within the
bounds, water-filling the other tables' HBM around them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from autoshard.errors import InputError
from autoshard.layout.kinds import WHOLE, ShardingKind


@dataclass(frozen=True)
class TableConstraint:
    """What one table may be.

    Args:
        kinds: The kinds it may take (None: any).
        hbm_share: The least and most share of its rows kept in HBM, on every shard
            (``(1, 1)``: all rows in HBM; ``(0, 0)``: none; ``(f, f)``: a cache of that size).
        min_cols: The narrowest column block it may be cut into.
    """

    kinds: frozenset[ShardingKind] | None = None
    hbm_share: tuple[float, float] = (0.0, 1.0)
    min_cols: int = 1

    def __post_init__(self) -> None:
        low, high = self.hbm_share
        if not (0.0 <= low <= high <= 1.0):
            raise InputError("must be shares with 0 <= least <= most <= 1",
                             field="hbm_share", value=self.hbm_share)
        if self.kinds is not None and not self.kinds:
            raise InputError("allows no sharding kind", field="kinds", value=[])
        if self.min_cols < 1:
            raise InputError("must be >= 1", field="min_cols", value=self.min_cols)

    def allows(self, kind: ShardingKind) -> bool:
        return self.kinds is None or kind in self.kinds

    @property
    def bounds_hbm(self) -> bool:
        """Whether it bounds the share of rows in HBM at all."""
        return self.hbm_share != (0.0, 1.0)

    def hbm_rows(self, rows: np.ndarray, hbm_rows: np.ndarray) -> np.ndarray:
        """``hbm_rows`` of shards of ``rows`` rows brought within the share bounds."""
        low, high = self.hbm_share
        least = np.ceil(low * rows - 1e-9).astype(np.int64)
        most = np.floor(high * rows + 1e-9).astype(np.int64)
        return np.clip(hbm_rows, least, most)


NO_CONSTRAINT = TableConstraint()


@dataclass(frozen=True)
class Constraints:
    """Per-table constraints of a task, by table name (tables not named are free)."""

    tables: Mapping[str, TableConstraint] = field(default_factory=dict, hash=False)

    def of(self, name: str) -> TableConstraint:
        return self.tables.get(name, NO_CONSTRAINT)

    def __bool__(self) -> bool:
        return any(c != NO_CONSTRAINT for c in self.tables.values())

    def must_split(self, name: str) -> bool:
        """Whether the table may not stay whole."""
        return not self.of(name).allows(WHOLE)


NO_CONSTRAINTS = Constraints()


def cols_allowed(constraint: TableConstraint, dim: int, parts: int) -> bool:
    """Whether ``parts`` equal column blocks of a ``dim``-wide table are wide enough."""
    return math.floor(dim / parts) >= constraint.min_cols
