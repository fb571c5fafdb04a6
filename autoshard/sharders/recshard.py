"""RecShard-style statistical MILP sharder: devices and HBM/UVM row splits chosen jointly.

Each table goes to one device and keeps its hottest rows in HBM, the rest in host memory (UVM).
Its cost as a function of its HBM bytes comes from the cost model at the points where its access
curve bends (:mod:`autoshard.sharders.milp_curves`); rows never touched cost nothing wherever
they live, and pooling factor and coverage scale its lookups. The MILP
(:mod:`autoshard.sharders.milp_model`) minimises the step cost (max over devices) under HBM and
host capacities. One solve:

1. the aggregated LP relaxation (one "device" per kind of identical devices, every line under
   every cost curve): a lower bound valid for every plan, and row splits to aim at;
2. warm starts: the greedy family and a packing of the LP's splits, each with its splits
   re-optimised for its devices by an LP; the cheapest is kept, and nothing worse is returned;
3. a large-neighbourhood search: the MILP re-solved on the most loaded device and a lighter one
   at a time, while it improves (on tasks too large for step 4: by more than ``stall`` per half
   of its run), at any size, 856 tables on 128 devices included;
4. for tasks of up to ``max_pairs`` (table, device) pairs whose gap is still above
   ``mip_rel_gap``, the whole MILP (symmetry of identical devices broken by fixing variables),
   warm-started from the search, whose dual bound tightens the LP's.

The gap reported is (cost - bound) / cost with the best valid bound found.

Every phase keeps the time limit: the first warm start (``lookup_greedy``) is built before
anything else; pricing (the relaxation behind the split choice, the cost curves, the table-wise
spread bound) runs in chunks against a deadline that is a share of the limit
(:data:`SPLIT_SETUP_SHARE`, :data:`CURVES_SHARE`, :data:`BOUND_SHARE`); an LP over every table
starts only if the time left covers its set-up (:data:`LP_LINES_PER_SECOND`). When the curves are
not priced in time the first warm start is returned, and when the split choice is not made in
time tables stay whole; the status says so (:data:`DEADLINE_STATUS`, :data:`NO_SPLIT_STATUS`).

With ``split`` (the default) tables may be split: the tables whose cost alone exceeds a share of
the per-device mean of the least work are split column-wise or row-wise
(:func:`autoshard.splitting.split_heavy_tables`), their shards placed by the solve above as if
they were tables (with their own HBM rows), for each choice in :data:`SPLIT_TARGETS` while time
is left and the gap is open, then every table whole unless a split plan already costs less than
the table-wise bound; the cheapest plan is kept. On tasks too large for the whole MILP only the
first split choice is tried, its search capped (``split_search_cap``), so that splitting
plans within a small multiple of a table-wise solve's time. Its bound is then the spread-work
bound, valid for every plan, split or not (the table-wise bounds above are not).

The bounds are proven for cost models linear in the HBM share between the access curve's grid
points (the analytical model); under others (a learned model, TorchRec's estimator,
:mod:`autoshard.torchrec_cost`) they are the same relaxation's figures, approximate. With
``also_for`` a second model is planned for too (:mod:`autoshard.sharders.recshard_both`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from autoshard.bounds import DeadlineReached, Relaxation, lower_bound_ms, relax
from autoshard.cost import CostModel, is_model_spec
from autoshard.errors import InputError, PlannerError
from autoshard.plan import Plan
from autoshard.sharders import milp_model
from autoshard.sharders.milp_curves import (
    CostLines,
    DeviceKinds,
    cost_curves,
    device_kinds,
)
from autoshard.sharders.milp_plans import (
    aggregated,
    device_loads,
    device_subproblem,
    feasible,
    fit_hbm,
    lp_packing,
    pin,
    polish,
    single_bound,
    step_cost,
    to_memory,
    to_rows,
)
from autoshard.shards import (
    ShardGeometry,
    ShardLayout,
    for_torchrec,
    is_whole,
    pricing_task,
    same_split,
    split_pins,
    whole_tables,
)
from autoshard.splitting import split_heavy_tables
from autoshard.task import ShardingTask

#: Split choices tried in turn (the cheapest plan is kept), as (share of the spread-work bound
#: above which tables are split, whether that target is raised to what the dearest table can
#: reach, :func:`autoshard.splitting.split_heavy_tables`): first the reachable target (under
#: the analytical model nearly always the same choice as the next), then only the tables that
#: alone exceed the per-device mean, then finer. Identical choices are solved once.
SPLIT_TARGETS = ((1.0, True), (1.0, False), (0.5, False))

#: Most lines over all curves in the LPs over "every" hull line; above it, each curve keeps
#: :data:`LARGE_TASK_LINES` evenly spaced ones (a weaker but still valid relaxation).
FULL_LINES_LIMIT = 200_000
LARGE_TASK_LINES = 32

#: Greedy sharders tried as warm starts (the best feasible one is kept); the first is built
#: before anything else and returned when the deadline comes before any better plan.
WARM_STARTS = ("lookup_greedy", "size_lookup_greedy", "size_greedy", "dim_greedy")

#: Shares of the time limit (of one placement solve's budget for the last two) by which the
#: setup phases must finish: the split choice (the spread-work relaxation and the pricing of
#: candidate splits; past it, tables stay whole), the pricing of the MILP's cost curves (past
#: it, the first warm start is returned) and the table-wise spread bound (past it, skipped).
SPLIT_SETUP_SHARE = 0.3
CURVES_SHARE = 0.6
BOUND_SHARE = 0.3
#: The aggregated LP starts only with this share of a placement solve's budget left; a warm
#: start's row splits are re-optimised only with this share of the time limit left.
LP_SHARE = 0.5
POLISH_SHARE = 0.1
#: Cost lines per second that building and presolving an LP over every table gets through (a
#: conservative figure from a 2-core Xeon; HiGHS's time limit leaves that work out): such an
#: LP starts only when the time left covers it too.
LP_LINES_PER_SECOND = 100_000

#: Seconds the search runs before it may stop for lack of progress (``stall``).
MIN_SEARCH_S = 1.0
#: On tasks too large for the whole MILP, a split choice's search runs at most this many times
#: as long as its solve's set-up (cost curves, relaxation, warm starts) took (at least
#: :data:`MIN_SEARCH_S`): a table-wise solve of a task held up by one table is little more
#: than that set-up, and splitting then plans within 3x of it.
SPLIT_SEARCH_OVER_SETUP = 1.0
#: Split choices tried on such tasks (the first ones of :data:`SPLIT_TARGETS`).
LARGE_TASK_CHOICES = 1

#: Status reported when the deadline came before the MILP's curves were priced.
DEADLINE_STATUS = f"deadline: {WARM_STARTS[0]} plan, cost curves not priced in time"
#: Status suffix when there was no time to choose splits.
NO_SPLIT_STATUS = "deadline: splits not chosen in time, tables whole"


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
        status: HiGHS's status of the whole MILP, or ``search`` when it did not run.
        warm_start: Name of the warm-start plan.
        warm_cost_ms: Its step cost.
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


class RecShard:
    """Statistical MILP sharder (RecShard, Sethi et al. 2022) solved with HiGHS.

    Args:
        time_limit: Seconds for the whole solve; the best plan found by then is returned.
        mip_rel_gap: Relative gap at which the MILP stops early.
        max_lines: Lines kept under each table's cost curve (more: tighter, larger model);
            None: as many as keep the whole model near 20,000 rows (8 to 48).
        max_pairs: Largest tables x devices solved as one MILP; larger tasks use the search.
        group_devices: Devices re-solved together in each search step.
        seed: Seed of the search's choice of devices.
        split: Also split tables (row-wise or column-wise) whose cost exceeds a share of the
            per-device mean of the least work (:data:`SPLIT_TARGETS`); False: every table whole.
        stall: On tasks too large for the whole MILP, the search stops once the second half of
            its time lowered the step cost by less than this share of it (default 0.5%:
            splitting, whose search would otherwise run to the limit with the split bound's gap
            open, then plans within a small multiple of a table-wise solve's time); 0: it runs
            while it improves at all.
        node_splits: On hardware of several nodes, also offer table-row-wise splits (row
            shards over 2..(devices per node) devices of one node, their partial sums reduced
            within the node, one shard per device, the node and devices chosen in turn).
        also_for: A second cost model to plan for (``torchrec``: TorchRec's own perf
            estimator, :mod:`autoshard.torchrec_cost`; ``analytical``; or a learned model's
            folder): the plan is chosen to be good under both
            (:mod:`autoshard.sharders.recshard_both`). The cost and bound reported stay the
            first model's.
        split_search_cap: On tasks too large for the whole MILP (over ``max_pairs``), only
            the first split choice is tried and its search runs at most this many times as
            long as its solve's set-up (:data:`SPLIT_SEARCH_OVER_SETUP`), so that splitting
            plans within about 3x a table-wise solve's time; None: every split choice, each
            search until it stalls (slower, at times a cheaper plan).
    """

    name: ClassVar[str] = "recshard"
    summary: ClassVar[str] = "MILP over devices and HBM/UVM row splits (HiGHS), greedy warm start"

    def __init__(self, time_limit: float = 60.0, mip_rel_gap: float = 5e-3,
                 max_lines: int | None = None, max_pairs: int = 2400, group_devices: int = 2,
                 seed: int = 0, split: bool = True, stall: float = 5e-3,
                 node_splits: bool = True, also_for: str | None = None,
                 split_search_cap: float | None = SPLIT_SEARCH_OVER_SETUP) -> None:
        if also_for is not None and not is_model_spec(also_for):
            raise InputError("must be 'analytical', 'torchrec' or a learned cost model's "
                             "folder", source="sharder options", field="recshard.also_for",
                             value=also_for)
        self.also_for = also_for
        self.split_search_cap = split_search_cap
        self.split = split
        self.node_splits = node_splits
        self.stall = stall
        self.time_limit = time_limit
        self.mip_rel_gap = mip_rel_gap
        self.max_lines = max_lines
        self.max_pairs = max_pairs
        self.group_devices = group_devices
        self.seed = seed
        self.last_result: RecShardResult | None = None

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            import highspy  # noqa: F401
        except ImportError:
            return "needs the HiGHS solver: pip install highspy"
        return None

    @property
    def last_bound_ms(self) -> float | None:
        """Lower bound proven by the last solve (pass to ``evaluate(..., bound_ms=...)``)."""
        return None if self.last_result is None else self.last_result.bound_ms

    def shard(self, task: ShardingTask, cost_model: CostModel) -> Plan:
        self.last_result = self.solve(task, cost_model)
        return self.last_result.plan

    def solve(self, task: ShardingTask, cost_model: CostModel) -> RecShardResult:
        """Plans the task and reports cost, bound and gap."""
        if self.also_for is not None:
            from autoshard.cost import load_cost_model
            from autoshard.sharders.recshard_both import solve_both

            return solve_both(self, task, (cost_model, load_cost_model(self.also_for)))
        start = time.perf_counter()
        deadline = start + self.time_limit
        if not self.split:
            found = self._solve_tables(task, cost_model, deadline)
            return self._result(Plan.from_arrays(task, found.device, found.rows, self.name),
                                found, found.bound, start)
        # Valid for every plan, split tables included (the table-wise bounds are not).
        choices: list[ShardGeometry] = [whole_tables(task)]
        try:
            relaxed = relax(task, cost_model, deadline=start + SPLIT_SETUP_SHARE * self.time_limit)
            bound = float(relaxed.cost_ms.sum()) / task.num_devices
            choices = self._split_choices(task, cost_model, relaxed, bound,
                                          start + SPLIT_SETUP_SHARE * self.time_limit,
                                          self.node_splits)
            # Last, while time is left: every table whole (splits pay their shards' reserved
            # HBM and one HBM share per table, and may lose to it), unless a split plan already
            # costs less than any such plan can (:func:`_beats_whole`).
            whole = whole_tables(task)
            if (self.split_search_cap is not None
                    and task.num_tables * task.num_devices > self.max_pairs):
                # Too large for the whole MILP: fewer split choices (module docstring).
                choices = choices[:LARGE_TASK_CHOICES]
            if not any(same_split(whole, h) for h in choices):
                choices.append(whole)
        except DeadlineReached:  # no time to choose splits: tables whole, no bound proven
            found = self._solve_tables(task, cost_model, deadline)
            found = replace(found, status=f"{found.status}; {NO_SPLIT_STATUS}")
            return self._result(Plan.from_arrays(task, found.device, found.rows, self.name),
                                found, 0.0, start)
        best: tuple[ShardLayout, _Found] | None = None
        first = self.time_limit
        for i, g in enumerate(choices):
            if best is not None and (_left(deadline) < 0.1 * self.time_limit
                                     or best[1].cost - bound <= self.mip_rel_gap * best[1].cost
                                     or _beats_whole(task, cost_model, g, best[1].cost,
                                                     deadline)):
                break
            more = i < len(choices) - 1
            began = time.perf_counter()
            # A finer split gets no more time than the first solve took (at least a tenth of
            # the limit), so that splitting costs a bounded multiple of a table-wise solve.
            stop = began + min(_left(deadline) * (0.6 if more else 1.0), first)
            sub = pricing_task(task, g)
            try:
                found = self._solve_tables(
                    sub, cost_model, stop, split_pins(task, g),
                    search_cap=None if sub is task else self.split_search_cap)
            except PlannerError:  # e.g. a whole table's reserved HBM fits no device
                if best is None and not more:
                    raise
                continue
            if i == 0:
                first = max(time.perf_counter() - began, 0.1 * self.time_limit)
            # One HBM share per split table, as TorchRec's one cache load factor has it.
            layout = ShardLayout(g, found.device, found.rows).even_shares(task)
            if not np.array_equal(layout.hbm_rows, found.rows):
                found = replace(found, rows=layout.hbm_rows, cost=step_cost(
                    sub, cost_model, layout.device, layout.hbm_rows))
            if best is None or found.cost < best[1].cost:
                best = (layout, found)
        assert best is not None
        return self._result(best[0].to_plan(task, self.name), best[1], bound, start)

    @staticmethod
    def _split_choices(task: ShardingTask, cost_model: CostModel, relaxed: Relaxation,
                       bound: float, deadline: float, node_local: bool = True
                       ) -> list[ShardGeometry]:
        """The distinct split choices of :data:`SPLIT_TARGETS` (tables whole when none is
        chosen in time: :class:`DeadlineReached` past ``deadline``)."""
        choices: list[ShardGeometry] = []
        for share, reachable in SPLIT_TARGETS:
            if time.perf_counter() >= deadline:
                if choices:
                    break
                raise DeadlineReached("split choice")
            g = split_heavy_tables(task, cost_model, share * bound, relaxed=relaxed,
                                   node_local=node_local, reachable=reachable).geometry
            if not any(same_split(g, h) for h in choices):
                choices.append(g)
        return choices

    def _result(self, plan: Plan, found: _Found, bound: float, start: float) -> RecShardResult:
        cost = found.cost
        bound = min(bound, cost)
        return RecShardResult(plan, cost, bound, (cost - bound) / cost if cost > 0 else 0.0,
                              time.perf_counter() - start, found.method, found.status,
                              found.warm_start, found.warm_cost)

    def _solve_tables(self, task: ShardingTask, cost_model: CostModel, deadline: float,
                      pins: np.ndarray | None = None, search_cap: float | None = None
                      ) -> _Found:
        """Places every table (or shard, for a shard task) whole, with its HBM rows; ``pins``:
        a device per table (shard), -1 where free; ``search_cap``: on a task too large for the
        whole MILP, the search runs at most that many times as long as the solve before it."""
        start = time.perf_counter()
        budget = max(deadline - start, 0.01)
        kinds = device_kinds(task)
        # The cheapest warm start first: the plan returned if the deadline comes before any
        # better one exists (None when it cannot place the task; then no phase is cut short).
        fallback = _cheap_start(task, cost_model, pins)
        cut = None if fallback is None else start + CURVES_SHARE * budget
        try:
            curves = cost_curves(task, cost_model, kinds, deadline=cut)
        except DeadlineReached:
            assert fallback is not None
            cost = step_cost(task, cost_model, *fallback[1:])
            return _Found(*fallback[1:], cost, 0.0, "warm", DEADLINE_STATUS, fallback[0], cost)
        full = curves.lines()
        if int(full.count.sum()) > FULL_LINES_LIMIT:  # keep the LPs small enough to stop in time
            full = curves.lines(LARGE_TASK_LINES, deadline=0.0)
        # HiGHS's limit leaves out building the model: started only with half the budget left.
        relaxed = milp_model.Solution(None, None, np.inf, np.inf, "skipped", 0.0)
        if _left(deadline) > LP_SHARE * budget + _lp_seconds(full):
            relaxed = milp_model.solve(aggregated(task, kinds), full,
                                       time_limit=min(0.5 * _left(deadline), 0.3 * budget))
        bound = max(relaxed.bound if np.isfinite(relaxed.bound) else 0.0, single_bound(full))
        with contextlib.suppress(DeadlineReached):  # the spread bound too, while time allows
            bound = max(bound, lower_bound_ms(task, cost_model, whole_tables=True,
                                              deadline=start + BOUND_SHARE * budget))
        focus = None
        if relaxed.memory is not None:
            focus = np.repeat(relaxed.memory[:, None], kinds.count, axis=1)
        pairs = task.num_tables * task.num_devices
        whole = pairs <= self.max_pairs
        lines_budget = int(np.clip(20000 // pairs, 8, 48)) if whole else 24
        lines = curves.lines(self.max_lines or lines_budget, focus,
                             deadline=start + 0.2 * budget)
        search_end = start + budget * (0.5 if whole else 1.0)
        ctx = _Context(task, cost_model, kinds, lines, full, search_end, bound, pins)
        name, device, rows = self._warm_start(ctx, relaxed, fallback, time.perf_counter() - start)
        warm_cost = step_cost(task, cost_model, device, rows)
        if search_cap is not None and not whole:
            now = time.perf_counter()
            ctx = replace(ctx, deadline=min(ctx.deadline, now + max(
                MIN_SEARCH_S, search_cap * (now - start))))
        # With the whole MILP to follow (to the deadline), stopping the search early saves
        # nothing: it runs while it improves at all.
        device, rows = self._search(ctx, device, rows, 0.0 if whole else self.stall)
        cost = step_cost(task, cost_model, device, rows)
        method, status = ("lns" if cost < warm_cost else "warm"), "search"
        if whole and (cost - bound) > self.mip_rel_gap * cost:
            ctx = _Context(task, cost_model, kinds, lines, full, deadline, bound, pins)
            status, found, mip_bound = self._whole(ctx, device, rows, bound)
            bound = max(bound, mip_bound)
            if found is not None and feasible(task, *found):
                new_cost = step_cost(task, cost_model, *found)
                if new_cost < cost:
                    (device, rows), cost, method = found, new_cost, "milp"
        tied = _tied(task)
        if tied is not None:  # one share of rows in HBM per split table (TorchRec's one)
            even = polish(task, kinds, full, np.arange(task.num_tables),
                          np.arange(task.num_devices), device, max(_left(deadline), 2.0), tied)
            if even is not None and feasible(task, device, even):
                rows, cost = even, step_cost(task, cost_model, device, even)
        return _Found(device, rows, cost, bound, method, status, name, warm_cost)

    def _warm_start(self, ctx: _Context, relaxed: milp_model.Solution,
                    first: tuple[str, np.ndarray, np.ndarray] | None, first_s: float
                    ) -> tuple[str, np.ndarray, np.ndarray]:
        """The cheapest feasible plan among the greedy family (``first``: the first of
        :data:`WARM_STARTS`, already built in about ``first_s`` seconds) and the LP-guided
        packing, each with its row splits re-optimised for its devices."""
        from autoshard.sharders import get_sharder

        task, model = ctx.task, ctx.cost_model
        starts = [] if first is None else [first]
        for name in WARM_STARTS[1:]:
            # Another greedy takes about as long as the first: started only if it can finish.
            if starts and _left(ctx.deadline) < 2 * first_s:
                break
            try:
                placed = pin(task, ctx.pins, *get_sharder(name).shard(task, model).arrays(task))
            except PlannerError:
                continue
            if placed is not None:
                starts.append((name, *placed))
        packed = None if starts and _past(ctx.deadline) else lp_packing(
            task, model, ctx.kinds, ctx.full, relaxed)
        if packed is not None:
            packed = pin(task, ctx.pins, *packed)
        if packed is not None:
            starts.append(("lp_packing", *packed))
        if not starts:
            raise PlannerError("capacity", f"no feasible start: every greedy sharder and the LP "
                               f"packing failed to place {task.num_tables} tables on "
                               f"{task.num_devices} devices")
        scored = []
        everything, devices = np.arange(task.num_tables), np.arange(task.num_devices)
        for name, device, rows in starts:
            scored.append((step_cost(task, model, device, rows), name, device, rows))
            if _left(ctx.deadline) < POLISH_SHARE * self.time_limit + _lp_seconds(ctx.full):
                continue
            better = polish(task, ctx.kinds, ctx.full, everything, devices, device,
                            min(_left(ctx.deadline), 10.0))
            if better is not None and feasible(task, device, better):
                scored.append((step_cost(task, model, device, better), name, device, better))
        best = min(scored, key=lambda c: c[0])
        return best[1], best[2], best[3]

    def _whole(self, ctx: _Context, device: np.ndarray, rows: np.ndarray, bound: float
               ) -> tuple[str, tuple[np.ndarray, np.ndarray] | None, float]:
        """The whole task as one MILP, then its splits polished on the full curves."""
        task = ctx.task
        tables, devices = np.arange(task.num_tables), np.arange(task.num_devices)
        sub = device_subproblem(task, ctx.kinds, tables, devices, pins=ctx.pins)
        sol = milp_model.solve(sub, ctx.lines, warm=(device, to_memory(task, rows)), lower=bound,
                               mip_rel_gap=self.mip_rel_gap, time_limit=_left(ctx.deadline))
        if sol.device is None or sol.memory is None:
            return sol.status, None, sol.bound
        new_rows = fit_hbm(task, sol.device, to_rows(task, sol.memory))
        better = polish(task, ctx.kinds, ctx.full, tables, devices, sol.device,
                        max(_left(ctx.deadline), 2.0))
        if better is not None and feasible(task, sol.device, better) and step_cost(
                task, ctx.cost_model, sol.device, better) < step_cost(
                task, ctx.cost_model, sol.device, new_rows):
            new_rows = better
        return sol.status, (sol.device, new_rows), sol.bound

    def _search(self, ctx: _Context, device: np.ndarray, rows: np.ndarray, stall: float
                ) -> tuple[np.ndarray, np.ndarray]:
        """Large-neighbourhood search: re-solve the most loaded device with a few others (until
        it stalls: :func:`_stalled`)."""
        task = ctx.task
        rng = np.random.default_rng(self.seed)
        device, rows = device.copy(), rows.copy()
        loads = device_loads(task, ctx.cost_model, device, rows)
        group = min(self.group_devices, task.num_devices)
        if group < 2:
            return device, rows
        stale, patience = 0, max(3 * task.num_devices // group, 6)
        history = [(time.perf_counter(), float(loads.max()))]
        while _left(ctx.deadline) > 0.2 and stale < patience:
            if loads.max() - ctx.bound <= self.mip_rel_gap * loads.max():
                break
            if _stalled(history, stall):
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
            stale = 0 if self._improve(ctx, devs, device, rows, loads) else stale + 1
            history.append((time.perf_counter(), float(loads.max())))
        return device, rows

    def _improve(self, ctx: _Context, devs: np.ndarray, device: np.ndarray, rows: np.ndarray,
                 loads: np.ndarray) -> bool:
        """Re-solves the tables of ``devs``; updates the arrays in place if their max drops."""
        task = ctx.task
        tables = np.flatnonzero(np.isin(device, devs))
        if tables.size == 0:
            return False
        sub = device_subproblem(task, ctx.kinds, tables, devs, pins=ctx.pins)
        position = np.searchsorted(devs, device[tables])
        limit = min(_left(ctx.deadline), 5.0)
        sol = milp_model.solve(sub, ctx.lines, warm=(position, to_memory(task, rows[tables],
                                                                          tables)),
                               spread=1e-3, mip_rel_gap=self.mip_rel_gap, time_limit=limit)
        if sol.device is None or sol.memory is None:
            return False
        split = polish(task, ctx.kinds, ctx.full, tables, devs, sol.device,
                       min(_left(ctx.deadline), 5.0))
        new_device, new_rows = device.copy(), rows.copy()
        new_device[tables] = devs[sol.device]
        new_rows[tables] = split if split is not None else to_rows(task, sol.memory, tables)
        new_rows = fit_hbm(task, new_device, new_rows)
        if not feasible(task, new_device, new_rows):
            return False
        new_loads = device_loads(task, ctx.cost_model, new_device, new_rows)
        if new_loads[devs].max() >= loads[devs].max() * (1 - 1e-9):
            return False
        device[:], rows[:], loads[:] = new_device, new_rows, new_loads
        return True


@dataclass(frozen=True)
class _Found:
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


def _beats_whole(task: ShardingTask, cost_model: CostModel, g: ShardGeometry, cost: float,
                 deadline: float) -> bool:
    """Whether ``g`` is every table whole and ``cost`` is below what any such plan costs (the
    table-wise bound: exact for cost models linear in the HBM share between grid points, as
    :func:`lower_bound_ms` says), so that planning it cannot win; False when the bound is not
    priced by ``deadline``."""
    if not is_whole(task, g):
        return False
    try:
        return cost < lower_bound_ms(task, cost_model, whole_tables=True, deadline=deadline)
    except DeadlineReached:
        return False


def _tied(task: ShardingTask) -> np.ndarray | None:
    """For a task of shards planned for TorchRec's runtime (one HBM share per split table),
    each shard's table when it is split (-1 when whole); else None."""
    g = getattr(task, "geometry", None)
    if g is None or not for_torchrec(task) or not (g.parts > 1).any():
        return None
    return np.where(g.parts > 1, g.table, -1)


@dataclass(frozen=True)
class _Context:
    """What every stage of one solve shares."""

    task: ShardingTask
    cost_model: CostModel
    kinds: DeviceKinds
    lines: CostLines
    full: CostLines
    deadline: float
    bound: float
    pins: np.ndarray | None = None


def _stalled(history: list[tuple[float, float]], stall: float) -> bool:
    """True once the search has run :data:`MIN_SEARCH_S` and its last half lowered the step cost
    by less than ``stall`` of it (``history``: (instant, step cost) after each step)."""
    begun, now = history[0][0], time.perf_counter()
    if stall <= 0 or now - begun < MIN_SEARCH_S:
        return False
    halfway = begun + (now - begun) / 2
    before = next(cost for at, cost in reversed(history) if at <= halfway)
    return before - history[-1][1] < stall * history[-1][1]


def _lp_seconds(lines: CostLines) -> float:
    """Seconds to set up an LP over every table's ``lines`` (:data:`LP_LINES_PER_SECOND`)."""
    return float(lines.count.sum()) / LP_LINES_PER_SECOND


def _past(deadline: float) -> bool:
    return time.perf_counter() >= deadline


def _left(deadline: float) -> float:
    return max(deadline - time.perf_counter(), 0.01)


def recshard_bound(task: ShardingTask, cost_model: CostModel, time_limit: float = 0.0) -> float:
    """A lower bound on the step cost of every feasible plan that places tables whole, from
    RecShard's model (plans that split tables may cost less; :func:`lower_bound_ms` bounds
    those too).

    With ``time_limit`` 0: the LP relaxation (aggregated over identical devices, every hull line)
    and the dearest single table, cheap. With a positive ``time_limit``: the sharder runs that
    long and its proven bound (the MILP's dual bound where the task is one MILP) is returned.
    Valid for cost models linear in the HBM share between :data:`autoshard.access.GRID` points
    (the analytical model); approximate for others. Computed without the task's HBM
    reservation (:mod:`autoshard.memory`), so that it also bounds plans made without that room.
    """
    task = replace(task, overhead="none") if task.overhead != "none" else task
    if time_limit <= 0:
        kinds = device_kinds(task)
        full = cost_curves(task, cost_model, kinds).lines()
        relaxed = milp_model.solve(aggregated(task, kinds), full)
        return max(relaxed.bound if np.isfinite(relaxed.bound) else 0.0, single_bound(full))
    return RecShard(time_limit=time_limit, split=False).solve(task, cost_model).bound_ms
