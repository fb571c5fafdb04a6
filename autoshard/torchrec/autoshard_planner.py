"""autoshard's planning behind TorchRec's planner interface: a drop-in for
``EmbeddingShardingPlanner``.

``AutoshardPlanner(topology, constraints=...).collective_plan(model, sharders, pg)`` returns a
``ShardingPlan`` ready for ``DistributedModelParallel``, as TorchRec's planner does. In between
it plans with autoshard:

1. the model's tables are read from its ``EmbeddingBagCollection`` and ``EmbeddingCollection``
   modules, nested anywhere (:mod:`autoshard.torchrec.model_tables`), with statistics;
2. the storage reservation keeps each rank's memory for the rest of the model, as TorchRec's
   planner has it (:mod:`autoshard.torchrec.storage_reservation`; TorchRec's default,
   ``HeuristicalStorageReservation(percentage=0.15)``, unless another is given);
3. the reserved topology becomes our hardware profile (:mod:`autoshard.torchrec.topology`), the
   per-rank batch our global one, the pipeline TorchRec's HBM reservation per table
   (:mod:`autoshard.torchrec.runtime_memory`), each table's ``ParameterConstraints`` our
   constraints (:mod:`autoshard.torchrec.parameter_constraints`);
4. a sharder from the registry plans the task under the cost model (:func:`autoshard.planning.
   plan`, which also brings its HBM rows within the constraints and prices the plan);
5. the plan becomes TorchRec's ``ParameterSharding`` objects keyed by each collection's module
   path (:func:`autoshard.torchrec.export.sharding_plan`);
6. TorchRec's enumerator and estimators rate it on the model itself
   (:mod:`autoshard.torchrec.model_rating`): every rank's shards must fit what the reservation
   leaves it under TorchRec's storage estimate, as TorchRec's partitioner demands. Where
   TorchRec counts more than our model did (a table of several features or a sequence table
   writes more output than our tables price), the task is planned again with each rank's HBM
   lowered by the most a rank overfilled, until a plan fits, :data:`FIT_ROUNDS` plans at most;
7. TorchRec's own validation checks the plan.

Errors are TorchRec's ``PlannerError`` with its ``PlannerErrorType``, and ours
(:mod:`autoshard.torchrec.planner_errors`). The plan's statistics, as TorchRec's planner prints
them (:mod:`autoshard.torchrec.planner_stats`), go to the ``autoshard.torchrec.autoshard_planner``
logger at INFO, with the sharder and how it stopped and our step cost and lower bound. The
planning's result is ``result`` (:class:`autoshard.planning.Planned`): ``result.plan`` is the
plan in our terms, with its context (tables recorded inline, the storage reservation in its
``hardware_spec``); ``result.plan.save("plan.json")`` and ``autoshard evaluate plan.json`` price
it again. ``plan_stats`` is its statistics (:class:`autoshard.torchrec.planner_stats.PlanStats`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from autoshard import planning
from autoshard.errors import InputError, PlannerError
from autoshard.hardware import HardwareProfile
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
from autoshard.torchrec.planner_stats import PlanStats
from autoshard.torchrec.reshard import previous_plan, torchrec_budget
from autoshard.torchrec.runtime_memory import TORCHREC, TORCHREC_PREFETCH, check_pipeline
from autoshard.torchrec.shardings import table_shardings
from autoshard.torchrec.storage_reservation import Reserved
from autoshard.torchrec.topology import topology_hardware

_log = logging.getLogger(__name__)
#: The seed the sharders that draw at random are given (the CLI's default).
SEED = 0
#: The sharder's time limit when neither ``time_limit`` nor ``timeout_seconds`` is given, s.
DEFAULT_TIME_LIMIT_S = 60.0
#: Plans made at most, the first and those made again with less HBM, until one fits
#: TorchRec's storage estimate (the module docstring, step 6).
FIT_ROUNDS = 4


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
        time_limit: Seconds the sharder may plan for (None: ``timeout_seconds``, else
            :data:`DEFAULT_TIME_LIMIT_S`).
        storage_reservation: TorchRec's ``StorageReservation``: the memory each rank keeps for
            the rest of the model; the tables are planned in what it leaves (None: TorchRec's
            planner's default, ``HeuristicalStorageReservation(percentage=0.15)``).
        timeout_seconds: TorchRec's name for ``time_limit`` (give one of them).
        debug: As TorchRec's planner: the statistics logged also list every table, the
            imbalance and the reservation (False: per rank only).
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
        plan_stats: The plan's statistics as TorchRec rates it (the same moments as
            ``result``; :class:`autoshard.torchrec.planner_stats.PlanStats`, whose ``render()``
            is the table logged).

    Raises (from :meth:`plan` and :meth:`collective_plan`): TorchRec's ``PlannerError``, as
    :class:`autoshard.torchrec.planner_errors.AutoshardPlannerError` (also our
    :class:`autoshard.errors.PlannerError`) or ``AutoshardInputError`` (also our
    :class:`autoshard.errors.InputError`).
    """

    def __init__(self, topology: Any = None, batch_size: int | None = None,
                 constraints: Mapping[str, Any] | None = None, *, sharder: str = "recshard",
                 sharder_options: Mapping[str, Any] | None = None,
                 stats: Statistics | None = None, cost_model: str = "analytical",
                 pipeline: str | None = None, time_limit: float | None = None,
                 storage_reservation: Any = None, timeout_seconds: float | None = None,
                 debug: bool = True, previous: Any = None,
                 move_budget: MoveBudget | None = None) -> None:
        from torchrec.distributed.types import ShardingPlanner

        from autoshard.torchrec.storage_reservation import default_reservation

        ShardingPlanner.register(AutoshardPlanner)  # isinstance(planner, ShardingPlanner)
        if batch_size is not None and not int_in(batch_size, 1, MAX_BATCH_SIZE):
            raise InputError(f"must be an integer in [1, {MAX_BATCH_SIZE:,}]",
                             field="batch_size", value=batch_size)
        if not is_model_spec(cost_model):
            raise InputError("must be 'analytical', 'torchrec' or a learned model's folder",
                             field="cost_model", value=cost_model)
        check_sharder_options(sharder, dict(sharder_options or {}))
        if move_budget is not None and previous is None:
            raise InputError("a move budget needs the plan the model runs with (previous=)",
                             field="move_budget", value=move_budget.describe())
        self.topology, self.batch_size, self.constraints = topology, batch_size, constraints
        self.sharder, self.sharder_options = sharder, dict(sharder_options or {})
        self.stats, self.cost_model = stats, cost_model
        self.time_limit = _time_limit(time_limit, timeout_seconds)
        self.pipeline = check_pipeline(pipeline or "none")
        self.storage_reservation = (default_reservation() if storage_reservation is None
                                    else _checked_reservation(storage_reservation))
        self.debug = bool(debug)
        self.previous, self.move_budget = previous, move_budget
        self.result: planning.Planned | None = None
        self.plan_stats: PlanStats | None = None

    def collective_plan(self, module: Any, sharders: Sequence[Any] | None = None,
                        pg: Any = None) -> Any:
        """Plans on rank 0 of ``pg`` (None: the default group) and broadcasts the plan, as
        TorchRec's planner does; ``sharders`` None are TorchRec's default sharders. A failure
        on rank 0 is raised on every rank (none waits for a plan that never comes), with its
        kind and TorchRec error type.

        Raises:
            AutoshardPlannerError: torch.distributed is not initialised and no ``pg`` is given,
                or planning failed (on every rank).
        """
        import torch.distributed as dist
        from torchrec.distributed.collective_utils import invoke_on_rank_and_broadcast_result
        from torchrec.distributed.sharding_plan import get_default_sharders

        from autoshard.torchrec.planner_errors import AutoshardPlannerError, as_torchrec_error

        if pg is None:
            if not dist.is_initialized():
                raise as_torchrec_error(PlannerError(
                    "distributed", "collective_plan needs torch.distributed initialised "
                    "(init_process_group) or a process group; in one process call plan()"))
            pg = dist.GroupMember.WORLD
        chosen = list(get_default_sharders() if sharders is None else sharders)
        failure: list[BaseException] = []
        outcome = invoke_on_rank_and_broadcast_result(pg, 0, self._plan_or_failure, module,
                                                      chosen, failure)
        if failure:
            raise failure[0]
        if outcome[0] == "failed":
            _, kind, error_type, message = outcome
            raise AutoshardPlannerError(kind, f"planning failed on rank 0: {message}",
                                        error_type)
        return outcome[1]

    def _plan_or_failure(self, module: Any, sharders: list[Any],
                         failure: list[BaseException]) -> tuple[Any, ...]:
        """(``"planned"``, the plan), or (``"failed"``, its kind, TorchRec error type,
        message) with the exception kept in ``failure`` to raise on this rank."""
        try:
            return ("planned", self.plan(module, sharders))
        except Exception as exc:  # broadcast, then raised on every rank
            failure.append(exc)
            return ("failed", getattr(exc, "kind", type(exc).__name__),
                    getattr(exc, "error_type", None), str(exc))

    def plan(self, module: Any, sharders: Sequence[Any]) -> Any:
        """A ``ShardingPlan`` of ``module``'s embedding collections that ``sharders`` shard
        (the module docstring); an empty plan when there is none, as TorchRec's.

        Raises:
            AutoshardInputError: A table or statistic autoshard cannot take (named);
                TorchRec's ``INPUT_VALIDATION``.
            AutoshardPlannerError: A constraint that cannot be honoured
                (``STRICT_CONSTRAINTS``), no plan that fits (``INSUFFICIENT_STORAGE``, also
                when the reservation leaves nothing), or one TorchRec's validation refuses.
        """
        from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError

        from autoshard.torchrec.planner_errors import as_torchrec_error

        try:
            return self._plan(module, list(sharders))
        except (InputError, PlannerError, TorchRecPlannerError) as exc:
            converted = as_torchrec_error(exc)
            if converted is exc:
                raise
            raise converted from exc

    def _plan(self, module: Any, sharders: list[Any]) -> Any:
        """:meth:`plan`, raising our errors and TorchRec's as they come."""
        from torchrec.distributed.types import ShardingPlan

        began = time.perf_counter()
        topology = self.topology or _default_topology()
        collections = find_collections(module, sharders)
        tables = tables_of(collections)
        self.result, self.plan_stats = None, None
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
        reserved_topology, reserved = self._reserve(topology, module, sharders)
        task = self._task(ours, reserved_topology, rules)
        model = _Model(module, sharders, topology, self._per_rank(), given,
                       {t.name: t.path for t in tables}, rules, reserved)
        planned, result, stats = self._fitted(task, model, began)
        _validate(result, module, sharders, topology)
        self.result, self.plan_stats = planned, stats
        _log_report(planned, self.pipeline, stats, self.debug)
        return result

    def _per_rank(self) -> int:
        from torchrec.distributed.planner.constants import BATCH_SIZE

        return self.batch_size or BATCH_SIZE

    def _reserve(self, topology: Any, module: Any, sharders: list[Any]
                 ) -> tuple[Any, Reserved]:
        """The topology the storage reservation leaves the tables, and what it kept."""
        from autoshard.torchrec.storage_reservation import reserve

        reserved_topology, reserved = reserve(self.storage_reservation, topology,
                                              self._per_rank(), module, sharders,
                                              self.constraints)
        _log.info("storage reservation: %s", reserved.describe())
        return reserved_topology, reserved

    def _task(self, tables: tuple[Any, ...], topology: Any, rules: dict[str, Allowed]
              ) -> ShardingTask:
        """The task: the tables on the (reserved) topology's hardware, the global batch,
        TorchRec's reservation per table for the pipeline and the tables' constraints."""
        hardware = topology_hardware(topology)
        workload = Workload(self._per_rank() * hardware.num_devices, "train")
        reservation = TORCHREC_PREFETCH if self.pipeline == "prefetch" else TORCHREC
        return ShardingTask(tables, hardware, workload, reservation,
                            Constraints({n: r.constraint for n, r in rules.items()}))

    def _fitted(self, task: ShardingTask, model: _Model, began: float
                ) -> tuple[planning.Planned, Any, PlanStats]:
        """The plan, TorchRec's ShardingPlan of it and its statistics: the first plan whose
        every rank fits what the reservation leaves it under TorchRec's storage estimate,
        the task planned again with less HBM per rank while one overfills (the module
        docstring, step 6).

        Raises:
            PlannerError: ``capacity``: no such plan in :data:`FIT_ROUNDS` plans.
        """
        from autoshard.torchrec.model_rating import rate_plan
        from autoshard.torchrec.planner_stats import plan_stats

        lowered = 0
        for _ in range(FIT_ROUNDS):
            planned = self._planned(_lowered(task, lowered), _source(model.module),
                                    model.reserved, model.path_of)
            result = self._torchrec_plan(planned.plan, planned.task, model)
            options = rate_plan(result, model.module, model.sharders, model.topology,
                                model.per_rank, model.constraints, self.pipeline)
            stats = plan_stats(options, model.topology, model.reserved, model.per_rank,
                               model.constraints, f"autoshard ({self.sharder})",
                               time.perf_counter() - began)
            if stats.fits:
                return planned, result, stats
            lowered += _overflow(stats, model.topology)
            _log.info("TorchRec counts more than the plan left room for (%s); planning "
                      "again with %s less per rank", _overfilled(stats), _gib(lowered))
        raise PlannerError("capacity", f"no plan within TorchRec's storage estimate in "
                           f"{FIT_ROUNDS} plans: {_overfilled(stats)} under "
                           f"{model.reserved.describe()}")

    def _planned(self, task: ShardingTask, source: str, reserved: Reserved,
                 paths: dict[str, str]) -> planning.Planned:
        """The sharder's plan within the constraints, priced (:func:`autoshard.planning.plan`),
        its context naming ``source`` (the model) with the tables inline, their collections'
        module ``paths`` (which ``autoshard export`` writes) and the storage reservation."""
        options = {**common_options(self.sharder, {"seed": SEED,
                                                   "time_limit": self.time_limit}),
                   **self.sharder_options}
        spec = {"profile": task.hardware.name, "storage_reservation": reserved.to_dict()}
        context = PlanContext.of(task, source, spec, model_identity(self.cost_model),
                                 inline=True, module_paths=paths)
        replan: dict[str, Any] = {} if self.previous is None else {
            "previous": previous_plan(self.previous, task),
            "move_budget": torchrec_budget(self.move_budget)}
        return planning.plan(task, self.sharder, self.cost_model, context=context, **options,
                             **replan)

    def _torchrec_plan(self, plan: Plan, task: ShardingTask, model: _Model) -> Any:
        """TorchRec's ShardingPlan of ``plan``, keyed by each collection's module path, each
        table as its constraints have it (:meth:`Allowed.apply`)."""
        modules: dict[str, list[Any]] = {}
        for s in table_shardings(plan, task):
            modules.setdefault(model.path_of[s.table], []).append(s)
        result = sharding_plan(modules, model.topology.compute_device,
                               model.topology.local_world_size, self.pipeline)
        for module_plan in result.plan.values():
            for name in list(module_plan):
                module_plan[name] = model.rules[name].apply(name, module_plan[name])
        return result


class _Model:
    """What one :meth:`AutoshardPlanner.plan` call plans for: the module and its sharders,
    the topology before the reservation, the batch per rank, the user's constraints, each
    table's collection path and rules, and what the reservation kept."""

    def __init__(self, module: Any, sharders: list[Any], topology: Any, per_rank: int,
                 constraints: dict[str, Any], path_of: dict[str, str],
                 rules: dict[str, Allowed], reserved: Reserved) -> None:
        self.module, self.sharders, self.topology = module, sharders, topology
        self.per_rank, self.constraints, self.path_of = per_rank, constraints, path_of
        self.rules, self.reserved = rules, reserved


def _time_limit(time_limit: float | None, timeout_seconds: float | None) -> float:
    """The sharder's time limit from ``time_limit`` or TorchRec's ``timeout_seconds``.

    Raises:
        InputError: Both given and different, or one out of range.
    """
    if time_limit is not None and timeout_seconds is not None and (
            time_limit != timeout_seconds):
        raise InputError(f"give time_limit ({time_limit:g} s) or timeout_seconds, not both",
                         field="timeout_seconds", value=timeout_seconds)
    for name, value in (("time_limit", time_limit), ("timeout_seconds", timeout_seconds)):
        if value is not None:
            TIME_LIMIT_S.check(value, name)
            return float(value)
    return DEFAULT_TIME_LIMIT_S


def _checked_reservation(reservation: Any) -> Any:
    """``reservation`` if it is TorchRec's ``StorageReservation`` (else an InputError)."""
    from torchrec.distributed.planner.types import StorageReservation

    if not isinstance(reservation, StorageReservation):
        raise InputError("must be a torchrec.distributed.planner.types.StorageReservation "
                         "(e.g. HeuristicalStorageReservation(percentage=0.15))",
                         field="storage_reservation", value=type(reservation).__name__)
    return reservation


def _lowered(task: ShardingTask, by_bytes: int) -> ShardingTask:
    """``task`` with each device's fast tier (HBM; a CPU topology's DDR) ``by_bytes``
    smaller (none below zero)."""
    if by_bytes <= 0:
        return task
    devices = tuple(replace(d, hbm=replace(d.hbm, capacity_bytes=max(
        d.hbm.capacity_bytes - by_bytes, 0))) for d in task.hardware.devices)
    hardware: HardwareProfile = replace(task.hardware, devices=devices)
    return replace(task, hardware=hardware)


def _overflow(stats: PlanStats, topology: Any) -> int:
    """The most by which a rank's shards overfill what the reservation leaves them under
    TorchRec's storage estimate, in its fast tier (HBM; a CPU topology's DDR), bytes."""
    cpu = topology.compute_device == "cpu"
    return max(0, *((r.ddr_bytes - r.ddr_left_bytes) if cpu else (r.hbm_bytes - r.hbm_left_bytes)
                    for r in stats.ranks))


def _overfilled(stats: PlanStats) -> str:
    """The ranks whose shards overfill what the reservation leaves them, in words."""
    return "; ".join(f"rank {r.rank}'s shards take {_gib(r.hbm_bytes)} HBM and "
                     f"{_gib(r.ddr_bytes)} DDR of the {_gib(r.hbm_left_bytes)} and "
                     f"{_gib(r.ddr_left_bytes)} left" for r in stats.ranks if not r.fits)


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.3f} GiB"


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
        torchrec.distributed.planner.types.PlannerError: What TorchRec's check says (its own
            error type kept).
    """
    from torchrec.distributed.planner.planners import (
        validate_modules_inclusion_in_sharding_plan,
        validate_rank_assignment,
    )

    validate_modules_inclusion_in_sharding_plan(result, module, sharders)
    validate_rank_assignment(result, topology)


def _log_report(planned: planning.Planned, pipeline: str, stats: PlanStats,
                debug: bool) -> None:
    """The planning report at INFO (the module docstring); nothing is computed unless the
    logger shows INFO."""
    if not _log.isEnabledFor(logging.INFO):
        return
    report, plan, task, solver = planned.report, planned.plan, planned.task, planned.solver
    status = f", status {solver['status']}" if solver is not None else ""
    found = f" ({plan.provenance.summary()})" if plan.provenance is not None else ""
    _log.info("planned %d tables on %d ranks with %s%s%s", task.num_tables, task.num_devices,
              plan.sharder, found, status)
    _log.info("step cost %.3f ms under %s, lower bound %.3f ms (%.2fx); TorchRec's estimate "
              "%.3f ms on its slowest rank (its CUDA model of this hardware, %s pipeline)",
              report.step_cost_ms, report.cost_model, report.lower_bound_ms, report.cost_ratio,
              stats.step_ms, pipeline)
    for line in stats.render(debug).splitlines():
        _log.info("%s", line)
