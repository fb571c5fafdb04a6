"""TorchRec's EmbeddingShardingPlanner as a sharder, its plan converted exactly into ours.

The planner runs on a simulated topology (no GPU, no process group) over a meta-device
EmbeddingBagCollection of the task's tables, configured as its users configure it at full
strength: every sharding type our plans can hold (``table_wise``, ``row_wise``,
``table_row_wise``, ``column_wise``, ``table_column_wise``), every compute kernel (``fused``,
``fused_uvm_caching``, ``fused_uvm``), TorchRec's default proposers plus its cache-size search
(``EmbeddingOffloadScaleupProposer``, given our access curves as cache statistics) and its own
storage estimate of every shard. The cache search starts from a load factor whose caches fit
the cluster's HBM (TorchRec's default 0.2 when that fits), so that big tables get an HBM cache
instead of falling back to host memory whole. On large tasks (more than
:data:`FULL_STRENGTH_CELLS` tables x devices) only the dominant tables (dearer whole than the
per-device mean, :func:`autoshard.splitting.dominant_tables`) are offered the split types, the
others ``table_wise``, as a user planning a large model constrains them: TorchRec enumerates a
row-wise option as one shard per rank, so otherwise its options grow with tables x devices.

Our statistics go where TorchRec takes them: lookups per sample (pooling factor x coverage) as
pooling factors, the access curve as cache statistics, the profile's bandwidths and capacities
into the topology, the optimizer state into its storage estimate
(:mod:`autoshard.torchrec.estimate`). The plan converts shard by shard: row ranges, column
blocks and ranks as TorchRec placed them, a cache of load factor f over a shard of n rows as its
round(f * n) hottest rows in HBM. The same evaluator then prices it with our cost model.
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

from autoshard.cost import CostModel
from autoshard.errors import PlannerError
from autoshard.plan import Plan
from autoshard.splitting import dominant_tables
from autoshard.task import ShardingTask
from autoshard.torchrec import torchrec_unavailable
from autoshard.torchrec.export import meta_collection
from autoshard.torchrec.mapping import (
    DEFAULT_CACHE_LOAD_FACTOR,
    FUSED,
    FUSED_UVM,
    FUSED_UVM_CACHING,
    SHARDING_TYPES,
    WHOLE_TYPE,
    data_type,
)
from autoshard.torchrec.shardings import from_parameter_sharding, to_plan

#: Share of the cluster's HBM the starting caches may fill, leaving the partitioner room.
_START_FILL = 0.9
_TINY_CACHE = 1e-3  # the smallest starting load factor tried
#: Tasks of up to this many tables x devices offer every table every sharding type; larger ones
#: offer the split types only to dominant tables (:func:`offered_sharding_types`).
FULL_STRENGTH_CELLS = 4096
_log = logging.getLogger(__name__)
_FIRST_START_SHARE = 0.75  # of the time limit, for the fitting cache start of two


def offered_sharding_types(task: ShardingTask, cost_model: CostModel,
                           sharding_types: tuple[str, ...] = SHARDING_TYPES,
                           full_strength_cells: int = FULL_STRENGTH_CELLS
                           ) -> dict[str, list[str]]:
    """The sharding types TorchRec may choose per table, as a user planning a large model
    constrains them.

    Up to ``full_strength_cells`` tables x devices, every table gets every type. Above it, a
    table gets the split types only when it is dominant (it costs more whole than the
    per-device mean of the least work, :func:`autoshard.splitting.dominant_tables`); the others
    get ``table_wise`` alone. TorchRec enumerates a row-wise option as one shard per rank, so
    without this the options grow with tables x devices and the search with them.
    """
    types = list(sharding_types)
    if task.num_tables * task.num_devices <= full_strength_cells or WHOLE_TYPE not in types:
        return {t.name: types for t in task.tables}
    heavy = dominant_tables(task, cost_model)
    return {t.name: types if heavy[i] else [WHOLE_TYPE] for i, t in enumerate(task.tables)}


class _SearchSpace:
    """The meta-device module, topology and per-table constraints TorchRec plans over."""

    def __init__(self, task: ShardingTask, offered: dict[str, list[str]],
                 use_stats: bool, pipeline: str) -> None:
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

        from autoshard.torchrec.estimate import declare_optimizers, torchrec_topology

        self.task, self.offered, self.use_stats = task, offered, use_stats
        self.pipeline = pipeline
        self.module = meta_collection([(t.name, t.rows, t.dim, data_type(t))
                                       for t in task.tables])
        if task.workload.train:
            declare_optimizers(self.module, task.tables)
        self.sharders = [EmbeddingBagCollectionSharder()]
        self.topology = torchrec_topology(task)

    def enumerator(self, clf: float) -> tuple[Any, dict[str, Any]]:
        """TorchRec's enumerator at starting cache load factor ``clf``, and its constraints."""
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

        from autoshard.torchrec.estimate import (
            per_rank_batch,
            torchrec_constraints,
            torchrec_estimators,
        )

        constraints = torchrec_constraints(self.task, self.use_stats, pipeline=self.pipeline,
                                           cache_load_factor=clf,
                                           compute_kernels=[FUSED, FUSED_UVM_CACHING, FUSED_UVM])
        for name, c in constraints.items():
            c.sharding_types = list(self.offered[name])
        return EmbeddingEnumerator(
            self.topology, per_rank_batch(self.task), constraints,
            estimator=torchrec_estimators(self.task, self.topology, constraints,
                                          self.pipeline)), constraints


class TorchRecSharder:
    """TorchRec's planner at full strength: all sharding types and kernels, cache-size search.

    Args:
        cache_load_factor: Starting cache load factor for ``fused_uvm_caching``; ``None``
            plans from the largest up to TorchRec's default 0.2 whose caches fit the cluster's
            HBM, and also from 0.2 when that is larger, and keeps the plan TorchRec rates
            best.
        use_stats: Pass the access curves as cache statistics (and run the cache-size search).
        sharding_types: Sharding types TorchRec may choose (default: all it has that our plans
            hold).
        time_limit: Seconds for the whole run, enumeration included: what is left when a
            starting point begins (three quarters of it for the fitting start of two) bounds
            TorchRec's proposal search there (its planner's ``timeout_seconds``); a start left
            with under a second is skipped, keeping the best plan so far, and said so in
            ``last_notes``.
        full_strength_cells: Tasks of more tables x devices than this offer the split sharding
            types to dominant tables only (:func:`offered_sharding_types`), bounding the
            options.
        pipeline: The TorchRec training pipeline the plan is for (``"none"``, TorchRec's
            default, or ``"prefetch"``: caches prefetched, priced and sized as TorchRec's
            prefetch pipeline, :mod:`autoshard.torchrec.estimate`); None: the one the task's
            reservation keeps HBM for.

    After :meth:`shard`, ``last_sharding_plan`` holds TorchRec's own ShardingPlan,
    ``last_cache_load_factor`` the starting load factor it came from and ``last_rating_ms``
    TorchRec's perf estimate of its slowest rank.
    """

    name: ClassVar[str] = "torchrec"
    summary: ClassVar[str] = ("TorchRec's EmbeddingShardingPlanner, every sharding type, cache "
                              "search, converted")

    def __init__(self, cache_load_factor: float | None = None, use_stats: bool = True,
                 sharding_types: tuple[str, ...] = SHARDING_TYPES,
                 time_limit: float | None = None,
                 full_strength_cells: int = FULL_STRENGTH_CELLS,
                 pipeline: str | None = None) -> None:
        from autoshard.torchrec.reservation import check_pipeline

        self.pipeline = None if pipeline is None else check_pipeline(pipeline)
        self.full_strength_cells = full_strength_cells
        self.cache_load_factor = cache_load_factor
        self.time_limit = time_limit
        self.use_stats = use_stats
        self.sharding_types = tuple(sharding_types)
        self.last_sharding_plan: Any = None
        self.last_cache_load_factor: float | None = None
        self.last_rating_ms: float | None = None
        self.last_notes: list[str] = []

    @classmethod
    def unavailable(cls) -> str | None:
        return torchrec_unavailable()

    def shard(self, task: ShardingTask, cost_model: CostModel) -> Plan:
        reason = torchrec_unavailable(load=True)
        if reason:
            raise PlannerError("unavailable", reason)
        from torchrec.distributed.planner import EmbeddingShardingPlanner
        from torchrec.distributed.planner.storage_reservations import (
            FixedPercentageStorageReservation,
        )
        from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError

        from autoshard.torchrec.estimate import per_rank_batch, quiet_torchrec, task_pipeline

        began = time.monotonic()
        self.last_notes = []
        pipeline = task_pipeline(task, self.pipeline)
        space = _SearchSpace(task, self._offered(task, cost_model), self.use_stats, pipeline)
        with quiet_torchrec():
            starts = ([self.cache_load_factor] if self.cache_load_factor is not None
                      else self._starts(space, task))
            best: tuple[float, float, Any] | None = None
            for i, clf in enumerate(starts):
                left = self._seconds_left(began, len(starts) - i)
                if best is not None and left is not None and left < 1:
                    self.last_notes.append(f"time limit reached: cache start {clf:.3g} not "
                                           f"tried, kept the plan from {best[1]:.3g}")
                    _log.warning("torchrec: %s", self.last_notes[-1])
                    break
                chosen, constraints = space.enumerator(clf)
                try:
                    planner = EmbeddingShardingPlanner(
                        topology=space.topology, batch_size=per_rank_batch(task),
                        enumerator=chosen, constraints=constraints,
                        storage_reservation=FixedPercentageStorageReservation(0.0),
                        proposer=self._proposers(), debug=False,
                        timeout_seconds=None if left is None else max(1, int(left)))
                    plan = planner.plan(space.module, space.sharders)
                except TorchRecPlannerError as exc:
                    if best is None and clf == starts[-1]:
                        raise PlannerError("torchrec", f"TorchRec's planner found no plan for "
                                           f"{task.num_tables} tables on {task.num_devices} "
                                           f"devices: {str(exc).splitlines()[0]}") from exc
                    continue
                rating = _rating(plan, task, pipeline)
                if best is None or rating < best[0]:
                    best = (rating, clf, plan)
        assert best is not None
        self.last_rating_ms, self.last_cache_load_factor, self.last_sharding_plan = best
        return convert_plan(self.last_sharding_plan, task, self.name)

    def search_space(self, task: ShardingTask, cost_model: CostModel,
                     cache_load_factor: float = DEFAULT_CACHE_LOAD_FACTOR) -> list[Any]:
        """TorchRec's enumerated sharding options for ``task``, as :meth:`shard` offers them."""
        from autoshard.torchrec.estimate import quiet_torchrec, task_pipeline

        space = _SearchSpace(task, self._offered(task, cost_model), self.use_stats,
                             task_pipeline(task, self.pipeline))

        with quiet_torchrec():
            return list(space.enumerator(cache_load_factor)[0].enumerate(space.module,
                                                                         space.sharders))

    def _offered(self, task: ShardingTask, cost_model: CostModel) -> dict[str, list[str]]:
        return offered_sharding_types(task, cost_model, self.sharding_types,
                                      self.full_strength_cells)

    def _starts(self, space: _SearchSpace, task: ShardingTask) -> list[float]:
        """The fitting cache start, and TorchRec's default when that is larger."""
        fit = fitting_cache_load_factor(space.enumerator(DEFAULT_CACHE_LOAD_FACTOR)[0],
                                        space.module, space.sharders, task)
        return [fit] + ([DEFAULT_CACHE_LOAD_FACTOR] if fit < DEFAULT_CACHE_LOAD_FACTOR else [])

    def _seconds_left(self, began: float, starts_left: int) -> float | None:
        """This start's share of what is left of ``time_limit`` (``None``: no limit): the first
        of two starts (the one whose caches fit) gets most of it."""
        if self.time_limit is None:
            return None
        left = self.time_limit - (time.monotonic() - began)
        return left if starts_left == 1 else left * _FIRST_START_SHARE

    def _proposers(self) -> list[Any]:
        """TorchRec's default proposers, plus its cache-size search when it has statistics."""
        from torchrec.distributed.planner.proposers import (
            EmbeddingOffloadScaleupProposer,
            GreedyProposer,
            GridSearchProposer,
            UniformProposer,
        )

        proposers = [GridSearchProposer(), GreedyProposer(), GreedyProposer(use_depth=False),
                     UniformProposer()]
        if self.use_stats:
            proposers.append(EmbeddingOffloadScaleupProposer())
        return proposers


def _rating(sharding_plan: Any, task: ShardingTask, pipeline: str) -> float:
    """TorchRec's rating of its plan: its perf estimate of the slowest rank, ms."""
    from autoshard.torchrec.estimate import estimate_shardings

    module_plan = sharding_plan.get_plan_for_module("")
    return estimate_shardings([from_parameter_sharding(t.name, module_plan[t.name], t.rows,
                                                       t.dim, data_type(t))
                               for t in task.tables], task, pipeline=pipeline).step_ms


def fitting_cache_load_factor(enumerator: Any, module: Any, sharders: list[Any],
                              task: ShardingTask) -> float:
    """The largest cache load factor, up to TorchRec's default, at which the cache-size search's
    starting plan (every table on its best-rated cached option) fits the cluster's HBM under
    TorchRec's own storage estimate, with room to partition.

    ``enumerator`` enumerates at TorchRec's default load factor; the starting plan's HBM is
    affine in the load factor (TorchRec's own model for its cache search), so two estimates
    give it. A small positive factor when even the buffers leave no room.
    """
    from torchrec.distributed.planner.proposers import EmbeddingOffloadScaleupProposer

    proposer = EmbeddingOffloadScaleupProposer()
    proposer.load(enumerator.enumerate(module, sharders), enumerator)
    start = proposer.starting_proposal
    cached = [o for o in start if o.compute_kernel == FUSED_UVM_CACHING]
    high = sum(o.total_storage.hbm for o in start)
    for o in cached:
        o.cache_params.load_factor = _TINY_CACHE
    enumerator.populate_estimates(cached)
    low = sum(o.total_storage.hbm for o in start)
    room = _START_FILL * float(task.device_arrays.hbm_capacity.sum())
    if high <= room or high <= low:
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

