"""The synthetic generator: determinism, Meta's layout, a round trip through the profiler
that recovers the generator's parameters, the default workload, and the data commands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli as run

from autoshard.stats import profile_trace_file
from autoshard.stats.readers.dlrm import Trace, save_trace
from autoshard.stats.synth_fit import distances, expected_reuse, read_locality_stats
from autoshard.stats.table_stats import merged_reuse
from autoshard.synth import SynthTable, default_tables, draw_tables, generate_trace
from autoshard.tables import load_tables

LOCALITY = Path(__file__).resolve().parents[2] / "shared" / "data" / "dlrm_locality_stats_2021.txt"

HAND = (SynthTable("a", rows=1000, dim=16, pooling_factor=4.0, coverage=0.8, alpha=0.9),
        SynthTable("b", rows=50_000, dim=32, pooling_factor=2.5, coverage=1.0, alpha=0.7),
        SynthTable("c", rows=200, dim=8, pooling_factor=1.0, coverage=0.5, alpha=1.0))


def rank_shares(rows: int, alpha: float) -> np.ndarray:
    """Share of each rank, hottest first, written out from the bounded power law."""
    r = np.arange(1, rows + 2, dtype=float)
    if alpha == 1.0:
        cdf = np.log(r) / np.log(rows + 1.0)
    else:
        cdf = (r ** (1 - alpha) - 1) / ((rows + 1.0) ** (1 - alpha) - 1)
    return np.diff(cdf)




def test_draws_are_deterministic() -> None:
    assert draw_tables(20, seed=3) == draw_tables(20, seed=3)
    assert draw_tables(20, seed=3) != draw_tables(20, seed=4)
    a, b = generate_trace(HAND, 64, seed=1), generate_trace(HAND, 64, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_trace_layout() -> None:
    indices, offsets, lengths = generate_trace(HAND, 500, seed=0)
    assert lengths.shape == (3, 500) and offsets.size == 3 * 500 + 1
    Trace(indices, offsets, lengths).check()
    for t, spec in enumerate(HAND):
        part = indices[offsets[t * 500]:offsets[(t + 1) * 500]]
        assert part.min() >= 0 and part.max() < spec.rows


def test_round_trip_recovers_parameters(tmp_path: Path) -> None:
    batch = 20_000
    path = tmp_path / "trace.pt"
    save_trace(path, *generate_trace(HAND, batch, seed=0))
    profiles = profile_trace_file(path, [t.rows for t in HAND], [t.name for t in HAND])
    for spec, got in zip(HAND, profiles, strict=True):
        assert got.pooling_factor == pytest.approx(spec.pooling_factor, rel=0.02)
        assert got.coverage == pytest.approx(spec.coverage, abs=0.015)
        share = rank_shares(spec.rows, spec.alpha)
        expected_used = np.sum(-np.expm1(got.lookups * np.log1p(-share)))
        assert got.rows_used == pytest.approx(expected_used, rel=0.03)
    for spec, got in ((HAND[0], profiles[0]), (HAND[2], profiles[2])):  # well sampled
        top = np.cumsum(rank_shares(spec.rows, spec.alpha))
        curve = got.to_table().access_curve()
        for k in (1, 10, spec.rows // 4):
            assert curve.share_at(k / spec.rows) == pytest.approx(top[k - 1], abs=0.02)


def test_expected_reuse_matches_a_sampled_batch() -> None:
    specs = draw_tables(6, seed=5)
    indices, offsets, lengths = generate_trace(specs, 4096, seed=2)
    from autoshard.stats.table_stats import profile_table

    profiles = [profile_table(s.name, indices[offsets[t * 4096]:offsets[(t + 1) * 4096]],
                              lengths[t], s.rows) for t, s in enumerate(specs)]
    rows, lookups = expected_reuse(np.array([s.rows for s in specs]),
                                   np.array([p.lookups for p in profiles], float),
                                   np.array([s.alpha for s in specs]))
    got_rows, got_lookups = merged_reuse(profiles)
    assert np.max(np.abs(np.cumsum(got_rows) - np.cumsum(rows / rows.sum()))) < 0.02
    assert np.max(np.abs(np.cumsum(got_lookups) - np.cumsum(lookups / lookups.sum()))) < 0.02


@pytest.mark.skipif(not LOCALITY.is_file(), reason=f"{LOCALITY} absent (shared data)")
def test_locality_stats_and_default_workload_distance() -> None:
    stats = read_locality_stats(LOCALITY)
    assert len(stats) == 17
    assert (stats[0].lookups, stats[0].distinct) == (887_017_990, 128_435_723)
    assert stats[0].rows_hist[0] == 0.473 and stats[0].lookups_hist[-1] == 0.019
    tables = default_tables()
    hist = np.array([t.reuse_hist for t in tables])
    used = np.array([t.rows_used for t in tables], float)
    lookups = np.array([t.pooling_factor * t.coverage for t in tables])
    rows_share = (hist * used[:, None]).sum(axis=0)
    assert distances(rows_share, rows_share, stats[0])[0] <= 0.05
    assert lookups.mean() == pytest.approx(stats[0].lookups / 856 / 65536, rel=0.1)


def test_default_tables_are_the_seeded_generator_measured() -> None:
    tables = default_tables()
    assert len(tables) == 856 and default_tables() is tables
    assert all(t.access_source == "measured" and t.rows_used for t in tables)
    specs = draw_tables(856, seed=0)
    assert [(t.name, t.rows, t.dim) for t in tables] == [(s.name, s.rows, s.dim) for s in specs]
    for t, s in zip(tables[:50], specs[:50], strict=True):
        assert t.coverage == pytest.approx(s.coverage, abs=0.01)


def test_cli_synth_then_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, tables = tmp_path / "t.pt.gz", tmp_path / "synth.json"
    code, _, err = run(["synth", "--tables", "4", "--batch-size", "300", "--seed", "2",
                          "-o", str(trace), "--table-file", str(tables)], capsys)
    assert code == 0, err
    measured = tmp_path / "profiled.json"
    report = tmp_path / "report.json"
    code, _, err = run(["profile", str(trace), "--table-file", str(tables), "-o", str(measured),
                        "--report", str(report)], capsys)
    assert code == 0, err
    assert [t.to_dict() for t in load_tables(measured)] == [
        t.to_dict() for t in load_tables(tables)]
    doc = json.loads(report.read_text())
    assert len(doc["tables"]) == 4 and len(doc["merged_reuse"]["rows"]) == 17


def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.pt"
    import torch

    torch.save((torch.tensor([0, 5]), torch.tensor([0, 1, 2]), torch.tensor([[1, 1]])), bad)
    out = tmp_path / "out.json"
    code, _, err = run(["profile", str(bad), "--hash-size", "3", "-o", str(out)], capsys)
    assert code == 2 and "index >= hash size 3 in table 0 at position 1" in err
    assert str(bad) in err and not out.exists()
    code, _, err = run(["profile", str(bad), "--format", "nope", "-o", str(out)], capsys)
    assert code == 2 and "unknown format" in err
    code, _, err = run(["synth", "--tables", "0", "-o", str(tmp_path / "x.pt")], capsys)
    assert code == 2 and "--tables" in err and not (tmp_path / "x.pt").exists()


def test_cli_tables_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    code, _, err = run(["plan", "-t", "default", "-s", "size_greedy", "-o", str(plan)], capsys)
    assert code == 0, err
    assert len(json.loads(plan.read_text())["placements"]) == 856


CRITEO = LOCALITY.with_name("criteo_sample.txt")


@pytest.mark.skipif(not CRITEO.is_file(), reason=f"{CRITEO} absent (shared data)")
def test_cli_profile_criteo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "criteo.yaml"
    code, _, err = run(["profile", str(CRITEO), "--hash-size", "5000", "-o", str(out),
                        "--json"], capsys)
    assert code == 0, err
    tables = load_tables(out)
    assert [t.name for t in tables] == [f"C{i}" for i in range(1, 27)]
    assert all(t.rows == 5000 and t.pooling_factor == 1.0 for t in tables)
    code, _, err = run(["profile", str(CRITEO), "--columns", "C1,C99", "-o",
                        str(tmp_path / "x.json")], capsys)
    assert code == 2 and "C99" in err and "unknown column" in err
    assert not (tmp_path / "x.json").exists()
