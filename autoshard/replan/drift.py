"""Drift: a plan made on one day's statistics, priced on the next day's, and what re-planning
buys, from scratch and from the plan in use within each of a few move budgets.

Statistics drift every day; :func:`drift` takes the plan in use (made on day k's statistics)
and day k+1's task and reports, on day k+1's statistics and against its lower bound:

- the plan in use as it is (carried onto the task: :func:`autoshard.replan.carry.carry`);
- a re-plan from scratch (no plan in use), and what it moves from the plan in use;
- a re-plan from the plan in use within each budget given (:func:`autoshard.planning.plan`
  with ``previous`` and ``move_budget``).

Each row gives the step cost, its ratio to the bound, the bytes copied and their share of the
tables' bytes, the move's time, and the steps after which the move has paid for itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from autoshard import planning
from autoshard.layout.plan import Plan
from autoshard.layout.shards import ShardLayout, plan_layout
from autoshard.pricing.cost import CostModel
from autoshard.pricing.evaluator import task_bound_ms
from autoshard.replan.budget import MoveBudget, Moves
from autoshard.replan.carry import carry
from autoshard.replan.diff import MoveReport, move_report
from autoshard.task import ShardingTask


@dataclass(frozen=True)
class DriftRow:
    """One plan on the new day's statistics.

    Args:
        name: What it is: ``plan in use``, ``re-plan from scratch`` or ``within <budget>``
            (:attr:`autoshard.replan.budget.MoveBudget.label`).
        cost_ms: Its step cost, ms.
        cost_ratio: Over the new day's lower bound.
        move: Its move from the plan in use, priced.
        seconds: The planning's wall time, s (0 for the plan in use).
    """

    name: str
    cost_ms: float
    cost_ratio: float
    move: MoveReport
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), move=self.move.to_dict())


@dataclass(frozen=True)
class Drift:
    """The plan in use and the re-plans on the new day's statistics (module docstring).

    Args:
        sharder: The sharder that re-planned.
        bound_ms: The new day's lower bound, ms (valid for every plan).
        before_ms: The plan in use's step cost on the statistics it was made for, where given.
        rows: The plan in use, the re-plan from scratch, then one re-plan per budget.
    """

    sharder: str
    bound_ms: float
    before_ms: float | None
    rows: tuple[DriftRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"sharder": self.sharder, "bound_ms": self.bound_ms,
                "before_ms": self.before_ms, "rows": [r.to_dict() for r in self.rows]}


def drift(previous: Plan, task: ShardingTask, sharder: str, cost_model: CostModel,
          budgets: Sequence[MoveBudget], before_ms: float | None = None,
          **options: Any) -> Drift:
    """The module docstring's report of ``previous`` (made on day k) on ``task`` (day k+1),
    re-planned with ``sharder`` (its ``options``) from scratch and within each of
    ``budgets``; ``before_ms``: its cost on day k, where known."""
    bound = task_bound_ms(task, cost_model)
    moves = carry(previous, task, cost_model, MoveBudget())
    rows = [DriftRow("plan in use", *_priced(moves.carried, moves, cost_model, bound))]
    fresh = planning.plan(task, sharder, cost_model, **options)
    layout = plan_layout(fresh.plan, task)
    rows.append(DriftRow("re-plan from scratch", *_priced(layout, moves, cost_model, bound),
                         fresh.seconds))
    for budget in budgets:
        found = planning.plan(task, sharder, cost_model, previous=previous,
                              move_budget=budget, **options)
        assert found.moves is not None
        rows.append(DriftRow(f"within {budget.label}", found.report.step_cost_ms,
                             found.report.step_cost_ms / bound, found.moves, found.seconds))
    return Drift(sharder, bound, before_ms, tuple(rows))


def _priced(layout: ShardLayout, moves: Moves, cost_model: CostModel, bound: float
            ) -> tuple[float, float, MoveReport]:
    """A layout's step cost, its ratio to ``bound`` and its move from the plan in use."""
    move = move_report(moves, layout, cost_model)
    return move.after_ms, move.after_ms / bound, move


__all__ = ["Drift", "DriftRow", "drift"]
