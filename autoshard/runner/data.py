"""Lookups for a measured run: synthetic (from table statistics) or from a DLRM trace.

Traces are read with :func:`autoshard.stats.readers.dlrm.load_trace`.

Row ids are *popularity ranks*: row 0 is the hottest, so a plan's ``hbm_rows = k`` means rows
``[0, k)`` live in the fast tier. Synthetic lookups are drawn that way; trace lookups are renumbered
hottest first by their counts in the trace, as a deployment pinning hot rows would do.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from autoshard.errors import InputError
from autoshard.runner.config import RunConfig, ShardTable
from autoshard.tables import Table

if TYPE_CHECKING:
    from autoshard.stats.readers.dlrm import Trace


@dataclass(frozen=True)
class TableBatch:
    """One table's lookups for one batch: ``lengths[b]`` ids per sample, concatenated."""

    indices: np.ndarray  # int64, popularity-ranked row ids
    lengths: np.ndarray  # int64 [B]


def synthetic_batch(table: Table, batch_size: int, rng: np.random.Generator) -> TableBatch:
    """Draws a batch from a table's statistics.

    A sample holds the feature with probability ``coverage``; then it looks up
    ``pooling_factor`` rows on average (normal with ``pooling_std`` when measured, else
    1 + Poisson(pooling_factor - 1)), each drawn from the table's access curve (measured, Zipf or
    uniform over the used rows), so the mean is ``lookups_per_sample`` as the cost models assume.
    """
    pf = table.pooling_factor
    if table.pooling_std:
        counts = np.maximum(np.rint(rng.normal(pf, table.pooling_std, batch_size)), 1)
    else:
        counts = 1 + rng.poisson(max(pf - 1.0, 0.0), batch_size)
    present = rng.random(batch_size) < table.coverage
    lengths = np.where(present, counts, 0).astype(np.int64)
    return TableBatch(sample_rows(table, int(lengths.sum()), rng), lengths)


def sample_rows(table: Table, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` row ids drawn by inverse transform of the table's access curve."""
    curve = table.access_curve()
    x = np.asarray(curve.row_fraction)
    y = np.asarray(curve.lookup_share)
    u = rng.random(count)
    j = np.clip(np.searchsorted(y, u, side="right") - 1, 0, len(y) - 2)
    width = y[j + 1] - y[j]
    frac = x[j] + np.divide(u - y[j], width, out=np.zeros_like(u), where=width > 0) * (
        x[j + 1] - x[j])
    return np.minimum((frac * table.rows).astype(np.int64), table.rows - 1)


def rank_rows(batch: TableBatch, table: Table, source: str = "<trace>") -> TableBatch:
    """Renumbers a trace table's row ids hottest first (ties by row id)."""
    if batch.indices.size and int(batch.indices.max()) >= table.rows:
        raise InputError(f"row id beyond table '{table.name}' ({table.rows} rows)",
                         source=source, field="indices", value=int(batch.indices.max()))
    counts = np.bincount(batch.indices, minlength=table.rows)
    order = np.argsort(-counts, kind="stable")
    rank = np.empty(table.rows, dtype=np.int64)
    rank[order] = np.arange(table.rows)
    return TableBatch(rank[batch.indices], batch.lengths)


def trace_batches(trace: Trace, table: Table, position: int, batch_size: int,
                  count: int, source: str) -> list[TableBatch]:
    """Up to ``count`` consecutive batches of ``batch_size`` samples of one trace table."""
    if batch_size > trace.batch_size:
        raise InputError(f"batch size is larger than the trace's {trace.batch_size} samples",
                         source=source, field="batch_size", value=batch_size)
    indices, lengths = trace.table(position)
    ranked = rank_rows(TableBatch(np.asarray(indices, dtype=np.int64),
                                  np.asarray(lengths, dtype=np.int64)), table, source)
    starts = np.concatenate(([0], np.cumsum(ranked.lengths)))
    out = []
    for i in range(min(count, trace.batch_size // batch_size)):
        a, b = i * batch_size, (i + 1) * batch_size
        out.append(TableBatch(ranked.indices[starts[a]:starts[b]], ranked.lengths[a:b]))
    return out


def global_batches(tables: Sequence[Table], positions: Sequence[int], config: RunConfig
                   ) -> list[list[TableBatch]]:
    """The distinct global batches of ``tables`` (outer: table, inner: batch), as every rank
    draws them: from the trace (table ``positions[i]`` of it), else synthetic, seeded by the run's
    seed and the table's position, so that every piece of a table, on any rank, sees the same
    lookups."""
    count = min(config.distinct_batches, config.warmup + config.iterations)
    if config.trace:
        from autoshard.stats.readers.dlrm import load_trace

        trace = load_trace(config.trace)
        return [trace_batches(trace, t, p, config.batch_size, count, config.trace)
                for t, p in zip(tables, positions, strict=True)]
    out = []
    for t, p in zip(tables, positions, strict=True):
        rng = np.random.default_rng([config.seed, p])
        out.append([synthetic_batch(t, config.batch_size, rng) for _ in range(count)])
    return out


@dataclass(frozen=True)
class TierInput:
    """One table's lookups that fall in one tier, in the tier's local row numbering."""

    indices: np.ndarray  # local row ids (global id - first row of the tier)
    offsets: np.ndarray  # [B + 1] bag boundaries
    bags: np.ndarray  # sample of each lookup


def split_tier(batch: TableBatch, first_row: int, end_row: int) -> TierInput:
    """The lookups of ``batch`` with row ids in ``[first_row, end_row)``."""
    bags = np.repeat(np.arange(batch.lengths.size, dtype=np.int64), batch.lengths)
    keep = (batch.indices >= first_row) & (batch.indices < end_row)
    counts = np.bincount(bags[keep], minlength=batch.lengths.size)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    return TierInput(batch.indices[keep] - first_row, offsets, bags[keep])


#: Seed of the id hash that spreads a table's rows over its row shards (the same on every rank).
_HASH_SEED = 0x5EED


def shard_lookups(batch: TableBatch, shard: ShardTable) -> TableBatch:
    """The lookups of a table's batch that one shard serves, in the shard's own popularity order.

    A column block serves every lookup. A row shard holds a range of the table's *hashed* id
    space, as a row-wise sharded table does: ids are hashed by a fixed permutation of the
    table's rows (so each shard receives its share of hot and cold rows alike, the table's
    access curve, as the cost model assumes), and renumbered within the shard hottest first, so
    that its ``hbm_rows`` hottest rows are its rows ``[0, hbm_rows)``.
    """
    if not shard.row_split:
        return batch
    local = _local_rows(shard.position, shard.table_rows, shard.row_start,
                        shard.row_start + shard.rows)
    ids = local[batch.indices]
    keep = ids >= 0
    bags = np.repeat(np.arange(batch.lengths.size, dtype=np.int64), batch.lengths)
    return TableBatch(ids[keep], np.bincount(bags[keep], minlength=batch.lengths.size
                                             ).astype(np.int64))


def own_samples(batch: TableBatch, start: int, end: int) -> TableBatch:
    """The lookups of samples ``[start, end)`` of ``batch``: what a replica pools on the rank
    whose block of the global batch they are."""
    edges = np.concatenate(([0], np.cumsum(batch.lengths)))
    return TableBatch(batch.indices[edges[start]:edges[end]], batch.lengths[start:end])


@functools.cache
def shard_rows(position: int, rows: int, start: int, end: int) -> np.ndarray:
    """The table rows (popularity ranks) a row shard holding hashed ids ``[start, end)`` keeps,
    in its own row order (hottest first)."""
    hashed = np.random.default_rng([_HASH_SEED, position]).permutation(rows)
    return np.flatnonzero((hashed >= start) & (hashed < end))  # ascending: hottest first


@functools.cache
def _local_rows(position: int, rows: int, start: int, end: int) -> np.ndarray:
    """Popularity-ranked table row -> popularity rank within the shard holding hashed ids
    ``[start, end)``, or -1 for rows of other shards."""
    mine = shard_rows(position, rows, start, end)
    local = np.full(rows, -1, dtype=np.int64)
    local[mine] = np.arange(mine.size, dtype=np.int64)
    return local
