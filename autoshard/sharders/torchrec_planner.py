"""TorchRec's EmbeddingShardingPlanner as a sharder, its plan converted exactly into ours.

The planner runs on a simulated topology (no GPU, no process group) over a meta-device
EmbeddingBagCollection of the task's tables, configured as its users configure it at full
strength: every sharding type our plans can hold (``table_wise``, ``row_wise``,
``table_row_wise``, ``column_wise``, ``table_column_wise``), every compute kernel (``fused``,
``fused_uvm_caching``, ``fused_uvm``), TorchRec's default proposers plus its cache-size search
(``EmbeddingOffloadScaleupProposer``, given our access curves as cache statistics) and its own
storage estimate of every shard. The cache search starts from a load factor whose caches fit
the cluster's HBM (TorchRec's default 0.2 when that fits), so that big tables get an HBM cache
instead of falling back to host memory whole.

Our statistics go where TorchRec takes them: lookups per sample (pooling factor x coverage) as
pooling factors, the access curve as cache statistics, the profile's bandwidths and capacities
into the topology, the optimizer state into its storage estimate
(:mod:`autoshard.torchrec_estimate`). The plan converts shard by shard: row ranges, column
blocks and ranks as TorchRec placed them, a cache of load factor f over a shard of n rows as its
round(f * n) hottest rows in HBM. The same evaluator then prices it with our cost model.
"""

from __future__ import annotations

from typing import Any, ClassVar

from autoshard.cost import CostModel
from autoshard.errors import PlannerError
from autoshard.export_torchrec import (
    DEFAULT_CACHE_LOAD_FACTOR,
    FUSED,
    FUSED_UVM,
    FUSED_UVM_CACHING,
    SHARDING_TYPES,
    from_parameter_sharding,
    meta_collection,
    to_plan,
    torchrec_unavailable,
)
from autoshard.plan import Plan
from autoshard.tables import Table
from autoshard.task import ShardingTask

#: Share of the cluster's HBM the starting caches may fill, leaving the partitioner room.
_START_FILL = 0.9
_TINY_CACHE = 1e-3  # the smallest starting load factor tried


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
        time_limit: Seconds for TorchRec's proposal search (its planner's ``timeout_seconds``),
            shared by the starting points; enumerating the options is not bounded by it.

    After :meth:`shard`, ``last_sharding_plan`` holds TorchRec's own ShardingPlan,
    ``last_cache_load_factor`` the starting load factor it came from and ``last_rating_ms``
    TorchRec's perf estimate of its slowest rank.
    """

    name: ClassVar[str] = "torchrec"
    summary: ClassVar[str] = ("TorchRec's EmbeddingShardingPlanner, every sharding type, cache "
                              "search, converted")

    def __init__(self, cache_load_factor: float | None = None, use_stats: bool = True,
                 sharding_types: tuple[str, ...] = SHARDING_TYPES,
                 time_limit: float | None = None) -> None:
        self.cache_load_factor = cache_load_factor
        self.time_limit = time_limit
        self.use_stats = use_stats
        self.sharding_types = tuple(sharding_types)
        self.last_sharding_plan: Any = None
        self.last_cache_load_factor: float | None = None
        self.last_rating_ms: float | None = None

    @classmethod
    def unavailable(cls) -> str | None:
        return torchrec_unavailable()

    def shard(self, task: ShardingTask, cost_model: CostModel) -> Plan:
        reason = torchrec_unavailable(load=True)
        if reason:
            raise PlannerError("unavailable", reason)
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
        from torchrec.distributed.planner.storage_reservations import (
            FixedPercentageStorageReservation,
        )
        from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError

        from autoshard.torchrec_estimate import (
            declare_optimizers,
            per_rank_batch,
            quiet_torchrec,
            torchrec_constraints,
            torchrec_estimators,
            torchrec_topology,
        )

        ebc = meta_collection([(t.name, t.rows, t.dim, _data_type(t)) for t in task.tables])
        if task.workload.train:
            declare_optimizers(ebc, task.tables)
        sharders = [EmbeddingBagCollectionSharder()]
        with quiet_torchrec():
            topology = torchrec_topology(task)

            def enumerator(clf: float) -> Any:
                constraints = torchrec_constraints(
                    task, self.use_stats, cache_load_factor=clf,
                    sharding_types=list(self.sharding_types),
                    compute_kernels=[FUSED, FUSED_UVM_CACHING, FUSED_UVM])
                return EmbeddingEnumerator(
                    topology, per_rank_batch(task), constraints,
                    estimator=torchrec_estimators(task, topology, constraints)), constraints

            starts: list[float] = []
            if self.cache_load_factor is not None:
                starts = [self.cache_load_factor]
            else:
                fit = fitting_cache_load_factor(enumerator(DEFAULT_CACHE_LOAD_FACTOR)[0], ebc,
                                                sharders, task)
                starts = [fit] + ([DEFAULT_CACHE_LOAD_FACTOR]
                                  if fit < DEFAULT_CACHE_LOAD_FACTOR else [])
            best: tuple[float, float, Any] | None = None
            timeout = (None if self.time_limit is None
                       else max(1, int(self.time_limit / len(starts))))
            for clf in starts:
                chosen, constraints = enumerator(clf)
                try:
                    planner = EmbeddingShardingPlanner(
                        topology=topology, batch_size=per_rank_batch(task), enumerator=chosen,
                        constraints=constraints,
                        storage_reservation=FixedPercentageStorageReservation(0.0),
                        proposer=self._proposers(), debug=False, timeout_seconds=timeout)
                    plan = planner.plan(ebc, sharders)
                except TorchRecPlannerError as exc:
                    if best is None and clf == starts[-1]:
                        raise PlannerError("torchrec", f"TorchRec's planner found no plan for "
                                           f"{task.num_tables} tables on {task.num_devices} "
                                           f"devices: {str(exc).splitlines()[0]}") from exc
                    continue
                rating = _rating(plan, task)
                if best is None or rating < best[0]:
                    best = (rating, clf, plan)
        assert best is not None
        self.last_rating_ms, self.last_cache_load_factor, self.last_sharding_plan = best
        return convert_plan(self.last_sharding_plan, task, self.name)

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


def _rating(sharding_plan: Any, task: ShardingTask) -> float:
    """TorchRec's rating of its plan: its perf estimate of the slowest rank, ms."""
    from autoshard.torchrec_estimate import estimate_shardings

    module_plan = sharding_plan.get_plan_for_module("")
    return estimate_shardings([from_parameter_sharding(t.name, module_plan[t.name], t.rows,
                                                       t.dim, _data_type(t))
                               for t in task.tables], task).step_ms


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
                                                 _data_type(t)))
    return to_plan(shardings, task, sharder)


def _data_type(table: Table) -> str:
    return {4: "FP32", 2: "FP16", 1: "INT8"}.get(table.bytes_per_element, "FP32")
