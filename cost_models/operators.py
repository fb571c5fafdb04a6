"""Embedding operators under test and the lookups fed to them.

Every operator is built for one :class:`~autoshard.cost_models.grid.BenchConfig` and exposes
``forward() -> Tensor`` and ``backward(out)`` (backward pass plus the optimizer update), so the
timing loop treats them alike. Heavy imports (torch, fbgemm_gpu) happen inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autoshard.cost_models.grid import BenchConfig

_LR = 0.01


@dataclass(frozen=True)
class Lookups:
    """One step's lookups for the operator's tables (table-major), with their statistics.

    Args:
        indices: Row ids within the operator's partition, per table: ``num_tables`` int64 arrays.
        lengths: Bag lengths per table: ``num_tables`` arrays of ``batch`` counts.
        lookups: Mean lookups per table that fall into the partition.
        distinct: Mean distinct rows of the partition touched per table.
        share: Mean share of the whole table's lookups that fall into the partition.
    """

    indices: tuple[np.ndarray, ...]
    lengths: tuple[np.ndarray, ...]
    lookups: float
    distinct: float
    share: float


def zipf_ranks(rows: int, alpha: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` row ranks (0 = hottest) with P(rank i) proportional to (i+1)^-alpha."""
    cdf = np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -alpha)
    ranks = np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right")
    return np.minimum(ranks, rows - 1)


def make_lookups(cfg: BenchConfig) -> Lookups:
    """Draws the batch of every table and keeps the lookups that fall into ``cfg``'s partition.

    Ranks are mapped to partition rows through a random permutation, so hot rows lie scattered
    in memory as hashed ids do.
    """
    rng = np.random.default_rng(cfg.draw_seed)
    lo, hi = {"full": (0, cfg.rows), "hot": (0, cfg.hot_rows),
              "cold": (cfg.hot_rows, cfg.rows)}[cfg.part]
    batches = [zipf_ranks(cfg.rows, cfg.alpha, cfg.batch * cfg.pooling, rng)
               for _ in range(cfg.num_tables)]
    perm = np.random.default_rng([cfg.draw_seed, lo]).permutation(hi - lo)
    indices, lengths, counts, distinct = [], [], [], []
    for ranks in batches:
        keep = (ranks >= lo) & (ranks < hi)
        bags = np.repeat(np.arange(cfg.batch), cfg.pooling)[keep]
        ids = perm[ranks[keep] - lo]
        indices.append(ids.astype(np.int64))
        lengths.append(np.bincount(bags, minlength=cfg.batch).astype(np.int64))
        counts.append(ids.size)
        distinct.append(np.unique(ids).size)
    total = cfg.batch * cfg.pooling
    return Lookups(tuple(indices), tuple(lengths), float(np.mean(counts)),
                   float(np.mean(distinct)), float(np.mean(counts)) / total)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


class TorchBags:
    """``num_tables`` separate ``nn.EmbeddingBag(mode='sum', sparse=True)`` with SGD (unfused)."""

    def __init__(self, cfg: BenchConfig, lk: Lookups, device: str) -> None:
        import torch

        dtype = torch.float16 if cfg.dtype == "fp16" else torch.float32
        self.bags = [torch.nn.EmbeddingBag(cfg.part_rows, cfg.dim, mode="sum", sparse=True,
                                           device=device, dtype=dtype)
                     for _ in range(cfg.num_tables)]
        self.inputs = [(torch.from_numpy(i).to(device), torch.from_numpy(_offsets(n)[:-1]).to(
            device)) for i, n in zip(lk.indices, lk.lengths, strict=True)]
        params = [p for b in self.bags for p in b.parameters()]
        self.opt = torch.optim.SGD(params, lr=_LR)

    def forward(self) -> Any:
        import torch

        return torch.cat([b(i, o) for b, (i, o) in zip(self.bags, self.inputs, strict=True)], dim=1)

    def backward(self, out: Any) -> None:
        out.backward(out.detach())
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class FbgemmBags:
    """FBGEMM's fused table-batched operator (``SplitTableBatchedEmbeddingBagsCodegen``).

    Sum pooling, exact row-wise Adagrad fused into backward (one optimizer float per row, as
    :class:`autoshard.tables.Table` assumes). ``location`` is an FBGEMM EmbeddingLocation name:
    HOST on CPU; DEVICE / MANAGED / MANAGED_CACHING on CUDA for the hbm / uvm / uvm_caching tiers.
    """

    def __init__(self, cfg: BenchConfig, lk: Lookups, device: str, location: str) -> None:
        import torch
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        compute = ComputeDevice.CUDA if device.startswith("cuda") else ComputeDevice.CPU
        loc = EmbeddingLocation[location]
        specs = [(cfg.part_rows, cfg.dim, loc, compute)] * cfg.num_tables
        precision = SparseType.FP16 if cfg.dtype == "fp16" else SparseType.FP32
        extra = {"device": torch.device(device)} if compute == ComputeDevice.CUDA else {}
        self.op = SplitTableBatchedEmbeddingBagsCodegen(
            specs, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=_LR,
            pooling_mode=PoolingMode.SUM, weights_precision=precision, **extra)
        ids = np.concatenate(lk.indices)
        offs = _offsets(np.concatenate(lk.lengths))
        self.indices = torch.from_numpy(ids).to(device)
        self.offsets = torch.from_numpy(offs).to(device)

    def forward(self) -> Any:
        return self.op(self.indices, self.offsets)

    def backward(self, out: Any) -> None:
        out.backward(out.detach())


class PinnedHostBags:
    """Torch stand-in for UVM where FBGEMM has no CUDA build: rows live in pinned host memory.

    Forward gathers the looked-up rows on the host, copies them to the GPU and sums the bags
    there; backward copies the row gradients back and applies SGD on the host.
    """

    def __init__(self, cfg: BenchConfig, lk: Lookups, device: str) -> None:
        import torch

        dtype = torch.float16 if cfg.dtype == "fp16" else torch.float32
        self.device = device
        self.weights = [torch.randn(cfg.part_rows, cfg.dim, dtype=dtype).pin_memory()
                        for _ in range(cfg.num_tables)]
        self.inputs = [(torch.from_numpy(i), torch.from_numpy(_offsets(n)[:-1]).to(device))
                       for i, n in zip(lk.indices, lk.lengths, strict=True)]

    def forward(self) -> Any:
        import torch
        import torch.nn.functional as F

        outs = []
        for w, (idx, off) in zip(self.weights, self.inputs, strict=True):
            rows = w.index_select(0, idx).pin_memory().to(self.device, non_blocking=True)
            pos = torch.arange(rows.shape[0], device=self.device)
            outs.append(F.embedding_bag(pos, rows, off, mode="sum"))
        return torch.cat(outs, dim=1)

    def backward(self, out: Any) -> None:
        dim = self.weights[0].shape[1]
        for t, (w, (idx, off)) in enumerate(zip(self.weights, self.inputs, strict=True)):
            grad = out[:, t * dim:(t + 1) * dim]
            lengths = off.diff(append=off.new_tensor([idx.numel()]))
            rows = grad.repeat_interleave(lengths, dim=0).to("cpu")
            w.index_add_(0, idx, rows.to(w.dtype), alpha=-_LR)


def fbgemm_available(device: str) -> bool:
    """Whether FBGEMM's table-batched operator runs on ``device`` (tries a tiny one)."""
    cfg = BenchConfig(op="fbgemm", rows=8, dim=4, pooling=1, batch=2, alpha=0.0,
                      tier="hbm" if device.startswith("cuda") else "host")
    try:
        op = build_operator(cfg, make_lookups(cfg), device)
        op.backward(op.forward())
    except Exception:  # any failure to import, build or run: unavailable
        return False
    return True


def build_operator(cfg: BenchConfig, lk: Lookups, device: str) -> Any:
    """The operator for ``cfg`` on ``device`` (``cpu`` or ``cuda``)."""
    if cfg.op == "torch":
        if device.startswith("cuda") and cfg.tier == "uvm":
            return PinnedHostBags(cfg, lk, device)
        return TorchBags(cfg, lk, device)
    location = {"host": "HOST", "hbm": "DEVICE", "uvm": "MANAGED",
                "uvm_caching": "MANAGED_CACHING"}[cfg.tier]
    return FbgemmBags(cfg, lk, device, location)
