"""The one featurisation of an embedding partition, shared by training and by planning.

A partition is the operator a plan issues for some rows of a table: the whole table, or the hot
or cold rows of a table split between tiers. :func:`partition_features` turns its description
into model features; :func:`dataset` turns microbenchmark rows into (features, latency, groups),
and :func:`task_partitions` describes the hot and cold partitions of a task's tables, so training
and planning go through the same function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from autoshard.access import GRID
from autoshard.errors import InputError
from autoshard.task import ShardingTask

TIER_CODES = {"host": 0, "hbm": 1, "uvm": 2, "uvm_caching": 3}
OP_CODES = {"torch": 0, "fbgemm": 1}
FEATURE_NAMES = (
    "log2_part_rows", "log2_lookups", "log2_distinct", "distinct_per_lookup",
    "lookups_per_bag", "log2_dim", "log2_batch", "bytes_per_element", "num_tables", "op",
    "train", "tier", "log2_part_bytes", "log2_work_bytes",
)
#: Column of :data:`FEATURE_NAMES` holding log2 of the bytes a partition moves; the learned
#: target is latency per work byte, so predictions scale with work beyond the measured range.
WORK_COLUMN = FEATURE_NAMES.index("log2_work_bytes")
REQUIRED_COLUMNS = ("config_id", "op", "dim", "batch", "num_tables", "dtype", "tier",
                    "part_rows", "lookups", "distinct_rows")
#: Statistic of a configuration's repeated timings that the model learns: ``p10`` (lower
#: decile: the operator's own cost, with less of the interference a shared machine adds, which
#: only ever adds time; measured twice, the default grid's p10 disagree by 7.1% MAPE, medians by
#: 12.2%) or ``median``.
STATS = {"median": ("fwd_ms", "bwd_ms"), "p10": ("fwd_p10_ms", "bwd_p10_ms")}
_BYTES = {"fp32": 4, "fp16": 2}


def work_bytes(lookups: ArrayLike, batch: ArrayLike, dim: ArrayLike,
               bytes_per_element: ArrayLike, num_tables: ArrayLike,
               train: ArrayLike) -> np.ndarray:
    """Bytes a partition moves per step: rows read plus pooled outputs written, per table,
    three passes in training (forward, backward, optimizer update)."""
    passes = np.where(np.asarray(train) > 0, 3.0, 1.0)
    return (np.asarray(num_tables) * (np.asarray(lookups) + np.asarray(batch))
            * np.asarray(dim) * np.asarray(bytes_per_element) * passes)


def partition_features(part_rows: ArrayLike, lookups: ArrayLike, distinct: ArrayLike,
                       dim: ArrayLike, batch: ArrayLike, bytes_per_element: ArrayLike,
                       num_tables: ArrayLike, op: ArrayLike, train: ArrayLike,
                       tier: ArrayLike) -> np.ndarray:
    """Feature matrix [N, len(FEATURE_NAMES)] of partitions (arguments broadcast together, then
    flattened in C order to N rows).

    Args:
        part_rows: Rows held by the partition's operator.
        lookups: Lookups per step and table that fall into the partition.
        distinct: Distinct rows of the partition touched per step and table.
        dim: Embedding dimension.
        batch: Bags (samples) per step.
        bytes_per_element: 4 for fp32, 2 for fp16.
        num_tables: Tables fused in the operator.
        op: Operator code (:data:`OP_CODES`).
        train: 1 for forward+backward+optimizer, 0 for forward only.
        tier: Memory tier code (:data:`TIER_CODES`).
    """
    arrays = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (
        part_rows, lookups, distinct, dim, batch, bytes_per_element, num_tables, op, train,
        tier)))
    rows, lk, dist, dim_, bat, bpe, nt, op_, tr, tier_ = (a.ravel() for a in arrays)
    work = work_bytes(lk, bat, dim_, bpe, nt, tr)
    return np.column_stack([
        np.log2(np.maximum(rows, 1.0)), np.log2(lk + 1.0), np.log2(dist + 1.0),
        dist / np.maximum(lk, 1.0), lk / bat, np.log2(dim_), np.log2(bat), bpe, nt, op_, tr,
        tier_, np.log2(np.maximum(rows, 1.0) * dim_ * bpe), np.log2(work),
    ])


def pool_repeats(frame: Any) -> Any:
    """One row per configuration: timings of a configuration measured in several sweeps (rows
    with the same ``config_id``) are pooled by their geometric mean."""
    if frame["config_id"].is_unique:
        return frame
    timing = [c for c in frame.columns if c.endswith("_ms")]
    logs = np.log(frame[timing].astype(float)).groupby(frame["config_id"]).mean()
    first = frame.drop_duplicates("config_id").set_index("config_id")
    first[timing] = np.exp(logs.loc[first.index].to_numpy())
    return first.reset_index()


def dataset(frame: Any, source: str = "<data>", stat: str = "p10"
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, latency ms, group ids) from microbenchmark rows (a pandas DataFrame).

    Each measured configuration gives two samples: inference (forward latency) and training
    (forward + backward-with-optimizer latency). Both share the configuration's group id, so a
    group split never separates them. Repeated measurements of a configuration are pooled first
    (:func:`pool_repeats`).

    Args:
        stat: Which timing statistic is the latency (:data:`STATS`).

    Raises:
        InputError: a required column is missing or holds an unknown value.
    """
    import pandas as pd

    if stat not in STATS:
        raise InputError(f"unknown statistic (choose from {', '.join(STATS)})", field="stat",
                         value=stat)
    df = frame if isinstance(frame, pd.DataFrame) else pd.DataFrame(frame)
    for col in (*REQUIRED_COLUMNS, *STATS[stat]):
        if col not in df.columns:
            raise InputError("missing column", source=source, field=col, value=None)
    for col, codes in (("op", OP_CODES), ("tier", TIER_CODES), ("dtype", _BYTES)):
        bad = sorted(set(df[col].astype(str)) - set(codes))
        if bad:
            raise InputError("unknown value", source=source, field=col, value=bad[0])
    for col in STATS[stat]:
        values = pd.to_numeric(df[col], errors="coerce")
        bad_rows = ~(np.isfinite(values) & (values > 0))
        if bad_rows.any():
            raise InputError("latency must be a number > 0", source=source, field=col,
                             value=df[col][bad_rows].iloc[0])
    df = pool_repeats(df)
    fwd, bwd = (df[c].to_numpy(float) for c in STATS[stat])
    xs, ys = [], []
    for train in (0, 1):
        xs.append(partition_features(
            df["part_rows"], df["lookups"], df["distinct_rows"], df["dim"], df["batch"],
            df["dtype"].map(_BYTES), df["num_tables"], df["op"].map(OP_CODES), train,
            df["tier"].map(TIER_CODES)))
        ys.append(fwd + bwd if train else fwd)
    groups = np.concatenate([df["config_id"].astype(str).to_numpy()] * 2)
    return np.vstack(xs), np.concatenate(ys), groups


@dataclass(frozen=True)
class TaskPartitions:
    """Hot and cold partitions of every table of a task at every split of :data:`GRID`.

    The split at grid point g holds the ``GRID[g]`` fraction of hottest rows in the hot
    partition. All arrays are shaped [T, len(GRID)].
    """

    hot_rows: np.ndarray
    hot_lookups: np.ndarray
    hot_distinct: np.ndarray
    cold_rows: np.ndarray
    cold_lookups: np.ndarray
    cold_distinct: np.ndarray


def task_partitions(task: ShardingTask) -> TaskPartitions:
    """Describes the two partitions of each table split at each grid point.

    Lookups per step are the table's lookups times the share served by the partition's rows.
    Distinct rows touched per step are estimated per grid segment as rows x (1 - exp(-lookups /
    rows)) (rows of a segment drawn about equally often), summed over the segments.
    """
    a = task.table_arrays
    rows = a.rows.astype(np.float64)[:, None]
    lookups = a.lookups[:, None]
    seg_rows = rows * np.diff(GRID)[None, :]
    seg_lookups = lookups * np.diff(a.curves, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        seg_distinct = np.where(seg_rows > 0,
                                seg_rows * -np.expm1(-seg_lookups / np.maximum(seg_rows, 1e-30)),
                                0.0)
    distinct = np.concatenate([np.zeros((rows.shape[0], 1)), np.cumsum(seg_distinct, axis=1)],
                              axis=1)
    hot_rows = np.floor(rows * GRID[None, :] + 1e-9)
    hot_lookups = lookups * a.curves
    return TaskPartitions(
        hot_rows=hot_rows, hot_lookups=hot_lookups, hot_distinct=distinct,
        cold_rows=rows - hot_rows, cold_lookups=np.maximum(lookups - hot_lookups, 0.0),
        cold_distinct=np.maximum(distinct[:, -1:] - distinct, 0.0))
