"""Reports show the HBM a task keeps for its runtime, per device, and a lower bound valid for the
task as posed (counting that reservation) beside the weights-only one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli as run
from clocks import fake_perf_counter

from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.bounds import lower_bound_ms
from autoshard.pricing.evaluator import evaluate
from autoshard.reservation import NO_RESERVATION
from autoshard.sharders import get_sharder
from autoshard.sharders.ppo import tuning
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_reserved_bound_holds_for_every_sharder_and_is_tighter(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuning, "MIN_RESOLVE_S", float("inf"))  # ppo's plan, no closing LNS
    task = constrained_task(dlrm_tables(30, seed=seed), 4, 0.3, reservation="torchrec")
    # The evaluator's bounds count replicated tables too (every plan of the task).
    weights = lower_bound_ms(task, MODEL, replicas=True)
    reserved = lower_bound_ms(task, MODEL, reserved=True, replicas=True)
    assert reserved > weights > 0
    assert weights <= lower_bound_ms(task, MODEL) * (1 + 1e-12)
    for name in ("lookup_greedy", "size_lookup_greedy", "split_lookup_greedy", "ppo"):
        report = evaluate(get_sharder(name).shard(task, MODEL), task, MODEL)
        assert report.step_cost_ms >= reserved * (1 - 1e-9), name
        assert report.lower_bound_ms == pytest.approx(reserved)
        assert report.weights_bound_ms == pytest.approx(weights)
        assert report.cost_ratio == pytest.approx(report.step_cost_ms / reserved)


def test_without_a_reservation_both_bounds_are_one() -> None:
    task = constrained_task(dlrm_tables(20, seed=4), 4, 0.3)
    assert task.reservation == NO_RESERVATION
    assert lower_bound_ms(task, MODEL, reserved=True) == pytest.approx(lower_bound_ms(task, MODEL))
    report = evaluate(get_sharder("lookup_greedy").shard(task, MODEL), task, MODEL)
    assert report.lower_bound_ms == report.weights_bound_ms
    assert all(d.hbm_reserved_bytes == 0 for d in report.per_device)


def test_per_device_hbm_adds_up() -> None:
    task = constrained_task(dlrm_tables(20, seed=5), 4, 0.3, reservation="torchrec")
    report = evaluate(get_sharder("lookup_greedy").shard(task, MODEL), task, MODEL)
    for d in report.per_device:
        assert d.hbm_reserved_bytes > 0 and d.hbm_free_bytes >= 0
        assert d.hbm_bytes + d.hbm_reserved_bytes + d.hbm_free_bytes == pytest.approx(
            d.hbm_capacity_bytes, abs=2)
    placed = np.array([d.tables for d in report.per_device])
    assert placed.sum() == task.num_tables


@pytest.mark.slow
def test_default_task_with_5_gb_shows_the_reservation_and_recshard_meets_the_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """The default task with --hbm-gb 5 keeps most of its HBM for TorchRec's buffers: the
    weights-only bound is far below any plan, the reservation-aware one is not. recshard's
    limit is kept on a fake clock, 0.2 s a reading."""
    fake_perf_counter(monkeypatch, 0.2)
    plan = tmp_path / "plan.json"
    code, out, err = run(["plan", "-t", "default", "-s", "recshard", "--hbm-gb", "5",
                          "--time-limit", "20", "-o", str(plan), "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["reservation"] == "torchrec"
    assert all(d["hbm_reserved_bytes"] > 0 for d in report["per_device"])
    assert report["weights_bound_ms"] < 0.5 * report["lower_bound_ms"]
    assert report["cost_ratio"] <= 1.10
    # the solver's own word first; a deadline reached on the fake clock is named after it
    status = report["solver"]["status"].split(";")[0]
    assert status in ("Optimal", "stalled", "search", "Time limit reached"), status
    code, text, _ = run(["evaluate", str(plan)], capsys)
    assert code == 0 and "HBM reserved for the runtime ('torchrec' reservation" in text
    assert "weights-only bound" in text
