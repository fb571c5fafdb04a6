"""Lower bounds on the step cost of any feasible plan of a task, and the kinds of device they
(and the MILP) price on."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from autoshard.layout import kinds
from autoshard.access import GRID
from autoshard.pricing.cost import CostModel
from autoshard.layout.shards import ShardGeometry, shard_task
from autoshard.task import ShardingTask

#: Most (table, device, rows) points priced in one call when pricing against a deadline.
PRICE_CHUNK = 100_000


class DeadlineReached(Exception):
    """Raised by a phase that was given a deadline (a ``time.perf_counter`` instant) and
    reached it before finishing; the caller falls back to what it already has."""


def price_total(task: ShardingTask, cost_model: CostModel, table_idx: np.ndarray,
                device_idx: np.ndarray, hbm_rows: np.ndarray, deadline: float | None = None
                ) -> np.ndarray:
    """Total cost (ms) of each (table, device, HBM rows) point; with ``deadline``, priced in
    chunks of :data:`PRICE_CHUNK` points and :class:`DeadlineReached` raised once it passes."""
    if deadline is None or table_idx.size <= PRICE_CHUNK:
        if deadline is not None and time.perf_counter() >= deadline:
            raise DeadlineReached("pricing")
        return cost_model.price(task, table_idx, device_idx, hbm_rows).total_ms
    out = np.empty(table_idx.size)
    for lo in range(0, table_idx.size, PRICE_CHUNK):
        if time.perf_counter() >= deadline:
            raise DeadlineReached("pricing")
        part = slice(lo, lo + PRICE_CHUNK)
        out[part] = cost_model.price(task, table_idx[part], device_idx[part],
                                     hbm_rows[part]).total_ms
    return out


def table_cost_curves(task: ShardingTask, cost_model: CostModel, device: int = 0,
                      hbm_bytes: float | None = None, deadline: float | None = None,
                      reserved: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each table's cost (ms) and HBM bytes with the hottest :data:`GRID` fraction of its rows
    in the HBM of ``device``. Shapes [T, len(GRID)].

    Row counts are the exact (fractional) grid points, so that a cost model linear in the HBM
    share between grid points (the analytical model) is linear between these samples too; they
    are capped by ``hbm_bytes`` (default: that device's HBM capacity). A row's bytes are its
    weights (and optimizer state), or with ``reserved`` what the task's runtime counts for a
    row in HBM (:meth:`autoshard.task.TableArrays.hbm_bytes`). Past ``deadline``:
    :class:`DeadlineReached`.
    """
    a = task.table_arrays
    per_row = a.hbm_bytes_per_row if reserved else a.memory_bytes_per_row
    cap = task.device_arrays.hbm_capacity[device] if hbm_bytes is None else hbm_bytes
    max_rows = np.minimum(a.rows, np.floor(cap / per_row))
    k = np.minimum(GRID[None, :] * a.rows[:, None], max_rows[:, None])
    t_idx = np.repeat(np.arange(task.num_tables), GRID.size)
    d_idx = np.full(t_idx.size, device)
    cost = price_total(task, cost_model, t_idx, d_idx, k.ravel(), deadline).reshape(k.shape)
    return cost, k * per_row[:, None]


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
    ``time.perf_counter`` instant): :class:`DeadlineReached`.

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
    (a ``time.perf_counter`` instant): :class:`DeadlineReached`."""
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
            cost, used = _with_replicas(task, cost_model, int(d), cost, used, reserved)
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
                   reserved: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each table replicated on every device (:func:`autoshard.layout.shards.replicas`): the
    replicas' total cost (ms, each priced on a device like ``device``, all rows in HBM) and
    their HBM bytes (weights and optimizer state, or with ``reserved`` as the runtime counts
    them with their reservations); cost infinite where the table may not be replicated (its
    constraints, or a world of one device). Shapes [T]."""
    a = task.table_arrays
    n, world = task.num_tables, task.num_devices
    t = np.arange(n)
    zero = np.zeros(n, dtype=np.int64)
    g = ShardGeometry(t, zero + kinds.REPLICATED.code, zero + world, zero, a.rows, zero,
                      a.dim)
    sub = shard_task(task, g, named=False)
    b = sub.table_arrays
    one = cost_model.price(sub, t, np.full(n, device), b.rows).total_ms
    per_row = b.hbm_bytes_per_row if reserved else b.memory_bytes_per_row
    held = b.rows * per_row + (b.hbm_reserved_bytes if reserved else 0.0)
    allowed = np.array([task.constraints.of(x.name).allows(kinds.REPLICATED)
                        for x in task.tables]) & (world > 1)
    return np.where(allowed, world * one, np.inf), world * held


def _with_replicas(task: ShardingTask, cost_model: CostModel, device: int, cost: np.ndarray,
                   used: np.ndarray, reserved: bool) -> tuple[np.ndarray, np.ndarray]:
    """The curves with each table's replicas as one more point (its last point repeated
    where it may not be replicated or the replicas cost more)."""
    rep_cost, rep_bytes = replica_points(task, cost_model, device, reserved)
    better = rep_cost < cost[:, -1]
    return (np.column_stack((cost, np.where(better, rep_cost, cost[:, -1]))),
            np.column_stack((used, np.where(better, np.maximum(rep_bytes, used[:, -1]),
                                            used[:, -1]))))


def lower_hull(cost: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Each curve (cost [T, G] against increasing bytes [T, G]) replaced by its lower convex
    hull at the same points, flat past its cheapest point: at most the curve everywhere, with
    savings per byte that only fall along it. Curves that are already so (the analytical
    model's) are returned as they are; others (a cost model whose price can rise with HBM
    rows, as TorchRec's estimator's does) are hulled one by one."""
    saving = cost[:, :-1] - cost[:, 1:]
    extra = used[:, 1:] - used[:, :-1]
    rate = np.divide(saving, extra, out=np.zeros_like(saving), where=extra > 0)
    # Segments of no bytes (rows capped by the HBM) take their predecessor's rate.
    last = np.maximum.accumulate(np.where(extra > 0, np.arange(extra.shape[1]), 0), axis=1)
    rate = np.take_along_axis(rate, last, axis=1)
    rising = rate[:, 1:] > rate[:, :-1] * (1 + 1e-6) + 1e-300
    bad = (saving < -1e-9 * np.abs(cost[:, :-1])).any(axis=1) | rising.any(axis=1)
    if not bad.any():
        return cost
    out = cost.copy()
    for t in np.flatnonzero(bad):
        out[t] = _hull_row(cost[t], used[t])
    return out


def _hull_row(cost: np.ndarray, used: np.ndarray) -> np.ndarray:
    """One curve's lower convex hull up to its cheapest point, then flat (see
    :func:`lower_hull`)."""
    last = int(np.argmin(cost))
    keep: list[int] = []
    for i in range(last + 1):
        while len(keep) >= 2:
            a, b = keep[-2], keep[-1]
            cross = ((used[b] - used[a]) * (cost[i] - cost[a])
                     - (cost[b] - cost[a]) * (used[i] - used[a]))
            if cross > 0:
                break
            keep.pop()
        keep.append(i)
    hull = np.interp(used[:last + 1], used[keep], cost[keep])
    return np.concatenate((hull, np.full(cost.size - last - 1, cost[last])))


def _least_work(cost: np.ndarray, used: np.ndarray, budget: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """Each table's cost and HBM bytes when, together, their bytes stay within ``budget`` and
    their total cost is least, relaxed to a fractional knapsack over the segments of the
    curves' lower hulls (cost [T, G], bytes [T, G])."""
    cost = lower_hull(cost, used)
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


@dataclass(frozen=True)
class DeviceKinds:
    """Devices grouped into interchangeable kinds (same capacities, bandwidths, link shares).

    Args:
        kind: Kind of each device ([D]).
        representative: One device index per kind ([K]).
    """

    kind: np.ndarray
    representative: np.ndarray

    @property
    def count(self) -> int:
        return int(self.representative.size)

    def members(self, k: int) -> np.ndarray:
        return np.flatnonzero(self.kind == k)


def device_kinds(task: ShardingTask) -> DeviceKinds:
    """Groups the task's devices by every attribute a cost model or a capacity can see."""
    dev = task.device_arrays
    keys: dict[tuple[float, ...], int] = {}
    kind = np.empty(task.num_devices, dtype=np.int64)
    reps: list[int] = []
    for d in range(task.num_devices):
        key = tuple(float(v[d]) for v in (dev.hbm_capacity, dev.host_capacity, dev.hbm_gbps,
                                           dev.host_gbps, dev.intra_share))
        if key not in keys:
            keys[key] = len(reps)
            reps.append(d)
        kind[d] = keys[key]
    return DeviceKinds(kind, np.array(reps, dtype=np.int64))
