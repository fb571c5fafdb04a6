"""Mapping strategies, the optimiser and capacity planning, on hand-checkable models."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.errors import InputError, PlannerError
from autoshard.serving.mapping import MAIN
from autoshard.serving.planning import (
    Evaluator,
    advantage_at_equal_servers,
    fewest_servers,
    server_range,
    sweep,
)
from autoshard.serving.registry import get_strategy, parse_strategies, strategy_names
from autoshard.serving.suites import suite_model
from autoshard.serving.task import ServingTask
from tests.serving_helpers import gb_table, profile, two_group_model


def task_of(model: object, **changes: object) -> ServingTask:
    return ServingTask(model, profile(**changes), qps=200.0, p99_ms=5.0,  # type: ignore[arg-type]
                       requests=2000)


def test_memory_bound_on_servers() -> None:
    task = task_of(two_group_model())  # 40 GB of tables, 25 GB servers, 15 GB main
    assert task.min_servers() == 2


def test_singular_only_when_the_main_server_holds_everything() -> None:
    with pytest.raises(PlannerError, match="main server"):
        get_strategy("singular").map(task_of(two_group_model()), 0)
    mapping = get_strategy("singular").map(task_of(two_group_model(), main_memory_gb=50.0), 0)
    assert set(mapping.assign) == {MAIN}


def test_capacity_balanced_splits_bytes_evenly() -> None:
    mapping = get_strategy("capacity_balanced").map(task_of(two_group_model()), 2)
    assert sorted(np.bincount(mapping.array)) == [2, 2]


def test_feature_group_keeps_groups_together_and_cuts_fan_out() -> None:
    task = task_of(two_group_model(coverage=0.3))
    fg = get_strategy("feature_group").map(task, 2)
    assert fg.assign[0] == fg.assign[1] and fg.assign[2] == fg.assign[3]
    cb = get_strategy("capacity_balanced").map(task, 2)
    ev = Evaluator(task)
    assert ev.simulate(fg).calls.mean() < ev.simulate(cb).calls.mean()


def test_a_table_larger_than_any_server_is_bad_input() -> None:
    from autoshard.serving.model import build_model

    model = build_model("big", [gb_table("huge", 30)], items=1)
    with pytest.raises(InputError, match=r"huge\.rows"):
        task_of(model)


def test_fewer_servers_than_memory_needs_is_refused() -> None:
    with pytest.raises(PlannerError, match="at least 2"):
        get_strategy("load_balanced").map(task_of(two_group_model()), 1)


def test_unknown_strategy_names_the_field() -> None:
    with pytest.raises(InputError, match="strategy"):
        get_strategy("nope")
    with pytest.raises(InputError, match="nope"):
        parse_strategies("feature_group,nope")


def test_optimiser_never_worse_than_the_best_baseline() -> None:
    model = suite_model("sparse")
    from autoshard.serving.profile import load_serving_profile

    task = ServingTask(model, load_serving_profile("cpu-256gb"), qps=5000.0, p99_ms=1.0,
                       requests=3000)
    rows = sweep(task, strategy_names(), server_range(task, 2),
                 {"optimiser": {"iterations": 60, "search_requests": 1000}})
    for adv in advantage_at_equal_servers(rows):
        assert adv["optimiser_p99_ms"] <= adv["best_baseline_p99_ms"] + 1e-9
    fewest = fewest_servers(rows, 1e9)
    assert fewest["optimiser"] == task.min_servers()
    assert fewest["singular"] is None


def test_fewest_servers_picks_the_smallest_count_meeting_the_target() -> None:
    rows = [{"strategy": "x", "servers": 3, "p99_ms": 9.0},
            {"strategy": "x", "servers": 4, "p99_ms": 4.0},
            {"strategy": "x", "servers": 5, "p99_ms": 3.0},
            {"strategy": "y", "servers": 3, "error": "no"}]
    assert fewest_servers(rows, 5.0) == {"x": 4, "y": None}
