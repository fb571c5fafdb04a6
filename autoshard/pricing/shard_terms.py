"""What a priced row of a shard task (:class:`autoshard.layout.shards.ShardTask`) adds to a table's
pricing: its share of the communication, the batch whose pooled outputs it writes, and a
replica's gradient all-reduce and dense update. A task of whole tables gets the whole table's
terms. The analytical model reads them (:mod:`autoshard.pricing.analytical`); the rules behind them
are the kinds' (:mod:`autoshard.layout.kinds`).
"""

from __future__ import annotations

import numpy as np

from autoshard.layout import kinds
from autoshard.layout.shards import ShardTask
from autoshard.task import ShardingTask


def comm_scales(task: ShardingTask, table_idx: np.ndarray) -> tuple[np.ndarray | float,
                                                                    np.ndarray | float]:
    """(all-to-all share, intra-node reduction share) of each priced row: (1, 0) for whole
    tables; a :class:`ShardTask`'s descriptor for shards."""
    if isinstance(task, ShardTask):
        assert task.a2a_scale is not None and task.reduce_scale is not None
        return task.a2a_scale[table_idx], task.reduce_scale[table_idx]
    return 1.0, 0.0


def batch_share(task: ShardingTask, table_idx: np.ndarray) -> np.ndarray | float:
    """Share of the batch whose pooled outputs each priced row writes: 1 for tables and
    shards (a row shard writes partial sums for every sample), 1/world for a replica (its
    device's own samples)."""
    if not isinstance(task, ShardTask):
        return 1.0
    assert task.geometry is not None
    codes = task.geometry.kind[np.asarray(table_idx)]
    return np.where(kinds.replicated(codes), 1.0 / task.num_devices, 1.0)


def replica_terms(task: ShardingTask, table_idx: np.ndarray) -> tuple[np.ndarray | float,
                                                                      np.ndarray | float]:
    """(bytes sent in the gradient all-reduce, HBM bytes of the dense update) of each priced
    row in a training step (:func:`autoshard.layout.kinds.replica_sync_bytes`): nonzero only for a
    :class:`ShardTask`'s replicas."""
    if not isinstance(task, ShardTask) or not task.workload.train:
        return 0.0, 0.0
    assert task.geometry is not None
    a = task.table_arrays
    t = np.asarray(table_idx)
    return kinds.replica_sync_bytes(task.geometry.kind[t], a.rows[t] * a.row_bytes[t],
                                    a.rows[t] * a.optimizer_bytes[t], task.num_devices)


__all__ = ["batch_share", "comm_scales", "replica_terms"]
