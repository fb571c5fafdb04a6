"""The correctness check of a sharded run: the same steps on one unsharded copy of the tables.

Every piece (whole table, row shard, column block, replica) starts from its slice of its
table's canonical weights (:func:`table_weights`: seeded by the run's seed and the table's
position, whatever the plan). The ranks run the plan's steps untimed and return their features
of every step and their pieces' final weights. The reference pools the same global batches with
each table whole in one process, applies the same loss (0.5 * mean |x_b|^2 over each rank's own
samples) and the same row-wise Adagrad, so a correct plan gives the reference's features at every
step and its weights after the last, up to float rounding (row shards' partial sums and the
replicas' all-reduce add in another order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoshard.runner.config import RunConfig, ShardTable
from autoshard.runner.data import global_batches, shard_rows, split_tier
from autoshard.runner.exchange import Assembly, Exchange, sample_blocks
from autoshard.runner.kernels import TierTable, TorchTier, rowwise_adagrad
from autoshard.runner.shard import PreparedBatch, RankShard
from autoshard.runner.step import run_step
from autoshard.tables import Table

#: Largest |sharded - reference| difference a check passes with (float32 values about 0.05..1).
TOLERANCE = 1e-5
#: Largest relative difference of the optimizer's accumulators a check passes with.
STATE_TOLERANCE = 1e-4


@dataclass(frozen=True)
class CheckResult:
    """A sharded run against the unsharded reference.

    Args:
        steps: Steps run (warm-up and timed ones of the run's settings).
        tolerance: Largest difference that passes.
        feature_diff: Max |sharded - reference| over every step's pooled features.
        weight_diff: Per table, max |sharded - reference| of its weights after the steps, over
            its pieces (every replica of a replicated table).
        state_diff: Max over pieces of |sharded - reference| of the row-wise Adagrad
            accumulators, relative to the reference's largest: Adagrad's update hardly moves
            when every gradient is scaled alike, its accumulator does (a gradient averaged
            where it should be summed shows here).
        replica_spread: Max |replica - rank 0's replica| over the replicated tables (0 when
            none): replicas that drifted apart.
        features: The run's pooled features of every step [batch, sum of dims], task order.
        weights: The run's weights after the steps, per table [rows, dim].
    """

    steps: int
    tolerance: float
    feature_diff: float
    weight_diff: dict[str, float]
    state_diff: float
    replica_spread: float
    features: tuple[np.ndarray, ...] = field(repr=False)
    weights: dict[str, np.ndarray] = field(repr=False)

    @property
    def ok(self) -> bool:
        """Whether features, weights and replicas all agree within :attr:`tolerance`."""
        worst = max([self.feature_diff, self.replica_spread, *self.weight_diff.values()])
        return bool(worst <= self.tolerance and self.state_diff <= STATE_TOLERANCE)


def table_weights(seed: int, position: int, rows: int, dim: int) -> Any:
    """A table's canonical initial weights [rows, dim] (rows in popularity order)."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1000003 + position)
    return torch.empty((rows, dim)).uniform_(-0.05, 0.05, generator=gen)


def piece_rows(t: ShardTable) -> np.ndarray:
    """The table rows a piece holds, in its own row order."""
    if t.row_split:
        return shard_rows(t.position, t.table_rows, t.row_start, t.row_start + t.rows)
    return np.arange(t.rows)


def canonical_weights(pieces: Sequence[ShardTable], seed: int) -> list[Any]:
    """Each piece's slice of its table's canonical weights (for :meth:`RankShard.load_weights`)."""
    import torch

    tables: dict[int, Any] = {}
    out = []
    for t in pieces:
        if t.position not in tables:
            tables[t.position] = table_weights(seed, t.position, t.table_rows or t.rows,
                                               t.full_dim)
        rows = torch.from_numpy(piece_rows(t))
        out.append(tables[t.position][rows, t.col_start:t.col_start + t.dim])
    return out


def check_rank(rank: int, shard: RankShard, exchange: Exchange, assembly: Assembly,
               prepared: list[PreparedBatch], config: RunConfig,
               progress: Any) -> dict[str, Any]:
    """Runs the steps untimed; the rank's features of every step and its pieces' final
    weights, as lists (they travel as JSON)."""
    features = []
    for step in range(config.warmup + config.iterations):
        progress(f"check step {step} (in a collective)")
        out = run_step(shard, exchange, assembly, prepared[step % len(prepared)], config,
                       lambda: None)
        features.append(out.detach().cpu().tolist())
    return {"rank": rank, "features": features,
            "weights": [w.detach().cpu().tolist() for w in shard.piece_weights()],
            "states": [a.detach().cpu().tolist() for a in shard.piece_weights(state=True)]}


@dataclass(frozen=True)
class Reference:
    """What the unsharded run gives: every step's features [batch, sum of dims], and each
    table's final weights [rows, dim] and accumulators (one [rows] per column block)."""

    features: list[np.ndarray]
    weights: list[np.ndarray]
    states: list[list[np.ndarray]]


def reference(tables: Sequence[Table], config: RunConfig, world: int,
              col_blocks: dict[int, list[tuple[int, int]]] | None = None) -> Reference:
    """The unsharded run of ``tables`` (task order), with the loss of ``world`` ranks' sample
    blocks.

    Row-wise Adagrad keeps one accumulator per row of each of a table's column blocks
    (``col_blocks``: table position -> column ranges; the whole dim if absent), as a column-wise
    sharded table does (and TorchRec's): a block's accumulator sees its own columns only.
    """
    import torch

    n = len(tables)
    tier = TorchTier([TierTable(i, t.rows, t.dim) for i, t in enumerate(tables)], "cpu", "cpu",
                     config.learning_rate, seed=0)
    for i, t in enumerate(tables):
        tier.weights[i].copy_(table_weights(config.seed, i, t.rows, t.dim))
    blocks_of = [(col_blocks or {}).get(i, [(0, t.dim)]) for i, t in enumerate(tables)]
    state = [[torch.zeros(t.rows) for _ in b] for t, b in zip(tables, blocks_of, strict=True)]
    drawn = global_batches(tables, list(range(n)), config)
    count = min((len(b) for b in drawn), default=1)
    blocks = sample_blocks(config.batch_size, world)
    per_sample = torch.from_numpy(np.repeat(1.0 / np.maximum(blocks, 1), blocks).astype(
        np.float32)).unsqueeze(1)
    features = []
    for step in range(config.warmup + config.iterations):
        batch = tier.prepare([split_tier(drawn[i][step % count], 0, t.rows)
                              for i, t in enumerate(tables)])
        pooled = tier.forward(batch)
        features.append(torch.cat(pooled, dim=1).numpy().copy())
        if not config.train:
            continue
        grads = tier.row_grads(batch, [p * per_sample for p in pooled])
        for w, x, g, cols, acc in zip(tier.weights, batch, grads, blocks_of, state, strict=True):
            for (c0, c1), s in zip(cols, acc, strict=True):
                rowwise_adagrad(w[:, c0:c1], s, x["uniq"], g[:, c0:c1], config.learning_rate)
    return Reference(features, [w.numpy().copy() for w in tier.weights],
                     [[a.numpy().copy() for a in acc] for acc in state])


def compare(results: list[dict[str, Any]], layout: Sequence[Sequence[ShardTable]],
            tables: Sequence[Table], config: RunConfig) -> CheckResult:
    """Sets every rank's results (rank order) beside :func:`reference`'s.

    Args:
        results: What :func:`check_rank` returned on every rank.
        layout: Every rank's pieces (:func:`autoshard.runner.shard.rank_tables`).
        tables: The task's tables.
        config: The run's settings.
    """
    results = sorted(results, key=lambda r: r["rank"])
    blocks = column_blocks(layout)
    want = reference(tables, config, len(results), blocks)
    got = tuple(np.concatenate([np.asarray(r["features"][s], dtype=np.float32).reshape(
        -1, f.shape[1]) for r in results]) for s, f in enumerate(want.features))
    weights = [np.zeros((t.rows, t.dim), dtype=np.float32) for t in tables]
    weight_diff = dict.fromkeys((t.name for t in tables), 0.0)
    state_diff, spread = 0.0, 0.0
    for pieces, r in zip(layout, results, strict=True):
        for t, w, acc in zip(pieces, r["weights"], r["states"], strict=True):
            rows, cols = piece_rows(t), np.arange(t.col_start, t.col_start + t.dim)
            piece = np.asarray(w, dtype=np.float32).reshape(t.rows, t.dim)
            ref = want.weights[t.position][np.ix_(rows, cols)]
            name = tables[t.position].name
            weight_diff[name] = max(weight_diff[name], float(np.abs(piece - ref).max(
                initial=0.0)))
            block = blocks.get(t.position, [(0, t.dim)]).index((t.col_start, t.col_start + t.dim))
            state = want.states[t.position][block][rows]
            state_diff = max(state_diff, float(np.abs(np.asarray(acc) - state).max(initial=0.0))
                             / max(float(np.abs(state).max(initial=0.0)), 1e-30))
            if t.replica and r is not results[0]:
                first = weights[t.position]
                spread = max(spread, float(np.abs(piece - first).max(initial=0.0)))
            else:
                weights[t.position][np.ix_(rows, cols)] = piece
    return CheckResult(
        steps=len(got), tolerance=TOLERANCE,
        feature_diff=max((float(np.abs(g - w).max(initial=0.0))
                          for g, w in zip(got, want.features, strict=True)), default=0.0),
        weight_diff=weight_diff, state_diff=state_diff, replica_spread=spread, features=got,
        weights={t.name: weights[i] for i, t in enumerate(tables)})


def column_blocks(layout: Sequence[Sequence[ShardTable]]) -> dict[int, list[tuple[int, int]]]:
    """Table position -> its column blocks (start, end) in column order, for the tables the
    layout splits by columns."""
    blocks: dict[int, set[tuple[int, int]]] = {}
    for pieces in layout:
        for t in pieces:
            if t.dim != t.full_dim:  # a grid's block comes once per row shard: kept once
                blocks.setdefault(t.position, set()).add((t.col_start, t.col_start + t.dim))
    return {position: sorted(found) for position, found in blocks.items()}
