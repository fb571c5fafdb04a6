"""Mergeable sketches of a table too large to count exactly (Apache DataSketches).

A table's per-row counts need 8 bytes per row; when that does not fit the memory given, the
table is summarised by two sketches that merge across files and workers:

- a *frequent items* sketch (Misra-Gries with a bounded map) keeps the hottest rows with counts
  between a lower and an upper bound; every row it does not hold was read at most ``offset``
  times (the sketch's largest error);
- a *tuple sketch* (a theta sketch whose entries carry a summed count) keeps a coordinated
  uniform sample of rows: a row is retained when the hash of its id is below ``theta``, the
  same rows in every file, so a retained row's count is exact after any merge.

The access curve is rebuilt from the head (rows the frequent items sketch proves hot) and the
tail (sampled rows, each standing for ``1/theta`` rows). The error it states is a bound at about
two standard deviations (95%): on the lookup-share axis, the hottest ``k`` rows of the estimate
serve within ``lookup_share_error`` of the share the hottest ``k`` rows truly serve; the
distinct rows are within ``distinct_rows_error`` rows. Distinct raw values of hashed columns are
counted by a HyperLogLog sketch (:class:`DistinctSketch`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoshard.errors import InputError

#: log2 of the frequent items sketch's map (0.75 x 2^16 = 49,152 rows held).
LG_FREQUENT = 16
#: log2 of the row sample's nominal size (2^14 = 16,384 rows).
LG_SAMPLE = 14
#: log2 of the HyperLogLog sketch's buckets (relative error about 1.6% at 2 sd).
LG_DISTINCT = 14
#: A row is counted in the head when its lower bound reaches this many times the largest error
#: of the frequent items sketch (the head's error is then at most 1/(2 x this) of the lookups).
HEAD_FACTOR = 16
#: Memory of one table's sketches (bytes), counted against the memory budget: the frequent
#: items map (about 60 bytes per row held, as Python ints) and the row sample.
SKETCH_BYTES = 8 << 20


@dataclass(frozen=True)
class SketchError:
    """The stated error of a sketched table's statistics (about 95%, two standard deviations).

    Args:
        distinct_rows: Rows used are within this many rows of the truth.
        lookup_share: The hottest k rows serve within this share of lookups of the truth.
    """

    distinct_rows: float
    lookup_share: float

    def to_dict(self) -> dict[str, float]:
        return {"distinct_rows": round(self.distinct_rows, 1),
                "lookup_share": round(self.lookup_share, 6)}


def _datasketches() -> Any:
    import datasketches

    return datasketches


def _longs() -> Any:
    return _datasketches().PyLongsSerDe()


class TableSketch:
    """The frequent items sketch and the row sample of one table (see the module docstring).

    Args:
        frequent: A frequent items sketch to start from (a new one when None).
        sample: A compact tuple sketch to start from (a new update sketch when None).
    """

    def __init__(self, frequent: Any = None, sample: Any = None) -> None:
        ds = _datasketches()
        self._policy = ds.AccumulatorPolicy()
        self.frequent = frequent if frequent is not None else ds.frequent_items_sketch(
            LG_FREQUENT)
        self.sample = sample if sample is not None else ds.update_tuple_sketch(
            self._policy, LG_SAMPLE)

    def add(self, indices: np.ndarray) -> None:
        """Adds a chunk of lookups (row ids); each distinct row updates the sketches once."""
        if indices.size == 0:
            return
        rows, counts = np.unique(indices, return_counts=True)
        frequent, sample = self.frequent.update, self.sample.update
        for row, count in zip(rows.tolist(), counts.tolist(), strict=True):
            frequent(row, count)
            sample(row, count)

    def compact(self) -> Any:
        """The row sample as a compact tuple sketch."""
        return self.sample.compact() if hasattr(self.sample, "compact") else self.sample

    def merge(self, other: TableSketch) -> TableSketch:
        """A new sketch of both tables' lookups."""
        ds = _datasketches()
        frequent = ds.frequent_items_sketch.deserialize(
            self.frequent.serialize(_longs()), _longs())
        frequent.merge(other.frequent)
        union = ds.tuple_union(self._policy, LG_SAMPLE)
        union.update(self.compact())
        union.update(other.compact())
        return TableSketch(frequent, union.get_result())

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Serialised sketches as byte arrays (for a partial profile's ``.npz``)."""
        return {"frequent": np.frombuffer(self.frequent.serialize(_longs()), np.uint8),
                "sample": np.frombuffer(self.compact().serialize(_longs()), np.uint8)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], source: str) -> TableSketch:
        """Reads what :meth:`to_arrays` wrote.

        Raises:
            InputError: The bytes are not a sketch (names the file).
        """
        ds = _datasketches()
        try:
            frequent = ds.frequent_items_sketch.deserialize(arrays["frequent"].tobytes(),
                                                            _longs())
            sample = ds.compact_tuple_sketch.deserialize(arrays["sample"].tobytes(), _longs())
        except Exception as exc:
            raise InputError(f"corrupt sketch ({exc})".splitlines()[0], source=source,
                             field="sketch") from exc
        return cls(frequent, sample)

    def estimate(self) -> tuple[np.ndarray, np.ndarray, SketchError]:
        """Estimated count histogram (access counts, rows with that count; unsorted) and its
        stated error."""
        ds = _datasketches()
        items = self.frequent.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES,
                                                 0)
        low = np.array([it[2] for it in items], dtype=np.int64)
        high = np.array([it[3] for it in items], dtype=np.int64)
        offset = int((high - low).max()) if items else 0
        threshold = max(1, HEAD_FACTOR * offset)
        head = low >= threshold
        band = (low < threshold) & (high >= threshold)
        sample = self.compact()
        theta = float(sample.theta)
        counts = np.array([summary for _, summary in sample], dtype=np.int64)
        tail = counts[counts < threshold]
        values, sampled = np.unique(tail, return_counts=True)
        tail_rows = np.rint(sampled / theta).astype(np.int64)
        times = np.concatenate(((low[head] + high[head]) // 2, values))
        rows = np.concatenate((np.ones(int(head.sum()), np.int64), tail_rows))
        error = _error(low[head], high[head], high[band], tail, values, theta,
                       float(np.dot(times, rows)))
        return times, rows, error


def _error(low: np.ndarray, high: np.ndarray, band_high: np.ndarray, tail: np.ndarray,
           values: np.ndarray, theta: float, estimated_lookups: float) -> SketchError:
    """The stated error of :meth:`TableSketch.estimate` (see the module docstring).

    Lookups: the head's midpoints are off by at most half their bound's width; rows in the
    ambiguous band (upper bound over the head's threshold, lower bound under it) may be missed
    entirely; the sample's Horvitz-Thompson sum of lookups is off by two standard deviations at
    most (95%); rounding rows per count value adds half a row of each value. The shares divide
    by the estimated total, which doubles the bound.
    """
    scale = (1.0 - theta) / theta**2
    lookups_err = (float(np.sum(np.ceil((high - low) / 2.0))) + float(band_high.sum())
                   + 2.0 * math.sqrt(scale * float(np.dot(tail, tail)))
                   + 0.5 * float(values.sum()))
    total = max(estimated_lookups - lookups_err, 1.0)
    share = min(1.0, 2.0 * lookups_err / total)
    rows_err = (2.0 * math.sqrt(tail.size * (1.0 - theta)) / theta + float(band_high.size)
                + 0.5 * float(values.size))
    return SketchError(distinct_rows=rows_err, lookup_share=share)


class DistinctSketch:
    """Distinct raw values of a hashed column (their 64-bit hashes), by HyperLogLog.

    Args:
        hll: A sketch to start from (a new one when None).
    """

    def __init__(self, hll: Any = None) -> None:
        self.hll = hll if hll is not None else _datasketches().hll_sketch(LG_DISTINCT)

    def add(self, hashes: np.ndarray) -> None:
        update = self.hll.update
        for value in np.unique(hashes).view(np.int64).tolist():
            update(value)

    def merge(self, other: DistinctSketch) -> DistinctSketch:
        union = _datasketches().hll_union(LG_DISTINCT)
        union.update(self.hll)
        union.update(other.hll)
        return DistinctSketch(union.get_result())

    def count(self) -> int:
        return round(self.hll.get_estimate())

    def to_array(self) -> np.ndarray:
        return np.frombuffer(self.hll.serialize_compact(), np.uint8)

    @classmethod
    def from_array(cls, data: np.ndarray, source: str) -> DistinctSketch:
        try:
            return cls(_datasketches().hll_sketch.deserialize(data.tobytes()))
        except Exception as exc:
            raise InputError(f"corrupt sketch ({exc})".splitlines()[0], source=source,
                             field="draws") from exc
