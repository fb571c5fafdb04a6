"""The ``ppo`` sharder's portfolio of candidates and its time budget
(:class:`autoshard.sharders.ppo.sharder.PPOSharder`): the time limit's instants
(:class:`Clock`), the rivals' plans (:func:`add_rivals`), which candidates are polished
(:func:`polish_candidates`), which start the re-split and kicks (:func:`refined_starts`), the
settle on large tasks (:func:`settle`) and the group re-solve on the others (:func:`resolve`);
in a re-plan, the candidates within the move budget and their search there
(:func:`within_budget`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from autoshard.errors import PlannerError
from autoshard.layout.plan import Plan
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import Curves
from autoshard.pricing.evaluator import plan_cost_ms
from autoshard.replan.budget import Moves
from autoshard.replan.repair import MoveGuard
from autoshard.search import lns
from autoshard.search.polish import budget, polish_plan
from autoshard.search.stage import refine
from autoshard.sharders.ppo import tuning
from autoshard.sharders.ppo.candidates import (
    CANDIDATES,
    CARRIED,
    FALLBACK,
    POLISHED_GROUPS,
    WHOLE,
    WHOLE_GROUP,
    Candidate,
    cheapest,
)
from autoshard.task import ShardingTask


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


def add_rivals(task: ShardingTask, cost_model: CostModel, out: list[Candidate],
               small: bool) -> None:
    """Adds each rival greedy sharder's plan with its step cost (failures and sharders that
    cannot run here are skipped); where not ``small`` (over :data:`~autoshard.sharders.ppo.
    tuning.SMALL_TASK` pairs), :data:`FALLBACK`'s alone."""
    from autoshard.sharders import get_sharder

    for name in CANDIDATES if small else (FALLBACK,):
        try:
            plan = get_sharder(name).shard(task, cost_model)
        except PlannerError:
            continue
        out.append(Candidate.of_rival(name, plan, plan_cost_ms(plan, task, cost_model)))


def polish_candidates(task: ShardingTask, cost_model: CostModel, candidates: list[Candidate],
                      clock: Clock, curves: dict[bytes, Curves], small: bool) -> float:
    """Polishes the cheapest candidate (:func:`autoshard.search.polish.polish_plan`), the
    tuned policy's cheapest, and the cheapest of each group of :data:`POLISHED_GROUPS` and
    :data:`WHOLE_GROUP` (ranked by their cost with HBM water-filled; split pieces a polish can
    balance better than their raw cost shows, and on a task planned for TorchRec row shards
    stay one per device, which a whole-table plan's polish cannot reach; where HBM is reserved
    per shard, whole tables reserve less); each that improves joins ``candidates`` with the
    step ``polish``. The group members are polished only while the time limit allows
    (``clock``); the cheapest always is. The items' curves priced go into ``curves``;
    ``small``: whether the task has at most ``SMALL_TASK`` pairs; returns how long the
    cheapest's polish took."""
    # Ranked by their cost with HBM water-filled, no move (the decodes' costs are; on
    # large tasks the fallback's is not, its curves would be priced for this alone).
    water = {id(c): c.cost_ms if c.rival is None or not small else
             filled(c.plan, task, cost_model, c.cost_ms, curves)[1] for c in candidates}
    ranked = sorted(candidates, key=lambda c: water[id(c)])
    own = [c for c in ranked if not c.tuned]  # the first policy's, the rivals'
    chosen = own[:1] + [c for c in ranked if c.tuned][:1]
    first_s = 0.0
    for group in (*POLISHED_GROUPS, WHOLE_GROUP) if small else POLISHED_GROUPS:
        chosen += [c for c in own if c.layout in group and c not in chosen][:1]
    for i, c in enumerate(chosen):
        rounds, seconds = budget(len(c.plan.placements), task.num_devices)
        if i and clock.left() < 2 * seconds:
            break
        began = time.perf_counter()
        plan, cost = polish_plan(c.plan, task, cost_model, c.cost_ms,
                                 limit=(rounds, min(seconds, max(clock.left(), 0.01))),
                                 curves=curves)
        first_s = first_s or time.perf_counter() - began
        if cost < c.cost_ms:
            candidates.append(c.then("polish", plan, cost))
    return first_s


def settle(task: ShardingTask, cost_model: CostModel, winner: Candidate,
           candidates: list[Candidate], clock: Clock, curves: dict[bytes, Curves],
           first_s: float, time_limit: float) -> Candidate:
    """On a large task, the winner's polish run on (step ``settle``) while its moves help (its
    time guard stops it long before its round per device there): for
    :data:`~autoshard.sharders.ppo.tuning.SETTLE_ROUNDS_PER_DEVICE` rounds per device within
    :data:`~autoshard.sharders.ppo.tuning.SETTLE_SHARE` of the limit, when what is left also
    covers another polish's set-up (``first_s``, the first polish's time; the items'
    ``curves`` are reused); returns the winner."""
    seconds = min(tuning.SETTLE_SHARE * time_limit, clock.left() - first_s)
    if seconds <= 0:
        return winner
    rounds = tuning.SETTLE_ROUNDS_PER_DEVICE * task.num_devices
    plan, cost = polish_plan(winner.plan, task, cost_model, winner.cost_ms,
                             limit=(rounds, seconds), curves=curves)
    if not cost < winner.cost_ms:
        return winner
    candidates.append(winner.then("settle", plan, cost))
    return candidates[-1]


def resolve(task: ShardingTask, cost_model: CostModel, winner: Candidate,
            candidates: list[Candidate], clock: Clock, seed: int = 0) -> Candidate:
    """The winner through the search stage's group re-solve
    (:func:`autoshard.search.lns.resolve_plan`) until the end of ``clock``, where at least
    :data:`~autoshard.sharders.ppo.tuning.MIN_RESOLVE_S` is left; the result joins
    ``candidates`` with the step ``lns`` where it is cheaper. Returns the winner."""
    if clock.left() < tuning.MIN_RESOLVE_S:
        return winner
    plan, cost = lns.resolve_plan(winner.plan, task, cost_model, winner.cost_ms, clock.end,
                                  seed)
    if not cost < winner.cost_ms:
        return winner
    candidates.append(winner.then("lns", plan, cost))
    return candidates[-1]


def refined_starts(candidates: list[Candidate]) -> list[Candidate]:
    """The :data:`~autoshard.sharders.ppo.tuning.REFINED` cheapest candidates, each from
    another decode or rival sharder (two can polish to the same cost and still re-split
    differently, their shards differing), then the tuned policy's cheapest: the first
    policy's and the rivals' starts are those they would be without the tuned policy."""
    first: dict[tuple[object, ...], Candidate] = {}  # decode or rival -> its cheapest
    for c in sorted(candidates, key=lambda c: c.cost_ms):
        first.setdefault(c.origin, c)
    tuned = [c for c in first.values() if c.tuned]
    own = [c for c in first.values() if not c.tuned]
    return own[:tuning.REFINED] + tuned[:1]


def filled(plan: Plan, task: ShardingTask, cost_model: CostModel, cost: float,
           curves: dict[bytes, Curves]) -> tuple[Plan, float]:
    """``plan`` with each device's HBM water-filled over the items it holds, and its step cost
    (the plan as it is where that is no cheaper): the HBM split the policy's buckets
    approximate, exact for the devices it chose (no item moves)."""
    return polish_plan(plan, task, cost_model, cost, curves=curves, fill_only=True)


def within_budget(task: ShardingTask, cost_model: CostModel, found: list[Candidate],
                  moves: Moves, clock: Clock, seed: int = 0) -> list[Candidate]:
    """A re-plan's candidates: the plan in use carried onto the task (``carried``), and the
    :data:`~autoshard.sharders.ppo.tuning.REPLAN_CANDIDATES` cheapest distinct plans of
    ``found`` (made without the budget) each brought within it (step ``budget``:
    :class:`autoshard.replan.repair.MoveGuard`); the cheapest then through the search stage
    within the budget (re-split and kicks drawn among the items it lets move:
    :func:`autoshard.search.stage.refine`) and, on tasks of up to
    :data:`~autoshard.sharders.ppo.tuning.SMALL_TASK` pairs, the group re-solve with the
    MILP's move term (:func:`autoshard.search.lns.resolve_plan`) until the end of ``clock``.
    Every candidate's cost is its step cost plus its moves' price per step where they are
    priced."""
    guard = MoveGuard(moves, cost_model)
    cost = guard.cost(moves.carried)
    out = [Candidate(WHOLE, moves.carried.to_plan(task), cost, rival=CARRIED, origin_ms=cost)]
    seen: set[tuple[object, ...]] = set()
    for c in sorted(found, key=lambda c: c.cost_ms):
        if len(seen) >= tuning.REPLAN_CANDIDATES or not clock.left():
            break
        if c.plan.placements in seen:
            continue
        seen.add(c.plan.placements)
        out.append(c.then("budget", *guard.admit(c.plan)))
    winner = cheapest(out)
    small = task.num_tables * task.num_devices <= tuning.SMALL_TASK
    refined = refine(winner.plan, task, cost_model, winner.cost_ms, large=not small,
                     seed=seed, seconds=tuning.REPLAN_REFINE_SHARE * clock.left(),
                     guard=guard)
    for tag, step_cost in refined.steps:
        winner = winner.then(tag, refined.plan, step_cost)
        out.append(winner)
    if small and clock.left() >= tuning.MIN_RESOLVE_S:
        plan, step_cost = lns.resolve_plan(winner.plan, task, cost_model, winner.cost_ms,
                                           clock.end, seed, moves)
        if step_cost < winner.cost_ms:
            out.append(winner.then("lns", plan, step_cost))
    return out
