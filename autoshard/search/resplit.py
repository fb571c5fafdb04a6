"""Re-splitting a finished plan's heaviest tables: the last step of the learned sharder's
improvement stage.

The split choice the decodes place (:func:`autoshard.layout.splitting.split_heavy_tables`) is made
before any table is placed, from each table's price alone. Where HBM is reserved per shard
(TorchRec's buffers, the ``torchrec`` reservation) or a table-row-wise split spreads a table's work
where a column split would not, the best split of a table depends on what else is on its
devices. This step revisits it on the plan itself:

- Each round takes the tables that cost at least :data:`HEAVY_SHARE` of the most loaded
  device's load (a table that is a small part of every device's work cannot move the step cost
  by its split): the dearest :data:`TABLES` on that device and overall.
- Each such table is tried in every other sharding
  :func:`autoshard.layout.splitting.candidate_splits` offers (whole too); its new shards go where
  the split fixes them (one per device of the world or of a node) or on the least loaded devices,
  with no HBM row.
- Every variant's HBM is water-filled (:func:`autoshard.search.polish.polish_plan` with no
  move); the :data:`FINALISTS` cheapest are polished in full and the cheapest of those replaces
  the plan when it lowers the step cost.

Rounds repeat until none does or the time guard
(:func:`autoshard.search.polish.step_seconds`) runs out; the result is never worse than
the input. On large tasks (where the sharder skips the split decodes) a quick mode keeps the
planning time: the dearest table on the most loaded device only, column blocks of at most
:data:`QUICK_BLOCKS`, the water-filled variants competing as they are, within
:data:`QUICK_SECONDS`.
"""

from __future__ import annotations

import time

import numpy as np

from autoshard.layout import kinds
from autoshard.layout.plan import Plan
from autoshard.layout.shards import (
    ShardGeometry,
    ShardLayout,
    column_blocks,
    one_per_device,
    plan_layout,
    pricing_task,
    whole_tables,
)
from autoshard.layout.splitting import candidate_splits
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import Curves
from autoshard.search.polish import polish_plan, step_seconds
from autoshard.task import ShardingTask

#: A table is re-split when it costs at least this share of the most loaded device's load.
HEAVY_SHARE = 0.25
#: Tables tried per round: this many of the dearest on the most loaded device, and overall.
TABLES = 2
#: Variants polished in full per round, the cheapest after water-filling first.
FINALISTS = 3
#: Most column blocks tried, and seconds at most, in the quick mode (large tasks).
QUICK_BLOCKS, QUICK_SECONDS = 8, 0.25


def resplit_plan(plan: Plan, task: ShardingTask, cost_model: CostModel, cost: float,
                 seconds: float | None = None, quick: bool = False) -> tuple[Plan, float]:
    """The plan with its heaviest tables' splits re-chosen (see the module docstring), and its
    step cost; the input and ``cost`` when no variant is cheaper.

    Args:
        plan: A valid plan of ``task``.
        task: The task.
        cost_model: Prices the variants.
        cost: The plan's step cost.
        seconds: Time guard (default: :func:`autoshard.search.polish.step_seconds` of
            the plan's tables); in the quick mode at most :data:`QUICK_SECONDS`.
        quick: For large tasks: only the dearest table on the most loaded device, column
            blocks of at most :data:`QUICK_BLOCKS`, and the water-filled variants compete as
            they are (no polish).
    """
    if seconds is None:
        seconds = step_seconds(len(plan.placements), task.num_devices)
    seconds = min(seconds, QUICK_SECONDS) if quick else seconds
    stop = time.perf_counter() + seconds
    best, best_cost = plan, cost
    while time.perf_counter() < stop:
        variants = _variants(best, task, cost_model, quick)
        if not variants:
            break
        curves: dict[bytes, Curves] = {}
        scored: list[tuple[float, int, Plan, Plan]] = []
        for layout in variants:
            if time.perf_counter() >= stop:
                break
            candidate = layout.to_plan(task, plan.sharder)
            filled, c = polish_plan(candidate, task, cost_model, np.inf, curves=curves,
                                    fill_only=True)
            scored.append((c, len(scored), candidate, filled))
        scored.sort(key=lambda q: q[:2])
        found, found_cost = best, best_cost
        if quick:  # the water-filled variants compete as they are
            if scored and scored[0][0] < found_cost:
                found, found_cost = scored[0][3], scored[0][0]
        else:
            for _, _, candidate, _ in scored[:FINALISTS]:
                if time.perf_counter() >= stop:
                    break
                polished, c = polish_plan(candidate, task, cost_model, np.inf, curves=curves)
                if c < found_cost:
                    found, found_cost = polished, c
        if not found_cost < best_cost:
            break
        best, best_cost = found, found_cost
    return best, best_cost


def _variants(plan: Plan, task: ShardingTask, cost_model: CostModel, quick: bool = False
              ) -> list[ShardLayout]:
    """Layouts of ``plan`` with one heavy table in another sharding, its new shards placed
    with no HBM row (``quick``: see :func:`resplit_plan`)."""
    layout = plan_layout(plan, task)
    g = layout.geometry
    price = cost_model.price(pricing_task(task, g), np.arange(g.num_shards), layout.device,
                             layout.hbm_rows).total_ms
    n_d = task.num_devices
    load = np.bincount(layout.device, weights=price, minlength=n_d)
    per_table = np.bincount(g.table, weights=price, minlength=task.num_tables)
    heavy = per_table >= HEAVY_SHARE * load.max()
    on_top = np.flatnonzero(layout.device == int(np.argmax(load)))
    ranked = g.table[on_top[np.argsort(-price[on_top], kind="stable")]].tolist()
    tables = [t for t in ranked if heavy[t]][:1 if quick else TABLES]
    if not quick:
        tables += [t for t in np.argsort(-per_table, kind="stable")[:TABLES].tolist()
                   if heavy[t]]
    out = []
    for t in dict.fromkeys(tables):
        mine = g.table == t
        rest = np.flatnonzero(~mine)
        base = load - np.bincount(layout.device[mine], weights=price[mine], minlength=n_d)
        current = (int(g.kind[mine][0]), int(mine.sum()))
        for v in [*candidate_splits(task, t, n_d, node_local=True),
                  whole_tables(task, np.array([t]))]:
            if (int(v.kind[0]), v.num_shards) == current or not _worth_trying(v, n_d):
                continue
            if quick and kinds.splits_cols(v.kind[0]) and column_blocks(v)[-1] >= QUICK_BLOCKS:
                continue
            out.append(ShardLayout(
                ShardGeometry.concat([g.take(rest), v]),
                np.concatenate([layout.device[rest], _devices(task, v, base)]),
                np.concatenate([layout.hbm_rows[rest], np.zeros(v.num_shards, dtype=np.int64)])))
    return out


def _worth_trying(v: ShardGeometry, devices: int) -> bool:
    """Row splits over a power of two or every device (the others add little over their
    neighbours and cost a polish each)."""
    k = v.num_shards
    return k == 1 or (k & (k - 1)) == 0 or k == devices


def _devices(task: ShardingTask, v: ShardGeometry, load: np.ndarray) -> np.ndarray:
    """Devices of a table's new shards ``v`` beside ``load`` (the other items' load per
    device): where the split fixes them one per device (row ranges planned for TorchRec: shard j
    on device j; node-local ones: each column block's on the least loaded devices of a node,
    the blocks on the least loaded nodes in turn), else the least loaded devices, one shard
    each."""
    k, n_d = v.num_shards, task.num_devices
    if one_per_device(task, v).all() and k > 1:
        if not kinds.node_local(v.kind[0]):
            return np.arange(k) % n_d
        local = task.hardware.node_devices
        nodes = np.argsort(load[:n_d // local * local].reshape(-1, local).sum(axis=1),
                           kind="stable")
        block = column_blocks(v)
        out = np.empty(k, dtype=np.int64)
        for b in range(int(block.max()) + 1):
            node, idx = int(nodes[b % nodes.size]), np.flatnonzero(block == b)
            out[idx] = node * local + np.argsort(load[node * local:(node + 1) * local],
                                                 kind="stable")[:idx.size]
        return out
    return np.argsort(load, kind="stable")[:k]
