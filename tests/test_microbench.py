"""The microbenchmark harness on a tiny grid: rows appended, resume, truncated last line."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from autoshard.cli import main
from autoshard.cost_models.grid import BenchConfig, grid_configs
from autoshard.cost_models.microbench import COLUMNS, Timing, device_configs, done_ids, sweep
from autoshard.cost_models.operators import make_lookups
from autoshard.errors import InputError

FAST = Timing(warmup=1, min_repeats=3, max_repeats=3, budget_s=0.0)


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def tiny() -> list[BenchConfig]:
    return grid_configs("tiny")


def test_tiny_grid_has_both_operators_and_partitions(tiny: list[BenchConfig]) -> None:
    assert {c.op for c in tiny} == {"torch", "fbgemm"}
    assert len({c.config_id for c in tiny}) == len(tiny)
    assert grid_configs("tiny") == tiny  # deterministic


def test_cpu_has_one_tier(tiny: list[BenchConfig]) -> None:
    configs, notes = device_configs("tiny", "cpu")
    assert configs == tiny and {c.tier for c in configs} == {"host"} and notes == []


def test_sweep_appends_one_row_per_config(tmp_path: Path, tiny: list[BenchConfig]) -> None:
    out = tmp_path / "bench.csv"
    assert sweep(tiny, out, timing=FAST, progress=False) == len(tiny)
    rows = read(out)
    assert [r["config_id"] for r in rows] == [c.config_id for c in tiny]
    assert list(rows[0]) == COLUMNS
    for r in rows:
        assert 0 < float(r["fwd_p10_ms"]) <= float(r["fwd_ms"]) <= float(r["fwd_p90_ms"])
        assert float(r["bwd_ms"]) > 0 and r["repeats"] == "3" and r["hardware"]
        assert r["clock"] == "thread_cpu" and r["threads"]


def test_resume_skips_done_configs(tmp_path: Path, tiny: list[BenchConfig]) -> None:
    out = tmp_path / "bench.csv"
    sweep(tiny[:2], out, timing=FAST, progress=False)
    first = read(out)
    assert sweep(tiny, out, timing=FAST, progress=False) == len(tiny) - 2
    rows = read(out)
    assert rows[:2] == first
    assert sorted(r["config_id"] for r in rows) == sorted(c.config_id for c in tiny)
    assert sweep(tiny, out, timing=FAST, progress=False) == 0


def test_truncated_last_line_is_dropped_and_remeasured(tmp_path: Path,
                                                       tiny: list[BenchConfig]) -> None:
    out = tmp_path / "bench.csv"
    sweep(tiny[:3], out, timing=FAST, progress=False)
    text = out.read_text()
    out.write_text(text[:-25])  # an interrupted write of the third row
    assert done_ids(out) == {c.config_id for c in tiny[:2]}
    assert sweep(tiny[:3], out, timing=FAST, progress=False) == 1
    assert [r["config_id"] for r in read(out)] == [c.config_id for c in tiny[:3]]


def test_foreign_csv_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "other.csv"
    out.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="header"):
        done_ids(out)


def test_hot_and_cold_partitions_divide_one_batch() -> None:
    base = dict(op="torch", rows=1000, dim=4, pooling=4, batch=64, alpha=1.1, num_tables=2,
                hot_fraction=0.05)
    hot = make_lookups(BenchConfig(**base, part="hot"))  # type: ignore[arg-type]
    cold = make_lookups(BenchConfig(**base, part="cold"))  # type: ignore[arg-type]
    assert hot.lookups + cold.lookups == 64 * 4
    assert hot.share > 0.3 > cold.share * 0.3  # 5% hottest rows of Zipf(1.1) take most lookups
    assert hot.distinct <= 50 and all(i.max() < 50 for i in hot.indices)
    assert all(i.max() < 950 for i in cold.indices)
    assert all(n.sum() == i.size for n, i in zip(hot.lengths, hot.indices, strict=True))


def test_bad_setting_names_the_field() -> None:
    with pytest.raises(InputError, match="dim"):
        BenchConfig(op="torch", rows=10, dim=0, pooling=1, batch=1, alpha=0.0)
    with pytest.raises(InputError, match="grid"):
        grid_configs("huge")


def test_cli_bench_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.csv"
    main(["bench", "--grid", "tiny", "--no-progress", "-o", str(out)])
    assert len(read(out)) == len(grid_configs("tiny"))
    main(["bench", "--grid", "tiny", "--no-progress", "-o", str(out)])
    assert "measured 0 of" in capsys.readouterr().out
    assert len(read(out)) == len(grid_configs("tiny"))
