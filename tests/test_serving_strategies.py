"""Mapping strategies, splits by heat and by size, precision, and the optimiser, on
hand-checkable models."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.errors import InputError, PlannerError
from autoshard.serving.evaluation import Evaluator
from autoshard.serving.hotcold import hot_cold_parts, with_main_cache
from autoshard.serving.mapping import MAIN
from autoshard.serving.model import build_model
from autoshard.serving.parts import fitting_parts, row_bytes
from autoshard.serving.registry import get_strategy, parse_strategies
from autoshard.serving.task import ServingTask
from autoshard.tables import Table
from tests.serving_helpers import gb_table, profile, two_group_model


def task_of(model: object, qps: float = 200.0, **changes: object) -> ServingTask:
    return ServingTask(model, profile(**changes), qps=qps, p99_ms=5.0,  # type: ignore[arg-type]
                       requests=2000, samples=3)


def test_memory_bound_counts_the_headroom() -> None:
    assert task_of(two_group_model()).min_servers() == 2  # 40 GB on 25 GB servers
    assert task_of(two_group_model(), memory_headroom=0.5).min_servers() == 4


def test_main_only_only_when_the_main_server_holds_everything() -> None:
    with pytest.raises(PlannerError, match="main server"):
        get_strategy("main_only").map(task_of(two_group_model()), 0)
    mapping = get_strategy("main_only").map(task_of(two_group_model(), main_memory_gb=50.0), 0)
    assert set(mapping.assign) == {MAIN}
    with pytest.raises(PlannerError, match="no sparse server"):
        get_strategy("main_only").map(task_of(two_group_model(), main_memory_gb=50.0), 2)


def test_singular_is_renamed() -> None:
    with pytest.raises(InputError, match="main_only"):
        get_strategy("singular")
    with pytest.raises(InputError, match="main_only"):
        parse_strategies("feature_group,singular")


def test_capacity_balanced_splits_bytes_evenly() -> None:
    mapping = get_strategy("capacity_balanced").map(task_of(two_group_model()), 2)
    assert sorted(np.bincount(mapping.array)) == [2, 2]


def test_feature_group_keeps_groups_together_and_cuts_fan_out() -> None:
    task = task_of(two_group_model(coverage=0.3))
    fg = get_strategy("feature_group").map(task, 2)
    assert fg.assign[0] == fg.assign[1] and fg.assign[2] == fg.assign[3]
    cb = get_strategy("capacity_balanced").map(task, 2)
    ev = Evaluator(task)
    calls = [np.mean([r.calls.mean() for r in ev.simulate(m.with_replicas((1, 1), 1))])
             for m in (fg, cb)]
    assert calls[0] < calls[1]


def test_a_table_larger_than_a_server_is_row_split_to_fit() -> None:
    model = build_model("big", [gb_table("huge", 60), gb_table("small", 1)], items=1)
    task = task_of(model)
    parts = task.base_parts
    assert parts.size == 4  # 60 GB in 3 parts of 20 GB on 25 GB servers, plus the small one
    big = parts.array == 0
    np.testing.assert_allclose(task.costs.bytes[big], 20e9, rtol=1e-3)
    mapping = get_strategy("capacity_balanced").map(task, task.min_servers())
    mapping.check_fits(task.costs.bytes, task.profile)
    assert len(set(mapping.array[big])) == 3  # the parts of the big table on different servers


def test_quantised_rows_take_less_memory() -> None:
    model = build_model("q", [Table("t", rows=1000, dim=64)], items=1)
    assert row_bytes(model, "fp32")[0] == 256 and row_bytes(model, "fp16")[0] == 128
    assert row_bytes(model, "int8")[0] == 68 and row_bytes(model, "int4")[0] == 36
    big = build_model("big", [gb_table("huge", 60)], items=1)
    assert fitting_parts(big, "int4", 25e9).size == 1  # 60 GB of fp32 is 8.4 GB in int4
    with pytest.raises(InputError, match="precision"):
        ServingTask(big, profile(), qps=1.0, requests=100, precision="int3")


def _skewed(rows: int = 50_000_000) -> ServingTask:
    table = Table("hot", rows=rows, dim=64, pooling_factor=2000.0, zipf_alpha=1.2)
    cold = [gb_table(f"c{i}", 8, coverage=0.05) for i in range(3)]
    return task_of(build_model("skew", [table, *cold], items=1), qps=20_000.0,
                   main_memory_gb=2.0)


def test_hot_cold_cuts_a_hot_table_and_packs_its_hot_part() -> None:
    task = _skewed()
    parts, hot = hot_cold_parts(task)
    assert parts.size in (task.base_parts.size + 1, task.base_parts.size + 2)
    assert hot.sum() == 1 and parts.by_heat[int(np.flatnonzero(hot)[0])]
    shares = parts.shares(task.model)[parts.array == 0]
    assert shares.sum() == pytest.approx(1.0) and shares.max() > 0.5
    mapping = get_strategy("hot_cold").map(task, 2)
    assert "1 hot parts" in mapping.note


def test_main_cache_moves_the_hottest_rows_within_the_main_memory() -> None:
    task = _skewed()
    base = get_strategy("capacity_balanced").map(task, 2)
    cached = with_main_cache(task, base)
    costs = task.costs_for(cached.part_set(4))
    on_main = costs.bytes[cached.array == MAIN].sum()
    assert 0 < on_main <= task.profile.usable_main_bytes
    ev = Evaluator(task)
    remote = [np.mean([(r.shard_utilisation).sum() for r in ev.simulate(m.with_replicas(
        (1, 1), 1))]) for m in (base, cached)]
    assert remote[1] < 0.8 * remote[0]  # the hot rows' lookups no longer go out


def test_optimiser_is_never_worse_than_its_seed_on_validation() -> None:
    from autoshard.serving.optimiser import BASELINES, Optimiser

    task = task_of(two_group_model(coverage=0.4), qps=3000.0)
    found = Optimiser(iterations=20, search_requests=500).map(task, 2)
    assert found.strategy == "optimiser" and "seed" in found.note
    val = Evaluator(task, task.validate_samples)
    seeds = [val.evaluate(get_strategy(n).map(task, 2)) for n in BASELINES]
    mine = val.evaluate(found)
    assert mine.feasible
    best = min(seeds, key=lambda s: (not s.feasible, s.percentile(99).mean))
    assert np.all(mine.per_sample(99) <= best.per_sample(99) + 1e-9)  # sample by sample
