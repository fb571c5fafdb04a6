"""One step of a rank, part by part: the timed runs and the correctness check both run it.

Forward: each tier pools the rank's pieces for the global batch, the replicas pool the rank's own
samples, the pieces' outputs go through the all-to-all and are assembled with the replicas'
into the rank's features (task order). In training the loss gradient goes back the same way,
each tier runs backward and row-wise Adagrad on its touched rows, and the replicas' gradients
are all-reduced before their dense update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoshard.runner.config import RunConfig
from autoshard.runner.exchange import Assembly, Exchange
from autoshard.runner.shard import PreparedBatch, RankShard

#: The parts of a step, in order, ms. ``wait`` is the barrier before the all-to-all and
#: ``sync_wait`` the one before the replicas' all-reduce (only where the plan replicates a
#: table): time spent waiting for slower ranks (load imbalance), kept out of the rank's own
#: work. ``allreduce`` is the replicas' gradient all-reduce, ``replica_step`` their dense
#: update. ``step`` is the whole step.
PARTS = ("hbm_fwd", "uvm_fwd", "replica_fwd", "combine", "wait", "comm_fwd", "dense", "comm_bwd",
         "hbm_bwd", "uvm_bwd", "replica_bwd", "sync_wait", "allreduce", "replica_step", "step")
#: The parts an inference step runs; the others take no time.
INFER_PARTS = PARTS[:PARTS.index("dense")]

Mark = Callable[[], None]


def run_step(shard: RankShard, exchange: Exchange, assembly: Assembly, batch: PreparedBatch,
             config: RunConfig, mark: Mark) -> Any:
    """Runs one step; calls ``mark`` before the first part and after each part it runs
    (:data:`PARTS` but ``step``; :data:`INFER_PARTS` in inference).

    Returns:
        The rank's features [own samples, sum of table dims], task order.
    """
    import torch.distributed as dist

    mark()
    parts = [shard.forward_tier("hbm", batch)]
    mark()
    parts.append(shard.forward_tier("uvm", batch))
    mark()
    local = shard.forward_replicas(batch, exchange.blocks[exchange.rank])
    mark()
    pooled = shard.combine(parts, config.batch_size)
    mark()
    dist.barrier()
    mark()
    features = assembly.forward(exchange.forward(pooled), local)
    mark()
    if config.train:
        backward(shard, exchange, assembly, batch, features, mark)
    return features


def backward(shard: RankShard, exchange: Exchange, assembly: Assembly, batch: PreparedBatch,
             features: Any, mark: Mark) -> None:
    """The training half of :func:`run_step`, from the loss gradient on.

    The loss is 0.5 * mean |x_b|^2 over the rank's own samples, so every table's gradient is
    the sum over ranks of their losses' gradients: the all-to-all brings the model-parallel
    pieces each rank's share, and the replicas' all-reduce sums theirs.
    """
    import torch.distributed as dist

    grad = features / max(features.shape[0], 1)
    mark()
    received, replica_grad = assembly.backward(grad)
    local_grad = exchange.backward(received)
    mark()
    shard.backward_tier("hbm", batch, local_grad)
    mark()
    shard.backward_tier("uvm", batch, local_grad)
    mark()
    shard.backward_replicas(batch, replica_grad)
    mark()
    if shard.replicas is not None:  # every rank holds the replicas: all take this barrier
        dist.barrier()
    mark()
    shard.sync_replicas()
    mark()
    shard.step_replicas()
    mark()
