"""Cost curves: each table's (or shard's) cost (ms) against the HBM bytes its hottest rows
take, on each kind of device, and their lower convex hulls.

A table's cost on a device falls as more of its hottest rows sit in HBM. Between the row counts
where its access curve can bend (:data:`autoshard.access.GRID` times its rows) the share of
lookups served from HBM, and hence any cost model linear in it (the analytical model), is
linear. Every user of a curve works on its lower convex hull, which lies under the true cost
everywhere, so that what it derives stays a relaxation; :func:`lower_hulls` is the one hull
routine. The curves come in three forms:

- :func:`table_cost_curves`: each table's cost at the grid points themselves, on one device
  (the lower bound's fractional knapsack, :mod:`autoshard.pricing.bounds`, and the policy's
  HBM buckets), with :func:`hull_values` their hulls at the same points;
- :class:`CostCurves`: each (table, kind) curve's hull vertices at whole rows, from which
  :class:`CostLines` keeps a few lines ("cost >= line" constraints) for the MILP
  (:mod:`autoshard.milp.model`): its optimum is a relaxation of the real problem (its dual
  bound a valid lower bound), and the plan it returns costs only slightly more than its
  objective says;
- :class:`Curves`: the same hulls as arrays, with each segment's worth (saving per byte) and
  every kind's segments in the order water-filling takes them
  (:mod:`autoshard.search.waterfill`).

Prices are asked of the cost model in large chunks (:func:`price_total`), against a deadline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from autoshard.access import GRID
from autoshard.errors import DeadlineReached
from autoshard.pricing.cost import CostModel
from autoshard.task import ShardingTask

__all__ = ["FIRST_CHUNK", "PRICE_CHUNK", "UNIT_BYTES", "CostCurves", "CostLines", "Curves",
           "DeviceKinds", "cost_curves", "device_kinds", "hbm_terms", "hull_values",
           "lower_hulls", "price_total", "table_cost_curves"]

#: Bytes per unit of the MILP's memory variables (GB keeps coefficients near 1).
UNIT_BYTES = 1e9
#: Most (table, device, rows) points priced in one call when pricing against a deadline.
PRICE_CHUNK = 100_000
#: Points of the first call against a deadline: its time per point sizes the later calls and
#: says whether the rest can be priced in time (a cost model may take milliseconds a point:
#: TorchRec's estimator).
FIRST_CHUNK = 2_000
#: Share of the time left that one later call may be expected to take.
CALL_SHARE = 0.25


def price_total(task: ShardingTask, cost_model: CostModel, table_idx: np.ndarray,
                device_idx: np.ndarray, hbm_rows: np.ndarray, deadline: float | None = None
                ) -> np.ndarray:
    """Total cost (ms) of each (table, device, HBM rows) point.

    With ``deadline``, the points are priced in calls sized by the time a point took so far
    (:data:`FIRST_CHUNK` first, then what :data:`CALL_SHARE` of the time left allows, at most
    :data:`PRICE_CHUNK`), and :class:`DeadlineReached` is raised once the deadline has passed
    or when the points left would take longer than the time left at the pace so far: a slow
    cost model stops before it overruns, not after."""
    if deadline is None:
        return cost_model.price(task, table_idx, device_idx, hbm_rows).total_ms
    n = table_idx.size
    out = np.empty(n)
    lo, size = 0, min(FIRST_CHUNK, n)
    while lo < n:
        began = time.perf_counter()
        if began >= deadline:
            raise DeadlineReached("pricing")
        hi = min(lo + size, n)
        out[lo:hi] = cost_model.price(task, table_idx[lo:hi], device_idx[lo:hi],
                                      hbm_rows[lo:hi]).total_ms
        per_point = (time.perf_counter() - began) / (hi - lo)
        lo = hi
        left = deadline - time.perf_counter()
        if lo < n and per_point * (n - lo) > left:
            raise DeadlineReached(f"pricing: {n - lo:,} points left at {per_point * 1e3:.3g} "
                                  f"ms each, {max(left, 0.0):.1f} s left")
        size = int(np.clip(CALL_SHARE * left / max(per_point, 1e-12), FIRST_CHUNK, PRICE_CHUNK))
    return out


@dataclass(frozen=True)
class DeviceKinds:
    """Devices grouped into interchangeable kinds (same capacities, bandwidths, link shares):
    a curve priced on one device of a kind holds for all of them.

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


def hbm_terms(task: ShardingTask, tables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How the curves' memory (a row's weight and optimizer bytes) becomes HBM as the task's
    runtime counts it, for ``tables``: HBM bytes per byte of curve memory, and each table's
    reserved HBM in :data:`UNIT_BYTES` units (the MILP's HBM coefficients)."""
    a = task.table_arrays
    return (a.hbm_bytes_per_row[tables] / a.memory_bytes_per_row[tables],
            a.hbm_reserved_bytes[tables] / UNIT_BYTES)


def lower_hulls(x: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Vertices of the lower convex hull of each row's points, sorted by x ([N, P] each):
    the monotone chain run on every row at once (repeated points are dropped; collinear ones
    too). The chain runs online: the vertices up to a point depend on no later point."""
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


def hull_values(cost: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Each curve (cost [T, G] against increasing bytes [T, G]) replaced by its lower convex
    hull at the same points, flat past its cheapest point: at most the curve everywhere, with
    savings per byte that only fall along it. Curves that are already so within a relative
    1e-6 (the analytical model's) are returned as they are; the others (a cost model whose
    price can rise with HBM rows, as TorchRec's estimator's does) get the :func:`lower_hulls`
    of their points up to the cheapest, read at those points."""
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
    rows = np.flatnonzero(bad)
    cheapest = np.argmin(cost[rows], axis=1)
    # Points past the cheapest become copies of it: the chain (online) then ends on the hull
    # of the points up to it, for every row at once.
    past = np.arange(cost.shape[1])[None, :] > cheapest[:, None]
    x = np.where(past, used[rows, cheapest][:, None], used[rows])
    y = np.where(past, cost[rows, cheapest][:, None], cost[rows])
    for t, c, (hx, hy) in zip(rows, cheapest, lower_hulls(x, y), strict=True):
        out[t, :c + 1] = np.interp(used[t, :c + 1], hx, hy)
        out[t, c + 1:] = cost[t, c]
    return out


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
    """Prices every table's bend points on every device kind (the floor and ceiling of each
    :data:`GRID` point times its rows, capped by the kind's HBM) and keeps each curve's lower
    hull (vectorised over all curves: pricing in a few large chunks, one hull sweep). Past
    ``deadline`` (a ``time.perf_counter`` instant) between chunks: :class:`DeadlineReached`."""
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
    hulls = _hull_vertices(memory, cost, first)
    max_memory = cap_rows * a.memory_bytes_per_row[:, None] / UNIT_BYTES
    return CostCurves(tuple(hulls), max_memory, kinds.count)


def _hull_vertices(x: np.ndarray, y: np.ndarray, first: np.ndarray
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`lower_hulls` of each row's points ([N, P], sorted by x; ``first`` marks each
    distinct point's first copy). A row whose slopes between distinct points strictly increase
    is its own hull (the usual case: a concave access curve makes cost convex in HBM bytes);
    the chain runs only on the others."""
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
        for r, hull in zip(other, lower_hulls(x[other], y[other]), strict=True):
            hulls[r] = hull
    return hulls


def _spread_lines(hulls: tuple[tuple[np.ndarray, np.ndarray], ...], width: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lines of up to ``width`` evenly spaced hull segments of each curve (every segment when
    it has no more), vectorised; slots past a curve's count repeat its kept lines. Returns
    (intercepts [N, width], slopes [N, width], lines kept [N])."""
    size = np.array([h[0].size for h in hulls], dtype=np.int64)
    top = int(size.max())
    hx = np.zeros((size.size, top + 1))  # a spare column: a segment's end past a single point
    hy = np.zeros((size.size, top + 1))
    mask = np.arange(top + 1)[None, :] < size[:, None]
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


@dataclass(frozen=True)
class Curves:
    """Every item's (a table's, or a shard's priced as one) hull on every kind of device, as
    arrays, and its segments in water-filling order (:mod:`autoshard.search.waterfill`).

    Args:
        kind: Kind of each device ([D]).
        cost: Cost (ms) at each grid point, [K, N, G].
        used: HBM bytes at each grid point, [K, N, G].
        extra: HBM bytes of each segment, [K, N, G - 1].
        worth: Saving per byte of each segment, at most that of any hotter one, [K, N, G - 1].
        segments: Per kind, the (owner item, bytes, worth, saving in ms) of every segment
            that saves anything, the largest worth first (ties: hotter segments first).
        owned: Per kind, (order, first): item ``i``'s segments are
            ``order[first[i]:first[i + 1]]`` (indices into ``segments``, increasing).
    """

    kind: np.ndarray
    cost: np.ndarray
    used: np.ndarray
    extra: np.ndarray
    worth: np.ndarray
    segments: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]
    owned: tuple[tuple[np.ndarray, np.ndarray], ...]

    @classmethod
    def price(cls, items: ShardingTask, cost_model: CostModel,
              priced: CostCurves | None = None) -> Curves:
        """Prices the curves of ``items`` on one device of each kind: the lower hulls of
        :func:`cost_curves` (vertices at whole rows, where the access curve can bend), padded
        to one length by repeating the last vertex; ``priced``: those hulls already priced (a
        MILP solve's)."""
        kinds = device_kinds(items)
        hulls = (priced if priced is not None else cost_curves(items, cost_model, kinds)).hulls
        width = max(h[0].size for h in hulls)
        shape = (items.num_tables, kinds.count, width)
        used, cost = np.empty(shape), np.empty(shape)
        for i, (hx, hy) in enumerate(hulls):
            t, k = divmod(i, kinds.count)
            used[t, k, :hx.size], used[t, k, hx.size:] = hx * UNIT_BYTES, hx[-1] * UNIT_BYTES
            cost[t, k, :hy.size], cost[t, k, hy.size:] = hy, hy[-1]
        # The curves count a row's memory; the water-filling counts the HBM it takes as the
        # runtime counts it (its reservation), which may be more per row: the MILP's scale.
        scale, _ = hbm_terms(items, np.arange(items.num_tables))
        used *= scale[:, None, None]
        used, cost = used.transpose(1, 0, 2).copy(), cost.transpose(1, 0, 2).copy()
        saving = cost[:, :, :-1] - cost[:, :, 1:]
        extra = used[:, :, 1:] - used[:, :, :-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(extra > 0, saving / extra, np.inf)
        worth = np.maximum(np.minimum.accumulate(ratio, axis=2), 0.0)
        segments = []
        for k in range(kinds.count):
            keep = (worth[k] > 0) & (extra[k] > 0)
            owner, _ = np.nonzero(keep)
            w, e, gain = worth[k][keep], extra[k][keep], saving[k][keep]
            order = np.argsort(-w, kind="stable")
            segments.append((owner[order], e[order], w[order], gain[order]))
        owned = []
        for owner, *_ in segments:
            by_owner = np.argsort(owner, kind="stable")
            owned.append((by_owner, np.searchsorted(owner[by_owner],
                                                    np.arange(items.num_tables + 1))))
        return cls(kinds.kind, cost, used, extra, worth, tuple(segments), tuple(owned))

    def on_device(self, device: np.ndarray, d: int) -> np.ndarray:
        """Indices into ``segments[kind[d]]`` of the segments of the items ``device`` puts on
        device ``d``, in water-filling order."""
        order, first = self.owned[self.kind[d]]
        items = np.flatnonzero(device == d)
        counts = first[items + 1] - first[items]
        shift = np.repeat(first[items] - (np.cumsum(counts) - counts), counts)
        return np.sort(order[shift + np.arange(counts.sum())])
