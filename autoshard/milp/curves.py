"""Per-table cost curves for the MILP: cost (ms) against HBM bytes, as lines under the curve.

A table's cost on a device kind is priced by the cost model at every row count where its access
curve can bend (the floor and ceiling of each :data:`autoshard.access.GRID` point times its rows,
capped by the kind's HBM). Between those points the share of lookups served from HBM, and hence
any cost model linear in it (the analytical model), is linear. The lower convex hull of the
points lies under the true cost everywhere; every hull segment's line does too. The MILP keeps a
few of those lines per table ("cost >= line" constraints), chosen where the hull bends most, so
its optimum is a relaxation of the real problem (its dual bound is a valid lower bound) and the
plan it returns costs only slightly more than its objective says.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from autoshard.access import GRID
from autoshard.pricing.bounds import DeviceKinds, device_kinds, price_total
from autoshard.pricing.cost import CostModel
from autoshard.task import ShardingTask

__all__ = ["UNIT_BYTES", "CostCurves", "CostLines", "DeviceKinds", "cost_curves", "device_kinds"]

#: Bytes per unit of the MILP's memory variables (GB keeps coefficients near 1).
UNIT_BYTES = 1e9


@dataclass(frozen=True)
class CostLines:
    """Lines under each (table, kind) cost curve: cost_ms >= intercept * x + slope * m.

    ``m`` is HBM memory in :data:`UNIT_BYTES` units, ``x`` is 1 when the table is on the device.
    Arrays are [T, K, L] (unused line slots repeat a used line).

    Args:
        intercept: Cost at m = 0 of each line, ms.
        slope: ms per unit of HBM memory (<= 0 when HBM is the faster tier).
        max_memory: Most HBM memory the table can use on the kind ([T, K], units).
        min_cost: Cheapest cost of the table on the kind, at ``max_memory`` ([T, K], ms).
        hull_error: Largest gap between the kept lines and the full hull ([T, K], ms).
        count: Distinct lines kept ([T, K]); slots past it repeat kept lines.
    """

    intercept: np.ndarray
    slope: np.ndarray
    max_memory: np.ndarray
    min_cost: np.ndarray
    hull_error: np.ndarray
    count: np.ndarray

    def cost(self, t: np.ndarray, k: np.ndarray, memory: np.ndarray) -> np.ndarray:
        """The lines' estimate (max over lines) for tables ``t`` on kinds ``k`` (vectorised)."""
        est = self.intercept[t, k] + self.slope[t, k] * np.asarray(memory)[..., None]
        return np.max(est, axis=-1)


@dataclass(frozen=True)
class CostCurves:
    """Lower convex hulls of every (table, kind) cost curve, from which lines are kept.

    Args:
        hulls: Hull vertices (memory units, cost ms) of table t on kind k at ``t * K + k``.
        max_memory: Most HBM memory each table can use on each kind ([T, K], units).
        kinds: Number of device kinds K.
    """

    hulls: tuple[tuple[np.ndarray, np.ndarray], ...]
    max_memory: np.ndarray
    kinds: int

    def lines(self, max_lines: int | None = None, focus: np.ndarray | None = None,
              tolerance: float = 1e-4, deadline: float | None = None) -> CostLines:
        """Up to ``max_lines`` lines per curve (None: every hull segment). With ``focus``
        ([T, K] memory units), the lines around that point are kept first (where a solution is
        expected), then those where the hull is missed most; past ``deadline`` (a
        ``time.perf_counter`` instant) the remaining curves get evenly spaced lines instead of
        that search (still lines under the hull: the relaxation stays valid)."""
        shape = self.max_memory.shape
        width = max_lines or max(h[0].size for h in self.hulls)
        n = len(self.hulls)
        intercept, slope = np.zeros((n, width)), np.zeros((n, width))
        error, count = np.zeros(n), np.zeros(n, dtype=np.int64)
        done = 0
        if max_lines is not None:
            for i, (hx, hy) in enumerate(self.hulls):
                if deadline is not None and i % 64 == 0 and time.perf_counter() > deadline:
                    break
                t, k = divmod(i, self.kinds)
                near = None if focus is None else float(focus[t, k])
                intercept[i], slope[i], error[i], count[i] = _pick_lines(
                    hx, hy, width, tolerance, near)
                done = i + 1
        if done < n:
            intercept[done:], slope[done:], count[done:] = _spread_lines(self.hulls[done:], width)
        intercept = intercept.reshape(*shape, width)
        slope = slope.reshape(*shape, width)
        error_tk, count_tk = error.reshape(shape), count.reshape(shape)
        tt, kk = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
        draft = CostLines(intercept, slope, self.max_memory, np.zeros(shape), error_tk, count_tk)
        return CostLines(intercept, slope, self.max_memory,
                         draft.cost(tt, kk, self.max_memory), error_tk, count_tk)


def cost_curves(task: ShardingTask, cost_model: CostModel, kinds: DeviceKinds,
                deadline: float | None = None) -> CostCurves:
    """Prices every table's bend points on every device kind and keeps each curve's lower hull
    (vectorised over all curves: pricing in a few large chunks, one hull sweep). Past
    ``deadline`` (a ``time.perf_counter`` instant) between chunks:
    :class:`autoshard.pricing.bounds.DeadlineReached`."""
    a = task.table_arrays
    cap = task.device_arrays.hbm_capacity[kinds.representative]
    cap_rows = a.hbm_rows_within(np.arange(task.num_tables)[:, None], cap[None, :])
    raw = GRID[None, :] * a.rows[:, None]
    base = np.concatenate((np.floor(raw), np.ceil(raw)), axis=1)
    pts = np.concatenate((np.minimum(base[:, None, :], cap_rows[:, :, None]),
                          cap_rows[:, :, None]), axis=2)
    n_t, n_k, n_p = pts.shape
    pts = np.sort(pts, axis=2).reshape(n_t * n_k, n_p)
    first = np.ones(pts.shape, dtype=bool)
    first[:, 1:] = pts[:, 1:] != pts[:, :-1]
    t_of = np.repeat(np.arange(n_t), n_k)
    k_of = np.tile(np.arange(n_k), n_t)
    rr, cc = np.nonzero(first)
    price = price_total(task, cost_model, t_of[rr], kinds.representative[k_of[rr]], pts[rr, cc],
                        deadline)
    cost = np.zeros(pts.shape)
    cost[rr, cc] = price
    # Repeated points take their first copy's price (forward fill along each curve).
    source = np.maximum.accumulate(np.where(first, np.arange(n_p)[None, :], 0), axis=1)
    cost = np.take_along_axis(cost, source, axis=1)
    memory = pts * a.memory_bytes_per_row[t_of][:, None] / UNIT_BYTES
    hulls = _convex_hulls(memory, cost, first)
    max_memory = cap_rows * a.memory_bytes_per_row[:, None] / UNIT_BYTES
    return CostCurves(tuple(hulls), max_memory, kinds.count)


def _convex_hulls(x: np.ndarray, y: np.ndarray, first: np.ndarray
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Lower hulls of each row's points ([N, P], sorted by x; ``first`` marks each distinct
    point's first copy). A row whose slopes between distinct points strictly increase is its own
    hull (the usual case: a concave access curve makes cost convex in HBM bytes); the monotone
    chain runs only on the others."""
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where(first[:, 1:], (y[:, 1:] - y[:, :-1]) / (x[:, 1:] - x[:, :-1]), np.nan)
    # Each slope against the one before it (forward-filled over repeated points).
    cols = np.arange(step.shape[1])
    last = np.maximum.accumulate(np.where(first[:, 1:], cols[None, :], -1), axis=1)
    prev = np.full(step.shape, -1)
    prev[:, 1:] = last[:, :-1]
    rows = np.arange(step.shape[0])[:, None]
    before = np.where(prev >= 0, step[rows, np.maximum(prev, 0)], -np.inf)
    convex = np.all(~first[:, 1:] | (step > before), axis=1)
    hulls: list[tuple[np.ndarray, np.ndarray]] = [(x[r, first[r]], y[r, first[r]])
                                                   if convex[r] else (x[r, :0], y[r, :0])
                                                   for r in range(x.shape[0])]
    other = np.flatnonzero(~convex)
    if other.size:
        for r, hull in zip(other, _lower_hulls(x[other], y[other]), strict=True):
            hulls[r] = hull
    return hulls


def _lower_hulls(x: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Vertices of the lower convex hull of each row's points, sorted by x ([N, P] each):
    the monotone chain run on every row at once (repeated points are dropped)."""
    n, p = x.shape
    stack = np.zeros((n, p), dtype=np.int64)
    size = np.zeros(n, dtype=np.int64)
    rows = np.arange(n)
    for i in range(p):
        xi, yi = x[:, i], y[:, i]
        while True:
            can = size >= 2
            if not can.any():
                break
            o = stack[rows, np.maximum(size - 2, 0)]
            q = stack[rows, np.maximum(size - 1, 0)]
            xo, yo = x[rows, o], y[rows, o]
            cross = (x[rows, q] - xo) * (yi - yo) - (y[rows, q] - yo) * (xi - xo)
            pop = can & (cross <= 0)
            if not pop.any():
                break
            size -= pop
        # A repeat of the top point (same x) is not pushed.
        top = stack[rows, np.maximum(size - 1, 0)]
        push = (size == 0) | (x[rows, top] != xi)
        stack[rows[push], size[push]] = i
        size += push
    return [(x[r, stack[r, :size[r]]], y[r, stack[r, :size[r]]]) for r in range(n)]


def _spread_lines(hulls: tuple[tuple[np.ndarray, np.ndarray], ...], width: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lines of up to ``width`` evenly spaced hull segments of each curve (every segment when
    it has no more), vectorised; slots past a curve's count repeat its kept lines. Returns
    (intercepts [N, width], slopes [N, width], lines kept [N])."""
    size = np.array([h[0].size for h in hulls], dtype=np.int64)
    top = int(size.max())
    hx = np.zeros((size.size, top))
    hy = np.zeros((size.size, top))
    mask = np.arange(top)[None, :] < size[:, None]
    hx[mask] = np.concatenate([h[0] for h in hulls])
    hy[mask] = np.concatenate([h[1] for h in hulls])
    segments = np.maximum(size - 1, 1)
    j = np.arange(width)[None, :]
    spread = np.round(j * (segments[:, None] - 1) / max(width - 1, 1)).astype(np.int64)
    pick = np.where(segments[:, None] <= width, j % segments[:, None], spread)
    rows = np.arange(size.size)[:, None]
    x0, y0 = hx[rows, pick], hy[rows, pick]
    x1, y1 = hx[rows, pick + 1], hy[rows, pick + 1]
    single = (size == 1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        seg_slope = np.where(single, 0.0, (y1 - y0) / np.where(single, 1.0, x1 - x0))
    seg_icpt = np.where(single, hy[:, :1], y0 - seg_slope * x0)
    kept = np.where(size == 1, 1, np.minimum(segments, width))
    return seg_icpt, seg_slope, kept


def _pick_lines(hx: np.ndarray, hy: np.ndarray, max_lines: int, tolerance: float,
                focus: float | None = None) -> tuple[np.ndarray, np.ndarray, float, int]:
    """Up to ``max_lines`` hull-segment lines: the first and last segments, those around
    ``focus`` (a memory point), then those where the kept ones fall furthest below the hull.
    Returns (intercepts, slopes, largest remaining gap at a hull vertex, lines kept)."""
    if hx.size == 1:
        return np.full(max_lines, hy[0]), np.zeros(max_lines), 0.0, 1
    seg_slope = np.diff(hy) / np.diff(hx)
    seg_icpt = hy[:-1] - seg_slope * hx[:-1]
    last = seg_slope.size - 1
    chosen = [0, last]
    if focus is not None:
        at = int(np.clip(np.searchsorted(hx, focus) - 1, 0, last))
        reach = max(max_lines - 2, 0) // 3
        chosen += list(range(max(at - reach, 0), min(at + reach, last) + 1))
    chosen = sorted(set(chosen))[:max_lines]
    scale = max(float(hy.max() - hy.min()), 1e-12)
    gap = 0.0
    while True:
        est = np.max(seg_icpt[chosen][:, None] + seg_slope[chosen][:, None] * hx[None, :], axis=0)
        miss = hy - est
        worst = int(np.argmax(miss))
        gap = float(max(miss[worst], 0.0))
        segment = min(worst, last)
        if len(chosen) >= max_lines or gap <= tolerance * scale or segment in chosen:
            break
        chosen.append(segment)
    keep = np.array(sorted(set(chosen)))
    used = keep.size
    keep = np.resize(keep, max_lines)
    return seg_icpt[keep], seg_slope[keep], gap, used
