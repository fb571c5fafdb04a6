"""TorchRec's own perf estimator as a cost model: plans made for the figure TorchRec rates.

:class:`TorchRecCostModel` prices each (table or shard, device, HBM rows) row by running
TorchRec's ``EmbeddingPerfEstimator`` on it, on the task's topology as
:mod:`autoshard.torchrec.estimate` describes it to TorchRec: the shard's table, sharding type
and sibling shards (TorchRec's even blocks), its compute kernel and cache load factor from its
HBM rows (:func:`autoshard.torchrec.mapping.table_kernel`: all rows in HBM ``fused``, none
``fused_uvm``, else ``fused_uvm_caching`` at the shard's share of rows), for the training
pipeline the task reserves HBM for (:func:`autoshard.torchrec.runtime_memory.pipeline_of`) unless
one is given.

A device's sum of these prices is TorchRec's rank figure and the plan's maximum its rating, so
any sharder given this model plans for TorchRec's estimate, as TorchRec's own planner does;
:func:`autoshard.torchrec.estimate.estimate_plan` gives the same step figure for the plan
(tested), as long as the shards of each split table keep one share of rows in HBM (TorchRec's
one load factor per table, which every sharder keeps on tasks planned for TorchRec).

What the estimator does not split is split here: compute is TorchRec's forward, backward and
prefetch compute, communication its forward and backward communication; the compute's host
share is the cache's host share of rows (TorchRec's view: a lookup's bandwidth is blended by
the load factor, whatever the skew). TorchRec's topology is uniform, so the price does not
depend on the device. Prices are cached per (table, sharding, shard size, HBM rows) for the
last few tasks. Needs the ``torchrec`` extra.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from autoshard.errors import PlannerError
from autoshard.layout import kinds
from autoshard.layout.kinds import WHOLE, ShardingKind
from autoshard.layout.shards import ShardTask, even_split, whole_tables
from autoshard.pricing.cost import Pricing
from autoshard.task import ShardingTask
from autoshard.torchrec import torchrec_unavailable
from autoshard.torchrec.mapping import (
    data_type,
    even_blocks,
    host_share,
    kernel_of,
    torchrec_name,
)
from autoshard.torchrec.runtime_memory import check_pipeline
from autoshard.torchrec.shardings import ShardSpec, TableSharding

#: Tasks whose prices are kept (a sharder works on one task and its shard tasks at a time).
CACHED_TASKS = 4

_Key = tuple[int, int, int, int, int, int]  # table, kind, parts, rows, cols, HBM rows


class TorchRecCostModel:
    """Prices rows with TorchRec's ``EmbeddingPerfEstimator`` (see the module docstring).

    Args:
        pipeline: TorchRec's training pipeline
            (:data:`autoshard.torchrec.runtime_memory.PIPELINES`); None: the one each task's
            reservation keeps HBM for.
        use_stats: Give TorchRec the access curves as cache statistics (as the ``torchrec``
            sharder does).
    """

    name = "torchrec"

    @classmethod
    def unavailable(cls) -> str | None:
        """Why TorchRec's estimator cannot run here (None when it can)."""
        return torchrec_unavailable(load=True)

    def __init__(self, pipeline: str | None = None, use_stats: bool = True) -> None:
        reason = torchrec_unavailable(load=True)
        if reason:
            raise PlannerError("unavailable", reason)
        self.pipeline = None if pipeline is None else check_pipeline(pipeline)
        self.use_stats = use_stats
        self._tasks: OrderedDict[int, _Priced] = OrderedDict()

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        t = np.asarray(table_idx, dtype=np.int64)
        rows_in_hbm = np.rint(np.asarray(hbm_rows, dtype=np.float64)).astype(np.int64)
        parent, g = ((task.parent, task.geometry) if isinstance(task, ShardTask)
                     else (task, whole_tables(task)))
        assert parent is not None and g is not None
        g = g.take(t)
        rows_in_hbm = np.clip(rows_in_hbm, 0, g.rows)
        # A replica keeps every row in HBM (its dense kernel): one price whatever is asked.
        rows_in_hbm = np.where(kinds.replicated(g.kind), g.rows, rows_in_hbm)
        keys = np.stack([g.table, g.kind, g.parts, g.rows, g.cols, rows_in_hbm], axis=1)
        priced = self._priced(parent)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        wanted = [_as_key(k) for k in unique]
        priced.fill(wanted)
        values = np.array([priced.prices[k] for k in wanted])
        values = values.reshape(-1, 3)[inverse.ravel()]
        return Pricing(hbm_ms=values[:, 0], uvm_ms=values[:, 1], comm_ms=values[:, 2])

    def _priced(self, task: ShardingTask) -> _Priced:
        key = id(task)
        found = self._tasks.get(key)
        if found is None or found.task is not task:
            found = _Priced(task, self.pipeline, self.use_stats)
            self._tasks[key] = found
            while len(self._tasks) > CACHED_TASKS:
                self._tasks.popitem(last=False)
        self._tasks.move_to_end(key)
        return found


class _Priced:
    """One task's TorchRec setting (topology, constraints, estimator) and its priced keys."""

    def __init__(self, task: ShardingTask, pipeline: str | None, use_stats: bool) -> None:
        from autoshard.torchrec.estimate import (
            task_pipeline,
            torchrec_constraints,
            torchrec_estimators,
            torchrec_topology,
        )

        self.task = task
        self.pipeline = task_pipeline(task, pipeline)
        topology = torchrec_topology(task)
        self.constraints = torchrec_constraints(task, use_stats, pipeline=self.pipeline)
        self.estimator = torchrec_estimators(task, topology, self.constraints, self.pipeline)[0]
        self.prices: dict[_Key, tuple[float, float, float]] = {}

    def fill(self, keys: list[_Key]) -> None:
        """Prices the keys not yet priced, in one estimator call."""
        from autoshard.torchrec.estimate import quiet_torchrec, sharding_options

        todo = [k for k in keys if k not in self.prices]
        if not todo:
            return
        entries = [(self.task.tables[k[0]], self._sharding(k)) for k in todo]
        with quiet_torchrec():
            options, data_map = sharding_options(entries, self.task, self.constraints)
            self.estimator.estimate(options, data_map)
        for key, option in zip(todo, options, strict=True):
            self.prices[key] = _split_perf(_own_shard(option, key), option.compute_kernel,
                                           option.cache_load_factor)

    def _sharding(self, key: _Key) -> TableSharding:
        """The shard's table as TorchRec shards it: ``parts`` even blocks (TorchRec's row
        blocks, or column blocks) on ranks 0.. (a node's first ranks for table-row-wise), or a
        grid (:func:`_grid`), all with the shard's kernel and cache load factor."""
        table, kind, parts, rows, cols, hbm = key
        t = self.task.tables[table]
        sharding = ShardingKind.of(kind)
        kernel, clf = kernel_of(sharding, np.array([rows]), np.ones(1), np.array([hbm]), t.rows)
        shards: tuple[ShardSpec, ...]
        if sharding.replicated:
            shards = tuple(ShardSpec(r, 0, t.rows, 0, t.dim) for r in range(parts))
        elif parts == 1:
            shards = (ShardSpec(0, 0, t.rows, 0, t.dim),)
        elif sharding.splits_rows and sharding.splits_cols:
            shards = _grid(self.task, t.rows, t.dim, max(round(t.dim / cols), 1))
        elif sharding.splits_rows:
            blocks = even_blocks(t.rows, parts)
            starts = np.concatenate(([0], np.cumsum(blocks)[:-1]))
            shards = tuple(ShardSpec(r, int(s), n, 0, t.dim)
                           for r, (s, n) in enumerate(zip(starts, blocks, strict=True)))
        else:
            g = even_split(self.task, table, sharding, parts)
            shards = tuple(ShardSpec(r, 0, t.rows, int(c), int(n))
                           for r, (c, n) in enumerate(zip(g.col_start, g.cols, strict=True)))
        return TableSharding(t.name, t.rows, t.dim, data_type(t),
                             torchrec_name(sharding if parts > 1 else WHOLE), kernel, clf,
                             shards)


def _grid(task: ShardingTask, rows: int, dim: int, blocks: int) -> tuple[ShardSpec, ...]:
    """A grid of ``blocks`` near-equal column blocks as TorchRec lays it out: each block its
    even row blocks over the ranks of a node in rank order, block b on node b (mod the
    nodes)."""
    local = task.hardware.node_devices
    nodes = max(task.num_devices // local, 1)
    edges = [b * dim // blocks for b in range(blocks + 1)]
    sizes = even_blocks(rows, local)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    return tuple(ShardSpec(b % nodes * local + r, int(starts[r]), sizes[r], edges[b],
                           edges[b + 1] - edges[b])
                 for b in range(blocks) for r in range(local))


def _as_key(row: np.ndarray) -> _Key:
    table, kind, parts, rows, cols, hbm = (int(v) for v in row)
    return table, kind, parts, rows, cols, hbm


def _own_shard(option: Any, key: _Key) -> Any:
    """The option's shard nearest the priced one in size (TorchRec's blocks may differ from
    the plan's by a row)."""
    rows, cols = key[3], key[4]
    return min(option.shards, key=lambda s: abs(s.size[0] - rows) + abs(s.size[1] - cols))


def _split_perf(shard: Any, kernel: str, clf: float | None) -> tuple[float, float, float]:
    """(HBM compute, host compute, communication) ms of a shard's TorchRec perf."""
    perf = shard.perf
    compute = perf.fwd_compute + perf.bwd_compute + perf.prefetch_compute
    host = host_share(kernel, clf)
    return compute * (1.0 - host), compute * host, perf.fwd_comms + perf.bwd_comms

