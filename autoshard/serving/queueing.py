"""Queues of a serving simulation: many first-come-first-served multi-core servers at once.

A server's worker threads take calls from one shared queue (M/G/c, the thread pool of an RPC
server): each call, in arrival order, starts on the first core to come free. Many queues of
different lengths are solved together, one step per call index (a queue's free-core times
are a row of a matrix), so the cost is the longest queue's length, not the sum. One core is
the Lindley recursion in closed form. Stalls (a paused process or host) delay every call in
service while they last; one timeline is drawn per server, or one for the whole host.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Stalls drawn per timeline at most (a bound on memory; the expected count is far below it
#: for any sample of a realistic length).
MAX_STALLS = 200_000


def solve_queues(arrivals: Sequence[np.ndarray], service: Sequence[np.ndarray], cores: int
                 ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Start and departure times of every job of several FCFS queues with ``cores`` cores
    each sharing one queue. Jobs of a queue need not be sorted; they are served by arrival.

    Args:
        arrivals: Per queue, its jobs' arrival times.
        service: Per queue, its jobs' service times (same shapes).
        cores: Cores per server.

    Returns:
        (starts, departures), per queue, in the order the jobs were given.
    """
    lengths = [a.size for a in arrivals]
    width = max(lengths, default=0)
    if width == 0:
        return [a.astype(float) for a in arrivals], [a.astype(float) for a in arrivals]
    q = len(arrivals)
    order = [np.argsort(a, kind="stable") for a in arrivals]
    big = 1e300
    arr = np.full((q, width), big)
    svc = np.zeros((q, width))
    for i, (a, x, o) in enumerate(zip(arrivals, service, order, strict=True)):
        arr[i, :a.size] = a[o]
        svc[i, :a.size] = x[o]
    start = _one_core(arr, svc) if cores == 1 else _many_cores(arr, svc, cores)
    starts, deps = [], []
    for i, o in enumerate(order):
        s = np.empty(o.size)
        s[o] = start[i, :o.size]
        starts.append(s)
        deps.append(s + service[i])
    return starts, deps


def _one_core(arr: np.ndarray, svc: np.ndarray) -> np.ndarray:
    """Start times on one core: ``D_k = C_k + max_{j<=k}(a_j - C_{j-1})`` (Lindley)."""
    cum = np.cumsum(svc, axis=1)
    dep = cum + np.maximum.accumulate(arr - (cum - svc), axis=1)
    return dep - svc


def _many_cores(arr: np.ndarray, svc: np.ndarray, cores: int) -> np.ndarray:
    """Start times on ``cores`` cores fed by one queue: each job takes the core free first."""
    q, width = arr.shape
    free = np.zeros((q, cores))
    rows = np.arange(q)
    start = np.empty((q, width))
    arr_t, svc_t = np.ascontiguousarray(arr.T), np.ascontiguousarray(svc.T)
    for k in range(width):
        core = free.argmin(axis=1)
        begin = np.maximum(arr_t[k], free[rows, core])
        free[rows, core] = begin + svc_t[k]
        start[:, k] = begin
    return start


def stall_delays(starts: Sequence[np.ndarray], deps: Sequence[np.ndarray], span_us: float,
                 per_s: float, mean_us: float, shared: bool,
                 rng: np.random.Generator) -> list[np.ndarray]:
    """Per queue, the stall time each job waits: the stalls that begin while it is in service.

    Stalls arrive as a Poisson stream of ``per_s`` per second (exponential lengths of mean
    ``mean_us``) on each queue's own timeline, or on one timeline for all when ``shared``.
    """
    if per_s <= 0 or mean_us <= 0:
        return [np.zeros(s.size) for s in starts]
    timeline = _timeline(span_us, per_s, mean_us, rng) if shared else None
    out = []
    for s, d in zip(starts, deps, strict=True):
        at, cum = timeline if timeline is not None else _timeline(span_us, per_s, mean_us, rng)
        out.append(cum[np.searchsorted(at, d)] - cum[np.searchsorted(at, s)])
    return out


def _timeline(span_us: float, per_s: float, mean_us: float,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(sorted stall starts, cumulative stall length before each index)."""
    count = min(int(rng.poisson(min(per_s * span_us / 1e6, 1e12))), MAX_STALLS)
    at = np.sort(rng.uniform(0.0, span_us, count))
    return at, np.r_[0.0, np.cumsum(rng.exponential(mean_us, count))]


def host_slowdown(busy: np.ndarray, host_cores: int, rounds: int = 4) -> np.ndarray:
    """How much slower each process runs when all share ``host_cores`` cores.

    ``busy`` is each process's busy share alone (one thread each). While a process runs, each
    other one is runnable with probability its (slowed, capped at 1) busy share, independently;
    with ``k`` others runnable the cores are shared ``max(1, (1 + k) / host_cores)`` ways. The
    expected slowdown is taken over the Poisson-binomial law of ``k``, and iterated a few times
    since slowed processes stay busy longer.
    """
    slow = np.ones(busy.size)
    ways = np.maximum(1.0, (1.0 + np.arange(busy.size)) / host_cores)
    for _ in range(rounds):
        u = np.minimum(busy * slow, 1.0)
        new = np.empty(busy.size)
        for i in range(busy.size):
            law = np.zeros(busy.size)
            law[0] = 1.0
            for j in np.flatnonzero(np.arange(busy.size) != i):
                law[1:] = law[1:] * (1 - u[j]) + law[:-1] * u[j]
                law[0] *= 1 - u[j]
            new[i] = float(law @ ways)
        slow = new
    return slow
