"""A rank's shard: its tables from the plan, split into an HBM tier and a host tier."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoshard.layout.plan import Plan
from autoshard.runner.config import RunConfig, ShardTable
from autoshard.runner.data import TableBatch, split_tier
from autoshard.runner.kernels import FbgemmTier, TierTable, TorchTier
from autoshard.runner.replicas import Replicas

TIERS = ("hbm", "uvm")


def rank_tables(plan: Plan, table_dims: dict[str, tuple[int, int, int]], rank: int
                ) -> list[ShardTable]:
    """The tables, shards and replicas the plan puts on ``rank``, in task order (a table's
    shards in row, then column order). A replicated table gives every rank one replica.

    Args:
        plan: The plan.
        table_dims: Table name -> (position in the task, rows, dim).
        rank: This rank.
    """
    mine = []
    for p in plan.placements:
        position, rows, dim = table_dims[p.table]
        for s in p.pieces(rows, dim):
            if s.device != rank:
                continue
            if not p.is_split or p.sharding.replicated:
                mine.append(ShardTable(p.table, position, rows, dim, s.hbm_rows,
                                       replica=p.sharding.replicated))
                continue
            mine.append(ShardTable(p.table, position, s.rows, s.cols, s.hbm_rows,
                                   table_rows=rows, table_dim=dim, row_start=s.row_start,
                                   col_start=s.col_start))
    return sorted(mine, key=lambda t: (t.position, t.row_start, t.col_start))


@dataclass(frozen=True)
class PreparedBatch:
    """One batch of a rank's lookups, split by tier and moved to the devices."""

    tiers: dict[str, Any]
    lookups: int
    uvm_lookups: int


class RankShard:
    """The rank's tables: hottest ``hbm_rows`` rows of each in the fast tier, the rest in host
    memory (on CPU both tiers are host DRAM; the split is kept so that both run as planned),
    and its replicas of the replicated tables (:class:`autoshard.runner.replicas.Replicas`).

    ``tables`` are the pieces that go through the all-to-all (whole tables, row and column
    shards); ``replicas`` holds the others, or is None when the plan replicates nothing.

    Args:
        pieces: The rank's pieces, replicas included (:func:`rank_tables`).
        config: Run settings (kernel, learning rate, seed).
        device: The rank's compute device.
    """

    def __init__(self, pieces: Sequence[ShardTable], config: RunConfig, device: Any) -> None:
        self.pieces = tuple(pieces)
        self.tables = tuple(t for t in self.pieces if not t.replica)
        copies = [t for t in self.pieces if t.replica]
        self.replicas = Replicas(copies, config, device) if copies else None
        self.dims = [t.dim for t in self.tables]
        self.device = device
        blocks = {
            "hbm": [(TierTable(i, t.hbm_rows, t.dim), 0, t.hbm_rows)
                    for i, t in enumerate(self.tables) if t.hbm_rows > 0],
            "uvm": [(TierTable(i, t.rows - t.hbm_rows, t.dim), t.hbm_rows, t.rows)
                    for i, t in enumerate(self.tables) if t.rows > t.hbm_rows],
        }
        self.blocks = blocks
        self.kernels: dict[str, Any] = {}
        for tier, items in blocks.items():
            if not items:
                continue
            parts = [b[0] for b in items]
            seed = config.seed * 1000003 + sum(self.tables[b.slot].position for b in parts)
            if config.kernel == "fbgemm":
                self.kernels[tier] = FbgemmTier(parts, tier, device, config.learning_rate, seed)
            else:
                home = device if tier == "hbm" else "cpu"
                self.kernels[tier] = TorchTier(parts, home, device, config.learning_rate, seed)

    @property
    def nbytes(self) -> dict[str, int]:
        """Bytes of weights and optimizer state held per tier (replicas in the fast one)."""
        held = {tier: (self.kernels[tier].nbytes if tier in self.kernels else 0)
                for tier in TIERS}
        held["hbm"] += self.replicas.nbytes if self.replicas else 0
        return held

    def prepare(self, batches: Sequence[TableBatch]) -> PreparedBatch:
        """Splits one batch (one :class:`TableBatch` per piece, :attr:`pieces` order; a
        replica's holds the rank's own samples only) by tier."""
        pairs = list(zip(self.pieces, batches, strict=True))
        mine = [b for t, b in pairs if not t.replica]
        prepared: dict[str, Any] = {}
        uvm = 0
        for tier, kernel in self.kernels.items():
            inputs = [split_tier(mine[b.slot], lo, hi) for b, lo, hi in self.blocks[tier]]
            if tier == "uvm":
                uvm = sum(x.indices.size for x in inputs)
            prepared[tier] = kernel.prepare(inputs)
        if self.replicas:
            prepared["replicas"] = self.replicas.prepare([b for t, b in pairs if t.replica])
        total = sum(b.indices.size for b in batches)
        return PreparedBatch(prepared, int(total), int(uvm))

    def forward_tier(self, tier: str, batch: PreparedBatch) -> dict[int, Any]:
        """Pooled partial sums of the tier's rows, by table slot."""
        if tier not in self.kernels:
            return {}
        pooled = self.kernels[tier].forward(batch.tiers[tier])
        return {b[0].slot: p for b, p in zip(self.blocks[tier], pooled, strict=True)}

    def combine(self, parts: Sequence[dict[int, Any]], batch_size: int) -> Any:
        """The rank's pooled output [B, sum of dims]: each table's tier sums added, tables side
        by side in task order."""
        import torch

        cols = []
        for slot, dim in enumerate(self.dims):
            found = [p[slot] for p in parts if slot in p]
            cols.append(found[0] if len(found) == 1 else (found[0] + found[1]) if found
                        else torch.zeros((batch_size, dim), device=self.device))
        if not cols:
            return torch.zeros((batch_size, 0), device=self.device)
        return torch.cat(cols, dim=1)

    def backward_tier(self, tier: str, batch: PreparedBatch, grad: Any) -> None:
        """Backward and optimizer step of the tier's rows, given the pooled output's gradient."""
        if tier not in self.kernels:
            return
        per_table = grad.split(self.dims, dim=1)
        grads = [per_table[b[0].slot] for b in self.blocks[tier]]
        self.kernels[tier].backward(batch.tiers[tier], grads)

    def forward_replicas(self, batch: PreparedBatch, samples: int) -> Any:
        """The replicas' pooled output for the rank's ``samples`` own samples [samples, width]
        (no columns when the plan replicates nothing)."""
        import torch

        if self.replicas is None:
            return torch.zeros((samples, 0), device=self.device)
        return self.replicas.forward(batch.tiers["replicas"])

    def backward_replicas(self, batch: PreparedBatch, grad: Any) -> None:
        """The replicas' gradient from this rank's samples (see :meth:`sync_replicas`)."""
        if self.replicas is not None:
            self.replicas.backward(batch.tiers["replicas"], grad)

    def sync_replicas(self) -> None:
        """The all-reduce of the replicas' gradients (a collective: every rank calls it)."""
        if self.replicas is not None:
            self.replicas.all_reduce()

    def step_replicas(self) -> None:
        """The replicas' dense update, the same on every rank."""
        if self.replicas is not None:
            self.replicas.step()

    def piece_weights(self, state: bool = False) -> list[Any]:
        """Each piece's weights [rows, dim] in :attr:`pieces` order (a piece's fast-tier rows,
        then its host rows); with ``state``, its row-wise Adagrad accumulators [rows]."""
        import torch

        parts: list[list[Any]] = [[] for _ in self.tables]
        for tier in TIERS:
            if tier in self.kernels:
                kernel = self.kernels[tier]
                for (b, _, _), w in zip(self.blocks[tier],
                                        kernel.state if state else kernel.weights, strict=True):
                    parts[b.slot].append(w.detach())
        whole = iter([torch.cat(p) for p in parts])
        held = self.replicas.tier if self.replicas else None
        copies = iter([] if held is None else held.state if state else held.weights)
        return [next(copies) if t.replica else next(whole) for t in self.pieces]

    def load_weights(self, weights: Sequence[Any]) -> None:
        """Sets every piece's weights, given as :meth:`piece_weights` returns them."""
        import torch

        given = list(zip(self.pieces, weights, strict=True))
        whole = [w for t, w in given if not t.replica]
        copies = [w for t, w in given if t.replica]
        with torch.no_grad():
            for tier in TIERS:
                if tier in self.kernels:
                    for (b, lo, hi), w in zip(self.blocks[tier], self.kernels[tier].weights,
                                              strict=True):
                        w.copy_(whole[b.slot][lo:hi])
            for w, new in zip(self.replicas.tier.weights if self.replicas else [], copies,
                              strict=True):
                w.copy_(new)
