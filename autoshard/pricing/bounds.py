"""Lower bounds on the step cost of any feasible plan of a task: a fractional knapsack over
the tables' cost curves (:mod:`autoshard.pricing.curves`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.layout import kinds
from autoshard.layout.shards import ShardGeometry, shard_task
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import device_kinds, hull_values, price_total, table_cost_curves
from autoshard.task import ShardingTask


def lower_bound_ms(task: ShardingTask, cost_model: CostModel, whole_tables: bool = False,
                   deadline: float | None = None, reserved: bool = False,
                   replicas: bool = False) -> float:
    """A lower bound on the step cost (max over devices) of every feasible plan.

    The least total work of all tables given the cluster's aggregate HBM capacity, spread evenly
    over the devices: a fractional knapsack over the segments of each table's cost curve, each
    segment bought on its own. It is a relaxation of every real plan whenever the cost model is
    linear in the HBM share between grid points (true of the analytical model), whatever the
    shape of the access curve, and whether or not tables are split: a row shard's or a column
    block's curve segments are its table's scaled by its share of the rows or columns (a column
    block's own optimizer state only adds cost and bytes), and every shard pays its own kernel
    overhead and output (a row shard its full partial sums), so a split table does no less
    work for its HBM bytes than the whole one; but its shards may fill the HBM of several
    devices, so each curve runs up to the cluster's HBM. With several kinds of device
    (capacity, bandwidth, link share) each table's curve is the cheapest over kinds on a common
    row grid.

    With ``whole_tables`` the bound holds only for plans that place every table whole, and is
    also at least the dearest single table's cheapest cost on any device. Past ``deadline`` (a
    ``time.perf_counter`` instant): :class:`autoshard.errors.DeadlineReached`.

    By default the HBM counts the rows' weights alone (a bound of the same tables on any
    runtime). With ``reserved`` it counts what the task's reservation keeps
    (:mod:`autoshard.reservation`): each row in HBM at the runtime's bytes per row, and the
    cluster's HBM less every table's reservation (a split table's shards reserve at least as
    much as the table whole: their input ids, outputs and rows add up to at least its own), a
    tighter bound valid for the task as posed.

    A replicated table (``data_parallel``: a replica on every device, all in HBM, no
    all-to-all) may do less work than the table whole. With ``replicas`` each table its
    constraints let replicate has one more point on its curve, the replicas' total cost at
    the bytes of every replica (:func:`replica_points`), so that the bound holds for plans
    that replicate tables too; without, it holds for plans that do not.
    """
    relaxed = relax(task, cost_model, whole_tables, deadline, reserved, replicas)
    spread = float(relaxed.cost_ms.sum()) / task.num_devices
    return max(relaxed.single_ms, spread) if whole_tables else spread


@dataclass(frozen=True)
class Relaxation:
    """The spread-work relaxation behind :func:`lower_bound_ms`.

    Args:
        cost_ms: Each table's cost in the relaxation's optimum ([T]).
        hbm_bytes: HBM bytes it gives each table ([T]).
        single_ms: The dearest table's cheapest whole cost on any device (with
            ``whole_tables``; else its cheapest cost with the cluster's HBM, a weaker figure).
    """

    cost_ms: np.ndarray
    hbm_bytes: np.ndarray
    single_ms: float


def relax(task: ShardingTask, cost_model: CostModel, whole_tables: bool = False,
          deadline: float | None = None, reserved: bool = False, replicas: bool = False
          ) -> Relaxation:
    """Solves the fractional knapsack of :func:`lower_bound_ms` (see there); past ``deadline``
    (a ``time.perf_counter`` instant): :class:`autoshard.errors.DeadlineReached`."""
    dev = task.device_arrays
    kinds = device_kinds(task).representative
    # A whole table uses at most one device's HBM; a split one may use every device's.
    top = float(dev.hbm_capacity.max() if whole_tables else dev.hbm_capacity.sum())
    single = np.full(task.num_tables, np.inf)
    best_cost: np.ndarray | None = None
    best_bytes: np.ndarray | None = None
    for d in kinds:
        # The same grid for every kind: capped at ``top`` (one device's HBM priced only where
        # the single-table figure needs it).
        cost, used = table_cost_curves(task, cost_model, int(d), hbm_bytes=top,
                                       deadline=deadline, reserved=reserved)
        if replicas and not whole_tables:
            cost, used = _with_replicas(task, cost_model, int(d), cost, used, reserved,
                                        deadline)
        if whole_tables and dev.hbm_capacity[d] != top:
            own, _ = table_cost_curves(task, cost_model, int(d), deadline=deadline,
                                       reserved=reserved)
            single = np.minimum(single, own.min(axis=1))
        else:
            single = np.minimum(single, cost.min(axis=1))
        best_cost = cost if best_cost is None else np.minimum(best_cost, cost)
        best_bytes = used
    assert best_cost is not None and best_bytes is not None
    budget = float(dev.hbm_capacity.sum())
    if reserved:  # every table's reservation is kept somewhere, whole or split
        budget = max(budget - float(task.table_arrays.hbm_reserved_bytes.sum()), 0.0)
    cost_ms, hbm = _least_work(best_cost, best_bytes, budget)
    return Relaxation(cost_ms, hbm, float(single.max()))


def replica_points(task: ShardingTask, cost_model: CostModel, device: int = 0,
                   reserved: bool = False, deadline: float | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Each table replicated on every device (:func:`autoshard.layout.shards.replicas`): the
    replicas' total cost (ms, each priced on a device like ``device``, all rows in HBM) and
    their HBM bytes (weights and optimizer state, or with ``reserved`` as the runtime counts
    them with their reservations); cost infinite where the table may not be replicated (its
    constraints, or a world of one device). Shapes [T]. Past ``deadline``:
    :class:`autoshard.errors.DeadlineReached` (:func:`price_total`)."""
    a = task.table_arrays
    n, world = task.num_tables, task.num_devices
    t = np.arange(n)
    zero = np.zeros(n, dtype=np.int64)
    g = ShardGeometry(t, zero + kinds.REPLICATED.code, zero + world, zero, a.rows, zero,
                      a.dim)
    sub = shard_task(task, g, named=False)
    b = sub.table_arrays
    one = price_total(sub, cost_model, t, np.full(n, device), b.rows, deadline)
    per_row = b.hbm_bytes_per_row if reserved else b.memory_bytes_per_row
    held = b.rows * per_row + (b.hbm_reserved_bytes if reserved else 0.0)
    allowed = np.array([task.constraints.of(x.name).allows(kinds.REPLICATED)
                        for x in task.tables]) & (world > 1)
    return np.where(allowed, world * one, np.inf), world * held


def _with_replicas(task: ShardingTask, cost_model: CostModel, device: int, cost: np.ndarray,
                   used: np.ndarray, reserved: bool, deadline: float | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The curves with each table's replicas as one more point (its last point repeated
    where it may not be replicated or the replicas cost more)."""
    rep_cost, rep_bytes = replica_points(task, cost_model, device, reserved, deadline)
    better = rep_cost < cost[:, -1]
    return (np.column_stack((cost, np.where(better, rep_cost, cost[:, -1]))),
            np.column_stack((used, np.where(better, np.maximum(rep_bytes, used[:, -1]),
                                            used[:, -1]))))


def _least_work(cost: np.ndarray, used: np.ndarray, budget: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """Each table's cost and HBM bytes when, together, their bytes stay within ``budget`` and
    their total cost is least, relaxed to a fractional knapsack over the segments of the
    curves' lower hulls (cost [T, G], bytes [T, G])."""
    cost = hull_values(cost, used)
    saving = cost[:, :-1] - cost[:, 1:]
    extra = used[:, 1:] - used[:, :-1]
    owner = np.broadcast_to(np.arange(cost.shape[0])[:, None], saving.shape)
    useful = (extra > 0) & (saving > 0)
    saving, extra, owner = saving[useful], extra[useful], owner[useful]
    order = np.argsort(-saving / extra, kind="stable")
    saving, extra, owner = saving[order], extra[order], owner[order]
    filled = np.cumsum(extra)
    bought = np.where(filled <= budget, 1.0, 0.0)
    partial = np.flatnonzero(filled > budget)
    if partial.size:
        i = partial[0]
        bought[i] = (budget - (filled[i - 1] if i > 0 else 0.0)) / extra[i]
    n = cost.shape[0]
    total_saving = np.bincount(owner, weights=saving * bought, minlength=n)
    hbm = np.bincount(owner, weights=extra * bought, minlength=n) + used[:, 0]
    return cost[:, 0] - total_saving, hbm

