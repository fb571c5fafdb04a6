"""Embedding kernels of one memory tier on one rank: plain torch, and FBGEMM's fused operator.

A tier holds, for each of the rank's tables that has rows in it, a contiguous block of rows
(the hot block ``[0, hbm_rows)`` or the cold block ``[hbm_rows, rows)``). Both kernels answer the
same three calls: ``prepare`` (untimed input pipeline), ``forward`` (pooled sums per table) and
``backward`` (gradient and optimizer step on the touched rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoshard.runner.data import TierInput


@dataclass(frozen=True)
class TierTable:
    """A table's block of rows in one tier."""

    slot: int  # position among the rank's tables (column block of the pooled output)
    rows: int
    dim: int


def rowwise_adagrad(weight: Any, state: Any, rows: Any, grad: Any, lr: float,
                    eps: float = 1e-8) -> None:
    """Row-wise Adagrad on distinct ``rows``: one accumulator per row (FBGEMM's default)."""
    state.index_add_(0, rows, grad.pow(2).mean(dim=1))
    scale = lr / (state.index_select(0, rows).sqrt() + eps)
    weight.index_add_(0, rows, grad * -scale.unsqueeze(1))


class TorchTier:
    """One tier with ``torch.nn.functional.embedding_bag`` per table.

    When the weights live where the lookups run (every tier on CPU; the HBM tier on CUDA) the
    kernel pools straight from the weights. When they do not (the host tier of a CUDA rank) it is
    *staged*: the touched rows are gathered in pinned host memory, copied to the GPU and pooled
    there, and their gradients come back for the update on the host, which is the traffic a UVM
    tier puts on the host link.

    Args:
        tables: The tier's blocks.
        weights_device: Where the rows live.
        compute_device: Where the pooling runs.
        lr: Row-wise Adagrad learning rate.
        seed: Seeds the initial weights.
        staged: Force the staged path (default: staged when the two devices differ).
    """

    def __init__(self, tables: Sequence[TierTable], weights_device: Any, compute_device: Any,
                 lr: float, seed: int, staged: bool | None = None) -> None:
        import torch

        self.tables = tuple(tables)
        self.weights_device = torch.device(weights_device)
        self.compute_device = torch.device(compute_device)
        apart = self.weights_device != self.compute_device
        self.staged = apart if staged is None else staged
        pin = apart and self.weights_device.type == "cpu"
        self.pinned = pin
        gen = torch.Generator().manual_seed(seed)
        self.weights = []
        self.state = []
        for t in self.tables:
            w = torch.empty((t.rows, t.dim), pin_memory=pin).uniform_(-0.05, 0.05, generator=gen)
            self.weights.append(w.to(self.weights_device))
            self.state.append(torch.zeros(t.rows, device=self.weights_device))
        self.lr = lr

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes + s.nbytes for w, s in zip(self.weights, self.state, strict=True))

    def prepare(self, inputs: Sequence[TierInput]) -> list[dict[str, Any]]:
        """Moves one batch's lookups (one :class:`TierInput` per table) to the devices."""
        import torch

        out = []
        for x in inputs:
            idx = torch.from_numpy(x.indices)
            uniq, inv = torch.unique(idx, return_inverse=True)
            dev = self.compute_device
            out.append({"indices": idx.to(dev), "offsets": torch.from_numpy(x.offsets[:-1]).to(dev),
                        "bags": torch.from_numpy(x.bags).to(dev), "uniq": uniq.to(
                            self.weights_device), "inv": inv.to(dev)})
        return out

    def forward(self, batch: list[dict[str, Any]]) -> list[Any]:
        """Pooled sums [B, dim] per table."""
        import torch.nn.functional as F

        pooled = []
        for w, x in zip(self.weights, batch, strict=True):
            if self.staged:
                rows = self._gather(w, x["uniq"]).to(self.compute_device, non_blocking=True)
                pooled.append(F.embedding_bag(x["inv"], rows, x["offsets"], mode="sum"))
            else:
                pooled.append(F.embedding_bag(x["indices"], w, x["offsets"], mode="sum"))
        return pooled

    def _gather(self, weight: Any, rows: Any) -> Any:
        """The touched rows, copied into pinned memory when the weights are pinned host memory."""
        import torch

        if not self.pinned:
            return weight.index_select(0, rows)
        out = torch.empty((rows.numel(), weight.shape[1]), pin_memory=True)
        return torch.index_select(weight, 0, rows, out=out)

    def row_grads(self, batch: list[dict[str, Any]], grads: Sequence[Any]) -> list[Any]:
        """Per table, the gradient of each touched row (``uniq`` of :meth:`prepare`; the sum
        over its lookups of their bags' pooled-output gradient), where the weights live."""
        import torch

        out = []
        for w, x, g in zip(self.weights, batch, grads, strict=True):
            per_lookup = g.index_select(0, x["bags"])
            g_rows = torch.zeros((x["uniq"].numel(), w.shape[1]), device=self.compute_device)
            g_rows.index_add_(0, x["inv"], per_lookup)
            out.append(g_rows.to(self.weights_device))
        return out

    def backward(self, batch: list[dict[str, Any]], grads: Sequence[Any]) -> None:
        """Gradient of each touched row (sum over its lookups) and the optimizer step."""
        for w, s, x, g in zip(self.weights, self.state, batch, self.row_grads(batch, grads),
                              strict=True):
            rowwise_adagrad(w, s, x["uniq"], g, self.lr)


class FbgemmTier:
    """One tier as one FBGEMM ``SplitTableBatchedEmbeddingBagsCodegen`` (all the tier's blocks
    batched in one operator, row-wise Adagrad fused into backward).

    Locations: host memory on CPU; on CUDA, ``DEVICE`` for the HBM tier and ``MANAGED`` (UVM) for
    the host tier.
    """

    def __init__(self, tables: Sequence[TierTable], tier: str, compute_device: Any,
                 lr: float, seed: int) -> None:
        import torch
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            EmbeddingLocation,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        self.tables = tuple(tables)
        self.compute_device = torch.device(compute_device)
        if self.compute_device.type == "cuda":
            where = EmbeddingLocation.DEVICE if tier == "hbm" else EmbeddingLocation.MANAGED
            kind = ComputeDevice.CUDA
        else:
            where, kind = EmbeddingLocation.HOST, ComputeDevice.CPU
        torch.manual_seed(seed)
        self.op = SplitTableBatchedEmbeddingBagsCodegen(
            [(t.rows, t.dim, where, kind) for t in self.tables],
            optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=lr,
            device=self.compute_device)
        self.dims = [t.dim for t in self.tables]
        self._out: Any = None

    @property
    def nbytes(self) -> int:
        return int(sum(t.rows * (t.dim + 1) * 4 for t in self.tables))

    @property
    def weights(self) -> list[Any]:
        """Each block's weights (views into the operator's storage), as :class:`TorchTier`'s."""
        return list(self.op.split_embedding_weights())

    @property
    def state(self) -> list[Any]:
        """Each block's row-wise Adagrad accumulator [rows], as :class:`TorchTier`'s."""
        return [s[0] for s in self.op.split_optimizer_states()]

    def prepare(self, inputs: Sequence[TierInput]) -> dict[str, Any]:
        """Concatenates the tables' lookups table-major, as the operator expects."""
        import torch

        base = np.cumsum([0] + [x.indices.size for x in inputs])
        offsets = np.concatenate([x.offsets[:-1] + b for x, b in zip(inputs, base, strict=False)]
                                 + [base[-1:]])
        indices = np.concatenate([x.indices for x in inputs])
        dev = self.compute_device
        return {"indices": torch.from_numpy(indices).to(dev),
                "offsets": torch.from_numpy(offsets.astype(np.int64)).to(dev)}

    def forward(self, batch: dict[str, Any]) -> list[Any]:
        self._out = self.op(batch["indices"], batch["offsets"])
        return list(self._out.split(self.dims, dim=1))

    def backward(self, batch: dict[str, Any], grads: Sequence[Any]) -> None:
        import torch

        self._out.backward(torch.cat(list(grads), dim=1))
        self._out = None
