"""The search stage's large-neighbourhood search (:mod:`autoshard.search.lns`) run from a
finished plan, its pinned shards kept where that plan put them, as ``ppo`` ends its improvement
stage with it. The searches here end by themselves (a round of devices that brings nothing),
long before their far deadline, so that no result depends on the machine's speed."""

from __future__ import annotations

import time

import numpy as np
import pytest
from clocks import fake_perf_counter

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
from autoshard.search import lns
from autoshard.search.lns import resolve_plan
from autoshard.search.polish import polish_plan
from autoshard.sharders import get_sharder
from autoshard.sharders.ppo import tuning
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()
#: Seconds from now to a deadline that no search here reaches.
FAR = 1e4


def _row_split_plan():
    """A polished plan with a row-wise table whose shards TorchRec routes one per device
    (split_lookup_greedy on 16 tables, 8 devices, TorchRec's room), that table's shards."""
    task = constrained_task(dlrm_tables(16, seed=0), 8, 0.3, reservation="torchrec")
    plan, cost = polish_plan(get_sharder("split_lookup_greedy").shard(task, MODEL), task, MODEL)
    g = plan_layout(plan, task).geometry
    pinned = one_per_device(task, g)
    assert pinned.any()
    return task, plan, cost, np.flatnonzero(g.table == g.table[pinned][0])


@pytest.mark.slow
def test_lifts_a_polished_plan_and_prices_it_as_the_evaluator_does() -> None:
    task, plan, cost, _ = _row_split_plan()
    out, after = resolve_plan(plan, task, MODEL, cost, time.perf_counter() + FAR)
    check_layout(out, task)
    assert after == pytest.approx(evaluate(out, task, MODEL).step_cost_ms, rel=1e-9)
    assert after < cost


@pytest.mark.slow
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
    out, after = resolve_plan(rotated, task, MODEL, before, time.perf_counter() + FAR)
    check_layout(out, task)
    assert after < before
    assert np.array_equal(plan_layout(out, task).device[idx], device[idx])


def test_never_worse_and_the_input_itself_when_no_time_is_left() -> None:
    task, plan, cost, _ = _row_split_plan()
    same, c = resolve_plan(plan, task, MODEL, cost, time.perf_counter())
    assert same is plan and c == cost


@pytest.mark.slow
def test_ppo_ends_with_it_from_its_cheapest_candidate_until_the_end_of_its_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    task = constrained_task(dlrm_tables(20, seed=3), 4, 0.2, reservation="torchrec")
    calls: list[tuple[float, float]] = []

    def recorded(plan: Plan, task: ShardingTask, cost_model: CostModel, cost: float,
                 deadline: float, seed: int = 0) -> tuple[Plan, float]:
        calls.append((cost, deadline))
        return plan, cost

    monkeypatch.setattr(lns, "resolve_plan", recorded)
    limit = 100.0  # far more than the stage needs here: the re-solve always has its time
    sharder = get_sharder("ppo", time_limit=limit)
    clock = fake_perf_counter(monkeypatch, 1e-3)
    began = clock.now
    choice = sharder.solve(task, MODEL).details
    ended = clock.now
    # Run once, from the cheapest candidate before it, until the end of the limit.
    assert len(calls) == 1
    before = min(c.cost_ms for c in choice.candidates)
    assert calls[0][0] == before
    assert began + limit <= calls[0][1] <= ended + limit
    assert not any(step == "lns" for c in choice.candidates for step, _ in c.steps)
    # A cheaper plan from it wins, with the step `lns` (named `<winner>+lns`).
    monkeypatch.setattr(lns, "resolve_plan",
                        lambda plan, task, cost_model, cost, deadline, seed=0: (plan, cost / 2))
    sharded = sharder.solve(task, MODEL)
    plan, choice = sharded.plan, sharded.details
    winner = choice.candidates[-1]
    assert winner.name == choice.winner and winner.name.endswith("+lns")
    assert winner.steps[-1] == ("lns", winner.cost_ms)
    assert winner.cost_ms == min(c.cost_ms for c in choice.candidates[:-1]) / 2
    assert plan.provenance is not None and plan.provenance.steps[-1][0] == "lns"
    # Without the time for it, no re-solve.
    calls.clear()
    monkeypatch.setattr(lns, "resolve_plan", recorded)
    monkeypatch.setattr(tuning, "MIN_RESOLVE_S", 1e9)
    choice = sharder.solve(task, MODEL).details
    assert not calls
    assert not any(step == "lns" for c in choice.candidates for step, _ in c.steps)
