"""Large tasks and time limits: the learned sharder keeps its limit by dropping decodes that
cannot end in time (and says so), and recshard, on tasks too large for one MILP, starts from a
plan the search stage has polished rather than from a bare greedy one."""

from __future__ import annotations

import time

import pytest

from autoshard.errors import DeadlineReached
from autoshard.layout.shards import check_layout
from autoshard.policy.network import decode, load_policy
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate, plan_cost_ms
from autoshard.sharders import get_sharder
from autoshard.sharders.ppo import DEFAULT_POLICY, PPOPolicySharder, PPOSharder
from autoshard.sharders.ppo.candidates import FALLBACK
from autoshard.sharders.recshard import RecShard
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()


def _task(tables: int = 300, devices: int = 16):
    return constrained_task(dlrm_tables(tables, seed=3), devices, hbm_fraction=0.3)


def test_a_decode_stops_at_its_deadline() -> None:
    net, multipliers, _ = load_policy(DEFAULT_POLICY)
    with pytest.raises(DeadlineReached):
        decode(net, multipliers, _task(), MODEL, deadline=time.perf_counter())


def test_a_decode_that_would_end_past_its_deadline_stops_well_before_it() -> None:
    net, multipliers, _ = load_policy(DEFAULT_POLICY)
    task = _task()
    assert task.table_arrays.rows.size == task.num_tables  # built before the decodes
    start = time.perf_counter()
    decode(net, multipliers, task, MODEL)
    whole = time.perf_counter() - start
    start = time.perf_counter()
    with pytest.raises(DeadlineReached):  # its first tenth of the tables projects the end
        decode(net, multipliers, task, MODEL, deadline=start + whole / 2)
    assert time.perf_counter() - start < whole / 2


def test_ppo_under_a_short_limit_keeps_its_fallback_and_says_what_was_cut() -> None:
    task = _task()
    assert task.table_arrays.rows.size == task.num_tables  # built before the sharder runs
    sharder = PPOSharder(time_limit=0.01)
    start = time.perf_counter()
    sharded = sharder.solve(task, MODEL)
    assert time.perf_counter() - start < 2.0
    plan, choice = sharded.plan, sharded.details
    check_layout(plan, task)
    assert choice.winner.split("+")[0] == FALLBACK
    assert not any(name.startswith("ppo-") for name in choice.costs)  # no decode ended
    assert sharded.notes and all("ppo" in note for note in sharded.notes)
    assert evaluate(plan, task, MODEL).step_cost_ms <= choice.costs[FALLBACK]


def test_ppo_with_time_decodes_and_its_notes_are_empty() -> None:
    task = _task()
    sharded = PPOSharder(time_limit=60.0).solve(task, MODEL)
    assert sharded.notes == ()
    assert any(name.startswith("ppo-") for name in sharded.details.costs)


def test_the_policy_alone_keeps_its_first_decode_under_any_limit() -> None:
    task = _task()
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


def test_recshard_beyond_the_whole_milp_starts_from_a_searched_plan() -> None:
    task = _task(600, 16)  # 9,600 (table, device) pairs: past max_pairs, no whole MILP
    sharder = RecShard(time_limit=6.0, split=False)
    assert task.num_tables * task.num_devices > sharder.max_pairs
    result = sharder.solve(task, MODEL).details
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
