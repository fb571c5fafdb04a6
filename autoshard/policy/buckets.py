"""HBM-split buckets of the placement policy: how many of a table's hottest rows an action
keeps in HBM.

A bucket is a multiple of the task's HBM value threshold (the saving per HBM byte at which the
fractional relaxation behind :func:`autoshard.pricing.bounds.lower_bound_ms` fills the cluster's
HBM). Bucket ``m`` keeps the leading rows of the table's cost curve whose saving per byte is at
least ``m`` times that threshold: multiplier 1 reproduces the relaxation's split of the table,
larger multipliers keep fewer rows (leaving HBM to other tables), smaller ones more. The first
bucket keeps no row in HBM and the last keeps every row, so the two plain choices are always there.
Because the buckets are defined by value rather than by a fixed share of rows, one choice means
the same thing for a small hot table and a huge cold one, which is what a shared policy needs.
"""

from __future__ import annotations

import numpy as np

from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import table_cost_curves
from autoshard.task import ShardingTask

#: Threshold multipliers, from no row in HBM (inf) to all rows (0).
MULTIPLIERS: tuple[float, ...] = (float("inf"), 4.0, 2.0, 1.4, 1.0, 0.7, 0.5, 0.0)
#: Buckets of an action: the value buckets, then the environment's "fill" bucket (as many
#: hottest rows as the device's free HBM holds, which depends on the device and the moment).
N_BUCKETS = len(MULTIPLIERS) + 1


def bucket_rows(task: ShardingTask, cost_model: CostModel,
                multipliers: tuple[float, ...] = MULTIPLIERS) -> np.ndarray:
    """HBM rows of every table in every bucket, shape [T, len(multipliers)], int64.

    Rows are taken at the points of :func:`autoshard.pricing.curves.table_cost_curves` (device 0's
    curves, capped at its HBM capacity); a multiplier of 0 means all of the table's rows.
    """
    cost, used = table_cost_curves(task, cost_model, 0)
    threshold = value_threshold(cost, used, float(task.device_arrays.hbm_capacity.sum()))
    per_row = task.table_arrays.memory_bytes_per_row
    rows_at = np.rint(used / per_row[:, None]).astype(np.int64)
    saving = cost[:, :-1] - cost[:, 1:]
    extra = used[:, 1:] - used[:, :-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(extra > 0, saving / extra, np.inf)
    # A segment is worth its ratio only if every hotter segment is worth at least as much.
    worth = np.minimum.accumulate(ratio, axis=1)
    out = np.empty((task.num_tables, len(multipliers)), dtype=np.int64)
    all_rows = task.table_arrays.rows
    for b, m in enumerate(multipliers):
        if m == 0.0:
            out[:, b] = all_rows
        elif np.isinf(m):
            out[:, b] = 0
        else:
            # Only segments that save anything: when the cluster's HBM holds every useful
            # segment (threshold 0), a bucket keeps the used rows, not the never-touched ones.
            taken = ((worth >= m * threshold) & (worth > 0)).sum(axis=1)
            out[:, b] = rows_at[np.arange(task.num_tables), taken]
    return out


def value_threshold(cost: np.ndarray, used: np.ndarray, budget: float) -> float:
    """Saving per byte (ms per byte) of the last curve segment that fits when ``budget`` bytes
    of HBM are filled with the segments that save most per byte (the fractional relaxation of
    :func:`autoshard.pricing.bounds.lower_bound_ms`); 0.0 when every segment fits.

    Args:
        cost: Cost curves, ms, [T, G].
        used: Their HBM bytes, [T, G].
        budget: HBM bytes of the whole cluster.
    """
    saving = (cost[:, :-1] - cost[:, 1:]).ravel()
    extra = (used[:, 1:] - used[:, :-1]).ravel()
    useful = (extra > 0) & (saving > 0)
    ratio = saving[useful] / extra[useful]
    order = np.argsort(-ratio, kind="stable")
    over = np.flatnonzero(np.cumsum(extra[useful][order]) > budget)
    return float(ratio[order[over[0]]]) if over.size else 0.0
