"""Per-table constraints (allowed kinds, share of rows in HBM, narrowest column block): what
the split choice offers, what recshard's MILP keeps, and what `enforce` brings any plan to."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autoshard.errors import InputError, PlannerError
from autoshard.layout.constraints import Constraints, TableConstraint
from autoshard.layout.kinds import ShardingKind
from autoshard.layout.shards import plan_layout
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.search.enforce import enforce
from autoshard.sharders import get_sharder
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()
K = ShardingKind


def _task(constraints: dict[str, TableConstraint]) -> ShardingTask:
    task = constrained_task(dlrm_tables(20, seed=1), 4, hbm_fraction=0.5)
    return replace(task, constraints=Constraints(constraints))


def _kinds_and_shares(task: ShardingTask, plan: object) -> dict[str, tuple[str, list[float],
                                                                          list[int]]]:
    layout = plan_layout(plan, task)  # type: ignore[arg-type]
    g = layout.geometry
    out = {}
    for t, table in enumerate(task.tables):
        mine = g.table == t
        out[table.name] = (K.of(g.kind[mine][0]).value,
                           (layout.hbm_rows[mine] / g.rows[mine]).tolist(), g.cols[mine].tolist())
    return out


@pytest.mark.usefixtures("step_clock")
def test_recshard_keeps_every_constraint() -> None:
    task = _task({"t0": TableConstraint(kinds=frozenset({K.COLUMN_WISE}), min_cols=16),
                  "t1": TableConstraint(hbm_share=(1.0, 1.0)),
                  "t2": TableConstraint(hbm_share=(0.0, 0.0)),
                  "t3": TableConstraint(kinds=frozenset({K.ROW_WISE})),
                  "t4": TableConstraint(hbm_share=(0.25, 0.25))})
    plan = get_sharder("recshard", time_limit=10).shard(task, MODEL)
    got = _kinds_and_shares(task, plan)
    assert got["t0"][0] == "column_wise" and min(got["t0"][2]) >= 16
    assert got["t1"][1] == [1.0] and got["t2"][1] == [0.0]
    assert got["t3"][0] == "row_wise"
    assert got["t4"][1] == pytest.approx([0.25], abs=1 / task.tables[4].rows)
    # Unconstrained tables are free, and the plan stays within the bound.
    report = evaluate(plan, task, MODEL)
    assert report.lower_bound_ms <= report.step_cost_ms


def test_enforce_brings_a_greedy_plan_within_its_hbm_bounds() -> None:
    task = _task({"t1": TableConstraint(hbm_share=(1.0, 1.0)),
                  "t2": TableConstraint(hbm_share=(0.0, 0.0))})
    plan = get_sharder("lookup_greedy").shard(task, MODEL)
    before = plan_layout(plan, task)
    after = enforce(task, before, MODEL)
    rows = task.table_arrays.rows
    assert after.hbm_rows[1] == rows[1] and after.hbm_rows[2] == 0
    assert (after.device == before.device).all()
    # The others were water-filled around them: the plan still fits its devices.
    evaluate(after.to_plan(task, "lookup_greedy"), task, MODEL)
    # A layout already within its bounds comes back as it is.
    assert enforce(task, after, MODEL) is after


def test_a_kind_the_constraints_forbid_is_refused_by_name() -> None:
    task = _task({"t0": TableConstraint(kinds=frozenset({K.COLUMN_WISE}))})
    plan = get_sharder("lookup_greedy").shard(task, MODEL)  # never splits
    with pytest.raises(PlannerError, match="'t0' planned table_wise"):
        enforce(task, plan_layout(plan, task), MODEL)


@pytest.mark.usefixtures("step_clock")
def test_a_table_that_must_split_but_cannot_is_named() -> None:
    dim = int(_task({}).tables[0].dim)
    task = _task({"t0": TableConstraint(kinds=frozenset({K.COLUMN_WISE}), min_cols=dim)})
    with pytest.raises(PlannerError, match="'t0' may not stay whole"):
        get_sharder("recshard", time_limit=5).shard(task, MODEL)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"hbm_share": (0.6, 0.4)}, "hbm_share"), ({"hbm_share": (-0.1, 1.0)}, "hbm_share"),
    ({"kinds": frozenset()}, "kinds"), ({"min_cols": 0}, "min_cols")])
def test_bad_constraints_name_their_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InputError) as info:
        TableConstraint(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_hbm_bounds_reach_the_task_arrays() -> None:
    task = _task({"t4": TableConstraint(hbm_share=(0.25, 0.5))})
    a = task.table_arrays
    rows = int(a.rows[4])
    assert a.hbm_least[4] == int(np.ceil(0.25 * rows)) and a.hbm_most[4] == rows // 2
    assert (a.hbm_least[:4] == 0).all() and (a.hbm_most[:4] == a.rows[:4]).all()
    assert a.hbm_rows_within(4, np.array([1e15])) == rows // 2
