"""Measured serving with torch.distributed.rpc: a small run, and a killed server ending it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from autoshard.serving.bench import BenchConfig, run_bench
from autoshard.serving.cluster import load_serving_profile
from autoshard.serving.registry import get_strategy
from autoshard.serving.suites import suite_model
from autoshard.serving.task import ServingTask


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["replay", "concurrent"])
def test_measured_run_reports_beside_the_simulator(mode: str) -> None:
    model = suite_model("bench")
    task = ServingTask(model, load_serving_profile("local-cpu"), qps=100.0, requests=100)
    mapping = get_strategy("feature_group").map(task, 1).with_replicas((2,), 1)
    config = BenchConfig(qps=(100.0,), requests=40, rounds=2, warmup=10, timeout_s=60.0,
                         mode=mode)
    rows = run_bench(task, [mapping, mapping], config)
    assert rows[0] == rows[1]  # the same deployment is measured once
    row = rows[0]
    assert row["servers"] == 1 and row["replicas"] == "2" and row["requests"] == 30
    assert row["rounds"] == 2 and row["mode"] == mode
    for name in ("measured", "simulated"):
        assert 0 < row[f"{name}_p50_ms"] <= row[f"{name}_p99_ms"]
        assert row[f"{name}_p99_lo_ms"] <= row[f"{name}_p99_ms"] <= row[f"{name}_p99_hi_ms"]
    assert row["p99_ratio"] > 0 and row["below_ceiling"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


#: Seconds after which processes still alive are taken as left behind (no duration is
#: asserted: they are given far longer than any machine needs).
HANG_S = 60


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "processes", "named"),
                         [("concurrent", 3, "sparse server 0"),
                          ("replay", 2, "server under test")])
def test_killed_server_ends_the_run_naming_it(mode: str, processes: int, named: str,
                                              tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "autoshard", "serve", "bench", "--model", "bench",
           "--strategy", "capacity_balanced", "--servers", "2", "--qps", "40",
           "--requests", "4000", "--timeout", "60", "--logs", str(logs), "--mode", mode]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # A server that never starts serving ends the command by its own watchdog (--timeout).
        progress = None
        while progress is None:
            found = list(logs.glob("*/rank1.progress"))
            if found and found[0].read_text() == "serving":
                progress = found[0]
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        work = progress.parent
        pids = [int(p.read_text()) for p in work.glob("rank*.pid")]
        assert len(pids) == processes
        os.kill(int((work / "rank1.pid").read_text()), signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2
    assert named in err
    gone = time.monotonic() + HANG_S  # the processes are reaped; a hang guard, not a timing
    while [p for p in pids if _alive(p)] and time.monotonic() < gone:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)]


@pytest.mark.slow
def test_calibration_measures_every_calibrated_field() -> None:
    import math

    from autoshard.serving.calibrate import calibrate
    from autoshard.serving.cluster import CALIBRATED, with_calibration

    found = calibrate(calls=8)
    assert set(CALIBRATED) <= set(found)
    assert all(math.isfinite(float(found[k])) and float(found[k]) >= 0 for k in CALIBRATED)
    assert found["network_gbps"] == found["nic_gbps"] and len(found["payload"]) == 4
    profile = with_calibration(load_serving_profile("local-cpu"), found, "here")
    assert profile.name == "here" and profile.host_cores >= 1
