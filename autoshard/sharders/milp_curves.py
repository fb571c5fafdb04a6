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

from dataclasses import dataclass

import numpy as np

from autoshard.access import GRID
from autoshard.bounds import DeviceKinds, device_kinds
from autoshard.cost import CostModel
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
              tolerance: float = 1e-4) -> CostLines:
        """Up to ``max_lines`` lines per curve (None: every hull segment). With ``focus``
        ([T, K] memory units), the lines around that point are kept first (where a solution is
        expected), then those where the hull is missed most."""
        shape = self.max_memory.shape
        width = max_lines or max(h[0].size for h in self.hulls)
        intercept, slope = np.zeros((*shape, width)), np.zeros((*shape, width))
        error, count = np.zeros(shape), np.zeros(shape, dtype=np.int64)
        for i, (hx, hy) in enumerate(self.hulls):
            t, k = divmod(i, self.kinds)
            if max_lines is None:
                intercept[t, k], slope[t, k], count[t, k] = _all_lines(hx, hy, width)
                continue
            near = None if focus is None else float(focus[t, k])
            intercept[t, k], slope[t, k], error[t, k], count[t, k] = _pick_lines(
                hx, hy, width, tolerance, near)
        tt, kk = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
        draft = CostLines(intercept, slope, self.max_memory, np.zeros(shape), error, count)
        return CostLines(intercept, slope, self.max_memory,
                         draft.cost(tt, kk, self.max_memory), error, count)


def cost_curves(task: ShardingTask, cost_model: CostModel, kinds: DeviceKinds) -> CostCurves:
    """Prices every table's bend points on every device kind and keeps each curve's lower hull."""
    a = task.table_arrays
    cap = task.device_arrays.hbm_capacity[kinds.representative]
    cap_rows = np.minimum(a.rows[:, None], np.floor(cap[None, :] / a.memory_bytes_per_row[:, None]))
    raw = GRID[None, :] * a.rows[:, None]
    base = np.concatenate((np.floor(raw), np.ceil(raw)), axis=1)
    tables, kk, points = [], [], []
    for t in range(task.num_tables):
        for k in range(kinds.count):
            pts = np.unique(np.append(np.minimum(base[t], cap_rows[t, k]), cap_rows[t, k]))
            tables.append(np.full(pts.size, t))
            kk.append(np.full(pts.size, k))
            points.append(pts)
    t_idx, k_idx, rows = (np.concatenate(v) for v in (tables, kk, points))
    price = cost_model.price(task, t_idx, kinds.representative[k_idx], rows).total_ms
    memory = rows * a.memory_bytes_per_row[t_idx] / UNIT_BYTES
    hulls = []
    start = 0
    for pts in points:
        end = start + pts.size
        hulls.append(_lower_hull(memory[start:end], price[start:end]))
        start = end
    max_memory = cap_rows * a.memory_bytes_per_row[:, None] / UNIT_BYTES
    return CostCurves(tuple(hulls), max_memory, kinds.count)


def _lower_hull(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the lower convex hull of points sorted by x (monotone chain)."""
    hull: list[int] = []
    for i in range(x.size):
        while len(hull) >= 2:
            o, p = hull[-2], hull[-1]
            cross = (x[p] - x[o]) * (y[i] - y[o]) - (y[p] - y[o]) * (x[i] - x[o])
            if cross > 0:
                break
            hull.pop()
        hull.append(i)
    idx = np.array(hull)
    return x[idx], y[idx]


def _all_lines(hx: np.ndarray, hy: np.ndarray,
               width: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Every hull segment's line (intercepts, slopes padded to ``width``, count)."""
    if hx.size == 1:
        return np.full(width, hy[0]), np.zeros(width), 1
    seg_slope = np.diff(hy) / np.diff(hx)
    seg_icpt = hy[:-1] - seg_slope * hx[:-1]
    keep = np.resize(np.arange(seg_slope.size), width)
    return seg_icpt[keep], seg_slope[keep], seg_slope.size


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
