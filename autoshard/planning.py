"""Planning from Python: a task, a sharder and a cost model in, a priced plan out.

:func:`plan` is the one sequence that the command line (``autoshard plan``), the comparison
harness (:func:`autoshard.compare.harness.run_one`) and TorchRec's planner interface
(:class:`autoshard.torchrec.autoshard_planner.AutoshardPlanner`) all run:

1. the sharder is made through the registry (its options checked,
   :func:`autoshard.sharders.get_sharder`), or given; the cost model is loaded, or given;
2. the sharder's run (:meth:`autoshard.sharders.base.Sharder.solve`) is timed with an injectable
   clock;
3. the plan's kinds are checked against the task's constraints, and the constraints enforced
   (:func:`autoshard.search.enforce.enforce`: HBM rows within each table's bounds); a plan
   already within them is kept as it is;
4. the plan is priced (:func:`autoshard.pricing.evaluator.evaluate`) with the sharder's proven
   lower bound, and the report's figures checked finite.

The result is a :class:`Planned` value.

A re-plan is the same sequence given the plan in use (``previous``) and a move budget
(:class:`autoshard.replan.budget.MoveBudget`): the plan in use is first carried onto the task
(:func:`autoshard.replan.carry.carry`: the re-plan that moves nothing it need not); a sharder that
plans within a budget (:class:`autoshard.sharders.base.MoveAware`) is given it, any other's plan
is brought within it table by table (:func:`autoshard.replan.repair.within_budget`), after the
constraints; the carried plan wins where it costs no more (with priced moves: step cost plus
price); and the move is priced (:attr:`Planned.moves`, :func:`autoshard.replan.diff.move_report`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autoshard.errors import InputError, PlannerError
from autoshard.layout.plan import Plan
from autoshard.layout.plan_context import PlanContext
from autoshard.layout.shards import plan_layout
from autoshard.limits import check_finite_costs
from autoshard.pricing.cost import CostModel, load_cost_model
from autoshard.pricing.evaluator import CostReport, evaluate
from autoshard.replan.budget import MoveBudget, Moves
from autoshard.replan.carry import carry
from autoshard.replan.diff import MoveReport, move_report
from autoshard.replan.repair import MoveGuard, within_budget
from autoshard.search.enforce import enforce
from autoshard.sharders import get_sharder
from autoshard.sharders.base import MoveAware, Sharded, Sharder, SolverRecord
from autoshard.task import ShardingTask

#: The report's figures that must be finite for a plan to be returned.
FIGURES = ("step_cost_ms", "lower_bound_ms", "cost_ratio", "load_balance", "uvm_lookup_share")


@dataclass(frozen=True)
class Planned:
    """A task planned and priced.

    Args:
        plan: The plan, within the task's constraints, with its context when one was given
            (its provenance says how the sharder found it).
        task: The task planned.
        report: The plan's cost report under the cost model.
        bound_ms: The lower bound the sharder proved, ms (None: it proved none).
        notes: What the sharder's time limit cut, one line each.
        seconds: Wall time of the sharder's run, s (by the clock :func:`plan` was given).
        details: The sharder's own record of the run
            (:attr:`autoshard.sharders.base.Sharded.details`; None for sharders without one).
        moves: In a re-plan, its move from the plan in use, priced (None otherwise).
    """

    plan: Plan
    task: ShardingTask
    report: CostReport
    bound_ms: float | None
    notes: tuple[str, ...]
    seconds: float
    details: Any = None
    moves: MoveReport | None = None

    @property
    def solver(self) -> dict[str, object] | None:
        """The solver's figures (status, bound, gap, timings) where the sharder's record
        reports them (:class:`autoshard.sharders.base.SolverRecord`: ``recshard``'s), else
        None."""
        return self.details.report() if isinstance(self.details, SolverRecord) else None


def plan(task: ShardingTask, sharder: str | Sharder,
         cost_model: str | Path | CostModel = "analytical", *, bound_ms: float | None = None,
         own_bound: bool = True, context: PlanContext | None = None,
         clock: Callable[[], float] | None = None, previous: Plan | None = None,
         move_budget: MoveBudget | None = None, **options: Any) -> Planned:
    """Plans ``task`` with ``sharder`` under ``cost_model`` and prices the plan (the module
    docstring gives the steps).

    Args:
        task: The task.
        sharder: A registry name (``autoshard sharders`` lists them) or a sharder.
        cost_model: ``analytical``, ``torchrec``, a learned model's folder, or a cost model.
        bound_ms: A lower bound known from elsewhere, ms; the report's bound is the largest of
            it, the task's own and (with ``own_bound``) the sharder's.
        own_bound: Whether the report's bound includes the one the sharder proved (it stays in
            :attr:`Planned.bound_ms` either way). A comparison leaves it out, so that every
            sharder's cost is divided by the same bound.
        context: The context the plan records (where its tables, hardware and cost model come
            from: :class:`autoshard.layout.plan_context.PlanContext`), if any.
        clock: Seconds, for :attr:`Planned.seconds` (default ``time.perf_counter``).
        previous: The plan in use: re-plan from it (module docstring), on the hardware and for
            the tables its context records (else the task's, with the same tables).
        move_budget: How much the re-plan may move (default: no limit); only with
            ``previous``.
        **options: The sharder's options (its constructor's keyword arguments), checked
            strictly; only with a registry name.

    Raises:
        InputError: An unknown sharder, option or cost model, or options given with a sharder
            already made.
        PlannerError: The sharder cannot run here or found no plan, the plan breaks the task's
            constraints beyond repair or its capacities, or a figure of its report is not
            finite.
    """
    model = (load_cost_model(str(cost_model)) if isinstance(cost_model, (str, Path))
             else cost_model)
    if move_budget is not None and previous is None:
        raise InputError("a move budget needs the plan in use (previous=)",
                         field="move_budget", value=move_budget.describe())
    chosen = _sharder(sharder, options)
    moves = None if previous is None else carry(previous, task, model,
                                                move_budget or MoveBudget())
    clock = clock or time.perf_counter
    start = clock()
    sharded: Sharded[object] = (chosen.solve_within(task, model, moves)
                                if moves is not None and isinstance(chosen, MoveAware)
                                else chosen.solve(task, model))
    seconds = clock() - start
    found = _within_constraints(sharded.plan, task, model, chosen.name)
    moved = None
    if moves is not None:
        found, moved = _within_budget(found, moves, model, sharded)
    if context is not None:
        found = replace(found, context=context)
    known = [b for b in (bound_ms, sharded.bound_ms if own_bound else None) if b is not None]
    report = evaluate(found, task, model, bound_ms=max(known) if known else None)
    check_finite_costs({f: getattr(report, f) for f in FIGURES}, f"{chosen.name}'s plan")
    return Planned(found, task, report, sharded.bound_ms, sharded.notes, seconds,
                   sharded.details, moved)


def _within_budget(found: Plan, moves: Moves, model: CostModel, sharded: Sharded[object]
                   ) -> tuple[Plan, MoveReport]:
    """``found`` within the re-plan's budget (repaired where the sharder did not keep it), or
    the carried plan where that costs no more; and the move priced."""
    task = moves.task
    layout = plan_layout(found, task)
    notes = []
    if not moves.allows(layout):
        layout = within_budget(moves, layout, model)
        notes.append("the sharder's plan exceeded the budget: tables put back as carried")
    guard = MoveGuard(moves, model)
    if guard.cost(moves.carried) <= guard.cost(layout):
        layout = moves.carried
        notes.append("the plan in use, carried, costs no more: nothing else moves")
    bound = getattr(sharded.details, "budget_bound_ms", None)
    report = move_report(moves, layout, model, bound, tuple(notes))
    return (replace(layout.to_plan(task, found.sharder), provenance=found.provenance),
            report)


def _sharder(sharder: str | Sharder, options: dict[str, Any]) -> Sharder:
    """The sharder named (made with ``options``), or the one given (with none)."""
    if isinstance(sharder, str):
        return get_sharder(sharder, **options)
    if options:
        raise InputError("options go to a sharder named by its registry name, not to one "
                         "already made", field="options", value=sorted(options))
    return sharder


def _within_constraints(found: Plan, task: ShardingTask, model: CostModel, name: str) -> Plan:
    """``found`` with the task's constraints enforced (the same plan where it keeps them).

    Raises:
        PlannerError: A table placed whole that its constraints allow only split (which
            sharders split is said), or constraints that cannot be kept.
    """
    _check_kinds(found, task, name)
    layout = plan_layout(found, task)
    enforced = enforce(task, layout, model)
    if enforced is layout:
        return found
    return replace(found, placements=enforced.to_plan(task, found.sharder).placements)


def _check_kinds(found: Plan, task: ShardingTask, sharder: str) -> None:
    """Fails, saying which sharders split, when the sharder placed whole a table that its
    constraints do not allow whole."""
    for p in found.placements:
        if not p.is_split and task.constraints.must_split(p.table):
            kinds = task.constraints.of(p.table).kinds or ()
            raise PlannerError("constraint", f"sharder '{sharder}' placed table '{p.table}' "
                               f"whole, but its constraints allow only "
                               f"{', '.join(sorted(k.value for k in kinds))}: plan with a "
                               "sharder that splits tables (recshard, the default, does)")
