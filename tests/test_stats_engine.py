"""Running the pieces: two local processes and a local Dask cluster of processes give the same
profile as one process; an interrupted run resumes from its finished pieces without counting
them again."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import run_cli
from test_stats_merge import write_days

import autoshard.stats.engine as engine
from autoshard.stats.engine import EngineOptions, run_plan
from autoshard.stats.inputs import expand_inputs
from autoshard.stats.scan import ScanOptions, ScanPlan, plan_scan


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs each test in its own folder, so default parts folders (runs/) land there."""
    monkeypatch.chdir(tmp_path)


def _plan(folder: Path) -> ScanPlan:
    return plan_scan(expand_inputs([str(folder)]), ScanOptions(hash_size="3000",
                                                               piece_bytes=100_000))


def _tables(part: object) -> list[dict[str, object]]:
    return [p.to_table().to_dict() for p in part.profiles()]  # type: ignore[attr-defined]


@pytest.mark.slow
def test_two_processes_and_a_dask_cluster_match_one_process(tmp_path: Path) -> None:
    write_days(tmp_path / "data", days=2, rows=1500)
    plan = _plan(tmp_path / "data")
    assert len(plan.pieces) >= 4
    one = run_plan(plan, EngineOptions(jobs=1, parts=tmp_path / "p1"))
    seen: list[int] = []
    two = run_plan(plan, EngineOptions(jobs=2, parts=tmp_path / "p2"),
                   advance=lambda nbytes, lookups: seen.append(lookups))
    cluster = run_plan(plan, EngineOptions(engine="dask", jobs=2, parts=tmp_path / "p3"))
    assert _tables(two) == _tables(one) and _tables(cluster) == _tables(one)
    assert sum(seen) == sum(t.lookups for t in one.tables) and len(seen) == len(plan.pieces)
    assert not any((tmp_path / p).exists() for p in ("p1", "p2", "p3"))  # parts removed


def test_an_interrupted_run_resumes_without_recounting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_days(tmp_path / "data", days=3, rows=600)
    plan = _plan(tmp_path / "data")
    parts = tmp_path / "parts"
    counted: list[str] = []
    real = engine.piece_bytes_of

    def counting(plan: ScanPlan, piece: object, target: str | None = None
                 ) -> tuple[bytes | None, int]:
        counted.append(piece.digest)  # type: ignore[attr-defined]
        return real(plan, piece, target)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "piece_bytes_of", counting)

    def stop_after_two(nbytes: int, lookups: int) -> None:
        if len(counted) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_plan(plan, EngineOptions(jobs=1, parts=parts), advance=stop_after_two)
    assert len(list(parts.glob("*.npz"))) == 2
    first = list(counted)
    counted.clear()
    logged: list[str] = []
    resumed = run_plan(plan, EngineOptions(jobs=1, parts=parts), log=logged.append)
    assert set(counted).isdisjoint(first) and len(counted) == len(plan.pieces) - 2
    assert logged == [f"resumed 2 of {len(plan.pieces)} pieces from {parts}"]
    whole = run_plan(plan, EngineOptions(jobs=1, parts=tmp_path / "fresh"))
    assert _tables(resumed) == _tables(whole)


def test_a_changed_file_is_counted_again(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    days = write_days(tmp_path / "data", days=2, rows=300)
    parts = tmp_path / "parts"
    argv = ["profile", str(tmp_path / "data"), "--hash-size", "3000", "--jobs", "1",
            "--parts", str(parts), "--keep-parts", "-o", str(tmp_path / "t.json"), "--json"]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    assert len(list(parts.glob("*.npz"))) == 2
    days[1].write_text(days[1].read_text() + days[0].read_text())
    code, out, err = run_cli([*argv[:-1]], capsys)
    assert code == 0, err
    assert "resumed 1 of 2 pieces" in out
    assert len(list(parts.glob("*.npz"))) == 3  # the changed file's piece is new


def test_a_bad_row_keeps_the_finished_pieces(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    days = write_days(tmp_path / "data", days=2, rows=300)
    days[1].write_text(days[1].read_text() + "1\t2\n")
    parts, out = tmp_path / "parts", tmp_path / "t.json"
    code, _, err = run_cli(["profile", str(tmp_path / "data"), "--hash-size", "3000",
                            "--jobs", "1", "--parts", str(parts), "-o", str(out)], capsys)
    assert code == 2 and str(days[1]) in err and "malformed or truncated CSV" in err, err
    assert not out.exists() and len(list(parts.glob("*.npz"))) == 1
