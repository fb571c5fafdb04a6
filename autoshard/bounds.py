"""Lower bounds on the step cost of any feasible plan of a task."""

from __future__ import annotations

import numpy as np

from autoshard.access import GRID
from autoshard.cost import CostModel
from autoshard.task import ShardingTask


def table_cost_curves(task: ShardingTask, cost_model: CostModel, device: int = 0,
                      hbm_bytes: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each table's cost (ms) and HBM bytes with the hottest :data:`GRID` fraction of its rows
    in the HBM of ``device``. Shapes [T, len(GRID)].

    Row counts are the exact (fractional) grid points, so that a cost model linear in the HBM
    share between grid points (the analytical model) is linear between these samples too; they
    are capped by ``hbm_bytes`` (default: that device's HBM capacity).
    """
    a = task.table_arrays
    cap = task.device_arrays.hbm_capacity[device] if hbm_bytes is None else hbm_bytes
    max_rows = np.minimum(a.rows, np.floor(cap / a.memory_bytes_per_row))
    k = np.minimum(GRID[None, :] * a.rows[:, None], max_rows[:, None])
    t_idx = np.repeat(np.arange(task.num_tables), GRID.size)
    d_idx = np.full(t_idx.size, device)
    cost = cost_model.price(task, t_idx, d_idx, k.ravel()).total_ms.reshape(k.shape)
    return cost, k * a.memory_bytes_per_row[:, None]


def lower_bound_ms(task: ShardingTask, cost_model: CostModel) -> float:
    """A lower bound on the step cost (max over devices) of every feasible plan.

    The larger of (a) the largest single table's cheapest cost on any device, and (b) the least
    total work of all tables given the cluster's aggregate HBM capacity, spread evenly over the
    devices. (b) solves a fractional knapsack over the segments of each table's cost curve, each
    segment bought on its own: a relaxation of every real plan whenever the cost model is linear
    in the HBM share between grid points (true of the analytical model), whatever the shape of
    the access curve. With several kinds of device (capacity, bandwidth, link share) each
    table's curve is the cheapest over kinds on a common row grid.
    """
    dev = task.device_arrays
    kinds = _device_kinds(task)
    top = float(dev.hbm_capacity.max())
    single = np.full(task.num_tables, np.inf)
    best_cost: np.ndarray | None = None
    best_bytes: np.ndarray | None = None
    for d in kinds:
        cost, used = table_cost_curves(task, cost_model, d)
        single = np.minimum(single, cost.min(axis=1))
        if dev.hbm_capacity[d] != top:
            cost, used = table_cost_curves(task, cost_model, d, hbm_bytes=top)
        best_cost = cost if best_cost is None else np.minimum(best_cost, cost)
        best_bytes = used  # the same grid for every kind, capped at the largest capacity
    assert best_cost is not None and best_bytes is not None
    work = _least_work(best_cost, best_bytes, float(dev.hbm_capacity.sum()))
    return max(float(single.max()), work / task.num_devices)


def _least_work(cost: np.ndarray, used: np.ndarray, budget: float) -> float:
    """Least total cost of all tables when their HBM bytes together stay within ``budget``,
    relaxed to a fractional knapsack over the curves' segments (cost [T, G], bytes [T, G])."""
    saving = cost[:, :-1] - cost[:, 1:]
    extra = used[:, 1:] - used[:, :-1]
    useful = (extra > 0) & (saving > 0)
    saving, extra = saving[useful], extra[useful]
    order = np.argsort(-saving / extra, kind="stable")
    saving, extra = saving[order], extra[order]
    filled = np.cumsum(extra)
    whole = filled <= budget
    total_saving = float(saving[whole].sum())
    partial = np.flatnonzero(~whole)
    if partial.size:
        i = partial[0]
        room = budget - (filled[i - 1] if i > 0 else 0.0)
        total_saving += float(saving[i] * room / extra[i])
    return float(cost[:, 0].sum()) - total_saving


def _device_kinds(task: ShardingTask) -> list[int]:
    """One representative device index per distinct (capacity, bandwidth, link share) kind."""
    dev = task.device_arrays
    seen: dict[tuple[float, ...], int] = {}
    for d in range(task.num_devices):
        key = (dev.hbm_capacity[d], dev.hbm_gbps[d], dev.host_gbps[d], dev.intra_share[d])
        seen.setdefault(tuple(float(v) for v in key), d)
    return list(seen.values())
