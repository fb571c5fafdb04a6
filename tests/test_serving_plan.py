"""Capacity planning: feasibility, intervals, replicas, and the answer across strategies."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.serving.cluster import load_serving_profile
from autoshard.serving.evaluation import Evaluator, Interval
from autoshard.serving.planning import PlanOptions, answer, server_range, sweep
from autoshard.serving.suites import suite_model
from autoshard.serving.task import ServingTask
from tests.serving_helpers import profile, two_group_model


def test_interval_is_students_t_over_samples() -> None:
    got = Interval.of(np.array([1.0, 2.0, 3.0]))
    assert got.mean == 2.0
    assert got.hi - got.mean == pytest.approx(4.3027 / np.sqrt(3), rel=1e-3)


@pytest.fixture(scope="module")
def medium_60k() -> ServingTask:
    return ServingTask(suite_model("medium"), load_serving_profile("cpu-256gb"), qps=60_000.0,
                       p99_ms=100.0, requests=1500, samples=3)


def test_past_capacity_never_meets_a_target(medium_60k: ServingTask) -> None:
    rows, _ = sweep(medium_60k, ["capacity_balanced", "feature_group"],
                    server_range(medium_60k, 2), PlanOptions(replicas=False))
    assert rows and all(not r["meets"] and not r["feasible"] for r in rows)
    assert all(r["max_utilisation"] >= 0.8 for r in rows)
    assert all(np.isfinite(r["p99_hi_ms"]) for r in rows)
    assert answer(rows) is None


def test_replicas_bring_every_server_below_the_ceiling(medium_60k: ServingTask) -> None:
    rows, found = sweep(medium_60k, ["load_balanced"], server_range(medium_60k, 1))
    (row,) = rows
    assert row["meets"] and row["max_utilisation"] < 0.8 and row["max_nic_utilisation"] < 0.8
    mapping = found[("load_balanced", row["servers"])].mapping
    assert mapping.main_replicas >= 2 and mapping.total_servers == row["total_servers"]
    assert answer(rows) == row


def test_meeting_needs_every_sample_within_the_target() -> None:
    task = ServingTask(two_group_model(coverage=0.5), profile(tail_sigma=0.6), qps=1500.0,
                       requests=600, samples=3)
    from autoshard.serving.registry import get_strategy

    mapping = get_strategy("feature_group").map(task, 2).with_replicas((1, 1), 1)
    result = Evaluator(task).evaluate(mapping)
    p99, worst = result.percentile(99), float(result.per_sample(99).max())
    fresh = Interval.of_one(result.per_sample(99))  # where one more sample's P99 lies
    assert result.feasible and p99.lo < p99.mean < worst < p99.hi < fresh.hi
    assert not result.meets(worst * 0.9999)
    assert result.meets(worst) and result.marginal(worst)
    assert result.meets(fresh.hi * 1.0001) and not result.marginal(fresh.hi * 1.0001)


def _row(name: str, total: int, p99: float, half: float = 0.1, **more: object
         ) -> dict[str, object]:
    return {"strategy": name, "servers": 3, "total_servers": total, "cost": float(total),
            "p99_ms": p99, "p99_lo_ms": p99 - half, "p99_hi_ms": p99 + half, "meets": True,
            "feasible": True, **more}


def test_ties_on_servers_go_to_the_first_strategy_whatever_its_p99() -> None:
    rows = [_row("capacity_balanced", 4, 3.0), _row("load_balanced", 4, 2.5),
            _row("optimiser", 5, 1.0)]
    best = answer(rows)
    assert best is not None and best["strategy"] == "capacity_balanced"
    best = answer(rows, "cost")
    assert best is not None and best["strategy"] == "capacity_balanced"
    best = answer([dict(rows[0], meets=False), *rows[1:]])
    assert best is not None and best["strategy"] == "load_balanced"


def test_seed_check_names_the_servers_that_hold_on_every_seed() -> None:
    from autoshard.serving.planning import seed_check

    first = _row("feature_group", 7, 2.0, marginal=False)
    same = seed_check(first, [dict(first), dict(first)], [True, True])
    assert same == {"same": True, "marginal": False, "servers_on_every_seed": 7}
    # another seed needs 8 servers, and the first answer's deployment misses there
    other = seed_check(first, [dict(first), _row("feature_group", 8, 1.9)], [True, False])
    assert other == {"same": False, "marginal": True, "servers_on_every_seed": 8}
    assert seed_check(dict(first, marginal=True), [], [])["marginal"]
    assert seed_check(first, [None], [True])["servers_on_every_seed"] is None


def test_prediction_interval_is_wider_than_the_mean_s() -> None:
    values = np.array([1.0, 2.0, 3.0])
    one = Interval.of_one(values)
    assert one.mean == 2.0
    assert one.hi - one.mean == pytest.approx(4.3027 * np.sqrt(1 + 1 / 3), rel=1e-3)


def test_the_answer_is_the_fewest_servers_whatever_the_strategy() -> None:
    task = ServingTask(two_group_model(), profile(main_memory_gb=50.0), qps=100.0,
                       p99_ms=50.0, requests=500, samples=3)
    rows, _ = sweep(task, ["capacity_balanced", "main_only"], server_range(task, 1))
    best = answer(rows)
    assert best is not None and best["strategy"] == "main_only" and best["total_servers"] == 1


def test_the_optimiser_is_compared_at_equal_servers() -> None:
    from autoshard.serving.planning import advantage_at_equal_servers

    rows = [_row("optimiser", 7, 4.6, validation_p99_ms=4.6),
            _row("capacity_balanced", 8, 4.0, validation_p99_ms=4.0),
            _row("feature_group", 7, 4.8, validation_p99_ms=4.7),
            _row("load_balanced", 7, 4.75, validation_p99_ms=4.9)]
    (adv,) = advantage_at_equal_servers(rows)
    # chosen on the validation samples (4.7 < 4.9), not on the judged P99 (4.75 < 4.8)
    assert adv["best_baseline"] == "feature_group" and adv["equal_servers"]
    assert adv["lowest_baseline_p99_ms"] == 4.75
    assert adv["p99_reduction"] == round(1 - 4.6 / 4.8, 4) and not adv["within_noise"]
    (adv,) = advantage_at_equal_servers([_row("optimiser", 6, 4.6), *rows[1:]])
    assert not adv["equal_servers"] and adv["best_baseline_total_servers"] == 7
