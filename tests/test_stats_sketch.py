"""Sketch mode: a table whose exact counts exceed the memory given is counted by mergeable
sketches, and its distinct rows and the rows covering 50/90/99% of lookups stay within the error
it states, on a table whose exact counts are known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli

from autoshard.stats.partial import ProfileSchema, TableSchema, merge_partials
from autoshard.stats.scan import PartialAccumulator, _choose_modes
from autoshard.stats.table_stats import CountHistogram

ROWS = 2_000_000


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs each test in its own folder, so default parts folders (runs/) land there."""
    monkeypatch.chdir(tmp_path)


def zipf_lookups(lookups: int, seed: int) -> np.ndarray:
    """Row ids of a skewed table: Zipf(1.1) ranks on a random permutation of the rows."""
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.1, lookups) - 1, ROWS - 1)
    return rng.permutation(ROWS)[ranks]


def sketched_profile(indices: np.ndarray, parts: int) -> object:
    """The profile of ``indices`` counted by sketches in ``parts`` partial profiles merged."""
    from autoshard.stats.inputs import Piece

    schema = ProfileSchema((TableSchema("t", ROWS, False, True),))
    partials = []
    for i, chunk in enumerate(np.array_split(indices, parts)):
        acc = PartialAccumulator(schema)
        for block in np.array_split(chunk, 8):
            acc.add(0, block, np.ones(block.size, np.int64))
        partials.append((acc.result(Piece(f"part{i}", 0, -1, 1, f"id{i}"), "columnar"),
                         f"part{i}"))
    return merge_partials(partials).profiles()[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_sketch_stays_within_its_stated_error(seed: int) -> None:
    indices = zipf_lookups(1_500_000, seed)
    exact = np.bincount(indices, minlength=ROWS)
    profile = sketched_profile(indices, parts=3)
    error = profile.error
    assert error is not None and profile.summary()["counted"] == "sketch"
    distinct = int(np.count_nonzero(exact))
    assert distinct > 100_000  # far beyond the sketches' sizes: they must estimate
    assert 0 < error.lookup_share < 0.1 and error.distinct_rows < 0.05 * distinct
    assert abs(profile.rows_used - distinct) <= error.distinct_rows
    assert profile.lookups == indices.size and profile.pooling_factor == 1.0
    truth, eps = CountHistogram.from_counts(exact), error.lookup_share
    for q in (0.5, 0.9, 0.99):
        # the estimated rows lie between the true rows serving q - eps and q + eps
        k = profile.counts.rows_covering(q)
        assert truth.rows_covering(q - eps) <= k <= truth.rows_covering(min(q + eps, 1.0)), q
        assert abs(truth.served_by(k) - q) <= eps
        assert k == pytest.approx(truth.rows_covering(q), rel=0.25)


def test_memory_budget_sketches_the_largest_tables_first() -> None:
    tables = (TableSchema("a", 1000, True, False), TableSchema("b", 10**8, True, False),
              TableSchema("c", 10**7, True, False), TableSchema("d", None, False, False))
    modes = [t.sketched for t in _choose_modes(tables, memory_bytes=100 << 20)]
    assert modes == [False, True, False, False]
    modes = [t.sketched for t in _choose_modes(tables, memory_bytes=10 << 20)]
    assert modes == [False, True, True, False]  # a: smaller than a sketch; d: size unknown


def test_cli_says_which_tables_are_sketched_and_their_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    small = np.random.default_rng(3).integers(0, 100, 400_000)
    pq.write_table(pa.table({"big": zipf_lookups(400_000, 2), "small": small}),
                   tmp_path / "ids.parquet")
    out = tmp_path / "tables.json"
    code, stdout, err = run_cli(["profile", str(tmp_path / "ids.parquet"), "--hash-size",
                                 f"big={ROWS},small=100", "--memory-gb", "0.01", "-o",
                                 str(out), "--json"], capsys)
    assert code == 0, err
    big, little = json.loads(stdout)["tables"]
    assert big["counted"] == "sketch" and little["counted"] == "exact"
    assert 0 < big["error"]["lookup_share"] < 0.1 and "error" not in little
    exact = np.bincount(zipf_lookups(400_000, 2), minlength=ROWS)
    assert abs(big["rows_used"] - np.count_nonzero(exact)) <= big["error"]["distinct_rows"]
    assert little["rows_used"] == np.unique(small).size
    code, stdout, err = run_cli(["profile", str(tmp_path / "ids.parquet"), "--hash-size",
                                 f"big={ROWS},small=100", "--memory-gb", "0.01", "-o",
                                 str(out)], capsys)
    assert code == 0 and "big: counted by sketches" in stdout and "small:" not in stdout
