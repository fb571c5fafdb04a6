"""The demo end to end with a small budget: synth, profile, plan with every sharder, compare."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard.sharders import sharder_names
from autoshard.tables import load_tables


@pytest.mark.slow
def test_demo_small_budget(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "autoshard", "demo", "--out", str(out), "--tables", "12",
         "--devices", "2", "--trace-batch", "512", "--time-limit", "1"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    tables = load_tables(out / "tables.json")
    assert len(tables) == 12
    assert all(t.access_source == "measured" for t in tables)  # profiled from the trace
    assert (out / "trace.pt").stat().st_size > 0
    with (out / "demo.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["sharder"] for r in rows} == set(sharder_names())
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) >= 6  # the six baselines always run
    for r in ok:
        assert float(r["step_cost_ms"]) >= float(r["lower_bound_ms"]) * (1 - 1e-9)
        assert (out / "demo.plans" / "demo-12x2" / f"{r['sharder']}.json").is_file()
    assert "cost / lower bound" in (out / "demo.md").read_text()
    assert (out / "demo.png").is_file() and (out / "demo.devices.png").is_file()
    assert "recshard" in proc.stdout and "cost" in proc.stdout


def test_the_demo_says_what_a_sharders_time_limit_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose sharder was cut by its limit (TorchRec's cache search, say) is shown with
    what was cut, so the table does not pass for the sharder at full strength."""
    from rich.console import Console

    from autoshard.cli import demo_cmds
    from autoshard.compare.rows import CompareRow

    console = Console(width=100, record=True, color_system=None)
    monkeypatch.setattr(demo_cmds, "console", console)
    base = {"suite": "demo", "task": "t", "tables": 4, "devices": 2, "mode": "train",
            "status": "ok", "step_cost_ms": 2.0, "lower_bound_ms": 1.0, "cost_ratio": 2.0,
            "uvm_lookup_share": 0.1, "plan_seconds": 30.0}
    rows = [CompareRow(sharder="torchrec", notes="time limit: TorchRec's cache-size search "
                       "not run (0.4 s left, 5 s needed)", **base),  # type: ignore[arg-type]
            CompareRow(sharder="recshard", **base)]  # type: ignore[arg-type]
    demo_cmds._show(rows, {})
    text = " ".join(console.export_text().split())
    assert "torchrec: time limit: TorchRec's cache-size search not run" in text
    assert "recshard:" not in text
