"""The statistics table TorchRec's planner prints, for a plan rated as TorchRec rates its own.

TorchRec's ``EmbeddingStats`` (planner/stats.py of torchrec 1.8.0) logs, after planning, a table
per rank (HBM, DDR, perf, input, output, shards by sharding type) and, with ``debug``, one per
table (sharding, kernel, perf, storage, cache load factor, pooling factor, features, dim,
rows, ranks), the imbalance of perf, HBM and DDR over the ranks, and the storage reservation.
:class:`PlanStats` holds the same figures as a value, from a plan's options rated by TorchRec's
estimators (:func:`autoshard.torchrec.model_rating.rate_plan`), and :meth:`PlanStats.render`
writes them as TorchRec's table does.

Per rank, HBM is the rank's shards under TorchRec's storage estimate against what the storage
reservation leaves them (:class:`autoshard.torchrec.storage_reservation.Reserved`), the test
TorchRec's partitioner applies; its own table shows the shards plus the dense and KJT storage
against the HBM less the reserved share, which passes and fails with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoshard.torchrec.mapping import ABBREVIATIONS, FUSED_UVM_CACHING, kind_of
from autoshard.torchrec.storage_reservation import Reserved

_GIB, _MIB = 2**30, 2**20
_WIDTH = 90  # TorchRec's narrowest table (stats.py MIN_WIDTH)


@dataclass(frozen=True)
class Perf:
    """TorchRec's perf estimate of shards, ms: the total and its parts."""

    total_ms: float
    fwd_compute_ms: float = 0.0
    fwd_comms_ms: float = 0.0
    bwd_compute_ms: float = 0.0
    bwd_comms_ms: float = 0.0
    prefetch_compute_ms: float = 0.0

    @classmethod
    def of(cls, perfs: Sequence[Any]) -> Perf:
        """The sum of TorchRec ``Perf`` objects."""
        return cls(*(float(sum(getattr(p, k) for p in perfs)) for k in (
            "total", "fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms",
            "prefetch_compute")))

    def text(self) -> str:
        """``total (forward compute, forward comms, backward compute, backward comms,
        prefetch compute)``, as TorchRec writes it."""
        parts = (self.fwd_compute_ms, self.fwd_comms_ms, self.bwd_compute_ms,
                 self.bwd_comms_ms, self.prefetch_compute_ms)
        return f"{round(self.total_ms, 3)} ({','.join(_figure(p) for p in parts)})"


@dataclass(frozen=True)
class RankStats:
    """One rank's row: its shards' HBM and DDR against what the reservation leaves them
    (bytes), their perf, the ids in and pooled embeddings out per iteration (MiB), and its
    shards by TorchRec's sharding type abbreviation."""

    rank: int
    hbm_bytes: int
    hbm_left_bytes: int
    ddr_bytes: int
    ddr_left_bytes: int
    perf: Perf
    input_mib: float
    output_mib: float
    shards: tuple[tuple[str, int], ...]

    @property
    def fits(self) -> bool:
        return self.hbm_bytes <= self.hbm_left_bytes and self.ddr_bytes <= self.ddr_left_bytes


@dataclass(frozen=True)
class TableStats:
    """One table's row: its module path and name, how it is sharded, its shards' perf and
    storage (bytes) summed, its cache load factor (None unless cached), its pooling factor
    summed over its features, its dim and column block dim (None unless split by columns),
    rows and ranks."""

    fqn: str
    sharding_type: str
    compute_kernel: str
    perf: Perf
    hbm_bytes: int
    ddr_bytes: int
    cache_load_factor: float | None
    pooling_factor: float
    features: int
    dim: int
    block_dim: int | None
    rows: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class PlanStats:
    """A plan as TorchRec's planner reports one (the module docstring).

    Args:
        ranks: One row per rank.
        tables: One row per table, in the model's order.
        imbalance: Per distribution (total perf, HBM, DDR), TorchRec's imbalance measures
            (total variation, total distance, chi and KL divergence; 0 balanced, 1 all on one
            rank).
        reserved: The storage reservation in force.
        batch_size: Samples per rank.
        planned_by: What planned it, in words.
        seconds: How long planning took, s.
    """

    ranks: tuple[RankStats, ...]
    tables: tuple[TableStats, ...]
    imbalance: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]
    reserved: Reserved
    batch_size: int
    planned_by: str
    seconds: float

    @property
    def fits(self) -> bool:
        """Whether every rank's shards fit what the reservation leaves them."""
        return all(r.fits for r in self.ranks)

    @property
    def step_ms(self) -> float:
        """TorchRec's rating of the plan: its slowest rank's perf, ms."""
        return max(r.perf.total_ms for r in self.ranks)

    def render(self, debug: bool = True) -> str:
        """The table as TorchRec's planner logs it: per rank, and with ``debug`` per table,
        the imbalance and the reservation."""
        return render(self, debug)


def stats_of(sharding_plan: Any, module: Any, sharders: Sequence[Any], topology: Any,
             batch_size: int | None = None, constraints: Mapping[str, Any] | None = None,
             storage_reservation: Any = None, pipeline: str = "none", planned_by: str = "",
             seconds: float = 0.0) -> PlanStats:
    """The statistics of any ``ShardingPlan`` of ``module`` (TorchRec's own planner's, say) as
    the drop-in planner rates its own: reserved as TorchRec's planner reserves
    (``storage_reservation``, None: its default), rated by TorchRec's enumerator and
    estimators on ``topology`` for ``batch_size`` samples per rank (None: TorchRec's
    default)."""
    from torchrec.distributed.planner.constants import BATCH_SIZE

    from autoshard.torchrec.model_rating import rate_plan
    from autoshard.torchrec.storage_reservation import default_reservation, reserve

    per_rank = batch_size or BATCH_SIZE
    reservation = default_reservation() if storage_reservation is None else storage_reservation
    _, reserved = reserve(reservation, topology, per_rank, module, sharders, constraints)
    options = rate_plan(sharding_plan, module, sharders, topology, per_rank, constraints,
                        pipeline)
    return plan_stats(options, topology, reserved, per_rank, constraints, planned_by, seconds)


def plan_stats(options: Sequence[Any], topology: Any, reserved: Reserved, batch_size: int,
               constraints: Mapping[str, Any] | None = None, planned_by: str = "",
               seconds: float = 0.0) -> PlanStats:
    """The statistics of rated options (one per table, shards on ranks, with TorchRec's perf
    and storage: :func:`autoshard.torchrec.model_rating.rate_plan`) on ``topology``, under
    ``reserved``."""
    world = topology.world_size
    hbm, ddr, inputs, outputs = [0] * world, [0] * world, [0.0] * world, [0.0] * world
    perfs: list[list[Any]] = [[] for _ in range(world)]
    kinds: list[Counter[str]] = [Counter() for _ in range(world)]
    for o in options:
        ins, outs = _io_bytes(o, topology, constraints)
        for shard, i, out in zip(o.shards, ins, outs, strict=True):
            r = shard.rank
            hbm[r] += shard.storage.hbm
            ddr[r] += shard.storage.ddr
            perfs[r].append(shard.perf)
            inputs[r] += i / _MIB
            outputs[r] += out / _MIB
            kinds[r][ABBREVIATIONS[o.sharding_type]] += 1
    used = sorted({ABBREVIATIONS[o.sharding_type] for o in options})
    ranks = tuple(RankStats(r, hbm[r], reserved.hbm_left_bytes[r], ddr[r],
                            reserved.ddr_left_bytes[r], Perf.of(perfs[r]), inputs[r],
                            outputs[r], tuple((k, kinds[r][k]) for k in used))
                  for r in range(world))
    return PlanStats(ranks, tuple(_table(o) for o in options),
                     _imbalance(ranks), reserved, batch_size, planned_by, seconds)


def _io_bytes(option: Any, topology: Any, constraints: Mapping[str, Any] | None
              ) -> tuple[list[int], list[int]]:
    """Bytes of ids in and pooled embeddings out per iteration of each of ``option``'s shards,
    as TorchRec's statistics count them (its own io-size function)."""
    from torchrec.distributed.planner.constants import BIGINT_DTYPE
    from torchrec.distributed.planner.shard_estimators import (
        _calculate_shard_io_sizes,
        get_num_poolings,
    )

    given = dict(constraints or {})
    c = given.get(option.name)
    batch_sizes = (c.batch_sizes if c is not None and c.batch_sizes
                   else [option.batch_size] * option.num_inputs)
    return _calculate_shard_io_sizes(
        sharding_type=option.sharding_type, batch_sizes=batch_sizes,
        world_size=topology.world_size, local_world_size=topology.intra_group_size,
        input_lengths=option.input_lengths, emb_dim=option.tensor.shape[1],
        shard_sizes=[s.size for s in option.shards], input_data_type_size=BIGINT_DTYPE,
        output_data_type_size=option.tensor.element_size(),
        num_poolings=get_num_poolings(given, option), is_pooled=option.is_pooled)


def _table(o: Any) -> TableStats:
    """One table's row of rated option ``o``."""
    cached = o.compute_kernel == FUSED_UVM_CACHING
    return TableStats(
        f"{o.path}.{o.name}" if o.path else o.name, ABBREVIATIONS[o.sharding_type],
        o.compute_kernel,
        Perf.of([s.perf for s in o.shards]), int(sum(s.storage.hbm for s in o.shards)),
        int(sum(s.storage.ddr for s in o.shards)),
        float(o.cache_load_factor) if cached and o.cache_load_factor is not None else None,
        float(sum(o.input_lengths)), len(o.input_lengths), int(o.tensor.shape[1]),
        int(o.shards[0].size[1]) if kind_of(o.sharding_type).splits_cols else None,
        int(o.tensor.shape[0]), tuple(sorted({int(s.rank) for s in o.shards})))


def _imbalance(ranks: Sequence[RankStats]
               ) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """TorchRec's imbalance measures (planner/stats.py ``IMBALANCE_STAT_MEASURE``) of each
    distribution over the ranks that is not all zero."""
    from torchrec.distributed.planner.stats import IMBALANCE_STAT_MEASURE

    out = []
    for name, values in (("Total Perf", [r.perf.total_ms for r in ranks]),
                         ("HBM", [float(r.hbm_bytes) for r in ranks]),
                         ("DDR", [float(r.ddr_bytes) for r in ranks])):
        total = sum(values)
        if total > 0:
            share = [v / total for v in values]
            out.append((name, tuple((m, float(f(share, **kw)))
                                    for m, (f, kw) in IMBALANCE_STAT_MEASURE.items())))
    return tuple(out)


def render(stats: PlanStats, debug: bool = True) -> str:
    """``stats`` as TorchRec's planner logs its table (see :meth:`PlanStats.render`)."""
    rows = _rank_rows(stats)
    tables = _table_rows(stats) if debug else []
    width = max(_WIDTH, len(rows[0]) + 8, len(tables[0]) + 6 if tables else 0)
    body = [*rows, "", "Perf: Total perf (Forward compute, Forward comms, Backward compute, "
            "Backward comms, Prefetch compute)",
            "Input: MB/iteration, Output: MB/iteration, Shards: number of tables",
            "HBM, DDR: the rank's shards (share of what the storage reservation leaves them)"]
    if debug:
        body += ["", "Parameter Info:", *tables]
    body += ["", f"Batch Size: {stats.batch_size}"]
    if debug:
        for name, measures in stats.imbalance:
            body += ["", f"{name} Imbalance Statistics",
                     *(f"{m}: {v:.3f}" for m, v in measures)]
        if stats.imbalance:
            body += ["", "Imbalance stats range 0-1, higher means more imbalanced"]
    body += ["", "Storage Reservation:", *(f"   {x}" for x in stats.reserved.lines())]
    head = ["#" * width, _centred("--- Planner Statistics ---", width),
            _centred(f"--- Planned by {stats.planned_by} in {stats.seconds:.2f}s ---", width),
            _centred("-" * (width - 4), width)]
    return "\n".join([*head, *(_left(x, width) for x in body), "#" * width])


def _rank_rows(stats: PlanStats) -> list[str]:
    table: list[list[str]] = [
        ["Rank", "HBM (GB)", "DDR (GB)", "Perf (ms)", "Input (MB)", "Output (MB)", "Shards"],
        ["------", "----------", "----------", "-----------", "------------",
         "-------------", "--------"]]
    for r in stats.ranks:
        table.append([str(r.rank), _used(r.hbm_bytes, r.hbm_left_bytes),
                      _used(r.ddr_bytes, r.ddr_left_bytes), r.perf.text(),
                      f"{round(r.input_mib, 2)}", f"{round(r.output_mib, 2)}",
                      " ".join(f"{k}: {n}" for k, n in r.shards)])
    return _aligned(table)


def _table_rows(stats: PlanStats) -> list[str]:
    table: list[list[str]] = [
        ["FQN", "Sharding", "Compute Kernel", "Perf (ms)", "Storage (HBM, DDR)",
         "Cache Load Factor", "Sum Pooling Factor", "Features", "Emb Dim (CW Dim)",
         "Hash Size", "Ranks"]]
    table.append(["-" * len(h) for h in table[0]])
    for t in stats.tables:
        table.append([t.fqn, t.sharding_type, t.compute_kernel, t.perf.text(),
                      f"({round(t.hbm_bytes / _GIB, 3)} GB, {round(t.ddr_bytes / _GIB, 3)} GB)",
                      str(t.cache_load_factor), str(round(t.pooling_factor, 3)),
                      str(t.features),
                      f"{t.dim} ({t.block_dim})" if t.block_dim is not None else str(t.dim),
                      str(t.rows), _ranks_text(t.ranks)])
    return _aligned(table)


def _used(used: int, left: int) -> str:
    share = f"{used / left:.0%}" if left > 0 else "-"
    return f"{round(used / _GIB, 3)} ({share})"


def _ranks_text(ranks: tuple[int, ...]) -> str:
    """Ranks as TorchRec writes them: ``a-b`` when consecutive, else listed."""
    if len(ranks) > 1 and ranks == tuple(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def _figure(ms: float) -> str:
    """A perf part as TorchRec writes it: whole ms from 1 up, else one significant figure."""
    return str(round(ms)) if ms >= 1 else f"{float(f'{ms:.1g}'):g}"


def _aligned(table: list[list[str]]) -> list[str]:
    """Rows right-aligned in columns three wider than their longest cell (TorchRec's)."""
    widths = [max(len(row[i]) for row in table) + 3 for i in range(len(table[0]))]
    return ["".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True))
            for row in table]


def _centred(text: str, width: int) -> str:
    return f"#{text: ^{width - 2}}#"


def _left(text: str, width: int) -> str:
    return f"# {text: <{width - 3}}#"
