"""HBM as TorchRec counts it, and plans fitted to that count before they are handed over.

TorchRec's storage estimate (``EmbeddingStorageEstimator`` of torchrec 1.8.0, CUDA, for the
training pipeline the task's reservation names,
:func:`autoshard.torchrec.runtime_memory.pipeline_of`) charges
each shard more HBM than our memory model's weights and optimizer state:

- ``fused_uvm_caching``: 16 bytes of cache state per cached row and 4 bytes of index per row
  of the shard (its cache bookkeeping);
- in training, the shard's input and output buffers: 8 bytes per input id it receives and
  4 bytes per element of the pooled output it writes, for the whole global batch (table-wise
  and column-wise shards receive every sample's ids; row-wise ones a world's, table-row-wise
  ones a node's share of them; every shard writes its columns for every sample); a replicated
  (``data_parallel``, ``dense``) shard holds the whole table and buffers its own rank's
  samples only; in the
  prefetch pipeline, three input buffers and, for a cached shard, seven prefetch buffers;
- in inference, only the weights.

Sharders keep room for it on tasks that reserve it (:mod:`autoshard.torchrec.runtime_memory`,
which bounds this count); a plan made without that room may overfill
HBM under TorchRec. :func:`fit_shardings` lowers the HBM caches on the ranks that overfill
(their tables' cache load factors, coldest rows first, which is what a cache load factor
drops; across tables, the rows that serve the fewest looked-up bytes per byte freed) until
every rank fits TorchRec's count, and says what it changed; the export does this before
writing (and changes nothing in a plan made with the room). This
module mirrors TorchRec's formulas and needs no TorchRec; tests check it against the estimator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from autoshard.layout.kinds import id_parts
from autoshard.tables import Table
from autoshard.task import ShardingTask
from autoshard.torchrec.mapping import DENSE, FUSED, FUSED_UVM, FUSED_UVM_CACHING
from autoshard.torchrec.runtime_memory import (
    CACHE_INDEX_BYTES,
    CACHE_SLOT_BYTES,
    INDEX_BYTES,
    OUTPUT_BYTES,
    optimizer_multiplier,
    pipeline_buffers,
    pipeline_of,
)
from autoshard.torchrec.shardings import ShardSpec, TableSharding


def _optimizer_multiplier(table: Table, train: bool) -> float:
    """TorchRec's optimizer state per weight byte for the optimizer our table implies."""
    if not train:
        return 0.0
    return float(optimizer_multiplier(np.array(table.optimizer_bytes_per_row),
                                      np.array(table.bytes_per_element), np.array(table.dim)))


def shard_hbm_bytes(s: TableSharding, table: Table, task: ShardingTask) -> list[int]:
    """TorchRec's HBM bytes of each of ``s``'s shards (same order)."""
    train = task.workload.train
    bpe = table.bytes_per_element
    full = table.rows * table.dim * bpe
    if s.compute_kernel in (FUSED, DENSE):
        storage = full
    elif s.compute_kernel == FUSED_UVM:
        storage = 0
    else:
        storage = round(full * float(s.cache_load_factor or 0.0))
    mult = _optimizer_multiplier(table, train)
    out = []
    for x in s.shards:
        tensor = math.ceil(storage * x.rows * x.cols / (table.rows * table.dim))
        size = tensor
        if train:
            size += math.ceil(tensor * mult)
            if s.compute_kernel == FUSED_UVM_CACHING:
                clf = float(s.cache_load_factor or 0.0)
                size += math.ceil(x.rows * (CACHE_INDEX_BYTES + clf * CACHE_SLOT_BYTES))
            size += _buffers(s, x, table, task)
        out.append(size)
    return out


def _buffers(s: TableSharding, x: ShardSpec, table: Table, task: ShardingTask) -> int:
    """Input and output buffer bytes of one shard in training (TorchRec's io sizes)."""
    if x.rows * x.cols == 0:
        return 0
    world = task.num_devices
    batch = max(task.workload.batch_size // world, 1)
    lookups = table.lookups_per_sample * batch
    local = task.hardware.node_devices
    lookups /= int(id_parts(np.asarray(s.kind.code), world, local))
    outputs = min(1.0, table.lookups_per_sample) * batch
    senders = 1 if s.kind.replicated else world  # a replica writes its own rank's samples
    return int(pipeline_buffers(np.array(math.ceil(lookups * world * INDEX_BYTES)),
                                np.array(math.ceil(outputs * senders * x.cols * OUTPUT_BYTES)),
                                pipeline_of(task.reservation),
                                s.compute_kernel == FUSED_UVM_CACHING))


def rank_hbm(shardings: Sequence[TableSharding], task: ShardingTask) -> np.ndarray:
    """TorchRec's HBM bytes per rank of ``shardings`` (one per task table, in task order)."""
    used = np.zeros(task.num_devices, dtype=np.int64)
    for s, t in zip(shardings, task.tables, strict=True):
        used += _per_rank(s, t, task)
    return used


def fit_shardings(shardings: Sequence[TableSharding], task: ShardingTask,
                  step: float = 0.1) -> tuple[list[TableSharding], list[str]]:
    """``shardings`` with HBM caches lowered until every rank fits TorchRec's count; returns
    them and the names of the tables changed.

    While a rank overfills, the table on it whose next cut (``step`` of its share of rows in
    HBM, coldest rows first; a whole table in HBM becomes a cache) loses the fewest looked-up
    bytes per byte it frees on that rank is cut; a cache that would drop below one row goes to
    host memory whole (``fused_uvm``). A table's load factor holds for all its shards, so a cut
    frees HBM on every rank holding one.

    Raises:
        PlannerError: A rank overfills with no HBM rows left to drop (its I/O buffers alone
            exceed its HBM).
    """

    out = list(shardings)
    cap = task.device_arrays.hbm_capacity
    per_table = [_per_rank(s, t, task) for s, t in zip(out, task.tables, strict=True)]
    used = np.sum(per_table, axis=0) if per_table else np.zeros(task.num_devices)
    changed: set[str] = set()
    while True:
        over = np.flatnonzero(used > cap)
        if not over.size:
            return out, sorted(changed, key=task.index.__getitem__)
        r = int(over[np.argmax(used[over] - cap[over])])
        best: tuple[float, int, TableSharding, np.ndarray] | None = None
        for i, s in enumerate(out):
            if s.compute_kernel == FUSED_UVM or per_table[i][r] == 0:
                continue
            t = task.tables[i]
            cut = _scaled(s, 1.0 - step)
            after = _per_rank(cut, t, task)
            freed = per_table[i][r] - after[r]
            if freed <= 0:
                continue
            loss = t.lookups_per_sample * t.row_bytes * float(
                t.access_curve().share_at(_share(s)) - t.access_curve().share_at(_share(cut)))
            if best is None or loss / freed < best[0]:
                best = (loss / freed, i, cut, after)
        if best is None:
            raise _not_exportable(out, task, r, int(used[r]))
        _, i, out[i], after = best
        used += after - per_table[i]
        per_table[i] = after
        changed.add(out[i].table)


def _not_exportable(shardings: Sequence[TableSharding], task: ShardingTask, rank: int,
                    used: int) -> Exception:
    """The error for a rank that overfills with no HBM rows left to drop."""
    from autoshard.errors import PlannerError, gib

    fixed = shards = 0
    for s, t in zip(shardings, task.tables, strict=True):
        for x in s.shards:
            if x.rank == rank and x.rows * x.cols:
                shards += 1
                fixed += _buffers(s, x, t, task) if task.workload.train else 0
    return PlannerError(
        "capacity", f"not exportable to TorchRec: rank {rank} holds {shards} shards whose fixed "
        f"I/O buffers alone take {gib(fixed)} under TorchRec's storage estimate "
        f"({gib(used)} in all, no table rows in HBM left to move), over its HBM of "
        f"{gib(task.device_arrays.hbm_capacity[rank])}; the plan puts too many tables on that "
        f"rank for TorchRec")


def _per_rank(s: TableSharding, table: Table, task: ShardingTask) -> np.ndarray:
    """TorchRec's HBM bytes of one table's shards, per rank."""
    used = np.zeros(task.num_devices, dtype=np.int64)
    for x, size in zip(s.shards, shard_hbm_bytes(s, table, task), strict=True):
        used[x.rank] += size
    return used


def _share(s: TableSharding) -> float:
    """The table's share of rows in HBM."""
    if s.compute_kernel == FUSED_UVM:
        return 0.0
    return float(s.cache_load_factor or 0.0) if s.compute_kernel == FUSED_UVM_CACHING else 1.0


def _scaled(s: TableSharding, keep: float) -> TableSharding:
    """``s`` with its share of rows in HBM multiplied by ``keep``."""
    new = _share(s) * keep
    if new * s.rows < 1.0:
        return replace(s, compute_kernel=FUSED_UVM, cache_load_factor=None)
    return replace(s, compute_kernel=FUSED_UVM_CACHING, cache_load_factor=new)
