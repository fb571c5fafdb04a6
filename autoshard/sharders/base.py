"""The sharder interface, and the value a sharder's run returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from autoshard.layout.plan import Plan
from autoshard.pricing.cost import CostModel
from autoshard.replan.budget import Moves
from autoshard.task import ShardingTask

#: The type of a sharder's own record of a run (None for sharders that keep none).
D = TypeVar("D", covariant=True)


@dataclass(frozen=True)
class Sharded(Generic[D]):
    """What one run of a sharder returns.

    Args:
        plan: The plan.
        details: The sharder's own frozen record of the run: ``recshard``'s
            :class:`~autoshard.sharders.recshard_tables.RecShardResult` (status, proven bound,
            gap, timings), ``ppo``'s :class:`~autoshard.sharders.ppo.sharder.Choice` (which
            candidate won, every candidate's cost), ``torchrec``'s
            :class:`~autoshard.torchrec.sharder.TorchRecRun` (TorchRec's own ShardingPlan, the
            starting cache load factor, TorchRec's rating); None for the sharders that keep
            none.
        bound_ms: A lower bound on the step cost of every plan of the task that the sharder
            proved, ms (None: it proved none); pass it to
            :func:`autoshard.pricing.evaluator.evaluate`.
        notes: What the run's time limit cut, one line each.
    """

    plan: Plan
    details: D
    bound_ms: float | None = None
    notes: tuple[str, ...] = ()


@runtime_checkable
class SolverRecord(Protocol):
    """A sharder's record that reports a solver's figures (``recshard``'s does)."""

    def report(self) -> dict[str, object]:
        """The solve's figures (status, bound, gap, timings), JSON-ready."""
        ...


class Sharder(Protocol):
    """Turns a task into a plan, pricing through the given cost model.

    Every sharder subclasses this interface and defines :meth:`solve`; :meth:`shard` is the
    plan alone. Implementations also define ``summary`` (one line for listings) and a
    classmethod ``unavailable() -> str | None`` returning why the sharder cannot run here
    (None if it can). A sharder that plans within a re-plan's move budget also answers
    :class:`MoveAware`; :func:`autoshard.planning.plan` brings any other's plan within it
    (:mod:`autoshard.replan.repair`).
    """

    name: ClassVar[str]
    summary: ClassVar[str]

    def solve(self, task: ShardingTask, cost_model: CostModel) -> Sharded[object]:
        """Plans ``task``: the plan with the sharder's bound, notes and own record."""
        ...

    def shard(self, task: ShardingTask, cost_model: CostModel) -> Plan:
        """The plan of :meth:`solve` alone."""
        return self.solve(task, cost_model).plan


@runtime_checkable
class MoveAware(Protocol):
    """A sharder that re-plans within a move budget itself (``recshard``: the MILP's move term;
    ``ppo``: its candidates and search stage within the budget)."""

    def solve_within(self, task: ShardingTask, cost_model: CostModel, moves: Moves
                     ) -> Sharded[object]:
        """Plans ``task`` copying within ``moves``' limit and rules from the plan in use."""
        ...
