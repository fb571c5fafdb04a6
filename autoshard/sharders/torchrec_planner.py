"""TorchRec's EmbeddingShardingPlanner as a sharder, its plan converted into ours.

The planner runs on a simulated topology (no GPU, no process group) over a meta-device
EmbeddingBagCollection of the task's tables, restricted to table-wise sharding so that the
conversion is exact (:mod:`autoshard.export_torchrec`): ``fused`` keeps all rows in HBM,
``fused_uvm`` none, ``fused_uvm_caching`` the cache load factor's share of rows. Our statistics go
where TorchRec takes them: lookups per sample (pooling factor x coverage) as pooling factors, the
access curve as cache statistics (expected miss rate of a cache of the hottest rows), the
profile's bandwidths and capacities into the topology, the optimizer state into its storage
estimate. The same evaluator then prices the plan with our cost model.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, ClassVar

import numpy as np

from autoshard.cost import CostModel
from autoshard.errors import PlannerError, gib
from autoshard.export_torchrec import (
    FUSED,
    FUSED_UVM,
    FUSED_UVM_CACHING,
    TableSharding,
    meta_collection,
    torchrec_unavailable,
)
from autoshard.plan import Plan, memory_use
from autoshard.tables import Table
from autoshard.task import ShardingTask

_BYTES_PER_MS_PER_GBPS = 1e6  # 1 GB/s = 1e9 bytes/s = 1e6 bytes/ms (TorchRec's unit)


class TorchRecSharder:
    """TorchRec's planner (table-wise, fused / fused_uvm / fused_uvm_caching kernels).

    Args:
        cache_load_factor: Share of rows TorchRec caches in HBM for ``fused_uvm_caching``
            (TorchRec's default is 0.2).
        use_stats: Pass the access curves as cache statistics.

    After :meth:`shard`, ``last_sharding_plan`` holds TorchRec's own ShardingPlan and
    ``last_repaired`` the devices whose HBM it overfilled under our memory model (their cached
    rows were scaled down to fit), normally none.
    """

    name: ClassVar[str] = "torchrec"
    summary: ClassVar[str] = "TorchRec's EmbeddingShardingPlanner, table-wise, converted"

    def __init__(self, cache_load_factor: float = 0.2, use_stats: bool = True) -> None:
        self.cache_load_factor = cache_load_factor
        self.use_stats = use_stats
        self.last_repaired: list[int] = []
        self.last_sharding_plan: Any = None

    @classmethod
    def unavailable(cls) -> str | None:
        return torchrec_unavailable()

    def shard(self, task: ShardingTask, cost_model: CostModel) -> Plan:
        reason = torchrec_unavailable(load=True)
        if reason:
            raise PlannerError("unavailable", reason)
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner
        from torchrec.distributed.planner.storage_reservations import (
            FixedPercentageStorageReservation,
        )
        from torchrec.distributed.planner.types import PlannerError as TorchRecPlannerError

        ebc = meta_collection([(t.name, t.rows, t.dim, _data_type(t)) for t in task.tables])
        if task.workload.train:
            _declare_optimizers(ebc, task)
        quiet = logging.getLogger("torchrec")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            planner = EmbeddingShardingPlanner(
                topology=_topology(task),
                batch_size=max(task.workload.batch_size // task.num_devices, 1),
                constraints={t.name: self._constraints(t, task) for t in task.tables},
                storage_reservation=FixedPercentageStorageReservation(0.0),
                proposer=self._proposers(), debug=False)
            plan = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
        except TorchRecPlannerError as exc:
            raise PlannerError("torchrec", f"TorchRec's planner found no plan for "
                               f"{task.num_tables} tables on {task.num_devices} devices: "
                               f"{str(exc).splitlines()[0]}") from exc
        finally:
            quiet.setLevel(level)
        self.last_sharding_plan = plan
        device, rows = self._convert(plan, task)
        return Plan.from_arrays(task, device, rows, self.name)

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

    def _constraints(self, table: Table, task: ShardingTask) -> Any:
        from torchrec.distributed.planner import ParameterConstraints
        from torchrec.distributed.types import CacheParams

        stats = _curve_stats(table, task.workload.batch_size) if self.use_stats else None
        return ParameterConstraints(
            sharding_types=["table_wise"], compute_kernels=[FUSED, FUSED_UVM_CACHING, FUSED_UVM],
            pooling_factors=[table.lookups_per_sample],
            cache_params=CacheParams(load_factor=self.cache_load_factor, stats=stats))

    def _convert(self, plan: Any, task: ShardingTask) -> tuple[np.ndarray, np.ndarray]:
        """Device and HBM rows per table from TorchRec's plan, scaled to fit our HBM."""
        module_plan = plan.get_plan_for_module("")
        device = np.zeros(task.num_tables, dtype=np.int64)
        rows = np.zeros(task.num_tables, dtype=np.int64)
        for i, t in enumerate(task.tables):
            ps = module_plan[t.name]
            if ps.sharding_type != "table_wise" or ps.compute_kernel not in (
                    FUSED, FUSED_UVM, FUSED_UVM_CACHING):
                raise PlannerError("torchrec", f"table '{t.name}': TorchRec chose "
                                   f"{ps.sharding_type} / {ps.compute_kernel}, not convertible")
            clf = None
            if ps.compute_kernel == FUSED_UVM_CACHING:
                clf = getattr(ps.cache_params, "load_factor", None) or self.cache_load_factor
            one = TableSharding(t.name, t.rows, t.dim, _data_type(t), int(ps.ranks[0]),
                                ps.compute_kernel, clf)
            device[i], rows[i] = one.rank, one.hbm_rows
        rows, self.last_repaired = _fit_hbm(task, device, rows)
        _, host = memory_use(task, device, rows)
        over = np.flatnonzero(host > task.device_arrays.host_capacity)
        if over.size:
            d = int(over[0])
            raise PlannerError("capacity", f"TorchRec's plan puts {gib(host[d])} in device {d}'s "
                               f"host memory of {gib(task.device_arrays.host_capacity[d])}")
        return device, rows


def _data_type(table: Table) -> str:
    return {4: "FP32", 2: "FP16", 1: "INT8"}.get(table.bytes_per_element, "FP32")


def _topology(task: ShardingTask) -> Any:
    """TorchRec's Topology of the profile: per-device HBM and host capacity (the smallest device,
    as TorchRec's caps are uniform), HBM and host-link bandwidths, node size and links."""
    from torchrec.distributed.planner import Topology

    dev = task.device_arrays
    hw = task.hardware
    host_bw = float(dev.host_gbps.min()) * _BYTES_PER_MS_PER_GBPS
    return Topology(
        world_size=task.num_devices, compute_device="cuda",
        hbm_cap=int(dev.hbm_capacity.min()), ddr_cap=int(dev.host_capacity.min()),
        local_world_size=min(hw.devices_per_node, task.num_devices),
        hbm_mem_bw=float(dev.hbm_gbps.min()) * _BYTES_PER_MS_PER_GBPS,
        ddr_mem_bw=host_bw, hbm_to_ddr_mem_bw=host_bw,
        intra_host_bw=hw.intra_node_gbps * _BYTES_PER_MS_PER_GBPS,
        inter_host_bw=hw.inter_node_gbps * _BYTES_PER_MS_PER_GBPS)


def _declare_optimizers(ebc: Any, task: ShardingTask) -> None:
    """Tells TorchRec's storage estimate about the optimizer state our memory model counts:
    one element per row is row-wise Adagrad, one row's worth Adagrad, two Adam."""
    import torch
    from torchrec.optim import RowWiseAdagrad

    for t in task.tables:
        extra = t.optimizer_bytes_per_row / max(t.row_bytes, 1)
        if t.optimizer_bytes_per_row == 0:
            continue
        if t.optimizer_bytes_per_row <= t.bytes_per_element:
            cls: type = RowWiseAdagrad
        elif extra <= 1.0:
            cls = torch.optim.Adagrad
        else:
            cls = torch.optim.Adam
        ebc.embedding_bags[t.name].weight._optimizer_classes = [cls]


def _fit_hbm(task: ShardingTask, device: np.ndarray,
             rows: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Scales down HBM rows on devices whose HBM the plan overfills under our memory model."""
    hbm, _ = memory_use(task, device, rows)
    cap = task.device_arrays.hbm_capacity
    repaired = [int(d) for d in np.flatnonzero(hbm > cap)]
    rows = rows.copy()
    for d in repaired:
        on = device == d
        rows[on] = np.floor(rows[on] * (cap[d] / hbm[d]) * (1 - 1e-9)).astype(np.int64)
    return rows, repaired


def _curve_stats(table: Table, batch_size: int) -> Any:
    """TorchRec cache statistics of one table from its access curve: a cache of the hottest
    ``clf`` share of rows misses the rest of the lookups."""
    return _stats_class()(table, batch_size)


@functools.cache
def _stats_class() -> type:
    from torchrec.distributed.types import CacheStatistics

    class CurveStats(CacheStatistics):
        def __init__(self, table: Table, batch_size: int) -> None:
            curve = table.access_curve()
            self._curve = curve
            used = curve.used_fraction * table.rows
            self._lookups = float(min(used, table.lookups_per_sample * batch_size))
            # Area under the miss-rate curve over the cache load factor: 0 = caches perfectly.
            grid = np.linspace(0.0, 1.0, 101)
            self._cacheability = float(np.mean(1.0 - curve.share_at(grid)))

        @property
        def expected_lookups(self) -> float:
            return self._lookups

        def expected_miss_rate(self, clf: float) -> float:
            return float(1.0 - self._curve.share_at(min(max(clf, 0.0), 1.0)))

        @property
        def cacheability(self) -> float:
            return self._cacheability

    return CurveStats
