"""Lower bounds on the step cost of any feasible plan of a task."""

from __future__ import annotations

import numpy as np

from autoshard.access import GRID
from autoshard.cost import CostModel
from autoshard.task import ShardingTask


def table_cost_curves(task: ShardingTask, cost_model: CostModel,
                      device: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each table's cost (ms) and HBM bytes at every :data:`GRID` point of its rows on ``device``,
    with HBM rows capped by that device's HBM capacity. Shapes [T, len(GRID)]."""
    a = task.table_arrays
    cap_rows = np.floor(task.device_arrays.hbm_capacity[device] / a.memory_bytes_per_row)
    max_rows = np.minimum(a.rows, cap_rows)
    k = np.minimum(np.round(GRID[None, :] * a.rows[:, None]), max_rows[:, None])
    t_idx = np.repeat(np.arange(task.num_tables), GRID.size)
    d_idx = np.full(t_idx.size, device)
    cost = cost_model.price(task, t_idx, d_idx, k.ravel()).total_ms.reshape(k.shape)
    return cost, k * a.memory_bytes_per_row[:, None]


def lower_bound_ms(task: ShardingTask, cost_model: CostModel) -> float:
    """A lower bound on the step cost (max over devices) of every feasible plan.

    The larger of (a) the largest single table's cheapest cost, and (b) the least total work of
    all tables given the cluster's aggregate HBM capacity, spread evenly over the devices. (b)
    solves a fractional knapsack over the segments of each table's cost curve: a relaxation of
    any real plan, exact for models linear in the HBM share between grid points (the analytical
    model). Devices are priced by each distinct device kind; the cheapest kind is taken.
    """
    kinds = _device_kinds(task)
    best_cost = None
    best_bytes = None
    for d in kinds:
        cost, used = table_cost_curves(task, cost_model, d)
        if best_cost is None or best_bytes is None:
            best_cost, best_bytes = cost, used
        else:
            better = cost < best_cost
            best_cost = np.where(better, cost, best_cost)
            best_bytes = np.where(better, used, best_bytes)
    assert best_cost is not None and best_bytes is not None
    single = float(best_cost.min(axis=1).max())
    saving = best_cost[:, :-1] - best_cost[:, 1:]
    extra = best_bytes[:, 1:] - best_bytes[:, :-1]
    useful = (extra > 0) & (saving > 0)
    saving, extra = saving[useful], extra[useful]
    order = np.argsort(-saving / extra, kind="stable")
    saving, extra = saving[order], extra[order]
    budget = float(task.device_arrays.hbm_capacity.sum())
    filled = np.cumsum(extra)
    whole = filled <= budget
    total_saving = float(saving[whole].sum())
    partial = np.flatnonzero(~whole)
    if partial.size:
        i = partial[0]
        room = budget - (filled[i - 1] if i > 0 else 0.0)
        total_saving += float(saving[i] * room / extra[i])
    work = float(best_cost[:, 0].sum()) - total_saving
    return max(single, work / task.num_devices)


def _device_kinds(task: ShardingTask) -> list[int]:
    """One representative device index per distinct (capacity, bandwidth, link share) kind."""
    dev = task.device_arrays
    seen: dict[tuple[float, ...], int] = {}
    for d in range(task.num_devices):
        key = (dev.hbm_capacity[d], dev.hbm_gbps[d], dev.host_gbps[d], dev.intra_share[d])
        seen.setdefault(tuple(float(v) for v in key), d)
    return list(seen.values())
