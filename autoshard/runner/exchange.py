"""The all-to-all of pooled embeddings (model parallel to data parallel, and back).

Every rank pools its tables for the whole global batch; sample block ``q`` of that output goes
to rank ``q``, which then holds all tables' pooled features for its own samples. Backward sends
the gradients the other way. Both run as one ``all_to_all_single`` with uneven splits (gloo and
NCCL both implement it). Replicated tables stay out of it: each rank pools its replicas for its
own samples, and :class:`Assembly` places their output beside the received pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autoshard.runner.config import ShardTable


def sample_blocks(batch_size: int, world: int) -> list[int]:
    """Samples per rank: the global batch split as evenly as possible."""
    base, extra = divmod(batch_size, world)
    return [base + (1 if q < extra else 0) for q in range(world)]


class Exchange:
    """Split sizes of both directions for one rank.

    Args:
        dims: Pooled width (sum of table dims) of every rank, rank order.
        batch_size: Global batch.
        rank: This rank.
        device: Where the buffers live.
    """

    def __init__(self, dims: Sequence[int], batch_size: int, rank: int, device: Any) -> None:
        self.dims = list(dims)
        self.rank = rank
        self.device = device
        self.blocks = sample_blocks(batch_size, len(self.dims))
        mine, width = self.blocks[rank], self.dims[rank]
        self.send_fwd = [b * width for b in self.blocks]
        self.recv_fwd = [mine * d for d in self.dims]

    def forward(self, pooled: Any) -> Any:
        """[B, dims[rank]] pooled output -> [B_rank, sum(dims)] features of this rank's samples."""
        import torch
        import torch.distributed as dist

        mine = self.blocks[self.rank]
        if not any(self.dims):  # every table replicated: nothing to exchange
            return torch.zeros((mine, 0), device=self.device)
        out = torch.empty(sum(self.recv_fwd), device=self.device)
        dist.all_to_all_single(out, pooled.contiguous().view(-1), self.recv_fwd, self.send_fwd)
        parts = [p.view(mine, d) for p, d in zip(out.split(self.recv_fwd), self.dims, strict=True)]
        return torch.cat(parts, dim=1)

    def backward(self, grad: Any) -> Any:
        """[B_rank, sum(dims)] feature gradients -> [B, dims[rank]] pooled-output gradient."""
        import torch
        import torch.distributed as dist

        if not any(self.dims):
            return torch.zeros((sum(self.blocks), 0), device=self.device)
        send = torch.cat([g.contiguous().view(-1) for g in grad.split(self.dims, dim=1)])
        out = torch.empty(sum(self.send_fwd), device=self.device)
        dist.all_to_all_single(out, send, self.send_fwd, self.recv_fwd)
        return out.view(sum(self.blocks), self.dims[self.rank])


class Assembly:
    """The received pooled pieces of every rank, and the rank's own replicas' output -> each
    table's pooled features in task order, and back.

    After the all-to-all a rank holds, for its samples, every rank's pieces side by side in rank
    order; its replicas' pooled output (already of its own samples) comes after them. A whole
    table's piece, or a replica's, is its features; column blocks of a table are placed side by
    side at their columns; row shards' pieces are partial sums of the full dim and are added
    (the reduction of a row-wise table). Backward hands each piece its slice of the table's
    gradient (every row shard the full gradient of the sum). Where every piece already sits at
    its table's columns, the pieces are kept as they come.

    Args:
        layout: The pieces that go through the all-to-all, of every rank, rank order.
        replicas: The replicas every rank holds, task order.
    """

    def __init__(self, layout: Sequence[Sequence[ShardTable]],
                 replicas: Sequence[ShardTable] = ()) -> None:
        pieces = [t for ts in layout for t in ts]
        self.received = sum(t.dim for t in pieces)
        self.local = sum(t.dim for t in replicas)
        pieces += list(replicas)
        widths = dict(sorted({t.position: t.full_dim for t in pieces}.items()))
        offsets, edge = {}, 0
        for position, width in widths.items():
            offsets[position] = edge
            edge += width
        self.width = edge
        self.moves: list[tuple[int, int, int]] = []  # (source column, width, target column)
        source = 0
        for t in pieces:
            self.moves.append((source, t.dim, offsets[t.position] + t.col_start))
            source += t.dim
        self.identity = source == edge and all(s == d for s, _, d in self.moves)

    def forward(self, received: Any, local: Any = None) -> Any:
        """[B_rank, received widths] from the all-to-all and [B_rank, replica widths] ->
        [B_rank, sum of table dims] (task order)."""
        import torch

        features = received if local is None or not self.local else torch.cat(
            [received, local], dim=1)
        if self.identity:
            return features
        out = torch.zeros((features.shape[0], self.width), device=features.device)
        for s, w, d in self.moves:
            out[:, d:d + w] += features[:, s:s + w]
        return out

    def backward(self, grad: Any) -> tuple[Any, Any]:
        """[B_rank, sum of table dims] gradient -> (the received pieces' gradients, as received;
        the replicas' output gradient)."""
        import torch

        pieces = grad if self.identity else torch.cat(
            [grad[:, d:d + w] for _, w, d in self.moves], dim=1)
        return pieces[:, :self.received], pieces[:, self.received:]
