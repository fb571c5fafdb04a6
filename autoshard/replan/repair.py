"""Any plan brought within a re-plan's budget and rules, table by table.

A sharder that plans without the budget (a greedy one, TorchRec's planner, or a search step that
moved items) gives a plan that may copy more than the budget allows. Each table of it is either
kept as that plan places it or put back as the carried plan holds it
(:mod:`autoshard.replan.carry`, which copies nothing it need not):

1. tables that break the runtime's rules (:class:`autoshard.replan.budget.MoveRules`: an item of
   a kind it cannot move moved, a split changed, HBM rows changed in place) are put back;
2. while the plan copies more than the limit, the table whose putting back raises the step cost
   least per byte it saves is put back (several at once on large tasks:
   :data:`BATCH_SHARE`), among those whose carried pieces fit their devices' memory beside the
   rest; where moves are priced, tables are then put back while that lowers the step cost plus
   the moves' price.

Device loads are the sum of the items' prices on them, as the greedy sharders count them; the
result is priced by the evaluator's own sum (:func:`autoshard.pricing.evaluator.step_cost_ms`).
Where no table can be put back in time the carried plan itself is returned, which is within the
limit by construction. :class:`MoveGuard` applies this to the plans a search proposes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.layout.plan import Plan
from autoshard.layout.shards import ShardLayout, plan_layout, pricing_task
from autoshard.pricing.cost import CostModel
from autoshard.pricing.evaluator import step_cost_ms
from autoshard.replan.budget import ANY_MOVE, Moves
from autoshard.task import ShardingTask

#: On large tasks a round puts back this share of the candidates at once (at least one).
BATCH_SHARE = 0.02


@dataclass(frozen=True, eq=False)
class _Options:
    """Per table ([T, D] or [T]) what each of its two options (the plan's, ``n``; the carried
    plan's, ``c``) puts on each device and copies."""

    load_n: np.ndarray
    load_c: np.ndarray
    hbm_n: np.ndarray
    hbm_c: np.ndarray
    host_n: np.ndarray
    host_c: np.ndarray
    bytes_n: np.ndarray
    bytes_c: np.ndarray
    price_n: np.ndarray
    price_c: np.ndarray


def within_budget(moves: Moves, layout: ShardLayout, cost_model: CostModel) -> ShardLayout:
    """``layout`` (of ``moves.task``) within ``moves``' rules and limit (module docstring)."""
    task = moves.task
    plan = layout.to_plan(task)
    carried = moves.carried.to_plan(task)
    choice = _conform(moves, plan, carried)
    if choice.all():
        return moves.carried
    options = _options(moves, plan, carried, cost_model)
    if not _fits(task, options, choice):
        return moves.carried
    kept = _put_back(moves, options, choice)
    if kept is None:
        return moves.carried
    merged = Plan(tuple(c if back else p for p, c, back in zip(
        plan.placements, carried.placements, kept, strict=True)))
    out = plan_layout(merged, task, "repaired plan")
    return out if moves.allows(out) else moves.carried


def _conform(moves: Moves, plan: Plan, carried: Plan) -> np.ndarray:
    """[T] the tables put back to keep the rules (step 1), or already as carried."""
    task = moves.task
    back = np.array([p == c for p, c in zip(plan.placements, carried.placements, strict=True)])
    if moves.rules is ANY_MOVE:
        return back
    for t in np.flatnonzero(~back):
        trial = Plan(tuple(p if i == t else c for i, (p, c) in enumerate(zip(
            plan.placements, carried.placements, strict=True))))
        if not moves.keeps_rules(plan_layout(trial, task)):
            back[t] = True
    return back


def _options(moves: Moves, plan: Plan, carried: Plan, cost_model: CostModel) -> _Options:
    """Each table's two options (:class:`_Options`)."""
    task = moves.task
    t, d = task.num_tables, task.num_devices
    out: dict[str, np.ndarray] = {}
    for tag, p in (("n", plan), ("c", carried)):
        layout = plan_layout(p, task)
        g = layout.geometry
        items = pricing_task(task, g)
        a = items.table_arrays
        priced = cost_model.price(items, np.arange(g.num_shards), layout.device,
                                  layout.hbm_rows).total_ms
        where = (g.table, layout.device)
        for name, values in (("load", priced), ("hbm", a.hbm_bytes(slice(None), layout.hbm_rows)),
                             ("host", (g.rows - layout.hbm_rows) * a.memory_bytes_per_row)):
            grid = np.zeros((t, d))
            np.add.at(grid, where, values)
            out[f"{name}_{tag}"] = grid
        arithmetic = moves.items(g)
        copied = arithmetic.copied(layout.device, layout.hbm_rows)
        out[f"bytes_{tag}"] = np.bincount(g.table, weights=copied, minlength=t)
        price = np.zeros(g.num_shards)
        if moves.horizon is not None:
            i = np.arange(g.num_shards)
            price = 1e3 / moves.horizon * (
                arithmetic.seconds_to()[i, layout.device]
                + arithmetic.host_bytes(layout.device, layout.hbm_rows)
                * arithmetic.host_seconds_per_byte()[layout.device])
        out[f"price_{tag}"] = np.bincount(g.table, weights=price, minlength=t)
    return _Options(**out)


def _totals(options: _Options, choice: np.ndarray) -> tuple[np.ndarray, ...]:
    """(load, HBM, host) per device, and bytes and price, of the plan with ``choice``'s tables
    put back."""
    pick = choice[:, None]
    load = np.where(pick, options.load_c, options.load_n).sum(axis=0)
    hbm = np.where(pick, options.hbm_c, options.hbm_n).sum(axis=0)
    host = np.where(pick, options.host_c, options.host_n).sum(axis=0)
    copied = np.where(choice, options.bytes_c, options.bytes_n).sum()
    price = np.where(choice, options.price_c, options.price_n).sum()
    return load, hbm, host, np.array(copied), np.array(price)


def _fits(task: ShardingTask, options: _Options, choice: np.ndarray) -> bool:
    _, hbm, host, _, _ = _totals(options, choice)
    dev = task.device_arrays
    return bool((hbm <= dev.hbm_capacity + 1e-6).all() and (host <= dev.host_capacity + 1e-6)
                .all())


def _put_back(moves: Moves, options: _Options, choice: np.ndarray) -> np.ndarray | None:
    """Step 2: tables put back until the plan copies within the limit and, where moves are
    priced, while that lowers the step cost plus the price; None when the limit cannot be
    reached so."""
    dev = moves.task.device_arrays
    choice = choice.copy()
    while True:
        load, hbm, host, copied, _ = _totals(options, choice)
        over = float(copied) > moves.limit_bytes
        cand = np.flatnonzero(~choice & (options.bytes_n > options.bytes_c))
        if (not over and moves.horizon is None) or not cand.size:
            return None if over else choice
        new_load = load[None, :] - options.load_n[cand] + options.load_c[cand]
        ok = ((hbm[None, :] - options.hbm_n[cand] + options.hbm_c[cand]
               <= dev.hbm_capacity + 1e-6).all(axis=1)
              & (host[None, :] - options.host_n[cand] + options.host_c[cand]
                 <= dev.host_capacity + 1e-6).all(axis=1))
        rise = new_load.max(axis=1) - load.max()
        saved_price = options.price_n[cand] - options.price_c[cand]
        saved = options.bytes_n[cand] - options.bytes_c[cand]
        if over:
            score = np.where(ok, rise / saved, np.inf)
        else:  # priced, within the limit: only what lowers cost plus price
            score = np.where(ok & (rise < saved_price), rise - saved_price, np.inf)
        if not np.isfinite(score).any():
            return None if over else choice
        count = max(1, int(BATCH_SHARE * cand.size)) if over else 1
        best = np.argsort(score, kind="stable")[:count]
        choice[cand[best[np.isfinite(score[best])]]] = True


class MoveGuard:
    """Holds the plans a search proposes within a re-plan's budget: :meth:`admit` repairs a
    plan (:func:`within_budget`) and prices it as the re-plan compares plans: its step cost,
    plus its moves' price per step where they are priced.

    Args:
        moves: The re-plan's budget.
        cost_model: Prices the plans.
    """

    def __init__(self, moves: Moves, cost_model: CostModel) -> None:
        self.moves, self.cost_model = moves, cost_model

    def admit(self, plan: Plan) -> tuple[Plan, float]:
        """``plan`` within the budget, and what it costs (class docstring)."""
        task = self.moves.task
        layout = plan_layout(plan, task)
        if not self.moves.allows(layout):
            layout = within_budget(self.moves, layout, self.cost_model)
            plan = layout.to_plan(task, plan.sharder)
        return plan, self.cost(layout)

    def cost(self, layout: ShardLayout) -> float:
        """A layout's step cost plus its moves' price per step (0 without a horizon)."""
        items = pricing_task(self.moves.task, layout.geometry)
        return (step_cost_ms(items, self.cost_model, layout.device, layout.hbm_rows)
                + self.moves.price_ms(layout))

    def movable(self, layout: ShardLayout) -> np.ndarray:
        """[N] the items of ``layout`` that the budget lets move to another device whole: the
        limit less what the others copy holds the item's bytes, and the rules let it move."""
        moves = self.moves.items(layout.geometry)
        copied = moves.copied(layout.device, layout.hbm_rows)
        ok = self.moves.limit_bytes - (copied.sum() - copied) >= moves.memory
        pins = self.moves.pins(layout.geometry)
        return ok if pins is None else ok & (pins < 0)


__all__ = ["BATCH_SHARE", "MoveGuard", "within_budget"]
