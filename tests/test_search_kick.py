"""Kicks: moves at random off the most loaded devices, polished again, the best kept."""

from __future__ import annotations

import numpy as np
import pytest
from clocks import fake_perf_counter

from autoshard.layout.shards import check_layout, one_per_device, plan_layout
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.search.kick import kick_plan
from autoshard.search.polish import polish_plan
from autoshard.sharders import get_sharder
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()


def test_escapes_the_polishs_local_optimum_with_torchrecs_room(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # With TorchRec's buffers reserved per table a polished plan stops where no single move
    # helps; kicks find a cheaper one, within every capacity as the runtime counts it. Time
    # guards read a step clock (1 ms a reading): the same work on any machine.
    fake_perf_counter(monkeypatch, 1e-3)
    task = constrained_task(dlrm_tables(80, seed=21), 8, 0.1, reservation="torchrec")
    plan, cost = polish_plan(get_sharder("lookup_greedy").shard(task, MODEL), task, MODEL)
    out, after = kick_plan(plan, task, MODEL, cost, seconds=60.0)
    check_layout(out, task)
    assert after == pytest.approx(evaluate(out, task, MODEL).step_cost_ms, rel=1e-9)
    assert after < cost


def test_same_seed_same_plan_and_never_worse(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a step clock (1 ms a reading) the time guards cut at the same step each run."""
    fake_perf_counter(monkeypatch, 1e-3)
    task = constrained_task(dlrm_tables(30, seed=11), 8, 0.2, reservation="torchrec")
    plan = get_sharder("split_lookup_greedy").shard(task, MODEL)
    cost = evaluate(plan, task, MODEL).step_cost_ms
    a, ca = kick_plan(plan, task, MODEL, cost, seed=3, seconds=60.0)
    b, cb = kick_plan(plan, task, MODEL, cost, seed=3, seconds=60.0)
    assert ca == cb and a == b and ca <= cost
    # Row shards TorchRec routes stay one per device.
    layout = plan_layout(a, task)
    g = layout.geometry
    for t in np.unique(g.table[one_per_device(task, g)]):
        on = layout.device[g.table == t]
        assert np.unique(on).size == on.size
    # No kick, no change.
    same, c = kick_plan(plan, task, MODEL, cost, kicks=0)
    assert same is plan and c == cost
