"""The ``ppo`` sharder's improvement stage over its candidates
(:class:`autoshard.sharders.ppo.PPOSharder`): its time limit (:class:`Clock`), which candidates
are polished (:func:`polish_candidates`), which start the re-split and kicks
(:func:`refined_starts`), the settle on large tasks (:func:`settle`) and the group re-solve
on the others (:func:`resolved`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from autoshard.errors import PlannerError
from autoshard.layout.feasibility import feasible
from autoshard.layout.plan import Plan
from autoshard.layout.shards import ShardLayout, held_shards, plan_layout, pricing_task
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import Curves
from autoshard.pricing.evaluator import plan_cost_ms, step_cost_ms
from autoshard.search.polish import budget, polish_plan
from autoshard.sharders.ppo_names import (
    CANDIDATES,
    FALLBACK,
    POLISHED_GROUPS,
    WHOLE_GROUP,
    is_tuned,
)
from autoshard.sharders.recshard import RecShard
from autoshard.sharders.recshard_tables import search_from
from autoshard.task import ShardingTask

#: On tasks over ``SMALL_TASK`` pairs, the winner is polished on while its moves help, for
#: at most this share of the time limit and this many rounds (moves) per device.
SETTLE_SHARE, SETTLE_ROUNDS_PER_DEVICE = 0.03, 1
#: Where tables dominate, the re-split and kicks start from this many candidates (time allowing).
REFINED = 2
#: The group re-solve (:func:`resolve`) starts only with at least this many seconds left.
MIN_RESOLVE_S = 0.5


def add_greedy(task: ShardingTask, cost_model: CostModel, costs: dict[str, float],
               plans: dict[str, Plan], small: bool) -> None:
    """Adds each candidate greedy sharder's plan and its step cost (failures and sharders that
    cannot run here are skipped); where not ``small`` (over ``SMALL_TASK`` pairs of
    :mod:`autoshard.sharders.ppo`), :data:`FALLBACK`'s alone."""
    from autoshard.sharders import get_sharder

    for name in CANDIDATES if small else (FALLBACK,):
        try:
            plan = get_sharder(name).shard(task, cost_model)
        except PlannerError:
            continue
        costs[name] = plan_cost_ms(plan, task, cost_model)
        plans[name] = plan


def polish_candidates(task: ShardingTask, cost_model: CostModel, costs: dict[str, float],
                      plans: dict[str, Plan], clock: Clock, curves: dict[bytes, Curves],
                      small: bool) -> float:
    """Polishes the cheapest candidate (:func:`autoshard.search.polish.polish_plan`), the
    tuned policy's cheapest (:func:`~autoshard.sharders.ppo_names.is_tuned`), and the
    cheapest of each group of :data:`POLISHED_GROUPS` and :data:`WHOLE_GROUP`
    (ranked by their cost with HBM water-filled; split pieces a polish can balance better
    than their raw cost shows, and on a task planned for TorchRec row shards stay one per
    device, which a whole-table plan's polish cannot reach; where HBM is reserved per
    shard, whole tables reserve less); each that improves competes as ``<name>+polish``.
    The group members are polished only while
    the time limit allows (``clock``); the cheapest always is. The items' curves priced
    go into ``curves``; ``small``: whether the task has at most ``SMALL_TASK`` pairs of
    :mod:`autoshard.sharders.ppo`; returns how long the cheapest's polish took."""
    # Ranked by their cost with HBM water-filled, no move (the decodes' costs are; on
    # large tasks the fallback's is not, its curves would be priced for this alone).
    water = {n: c if n.startswith("ppo") or not small else
             filled(plans[n], task, cost_model, c, curves)[1] for n, c in costs.items()}
    ranked = sorted(costs, key=water.__getitem__)
    own = [n for n in ranked if not is_tuned(n)]  # the first policy's, the rivals'
    chosen = own[:1] + [n for n in ranked if is_tuned(n)][:1]
    first_s = 0.0
    for group in (*POLISHED_GROUPS, WHOLE_GROUP) if small else POLISHED_GROUPS:
        chosen += [n for n in own if n.startswith(group) and n not in chosen][:1]
    for i, name in enumerate(chosen):
        rounds, seconds = budget(len(plans[name].placements), task.num_devices)
        if i and clock.left() < 2 * seconds:
            break
        began = time.perf_counter()
        plan, cost = polish_plan(plans[name], task, cost_model, costs[name],
                                 limit=(rounds, min(seconds, max(clock.left(), 0.01))),
                                 curves=curves)
        first_s = first_s or time.perf_counter() - began
        if cost < costs[name]:
            costs[f"{name}+polish"], plans[f"{name}+polish"] = cost, plan
    return first_s


def settle(task: ShardingTask, cost_model: CostModel, winner: str, costs: dict[str, float],
           plans: dict[str, Plan], clock: Clock, curves: dict[bytes, Curves], first_s: float,
           time_limit: float) -> str:
    """On a large task, the winner's polish run on (``+settle``) while its moves help (its
    time guard stops it long before its round per device there): for
    :data:`SETTLE_ROUNDS_PER_DEVICE` rounds per device within :data:`SETTLE_SHARE` of the
    limit, when what is left also covers another polish's set-up (``first_s``, the first
    polish's time; the items' ``curves`` are reused); returns the winner's name."""
    seconds = min(SETTLE_SHARE * time_limit, clock.left() - first_s)
    if seconds <= 0:
        return winner
    rounds = SETTLE_ROUNDS_PER_DEVICE * task.num_devices
    plan, cost = polish_plan(plans[winner], task, cost_model, costs[winner],
                             limit=(rounds, seconds), curves=curves)
    if not cost < costs[winner]:
        return winner
    name = f"{winner}+settle"
    costs[name], plans[name] = cost, plan
    return name


def resolved(plan: Plan, task: ShardingTask, cost_model: CostModel, cost: float,
             deadline: float, seed: int = 0) -> tuple[Plan, float]:
    """``plan`` after ``recshard``'s large-neighbourhood search (the MILP re-solved on the
    most loaded device and a lighter one at a time:
    :func:`autoshard.sharders.recshard_tables.search_from`, ``recshard``'s default options
    but no stall rule, so it runs until a round of devices brings nothing) until
    ``deadline``, and its step cost; the input where that is no cheaper. The items a split
    pins to their devices (one row shard per device, replicas, node-local shards) stay where
    the plan has them; each split table then keeps one HBM share where the task's runtime
    holds one (:meth:`~autoshard.layout.shards.ShardLayout.even_shares`)."""
    layout = plan_layout(plan, task)
    g = layout.geometry
    items = pricing_task(task, g)
    held = held_shards(task, g)
    pins = np.where(held, layout.device, -1) if held.any() else None
    found = search_from(RecShard(seed=seed, stall=0.0).settings, items, cost_model, layout.device,
                        layout.hbm_rows, deadline, pins)
    if found is None:
        return plan, cost
    out = ShardLayout(g, *found).even_shares(task)
    new_cost = step_cost_ms(items, cost_model, out.device, out.hbm_rows)
    if not new_cost < cost or not feasible(items, out.device, out.hbm_rows):
        return plan, cost
    return out.to_plan(task, plan.sharder), new_cost


def resolve(task: ShardingTask, cost_model: CostModel, winner: str, costs: dict[str, float],
            plans: dict[str, Plan], clock: Clock, seed: int = 0) -> str:
    """The winner through :func:`resolved` until the end of ``clock``, where at least
    :data:`MIN_RESOLVE_S` is left; the result competes as ``<winner>+lns`` where it is
    cheaper. Returns the winner's name."""
    if clock.left() < MIN_RESOLVE_S:
        return winner
    plan, cost = resolved(plans[winner], task, cost_model, costs[winner], clock.end, seed)
    if not cost < costs[winner]:
        return winner
    name = f"{winner}+lns"
    costs[name], plans[name] = cost, plan
    return name


def refined_starts(costs: dict[str, float]) -> list[str]:
    """The :data:`REFINED` cheapest candidates, each from another decode or rival sharder (two
    can polish to the same cost and still re-split differently, their shards differing), then
    the tuned policy's cheapest: the first policy's and the rivals' starts are those they would
    be without the tuned policy."""
    first: dict[str, str] = {}  # decode or rival -> its cheapest candidate
    for name in sorted(costs, key=costs.__getitem__):
        first.setdefault(name.split("+")[0], name)
    tuned = [n for n in first.values() if is_tuned(n)]
    own = [n for n in first.values() if not is_tuned(n)]
    return own[:REFINED] + tuned[:1]


def filled(plan: Plan, task: ShardingTask, cost_model: CostModel, cost: float,
           curves: dict[bytes, Curves]) -> tuple[Plan, float]:
    """``plan`` with each device's HBM water-filled over the items it holds, and its step cost
    (the plan as it is where that is no cheaper): the HBM split the policy's buckets
    approximate, exact for the devices it chose (no item moves)."""
    return polish_plan(plan, task, cost_model, cost, curves=curves, fill_only=True)


@dataclass(frozen=True)
class Clock:
    """A sharder's time limit: by when decodes must be estimated to end, when a running one
    stops, when the whole run must end, and by when a tuned policy's decodes must be estimated
    to end (``time.perf_counter`` instants)."""

    decodes_end: float
    decodes_stop: float
    end: float
    tuned_end: float

    def left(self, until: float | None = None) -> float:
        """Seconds left before ``until`` (default: the end), at least 0."""
        return max((self.end if until is None else until) - time.perf_counter(), 0.0)
