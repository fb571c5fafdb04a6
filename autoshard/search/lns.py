"""Large-neighbourhood search: the MILP re-solved on the most loaded device and a lighter one
at a time, while it improves, from a given placement of a task's tables (or shards).

``recshard`` runs it between its warm starts and its whole MILP
(:func:`autoshard.sharders.recshard_tables.solve_tables`); ``ppo`` ends its improvement stage
with it on small tasks (:func:`resolve_plan`, ``+lns``). Both set up the MILP's lines the same
way (:func:`set_up`): the cost curves' lines over every hull segment, the aggregated LP
relaxation and its bound, and the lines kept under each curve for the group re-solves.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np

from autoshard.errors import DeadlineReached
from autoshard.layout.feasibility import feasible, fit_hbm
from autoshard.layout.plan import Plan
from autoshard.layout.shards import (
    ShardGeometry,
    ShardLayout,
    held_shards,
    plan_layout,
    pricing_task,
    whole_tables,
)
from autoshard.milp import model as milp_model
from autoshard.milp.plans import (
    aggregated,
    device_loads,
    device_subproblem,
    polish,
    single_bound,
    to_memory,
    to_rows,
)
from autoshard.pricing.bounds import lower_bound_ms
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import (
    CostCurves,
    CostLines,
    DeviceKinds,
    cost_curves,
    device_kinds,
)
from autoshard.pricing.evaluator import step_cost_ms
from autoshard.replan.budget import Moves
from autoshard.task import ShardingTask

#: Most lines over all curves in the LPs over "every" hull line; above it, each curve keeps
#: :data:`LARGE_TASK_LINES` evenly spaced ones (a weaker but still valid relaxation).
FULL_LINES_LIMIT = 200_000
LARGE_TASK_LINES = 32
#: The aggregated LP starts only with this share of a placement solve's budget left.
LP_SHARE = 0.5
#: Share of a solve's budget by which the table-wise spread bound must be priced (past it,
#: skipped).
BOUND_SHARE = 0.3
#: Cost lines per second that building and presolving an LP over every table gets through (a
#: conservative figure from a 2-core Xeon; HiGHS's time limit leaves that work out): such an
#: LP starts only when the time left covers it too.
LP_LINES_PER_SECOND = 100_000
#: Lines per cost curve in the search's group re-solves on tasks too large for the whole MILP.
SEARCH_LINES = 24
#: Seconds the search runs before it may stop for lack of progress (``stall``).
MIN_SEARCH_S = 1.0


#: ``recshard``'s defaults for the search's options (its constructor's ``mip_rel_gap``,
#: ``max_pairs`` and ``group_devices``), shared with ``ppo``'s re-solve.
MIP_REL_GAP, MAX_PAIRS, GROUP_DEVICES = 5e-3, 2400, 2


@dataclass(frozen=True)
class LNSSettings:
    """The options the search reads (``recshard``'s, :class:`autoshard.sharders.recshard.
    RecShard`).

    Args:
        mip_rel_gap: The search stops once the plan is within this share of the bound; each
            group re-solve stops at it too.
        max_lines: Lines kept under each curve (None: as many as keep a whole MILP near 20,000
            rows, :data:`SEARCH_LINES` on tasks over ``max_pairs``).
        max_pairs: Largest tables x devices solved as one MILP (sets the lines kept).
        group_devices: Devices re-solved together in each step.
        seed: Seed of the choice of lighter devices.
        stall: The search stops once the second half of its time lowered the step cost by
            less than this share of it (after :data:`MIN_SEARCH_S`); 0: while it improves.
    """

    mip_rel_gap: float = MIP_REL_GAP
    max_lines: int | None = None
    max_pairs: int = MAX_PAIRS
    group_devices: int = GROUP_DEVICES
    seed: int = 0
    stall: float = 0.0


@dataclass(frozen=True)
class Neighbourhood:
    """What every stage of one solve shares; in a re-plan, its moves (:class:`autoshard.replan.
    budget.Moves`)."""

    task: ShardingTask
    cost_model: CostModel
    kinds: DeviceKinds
    lines: CostLines
    full: CostLines
    deadline: float
    bound: float
    pins: np.ndarray | None = None
    moves: Moves | None = None

    def terms(self, tables: np.ndarray, devices: np.ndarray, device: np.ndarray,
              rows: np.ndarray) -> milp_model.MoveTerms | None:
        """The move term of a subproblem of ``tables`` on ``devices``, the other items as
        ``device`` and ``rows`` place them (None outside a re-plan, or in one whose moves are
        neither limited nor priced nor ruled)."""
        m = self.moves
        if m is None or not (m.limited or m.horizon is not None or m.rules.hbm_with_device):
            return None
        return m.terms(self.items, tables, devices, device, rows)

    @property
    def items(self) -> ShardGeometry:
        """The geometry of the task's items: a shard task's shards, else its tables whole."""
        g: ShardGeometry | None = getattr(self.task, "geometry", None)
        return g if g is not None else whole_tables(self.task)

    def allows(self, device: np.ndarray, rows: np.ndarray) -> bool:
        """Whether a placement of the items copies within the re-plan's limit (always outside
        one)."""
        return self.moves is None or self.moves.allows(ShardLayout(self.items, device, rows))

    def objective(self, device: np.ndarray, rows: np.ndarray) -> float:
        """:meth:`score` of a placement, its loads priced here."""
        return self.score(device, rows, device_loads(self.task, self.cost_model, device, rows))

    def score(self, device: np.ndarray, rows: np.ndarray, loads: np.ndarray) -> float:
        """What a placement costs: its step cost (``loads``' max), plus its moves' price per
        step in a re-plan that prices them."""
        if self.moves is None or self.moves.horizon is None:
            return float(loads.max())
        return float(loads.max()) + self.moves.price_ms(ShardLayout(self.items, device, rows))

def search_from(settings: LNSSettings, task: ShardingTask, cost_model: CostModel,
                device: np.ndarray, rows: np.ndarray, deadline: float,
                pins: np.ndarray | None = None, moves: Moves | None = None
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """Step 3 alone (:func:`lns_search`, the MILP re-solved a few devices at a time) from a
    given placement of ``task``'s tables (or shards), ``pins`` kept (in a re-plan, within its
    ``moves``' limit); the cost curves, the relaxation and the lines as a whole solve sets them
    up (:func:`set_up`), each split table's shards then kept at one HBM share where the
    runtime holds one (:func:`even_shares`). The devices and HBM rows found, or None when
    nothing improved or the curves were not priced by ``deadline``."""
    start, kinds = time.perf_counter(), device_kinds(task)
    try:
        curves = cost_curves(task, cost_model, kinds, deadline=deadline)
    except DeadlineReached:
        return None
    full, _, bound, lines = set_up(settings, task, cost_model, kinds, curves, start, deadline)
    ctx = Neighbourhood(task, cost_model, kinds, lines, full, deadline, bound, pins, moves)
    found, found_rows, improved = lns_search(settings, ctx, device, rows, settings.stall)
    if improved is None:
        return None
    even = even_shares(task, kinds, full, found, deadline, least=0.0, ctx=ctx, rows=found_rows)
    return found, found_rows if even is None else even

def set_up(settings: LNSSettings, task: ShardingTask, cost_model: CostModel,
            kinds: DeviceKinds, curves: CostCurves, start: float, deadline: float
            ) -> tuple[CostLines, milp_model.Solution, float, CostLines]:
    """What a solve begun at ``start`` builds on its priced ``curves``: the lines over every
    hull segment (evenly spaced ones past :data:`FULL_LINES_LIMIT`), the aggregated relaxation
    and the best bound in time (:func:`_relaxation`), and the lines kept under each curve for
    the MILP (by a fifth of the budget): ``max_lines``, or as many as keep the whole model near
    20,000 rows (:data:`SEARCH_LINES` for the search alone), focused where the relaxation puts
    each table's HBM."""
    full = curves.lines()
    if int(full.count.sum()) > FULL_LINES_LIMIT:  # keep the LPs small enough to stop in time
        full = curves.lines(LARGE_TASK_LINES, deadline=0.0)
    relaxed, bound = _relaxation(task, cost_model, kinds, full, start, deadline)
    focus = None
    if relaxed.memory is not None:
        focus = np.repeat(relaxed.memory[:, None], kinds.count, axis=1)
    pairs = task.num_tables * task.num_devices
    count = (int(np.clip(20000 // pairs, 8, 48)) if pairs <= settings.max_pairs
             else SEARCH_LINES)
    lines = curves.lines(settings.max_lines or count, focus,
                         deadline=start + 0.2 * max(deadline - start, 0.01))
    return full, relaxed, bound, lines

def even_shares(task: ShardingTask, kinds: DeviceKinds, full: CostLines, device: np.ndarray,
                 deadline: float, least: float = 2.0, ctx: Neighbourhood | None = None,
                 rows: np.ndarray | None = None) -> np.ndarray | None:
    """On a task of shards whose runtime keeps one HBM share per split table (TorchRec's
    one), the HBM rows of every item on ``device`` re-chosen by the LP with each split
    table's shards at one share, given until ``deadline`` or ``least`` seconds; None
    elsewhere or when that does not fit (in a re-plan, ``ctx``'s, or exceeds its limit; its
    HBM ``rows`` now)."""
    tied = tied_shares(task)
    if tied is None:
        return None
    everything = np.arange(task.num_tables)
    terms = (None if ctx is None or rows is None
             else ctx.terms(everything, np.arange(task.num_devices), device, rows))
    even = polish(task, kinds, full, everything, np.arange(task.num_devices),
                  device, max(left(deadline), least), tied, moves=terms)
    if even is None or not feasible(task, device, even):
        return None
    return even if ctx is None or ctx.allows(device, even) else None

def _relaxation(task: ShardingTask, cost_model: CostModel, kinds: DeviceKinds,
                full: CostLines, start: float, deadline: float
                ) -> tuple[milp_model.Solution, float]:
    """The aggregated LP relaxation (skipped when too little time is left) and the best bound
    in time: the LP's, the dearest single table's, and the table-wise spread bound."""
    budget = max(deadline - start, 0.01)
    # HiGHS's limit leaves out building the model: started only with half the budget left.
    relaxed = milp_model.Solution(None, None, np.inf, np.inf, "skipped", 0.0)
    if left(deadline) > LP_SHARE * budget + lp_seconds(full):
        relaxed = milp_model.solve(aggregated(task, kinds), full,
                                   time_limit=min(0.5 * left(deadline), 0.3 * budget))
    bound = max(relaxed.bound if np.isfinite(relaxed.bound) else 0.0, single_bound(full))
    with contextlib.suppress(DeadlineReached):  # the spread bound too, while time allows
        bound = max(bound, lower_bound_ms(task, cost_model, whole_tables=True,
                                          deadline=start + BOUND_SHARE * budget))
    return relaxed, bound

def lns_search(settings: LNSSettings, ctx: Neighbourhood, device: np.ndarray, rows: np.ndarray,
            stall: float) -> tuple[np.ndarray, np.ndarray, float | None]:
    """Large-neighbourhood search: re-solve the most loaded device with a few others (until
    it stalls: :func:`autoshard.milp.model.stalled`); also returns when it last improved
    (None if it never did)."""
    task = ctx.task
    rng = np.random.default_rng(settings.seed)
    device, rows = device.copy(), rows.copy()
    loads = device_loads(task, ctx.cost_model, device, rows)
    group = min(settings.group_devices, task.num_devices)
    if group < 2:
        return device, rows, None
    improved = None
    stale, patience = 0, max(3 * task.num_devices // group, 6)
    history = [(time.perf_counter(), ctx.score(device, rows, loads))]
    while left(ctx.deadline) > 0.2 and stale < patience:
        if ctx.score(device, rows, loads) - ctx.bound <= settings.mip_rel_gap * loads.max():
            break
        if milp_model.stalled(history, stall, MIN_SEARCH_S):
            break
        order = np.argsort(loads)
        worst = int(order[-1])
        lighter = order[: max(task.num_devices // 2, group - 1)]
        pool = lighter[lighter != worst]
        if stale == 0:  # the lightest first, then random lighter ones
            partners = pool[: group - 1]
        else:
            partners = rng.choice(pool, size=group - 1, replace=False)
        devs = np.unique(np.append(partners, worst))
        if _improve(settings, ctx, devs, device, rows, loads):
            stale, improved = 0, time.perf_counter()
        else:
            stale += 1
        history.append((time.perf_counter(), ctx.score(device, rows, loads)))
    return device, rows, improved

def _improve(settings: LNSSettings, ctx: Neighbourhood, devs: np.ndarray, device: np.ndarray,
             rows: np.ndarray, loads: np.ndarray) -> bool:
    """Re-solves the tables of ``devs``; updates the arrays in place if their max drops."""
    task = ctx.task
    tables = np.flatnonzero(np.isin(device, devs))
    if tables.size == 0:
        return False
    terms = ctx.terms(tables, devs, device, rows)
    sub = device_subproblem(task, ctx.kinds, tables, devs, pins=ctx.pins, moves=terms)
    position = np.searchsorted(devs, device[tables])
    limit = min(left(ctx.deadline), 5.0)
    sol = milp_model.solve(sub, ctx.lines, warm=(position, to_memory(task, rows[tables],
                                                                      tables)),
                           spread=1e-3, mip_rel_gap=settings.mip_rel_gap, time_limit=limit)
    if sol.device is None or sol.memory is None:
        return False
    split = polish(task, ctx.kinds, ctx.full, tables, devs, sol.device,
                   min(left(ctx.deadline), 5.0), moves=terms)
    new_device, new_rows = device.copy(), rows.copy()
    new_device[tables] = devs[sol.device]
    new_rows[tables] = split if split is not None else to_rows(task, sol.memory, tables)
    new_rows = fit_hbm(task, new_device, new_rows)
    if not feasible(task, new_device, new_rows) or not ctx.allows(new_device, new_rows):
        return False
    new_loads = device_loads(task, ctx.cost_model, new_device, new_rows)
    if ctx.moves is not None and ctx.moves.horizon is not None:
        if (ctx.score(new_device, new_rows, new_loads)
                >= ctx.score(device, rows, loads) * (1 - 1e-9)):
            return False
    elif new_loads[devs].max() >= loads[devs].max() * (1 - 1e-9):
        return False
    device[:], rows[:], loads[:] = new_device, new_rows, new_loads
    return True

def tied_shares(task: ShardingTask) -> np.ndarray | None:
    """For a task of shards whose runtime keeps one HBM share per split table, each shard's
    table when it is split (-1 when whole); else None."""
    g = getattr(task, "geometry", None)
    if g is None or not task.reservation.one_share_per_table or not (g.parts > 1).any():
        return None
    return np.where(g.parts > 1, g.table, -1)

def lp_seconds(lines: CostLines) -> float:
    """Seconds to set up an LP over every table's ``lines`` (:data:`LP_LINES_PER_SECOND`)."""
    return float(lines.count.sum()) / LP_LINES_PER_SECOND

def left(deadline: float) -> float:
    """Seconds left before ``deadline`` (at least 0.01)."""
    return max(deadline - time.perf_counter(), 0.01)



def resolve_plan(plan: Plan, task: ShardingTask, cost_model: CostModel, cost: float,
                 deadline: float, seed: int = 0, moves: Moves | None = None
                 ) -> tuple[Plan, float]:
    """``plan`` after the search (``recshard``'s default options, :class:`LNSSettings`, but no
    stall rule, so it runs until a round of devices brings nothing) until ``deadline``, and
    its step cost; the input where that is no cheaper. The items a split pins to their devices
    (one row shard per device, replicas, node-local shards) stay where the plan has them; each
    split table then keeps one HBM share where the task's runtime holds one
    (:meth:`~autoshard.layout.shards.ShardLayout.even_shares`). In a re-plan, the re-solves keep
    within its ``moves``' limit and rules (and ``cost`` is then the plan's step cost plus its
    moves' price where they are priced, as is the cost returned)."""
    layout = plan_layout(plan, task)
    g = layout.geometry
    items = pricing_task(task, g)
    held = held_shards(task, g)
    if moves is not None and (kept := moves.pins(g)) is not None:
        held = held | (kept >= 0)
    pins = np.where(held, layout.device, -1) if held.any() else None
    found = search_from(LNSSettings(seed=seed), items, cost_model, layout.device,
                        layout.hbm_rows, deadline, pins, moves)
    if found is None:
        return plan, cost
    out = ShardLayout(g, *found)
    if moves is None:
        out = out.even_shares(task)
    new_cost = step_cost_ms(items, cost_model, out.device, out.hbm_rows)
    if moves is not None:
        new_cost += moves.price_ms(out)
    if not new_cost < cost or not feasible(items, out.device, out.hbm_rows) or (
            moves is not None and not moves.allows(out)):
        return plan, cost
    return out.to_plan(task, plan.sharder), new_cost
