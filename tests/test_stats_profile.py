"""The profiler: reuse bins, count histograms, curves and per-table statistics, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.access import AccessCurve, expected_rows_used
from autoshard.stats.table_stats import (
    CountAccumulator,
    CountHistogram,
    cdf_distance,
    merged_reuse,
    profile_table,
    reuse_bin,
)


def test_reuse_bins_follow_the_locality_stats_edges() -> None:
    # (0,1] -> 0, (1,2] -> 1, (2,4] -> 2, (4,8] -> 3, ..., (16384,32768] -> 15, 32768+ -> 16
    times = np.array([1, 2, 3, 4, 5, 8, 9, 16384, 16385, 32768, 32769, 10**6])
    assert reuse_bin(times).tolist() == [0, 1, 2, 2, 3, 3, 4, 14, 15, 15, 16, 16]


def test_hand_table() -> None:
    # 3 samples: lookups {0, 0}, none, {1, 3}; hash size 5.
    stats = profile_table("t", np.array([0, 0, 1, 3]), np.array([2, 0, 2]), 5)
    assert stats.pooling_factor == 2.0
    assert stats.pooling_std == 0.0
    assert stats.coverage == pytest.approx(2 / 3)
    assert stats.rows_used == 3
    assert stats.reuse_rows[:3].tolist() == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert stats.reuse_lookups[:3].tolist() == pytest.approx([0.5, 0.5, 0.0])
    assert stats.expected_rows_used == pytest.approx(5 * (1 - 0.8**4))
    table = stats.to_table(dim=8)
    assert table.rows == 5 and table.dim == 8 and table.rows_used == 3
    # hottest row (1 of 5 rows) serves 2 of 4 lookups; all 3 used rows serve everything
    assert table.access_curve().share_at(0.2) == pytest.approx(0.5)
    assert table.access_curve().used_fraction == pytest.approx(0.6)


def test_pooling_spread() -> None:
    stats = profile_table("t", np.zeros(6, np.int64), np.array([1, 5, 0]), 1)
    assert stats.pooling_factor == 3.0
    assert stats.pooling_std == pytest.approx(2.0)


def test_curve_matches_sorting_reference() -> None:
    rng = np.random.default_rng(1)
    counts = rng.zipf(1.5, 5000) * (rng.random(5000) < 0.7)
    ours = CountHistogram.from_counts(counts).curve(8000)
    reference = AccessCurve.from_counts(counts, 8000)
    grid = np.linspace(0, 1, 500)
    assert np.max(np.abs(ours.share_at(grid) - reference.share_at(grid))) < 1e-6
    assert ours.used_fraction == pytest.approx(np.count_nonzero(counts) / 8000)


def test_sparse_and_dense_counting_agree() -> None:
    rng = np.random.default_rng(2)
    idx = rng.integers(0, 50, 1000) * 997
    small = profile_table("t", idx, np.full(100, 10), 50 * 997)
    large = profile_table("t", idx, np.full(100, 10), 10**9)  # counted by sorting
    assert small.rows_used == large.rows_used == np.unique(idx).size
    assert small.reuse_rows.tolist() == large.reuse_rows.tolist()


def test_accumulator_over_chunks_equals_one_pass() -> None:
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 300, 5000)
    lengths = np.full(500, 10)
    acc = CountAccumulator(["t"], [None])  # hash size unknown: grows to max index + 1
    for part in range(5):
        acc.add(0, idx[part * 1000:(part + 1) * 1000], lengths[part * 100:(part + 1) * 100])
    (chunked,) = acc.result()
    whole = profile_table("t", idx, lengths, int(idx.max()) + 1)
    assert chunked.hash_size == whole.hash_size
    assert chunked.rows_used == whole.rows_used
    assert chunked.pooling_factor == whole.pooling_factor == 10.0
    assert np.array_equal(chunked.reuse[1], whole.reuse[1])


def test_merged_reuse_weights_tables_by_rows_and_lookups() -> None:
    a = profile_table("a", np.array([0]), np.array([1]), 1)        # 1 row used once
    b = profile_table("b", np.array([0, 0, 0]), np.array([3]), 1)  # 1 row used 3 times
    rows, lookups = merged_reuse([a, b])
    assert rows[0] == 0.5 and rows[2] == 0.5
    assert lookups[0] == 0.25 and lookups[2] == 0.75
    assert cdf_distance(rows, lookups) == pytest.approx(0.25)


def test_birthday_expectation() -> None:
    assert float(expected_rows_used(1000, 1000)) == pytest.approx(1000 * (1 - 0.999**1000))
