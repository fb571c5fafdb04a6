"""Kicks: an iterated local search around the improvement stage's result.

The polish (:mod:`autoshard.search.polish`) stops where no single move or swap off the
most loaded device helps: a local optimum, and with HBM reserved per table (TorchRec's buffers)
often a poor one, since moving one table there moves its reservation too. Each kick moves
:data:`MOVED` items drawn at random from the two most loaded devices to devices drawn at random
(items a split pins to a device or a node stay), clears every HBM row and polishes the result
again; the cheapest plan found is kept. Kicks run until :data:`KICKS` of them or the time guard
(:func:`autoshard.search.polish.step_seconds`) is spent; the generator is seeded, so a
run on the same machine is repeatable unless the guard ends it first. The result is never worse
than the input.

In a re-plan (a :class:`autoshard.replan.repair.MoveGuard`), kicks draw only items whose move the
budget still holds (and the runtime's rules allow), each kicked plan is brought within the
budget (:func:`autoshard.replan.repair.within_budget`), and plans are compared by their step
cost plus their moves' price where moves are priced.
"""

from __future__ import annotations

import time

import numpy as np

from autoshard.layout.plan import Plan
from autoshard.layout.shards import ShardLayout, held_shards, plan_layout, pricing_task
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import Curves
from autoshard.replan.repair import MoveGuard
from autoshard.search.polish import polish_plan, step_seconds
from autoshard.task import ShardingTask

#: Kicks at most, and items moved per kick.
KICKS, MOVED = 10, 3


def kick_plan(plan: Plan, task: ShardingTask, cost_model: CostModel, cost: float,
              seed: int = 0, kicks: int = KICKS, seconds: float | None = None,
              guard: MoveGuard | None = None) -> tuple[Plan, float]:
    """The cheapest of ``plan`` and its kicked and polished variants (see the module
    docstring), and its step cost.

    Args:
        plan: A valid plan of ``task``.
        task: The task.
        cost_model: Prices the variants.
        cost: The plan's step cost.
        seed: Seeds the draws.
        kicks: Kicks at most.
        seconds: Time guard (default: :func:`autoshard.search.polish.step_seconds` of
            the plan's items).
        guard: In a re-plan, its budget (module docstring); ``cost`` is then the plan's cost
            as the guard prices it, and so is the cost returned.
    """
    layout = plan_layout(plan, task)
    g = layout.geometry
    items = pricing_task(task, g)
    stop = time.perf_counter() + (seconds if seconds is not None
                                  else step_seconds(g.num_shards, task.num_devices))
    free = ~held_shards(task, g)
    if guard is not None:
        free &= guard.movable(layout)
    movable = np.flatnonzero(free)
    rng = np.random.default_rng(seed)
    curves: dict[bytes, Curves] = {}
    best, best_cost, device = plan, cost, layout.device

    def on_top(device: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The movable items on the two most loaded devices, items on ``device`` with ``rows``
        in HBM."""
        price = cost_model.price(items, np.arange(g.num_shards), device, rows).total_ms
        load = np.bincount(device, weights=price, minlength=task.num_devices)
        return movable[np.isin(device[movable], np.argsort(-load, kind="stable")[:2])]

    here = on_top(device, layout.hbm_rows)
    for _ in range(kicks):
        if time.perf_counter() >= stop or not here.size:
            break
        moved = device.copy()
        picked = rng.choice(here, size=min(MOVED, here.size), replace=False)
        moved[picked] = rng.integers(task.num_devices, size=picked.size)
        kicked = ShardLayout(g, moved, items.table_arrays.hbm_least.copy()).to_plan(
            task, plan.sharder)
        polished, c = polish_plan(kicked, task, cost_model, np.inf, curves=curves)
        if guard is not None and np.isfinite(c):
            polished, c = guard.admit(polished)
        if c < best_cost:
            best, best_cost = polished, c
            out = plan_layout(best, task)
            device = out.device
            here = on_top(device, out.hbm_rows)
    return best, best_cost
