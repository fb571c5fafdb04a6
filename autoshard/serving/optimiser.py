"""Our mapping optimiser: simulated annealing over the request simulator.

At a given number of sparse servers it starts from the best baseline mapping (capacity-balanced,
load-balanced, feature-group), then moves tables, or whole feature groups, between servers,
each move priced incrementally (only the two servers' per-request aggregates change) on a fixed
sub-sample of the task's requests (common random numbers), accepting worse moves with the
annealing probability. The result is re-simulated on the task's full sample and returned only if
it beats its seed there, so it is never worse than the best baseline at the same server count.
"""

from __future__ import annotations

import math

import numpy as np

from autoshard.errors import PlannerError
from autoshard.serving.mapping import Mapping
from autoshard.serving.simulate import RequestSample, ServerLoad, simulate, simulate_load
from autoshard.serving.strategies import (
    CapacityBalanced,
    FeatureGroup,
    LoadBalanced,
    check_servers,
)
from autoshard.serving.task import ServingTask

BASELINES = (CapacityBalanced, LoadBalanced, FeatureGroup)


def objective(p99_ms: float, mean_ms: float) -> float:
    """What the search minimises: P99, with the mean as a small tie-breaker."""
    return p99_ms + 0.05 * mean_ms


class Optimiser:
    """Fewest servers meeting a P99 target (with :func:`autoshard.serving.planning.plan`), or
    lowest P99 at a given server count (``map``).

    Args:
        iterations: Annealing moves per server count.
        search_requests: Requests in the search's sub-sample.
        seed: Seed of the moves.
    """

    summary = "anneals table and group moves over the simulator, seeded by the best baseline"
    name = "optimiser"
    needs_servers = True

    def __init__(self, iterations: int = 400, search_requests: int = 4000, seed: int = 0) -> None:
        self.iterations = iterations
        self.search_requests = search_requests
        self.seed = seed

    def map(self, task: ServingTask, servers: int) -> Mapping:
        check_servers(task, servers)
        seeds = []
        for cls in BASELINES:
            try:
                seeds.append(cls().map(task, servers))
            except PlannerError:
                continue
        if not seeds:
            raise PlannerError("capacity", f"no baseline fits the tables on {servers} servers")
        scored = [(_score(task, m), m) for m in seeds]
        start_score, start = min(scored, key=lambda pair: pair[0])
        found = self.search(task, start)
        found_score = _score(task, found)
        if found_score < start_score:
            gain = 1 - found_score / start_score
            return Mapping(servers, found.assign, self.name,
                           f"search improved its seed ({start.strategy}) by {gain:.1%}")
        return Mapping(servers, start.assign, self.name,
                       f"search kept its seed ({start.strategy})")

    def search(self, task: ServingTask, start: Mapping) -> Mapping:
        """Anneals from ``start`` on a sub-sample; returns the best mapping seen there."""
        m = min(self.search_requests, task.sample.requests)
        sample = RequestSample(task.sample.touched[:m], task.sample.gaps[:m], task.sample.seed)
        state = _State(task, sample, start)
        rng = np.random.default_rng(self.seed)
        current = best = state.score()
        best_assign = state.assign.copy()
        temp0 = 0.02 * current
        for it in range(self.iterations):
            move = state.propose(rng)
            if move is None:
                continue
            state.apply(*move)
            value = state.score()
            temp = temp0 * (0.01 ** (it / max(self.iterations - 1, 1)))
            if value <= current or rng.random() < math.exp(-(value - current) / max(temp, 1e-12)):
                current = value
                if value < best:
                    best, best_assign = value, state.assign.copy()
            else:
                state.apply(move[0], move[2], move[1])
        return Mapping(start.servers, tuple(int(s) for s in best_assign), self.name)


def _score(task: ServingTask, mapping: Mapping) -> float:
    lat = simulate(task.model, task.profile, mapping, task.qps, task.sample, task.costs)
    return objective(lat.percentile_ms(99), float(lat.end_to_end_us.mean()) / 1e3)


class _State:
    """Per-request, per-server aggregates of a mapping, updated move by move."""

    def __init__(self, task: ServingTask, sample: RequestSample, start: Mapping) -> None:
        self.task, self.sample = task, sample
        self.touched = sample.touched.astype(np.float64)
        self.assign = start.array.copy()
        self.servers = start.servers
        costs = task.costs
        self.per_table = np.stack([costs.work_us, costs.transfer_us])  # (2, tables)
        self.bytes = costs.bytes
        self.used = np.bincount(self.assign, weights=self.bytes, minlength=self.servers)
        onehot = np.zeros((self.assign.size, self.servers + 1))
        onehot[np.arange(self.assign.size), self.assign + 1] = 1.0
        self.work = self.touched @ (onehot * costs.work_us[:, None])
        self.transfer = self.touched @ (onehot * costs.transfer_us[:, None])
        self.count = self.touched @ onehot
        self.group = costs.group
        self.expected = costs.expected_us

    def score(self) -> float:
        load = ServerLoad(self.work, self.transfer, self.count > 0.5)
        lat = simulate_load(load, self.sample, self.task.profile, self.task.model.items,
                            self.task.qps)
        return objective(lat.percentile_ms(99), float(lat.end_to_end_us.mean()) / 1e3)

    def busiest_move(self, rng: np.random.Generator) -> tuple[np.ndarray, int, int] | None:
        """A table of the busiest server (drawn by its share of the load) to the least busy
        server it fits on."""
        busy = (self.work[:, 1:] + self.transfer[:, 1:]).sum(axis=0) + (
            self.count[:, 1:] > 0.5).sum(axis=0) * self.task.profile.call_overhead_us
        src = int(np.argmax(busy))
        tables = np.flatnonzero(self.assign == src)
        if tables.size < 2:
            return None
        load = self.expected[tables]
        t = int(rng.choice(tables, p=load / load.sum())) if load.sum() > 0 else int(tables[0])
        room = self.used + self.bytes[t] <= self.task.profile.server_bytes
        room[src] = False
        if not room.any():
            return None
        dst = int(np.flatnonzero(room)[np.argmin(busy[room])])
        return np.array([t]), src, dst

    def propose(self, rng: np.random.Generator) -> tuple[np.ndarray, int, int] | None:
        """(tables, from, to): half the time a table off the busiest server
        (:meth:`busiest_move`); else a random table, or its group's tables on its server, to
        another server, a third of the time to one holding others of its group."""
        if rng.random() < 0.5:
            return self.busiest_move(rng)
        t = int(rng.integers(self.assign.size))
        src = int(self.assign[t])
        mates = np.flatnonzero(self.group == self.group[t])
        tables = mates[self.assign[mates] == src] if rng.random() < 0.5 else np.array([t])
        others = np.unique(self.assign[mates])
        others = others[others != src]
        if others.size and rng.random() < 1 / 3:
            dst = int(rng.choice(others))
        else:
            dst = int(rng.integers(self.servers))
        size = float(self.bytes[tables].sum())
        if dst == src or self.used[dst] + size > self.task.profile.server_bytes:
            return None
        return tables, src, dst

    def apply(self, tables: np.ndarray, src: int, dst: int) -> None:
        cols = self.touched[:, tables]
        work = cols @ self.per_table[0, tables]
        transfer = cols @ self.per_table[1, tables]
        count = cols.sum(axis=1)
        for col, sign in ((src + 1, -1.0), (dst + 1, 1.0)):
            self.work[:, col] += sign * work
            self.transfer[:, col] += sign * transfer
            self.count[:, col] += sign * count
        size = float(self.bytes[tables].sum())
        self.used[src] -= size
        self.used[dst] += size
        self.assign[tables] = dst
