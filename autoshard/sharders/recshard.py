"""RecShard-style statistical MILP sharder: devices and HBM/UVM row splits chosen jointly.

Each table goes to one device and keeps its hottest rows in HBM, the rest in host memory (UVM).
Its cost as a function of its HBM bytes comes from the cost model at the points where its access
curve bends (:mod:`autoshard.pricing.curves`); rows never touched cost nothing wherever
they live, and pooling factor and coverage scale its lookups. The MILP
(:mod:`autoshard.milp.model`) minimises the step cost (max over devices) under HBM and
host capacities. One solve:

1. the aggregated LP relaxation (one "device" per kind of identical devices, every line under
   every cost curve): a lower bound valid for every plan, and row splits to aim at;
2. warm starts: the greedy family and a packing of the LP's splits, each with its splits
   re-optimised for its devices by an LP; on tasks over ``max_pairs`` the one that water-fills
   cheapest also through the search stage's polish (:data:`autoshard.sharders.
   recshard_tables.SEARCH_START_SHARE`); the cheapest is kept, and nothing worse is returned;
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
(:func:`autoshard.layout.splitting.split_heavy_tables`), their shards placed by the solve above as
if they were tables (with their own HBM rows), for each choice in :data:`SPLIT_TARGETS` while time
is left and the gap is open, then every table whole unless a split plan already costs less than
the table-wise bound; the cheapest plan is kept. On tasks too large for the whole MILP only the
first split choice is tried, its search capped (``split_search_cap``), so that splitting
plans within a small multiple of a table-wise solve's time. Its bound is then the spread-work
bound, valid for every plan, split or not (the table-wise bounds above are not).

The bounds are proven for cost models linear in the HBM share between the access curve's grid
points (the analytical model); under others (a learned model, TorchRec's estimator,
:mod:`autoshard.torchrec.cost`) they are the same relaxation's figures, approximate. With
``also_for`` a second model is planned for too (:mod:`autoshard.sharders.recshard_blend`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import ClassVar

import numpy as np

from autoshard.errors import DeadlineReached, InputError, PlannerError
from autoshard.layout.plan import Plan
from autoshard.layout.shards import (
    ShardGeometry,
    ShardLayout,
    is_whole,
    pricing_task,
    same_split,
    split_pins,
    whole_tables,
)
from autoshard.layout.splitting import replicate_tables, split_heavy_tables
from autoshard.limits import MAX_DEVICES, MAX_TABLES, SEED, TIME_LIMIT_S, Range
from autoshard.milp import model as milp_model
from autoshard.milp.plans import aggregated, single_bound, step_cost
from autoshard.pricing.bounds import Relaxation, lower_bound_ms, relax
from autoshard.pricing.cost import CostModel, is_model_spec
from autoshard.pricing.curves import cost_curves, device_kinds
from autoshard.provenance import Provenance
from autoshard.replan.budget import Moves
from autoshard.reservation import NO_RESERVATION
from autoshard.search.lns import GROUP_DEVICES, MAX_PAIRS, MIP_REL_GAP
from autoshard.sharders.base import Sharded, Sharder
from autoshard.sharders.recshard_blend import solve_both
from autoshard.sharders.recshard_tables import (
    DEADLINE_STATUS,
    MIN_SEARCH_S,
    Found,
    RecShardResult,
    SolveSettings,
    left,
    solve_tables,
)
from autoshard.task import ShardingTask

__all__ = ["DEADLINE_STATUS", "MIN_SEARCH_S", "NO_SPLIT_STATUS", "RecShard", "RecShardResult",
           "recshard_bound"]

#: Split choices tried in turn (the cheapest plan is kept), as (share of the spread-work bound
#: above which tables are split, whether that target is raised to what the dearest table can
#: reach, :func:`autoshard.layout.splitting.split_heavy_tables`): first the reachable target (under
#: the analytical model nearly always the same choice as the next), then only the tables that
#: alone exceed the per-device mean, then finer. Identical choices are solved once.
SPLIT_TARGETS = ((1.0, True), (1.0, False), (0.5, False))

#: Share of the time limit by which the split choice (the spread-work relaxation and the
#: pricing of candidate splits) must be made; past it, tables stay whole.
SPLIT_SETUP_SHARE = 0.3
#: On tasks too large for the whole MILP, a split choice's search runs at most this many times
#: as long as its solve's set-up (cost curves, relaxation, warm starts) took (at least
#: :data:`MIN_SEARCH_S`): a table-wise solve of a task held up by one table is little more
#: than that set-up, and splitting then plans within 3x of it.
SPLIT_SEARCH_OVER_SETUP = 1.0
#: Split choices tried on such tasks (the first ones of :data:`SPLIT_TARGETS`).
LARGE_TASK_CHOICES = 1

#: Share of the time limit the search stage gets when ``polish`` is on (the solve the rest).
POLISH_SHARE_OF_LIMIT = 0.1

#: In a re-plan, the share of the time limit the carried plan's splits get (the other split
#: choices share the rest).
CARRIED_SHARE = 0.4

#: Status suffix when there was no time to choose splits.
NO_SPLIT_STATUS = "deadline: splits not chosen in time, tables whole"


class RecShard(Sharder):
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
            estimator, :mod:`autoshard.torchrec.cost`; ``analytical``; or a learned model's
            folder): the plan is chosen to be good under both
            (:mod:`autoshard.sharders.recshard_blend`). The cost and bound reported stay the
            first model's. It is loaded when the sharder is made (TorchRec's import takes
            seconds), so that ``time_limit`` covers the planning.
        split_search_cap: On tasks too large for the whole MILP (over ``max_pairs``), only
            the first split choice is tried and its search runs at most this many times as
            long as its solve's set-up (:data:`SPLIT_SEARCH_OVER_SETUP`), so that splitting
            plans within about 3x a table-wise solve's time; None: every split choice, each
            search until it stalls (slower, at times a cheaper plan).
        polish: Run the search stage after the solve (:mod:`autoshard.search.stage`: HBM
            water-filled per device, moves, re-splits of the heaviest tables and kicks), in the
            last :data:`POLISH_SHARE_OF_LIMIT` of the time limit; the plan's provenance says
            what each step took off.
        replicate: With ``split``, also offer each split choice with the light tables whose
            replicas pay replicated on every device (``data_parallel``:
            :func:`autoshard.layout.splitting.replicate_tables`), solved before it; the bound then
            holds for replicated plans too. False: no table replicated.
    """

    name: ClassVar[str] = "recshard"
    summary: ClassVar[str] = "MILP over devices and HBM/UVM row splits (HiGHS), greedy warm start"
    option_ranges: ClassVar[dict[str, Range]] = {
        "time_limit": TIME_LIMIT_S, "mip_rel_gap": Range(0, 1), "stall": Range(0, 1),
        "max_lines": Range(2, 10_000, integer=True),
        "max_pairs": Range(1, MAX_TABLES * MAX_DEVICES, integer=True),
        "group_devices": Range(2, MAX_DEVICES, integer=True), "seed": SEED,
        "split_search_cap": Range(0, 1000, open_low=True)}

    def __init__(self, time_limit: float = 60.0, mip_rel_gap: float = MIP_REL_GAP,
                 max_lines: int | None = None, max_pairs: int = MAX_PAIRS,
                 group_devices: int = GROUP_DEVICES,
                 seed: int = 0, split: bool = True, stall: float = 5e-3,
                 node_splits: bool = True, also_for: str | None = None,
                 split_search_cap: float | None = SPLIT_SEARCH_OVER_SETUP,
                 polish: bool = False, replicate: bool = True) -> None:
        if also_for is not None and not is_model_spec(also_for):
            raise InputError("must be 'analytical', 'torchrec' or a learned cost model's "
                             "folder", source="sharder options", field="recshard.also_for",
                             value=also_for)
        self.also_for = also_for
        # Loaded when the sharder is made (importing TorchRec takes seconds), as the torchrec
        # sharder imports TorchRec, so that the time limit covers the planning alone.
        self._second: CostModel | None = None
        if also_for is not None:
            from autoshard.pricing.cost import load_cost_model

            self._second = load_cost_model(also_for)
        self.polish = polish
        self.replicate = replicate
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

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            import highspy  # noqa: F401
        except ImportError:
            return "needs the HiGHS solver: pip install highspy"
        return None

    def solve(self, task: ShardingTask, cost_model: CostModel) -> Sharded[RecShardResult]:
        """Plans the task: the plan with its proven bound, and the solve's record (cost,
        bound, gap, status, timings: :class:`RecShardResult`) as its details."""
        result = self._record(task, cost_model)
        return Sharded(result.plan, result, bound_ms=result.bound_ms)

    def solve_within(self, task: ShardingTask, cost_model: CostModel, moves: Moves
                     ) -> Sharded[RecShardResult]:
        """Re-plans ``task`` within ``moves`` (:class:`autoshard.replan.budget.Moves`): the
        solve of :func:`~autoshard.sharders.recshard_tables.solve_tables` with the MILP's move
        term, from the carried plan, over its splits (:data:`CARRIED_SHARE` of the time) and,
        unless the rules keep them, each split choice a fresh plan tries
        (:data:`SPLIT_TARGETS`, with replicas) in the time left; the plan that costs least
        (with its moves' price where they are priced) within the budget. The record's
        ``budget_bound_ms`` bounds the plans within the budget that keep the carried splits
        (where moves are not priced); the bound returned is the spread-work bound, valid for
        every plan, where it was priced in time."""
        start = time.perf_counter()
        deadline = start + self.time_limit
        choices, bound = [moves.carried.geometry], 0.0
        if self.split and not moves.rules.keep_splits:
            try:
                split, bound = self._choices(task, cost_model, start)
                choices += [g for g in split if not same_split(g, choices[0])]
            except DeadlineReached:
                pass
        best: tuple[float, ShardLayout, Found] | None = None
        for i, g in enumerate(choices):
            if i and left(deadline) < 0.05 * self.time_limit:
                break
            # The carried splits first, with most of the time; then each split choice a fresh
            # plan would try, in turn, with an equal share of what is left.
            share = CARRIED_SHARE if i == 0 and len(choices) > 1 else 1.0 / (len(choices) - i)
            solved = self._within(task, cost_model, moves, g,
                                  time.perf_counter() + share * left(deadline))
            if solved is None:
                continue
            score = solved[1].cost + moves.price_ms(solved[0])
            if best is None or score < best[0]:
                best = (score, *solved)
        if best is None:  # no choice planned in time: the carried plan
            raise PlannerError("deadline", "no plan within the move budget in time")
        _, layout, found = best
        result = self._result(layout.to_plan(task, self.name), found, bound, start)
        if moves.horizon is None and same_split(layout.geometry, choices[0]):
            result = replace(result, budget_bound_ms=min(found.bound, found.cost))
        return Sharded(result.plan, result, bound_ms=bound or None)

    def _within(self, task: ShardingTask, cost_model: CostModel, moves: Moves,
                g: ShardGeometry, deadline: float) -> tuple[ShardLayout, Found] | None:
        """One split choice solved within ``moves`` by ``deadline``: its layout (one HBM share
        per split table where that stays within the budget) and its solve; None where it
        found no plan within the budget."""
        sub = pricing_task(task, g)
        pins = split_pins(task, g)
        kept = moves.pins(g)
        if kept is not None:
            pins = kept if pins is None else np.where(kept >= 0, kept, pins)
        try:
            found = self._solve_tables(sub, cost_model, deadline, pins, moves=moves)
        except PlannerError:
            return None
        layout = ShardLayout(g, found.device, found.rows)
        even = layout.even_shares(task)
        if not np.array_equal(even.hbm_rows, layout.hbm_rows) and moves.allows(even):
            layout = even
            found = replace(found, rows=even.hbm_rows, cost=step_cost(
                sub, cost_model, even.device, even.hbm_rows))
        return (layout, found) if moves.allows(layout) else None

    def _record(self, task: ShardingTask, cost_model: CostModel) -> RecShardResult:
        """The solve of :meth:`solve`, as its record."""
        start = time.perf_counter()
        limit = self.time_limit * (1.0 - POLISH_SHARE_OF_LIMIT if self.polish else 1.0)
        solver = self._with_limit(limit)
        if self._second is not None:
            result = solve_both(solver._with_limit, task, (cost_model, self._second), limit,
                                self.name)
        else:
            result = solver._solve(task, cost_model)
        if not self.polish:
            return result
        return self._searched(result, task, cost_model, start)

    def _with_limit(self, time_limit: float) -> RecShard:
        """A copy with another time limit, planning for its cost model alone, no search
        stage."""
        out = copy.copy(self)
        out.time_limit, out.also_for, out._second, out.polish = time_limit, None, None, False
        return out

    def _searched(self, result: RecShardResult, task: ShardingTask, cost_model: CostModel,
                  start: float) -> RecShardResult:
        """``result`` after the search stage, its plan's provenance saying what each step
        took off."""
        from autoshard.search.stage import search

        large = task.num_tables * task.num_devices > self.max_pairs
        found = search(result.plan, task, cost_model, result.step_cost_ms, large=large,
                       seed=self.seed)
        record = Provenance(self.name, "milp", result.step_cost_ms, found.steps,
                            ((self.name, result.step_cost_ms),))
        cost, bound = found.cost_ms, min(result.bound_ms, found.cost_ms)
        seconds = time.perf_counter() - start
        return replace(result, plan=replace(found.plan, sharder=self.name, provenance=record),
                       step_cost_ms=cost, bound_ms=bound,
                       gap=(cost - bound) / cost if cost > 0 else 0.0, seconds=seconds,
                       found_s=seconds if found.steps else result.found_s)

    def _solve(self, task: ShardingTask, cost_model: CostModel) -> RecShardResult:
        """The solve of the module docstring (one cost model, no search stage)."""
        start = time.perf_counter()
        deadline = start + self.time_limit
        if not self.split:
            found = self._solve_tables(task, cost_model, deadline)
            return self._result(Plan.from_arrays(task, found.device, found.rows, self.name),
                                found, found.bound, start)
        try:
            choices, bound = self._choices(task, cost_model, start)
        except DeadlineReached:  # no time to choose splits: tables whole, no bound proven
            found = self._solve_tables(task, cost_model, deadline)
            found = replace(found, status=f"{found.status}; {NO_SPLIT_STATUS}")
            return self._result(Plan.from_arrays(task, found.device, found.rows, self.name),
                                found, 0.0, start)
        layout, found = self._best_split(task, cost_model, choices, bound, deadline)
        return self._result(layout.to_plan(task, self.name), found,
                            max(bound, self._reserved_bound(task, cost_model, deadline)), start)

    def _choices(self, task: ShardingTask, cost_model: CostModel, start: float
                 ) -> tuple[list[ShardGeometry], float]:
        """The split choices to solve, every table whole last, and the spread-work bound
        (valid for every plan, split tables included; the table-wise bounds are not).

        Raises:
            DeadlineReached: No time left to choose splits.
        """
        relaxed = relax(task, cost_model, deadline=start + SPLIT_SETUP_SHARE * self.time_limit,
                        replicas=self.replicate)
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
        may_stay_whole = not any(task.constraints.must_split(t.name) for t in task.tables)
        if may_stay_whole and not any(same_split(whole, h) for h in choices):
            choices.append(whole)
        if self.replicate:
            choices = _with_replicas(task, cost_model, choices)
            choices[2:2] = self._plain_choice(task, cost_model, choices,
                                              start + SPLIT_SETUP_SHARE * self.time_limit)
        return choices, bound

    def _plain_choice(self, task: ShardingTask, cost_model: CostModel,
                      choices: list[ShardGeometry], deadline: float) -> list[ShardGeometry]:
        """The first split choice as made with no table replicated, where it is not among
        ``choices`` (none past ``deadline``). Replicas change the relaxation and so the split
        targets; where the MILP's replicated plan then costs more than the relaxation said
        (under TorchRec's estimator, say), this choice keeps the plan that planning without
        replicas finds within reach."""
        try:
            plain = relax(task, cost_model, deadline=deadline, replicas=False)
            g = self._split_choices(task, cost_model, plain,
                                    float(plain.cost_ms.sum()) / task.num_devices, deadline,
                                    self.node_splits)[0]
        except DeadlineReached:
            return []
        return [] if any(same_split(g, h) for h in choices) else [g]

    def _best_split(self, task: ShardingTask, cost_model: CostModel,
                    choices: list[ShardGeometry], bound: float, deadline: float
                    ) -> tuple[ShardLayout, Found]:
        """Each split choice solved in turn while time is left and the gap open (one whose
        shards' bound is no lower than the best plan's cost skipped); the cheapest layout and
        its solve."""
        best: tuple[ShardLayout, Found] | None = None
        first = self.time_limit
        for i, g in enumerate(choices):
            if best is not None and (left(deadline) < 0.1 * self.time_limit
                                     or best[1].cost - bound <= self.mip_rel_gap * best[1].cost
                                     or _beats_whole(task, cost_model, g, best[1].cost,
                                                     deadline)):
                break
            more = i < len(choices) - 1
            sub = pricing_task(task, g)
            if best is not None and _cannot_beat(sub, cost_model, best[1].cost, deadline):
                continue
            began = time.perf_counter()
            # A finer split gets no more time than the first solve took (at least a tenth of
            # the limit), so that splitting costs a bounded multiple of a table-wise solve.
            stop = began + min(left(deadline) * (0.6 if more else 1.0), first)
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
        return best

    def _reserved_bound(self, task: ShardingTask, cost_model: CostModel, deadline: float
                        ) -> float:
        """The spread-work bound counting the task's reservation (valid for every plan of the
        task as posed, tighter than the weights-only one it splits by), while time allows;
        0 for a task that reserves nothing."""
        if not task.reservation.keeps_room:
            return 0.0
        try:
            return lower_bound_ms(task, cost_model, reserved=True,
                                  deadline=max(deadline, time.perf_counter() + 1.0),
                                  replicas=self.replicate)
        except DeadlineReached:
            return 0.0

    @property
    def settings(self) -> SolveSettings:
        """The options a placement solve reads."""
        return SolveSettings(self.time_limit, self.mip_rel_gap, self.max_lines, self.max_pairs,
                             self.group_devices, self.seed, self.stall)

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

    def _result(self, plan: Plan, found: Found, bound: float, start: float) -> RecShardResult:
        cost = found.cost
        bound = min(bound, cost)
        return RecShardResult(plan, cost, bound, (cost - bound) / cost if cost > 0 else 0.0,
                              time.perf_counter() - start, found.method, found.status,
                              found.warm_start, found.warm_cost,
                              max(found.found_at - start, 0.0))

    def _solve_tables(self, task: ShardingTask, cost_model: CostModel, deadline: float,
                      pins: np.ndarray | None = None, search_cap: float | None = None,
                      moves: Moves | None = None) -> Found:
        """One placement solve (:func:`autoshard.sharders.recshard_tables.solve_tables`)."""
        return solve_tables(self.settings, task, cost_model, deadline, pins, search_cap, moves)



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


def _cannot_beat(sub: ShardingTask, cost_model: CostModel, cost: float, deadline: float
                 ) -> bool:
    """Whether every plan of the shards of ``sub`` (a split choice's pricing task) costs at
    least ``cost`` (its spread-work bound, the reservation counted: :func:`lower_bound_ms`),
    so that solving it cannot win; False when the bound is not priced by ``deadline``."""
    try:
        return lower_bound_ms(sub, cost_model, reserved=True, deadline=deadline) >= cost
    except DeadlineReached:
        return False


def recshard_bound(task: ShardingTask, cost_model: CostModel, time_limit: float = 0.0) -> float:
    """A lower bound on the step cost of every feasible plan that places tables whole, from
    RecShard's model (plans that split tables may cost less; :func:`lower_bound_ms` bounds
    those too).

    With ``time_limit`` 0: the LP relaxation (aggregated over identical devices, every hull line)
    and the dearest single table, cheap. With a positive ``time_limit``: the sharder runs that
    long and its proven bound (the MILP's dual bound where the task is one MILP) is returned.
    Valid for cost models linear in the HBM share between :data:`autoshard.access.GRID` points
    (the analytical model); approximate for others. Computed without the task's HBM
    reservation (:mod:`autoshard.reservation`), so that it also bounds plans made without that
    room.
    """
    task = task.with_reservation(NO_RESERVATION)
    if time_limit <= 0:
        kinds = device_kinds(task)
        full = cost_curves(task, cost_model, kinds).lines()
        relaxed = milp_model.solve(aggregated(task, kinds), full)
        return max(relaxed.bound if np.isfinite(relaxed.bound) else 0.0, single_bound(full))
    return RecShard(time_limit=time_limit, split=False).solve(task, cost_model).details.bound_ms


def _with_replicas(task: ShardingTask, cost_model: CostModel, choices: list[ShardGeometry]
                   ) -> list[ShardGeometry]:
    """Each choice preceded by itself with the tables whose replicas pay replicated
    (:func:`autoshard.layout.splitting.replicate_tables`), where that differs."""
    out: list[ShardGeometry] = []
    for g in choices:
        replicated = replicate_tables(task, cost_model, g)
        if not same_split(replicated, g) and not any(same_split(replicated, h) for h in out):
            out.append(replicated)
        out.append(g)
    return out
