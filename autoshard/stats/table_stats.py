"""Per-table statistics from lookups: counts per row, then everything the planner needs.

One pass: a table's lookups are counted with ``np.bincount`` (or a sort when the table is far
larger than its lookups), and every statistic is read from the histogram of those counts, so no
step loops over samples or sorts the rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoshard.access import AccessCurve, expected_rows_used
from autoshard.errors import InputError
from autoshard.stats.sketch import SketchError
from autoshard.tables import REUSE_BINS, Table

#: Tables with more rows than this many times their lookups are counted by sorting: beyond it,
#: the two passes over a dense count array cost more than a sort of the lookups
#: (benchmarks/bench_profiler.py).
SPARSE_RATIO = 16
#: Shares of lookups for which a summary says how many of the hottest rows serve them.
COVERING_SHARES = (0.5, 0.9, 0.99)
#: Distinct raw-value hashes an :class:`ExactDistinct` holds unmerged beyond twice those merged.
PENDING_HASHES = 1 << 16


def reuse_bin(times: np.ndarray) -> np.ndarray:
    """Reuse bin of rows accessed ``times`` >= 1 times: 0 for 1, i for 2^(i-1) < n <= 2^i,
    16 for n > 32768 (the bins of Meta's DLRM locality stats)."""
    exponent = np.frexp(np.asarray(times, dtype=np.float64) - 1.0)[1]
    return np.minimum(exponent, REUSE_BINS - 1)


@dataclass(frozen=True)
class CountHistogram:
    """How many rows were accessed exactly ``times[i]`` times (``rows[i]`` of them).

    ``times`` is sorted in decreasing order and holds only values >= 1.
    """

    times: np.ndarray
    rows: np.ndarray

    @classmethod
    def from_counts(cls, counts: np.ndarray) -> CountHistogram:
        """From per-row counts (zeros allowed)."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.size == 0:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))
        per_value = np.bincount(counts)
        times = np.flatnonzero(per_value)[::-1]
        times = times[times > 0]
        return cls(times.astype(np.int64), per_value[times].astype(np.int64))

    @property
    def distinct(self) -> int:
        return int(self.rows.sum())

    @property
    def lookups(self) -> int:
        return int((self.rows * self.times).sum())

    def reuse(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows and lookups per reuse bin (absolute numbers, 17 bins)."""
        bins = reuse_bin(self.times)
        rows = np.bincount(bins, weights=self.rows, minlength=REUSE_BINS)
        lookups = np.bincount(bins, weights=self.rows * self.times, minlength=REUSE_BINS)
        return rows, lookups

    def rows_covering(self, share: float) -> int:
        """The fewest rows (hottest first) that serve at least ``share`` of the lookups."""
        if self.distinct == 0:
            return 0
        cum_rows = np.cumsum(self.rows)
        cum_lookups = np.cumsum(self.rows * self.times)
        need = share * float(cum_lookups[-1])
        group = min(int(np.searchsorted(cum_lookups, need)), cum_rows.size - 1)
        before_rows = int(cum_rows[group - 1]) if group else 0
        before = float(cum_lookups[group - 1]) if group else 0.0
        return before_rows + max(int(np.ceil((need - before) / self.times[group])), 0)

    def served_by(self, k: int) -> float:
        """Share of lookups the hottest ``k`` rows serve."""
        if self.distinct == 0 or k <= 0:
            return 0.0
        cum_rows = np.cumsum(self.rows)
        cum_lookups = np.cumsum(self.rows * self.times)
        group = min(int(np.searchsorted(cum_rows, k)), cum_rows.size - 1)
        before_rows = int(cum_rows[group - 1]) if group else 0
        before = int(cum_lookups[group - 1]) if group else 0
        served = before + min(k - before_rows, int(self.rows[group])) * int(self.times[group])
        return served / float(cum_lookups[-1])

    def curve(self, hash_size: int, points: int = 64) -> AccessCurve:
        """Share of lookups served by the hottest k rows, at log-spaced k (exact at each k)."""
        if self.distinct == 0:
            return AccessCurve.uniform(1.0)
        cum_rows = np.cumsum(self.rows)
        cum_lookups = np.cumsum(self.rows * self.times)
        k = np.unique(np.round(np.logspace(0, np.log10(cum_rows[-1]), points)).astype(np.int64))
        group = np.searchsorted(cum_rows, k)
        before_rows = np.where(group > 0, cum_rows[group - 1], 0)
        before_lookups = np.where(group > 0, cum_lookups[group - 1], 0)
        served = before_lookups + (k - before_rows) * self.times[group]
        x = np.concatenate(([0.0], k / hash_size))
        y = np.concatenate(([0.0], np.round(served / cum_lookups[-1], 6)))
        y[-1] = 1.0
        return AccessCurve(tuple(float(f"{v:.10g}") for v in x), tuple(y.tolist()))


@dataclass(frozen=True)
class TableProfile:
    """Measured statistics of one table.

    Args:
        name: Table name.
        hash_size: Rows of the table.
        samples: Samples seen.
        present: Samples in which the feature had at least one lookup.
        lookups: Total lookups.
        pooling_sq: Sum over samples of squared lookups per sample (for the spread).
        counts: Histogram of per-row access counts.
        draws: Distinct raw values hashed into the table, when known (else ``None``).
        error: For a table counted by sketches, the stated error of its statistics (else
            ``None``: exact).
    """

    name: str
    hash_size: int
    samples: int
    present: int
    lookups: int
    pooling_sq: float
    counts: CountHistogram
    draws: int | None = None
    error: SketchError | None = None
    reuse: tuple[np.ndarray, np.ndarray] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reuse", self.counts.reuse())

    @property
    def rows_used(self) -> int:
        return self.counts.distinct

    @property
    def coverage(self) -> float:
        return self.present / self.samples if self.samples else 0.0

    @property
    def pooling_factor(self) -> float:
        """Mean lookups per sample in which the feature is present."""
        return self.lookups / self.present if self.present else 0.0

    @property
    def pooling_std(self) -> float:
        """Standard deviation of lookups per sample over the samples where it is present."""
        if not self.present:
            return 0.0
        var = self.pooling_sq / self.present - self.pooling_factor**2
        return float(np.sqrt(max(var, 0.0)))

    @property
    def expected_rows_used(self) -> float:
        """Birthday-paradox rows used: distinct raw values (or, unknown, all lookups) hashed
        uniformly into the table."""
        draws = self.draws if self.draws is not None else self.lookups
        return float(expected_rows_used(self.hash_size, draws))

    @property
    def reuse_rows(self) -> np.ndarray:
        """Share of distinct rows in each reuse bin."""
        rows = self.reuse[0]
        return rows / rows.sum() if rows.sum() else rows

    @property
    def reuse_lookups(self) -> np.ndarray:
        """Share of lookups in each reuse bin."""
        lookups = self.reuse[1]
        return lookups / lookups.sum() if lookups.sum() else lookups

    def to_table(self, dim: int = 64, points: int = 64) -> Table:
        """The planner's :class:`Table` (raises when the table was never looked up)."""
        if self.lookups == 0:
            raise InputError("table has no lookups", field=f"{self.name}.lookups", value=0)
        return Table(name=self.name, rows=self.hash_size, dim=dim,
                     pooling_factor=self.pooling_factor, pooling_std=self.pooling_std,
                     coverage=self.coverage, rows_used=self.rows_used,
                     access_cdf=self.counts.curve(self.hash_size, points),
                     reuse_hist=tuple(float(v) for v in np.round(self.reuse_rows, 6)))

    def summary(self) -> dict[str, Any]:
        """The statistics by name; ``rows_for_50`` etc. are the fewest rows serving that share
        of lookups; ``counted`` says ``exact`` or ``sketch`` (with ``error``, its bounds)."""
        out: dict[str, Any] = {
            "name": self.name, "rows": self.hash_size, "lookups": self.lookups,
            "pooling_factor": self.pooling_factor, "pooling_std": self.pooling_std,
            "coverage": self.coverage, "rows_used": self.rows_used,
            "expected_rows_used": self.expected_rows_used,
            **{f"rows_for_{round(q * 100)}": self.counts.rows_covering(q)
               for q in COVERING_SHARES},
            "counted": "exact" if self.error is None else "sketch"}
        if self.error is not None:
            out["error"] = self.error.to_dict()
        return out


def count_rows(indices: np.ndarray, hash_size: int) -> np.ndarray | CountHistogram:
    """Per-row counts (dense) or, for tables much larger than their lookups, the count
    histogram straight from a sort."""
    if hash_size > SPARSE_RATIO * max(indices.size, 1):
        return CountHistogram.from_counts(distinct_counts(indices, hash_size)[1])
    return np.bincount(indices, minlength=hash_size)


def distinct_counts(indices: np.ndarray, hash_size: int | None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct row ids of a chunk of (checked) lookups and their counts, by a sort
    (of 32-bit ids when the table has at most 2^32 rows: half the memory to move)."""
    narrow = indices.astype(np.uint32) if hash_size is not None and hash_size <= 2**32 \
        else indices
    ordered = np.sort(narrow)
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    return ordered[starts].astype(np.int64), np.diff(np.append(starts, ordered.size))


def profile_table(name: str, indices: np.ndarray, lengths: np.ndarray, hash_size: int,
                  draws: int | None = None) -> TableProfile:
    """Profiles one table from all its lookups and its lookups per sample (checked input)."""
    counted = count_rows(indices, hash_size)
    hist = counted if isinstance(counted, CountHistogram) else CountHistogram.from_counts(counted)
    lengths = np.asarray(lengths, dtype=np.int64)
    return TableProfile(name=name, hash_size=hash_size, samples=int(lengths.size),
                        present=int(np.count_nonzero(lengths)), lookups=int(indices.size),
                        pooling_sq=float(np.dot(lengths, lengths)), counts=hist, draws=draws)


def add_counts(counts: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``counts`` with one more access for each of ``indices`` (checked row ids), grown when an
    id lies beyond it; added in place where it fits. A chunk much smaller than the table is
    counted by sorting it, which costs nothing per row of the table."""
    if indices.size == 0:
        return counts
    top = int(indices.max()) + 1
    if top > counts.size:
        grown = np.zeros(max(top, 2 * counts.size), dtype=np.int64)
        grown[: counts.size] = counts
        counts = grown
    if counts.size > SPARSE_RATIO * indices.size:
        rows, times = np.unique(indices, return_counts=True)
        counts[rows] += times
    else:
        counts += np.bincount(indices, minlength=counts.size)
    return counts


class SparseCounts:
    """Exact per-row counts held as sorted (row, count) pairs, so memory follows the rows
    touched rather than the table's size; chunks are summed lazily (amortised n log n).

    Args:
        rows: Sorted distinct rows to start from (none when None).
        counts: Their counts.
        hash_size: Rows of the table, when known: chunks of a table no larger than
            :data:`SPARSE_RATIO` times the chunk are counted with ``np.bincount``.
    """

    def __init__(self, rows: np.ndarray | None = None, counts: np.ndarray | None = None,
                 hash_size: int | None = None) -> None:
        self.rows = np.zeros(0, np.int64) if rows is None else rows
        self.counts = np.zeros(0, np.int64) if counts is None else counts
        self.hash_size = hash_size
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.pending_size = 0

    def add(self, indices: np.ndarray) -> None:
        """Counts a chunk of (checked) row ids."""
        if indices.size == 0:
            return
        if self.hash_size is not None and self.hash_size <= SPARSE_RATIO * indices.size:
            dense = np.bincount(indices, minlength=self.hash_size)
            rows = np.flatnonzero(dense)
            pair = (rows, dense[rows])
        else:
            pair = distinct_counts(indices, self.hash_size)
        self.add_pairs(*pair)

    def add_pairs(self, rows: np.ndarray, counts: np.ndarray) -> None:
        """Adds sorted distinct rows with their counts."""
        self.pending.append((rows.astype(np.int64), counts.astype(np.int64)))
        self.pending_size += rows.size
        if self.pending_size > self.rows.size + (1 << 18):
            self.pairs()

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """The sorted distinct rows and their counts."""
        if len(self.pending) == 1 and not self.rows.size:  # one chunk: sorted and distinct
            (self.rows, self.counts), self.pending, self.pending_size = self.pending[0], [], 0
        if self.pending:
            rows = np.concatenate([self.rows, *(r for r, _ in self.pending)])
            counts = np.concatenate([self.counts, *(c for _, c in self.pending)])
            order = np.argsort(rows, kind="stable")
            rows, counts = rows[order], counts[order]
            starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
            self.rows, self.counts = rows[starts], np.add.reduceat(counts, starts)
            self.pending, self.pending_size = [], 0
        return self.rows, self.counts

    def merged(self, other: SparseCounts | DenseCounts) -> SparseCounts:
        """A new counter of both (summed lazily, so merging many in a row stays n log n)."""
        out = SparseCounts(self.rows, self.counts, self.hash_size)
        out.pending, out.pending_size = list(self.pending), self.pending_size
        out.add_pairs(*other.pairs())
        return out


class DenseCounts:
    """Exact per-row counts of a table of known size as one array (8 bytes a row): what a merge
    of many pieces adds into, in O(rows touched) per piece and no sort.

    Args:
        hash_size: Rows of the table.
    """

    def __init__(self, hash_size: int) -> None:
        self.hash_size = hash_size
        self.counts = np.zeros(hash_size, np.int64)

    def add_pairs(self, rows: np.ndarray, counts: np.ndarray) -> None:
        """Adds sorted distinct rows with their counts (in place)."""
        self.counts[rows] += counts

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        rows = np.flatnonzero(self.counts)
        return rows, self.counts[rows]

    def merged(self, other: SparseCounts | DenseCounts) -> DenseCounts:
        """Adds ``other`` into this counter and returns it (a merge owns its counter)."""
        self.add_pairs(*other.pairs())
        return self


class ExactDistinct:
    """Distinct 64-bit hashes of raw values seen so far (those hashed into a table), merged
    lazily (amortised linear time)."""

    def __init__(self) -> None:
        self.known = np.zeros(0, np.uint64)
        self.pending: list[np.ndarray] = []
        self.pending_size = 0

    def add(self, hashes: np.ndarray) -> None:
        self.pending.append(np.unique(hashes))
        self.pending_size += self.pending[-1].size
        if self.pending_size > 2 * self.known.size + PENDING_HASHES:
            self._merge()

    def _merge(self) -> None:
        # every part is sorted: a stable sort (timsort) merges the runs in n log(runs)
        merged = np.sort(np.concatenate([self.known, *self.pending]), kind="stable")
        if merged.size:
            merged = merged[np.concatenate(([True], merged[1:] != merged[:-1]))]
        self.known = merged
        self.pending, self.pending_size = [], 0

    def merged(self, other: ExactDistinct) -> ExactDistinct:
        """A new set of both (merged lazily)."""
        out = ExactDistinct()
        out.known = self.known
        out.pending, out.pending_size = list(self.pending), self.pending_size
        out.pending.append(other.values())
        out.pending_size += out.pending[-1].size
        return out

    def values(self) -> np.ndarray:
        """The distinct hashes, sorted."""
        self._merge()
        return self.known

    def count(self) -> int:
        return int(self.values().size)


class CountAccumulator:
    """Accumulates dense per-row counts of several tables over chunks of samples.

    Args:
        names: Table names.
        hash_sizes: Rows per table; ``None``: unknown, the table grows to its largest index + 1.
    """

    def __init__(self, names: Sequence[str], hash_sizes: Sequence[int | None]) -> None:
        self.names = list(names)
        self.hash_sizes = list(hash_sizes)
        self.counts = [np.zeros(h or 0, dtype=np.int64) for h in hash_sizes]
        self.samples = np.zeros(len(names), dtype=np.int64)
        self.present = np.zeros(len(names), dtype=np.int64)
        self.pooling_sq = np.zeros(len(names), dtype=np.float64)

    def add(self, table: int, indices: np.ndarray, lengths: np.ndarray) -> None:
        """Adds one chunk of a table: its (checked) lookups and its lookups per sample."""
        self.counts[table] = add_counts(self.counts[table], indices)
        lengths = np.asarray(lengths, dtype=np.int64)
        self.samples[table] += lengths.size
        self.present[table] += np.count_nonzero(lengths)
        self.pooling_sq[table] += float(np.dot(lengths, lengths))

    def result(self, draws: Sequence[int | None] | None = None) -> list[TableProfile]:
        draws = draws if draws is not None else [None] * len(self.names)
        return [TableProfile(name=n, hash_size=h or max(_top(c), 1),
                             samples=int(self.samples[i]), present=int(self.present[i]),
                             lookups=int(c.sum()), pooling_sq=float(self.pooling_sq[i]),
                             counts=CountHistogram.from_counts(c), draws=draws[i])
                for i, (n, h, c) in enumerate(zip(self.names, self.hash_sizes, self.counts,
                                                  strict=True))]


def _top(counts: np.ndarray) -> int:
    """Largest row id with an access, + 1 (0 for none)."""
    used = np.flatnonzero(counts)
    return int(used[-1]) + 1 if used.size else 0


def merged_reuse(profiles: Iterable[TableProfile]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct-row share and lookup share per reuse bin over all tables together (how Meta's
    locality stats merge the 856 tables of a trace)."""
    rows = np.zeros(REUSE_BINS)
    lookups = np.zeros(REUSE_BINS)
    for p in profiles:
        rows += p.reuse[0]
        lookups += p.reuse[1]
    return rows / max(rows.sum(), 1.0), lookups / max(lookups.sum(), 1.0)


def cdf_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """Max absolute difference of two histograms' CDFs over the bins."""
    return float(np.max(np.abs(np.cumsum(a) - np.cumsum(b))))
