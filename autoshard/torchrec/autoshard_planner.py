"""autoshard's planning behind TorchRec's planner interface: a drop-in for
``EmbeddingShardingPlanner``.

``AutoshardPlanner(topology, constraints=...).collective_plan(model, sharders, pg)`` returns a
``ShardingPlan`` ready for ``DistributedModelParallel``, as TorchRec's planner does. In between
it plans with autoshard:

1. the model's tables are read from its ``EmbeddingBagCollection`` and ``EmbeddingCollection``
   modules, nested anywhere (:mod:`autoshard.torchrec.model_tables`), with statistics;
2. the topology becomes our hardware profile (:mod:`autoshard.torchrec.topology`), the
   per-rank batch our global one, the pipeline TorchRec's HBM reservation
   (:mod:`autoshard.torchrec.runtime_memory`), each table's ``ParameterConstraints`` our
   constraints (:mod:`autoshard.torchrec.parameter_constraints`);
3. a sharder from the registry plans the task under the cost model (:func:`autoshard.planning.
   plan`, which also brings its HBM rows within the constraints and prices the plan);
4. the plan becomes TorchRec's ``ParameterSharding`` objects keyed by each collection's module
   path (:func:`autoshard.torchrec.export.sharding_plan`), checked with TorchRec's own
   validation.

A short report goes to the ``autoshard.torchrec.autoshard_planner`` logger at INFO: the sharder and
how it stopped, the step cost and lower bound under our cost model, the HBM reserved per rank, and
TorchRec's own estimate of the plan beside ours. The planning's result is ``result``
(:class:`autoshard.planning.Planned`): ``result.plan`` is the plan in our terms, with its context
(tables recorded inline); ``result.plan.save("plan.json")`` and ``autoshard evaluate plan.json``
price it again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from autoshard import planning
from autoshard.errors import InputError, PlannerError, gib
from autoshard.layout.constraints import Constraints
from autoshard.layout.plan import Plan
from autoshard.layout.plan_context import PlanContext
from autoshard.limits import MAX_BATCH_SIZE, TIME_LIMIT_S, int_in
from autoshard.pricing.cost import is_model_spec, model_identity
from autoshard.replan.budget import MoveBudget
from autoshard.sharders import check_sharder_options, common_options
from autoshard.task import ShardingTask, Workload
from autoshard.torchrec.export import sharding_plan
from autoshard.torchrec.model_tables import (
    Statistics,
    find_collections,
    our_tables,
    output_notes,
    read_statistics,
    tables_of,
)
from autoshard.torchrec.parameter_constraints import Allowed, allowed, pooling_factors
from autoshard.torchrec.reshard import previous_plan, torchrec_budget
from autoshard.torchrec.runtime_memory import TORCHREC, TORCHREC_PREFETCH, check_pipeline
from autoshard.torchrec.shardings import table_shardings
from autoshard.torchrec.topology import topology_hardware

_log = logging.getLogger(__name__)
#: The seed the sharders that draw at random are given (the CLI's default).
SEED = 0


class AutoshardPlanner:
    """TorchRec's planner interface (``plan``, ``collective_plan``), planned by autoshard.

    Args:
        topology: TorchRec's ``Topology`` (None: the process group's, as TorchRec builds it).
        batch_size: Samples per rank per step, as TorchRec's planner takes it (None: its
            default, ``BATCH_SIZE``, 512); our workload's batch is this times the world size.
        constraints: TorchRec ``ParameterConstraints`` by table name
            (:mod:`autoshard.torchrec.parameter_constraints` says how each field is honoured).
        sharder: The autoshard sharder to plan with (``autoshard sharders`` lists them).
        sharder_options: Options for it (as ``--opt``); ``seed`` and ``time_limit`` are given
            to the sharders that take them unless set here.
        stats: Table statistics: an autoshard table file or tables, matched by table or feature
            name (:mod:`autoshard.torchrec.model_tables`).
        cost_model: ``analytical``, ``torchrec`` or a learned model's folder.
        pipeline: TorchRec's training pipeline the plan is for, ``"none"`` (its default) or
            ``"prefetch"``; it decides the HBM reserved per table (None: ``"none"``).
        time_limit: Seconds the sharder may plan for.
        previous: The plan the model runs with (its ``ShardingPlan``, an autoshard plan, or
            a plan file): re-plan from it, moving only what ``move_budget`` allows and what
            TorchRec's reshard can move (:func:`autoshard.torchrec.reshard.torchrec_budget`);
            :func:`autoshard.torchrec.reshard.reshard_to` then moves the model in place.
        move_budget: How much the re-plan may move (:class:`autoshard.replan.budget.
            MoveBudget`; default: no limit); only with ``previous``.

    Attributes:
        result: What :meth:`plan` planned (on rank 0 of :meth:`collective_plan`; None before,
            or when the model has no table to plan): the plan in our terms with its context,
            the task planned, its cost report and the sharder's record
            (:class:`autoshard.planning.Planned`). :meth:`plan` returns TorchRec's
            ``ShardingPlan``, as TorchRec's planner interface has it; ``DistributedModelParallel``
            calls :meth:`collective_plan` itself, so the result is kept here.
    """

    def __init__(self, topology: Any = None, batch_size: int | None = None,
                 constraints: Mapping[str, Any] | None = None, *, sharder: str = "recshard",
                 sharder_options: Mapping[str, Any] | None = None,
                 stats: Statistics | None = None, cost_model: str = "analytical",
                 pipeline: str | None = None, time_limit: float = 60.0,
                 previous: Any = None, move_budget: MoveBudget | None = None) -> None:
        from torchrec.distributed.types import ShardingPlanner

        ShardingPlanner.register(AutoshardPlanner)  # isinstance(planner, ShardingPlanner)
        if batch_size is not None and not int_in(batch_size, 1, MAX_BATCH_SIZE):
            raise InputError(f"must be an integer in [1, {MAX_BATCH_SIZE:,}]",
                             field="batch_size", value=batch_size)
        TIME_LIMIT_S.check(time_limit, "time_limit")
        if not is_model_spec(cost_model):
            raise InputError("must be 'analytical', 'torchrec' or a learned model's folder",
                             field="cost_model", value=cost_model)
        check_sharder_options(sharder, dict(sharder_options or {}))
        if move_budget is not None and previous is None:
            raise InputError("a move budget needs the plan the model runs with (previous=)",
                             field="move_budget", value=move_budget.describe())
        self.topology, self.batch_size, self.constraints = topology, batch_size, constraints
        self.sharder, self.sharder_options = sharder, dict(sharder_options or {})
        self.stats, self.cost_model, self.time_limit = stats, cost_model, time_limit
        self.pipeline = check_pipeline(pipeline or "none")
        self.previous, self.move_budget = previous, move_budget
        self.result: planning.Planned | None = None

    def collective_plan(self, module: Any, sharders: Sequence[Any] | None = None,
                        pg: Any = None) -> Any:
        """Plans on rank 0 of ``pg`` (None: the default group) and broadcasts the plan, as
        TorchRec's planner does; ``sharders`` None are TorchRec's default sharders. A failure
        on rank 0 is raised on every rank (none waits for a plan that never comes).

        Raises:
            PlannerError: torch.distributed is not initialised and no ``pg`` is given, or
                planning failed (on every rank).
        """
        import torch.distributed as dist
        from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result
        from torchrec.distributed.sharding_plan import get_default_sharders

        if pg is None:
            if not dist.is_initialized():
                raise PlannerError("distributed", "collective_plan needs torch.distributed "
                                   "initialised (init_process_group) or a process group; in "
                                   "one process call plan()")
            pg = dist.GroupMember.WORLD
        chosen = list(get_default_sharders() if sharders is None else sharders)
        failure: list[BaseException] = []
        outcome = invoke_on_rank_and_broadcast_result(pg, 0, self._plan_or_failure, module,
                                                      chosen, failure)
        if failure:
            raise failure[0]
        if outcome[0] == "failed":
            raise PlannerError(outcome[1], f"planning failed on rank 0: {outcome[2]}")
        return outcome[1]

    def _plan_or_failure(self, module: Any, sharders: list[Any],
                         failure: list[BaseException]) -> tuple[Any, ...]:
        """(``"planned"``, the plan), or (``"failed"``, its kind, message) with the exception
        kept in ``failure`` to raise on this rank."""
        try:
            return ("planned", self.plan(module, sharders))
        except Exception as exc:  # broadcast, then raised on every rank
            failure.append(exc)
            return ("failed", getattr(exc, "kind", type(exc).__name__), str(exc))

    def plan(self, module: Any, sharders: Sequence[Any]) -> Any:
        """A ``ShardingPlan`` of ``module``'s embedding collections that ``sharders`` shard
        (the module docstring); an empty plan when there is none, as TorchRec's.

        Raises:
            InputError: A table or statistic autoshard cannot take (named).
            PlannerError: A constraint that cannot be honoured, or no plan that fits.
        """
        from torchrec.distributed.types import ShardingPlan

        topology = self.topology or _default_topology()
        collections = find_collections(module, sharders)
        tables = tables_of(collections)
        self.result = None
        if not tables:
            _log.warning("no embedding collection with tables to plan in %s",
                         type(module).__name__)
            return ShardingPlan({})
        sharder_of = {c.path: c.sharder for c in collections}
        given = dict(self.constraints or {})
        rules = {t.name: allowed(t, given.get(t.name), sharder_of[t.path],
                                 topology.compute_device) for t in tables}
        _note_unknown(given, rules)
        ours, _ = our_tables(tables, read_statistics(self.stats), pooling_factors(given))
        for note in output_notes(tables):
            _log.info("%s", note)
        task = self._task(ours, topology, rules)
        planned = self._planned(task, _source(module))
        path_of = {t.name: t.path for t in tables}
        result = self._torchrec_plan(planned.plan, task, path_of, rules, topology)
        _validate(result, module, list(sharders), topology)
        self.result = planned
        _log_report(planned, self.pipeline)
        return result

    def _task(self, tables: tuple[Any, ...], topology: Any, rules: dict[str, Allowed]
              ) -> ShardingTask:
        """The task: the tables on the topology's hardware, the global batch, TorchRec's
        reservation for the pipeline and the tables' constraints."""
        from torchrec.distributed.planner.constants import BATCH_SIZE

        hardware = topology_hardware(topology)
        per_rank = self.batch_size or BATCH_SIZE
        workload = Workload(per_rank * hardware.num_devices, "train")
        reservation = TORCHREC_PREFETCH if self.pipeline == "prefetch" else TORCHREC
        return ShardingTask(tables, hardware, workload, reservation,
                            Constraints({n: r.constraint for n, r in rules.items()}))

    def _planned(self, task: ShardingTask, source: str) -> planning.Planned:
        """The sharder's plan within the constraints, priced (:func:`autoshard.planning.plan`),
        its context naming ``source`` (the model) with the tables inline."""
        options = {**common_options(self.sharder, {"seed": SEED,
                                                   "time_limit": self.time_limit}),
                   **self.sharder_options}
        context = PlanContext.of(task, source, {"profile": task.hardware.name},
                                 model_identity(self.cost_model), inline=True)
        replan: dict[str, Any] = {} if self.previous is None else {
            "previous": previous_plan(self.previous, task),
            "move_budget": torchrec_budget(self.move_budget)}
        return planning.plan(task, self.sharder, self.cost_model, context=context, **options,
                             **replan)

    def _torchrec_plan(self, plan: Plan, task: ShardingTask, path_of: dict[str, str],
                       rules: dict[str, Allowed], topology: Any) -> Any:
        """TorchRec's ShardingPlan of ``plan``, keyed by each collection's module path, each
        table as its constraints have it (:meth:`Allowed.apply`)."""
        modules: dict[str, list[Any]] = {}
        for s in table_shardings(plan, task):
            modules.setdefault(path_of[s.table], []).append(s)
        result = sharding_plan(modules, topology.compute_device, topology.local_world_size,
                               self.pipeline)
        for module_plan in result.plan.values():
            for name in list(module_plan):
                module_plan[name] = rules[name].apply(name, module_plan[name])
        return result


def _default_topology() -> Any:
    """The process group's topology, as TorchRec's planner builds it without one."""
    import torch.distributed as dist
    from torchrec.distributed.comm import get_local_size
    from torchrec.distributed.planner import Topology
    from torchrec.distributed.utils import get_device_type

    if not dist.is_initialized():
        raise PlannerError("distributed", "no topology given and torch.distributed is not "
                           "initialised: give AutoshardPlanner a Topology")
    return Topology(world_size=dist.get_world_size(), compute_device=get_device_type(),
                    local_world_size=get_local_size())


def _source(module: Any) -> str:
    """Where a live model's tables came from, as the plan's context records it."""
    cls = type(module)
    return f"torchrec-module:{cls.__module__}.{cls.__qualname__}"


def _note_unknown(given: dict[str, Any], rules: dict[str, Allowed]) -> None:
    unknown = sorted(set(given) - set(rules))
    if unknown:
        _log.warning("constraints name tables the model does not have: %s",
                     ", ".join(unknown))


def _validate(result: Any, module: Any, sharders: list[Any], topology: Any) -> None:
    """TorchRec's own checks of a plan: every shardable module planned, ranks in the world.

    Raises:
        PlannerError: What TorchRec's check says.
    """
    from torchrec.distributed.planner.planners import (
        validate_modules_inclusion_in_sharding_plan,
        validate_rank_assignment,
    )
    from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError

    try:
        validate_modules_inclusion_in_sharding_plan(result, module, sharders)
        validate_rank_assignment(result, topology)
    except TorchRecPlannerError as exc:
        raise PlannerError("invalid_plan", f"TorchRec's validation: {exc}") from exc


def _log_report(planned: planning.Planned, pipeline: str) -> None:
    """The planning report at INFO (the module docstring); nothing is computed unless the
    logger shows INFO."""
    if not _log.isEnabledFor(logging.INFO):
        return
    report, plan, task, solver = planned.report, planned.plan, planned.task, planned.solver
    status = f", status {solver['status']}" if solver is not None else ""
    found = f" ({plan.provenance.summary()})" if plan.provenance is not None else ""
    _log.info("planned %d tables on %d ranks with %s%s%s", task.num_tables, task.num_devices,
              plan.sharder, found, status)
    _log.info("step cost %.3f ms under %s, lower bound %.3f ms (%.2fx)",
              report.step_cost_ms, report.cost_model, report.lower_bound_ms, report.cost_ratio)
    _log.info("HBM per rank (weights / reserved for TorchRec's %s pipeline / free): %s",
              pipeline, "; ".join(f"{d.device}: {gib(d.hbm_bytes)} / "
                                  f"{gib(d.hbm_reserved_bytes)} / {gib(d.hbm_free_bytes)}"
                                  for d in report.per_device))
    _log.info("TorchRec's estimate of this plan: %s", _torchrec_estimate(plan, task, pipeline))


def _torchrec_estimate(plan: Plan, task: ShardingTask, pipeline: str) -> str:
    """TorchRec's perf estimate of the slowest rank, in words (or why there is none)."""
    from autoshard.torchrec.estimate import estimate_plan

    try:
        estimate = estimate_plan(plan, task, pipeline=pipeline)
    except (InputError, PlannerError) as exc:
        return f"unavailable ({exc})"
    return (f"{estimate.step_ms:.3f} ms on its slowest rank (its CUDA model of this "
            f"hardware), HBM {'fits' if estimate.fits else 'overfills'}")

