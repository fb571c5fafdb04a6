"""The placement MILP, built in matrix form and solved with HiGHS.

Variables, for every allowed (table t, device d) pair: ``x`` binary (t on d), ``m`` HBM memory of
t on d (GB), ``c`` cost of t on d (ms); and ``C``, the step cost. Constraints::

    sum_d x[t,d] = 1                                  every table placed once
    m[t,d] <= M[t,kind(d)] * x[t,d]                   HBM use only where placed, capped
    c[t,d] >= a_l * x[t,d] + b_l * m[t,d]             every kept line under the cost curve
    sum_t c[t,d] <= w_d * C                           step cost is the max over devices
    sum_t (s_t * m[t,d] + R_t * x[t,d]) <= w_d * HBM_d  HBM capacity
    sum_t (F_t * x[t,d] - m[t,d]) <= w_d * host_d     host capacity (the rest of the table)

where ``m`` counts a table's rows at their weights and optimizer state (its cost curves' axis),
``s_t`` is the ratio of a row's HBM bytes as the runtime counts them to that, and ``R_t`` the
HBM reserved for the table wherever it lives (:mod:`autoshard.reservation`); minimising C (plus
``spread`` times the total cost, to break ties towards less work). With fixed devices, ``tied``
tables keep equal shares: m[a] / F_a = m[b] / F_b. A "device" of weight w_d > 1 stands for w_d
identical devices: the aggregated LP of a cluster, whose optimum equals the LP relaxation of the
per-device model (average any per-device solution over each kind).

A re-plan adds a move term (:class:`MoveTerms`, from :mod:`autoshard.replan.budget`): with
``N[t,d]`` the memory sent to d if t goes there, ``k[t,d]`` the share of t's memory already on d
and ``h[t,d]`` its memory already in d's HBM, a variable ``u[t,d]`` >= |k m[t,d] - h x[t,d]| (the
memory copied between d's host memory and HBM), and::

    sum_(t,d) (N[t,d] * x[t,d] + u[t,d]) <= B          copies within the budget

with, where moves are priced, ``p[t,d] * x[t,d] + q[t,d] * u[t,d]`` (ms per step) added to the
objective.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from autoshard.pricing.curves import CostLines

_TOLERANCE = 1e-9
#: Status of a MIP stopped by its stall rule (:func:`solve`'s ``stall``).
STALLED = "stalled"
#: Seconds a MIP runs before its stall rule applies.
STALL_AFTER_S = 1.0
_BANNER_SHOWN = False


@dataclass(frozen=True)
class MoveTerms:
    """A subproblem's move term (module docstring), every array [T', D'] over its tables and
    devices, memory in the model's units (GB of ``m``).

    Args:
        network: Memory sent to the device from others if the table goes there (N).
        kept: Share of the table's memory already on the device (k).
        kept_hbm: Its memory already in the device's HBM (h).
        budget: Memory the subproblem may copy in all (B; inf: no limit).
        price_network: ms per step added where the table goes to the device (p; None: 0).
        price_hbm: ms per step per unit of memory copied between the device's host memory and
            HBM (q; None: 0).
        hold: Pairs whose HBM memory may not change where the table stays (u = 0; None: none).
    """

    network: np.ndarray
    kept: np.ndarray
    kept_hbm: np.ndarray
    budget: float = np.inf
    price_network: np.ndarray | None = None
    price_hbm: np.ndarray | None = None
    hold: np.ndarray | None = None

    def copied(self, position: np.ndarray, memory: np.ndarray) -> np.ndarray:
        """Memory each table copies on device ``position`` with HBM ``memory``."""
        t = np.arange(position.size)
        return (self.network[t, position]
                + np.abs(self.kept[t, position] * memory - self.kept_hbm[t, position]))


@dataclass(frozen=True)
class Subproblem:
    """Which tables go on which devices, and what each device holds.

    Args:
        tables: Task indices of the tables ([T']).
        kind: Device kind of each device ([D']).
        hbm: HBM capacity of each device, GB ([D']).
        host: Host capacity of each device, GB ([D']).
        full: Each table's full memory, GB ([T']).
        weight: Devices each one stands for ([D'], 1 for real devices).
        integer: Binary placement (False: the LP relaxation).
        symmetric: Fix variables to break the symmetry of identical devices (real devices only).
        fixed: Device position of each table, to re-optimise only the row splits.
        hbm_scale: HBM bytes per unit of ``m`` of each table ([T'], default 1).
        reserved: HBM reserved for each table wherever it lives, GB ([T'], default 0).
        tied: With ``fixed``, a group per table ([T'], -1: none): the tables of one group keep
            the same share of their memory in HBM (the shards of one split table).
        allowed: Devices each table may go to ([T', D'] bool; None: all).
        least: Least HBM memory of each table wherever it lives, GB of its memory variable
            ([T'], None: none; a replica's whole table, or what its constraints keep in HBM).
        moves: The move term of a re-plan (:class:`MoveTerms`; None: none).
    """

    tables: np.ndarray
    kind: np.ndarray
    hbm: np.ndarray
    host: np.ndarray
    full: np.ndarray
    weight: np.ndarray
    integer: bool = True
    symmetric: bool = True
    fixed: np.ndarray | None = None
    hbm_scale: np.ndarray | None = None
    reserved: np.ndarray | None = None
    tied: np.ndarray | None = None
    allowed: np.ndarray | None = None
    least: np.ndarray | None = None
    moves: MoveTerms | None = None


@dataclass(frozen=True)
class Solution:
    """A solved subproblem: device (position in the subproblem) and HBM memory (GB) per table,
    the objective of the returned solution, HiGHS's proven bound, status, seconds spent, and
    when (``time.perf_counter()``) its last improving solution was found, where recorded."""

    device: np.ndarray | None
    memory: np.ndarray | None
    objective: float
    bound: float
    status: str
    seconds: float
    improved_at: float | None = None


def _pairs(sub: Subproblem, lines: CostLines, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Allowed (table position, device position) pairs: the table's rest fits the host memory,
    and, for identical devices, the i-th table (by ``order``) only on the first i+1 of its kind."""
    nt, nd = sub.tables.size, sub.kind.size
    tt, dd = np.meshgrid(np.arange(nt), np.arange(nd), indexing="ij")
    cap = lines.max_memory[sub.tables[:, None], sub.kind[None, :]]
    ok = sub.full[:, None] - cap <= sub.host[None, :] * sub.weight[None, :] + _TOLERANCE
    if sub.fixed is not None:
        ok &= dd == sub.fixed[:, None]
    if sub.allowed is not None:
        ok &= sub.allowed
    if sub.least is not None:
        ok &= sub.least[:, None] <= cap + _TOLERANCE
    if sub.symmetric and sub.integer and sub.fixed is None:
        rank = np.empty(nt, dtype=np.int64)
        rank[order] = np.arange(nt)
        for k in np.unique(sub.kind):
            members = np.flatnonzero(sub.kind == k)
            position = np.arange(members.size)
            ok[:, members] &= position[None, :] <= rank[:, None]
    return tt[ok], dd[ok]


def _matrix(sub: Subproblem, lines: CostLines, pt: np.ndarray, pd: np.ndarray,
            spread: float) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray],
                                    np.ndarray, np.ndarray, np.ndarray]:
    """Triplets (row, col, value), row bounds and column costs of the model."""
    p = pt.size
    t_glob, kinds = sub.tables[pt], sub.kind[pd]
    x, m, c, cc = np.arange(p), p + np.arange(p), 2 * p + np.arange(p), 3 * p
    rows, cols, vals, lo, hi = [], [], [], [], []
    nrow = 0

    def add(r: np.ndarray, col: np.ndarray, v: np.ndarray) -> None:
        rows.append(r)
        cols.append(col)
        vals.append(np.broadcast_to(v, r.shape).astype(np.float64))

    nt, nd = sub.tables.size, sub.kind.size
    add(pt, x, np.ones(p))
    lo.append(np.ones(nt))
    hi.append(np.ones(nt))
    nrow = nt
    add(nrow + np.arange(p), m, np.ones(p))
    add(nrow + np.arange(p), x, -lines.max_memory[t_glob, kinds])
    lo.append(np.full(p, -np.inf))
    hi.append(np.zeros(p))
    nrow += p
    nrow += _least_rows(sub, pt, x, m, nrow, add, lo, hi)
    counts = lines.count[t_glob, kinds]
    for line in range(int(counts.max())):
        use = np.flatnonzero(counts > line)
        r = nrow + np.arange(use.size)
        add(r, x[use], lines.intercept[t_glob[use], kinds[use], line])
        add(r, m[use], lines.slope[t_glob[use], kinds[use], line])
        add(r, c[use], -np.ones(use.size))
        lo.append(np.full(use.size, -np.inf))
        hi.append(np.zeros(use.size))
        nrow += use.size
    add(nrow + pd, c, np.ones(p))
    add(nrow + np.arange(nd), np.full(nd, cc), -sub.weight.astype(np.float64))
    nrow += nd
    add(nrow + pd, m, np.ones(p) if sub.hbm_scale is None else sub.hbm_scale[pt])
    if sub.reserved is not None:
        add(nrow + pd, x, sub.reserved[pt])
    add(nrow + nd + pd, x, sub.full[pt])
    add(nrow + nd + pd, m, -np.ones(p))
    lo.append(np.full(3 * nd, -np.inf))
    hi.append(np.concatenate((np.zeros(nd), sub.hbm * sub.weight, sub.host * sub.weight)))
    nrow += 2 * nd
    nrow += _tied_rows(sub, pt, m, nrow, add, lo, hi)
    cost = np.zeros(3 * p + 1 + (p if sub.moves is not None else 0))
    cost[c] = spread
    cost[cc] = 1.0
    if sub.moves is not None:
        _move_rows(sub.moves, pt, pd, (x, m, cc + 1 + np.arange(p)), nrow, add, lo, hi, cost)
    return rows, cols, vals, np.concatenate(lo), np.concatenate(hi), cost


def _tied_rows(sub: Subproblem, pt: np.ndarray, m: np.ndarray, nrow: int,
               add: Callable[[np.ndarray, np.ndarray, np.ndarray], None],
               lo: list[np.ndarray], hi: list[np.ndarray]) -> int:
    """Rows m[a] / F_a = m[b] / F_b of the tables of one ``tied`` group, where devices are
    fixed; returns how many."""
    if sub.tied is None or sub.fixed is None:
        return 0
    first, second = _tied_pairs(sub.tied)
    column = np.empty(sub.tables.size, dtype=np.int64)
    column[pt] = np.arange(pt.size)  # one pair per table when devices are fixed
    r = nrow + np.arange(first.size)
    add(r, m[column[first]], 1.0 / sub.full[first])
    add(r, m[column[second]], -1.0 / sub.full[second])
    lo.append(np.zeros(first.size))
    hi.append(np.zeros(first.size))
    return int(first.size)


def _move_rows(terms: MoveTerms, pt: np.ndarray, pd: np.ndarray,
               columns: tuple[np.ndarray, np.ndarray, np.ndarray], nrow: int,
               add: Callable[[np.ndarray, np.ndarray, np.ndarray], None],
               lo: list[np.ndarray], hi: list[np.ndarray], cost: np.ndarray) -> None:
    """The move term's rows (module docstring): u >= +-(k m - h x) where some of the table is
    already on the device, the budget row, and the prices in ``cost``."""
    x, m, u = columns
    k, h = terms.kept[pt, pd], terms.kept_hbm[pt, pd]
    on = np.flatnonzero(k > 0)
    for sign in (1.0, -1.0):
        r = nrow + np.arange(on.size)
        add(r, m[on], sign * k[on])
        add(r, x[on], -sign * h[on])
        add(r, u[on], -np.ones(on.size))
        lo.append(np.full(on.size, -np.inf))
        hi.append(np.zeros(on.size))
        nrow += on.size
    if np.isfinite(terms.budget):
        r = np.full(pt.size, nrow)
        add(r, x, terms.network[pt, pd])
        add(r, u, np.ones(pt.size))
        lo.append(np.array([-np.inf]))
        hi.append(np.array([max(terms.budget, 0.0)]))
    if terms.price_network is not None:
        cost[x] += terms.price_network[pt, pd]
    if terms.price_hbm is not None:
        cost[u] = terms.price_hbm[pt, pd]


def _move_upper(terms: MoveTerms, pt: np.ndarray, pd: np.ndarray) -> np.ndarray:
    """Upper bounds of u: none where some of the table is already on the device (and its HBM
    may change there), 0 elsewhere."""
    free = terms.kept[pt, pd] > 0
    if terms.hold is not None:
        free &= ~terms.hold[pt, pd]
    return np.where(free, np.inf, 0.0)


def _least_rows(sub: Subproblem, pt: np.ndarray, x: np.ndarray, m: np.ndarray, nrow: int,
                add: Callable[[np.ndarray, np.ndarray, np.ndarray], None],
                lo: list[np.ndarray], hi: list[np.ndarray]) -> int:
    """Rows m >= least * x of the pairs whose table keeps HBM memory wherever it lives
    (:attr:`Subproblem.least`); returns how many."""
    if sub.least is None or not (sub.least > 0).any():
        return 0
    use = np.flatnonzero(sub.least[pt] > 0)
    r = nrow + np.arange(use.size)
    add(r, m[use], np.ones(use.size))
    add(r, x[use], -sub.least[pt[use]])
    lo.append(np.zeros(use.size))
    hi.append(np.full(use.size, np.inf))
    return int(use.size)


def _tied_pairs(tied: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive (position, position) pairs of each group of ``tied`` (-1: in none)."""
    order = np.argsort(tied, kind="stable")
    g = tied[order]
    same = (g[1:] == g[:-1]) & (g[1:] >= 0)
    return order[:-1][same], order[1:][same]


def stalled(history: list[tuple[float, float]], stall: float, min_seconds: float) -> bool:
    """True once a search has run ``min_seconds`` and its last half lowered its objective by
    less than ``stall`` of it (``history``: (instant, objective) after each step, the first
    entry its start); never with ``stall`` <= 0."""
    begun, now = history[0][0], time.perf_counter()
    if stall <= 0 or now - begun < min_seconds or len(history) < 2:
        return False
    halfway = begun + (now - begun) / 2
    before = next(cost for at, cost in reversed(history) if at <= halfway)
    return before - history[-1][1] < stall * history[-1][1]


def solve(sub: Subproblem, lines: CostLines, *, order: np.ndarray | None = None,
          warm: tuple[np.ndarray, np.ndarray] | None = None, lower: float = 0.0,
          spread: float = 0.0, time_limit: float = 60.0, mip_rel_gap: float = 1e-4,
          stall: float = 0.0, stall_after: float = STALL_AFTER_S) -> Solution:
    """Solves a subproblem with HiGHS.

    Args:
        sub: The tables, devices and capacities.
        lines: Cost lines of every (task table, kind).
        order: Table positions from most to least costly (for symmetry breaking).
        warm: A feasible start (device position, HBM GB per table), relabelled within kinds to
            respect the symmetry breaking.
        lower: A known lower bound on C.
        spread: Weight of the total cost in the objective.
        time_limit: Seconds before HiGHS stops with its best solution.
        mip_rel_gap: Relative gap at which HiGHS stops.
        stall: A MIP also stops (status :data:`STALLED`) once, after ``stall_after`` seconds,
            the last half of its run lowered its best solution by less than this share of it
            (:func:`stalled`); 0: it runs to its gap or time limit.
        stall_after: Seconds before the stall rule applies.
    """
    import highspy
    from scipy.sparse import coo_matrix

    start = time.perf_counter()
    if order is None:
        order = np.argsort(-lines.min_cost[sub.tables, sub.kind[0]], kind="stable")
    pt, pd = _pairs(sub, lines, order)
    if np.setdiff1d(np.arange(sub.tables.size), pt).size:
        return Solution(None, None, np.inf, np.inf, "infeasible", time.perf_counter() - start)
    rows, cols, vals, lo, hi, cost = _matrix(sub, lines, pt, pd, spread)
    p, ncol = pt.size, cost.size
    a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                   shape=(lo.size, ncol)).tocsc()
    col_lower = np.concatenate((np.zeros(3 * p), [lower], np.zeros(ncol - 3 * p - 1)))
    col_upper = np.concatenate((np.ones(p), lines.max_memory[sub.tables[pt], sub.kind[pd]],
                                np.full(p + 1, np.inf),
                                [] if sub.moves is None else _move_upper(sub.moves, pt, pd)))
    integrality = np.zeros(ncol, dtype=np.int32)
    if sub.integer:
        integrality[:p] = 1
    h = _new_highs()
    h.setOptionValue("time_limit", float(max(time_limit, 0.01)))
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    # The array form of passModel: no per-element conversion of the (large) matrix.
    h.passModel(ncol, lo.size, a.nnz, int(highspy.MatrixFormat.kColwise), 1, 0.0,
                cost, col_lower, col_upper, lo, hi, a.indptr.astype(np.int32),
                a.indices.astype(np.int32), a.data.astype(np.float64), integrality)
    if warm is not None and sub.integer:
        _set_start(h, sub, lines, pt, pd, order, warm, spread)
    found: list[tuple[float, float]] = [(start, np.inf)]
    if sub.integer and stall > 0:
        _stop_when_stalled(h, found, stall, stall_after)
    h.run()
    solution = _read(h, sub, pt, pd, start)
    if h.modelStatusToString(h.getModelStatus()) == "Interrupted by user":
        solution = replace(solution, status=STALLED)
    return replace(solution, improved_at=found[-1][0]) if len(found) > 1 else solution


def _stop_when_stalled(h: Any, found: list[tuple[float, float]], stall: float,
                       after: float) -> None:
    """Makes HiGHS record each improving solution in ``found`` and stop once they stall."""
    def improved(e: Any) -> None:
        found.append((time.perf_counter(), float(e.data_out.objective_function_value)))

    def check(e: Any) -> None:
        if stalled(found, stall, after):
            e.interrupt()

    h.cbMipImprovingSolution += improved
    h.cbMipInterrupt += check


def _new_highs() -> Any:
    """A silent HiGHS instance (its first construction prints a banner on the C stdout)."""
    import highspy

    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        h = highspy.Highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as sink:
                os.dup2(sink.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _BANNER_SHOWN = True
    h.setOptionValue("output_flag", False)
    return h


def _set_start(h: Any, sub: Subproblem, lines: CostLines, pt: np.ndarray, pd: np.ndarray,
               order: np.ndarray, warm: tuple[np.ndarray, np.ndarray], spread: float) -> None:
    import highspy

    device = relabel(sub, order, warm[0]) if sub.symmetric else warm[0]
    on = device[pt] == pd
    x = on.astype(np.float64)
    m = np.where(on, warm[1][pt], 0.0)
    c = np.where(on, lines.cost(sub.tables[pt], sub.kind[pd], m), 0.0)
    load = np.bincount(pd, weights=c, minlength=sub.kind.size) / sub.weight
    values = [x, m, c, [max(load.max(), 0.0)]]
    if sub.moves is not None:  # the copies between host memory and HBM the start makes
        values.append(np.abs(sub.moves.kept[pt, pd] * m - sub.moves.kept_hbm[pt, pd] * x))
    sol = highspy.HighsSolution()
    sol.col_value = np.concatenate(values).tolist()
    sol.value_valid = True
    h.setSolution(sol)


def relabel(sub: Subproblem, order: np.ndarray, device: np.ndarray) -> np.ndarray:
    """The same placement with devices renumbered within each kind so that, taking tables in
    ``order``, each device's first table comes before the next device's (symmetry breaking)."""
    new = device.copy()
    for k in np.unique(sub.kind):
        members = np.flatnonzero(sub.kind == k)
        first = {}
        for i, t in enumerate(order):
            d = int(device[t])
            if sub.kind[d] == k and d not in first:
                first[d] = i
        used = sorted(first, key=first.__getitem__)
        mapping = dict(zip(used, members[: len(used)], strict=True))
        for t in np.flatnonzero(np.isin(device, used)):
            new[t] = mapping[int(device[t])]
    return new


def _read(h: Any, sub: Subproblem, pt: np.ndarray, pd: np.ndarray, start: float) -> Solution:
    info = h.getInfo()
    status = h.modelStatusToString(h.getModelStatus())
    seconds = time.perf_counter() - start
    if sub.integer:
        bound = float(info.mip_dual_bound)
    else:
        bound = float(info.objective_function_value) if status == "Optimal" else -np.inf
    if info.primal_solution_status < 2:
        return Solution(None, None, np.inf, bound, status, seconds)
    values = np.asarray(h.getSolution().col_value)
    p = pt.size
    x, m = values[:p], values[p: 2 * p]
    nt = sub.tables.size
    if sub.integer:
        pick = x > 0.5
    else:
        best = np.full(nt, -1.0)
        np.maximum.at(best, pt, x)
        pick = x >= best[pt] - _TOLERANCE
        first = np.zeros(nt, dtype=bool)
        keep = np.zeros(p, dtype=bool)
        for i in np.flatnonzero(pick):
            if not first[pt[i]]:
                first[pt[i]] = keep[i] = True
        pick = keep
    device = np.full(nt, -1, dtype=np.int64)
    memory = np.zeros(nt)
    device[pt[pick]] = pd[pick]
    memory[pt[pick]] = m[pick] / np.maximum(x[pick], _TOLERANCE)
    return Solution(device, memory, float(info.objective_function_value), bound, status, seconds)
