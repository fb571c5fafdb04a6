"""Re-planning from the plan in use within a move budget (``autoshard.plan(previous=...,
move_budget=...)``): a zero budget returns the plan in use priced on the new statistics; the
MILP's move term keeps any limit and finds the optimum a hand count knows; other sharders' plans
are brought within the budget; priced moves pay back within their horizon; new tables and lost
devices are carried; the command line writes the plan and its move."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from cli_helpers import run_cli

import autoshard
from autoshard import MoveBudget
from autoshard.errors import InputError
from autoshard.hardware import HardwareProfile, load_hardware
from autoshard.layout.plan import Placement, Plan
from autoshard.layout.shards import plan_layout
from autoshard.pricing.cost import load_cost_model
from autoshard.pricing.evaluator import evaluate
from autoshard.replan.carry import carry
from autoshard.replan.repair import within_budget
from autoshard.tables import Table, save_tables
from autoshard.task import ShardingTask, Workload

MODEL = load_cost_model("analytical")
#: Every byte a row of a 16-wide FP32 table copies: 64 B of weights, 4 B of optimizer state.
ROW = 68


def tables(a_pooling: float) -> tuple[Table, ...]:
    """a (68,000 B), b (136,000 B), c (34,000 B); a's pooling factor changes between days."""
    return (Table("a", 1000, 16, pooling_factor=a_pooling), Table("b", 2000, 16),
            Table("c", 500, 16, pooling_factor=2.5))


def task(a_pooling: float, hardware: HardwareProfile | None = None) -> ShardingTask:
    return ShardingTask(tables(a_pooling), hardware or load_hardware("8xH100-80GB", devices=2),
                        Workload(65536))


#: The plan in use, made for a's pooling factor 1: a and b on device 1, c on 0, all in HBM.
OLD = Plan((Placement("a", 1, 1000), Placement("b", 1, 2000), Placement("c", 0, 500)))


def replan(budget: MoveBudget, sharder: str = "recshard", new: ShardingTask | None = None,
           **options: object) -> autoshard.Planned:
    new = new or task(5.0)
    if sharder == "recshard":
        options.setdefault("time_limit", 10)
    return autoshard.plan(new, sharder, MODEL, previous=OLD, move_budget=budget, **options)


def best_whole(new: ShardingTask) -> float:
    """The cheapest plan of the three tables whole, every table all in HBM, by enumeration."""
    rows = {t.name: t.rows for t in new.tables}
    return min(evaluate(Plan(tuple(Placement(t, d, rows[t]) for t, d in zip(rows, devices,
                                                                               strict=True))),
                        new, MODEL).step_cost_ms
               for devices in itertools.product(range(2), repeat=3))


def test_a_zero_budget_returns_the_plan_in_use_priced_on_the_new_statistics() -> None:
    planned = replan(MoveBudget(max_bytes=0))
    assert planned.plan.placements == OLD.placements
    assert planned.report.step_cost_ms == evaluate(OLD, task(5.0), MODEL).step_cost_ms
    moves = planned.moves
    assert moves is not None and moves.copied_bytes == 0 and moves.seconds == 0
    assert moves.before_ms == moves.after_ms == planned.report.step_cost_ms


def test_the_budget_bounds_the_bytes_and_the_cost_follows_it() -> None:
    costs = []
    for limit in (0, 100_000, None):
        planned = replan(MoveBudget(max_bytes=limit))
        assert planned.moves is not None
        if limit is not None:
            assert planned.moves.copied_bytes <= limit
        costs.append(planned.report.step_cost_ms)
    # each larger budget plans no dearer; the unlimited one finds the best whole-table plan
    assert costs[0] > costs[1] > costs[2]
    assert costs[2] <= best_whole(task(5.0)) * (1 + 1e-9)


def test_the_best_plan_within_a_budget_costs_its_tables_bytes() -> None:
    # The best whole-table plans put b alone on a device, a and c on the other: from the plan
    # in use (a, b | c) that moves b (2,000 rows x 68 B) or a and c (1,500 rows x 68 B); every
    # table was all in HBM and stays so, so no host-HBM copy adds to it.
    planned = replan(MoveBudget(max_bytes=2000 * ROW))
    assert planned.moves is not None
    assert planned.moves.copied_bytes in (pytest.approx(2000 * ROW), pytest.approx(1500 * ROW))
    assert planned.report.step_cost_ms == pytest.approx(best_whole(task(5.0)))
    bound = planned.moves.budget_bound_ms
    assert bound is not None and bound <= planned.report.step_cost_ms * (1 + 1e-9)
    short = replan(MoveBudget(max_bytes=1500 * ROW - 1000))  # 1,000 B short of either
    assert short.moves is not None and short.moves.copied_bytes < 1500 * ROW
    assert short.report.step_cost_ms > planned.report.step_cost_ms


def test_a_greedy_sharders_plan_is_brought_within_the_budget() -> None:
    for limit in (0, 70_000):
        planned = replan(MoveBudget(max_bytes=limit), "size_greedy")
        assert planned.moves is not None and planned.moves.copied_bytes <= limit
    moves = carry(OLD, task(5.0), MODEL, MoveBudget(max_bytes=40_000))
    everything = plan_layout(Plan((Placement("a", 0, 1000), Placement("b", 0, 2000),
                                   Placement("c", 1, 500))), task(5.0))
    repaired = within_budget(moves, everything, MODEL)
    assert moves.copied(repaired) <= 40_000  # only c's 34,000 B can move back


def test_priced_moves_pay_back_within_their_horizon() -> None:
    # the tables 10,000 times larger: moving a (680 MB) and c (340 MB) over the profile's
    # 900 GB/s intra-node links takes 1.13 ms, one after the other, and saves 0.030 ms a step
    big = tuple(replace(t, rows=t.rows * 10_000) for t in tables(5.0))
    new = ShardingTask(big, load_hardware("8xH100-80GB", devices=2), Workload(65536))
    old = Plan(tuple(replace(p, hbm_rows=p.hbm_rows * 10_000) for p in OLD.placements))

    def priced(horizon: float) -> autoshard.Planned:
        return autoshard.plan(new, "recshard", MODEL, previous=old, time_limit=10,
                              move_budget=MoveBudget(horizon_steps=horizon))

    short, long = priced(10), priced(100)
    assert short.plan.placements == old.placements  # 10 steps win back no move's time
    assert long.moves is not None
    assert long.moves.copied_bytes == pytest.approx(15_000_000 * ROW)
    assert long.report.step_cost_ms < short.report.step_cost_ms
    # device 0 receives a's 680 MB while it sends c's 340 MB, at 900 GB/s
    assert long.moves.seconds == pytest.approx(10_000_000 * ROW / 900e9)
    assert long.moves.payback_steps is not None and long.moves.payback_steps <= 100
    assert long.moves.price_ms == pytest.approx(1e3 * 15_000_000 * ROW / 900e9 / 100)


def test_new_tables_and_a_lost_device_are_carried() -> None:
    grown = (*tables(5.0), Table("d", 300, 16))
    three = load_hardware("8xH100-80GB", devices=3)
    two = ShardingTask(grown, load_hardware("8xH100-80GB", devices=2), Workload(65536))
    old = Plan((*OLD.placements[:2], Placement("c", 2, 500)))  # c on device 2, now gone
    moves = carry(old, two, MODEL, MoveBudget(max_bytes=0), hardware=three)
    # c must leave device 2 (its 34,000 B are the least any re-plan copies); d is created
    assert moves.forced_bytes == pytest.approx(500 * ROW)
    assert moves.limit_bytes == moves.forced_bytes
    planned = autoshard.plan(two, "recshard", MODEL, previous=replace(old, context=None),
                             move_budget=MoveBudget(max_bytes=0), time_limit=5)
    assert planned.moves is not None and planned.moves.copied_bytes == pytest.approx(500 * ROW)
    assert {p.table for p in planned.plan.placements} == {"a", "b", "c", "d"}


def test_a_budget_needs_the_plan_in_use() -> None:
    with pytest.raises(InputError, match="previous"):
        autoshard.plan(task(5.0), "recshard", move_budget=MoveBudget(max_bytes=0))


def test_replan_and_diff_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_tables(tmp_path / "day1.json", tables(1.0))
    save_tables(tmp_path / "day2.json", tables(5.0))
    common = ["--devices", "2", "--overhead", "none", "--time-limit", "5"]
    code, _, err = run_cli(["plan", "-t", str(tmp_path / "day1.json"), *common, "-o",
                            str(tmp_path / "old.json")], capsys)
    assert code == 0, err
    code, out, err = run_cli(["replan", str(tmp_path / "old.json"), "-t",
                              str(tmp_path / "day2.json"), "--move-budget", "0.05MB",
                              "--time-limit", "5", "-o", str(tmp_path / "new.json"), "--json"],
                             capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["moves"]["copied_bytes"] <= 50_000 and doc["moves"]["limit_bytes"] == 50_000
    new = Plan.load(tmp_path / "new.json")
    assert new.context is not None and new.context.tables == str(tmp_path / "day2.json")
    code, out, err = run_cli(["diff", str(tmp_path / "old.json"), str(tmp_path / "new.json"),
                              "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["report"]["copied_bytes"] == pytest.approx(
        doc["moves"]["copied_bytes"])
    code, _, err = run_cli(["replan", str(tmp_path / "old.json"), "--move-budget", "lots"],
                           capsys)
    assert code == 2 and "--move-budget" in err


def test_drift_prices_the_plan_in_use_and_the_replans(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autoshard.replan.drift import drift

    found = drift(OLD, task(5.0), "recshard", MODEL,
                  [MoveBudget(max_bytes=0), MoveBudget(max_share=0.5)], time_limit=5)
    names = [r.name for r in found.rows]
    assert names == ["plan in use", "re-plan from scratch", "within 0 GB", "within 50%"]
    in_use, scratch, zero, half = found.rows
    assert in_use.cost_ms == evaluate(OLD, task(5.0), MODEL).step_cost_ms
    assert zero.cost_ms == in_use.cost_ms and zero.move.copied_bytes == 0
    assert half.move.copied_bytes <= 0.5 * half.move.total_bytes
    assert scratch.cost_ms < in_use.cost_ms and half.cost_ms < in_use.cost_ms
    assert all(r.cost_ratio >= 1 - 1e-9 for r in found.rows)
    save_tables(tmp_path / "day1.json", tables(1.0))
    save_tables(tmp_path / "day2.json", tables(5.0))
    code, _, err = run_cli(["plan", "-t", str(tmp_path / "day1.json"), "--devices", "2",
                            "--time-limit", "5", "-o", str(tmp_path / "old.json")], capsys)
    assert code == 0, err
    code, out, err = run_cli(["drift", str(tmp_path / "old.json"), "-t",
                              str(tmp_path / "day2.json"), "--budgets", "0,10%",
                              "--time-limit", "5", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert [r["name"] for r in doc["rows"]] == ["plan in use", "re-plan from scratch",
                                                "within 0 GB", "within 10%"]
    assert doc["before_ms"] is not None and doc["bound_ms"] > 0


def test_the_search_stage_keeps_the_budget() -> None:
    from autoshard.replan.repair import MoveGuard
    from autoshard.search.kick import kick_plan
    from autoshard.search.stage import search

    new = task(5.0)
    moves = carry(OLD, new, MODEL, MoveBudget(max_bytes=40_000))
    guard = MoveGuard(moves, MODEL)
    carried = moves.carried
    # only c (500 rows x 68 B = 34,000 B) fits the budget whole
    assert guard.movable(carried).tolist() == [False, False, True]
    plan, cost = carried.to_plan(new), guard.cost(carried)
    kicked, kicked_cost = kick_plan(plan, new, MODEL, cost, guard=guard)
    assert moves.copied(plan_layout(kicked, new)) <= 40_000 and kicked_cost <= cost
    found = search(plan, new, MODEL, cost, guard=guard)
    assert moves.copied(plan_layout(found.plan, new)) <= 40_000 and found.cost_ms <= cost


def test_ppo_replans_within_the_budget() -> None:
    from autoshard.sharders.ppo import PPOSharder

    if (reason := PPOSharder.unavailable()) is not None:
        pytest.skip(reason)
    planned = replan(MoveBudget(max_bytes=100_000), "ppo", time_limit=10)
    assert planned.moves is not None and planned.moves.copied_bytes <= 100_000
    assert planned.report.step_cost_ms < planned.moves.before_ms
    names = planned.details.costs
    assert "carried" in names and any(n.endswith("+budget") for n in names)
