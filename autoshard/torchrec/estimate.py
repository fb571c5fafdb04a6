"""A plan priced and sized by TorchRec's own estimators, on the same topology.

TorchRec's planner rates a plan with ``EmbeddingPerfEstimator`` (per shard: forward and
backward compute, input and output communication, cache prefetch; a rank's figure is the sum
over its shards, the plan's the maximum over ranks) and sizes it with
``EmbeddingStorageEstimator`` (per shard: weights, optimizer state, cache, cache bookkeeping and
I/O buffers). Here any plan, splits included, goes through both: its tables become TorchRec
``ShardingOption`` objects with our shards, ranks, kernels and cache load factors, TorchRec's
estimators fill in each shard's perf and storage, and the result is summed per rank.

What TorchRec is told is what its planner is told when it plans the same task (the
``torchrec`` sharder): the profile's bandwidths and capacities as its Topology, lookups per
sample as pooling factors, the access curves as cache statistics, the optimizer state as the
tables' optimizer class. Needs the ``torchrec`` extra.

TorchRec prices an HBM cache (``fused_uvm_caching``) by the training pipeline it runs in
(``pipeline``):

- ``"none"`` (TorchRec's default): each lookup at a bandwidth blended by the cache's load
  factor, (f x HBM + (1 - f) x host link) / 10, whatever the lookups' skew; storage counts
  one input and one output buffer per shard.
- ``"prefetch"`` (TorchRec's prefetch pipeline, ``CacheParams.prefetch_pipeline`` and
  ``PipelineType.TRAIN_PREFETCH_SPARSE_DIST``): lookups at HBM bandwidth, plus the prefetch of
  the expected misses (miss rate at the load factor, from the cache statistics, x unique
  lookups) over the host link; storage counts three input buffers and seven prefetch buffers
  per cached shard. This is the pricing that reads the skew of the access curves, as our
  model does.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoshard.errors import PlannerError
from autoshard.layout.plan import Plan
from autoshard.tables import Table
from autoshard.task import ShardingTask
from autoshard.torchrec import torchrec_unavailable
from autoshard.torchrec.export import meta_collection
from autoshard.torchrec.mapping import FUSED_UVM_CACHING
from autoshard.torchrec.runtime_memory import check_pipeline, pipeline_of
from autoshard.torchrec.shardings import TableSharding, table_shardings

_BYTES_PER_MS_PER_GBPS = 1e6  # 1 GB/s = 1e9 bytes/s = 1e6 bytes/ms (TorchRec's unit)


def task_pipeline(task: ShardingTask, pipeline: str | None = None) -> str:
    """``pipeline`` checked, or (None) the one the task's reservation keeps HBM for."""
    return pipeline_of(task.reservation) if pipeline is None else check_pipeline(pipeline)


@dataclass(frozen=True)
class RankEstimate:
    """TorchRec's figures for one rank: perf (ms) and storage (bytes) against its caps."""

    rank: int
    perf_ms: float
    hbm_bytes: int
    ddr_bytes: int
    hbm_capacity: int
    ddr_capacity: int

    @property
    def fits(self) -> bool:
        return self.hbm_bytes <= self.hbm_capacity and self.ddr_bytes <= self.ddr_capacity


@dataclass(frozen=True)
class TableEstimate:
    """TorchRec's figures for one table: how it is sharded and its shards' perf summed (ms)."""

    table: str
    sharding_type: str
    compute_kernel: str
    cache_load_factor: float | None
    shards: int
    perf_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "sharding_type": self.sharding_type,
                "compute_kernel": self.compute_kernel,
                "cache_load_factor": self.cache_load_factor, "shards": self.shards,
                "perf_ms": self.perf_ms}


@dataclass(frozen=True)
class TorchRecEstimate:
    """A plan under TorchRec's estimators: per rank and the plan's rating (max over ranks), and
    per table (where the two estimators' figures part)."""

    per_rank: tuple[RankEstimate, ...]
    per_table: tuple[TableEstimate, ...] = ()

    @property
    def step_ms(self) -> float:
        return max(r.perf_ms for r in self.per_rank)

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.per_rank)

    @property
    def hbm_fill(self) -> float:
        """The fullest rank's HBM use over its capacity (> 1: overfilled)."""
        return max(r.hbm_bytes / max(r.hbm_capacity, 1) for r in self.per_rank)

    def to_dict(self) -> dict[str, Any]:
        return {"step_cost_ms": self.step_ms, "fits": self.fits, "hbm_fill": self.hbm_fill,
                "per_rank": [{"rank": r.rank, "perf_ms": r.perf_ms, "hbm_bytes": r.hbm_bytes,
                              "ddr_bytes": r.ddr_bytes, "hbm_capacity": r.hbm_capacity,
                              "ddr_capacity": r.ddr_capacity, "fits": r.fits}
                             for r in self.per_rank],
                "per_table": [t.to_dict() for t in self.per_table]}


def estimate_plan(plan: Plan, task: ShardingTask, use_stats: bool = True,
                  pipeline: str | None = None) -> TorchRecEstimate:
    """``plan`` priced and sized by TorchRec's estimators on the task's topology, for a run in
    TorchRec's training ``pipeline`` (:data:`autoshard.torchrec.runtime_memory.PIPELINES`; None:
    the one the task's reservation is for, :func:`autoshard.torchrec.runtime_memory.pipeline_of`).
    """
    return estimate_shardings(table_shardings(plan, task), task, use_stats, pipeline)


def estimate_shardings(shardings: Sequence[TableSharding], task: ShardingTask,
                       use_stats: bool = True, pipeline: str | None = None) -> TorchRecEstimate:
    """TorchRec's per-rank perf and storage of ``shardings`` (one per task table), for
    ``pipeline`` (as :func:`estimate_plan`)."""
    pipeline = task_pipeline(task, pipeline)
    reason = torchrec_unavailable(load=True)
    if reason:
        raise PlannerError("unavailable", reason)
    with quiet_torchrec():
        topology = torchrec_topology(task)
        constraints = torchrec_constraints(task, use_stats, pipeline=pipeline)
        options, data_map = _sharding_options(shardings, task, constraints)
        for estimator in torchrec_estimators(task, topology, constraints, pipeline):
            estimator.estimate(options, data_map)
    d = task.num_devices
    perf = np.zeros(d)
    hbm = np.zeros(d, dtype=np.int64)
    ddr = np.zeros(d, dtype=np.int64)
    tables = []
    for option in options:
        for shard in option.shards:
            perf[shard.rank] += shard.perf.total
            hbm[shard.rank] += shard.storage.hbm
            ddr[shard.rank] += shard.storage.ddr
        tables.append(TableEstimate(
            option.name, option.sharding_type, option.compute_kernel,
            option.cache_load_factor if option.compute_kernel == FUSED_UVM_CACHING else None,
            len(option.shards), float(sum(x.perf.total for x in option.shards))))
    dev = task.device_arrays
    return TorchRecEstimate(tuple(
        RankEstimate(r, float(perf[r]), int(hbm[r]), int(ddr[r]), int(dev.hbm_capacity[r]),
                     int(dev.host_capacity[r])) for r in range(d)), tuple(tables))


def _sharding_options(shardings: Sequence[TableSharding], task: ShardingTask,
                      constraints: dict[str, Any]) -> tuple[list[Any], Any]:
    by_name = {s.table: s for s in shardings}
    return sharding_options([(t, by_name[t.name]) for t in task.tables], task, constraints)


def sharding_options(entries: Sequence[tuple[Table, TableSharding]], task: ShardingTask,
                     constraints: dict[str, Any]) -> tuple[list[Any], Any]:
    """TorchRec ``ShardingOption`` objects (and the sharder data map its estimators read), one
    per (table, sharding) entry; a table may come more than once (several candidate shardings
    of it priced in one estimator call)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.enumerators import get_partition_by_type
    from torchrec.distributed.planner.types import Shard, ShardingOption
    from torchrec.distributed.planner.utils import build_sharder_data_map, sharder_name
    from torchrec.distributed.types import CacheParams

    unique = {t.name: (t, s) for t, s in entries}
    ebc = meta_collection([(s.table, s.rows, s.dim, s.data_type) for _, s in unique.values()])
    if task.workload.train:
        declare_optimizers(ebc, [t for t, _ in unique.values()])
    sharder = EmbeddingBagCollectionSharder()
    params = sharder.shardable_parameters(ebc)
    batch = per_rank_batch(task)
    options = []
    for t, s in entries:
        given = constraints[t.name].cache_params
        cache = CacheParams(load_factor=s.cache_load_factor, stats=given.stats,
                            prefetch_pipeline=given.prefetch_pipeline) if (
            s.compute_kernel == FUSED_UVM_CACHING) else None
        options.append(ShardingOption(
            name=t.name, tensor=params[t.name], module=("", ebc),
            input_lengths=[t.lookups_per_sample], batch_size=batch,
            sharding_type=s.sharding_type, partition_by=get_partition_by_type(s.sharding_type),
            compute_kernel=s.compute_kernel, cache_params=cache, is_pooled=True,
            feature_names=[t.name],
            shards=[Shard(size=[x.rows, x.cols], offset=[x.row_offset, x.col_offset],
                          rank=x.rank) for x in s.shards]))
    return options, build_sharder_data_map({sharder_name(type(ebc)): sharder})


def torchrec_estimators(task: ShardingTask, topology: Any, constraints: dict[str, Any],
                        pipeline: str = "none") -> list[Any]:
    """TorchRec's perf and storage estimators, as its planner builds them (in inference mode
    for an inference workload: no optimizer state, backward pass or training I/O buffers), the
    storage one for the training ``pipeline`` (the perf one reads it from each option's cache
    parameters, :func:`torchrec_constraints`)."""
    from torchrec.distributed.planner.shard_estimators import (
        EmbeddingPerfEstimator,
        EmbeddingStorageEstimator,
    )
    from torchrec.distributed.types import PipelineType

    infer = not task.workload.train
    kind = (PipelineType.TRAIN_PREFETCH_SPARSE_DIST if check_pipeline(pipeline) == "prefetch"
            else PipelineType.NONE)
    return [EmbeddingPerfEstimator(topology=topology, constraints=constraints,
                                   is_inference=infer),
            EmbeddingStorageEstimator(topology=topology, constraints=constraints,
                                      is_inference=infer, pipeline_type=kind)]


def per_rank_batch(task: ShardingTask) -> int:
    """TorchRec's batch size: samples per rank."""
    return max(task.workload.batch_size // task.num_devices, 1)


def torchrec_topology(task: ShardingTask) -> Any:
    """TorchRec's Topology of the profile: per-device HBM and host capacity (the smallest device,
    as TorchRec's caps are uniform), HBM and host-link bandwidths, node size and links."""
    from torchrec.distributed.planner import Topology

    dev = task.device_arrays
    hw = task.hardware
    host_bw = float(dev.host_gbps.min()) * _BYTES_PER_MS_PER_GBPS
    # The topology is simulated on purpose: it describes the profile's hardware, not the
    # devices of this machine (which may have no GPU), so it is built directly, not through
    # TopologyFactory.create_topology(), which would resolve the hardware present. TorchRec
    # warns on every such construction that "the job will fail"; planning and estimating do
    # not, so that one warning is dropped (and nothing else TorchRec logs).
    log = logging.getLogger("torchrec.distributed.planner.types")
    log.addFilter(_drop_direct_topology_warning)
    try:
        return Topology(
            world_size=task.num_devices, compute_device="cuda",
            hbm_cap=int(dev.hbm_capacity.min()), ddr_cap=int(dev.host_capacity.min()),
            local_world_size=hw.node_devices,
            hbm_mem_bw=float(dev.hbm_gbps.min()) * _BYTES_PER_MS_PER_GBPS,
            ddr_mem_bw=host_bw, hbm_to_ddr_mem_bw=host_bw,
            intra_host_bw=hw.intra_node_gbps * _BYTES_PER_MS_PER_GBPS,
            inter_host_bw=hw.inter_node_gbps * _BYTES_PER_MS_PER_GBPS)
    finally:
        log.removeFilter(_drop_direct_topology_warning)


def _drop_direct_topology_warning(record: logging.LogRecord) -> bool:
    """A logging filter: False (drop) for TorchRec's warning about a topology built directly
    (see :func:`torchrec_topology`), True for every other record."""
    return "topology was constructed directly" not in record.getMessage()


def torchrec_constraints(task: ShardingTask, use_stats: bool = True, pipeline: str = "none",
                         **options: Any) -> dict[str, Any]:
    """Per-table ParameterConstraints carrying our statistics: lookups per sample as the
    pooling factor and (``use_stats``) the access curve as cache statistics, caches prefetched
    when the training ``pipeline`` is ``"prefetch"``; ``options`` are further
    ParameterConstraints fields (sharding_types, compute_kernels, ...), and a
    ``cache_load_factor`` key sets the starting cache size."""
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    clf = options.pop("cache_load_factor", None)
    batch = task.workload.batch_size
    return {t.name: ParameterConstraints(
        pooling_factors=[t.lookups_per_sample],
        cache_params=CacheParams(load_factor=clf,
                                 stats=curve_stats(t, batch) if use_stats else None,
                                 prefetch_pipeline=check_pipeline(pipeline) == "prefetch"),
        **options) for t in task.tables}


def declare_optimizers(ebc: Any, tables: Sequence[Table]) -> None:
    """Tells TorchRec's storage estimate about the optimizer state our memory model counts:
    one element per row is row-wise Adagrad, one row's worth Adagrad, two Adam."""
    import torch
    from torchrec.optim import RowWiseAdagrad

    for t in tables:
        if t.optimizer_bytes_per_row == 0:
            continue
        extra = t.optimizer_bytes_per_row / max(t.row_bytes, 1)
        if t.optimizer_bytes_per_row <= t.bytes_per_element:
            cls: type = RowWiseAdagrad
        elif extra <= 1.0:
            cls = torch.optim.Adagrad
        else:
            cls = torch.optim.Adam
        ebc.embedding_bags[t.name].weight._optimizer_classes = [cls]


@contextmanager
def quiet_torchrec() -> Iterator[None]:
    """TorchRec's planner logs every proposal at INFO/WARNING; keep only its errors."""
    log = logging.getLogger("torchrec")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def curve_stats(table: Table, batch_size: int) -> Any:
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
