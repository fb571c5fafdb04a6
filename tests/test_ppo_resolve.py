"""The group re-solve at the end of ``ppo``'s improvement stage: recshard's large-neighbourhood
search run from a finished plan, its pinned shards kept where that plan put them."""

from __future__ import annotations

import time

import numpy as np
import pytest

from autoshard.layout.plan import Plan
from autoshard.layout.shards import (
    ShardLayout,
    check_layout,
    one_per_device,
    plan_layout,
    split_pins,
)
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.cost import CostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.search.polish import polish_plan
from autoshard.sharders import get_sharder, ppo_stage
from autoshard.sharders.ppo_stage import resolved
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()


def _row_split_plan():
    """A polished plan with a row-wise table whose shards TorchRec routes one per device
    (split_lookup_greedy on 30 tables, 8 devices, TorchRec's room), that table's shards."""
    task = constrained_task(dlrm_tables(30, seed=0), 8, 0.3, reservation="torchrec")
    plan, cost = polish_plan(get_sharder("split_lookup_greedy").shard(task, MODEL), task, MODEL)
    g = plan_layout(plan, task).geometry
    pinned = one_per_device(task, g)
    assert pinned.any()
    return task, plan, cost, np.flatnonzero(g.table == g.table[pinned][0])


def test_lifts_a_polished_plan_and_prices_it_as_the_evaluator_does() -> None:
    task, plan, cost, _ = _row_split_plan()
    out, after = resolved(plan, task, MODEL, cost, time.perf_counter() + 20)
    check_layout(out, task)
    assert after == pytest.approx(evaluate(out, task, MODEL).step_cost_ms, rel=1e-9)
    assert after < cost


def test_pinned_shards_stay_on_the_devices_the_plan_gave_them() -> None:
    # The row shards' devices rotated from the order the split's own pins give them: the
    # search must keep these (a search pinned to the split's order finds no legal move).
    task, plan, _, idx = _row_split_plan()
    layout = plan_layout(plan, task)
    g = layout.geometry
    pins = split_pins(task, g)
    assert pins is not None
    device = layout.device.copy()
    device[idx] = np.roll(device[idx], 3)
    assert not np.array_equal(device[idx], pins[idx])
    rotated = ShardLayout(g, device, layout.hbm_rows).to_plan(task, "rotated")
    before = evaluate(rotated, task, MODEL).step_cost_ms
    out, after = resolved(rotated, task, MODEL, before, time.perf_counter() + 20)
    check_layout(out, task)
    assert after < before
    assert np.array_equal(plan_layout(out, task).device[idx], device[idx])


def test_never_worse_and_the_input_itself_when_no_time_is_left() -> None:
    task, plan, cost, _ = _row_split_plan()
    same, c = resolved(plan, task, MODEL, cost, time.perf_counter())
    assert same is plan and c == cost


def test_ppo_ends_with_it_within_its_time_limit_on_small_tasks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    task = constrained_task(dlrm_tables(40, seed=3), 8, 0.2, reservation="torchrec")
    calls: list[tuple[float, float]] = []

    def recorded(plan: Plan, task: ShardingTask, cost_model: CostModel, cost: float,
                 deadline: float, seed: int = 0) -> tuple[Plan, float]:
        calls.append((cost, deadline))
        return resolved(plan, task, cost_model, cost, deadline, seed)

    monkeypatch.setattr(ppo_stage, "resolved", recorded)
    sharder = get_sharder("ppo", time_limit=5)
    began = time.perf_counter()
    plan = sharder.shard(task, MODEL)
    assert time.perf_counter() - began < 5.5
    choice = sharder.last_choice
    assert choice is not None
    # Run once, from the cheapest candidate before it, until the end of the limit.
    assert len(calls) == 1
    before = min(c for n, c in choice.costs.items() if not n.endswith("+lns"))
    assert calls[0][0] == before and calls[0][1] == pytest.approx(began + 5.0, abs=0.1)
    assert choice.costs[choice.winner] <= before
    if choice.winner.endswith("+lns"):  # (whether it finds a cheaper plan in time varies)
        assert choice.costs[choice.winner] < choice.costs[choice.winner.removesuffix("+lns")]
    assert evaluate(plan, task, MODEL).step_cost_ms == pytest.approx(
        choice.costs[choice.winner], rel=1e-9)
    # A cheaper plan from it wins as `<winner>+lns`.
    monkeypatch.setattr(ppo_stage, "resolved",
                        lambda plan, task, cost_model, cost, deadline, seed=0: (plan, cost / 2))
    sharder.shard(task, MODEL)
    winner = sharder.last_choice.winner
    assert winner.endswith("+lns")
    assert sharder.last_choice.costs[winner] == sharder.last_choice.costs[
        winner.removesuffix("+lns")] / 2
    # Without the time for it, no re-solve.
    calls.clear()
    monkeypatch.setattr(ppo_stage, "resolved", recorded)
    monkeypatch.setattr(ppo_stage, "MIN_RESOLVE_S", 1e9)
    sharder.shard(task, MODEL)
    assert not calls
    assert not any(n.endswith("+lns") for n in sharder.last_choice.costs)
