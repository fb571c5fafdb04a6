"""The search stage: polish, re-split and kicks around a finished plan.

Each step runs on the best plan so far and is kept only where it lowers the step cost (as
:func:`autoshard.pricing.evaluator.evaluate` prices it), so the stage never returns a worse plan;
the result says what each kept step brought (:class:`Searched`), which a plan's provenance records
(:class:`autoshard.layout.plan.Provenance`).

1. **polish** (:mod:`autoshard.search.polish`): HBM rows water-filled per device, then items
   moved and swapped off the most loaded device;
2. **resplit** (:mod:`autoshard.search.resplit`): the heaviest tables' splits chosen again; on
   large tasks only its quick mode (the dearest table on the most loaded device);
3. **kick** (:mod:`autoshard.search.kick`): moves out of the polish's local optimum (not on
   large tasks).

In a re-plan (a :class:`autoshard.replan.repair.MoveGuard`), each step's plan is brought within
the move budget before it is compared (:func:`autoshard.replan.repair.within_budget`), the kicks
draw only items the budget lets move, and costs are the guard's: step cost plus the moves' price
per step where they are priced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from autoshard.layout.plan import Plan
from autoshard.pricing.cost import CostModel
from autoshard.replan.repair import MoveGuard
from autoshard.search.kick import kick_plan
from autoshard.search.polish import STEP_MAX_SECONDS, polish_plan
from autoshard.search.resplit import resplit_plan
from autoshard.task import ShardingTask

#: Seconds a step after the polish may take per unit of the plan's gap to the task's lower bound
#: (within its share of the time left; :func:`refine`).
GAP_SECONDS = 5.0


@dataclass(frozen=True)
class Searched:
    """A plan after the search stage.

    Args:
        plan: The best plan found (the input when no step lowered its cost).
        cost_ms: Its step cost.
        steps: Each step that lowered the cost, as (stage name, step cost after it), in order.
    """

    plan: Plan
    cost_ms: float
    steps: tuple[tuple[str, float], ...] = ()


def refine(plan: Plan, task: ShardingTask, cost_model: CostModel, cost: float, *,
           large: bool = False, seed: int = 0, seconds: float | None = None,
           bound_ms: float | None = None, guard: MoveGuard | None = None) -> Searched:
    """Steps 2 and 3 of the module docstring on a polished plan; on a ``large`` task only the
    re-split's quick mode. With ``seconds``, a step whose share of what is left of them (half
    for the re-split, all for the kicks) is shorter than any step's own time guard
    (:data:`autoshard.search.polish.STEP_MAX_SECONDS`) gets that share as its guard; with
    ``bound_ms`` too (the task's lower bound), a step gets up to :data:`GAP_SECONDS` per unit
    of the plan's gap to it (its cost over the bound, less 1) where that is longer, within
    its share: the time goes where the bound says the gap is. With ``guard`` (a re-plan's
    budget), ``cost`` and the costs compared are the guard's (module docstring)."""
    stop = None if seconds is None else time.perf_counter() + seconds
    steps = [("resplit", partial(resplit_plan, quick=large))]
    if not large:
        steps.append(("kick", partial(kick_plan, seed=seed, guard=guard)))
    kept: list[tuple[str, float]] = []
    for i, (tag, step) in enumerate(steps):
        limit = None  # the step's own time guard, unless what is left is shorter
        if stop is not None:
            left = stop - time.perf_counter()
            if left <= 0:
                break
            share = left / (len(steps) - i)
            gap = GAP_SECONDS * (cost / bound_ms - 1.0) if bound_ms else 0.0
            limit = (share if share < STEP_MAX_SECONDS else
                     min(gap, share) if gap > STEP_MAX_SECONDS else None)
        better, better_cost = step(plan, task, cost_model, cost, seconds=limit)
        if guard is not None and tag != "kick":  # the kicks keep the budget themselves
            better, better_cost = guard.admit(better)
        if better_cost < cost:
            plan, cost = better, better_cost
            kept.append((tag, cost))
    return Searched(plan, cost, tuple(kept))


def search(plan: Plan, task: ShardingTask, cost_model: CostModel, cost: float, *,
           large: bool = False, seed: int = 0, guard: MoveGuard | None = None) -> Searched:
    """The whole stage (module docstring) on ``plan``, whose step cost is ``cost`` (with
    ``guard``, its cost as the guard prices it)."""
    polished, polished_cost = polish_plan(plan, task, cost_model, cost)
    if guard is not None:
        polished, polished_cost = guard.admit(polished)
    steps: tuple[tuple[str, float], ...] = ()
    if polished_cost < cost:
        plan, cost, steps = polished, polished_cost, (("polish", polished_cost),)
    refined = refine(plan, task, cost_model, cost, large=large, seed=seed, guard=guard)
    return Searched(refined.plan, refined.cost_ms, steps + refined.steps)
