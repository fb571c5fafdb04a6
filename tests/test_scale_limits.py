"""Large tasks and time limits: the learned sharder keeps its limit by dropping decodes that
cannot end in time (and says so), and recshard, on tasks too large for one MILP, starts from a
plan the search stage has polished rather than from a bare greedy one.

The limits are kept on a fake clock (:mod:`clocks`), so what they cut is counted in readings
and is the same on every machine."""

from __future__ import annotations

import pytest
from clocks import fake_perf_counter

from autoshard.errors import DeadlineReached
from autoshard.layout.shards import check_layout
from autoshard.policy.network import PROJECT_AFTER, decode, load_policy
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate, plan_cost_ms
from autoshard.sharders import get_sharder
from autoshard.sharders.ppo import DEFAULT_POLICY, PPOPolicySharder, PPOSharder, tuning
from autoshard.sharders.ppo.candidates import FALLBACK
from autoshard.sharders.recshard import RecShard
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()


def _task(tables: int = 300, devices: int = 16):
    return constrained_task(dlrm_tables(tables, seed=3), devices, hbm_fraction=0.3)


def test_a_decode_stops_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    net, multipliers, _ = load_policy(DEFAULT_POLICY)
    task = _task()
    clock = fake_perf_counter(monkeypatch, 1.0)
    with pytest.raises(DeadlineReached):
        decode(net, multipliers, task, MODEL, deadline=0.5)  # past at its first reading
    assert clock.readings <= 2


def test_a_decode_that_would_end_past_its_deadline_stops_well_before_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    net, multipliers, _ = load_policy(DEFAULT_POLICY)
    task = _task()
    assert task.table_arrays.rows.size == task.num_tables  # built before the decodes
    clock = fake_perf_counter(monkeypatch, 1.0)  # the decode reads it once a step
    steps = task.num_tables  # a whole decode: one step per table, so ~300 s on this clock
    with pytest.raises(DeadlineReached):  # its first tenth of the tables projects the end
        decode(net, multipliers, task, MODEL, deadline=steps / 2)
    assert clock.now <= PROJECT_AFTER * steps + 2


#: Seconds the fake clock advances at each reading in the sharders' runs below.
STEP_S = 1e-3


def test_ppo_under_a_short_limit_keeps_its_fallback_and_says_what_was_cut(
        monkeypatch: pytest.MonkeyPatch) -> None:
    task = _task()
    assert task.table_arrays.rows.size == task.num_tables  # built before the sharder runs
    limit = 0.01
    clock = fake_perf_counter(monkeypatch, STEP_S)
    sharded = PPOSharder(time_limit=limit).solve(task, MODEL)
    assert clock.now <= limit + 10 * STEP_S  # the fallback's polish ends soon after the limit
    monkeypatch.undo()
    plan, choice = sharded.plan, sharded.details
    check_layout(plan, task)
    assert choice.winner.split("+")[0] == FALLBACK
    assert not any(name.startswith("ppo-") for name in choice.costs)  # no decode ended
    assert sharded.notes and all("ppo" in note for note in sharded.notes)
    assert evaluate(plan, task, MODEL).step_cost_ms <= choice.costs[FALLBACK]


@pytest.mark.slow
def test_ppo_with_time_decodes_and_its_notes_are_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    task = _task()
    # The group re-solve that ends the search stage cuts nothing and adds no note: left out.
    monkeypatch.setattr(tuning, "MIN_RESOLVE_S", float("inf"))
    clock = fake_perf_counter(monkeypatch, STEP_S)
    sharded = PPOSharder(time_limit=60.0).solve(task, MODEL)
    assert clock.now < 60.0
    assert sharded.notes == ()
    assert any(name.startswith("ppo-") for name in sharded.details.costs)


@pytest.mark.slow
def test_the_policy_alone_keeps_its_first_decode_under_any_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    task = _task()
    fake_perf_counter(monkeypatch, STEP_S)
    sharded = PPOPolicySharder(time_limit=0.01).solve(task, MODEL)
    check_layout(sharded.plan, task)
    # No fallback: the whole-table decode ran to its end past the limit; the later decodes
    # (in the other refill modes, and with light tables replicated) were cut, and the notes
    # say so.
    assert list(sharded.details.costs) == ["ppo-greedy"]
    notes = sharded.notes
    assert any("ppo-refill" in n for n in notes) and any("ppo-replicas" in n for n in notes)
    roomy = PPOPolicySharder(time_limit=60.0).solve(task, MODEL)
    assert "ppo-replicas-greedy" in roomy.details.costs


@pytest.mark.slow
def test_recshard_beyond_the_whole_milp_starts_from_a_searched_plan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    task = _task(600, 16)  # 9,600 (table, device) pairs: past max_pairs, no whole MILP
    sharder = RecShard(time_limit=6.0, split=False)
    assert task.num_tables * task.num_devices > sharder.max_pairs
    fake_perf_counter(monkeypatch, 0.05)
    result = sharder.solve(task, MODEL).details
    monkeypatch.undo()
    plan = result.plan
    assert result.warm_start.endswith("+search")
    greedy = plan_cost_ms(get_sharder(FALLBACK).shard(task, MODEL), task, MODEL)
    assert result.warm_cost_ms < greedy
    assert evaluate(plan, task, MODEL).step_cost_ms <= result.warm_cost_ms * (1 + 1e-9)


def test_a_polish_round_prices_a_spread_of_items_on_thousands_of_tables() -> None:
    import numpy as np

    from autoshard.search.move_search import _spread

    items = np.arange(10, 5010)
    price = np.random.default_rng(0).random(items.size)
    picked = _spread(items, price, 100)
    assert picked.size == 100 and np.all(np.diff(picked) > 0) and np.isin(picked, items).all()
    assert items[np.argmin(price)] in picked and items[np.argmax(price)] in picked
    ranks = np.argsort(np.argsort(price))[np.searchsorted(items, picked)]
    assert np.all(np.diff(np.sort(ranks)) <= 51)  # evenly over the ranking
    assert np.array_equal(_spread(items[:50], price[:50], 100), items[:50])
