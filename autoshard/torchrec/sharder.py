"""TorchRec's EmbeddingShardingPlanner as a sharder, its plan converted exactly into ours.

The planner runs on a simulated topology (no GPU, no process group) over a meta-device
EmbeddingBagCollection of the task's tables, configured as its users configure it at full
strength: every sharding type our plans can hold (``table_wise``, ``row_wise``,
``table_row_wise``, ``column_wise``, ``table_column_wise``, ``data_parallel``, and on hardware
of several nodes ``grid_shard`` for the dominant tables, which TorchRec enumerates only where a
constraint names it), every compute kernel (``fused``, ``fused_uvm_caching``, ``fused_uvm``,
``dense`` for replicas), TorchRec's default proposers plus its cache-size search
(``EmbeddingOffloadScaleupProposer``, given our access curves as cache statistics) and its own
storage estimate of every shard. The cache search starts from a load factor whose caches fit
the cluster's HBM (TorchRec's default 0.2 when that fits), so that big tables get an HBM cache
instead of falling back to host memory whole. On large tasks (more than
:data:`FULL_STRENGTH_CELLS` tables x devices) only the dominant tables (dearer whole than the
per-device mean, :func:`autoshard.layout.splitting.dominant_tables`) are offered the split types,
the others ``table_wise``, as a user planning a large model constrains them: TorchRec enumerates a
row-wise option as one shard per rank, so otherwise its options grow with tables x devices.

Our statistics go where TorchRec takes them: lookups per sample (pooling factor x coverage) as
pooling factors, the access curve as cache statistics, the profile's bandwidths and capacities
into the topology, the optimizer state into its storage estimate
(:mod:`autoshard.torchrec.estimate`). The plan converts shard by shard: row ranges, column
blocks and ranks as TorchRec placed them, a cache of load factor f over a shard of n rows as its
round(f * n) hottest rows in HBM. The same evaluator then prices it with our cost model.

A time limit covers the whole run (importing TorchRec, seconds once per process, happens when
the sharder is made, as the ``ppo`` sharder loads its policy). The options are enumerated once
per starting load factor and handed to TorchRec's planner, whose proposers stop at the
deadline once a plan is found (:mod:`autoshard.torchrec.timed_planning`). Where TorchRec's
enumeration of every option is predicted (:data:`ENUMERATE_S_PER_SHARD`) to take more than
:data:`ENUMERATE_SHARE` of the limit, the split types are offered to the dominant tables only,
or to none, and then (where HBM holds every table whole) the ``fused`` kernel alone; the
fitting cache start is searched only with time left for it, a second start only with
:data:`MIN_START_S` left, and the cache-size search runs only with that much left.
The result's notes (:attr:`autoshard.sharders.base.Sharded.notes`) say what the limit cut.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from autoshard.errors import PlannerError
from autoshard.layout.plan import Plan
from autoshard.layout.splitting import REPLICA_HBM_SHARE, dominant_tables
from autoshard.limits import MAX_DEVICES, MAX_TABLES, TIME_LIMIT_S, Range
from autoshard.pricing.cost import CostModel
from autoshard.sharders.base import Sharded, Sharder
from autoshard.task import ShardingTask
from autoshard.torchrec import torchrec_unavailable
from autoshard.torchrec.mapping import (
    DEFAULT_CACHE_LOAD_FACTOR,
    FUSED,
    FUSED_UVM_CACHING,
    NAMED_ONLY,
    REPLICATED_TYPE,
    SHARDING_TYPES,
    WHOLE_TYPE,
    data_type,
)
from autoshard.torchrec.shardings import from_parameter_sharding, to_plan
from autoshard.torchrec.timed_planning import (
    PLANNED_KERNELS,
    SearchSpace,
    largest_hbm,
    predicted_shards,
)

#: Share of the cluster's HBM the starting caches may fill, leaving the partitioner room.
_START_FILL = 0.9
_TINY_CACHE = 1e-3  # the smallest starting load factor tried
#: Tasks of up to this many tables x devices offer every table every sharding type; larger ones
#: offer the split types only to dominant tables (:func:`offered_sharding_types`).
FULL_STRENGTH_CELLS = 4096
_log = logging.getLogger(__name__)
_FIRST_START_SHARE = 0.75  # of the time left, for the fitting cache start of two
#: Seconds TorchRec's enumerator takes per shard of a sharding option it estimates: 0.18 to
#: 0.49 ms measured on a 2-core Xeon (200 default tables on 8 devices, one sharding type at a
#: time: table-row-wise the cheapest, table-column-wise the dearest), rounded up; 0.66 ms on a
#: 2-core AMD EPYC (856 whole tables, every kernel): machines differ, so the limit's slack and
#: the fused-only step (:meth:`TorchRecSharder._offered_in_time`) absorb the difference.
ENUMERATE_S_PER_SHARD = 5e-4
#: Share of the time limit the enumeration may be predicted to take; a larger search space is
#: offered less (split types for dominant tables only, then for none).
ENUMERATE_SHARE = 0.2
#: A further cache start begins only with at least this many seconds left (plus what its
#: enumeration took), and the fitting start is searched only with that much left after the
#: enumeration's own time again.
MIN_START_S = 1.0


def offered_sharding_types(task: ShardingTask, cost_model: CostModel,
                           sharding_types: tuple[str, ...] = SHARDING_TYPES,
                           full_strength_cells: int = FULL_STRENGTH_CELLS,
                           replicas: bool = True, heavy: np.ndarray | None = None
                           ) -> dict[str, list[str]]:
    """The sharding types TorchRec may choose per table, as a user planning a large model
    constrains them.

    Up to ``full_strength_cells`` tables x devices, every table gets every type, but for the
    types TorchRec's planner enumerates only where a constraint names them
    (:data:`autoshard.torchrec.mapping.NAMED_ONLY`: ``grid_shard``): those are named for the
    dominant tables (dearer whole than the per-device mean of the least work,
    :func:`autoshard.layout.splitting.dominant_tables`), the tables a grid can relieve, and only on
    hardware of several nodes (a grid's column blocks go to different nodes). Above it, a table
    gets the split types only when it is dominant; the others get ``table_wise``, and
    ``data_parallel`` (replicated, the choice for small tables) where the table fits
    :data:`autoshard.layout.splitting.REPLICA_HBM_SHARE` of a device's HBM (and ``replicas``).
    ``heavy``: the dominant tables, where already known.
    TorchRec enumerates a
    row-wise option as one shard per rank, so without this the options grow with tables x
    devices and the search with them.
    """
    types = list(sharding_types)
    if not task.hardware.spans_nodes:
        types = [x for x in types if x not in NAMED_ONLY]
    full = task.num_tables * task.num_devices <= full_strength_cells or WHOLE_TYPE not in types
    if full and not any(x in NAMED_ONLY for x in types):
        return {t.name: types for t in task.tables}
    heavy = dominant_tables(task, cost_model) if heavy is None else heavy
    a = task.table_arrays
    small = (a.rows * a.memory_bytes_per_row
             <= REPLICA_HBM_SHARE * float(task.device_arrays.hbm_capacity.min()))

    def light(i: int) -> list[str]:
        if full:
            return [x for x in types if x not in NAMED_ONLY]
        return [x for x in types
                if x == WHOLE_TYPE or (x == REPLICATED_TYPE and small[i] and replicas)]

    return {t.name: types if heavy[i] else light(i) for i, t in enumerate(task.tables)}


@dataclass(frozen=True)
class TorchRecRun:
    """What TorchRec's planner made of a task: the ``torchrec`` sharder's
    :attr:`~autoshard.sharders.base.Sharded.details`.

    Args:
        sharding_plan: TorchRec's own ``ShardingPlan``.
        cache_load_factor: The starting cache load factor it was planned from.
        task: The task planned.
        pipeline: The TorchRec training pipeline it was rated for.
        rating_ms: TorchRec's perf estimate of its slowest rank, ms, where several starts
            were rated against each other (None where one start was planned:
            :meth:`rated_ms` rates it).
    """

    sharding_plan: Any
    cache_load_factor: float
    task: ShardingTask
    pipeline: str
    rating_ms: float | None = None

    def rated_ms(self) -> float:
        """TorchRec's perf estimate of the plan's slowest rank, ms (rated now where no
        rating was needed to choose the plan)."""
        if self.rating_ms is not None:
            return self.rating_ms
        return _rating(self.sharding_plan, self.task, self.pipeline)


class TorchRecSharder(Sharder):
    """TorchRec's planner at full strength: all sharding types and kernels, cache-size search.

    Args:
        cache_load_factor: Starting cache load factor for ``fused_uvm_caching``; ``None``
            plans from the largest up to TorchRec's default 0.2 whose caches fit the cluster's
            HBM, and also from 0.2 when that is larger, and keeps the plan TorchRec rates
            best.
        use_stats: Pass the access curves as cache statistics (and run the cache-size search).
        sharding_types: Sharding types TorchRec may choose (default: all it has that our plans
            hold).
        time_limit: Seconds for the whole run, enumeration included; None: no limit. Options
            TorchRec would take too long to enumerate are not offered, TorchRec's proposers
            stop at the deadline once a plan is found, and a further start is tried only with
            time left (module docstring); the result's notes say what was cut.
        full_strength_cells: Tasks of more tables x devices than this offer the split sharding
            types to dominant tables only (:func:`offered_sharding_types`), bounding the
            options.
        pipeline: The TorchRec training pipeline the plan is for (``"none"``, TorchRec's
            default, or ``"prefetch"``: caches prefetched, priced and sized as TorchRec's
            prefetch pipeline, :mod:`autoshard.torchrec.estimate`); None: the one the task's
            reservation keeps HBM for.

    :meth:`solve` returns, beside the plan, TorchRec's own ShardingPlan, the starting load
    factor it came from and TorchRec's rating of it (:class:`TorchRecRun`).
    """

    #: The clock the time limit is kept by, seconds; a test may set a fake one on an instance
    #: (a clock that counts steps keeps the run independent of the machine's speed).
    clock: Callable[[], float] = staticmethod(time.monotonic)

    name: ClassVar[str] = "torchrec"
    summary: ClassVar[str] = ("TorchRec's EmbeddingShardingPlanner, every sharding type, cache "
                              "search, converted")
    option_ranges: ClassVar[dict[str, Range]] = {
        "cache_load_factor": Range(0, 1, open_low=True), "time_limit": TIME_LIMIT_S,
        "full_strength_cells": Range(1, MAX_TABLES * MAX_DEVICES, integer=True)}

    def __init__(self, cache_load_factor: float | None = None, use_stats: bool = True,
                 sharding_types: tuple[str, ...] = SHARDING_TYPES,
                 time_limit: float | None = None,
                 full_strength_cells: int = FULL_STRENGTH_CELLS,
                 pipeline: str | None = None) -> None:
        from autoshard.torchrec.runtime_memory import check_pipeline

        self.pipeline = None if pipeline is None else check_pipeline(pipeline)
        self.full_strength_cells = full_strength_cells
        self.cache_load_factor = cache_load_factor
        self.time_limit = time_limit
        self.use_stats = use_stats
        self.sharding_types = tuple(sharding_types)
        # Import TorchRec now (seconds, once per process), so that solve() is planning only.
        self._unloadable = torchrec_unavailable(load=True) if self.unavailable() is None else None

    @classmethod
    def unavailable(cls) -> str | None:
        return torchrec_unavailable()

    def solve(self, task: ShardingTask, cost_model: CostModel) -> Sharded[TorchRecRun]:
        """TorchRec's plan of ``task``, converted into ours, with what the time limit cut
        (notes) and TorchRec's own plan (:class:`TorchRecRun`).

        Raises:
            PlannerError: TorchRec is unavailable here, or its planner found no plan.
        """
        reason = self._unloadable or torchrec_unavailable(load=True)
        if reason:
            raise PlannerError("unavailable", reason)
        from autoshard.torchrec.estimate import quiet_torchrec, task_pipeline

        began = self.clock()
        deadline = math.inf if self.time_limit is None else began + self.time_limit
        notes: list[str] = []
        pipeline = task_pipeline(task, self.pipeline)
        with quiet_torchrec():
            offered, kernels = self._offered_in_time(task, cost_model, deadline, notes)
            space = SearchSpace(task, offered, self.use_stats, pipeline, kernels, self.clock)
            starts = ([self.cache_load_factor] if self.cache_load_factor is not None
                      else self._starts(space, task, deadline, notes))
            rating, clf, plan = self._best_start(space, task, starts, deadline, notes)
        return Sharded(convert_plan(plan, task, self.name),
                       TorchRecRun(plan, clf, task, pipeline, rating), notes=tuple(notes))

    def _best_start(self, space: SearchSpace, task: ShardingTask, starts: list[float],
                    deadline: float, notes: list[str]) -> tuple[float | None, float, Any]:
        """(rating, starting load factor, ShardingPlan) of the best start TorchRec planned in
        time; the rating is None where only one start was planned (none to compare)."""
        from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError

        plans: list[tuple[float, Any]] = []
        for i, clf in enumerate(starts):
            left = deadline - self.clock()
            need = MIN_START_S + (0.0 if clf in space.enumerated else space.enumerate_s)
            if plans and left < need:
                _note(notes, f"time limit: cache start {clf:.3g} not tried ({left:.1f} s "
                      f"left), kept the plan from {plans[0][0]:.3g}")
                break
            last = i == len(starts) - 1
            stop = deadline if last else self.clock() + left * _FIRST_START_SHARE
            if left < 0 and not plans:
                _note(notes, f"time limit passed before TorchRec proposed (its enumeration "
                      f"took {space.enumerate_s:.1f} s): its first proposals that fit are kept")
            try:
                plans.append((clf, space.planned(clf, stop, deadline, task,
                                                 self._proposers(deadline, notes,
                                                                 space.enumerate_s,
                                                                 space.kernels))))
            except TorchRecPlannerError as exc:
                if not plans and last:
                    within = ("" if self.time_limit is None else
                              f" within its time limit of {self.time_limit:g} s")
                    raise PlannerError("torchrec", f"TorchRec's planner found no plan for "
                                       f"{task.num_tables} tables on {task.num_devices} "
                                       f"devices{within}: {str(exc).splitlines()[0]}") from exc
        if len(plans) == 1:
            return None, *plans[0]
        rated = [(_rating(plan, task, space.pipeline), clf, plan) for clf, plan in plans]
        return min(rated, key=lambda r: r[0])

    def search_space(self, task: ShardingTask, cost_model: CostModel,
                     cache_load_factor: float = DEFAULT_CACHE_LOAD_FACTOR) -> list[Any]:
        """TorchRec's enumerated sharding options for ``task``, as :meth:`solve` offers them
        without a time limit."""
        from autoshard.torchrec.estimate import quiet_torchrec, task_pipeline

        space = SearchSpace(task, self._offered(task, cost_model), self.use_stats,
                             task_pipeline(task, self.pipeline))

        with quiet_torchrec():
            return list(space.options(cache_load_factor)[2])

    def _offered(self, task: ShardingTask, cost_model: CostModel) -> dict[str, list[str]]:
        return offered_sharding_types(task, cost_model, self.sharding_types,
                                      self.full_strength_cells)

    def _offered_in_time(self, task: ShardingTask, cost_model: CostModel, deadline: float,
                         notes: list[str]) -> tuple[dict[str, list[str]], tuple[str, ...]]:
        """The sharding types offered per table and the compute kernels: as :meth:`_offered`
        and every kernel, or fewer where TorchRec's enumeration of those is predicted to take
        more than :data:`ENUMERATE_SHARE` of the time left (split types for dominant tables
        only, then for none; then the ``fused`` kernel alone where every table fits a device's
        HBM whole and all of them the cluster's, so that no option in host memory can be
        chosen; said in ``notes``)."""
        budget = ENUMERATE_SHARE * (deadline - self.clock())
        offered = self._offered(task, cost_model)
        if WHOLE_TYPE not in self.sharding_types:
            return offered, PLANNED_KERNELS
        heavy = dominant_tables(task, cost_model)
        for label, cells, replicas in (
                ("the dominant tables only", 0, True),
                ("the dominant tables only, and no table replicated", 0, False),
                ("no table", None, False)):
            predicted = predicted_shards(task, offered) * ENUMERATE_S_PER_SHARD
            if predicted <= budget:
                return offered, PLANNED_KERNELS
            fewer = ({t.name: [WHOLE_TYPE] for t in task.tables} if cells is None else
                     offered_sharding_types(task, cost_model, self.sharding_types, cells,
                                            replicas, heavy))
            if fewer != offered:
                _note(notes, f"time limit: split sharding types offered to {label} (TorchRec's "
                           f"enumeration of the options predicted to take {predicted:.1f} s)")
            offered = fewer
        predicted = predicted_shards(task, offered) * ENUMERATE_S_PER_SHARD
        if predicted <= budget or not _fits_hbm_whole(task):
            return offered, PLANNED_KERNELS
        _note(notes, f"time limit: the {FUSED} kernel alone offered, as every table fits HBM "
                   f"(TorchRec's enumeration of every kernel predicted to take "
                   f"{predicted:.1f} s)")
        return offered, (FUSED,)

    def _starts(self, space: SearchSpace, task: ShardingTask, deadline: float,
                notes: list[str]) -> list[float]:
        """The fitting cache start, and TorchRec's default when that is larger; the default
        alone when the fitting start cannot be searched in time."""
        enumerator, _, options = space.options(DEFAULT_CACHE_LOAD_FACTOR)
        room = _START_FILL * float(task.device_arrays.hbm_capacity.sum())
        if largest_hbm(options) <= room:  # every start fits: the fitting one is the default
            return [DEFAULT_CACHE_LOAD_FACTOR]
        left = deadline - self.clock()
        if left < 2 * space.enumerate_s + MIN_START_S:
            _note(notes, f"time limit: the fitting cache start not searched ({left:.1f} s "
                       f"left), planned from TorchRec's default {DEFAULT_CACHE_LOAD_FACTOR}")
            return [DEFAULT_CACHE_LOAD_FACTOR]
        fit = fitting_cache_load_factor(enumerator, space.module, space.sharders, task,
                                        options)
        return [fit] + ([DEFAULT_CACHE_LOAD_FACTOR] if fit < DEFAULT_CACHE_LOAD_FACTOR else [])

    def _proposers(self, deadline: float, notes: list[str], enumerate_s: float = 0.0,
                   kernels: tuple[str, ...] = PLANNED_KERNELS) -> list[Any]:
        """TorchRec's default proposers, plus its cache-size search when it has statistics
        and a cached kernel is offered (``kernels``); one left out is said in ``notes``.

        Under a time limit the cache-size search comes first (its first proposal, the fitting
        start, fits where any does), and is left out when less is left than
        :data:`MIN_START_S` or than the options' enumeration took (``enumerate_s``: loading
        the search copies the options, and each of its proposals prices them again)."""
        from torchrec.distributed.planner.proposers import (
            EmbeddingOffloadScaleupProposer,
            GreedyProposer,
            GridSearchProposer,
            UniformProposer,
        )

        proposers = [GridSearchProposer(), GreedyProposer(), GreedyProposer(use_depth=False),
                     UniformProposer()]
        if not self.use_stats or FUSED_UVM_CACHING not in kernels:
            return proposers
        if math.isinf(deadline):
            return [*proposers, EmbeddingOffloadScaleupProposer()]
        left = deadline - self.clock()
        if left < max(MIN_START_S, enumerate_s):
            _note(notes, f"time limit: TorchRec's cache-size search not run ({left:.1f} s "
                  f"left)")
            return proposers
        return [EmbeddingOffloadScaleupProposer(), *proposers]


def _fits_hbm_whole(task: ShardingTask) -> bool:
    """Whether every table fits the smallest device's HBM whole, and all of them
    :data:`_START_FILL` of the cluster's (with the task's reservation): HBM alone holds a plan,
    so TorchRec's estimator rates no host-memory kernel above ``fused``."""
    a, d = task.table_arrays, task.device_arrays
    table_bytes = a.rows * a.memory_bytes_per_row
    return bool(table_bytes.max() <= _START_FILL * float(d.hbm_capacity.min())
                and table_bytes.sum() <= _START_FILL * float(d.hbm_capacity.sum()))


def _note(notes: list[str], note: str) -> None:
    """Adds ``note`` to ``notes`` and logs it as a warning."""
    notes.append(note)
    _log.warning("torchrec: %s", note)


def _rating(sharding_plan: Any, task: ShardingTask, pipeline: str) -> float:
    """TorchRec's rating of its plan: its perf estimate of the slowest rank, ms."""
    from autoshard.torchrec.estimate import estimate_shardings

    module_plan = sharding_plan.get_plan_for_module("")
    return estimate_shardings([from_parameter_sharding(t.name, module_plan[t.name], t.rows,
                                                       t.dim, data_type(t))
                               for t in task.tables], task, pipeline=pipeline).step_ms


def fitting_cache_load_factor(enumerator: Any, module: Any, sharders: list[Any],
                              task: ShardingTask, options: list[Any] | None = None) -> float:
    """The largest cache load factor, up to TorchRec's default, at which the cache-size search's
    starting plan (every table on its best-rated cached option) fits the cluster's HBM under
    TorchRec's own storage estimate, with room to partition.

    ``enumerator`` enumerates at TorchRec's default load factor (``options``: what it
    enumerated, left unchanged); the starting plan's HBM is affine in the load factor
    (TorchRec's own model for its cache search), so two estimates give it. A small positive
    factor when even the buffers leave no room.
    """
    from torchrec.distributed.planner.proposers import EmbeddingOffloadScaleupProposer

    proposer = EmbeddingOffloadScaleupProposer()  # its starting proposal is a copy
    proposer.load(options if options is not None else enumerator.enumerate(module, sharders),
                  enumerator)
    start = proposer.starting_proposal
    high = sum(o.total_storage.hbm for o in start)
    room = _START_FILL * float(task.device_arrays.hbm_capacity.sum())
    if high <= room:
        return DEFAULT_CACHE_LOAD_FACTOR
    cached = [o for o in start if o.compute_kernel == FUSED_UVM_CACHING]
    for o in cached:
        o.cache_params.load_factor = _TINY_CACHE
    enumerator.populate_estimates(cached)
    low = sum(o.total_storage.hbm for o in start)
    if high <= low:
        return DEFAULT_CACHE_LOAD_FACTOR
    clf = _TINY_CACHE + (room - low) / (high - low) * (DEFAULT_CACHE_LOAD_FACTOR - _TINY_CACHE)
    return float(min(max(clf, _TINY_CACHE), DEFAULT_CACHE_LOAD_FACTOR))


def convert_plan(sharding_plan: Any, task: ShardingTask, sharder: str = "torchrec") -> Plan:
    """Our plan of TorchRec's ShardingPlan, shard by shard (:func:`to_plan`).

    Raises:
        PlannerError: A table is missing, or has a sharding type or kernel our plans cannot
            hold.
    """
    module_plan = sharding_plan.get_plan_for_module("") or {}
    shardings = []
    for t in task.tables:
        if t.name not in module_plan:
            raise PlannerError("torchrec", f"TorchRec's plan leaves table '{t.name}' out")
        shardings.append(from_parameter_sharding(t.name, module_plan[t.name], t.rows, t.dim,
                                                 data_type(t)))
    return to_plan(shardings, task, sharder)

