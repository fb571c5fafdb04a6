"""``recshard`` planning for two cost models at once: ours, and a second opinion.

A plan handed to TorchRec is judged twice: by our cost model and by TorchRec's own estimator
(:class:`autoshard.torchrec.cost.TorchRecCostModel`), which prices an HBM cache by its load
factor and not by the skew of the lookups. Each model's best plan can be poor under the other.
:func:`solve_both` looks for one plan good under both:

1. ``recshard`` under each model on its own (a third of the time limit each, at most what is
   left of it): each model's own best step cost ``best_m``;
2. ``recshard`` under their blend (:class:`BlendedCostModel`), each price divided by its model's
   ``best_m``, so that a device's blended load is the sum of its loads relative to each model's
   best (the rest of the time);
3. of the three plans, the one whose worse relative figure, max over models of
   cost_m / (least cost_m among the three), is least.

The whole keeps the time limit: a step left too little of it is not run, and the status says so.

The result's cost and bound are the first model's (its bound holds for every plan under it);
its status gives each model's figure for the plan and for that model's own best plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from autoshard.layout.plan import Plan
from autoshard.pricing.cost import CostModel, Pricing
from autoshard.pricing.evaluator import plan_cost_ms
from autoshard.sharders.base import Sharded
from autoshard.sharders.recshard_tables import RecShardResult
from autoshard.task import ShardingTask


class Solver(Protocol):
    """``recshard`` planning for one cost model."""

    def solve(self, task: ShardingTask, cost_model: CostModel) -> Sharded[RecShardResult]: ...

#: Share of the time limit for each model's own solve (the blend gets the rest).
OWN_SHARE = 1.0 / 3.0
#: Least share of the time limit left for a step to be run at all.
MIN_STEP_SHARE = 0.05


class BlendedCostModel:
    """The sum of several cost models' prices, each times its weight (every tier and the
    communication alike), so that a device's load is the weighted sum of its loads."""

    def __init__(self, models: tuple[CostModel, ...], weights: tuple[float, ...]) -> None:
        if len(models) != len(weights) or not models:
            raise ValueError("one weight per model, at least one model")
        self.models = models
        self.weights = weights
        self.name = "+".join(m.name for m in models)

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        parts = [m.price(task, table_idx, device_idx, hbm_rows) for m in self.models]
        return Pricing(*(sum(w * getattr(p, f) for w, p in zip(self.weights, parts, strict=True))
                         for f in ("hbm_ms", "uvm_ms", "comm_ms")))


def solve_both(with_limit: Callable[[float], Solver], task: ShardingTask,
               models: tuple[CostModel, CostModel], limit: float, name: str) -> RecShardResult:
    """The plan of the module docstring within ``limit`` seconds; ``with_limit(seconds)`` gives
    the solver of each step (``recshard`` with its settings and that time limit), ``name`` the
    sharder's name for the plan.

    Each step gets at most what is left of the limit; a step with less than
    :data:`MIN_STEP_SHARE` of it left is not run (the choice is then among the plans made),
    and its status says so."""
    start = time.perf_counter()
    deadline = start + limit
    first = with_limit(OWN_SHARE * limit).solve(task, models[0]).details
    plans, names, skipped = [first.plan], ["own"], []
    left = deadline - time.perf_counter()
    if left >= MIN_STEP_SHARE * limit:
        plans.append(with_limit(min(OWN_SHARE * limit, left)).solve(task, models[1]).plan)
        names.append("second")
    else:
        skipped.append("second")
    left = deadline - time.perf_counter()
    if len(plans) == 2 and left >= MIN_STEP_SHARE * limit:
        best = [min(plan_cost_ms(p, task, m) for p in plans) for m in models]
        blend = BlendedCostModel(models, tuple(1.0 / max(b, 1e-12) for b in best))
        plans.append(with_limit(deadline - time.perf_counter()).solve(task, blend).plan)
        names.append("blend")
    else:
        skipped.append("blend")
    choice = choose(plans, task, models)
    pick, costs, least = choice.index, choice.costs, choice.least
    status = (f"both: {names[pick]} plan; " + ", ".join(
        f"{m.name} {costs[pick][i]:.4g} ms (least {least[i]:.4g})"
        for i, m in enumerate(models))
        + (f"; time limit: {' and '.join(skipped)} plan not made" if skipped else ""))
    step = costs[pick][0]
    bound = min(first.bound_ms, step)
    return replace(first, plan=replace(plans[pick], sharder=name), step_cost_ms=step,
                   bound_ms=bound, gap=(step - bound) / step if step > 0 else 0.0,
                   seconds=time.perf_counter() - start,
                   found_s=time.perf_counter() - start, method=f"both-{names[pick]}",
                   status=status)


@dataclass(frozen=True)
class Choice:
    """Which of several plans is best under several models at once.

    Args:
        index: The plan picked: least ``scores``.
        costs: Each plan's step cost under each model ([plan][model], ms).
        least: Each model's least cost over the plans.
        scores: Each plan's worse cost relative to that least, max over models (>= 1).
    """

    index: int
    costs: list[list[float]]
    least: list[float]
    scores: list[float]


def choose(plans: list[Plan], task: ShardingTask, models: tuple[CostModel, ...]) -> Choice:
    """The plan whose worse relative cost over the models is least (the first on a tie)."""
    costs = [[plan_cost_ms(p, task, m) for m in models] for p in plans]
    least = [min(c[i] for c in costs) for i in range(len(models))]
    scores = [max(c[i] / max(least[i], 1e-12) for i in range(len(models))) for c in costs]
    return Choice(int(np.argmin(scores)), costs, least, scores)
