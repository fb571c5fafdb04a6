"""Placing every table (or shard) whole with its HBM rows: the solve behind ``recshard``.

One placement solve (the sharder's steps 1-4, :mod:`autoshard.sharders.recshard`): the
aggregated LP relaxation, warm starts (the greedy family and an LP-guided packing, each with its
row splits re-optimised), the search stage's large-neighbourhood search re-solving the MILP a
few devices at a time (:mod:`autoshard.search.lns`), and on tasks small enough the whole MILP,
each within its share of the deadline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from autoshard.errors import DeadlineReached, PlannerError
from autoshard.layout.feasibility import feasible, fit_hbm
from autoshard.layout.plan import Plan
from autoshard.layout.shards import whole_tables
from autoshard.milp import model as milp_model
from autoshard.milp.plans import (
    device_subproblem,
    lp_packing,
    pin,
    polish,
    step_cost,
    to_memory,
    to_rows,
)
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import CostCurves, cost_curves, device_kinds
from autoshard.replan.budget import Moves
from autoshard.search.lns import (
    MIN_SEARCH_S,
    LNSSettings,
    Neighbourhood,
    even_shares,
    left,
    lns_search,
    lp_seconds,
    set_up,
)
from autoshard.task import ShardingTask

#: Greedy sharders tried as warm starts (the best feasible one is kept); the first is built
#: before anything else and returned when the deadline comes before any better plan.
WARM_STARTS = ("lookup_greedy", "size_lookup_greedy", "size_greedy", "dim_greedy")

#: Share of one placement solve's budget by which the pricing of the MILP's cost curves must
#: finish (past it, the first warm start is returned; the table-wise spread bound's share is
#: :data:`autoshard.search.lns.BOUND_SHARE`).
CURVES_SHARE = 0.6
#: A warm start's row splits are re-optimised only with this share of the time limit left.
POLISH_SHARE = 0.1
#: On tasks too large for the whole MILP, the warm start that water-fills cheapest also goes
#: through the search stage's polish (HBM water-filled, items moved:
#: :func:`autoshard.search.polish.polish_arrays`) until this share of the time left has
#: passed; without it a greedy start on thousands of tables can stay several times its bound
#: (4.5x at 20,000 x 64, HBM for 30% of the bytes).
SEARCH_START_SHARE = 0.8
#: The warm start of a re-plan: the plan in use carried onto the items (where it fits them,
#: the only start: the greedy family's copy more than a budget allows).
CARRIED_START = "carried"
#: Status reported when the deadline came before the MILP's curves were priced.
DEADLINE_STATUS = f"deadline: {WARM_STARTS[0]} plan, cost curves not priced in time"


@dataclass(frozen=True)
class RecShardResult:
    """What the MILP sharder found.

    Args:
        plan: The plan returned.
        step_cost_ms: Its step cost under the cost model (max over devices).
        bound_ms: A lower bound on the step cost of every feasible plan (with ``split=False``:
            of every plan that places tables whole; see the module docstring).
        gap: (step cost - bound) / step cost: the proven distance from optimal.
        seconds: Wall time of the whole solve.
        method: ``milp`` (the whole MILP gave the plan), ``lns`` (the search did) or ``warm``
            (the best warm start, splits re-optimised, was not improved on).
        status: How the whole MILP ended: HiGHS's ``Optimal`` (within ``mip_rel_gap``),
            ``stalled`` (its stall rule: no longer improving), ``Time limit reached``; or
            ``search`` when it did not run (the search closed the gap, or the task is too
            large for one MILP).
        warm_start: Name of the warm-start plan.
        warm_cost_ms: Its step cost.
        found_s: Seconds from the start of the solve to when the returned plan was found.
        budget_bound_ms: In a re-plan whose moves are not priced, a lower bound on the step
            cost of every plan within its budget that keeps the carried plan's splits (the
            MILP's, with its move term); None otherwise.
    """

    plan: Plan
    step_cost_ms: float
    bound_ms: float
    gap: float
    seconds: float
    method: str
    status: str
    warm_start: str
    warm_cost_ms: float
    found_s: float = 0.0
    budget_bound_ms: float | None = None

    def report(self) -> dict[str, object]:
        """The solve's figures, as a plan's report shows them (JSON-ready)."""
        doc: dict[str, object] = {
            "solver": "recshard (HiGHS MILP)", "status": self.status, "method": self.method,
            "bound_ms": self.bound_ms, "gap": self.gap, "seconds": self.seconds,
            "found_s": self.found_s, "warm_start": self.warm_start,
            "warm_cost_ms": self.warm_cost_ms}
        if self.budget_bound_ms is not None:
            doc["budget_bound_ms"] = self.budget_bound_ms
        return doc


@dataclass(frozen=True)
class SolveSettings:
    """The settings of a placement solve (see :class:`autoshard.sharders.recshard.RecShard`,
    whose options they are)."""

    time_limit: float
    mip_rel_gap: float
    max_lines: int | None
    max_pairs: int
    group_devices: int
    seed: int
    stall: float

    @property
    def lns(self) -> LNSSettings:
        """The options the large-neighbourhood search reads."""
        return LNSSettings(self.mip_rel_gap, self.max_lines, self.max_pairs,
                           self.group_devices, self.seed, self.stall)


def solve_tables(settings: SolveSettings, task: ShardingTask, cost_model: CostModel,
                 deadline: float, pins: np.ndarray | None = None,
                 search_cap: float | None = None, moves: Moves | None = None) -> Found:
    """Places every table (or shard, for a shard task) whole, with its HBM rows; ``pins``:
    a device per table (shard), -1 where free; ``search_cap``: on a task too large for the
    whole MILP, the search runs at most that many times as long as the solve before it.
    ``moves``: a re-plan's budget; the plan in use carried is then the one warm start (the
    greedy family's where it does not fit the items), and every step keeps within the budget
    (the MILP's move term)."""
    start = time.perf_counter()
    budget = max(deadline - start, 0.01)
    kinds = device_kinds(task)
    # The cheapest warm start first: the plan returned if the deadline comes before any
    # better one exists (None when it cannot place the task; then no phase is cut short).
    fallback = None if moves is None else _carried_start(task, pins, moves)
    if fallback is None:  # outside a re-plan, or the carried plan does not fit these items
        fallback = _cheap_start(task, cost_model, pins)
    cut = None if fallback is None else start + CURVES_SHARE * budget
    try:
        curves = cost_curves(task, cost_model, kinds, deadline=cut)
    except DeadlineReached:
        assert fallback is not None
        cost = step_cost(task, cost_model, *fallback[1:])
        return Found(*fallback[1:], cost, 0.0, "warm", DEADLINE_STATUS, fallback[0], cost,
                     time.perf_counter())
    full, relaxed, bound, lines = set_up(settings.lns, task, cost_model, kinds, curves, start,
                                          deadline)
    whole = task.num_tables * task.num_devices <= settings.max_pairs
    search_end = start + budget * (0.5 if whole else 1.0)
    ctx = Neighbourhood(task, cost_model, kinds, lines, full, search_end, bound, pins, moves)
    name, device, rows = _warm_start(settings, ctx, relaxed, fallback, time.perf_counter() - start,
                                     searched=None if whole or moves else curves)
    warm_cost = step_cost(task, cost_model, device, rows)
    if search_cap is not None and not whole:
        now = time.perf_counter()
        ctx = replace(ctx, deadline=min(ctx.deadline, now + max(
            MIN_SEARCH_S, search_cap * (now - start))))
    found_at = time.perf_counter()
    device, rows, improved = lns_search(settings.lns, ctx, device, rows, settings.stall)
    cost = step_cost(task, cost_model, device, rows)
    method, status = ("lns" if cost < warm_cost else "warm"), "search"
    found_at = improved or found_at
    if whole and (cost - bound) > settings.mip_rel_gap * cost:
        ctx = Neighbourhood(task, cost_model, kinds, lines, full, deadline, bound, pins, moves)
        status, better, mip_bound, when = _whole(settings, ctx, device, rows, bound)
        bound = max(bound, mip_bound)
        if (better is not None and feasible(task, *better) and ctx.allows(*better)
                and ctx.objective(*better) < ctx.objective(device, rows)):
            (device, rows), method = better, "milp"
            cost = step_cost(task, cost_model, *better)
            found_at = when or time.perf_counter()
    even = even_shares(task, kinds, full, device, deadline, ctx=ctx if moves else None,
                       rows=rows)
    if even is not None:
        rows, cost = even, step_cost(task, cost_model, device, even)
    return Found(device, rows, cost, bound, method, status, name, warm_cost, found_at)


def _warm_start(settings: SolveSettings, ctx: Neighbourhood, relaxed: milp_model.Solution,
                first: tuple[str, np.ndarray, np.ndarray] | None, first_s: float,
                searched: CostCurves | None = None) -> tuple[str, np.ndarray, np.ndarray]:
    """The cheapest feasible plan among the greedy family (``first``: the first of
    :data:`WARM_STARTS`, already built in about ``first_s`` seconds) and the LP-guided
    packing, each with its row splits re-optimised for its devices; with ``searched`` (the
    items' cost curves), the start that water-fills cheapest polished by the search stage too
    (:data:`SEARCH_START_SHARE`)."""
    from autoshard.sharders import get_sharder

    task, model = ctx.task, ctx.cost_model
    starts = [] if first is None else [first]
    # In a re-plan, the others only where they copy within its budget (without a limit, all).
    starts += [s for s in _other_starts(ctx, relaxed, bool(starts), first_s)
               if ctx.allows(s[1], s[2])]
    if not starts:
        try:  # the first greedy's own error says which table fits nowhere, with the bytes
            get_sharder(WARM_STARTS[0]).shard(task, model)
        except PlannerError as exc:
            raise PlannerError("capacity", f"no feasible start: every greedy sharder and the LP "
                               f"packing failed ({WARM_STARTS[0]}: {exc})") from exc
        raise PlannerError("capacity", f"no feasible start: every greedy sharder and the LP "
                           f"packing failed to place {task.num_tables} tables on "
                           f"{task.num_devices} devices")
    scored = []
    everything, devices = np.arange(task.num_tables), np.arange(task.num_devices)
    found = None if searched is None else _searched_start(ctx, starts, searched)
    if found is not None:
        starts.append(found)
    for name, device, rows in starts:
        scored.append((ctx.objective(device, rows), name, device, rows))
        if left(ctx.deadline) < POLISH_SHARE * settings.time_limit + lp_seconds(ctx.full):
            continue
        better = polish(task, ctx.kinds, ctx.full, everything, devices, device,
                        min(left(ctx.deadline), 10.0),
                        moves=ctx.terms(everything, devices, device, rows))
        if better is not None and feasible(task, device, better) and ctx.allows(device, better):
            scored.append((ctx.objective(device, better), name, device, better))
    best = min(scored, key=lambda c: c[0])
    return best[1], best[2], best[3]


def _other_starts(ctx: Neighbourhood, relaxed: milp_model.Solution, started: bool,
                  first_s: float) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The greedy family after the first (each only while it can finish in time: about
    ``first_s`` seconds each) and the LP-guided packing, their pins kept."""
    from autoshard.sharders import get_sharder

    task, model = ctx.task, ctx.cost_model
    out: list[tuple[str, np.ndarray, np.ndarray]] = []
    for name in WARM_STARTS[1:]:
        # Another greedy takes about as long as the first: started only if it can finish.
        if (started or out) and left(ctx.deadline) < 2 * first_s:
            break
        try:
            placed = pin(task, ctx.pins, *get_sharder(name).shard(task, model).arrays(task))
        except PlannerError:
            continue
        if placed is not None:
            out.append((name, *placed))
    if (started or out) and _past(ctx.deadline):
        return out
    packed = lp_packing(task, model, ctx.kinds, ctx.full, relaxed)
    packed = None if packed is None else pin(task, ctx.pins, *packed)
    return out if packed is None else [*out, ("lp_packing", *packed)]


def _searched_start(ctx: Neighbourhood, starts: list[tuple[str, np.ndarray, np.ndarray]],
                    curves: CostCurves) -> tuple[str, np.ndarray, np.ndarray] | None:
    """The start that water-fills cheapest, through the search stage's polish
    (``<name>+search``) until :data:`SEARCH_START_SHARE` of the time left has passed; pinned
    items stay on their device. None when the result does not fit (that start is already
    among ``starts``)."""
    from autoshard.layout import kinds as sharding_kinds
    from autoshard.search.polish import polish_arrays

    task, model = ctx.task, ctx.cost_model
    fixed = None if ctx.pins is None else ctx.pins >= 0
    g = getattr(task, "geometry", None)
    local = None if g is None else sharding_kinds.node_local(g.kind)
    stop = time.perf_counter() + SEARCH_START_SHARE * left(ctx.deadline)
    index, device, rows = polish_arrays(task, model, [(d, r) for _, d, r in starts], stop,
                                        fixed, local, curves)
    if not feasible(task, device, rows):
        return None
    return f"{starts[index][0]}+search", device, rows


def _whole(settings: SolveSettings, ctx: Neighbourhood, device: np.ndarray, rows: np.ndarray,
           bound: float
           ) -> tuple[str, tuple[np.ndarray, np.ndarray] | None, float, float | None]:
    """The whole task as one MILP (stopped at its gap, its stall rule or the deadline), then
    its splits polished on the full curves: (status, plan, proven bound, when its last
    improving solution was found)."""
    task = ctx.task
    tables, devices = np.arange(task.num_tables), np.arange(task.num_devices)
    terms = ctx.terms(tables, devices, device, rows)
    sub = device_subproblem(task, ctx.kinds, tables, devices, pins=ctx.pins, moves=terms)
    sol = milp_model.solve(sub, ctx.lines, warm=(device, to_memory(task, rows)), lower=bound,
                           mip_rel_gap=settings.mip_rel_gap, time_limit=left(ctx.deadline),
                           stall=settings.stall)
    if sol.device is None or sol.memory is None:
        return sol.status, None, sol.bound, None
    new_rows = fit_hbm(task, sol.device, to_rows(task, sol.memory))
    better = polish(task, ctx.kinds, ctx.full, tables, devices, sol.device,
                    max(left(ctx.deadline), 2.0), moves=terms)
    if better is not None and feasible(task, sol.device, better) and ctx.allows(
            sol.device, better) and ctx.objective(sol.device, better) < ctx.objective(
            sol.device, new_rows):
        new_rows = better
    return sol.status, (sol.device, new_rows), sol.bound, sol.improved_at


@dataclass(frozen=True)
class Found:
    """One placement solve: devices and HBM rows per table (or shard), its cost, the bound
    proven for plans of the same tables (or shards), and how it was found."""

    device: np.ndarray
    rows: np.ndarray
    cost: float
    bound: float
    method: str
    status: str
    warm_start: str
    warm_cost: float
    found_at: float


def _cheap_start(task: ShardingTask, cost_model: CostModel, pins: np.ndarray | None = None
                 ) -> tuple[str, np.ndarray, np.ndarray] | None:
    """The first of :data:`WARM_STARTS`' plan (name, devices, HBM rows), its ``pins`` kept;
    None if it fails."""
    from autoshard.sharders import get_sharder

    name = WARM_STARTS[0]
    try:
        placed = pin(task, pins, *get_sharder(name).shard(task, cost_model).arrays(task))
    except PlannerError:
        return None
    return None if placed is None else (name, *placed)


def _carried_start(task: ShardingTask, pins: np.ndarray | None, moves: Moves
                   ) -> tuple[str, np.ndarray, np.ndarray] | None:
    """The plan in use carried onto the items of ``task`` (:meth:`autoshard.replan.budget.
    Moves.start`), its ``pins`` kept; None where some item has no place in it or it does not
    fit."""
    g = getattr(task, "geometry", None)
    found = moves.start(g if g is not None else whole_tables(task))
    if found is None:
        return None
    placed = pin(task, pins, *found)
    return None if placed is None else (CARRIED_START, *placed)


def _past(deadline: float) -> bool:
    return time.perf_counter() >= deadline


