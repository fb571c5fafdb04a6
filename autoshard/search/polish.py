"""A fast improvement stage for a finished plan: HBM rows re-chosen per device, then tables (or
shards) moved and swapped between devices.

Both steps work on each item's cost curve per kind of device: the lower hull of its cost
against HBM bytes from :func:`autoshard.pricing.curves.cost_curves` (vertices at whole
rows where the access curve bends), priced by the task's cost model.

- **Rows.** Given every item's device, each device's HBM is water-filled: the hull segments of
  its items, the largest saving per HBM byte first (each item keeps a prefix of its hottest
  rows), until the device's HBM is full. For a cost model linear in the HBM share between the
  curve's points (the analytical one) this is each device's cheapest split of its HBM.
- **Moves.** Items on the most loaded device are moved to another device, or swapped with one
  there, while that lowers it with the other device below the old maximum; when none does,
  moves and swaps from the devices whose HBM is worth most (the highest water levels) that lower
  the two devices' total work without raising the maximum. Candidates are scored on the
  water-filled curves (:class:`SegmentLists`: the source's load without the item exactly, the
  target's with it as an upper bound, a swap partner's leaving at its device's level; a change
  that a lower bound of the arrival shows cannot qualify is not scored: the item's cheapest
  split there, each byte it takes priced at the device's water level); the best few are
  re-filled on the two devices and priced by the cost model, and the best that qualifies is
  applied. The search stops after a number of rounds that grows with the devices,
  or at a time guard that grows with the task (:func:`budget`).

- **Split shares.** On a task planned for TorchRec a split table keeps one HBM share over its
  shards (:meth:`autoshard.layout.shards.ShardLayout.even_shares`); that share is chosen again
  (:func:`_tune_shares`), the other items' HBM water-filled around it.

A device's load is the sum of its items' prices; :func:`polish_plan` keeps the result only when
it fits and the evaluator's pricing of it (:func:`step_cost_ms`) is below the input's, so the
stage never returns a worse plan.
"""

from __future__ import annotations

import time

import numpy as np

from autoshard.layout import kinds
from autoshard.layout.feasibility import feasible
from autoshard.layout.plan import Plan
from autoshard.layout.shards import (
    ShardLayout,
    fixed_shards,
    plan_layout,
    pricing_task,
)
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import CostCurves, Curves
from autoshard.pricing.evaluator import evaluate, step_cost_ms
from autoshard.search.move_search import MARGIN, Polisher
from autoshard.task import ShardingTask

#: Rounds of the move search: :data:`ROUNDS_PER_DEVICE` per device, at least
#: :data:`MIN_ROUNDS` (the usual stop, so plans do not depend on the machine's speed).
ROUNDS_PER_DEVICE, MIN_ROUNDS = 1, 8
#: The search's time limit, a guard for large tasks: seconds per (item, device) pair, within
#: bounds.
SECONDS_PER_PAIR, MIN_SECONDS, MAX_SECONDS = 2e-4, 0.15, 0.3
#: A split table's HBM share (one per table, as TorchRec holds one cache load factor) is tried
#: at these multiples of its value, or at these shares when it has none, for the
#: :data:`TUNED_TABLES` dearest split tables, then refined this many times.
SHARE_STEPS, FIRST_SHARES = (0.5, 0.75, 1.25, 1.5, 2.0, 3.0), (0.01, 0.05, 0.2)
TUNED_TABLES, REFINE = 3, 3
#: The time guard of each step after the polish (:mod:`autoshard.search.resplit`,
#: :mod:`autoshard.search.kick`): seconds per (item, device) pair, within bounds.
STEP_SECONDS_PER_PAIR, STEP_MIN_SECONDS, STEP_MAX_SECONDS = 5e-5, 0.1, 0.5


def step_seconds(items: int, devices: int) -> float:
    """Seconds a step after the polish may take on ``items`` tables or shards on
    ``devices``."""
    return float(np.clip(STEP_SECONDS_PER_PAIR * items * devices, STEP_MIN_SECONDS,
                         STEP_MAX_SECONDS))


def budget(items: int, devices: int) -> tuple[int, float]:
    """The move search's budget for ``items`` tables or shards on ``devices``: rounds and
    seconds, whichever runs out first."""
    seconds = float(np.clip(SECONDS_PER_PAIR * items * devices, MIN_SECONDS, MAX_SECONDS))
    return max(MIN_ROUNDS, ROUNDS_PER_DEVICE * devices), seconds


def polish_plan(plan: Plan, task: ShardingTask, cost_model: CostModel,
                cost: float | None = None, limit: tuple[int, float] | None = None,
                curves: dict[bytes, Curves] | None = None, fill_only: bool = False
                ) -> tuple[Plan, float]:
    """The plan with its HBM rows re-chosen and moves applied (see the module docstring), and
    its step cost; the input and its cost when that is no better.

    Args:
        plan: A valid plan of ``task``.
        task: The task.
        cost_model: Prices the items and the result.
        cost: The plan's step cost, if known (else evaluated here).
        limit: Rounds and seconds of the move search (default: :func:`budget` of the task).
        curves: Curves already priced, by shard geometry (plans of the same shards share
            them); those priced here are added.
        fill_only: Only water-fill the HBM (no move, no split share re-chosen): a quick
            estimate of what the stage makes of a plan.
    """
    before = evaluate(plan, task, cost_model).step_cost_ms if cost is None else cost
    layout = plan_layout(plan, task)
    g = layout.geometry
    items = pricing_task(task, g)
    key = np.concatenate((g.table, g.row_start, g.row_end, g.col_start, g.col_end)).tobytes()
    cache = {} if curves is None else curves
    if key not in cache:
        cache[key] = Curves.price(items, cost_model)
    polisher = Polisher(items, cost_model, cache[key], layout.device, layout.hbm_rows,
                        kinds.node_local(g.kind), fixed_shards(task, g))
    polisher.refill()
    if not fill_only:
        polisher.search(*(budget(items.num_tables, task.num_devices) if limit is None
                          else limit))
    # One HBM share per split table, as the export gives TorchRec one cache load factor each;
    # the HBM that frees goes to the other items on those devices.
    out = ShardLayout(g, polisher.device, polisher.rows).even_shares(task)
    if not np.array_equal(out.hbm_rows, polisher.rows):
        rest = Polisher(items, cost_model, cache[key], out.device, out.hbm_rows,
                        locked=g.parts > 1)
        rest.refill()
        out = ShardLayout(g, rest.device, rest.rows)
    after = step_cost_ms(items, cost_model, out.device, out.hbm_rows)
    if task.reservation.one_share_per_table and (g.parts > 1).any() and not fill_only:
        out, after = _tune_shares(items, cost_model, cache[key], out, after)
    if not after < before or not feasible(items, out.device, out.hbm_rows):
        return plan, before
    return out.to_plan(task, plan.sharder), after


def polish_arrays(items: ShardingTask, cost_model: CostModel,
                  starts: list[tuple[np.ndarray, np.ndarray]], stop: float,
                  fixed: np.ndarray | None = None, node_bound: np.ndarray | None = None,
                  priced: CostCurves | None = None) -> tuple[int, np.ndarray, np.ndarray]:
    """The polish on bare arrays (for a solver's warm start). Each start (devices, HBM rows of
    every item of ``items``: tables, or shards priced as tables) is water-filled; the one whose
    most loaded device is then lightest is moved until ``stop`` (a ``time.perf_counter``
    instant) or until no move helps (``fixed`` items stay on their device, ``node_bound``
    ones on their node). A start's raw cost says little of where it polishes to (a greedy
    plan's HBM split can be far off while its placement is good); another start is filled only
    while that fits before ``stop``. ``priced``: the items' cost curves, when a solver has
    them. Returns (the start's index, devices, HBM rows), which may not be cheaper than that
    start: the caller prices and checks them."""
    curves = Curves.price(items, cost_model, priced)
    best: tuple[float, int, Polisher] | None = None
    for i, (device, rows) in enumerate(starts):
        began = time.perf_counter()
        polisher = Polisher(items, cost_model, curves, device, rows, node_bound, fixed)
        polisher.refill()
        top = float(polisher.load.max())
        if best is None or top < best[0]:
            best = (top, i, polisher)
        if 2 * time.perf_counter() - began >= stop:  # the next fill would end past it
            break
    assert best is not None, "no start"
    _, index, polisher = best
    polisher.search(max(MIN_ROUNDS, ROUNDS_PER_DEVICE * items.num_devices) * 1000,
                    max(stop - time.perf_counter(), 0.0))
    return index, polisher.device, polisher.rows


def _tune_shares(items: ShardingTask, cost_model: CostModel, curves: Curves, layout: ShardLayout,
                 cost: float) -> tuple[ShardLayout, float]:
    """Each split table's one HBM share (the dearest tables first, at most
    :data:`TUNED_TABLES`) tried at :data:`SHARE_STEPS` times its value (or at
    :data:`FIRST_SHARES` when it has none), then :data:`REFINE` times halfway between the best
    and its neighbours, with the other items' HBM water-filled around it; the cheapest that
    fits is kept. The water-filling before the shares were made one per table chose each
    shard's rows on its own device, so the common share is worth choosing again."""
    g, device = layout.geometry, layout.device
    split = g.parts > 1
    price = cost_model.price(items, np.arange(g.num_shards), device, layout.hbm_rows).total_ms
    tables = np.unique(g.table[split])
    worth = np.bincount(g.table, weights=price)[tables]
    best, best_cost = layout.hbm_rows, cost

    def priced(idx: np.ndarray, share: float) -> tuple[np.ndarray, float]:
        rows = np.where(split, best, 0)
        rows[idx] = np.floor(share * g.rows[idx] + 1e-9)
        trial = Polisher(items, cost_model, curves, device, rows, locked=split)
        if (trial.hbm_cap < -1e-6).any():  # the shards' HBM alone overfills a device
            return rows, np.inf
        trial.refill()
        if not feasible(items, device, trial.rows):
            return rows, np.inf
        return trial.rows, step_cost_ms(items, cost_model, device, trial.rows)

    for t in tables[np.argsort(-worth, kind="stable")[:TUNED_TABLES]]:
        idx = np.flatnonzero(g.table == t)
        share = float(best[idx].sum() / g.rows[idx].sum())
        tried = {share: best_cost}
        steps = FIRST_SHARES if share <= 0 else tuple(min(share * m, 1.0) for m in SHARE_STEPS)
        for _ in range(REFINE + 1):
            for s in steps:
                if s in tried:
                    continue
                rows, tried[s] = priced(idx, s)
                if tried[s] < best_cost * (1 - MARGIN):
                    best, best_cost = rows, tried[s]
            grid = sorted(tried)
            at = grid.index(min(grid, key=tried.__getitem__))
            steps = tuple((grid[at] + grid[j]) / 2 for j in (at - 1, at + 1)
                          if 0 <= j < len(grid))
    return ShardLayout(g, device, best), best_cost
