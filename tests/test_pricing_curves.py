"""The cost curves' one hull routine, and the placement feasibility checks."""

from __future__ import annotations

import numpy as np

from autoshard.layout.feasibility import feasible, fit_hbm
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.cost import Pricing
from autoshard.pricing.curves import hull_values, lower_hulls, table_cost_curves
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables


def _reference_hull(cost: np.ndarray, used: np.ndarray) -> np.ndarray:
    """The bound's hull as it was written before the curves shared one hull routine: curves
    already convex within a relative 1e-6 as they are, the others a scalar monotone chain per
    curve up to its cheapest point, read at the points, then flat."""
    saving = cost[:, :-1] - cost[:, 1:]
    extra = used[:, 1:] - used[:, :-1]
    rate = np.divide(saving, extra, out=np.zeros_like(saving), where=extra > 0)
    last = np.maximum.accumulate(np.where(extra > 0, np.arange(extra.shape[1]), 0), axis=1)
    rate = np.take_along_axis(rate, last, axis=1)
    rising = rate[:, 1:] > rate[:, :-1] * (1 + 1e-6) + 1e-300
    bad = (saving < -1e-9 * np.abs(cost[:, :-1])).any(axis=1) | rising.any(axis=1)
    out = cost.copy()
    for t in np.flatnonzero(bad):
        c, u = cost[t], used[t]
        cheapest = int(np.argmin(c))
        keep: list[int] = []
        for i in range(cheapest + 1):
            while len(keep) >= 2:
                a, b = keep[-2], keep[-1]
                if (u[b] - u[a]) * (c[i] - c[a]) - (c[b] - c[a]) * (u[i] - u[a]) > 0:
                    break
                keep.pop()
            keep.append(i)
        out[t] = np.concatenate((np.interp(u[:cheapest + 1], u[keep], c[keep]),
                                 np.full(c.size - cheapest - 1, c[cheapest])))
    return out


class _Wiggly:
    """The analytical model with a wiggle in HBM rows: curves that are not convex."""

    name = "wiggly"

    def __init__(self) -> None:
        self.model = AnalyticalCostModel()

    def price(self, task: ShardingTask, t: np.ndarray, d: np.ndarray,
              rows: np.ndarray) -> Pricing:
        p = self.model.price(task, t, d, rows)
        share = np.asarray(rows, dtype=float) / (1.0 + task.table_arrays.rows[t])
        return Pricing(p.hbm_ms * (1.0 + 0.2 * np.sin(37.0 * share)), p.uvm_ms, p.comm_ms)


def test_hand_curve_hull() -> None:
    """(0, 10), (1, 9), (2, 5), (3, 6): the middle point lies above the chord to (2, 5), and
    the curve is flat past its cheapest point."""
    cost = np.array([[10.0, 9.0, 5.0, 6.0]])
    used = np.array([[0.0, 1.0, 2.0, 3.0]])
    assert hull_values(cost, used).tolist() == [[10.0, 7.5, 5.0, 5.0]]
    (hx, hy), = lower_hulls(used, cost)
    assert hx.tolist() == [0.0, 2.0, 3.0] and hy.tolist() == [10.0, 5.0, 6.0]


def test_bound_hull_is_bit_for_bit_the_scalar_chain_on_random_curves() -> None:
    rng = np.random.default_rng(0)
    used = np.cumsum(rng.integers(0, 3, size=(400, 12)), axis=1).astype(float)  # repeats
    cost = np.where(rng.random((400, 1)) < 0.3, (used - 8.0) ** 2, rng.random((400, 12)) * 5)
    # Repeated bytes carry the same price (the same rows priced twice).
    first = np.ones(used.shape, dtype=bool)
    first[:, 1:] = used[:, 1:] != used[:, :-1]
    source = np.maximum.accumulate(np.where(first, np.arange(12)[None, :], 0), axis=1)
    cost = np.take_along_axis(cost, source, axis=1)
    got = hull_values(cost, used)
    assert np.array_equal(got, _reference_hull(cost, used))
    assert (got != cost).any(axis=1).sum() >= 100  # the chain ran on many curves
    assert (got <= cost + 1e-12).all()


def test_bound_hull_is_bit_for_bit_the_scalar_chain_on_task_curves() -> None:
    for n, devices, reserved in ((6, 2, False), (20, 4, True), (40, 8, False)):
        task = constrained_task(dlrm_tables(n, seed=n), devices, 0.3, reservation="torchrec")
        for model in (AnalyticalCostModel(), _Wiggly()):
            cost, used = table_cost_curves(task, model, 0, reserved=reserved)
            assert np.array_equal(hull_values(cost, used), _reference_hull(cost, used))
        assert (hull_values(cost, used) != cost).any(axis=1).sum() > n // 2  # wiggly: hulled


def test_feasible_and_fit_hbm_on_one_device() -> None:
    """Two tables on one device: every row in HBM overflows it; fit_hbm takes the overshoot
    off the table with most HBM rows to spare, after which the placement fits."""
    task = constrained_task(dlrm_tables(2, seed=1), 1, 0.5)
    a = task.table_arrays
    device = np.zeros(2, dtype=np.int64)
    rows = a.rows.astype(np.int64)
    assert not feasible(task, device, rows)
    assert feasible(task, device, np.zeros(2, dtype=np.int64))
    cap = task.device_arrays.hbm_capacity[0]
    over = int(np.ceil((a.hbm_bytes(slice(None), rows).sum() - cap) / a.hbm_bytes_per_row.max()))
    big = int(np.argmax(rows * a.hbm_bytes_per_row))
    if rows[big] > over:
        fitted = fit_hbm(task, device, rows)
        assert fitted[1 - big] == rows[1 - big] and fitted[big] < rows[big]
        assert feasible(task, device, fitted)


def test_curves_of_one_point_each_give_flat_lines() -> None:
    """Where no table has HBM to move (each cost curve a single point), its lines are that
    cost, flat, as a relaxation of nothing to choose."""
    from autoshard.pricing.curves import _spread_lines

    hulls = ((np.array([0.0]), np.array([5.0])), (np.array([0.0]), np.array([2.5])))
    intercept, slope, kept = _spread_lines(hulls, 3)
    assert intercept.tolist() == [[5.0] * 3, [2.5] * 3]
    assert slope.tolist() == [[0.0] * 3] * 2 and kept.tolist() == [1, 1]
    mixed = ((np.array([0.0]), np.array([5.0])), (np.array([0.0, 1.0]), np.array([4.0, 1.0])))
    intercept, slope, kept = _spread_lines(mixed, 1)
    assert (intercept[:, 0].tolist(), slope[:, 0].tolist(), kept.tolist()) == (
        [5.0, 4.0], [0.0, -3.0], [1, 1])
