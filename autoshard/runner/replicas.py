"""A rank's replicas of the replicated tables (TorchRec's ``data_parallel``).

Every rank holds every replicated table whole, all of it in the fast tier. A replica pools only
its rank's own samples (the rank's block of the global batch,
:func:`autoshard.runner.exchange.sample_blocks`), so its output is already where the rank's
features are and it sends nothing through the all-to-all. In training each replica computes the
gradient of its whole table from its samples; the replicas' gradients are summed by one
all-reduce over all of them (the model-parallel tables' gradients are sums over the ranks too:
each rank's loss gradient reaches them through the backward all-to-all), and every replica
applies the same dense row-wise Adagrad update, so the replicas stay identical and equal to one
table trained on the global batch.

Replicas run on the torch kernel whatever the run's kernel: FBGEMM fuses the optimizer into
backward, leaving no room for the all-reduce between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autoshard.runner.config import RunConfig, ShardTable
from autoshard.runner.data import TableBatch, split_tier
from autoshard.runner.kernels import TierTable, TorchTier, rowwise_adagrad

#: Added to the replicas' weight seed so that it differs from the tiers' (same on every rank).
_SEED_OFFSET = 7919


class Replicas:
    """The replicated tables one rank holds, as one block of weights in the fast tier.

    Args:
        tables: The replicas, in task order (the same on every rank).
        config: Run settings (learning rate, seed).
        device: The rank's compute device.
    """

    def __init__(self, tables: Sequence[ShardTable], config: RunConfig, device: Any) -> None:
        import torch

        self.tables = tuple(tables)
        self.dims = [t.dim for t in self.tables]
        self.device = device
        seed = config.seed * 1000003 + _SEED_OFFSET + sum(t.position for t in self.tables)
        self.tier = TorchTier([TierTable(i, t.rows, t.dim) for i, t in enumerate(self.tables)],
                              device, device, config.learning_rate, seed)
        sizes = [t.rows * t.dim for t in self.tables]
        self.grad = torch.zeros(sum(sizes), device=device)  # every table's gradient, flat
        self._grads = [g.view(t.rows, t.dim)
                       for g, t in zip(self.grad.split(sizes), self.tables, strict=True)]
        self._rows = [torch.arange(t.rows, device=device) for t in self.tables]

    @property
    def width(self) -> int:
        """Columns of the replicas' pooled output (the sum of their dims)."""
        return sum(self.dims)

    @property
    def nbytes(self) -> int:
        """Bytes of weights and optimizer state (the gradient buffer not counted)."""
        return self.tier.nbytes

    def prepare(self, batches: Sequence[TableBatch]) -> list[dict[str, Any]]:
        """One batch of the rank's own samples, one :class:`TableBatch` per replica."""
        return self.tier.prepare([split_tier(b, 0, t.rows)
                                  for b, t in zip(batches, self.tables, strict=True)])

    def forward(self, batch: list[dict[str, Any]]) -> Any:
        """The replicas' pooled output [own samples, width], tables side by side."""
        import torch

        return torch.cat(self.tier.forward(batch), dim=1)

    def backward(self, batch: list[dict[str, Any]], grad: Any) -> None:
        """This rank's gradient of every replica (dense, zero on rows its samples miss), from
        the gradient of :meth:`forward`'s output."""
        self.grad.zero_()
        per_table = grad.split(self.dims, dim=1)
        for g, x, rows in zip(self._grads, batch, self.tier.row_grads(batch, per_table),
                              strict=True):
            g.index_add_(0, x["uniq"], rows)

    def all_reduce(self) -> None:
        """Sums the gradients of every rank's replicas (one collective for all tables)."""
        import torch.distributed as dist

        dist.all_reduce(self.grad, op=dist.ReduceOp.SUM)

    def step(self) -> None:
        """The same dense row-wise Adagrad update on every rank (a row no sample touched has a
        zero gradient and does not move)."""
        for w, s, rows, g in zip(self.tier.weights, self.tier.state, self._rows, self._grads,
                                 strict=True):
            rowwise_adagrad(w, s, rows, g, self.tier.lr)
