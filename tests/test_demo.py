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
