"""recshard keeps its time limit in every phase, the setup before its first plan included.

The limits are kept on a fake clock (:mod:`clocks`) that also counts the pricing done, so what
they cut is the same on every machine."""

from __future__ import annotations

import time

import numpy as np
import pytest
from clocks import StepClock

from autoshard.errors import DeadlineReached
from autoshard.layout.shards import check_layout
from autoshard.pricing import curves
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.cost import Pricing
from autoshard.pricing.curves import cost_curves, device_kinds, price_total
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders import get_sharder
from autoshard.sharders.recshard import DEADLINE_STATUS, NO_SPLIT_STATUS, RecShard
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()


#: Seconds the fake clock advances at each reading.
STEP_S = 1e-3


class _Clock(StepClock):
    """A fake ``time.perf_counter``: :data:`STEP_S` a reading plus what the slow cost model
    has charged (``charged``, s)."""

    def __init__(self) -> None:
        super().__init__(STEP_S)
        self.charged = 0.0

    def __call__(self) -> float:
        return super().__call__() + self.charged


class _SlowModel:
    """The analytical model, charging ``per_point`` fake seconds per priced point."""

    name = "slow-analytical"

    def __init__(self, clock: _Clock, per_point: float) -> None:
        self.clock, self.per_point = clock, per_point

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        self.clock.charged += self.per_point * np.asarray(table_idx).size
        return MODEL.price(task, table_idx, device_idx, hbm_rows)


def _task(tables: int) -> ShardingTask:
    task = constrained_task(dlrm_tables(tables, seed=0), 8, hbm_fraction=0.3)
    assert task.table_arrays.rows.size == tables  # built once, shared by every sharder
    return task


def test_pricing_past_its_deadline_stops_between_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    task = _task(300)
    monkeypatch.setattr(curves, "PRICE_CHUNK", 500)
    with pytest.raises(DeadlineReached):
        cost_curves(task, MODEL, device_kinds(task), deadline=time.perf_counter() - 1.0)
    t = np.arange(task.num_tables)
    zeros = np.zeros(t.size, dtype=np.int64)
    rows = task.table_arrays.rows.astype(float) / 2
    expected = MODEL.price(task, t, zeros, rows).total_ms
    assert np.allclose(price_total(task, MODEL, t, zeros, rows, np.inf), expected)


@pytest.mark.parametrize("split", [False, True])
def test_slow_setup_returns_the_cheap_plan_by_the_deadline(
        monkeypatch: pytest.MonkeyPatch, split: bool) -> None:
    """Pricing charged so dear that the setup cannot finish in the limit: the first warm start
    comes back, in time (fake clock: deterministic), with the deadline in its status."""
    clock = _Clock()
    monkeypatch.setattr(curves, "PRICE_CHUNK", 2000)
    task = _task(400)
    greedy = get_sharder("lookup_greedy").shard(task, MODEL)
    per_point = 1e-3  # one pricing chunk: 2 fake seconds; the whole curves: far past the limit
    monkeypatch.setattr(time, "perf_counter", clock)
    start = clock()
    result = RecShard(time_limit=5.0, split=split).solve(task,
                                                         _SlowModel(clock, per_point)).details
    elapsed = clock() - start
    monkeypatch.undo()
    assert elapsed <= 5.0 + 2000 * per_point + 0.1  # at most one chunk past the limit
    assert DEADLINE_STATUS in result.status
    assert (NO_SPLIT_STATUS in result.status) == split
    greedy_cost = evaluate(greedy, task, MODEL).step_cost_ms
    assert result.step_cost_ms == pytest.approx(greedy_cost, rel=1e-9)
    check_layout(result.plan, task)


@pytest.mark.slow
def test_returns_within_the_limit_on_a_large_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 tables x 64 devices with a 2 s limit (the old setup alone ran past it several
    times over), pricing charged 1 us a point (about this machine's rate): the cheap first
    plan comes back within the limit and one pricing chunk."""
    task = constrained_task(dlrm_tables(10_000, seed=0), 64, hbm_fraction=0.3)
    assert task.table_arrays.rows.size == 10_000  # the task's own arrays, built beforehand
    clock = _Clock()
    per_point = 1e-6
    monkeypatch.setattr(time, "perf_counter", clock)
    result = RecShard(time_limit=2.0).solve(task, _SlowModel(clock, per_point)).details
    elapsed = clock.now + clock.charged
    monkeypatch.undo()
    assert elapsed <= 2.0 + curves.PRICE_CHUNK * per_point + 0.1
    assert DEADLINE_STATUS in result.status
    check_layout(result.plan, task)


def test_slow_pricing_stops_before_it_would_overrun(monkeypatch: pytest.MonkeyPatch) -> None:
    """Points dear enough that the rest cannot be priced in time: the first call's pace says
    so and pricing stops then, not after the deadline (fake clock: deterministic)."""
    clock = _Clock()
    task = _task(300)
    t = np.repeat(np.arange(task.num_tables), 20)
    zeros = np.zeros(t.size, dtype=np.int64)
    rows = np.ones(t.size)
    slow = _SlowModel(clock, 1e-3)  # 6,000 points: 6 fake seconds in all
    monkeypatch.setattr(time, "perf_counter", clock)
    with pytest.raises(DeadlineReached, match="points left"):
        price_total(task, slow, t, zeros, rows, clock() + 3.0)
    monkeypatch.undo()
    assert clock.charged == pytest.approx(curves.FIRST_CHUNK * 1e-3)  # one call, then stopped


def test_planning_for_two_models_keeps_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``also_for``: every step gets at most what is left of the limit, and a step with
    almost nothing left is not run (each step here overruns its share by half: the blend
    would have run past the limit)."""
    from autoshard.sharders.base import Sharded
    from autoshard.sharders.recshard_blend import solve_both
    from autoshard.sharders.recshard_tables import RecShardResult

    clock = _Clock()
    task = _task(40)
    plan = get_sharder("lookup_greedy").shard(task, MODEL)
    given: list[float] = []

    class _Step:
        def __init__(self, seconds: float) -> None:
            self.seconds = seconds

        def solve(self, task: ShardingTask, model: object) -> Sharded[RecShardResult]:
            given.append(self.seconds)
            clock.charged += 1.5 * self.seconds
            return Sharded(plan, RecShardResult(plan, 1.0, 0.5, 0.5, 0.0, "milp", "Optimal",
                                                "greedy", 1.0))

    monkeypatch.setattr(time, "perf_counter", clock)
    start = clock()
    result = solve_both(_Step, task, (MODEL, MODEL), 9.0, "recshard")
    elapsed = clock() - start
    monkeypatch.undo()
    assert given == [pytest.approx(3.0), pytest.approx(3.0)]
    assert elapsed <= 9.0 + 1.0  # the two steps' 9 fake seconds and the real pricing
    assert "time limit: blend plan not made" in result.status
