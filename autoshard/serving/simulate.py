"""Request-level serving simulator: Monte Carlo over requests, vectorised, seeded.

For a mapping, each sampled request calls every sparse server that holds a table it touches
(in parallel) and looks up its main-server tables locally. A call's service time is the
per-call overhead plus its lookups' CPU time plus its tables' transfer and per-table call
cost, times a lognormal tail factor (mean 1); the network latency adds to its response without
occupying the server. Requests arrive as a Poisson stream at ``qps``;
each server serves calls first come, first served on ``cores`` cores (calls dealt to the cores
round-robin, each core a FIFO queue solved in closed form by the Lindley recursion
``D_k = max(a_k, D_{k-1}) + x_k = C_k + max_{j<=k}(a_j - C_{j-1})`` with ``C`` the cumulative
service). The main server queues each request's own fixed work, its local lookups, its cost of
issuing the calls and dense compute the same way. End-to-end latency is the later of the main
server's response and the time to take the request and issue the calls plus the slowest
call's response plus the dense compute. When every process runs on one host
(``host_cores`` > 0, as in ``serve bench``), service times are stretched by the sharing of its
cores (:func:`host_slowdown`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.errors import InputError
from autoshard.serving.mapping import MAIN, Mapping
from autoshard.serving.model import ServingModel, TableCosts, table_costs
from autoshard.serving.profile import ServingProfile

CHUNK = 8192  # requests per vectorised block (bounds working memory)


@dataclass(frozen=True)
class RequestSample:
    """Sampled requests: which tables each touches, and unit-rate arrival gaps.

    Args:
        touched: (requests, tables) bool.
        gaps: (requests,) exponential(1) inter-arrival gaps, scaled by 1 / qps when simulated.
        seed: The seed they were drawn with (tail factors derive from it too).
    """

    touched: np.ndarray
    gaps: np.ndarray
    seed: int

    @property
    def requests(self) -> int:
        return int(self.touched.shape[0])


def sample_requests(model: ServingModel, requests: int, seed: int = 0) -> RequestSample:
    """Draws ``requests`` requests: groups touched together, tables within them."""
    if not (isinstance(requests, int) and requests >= 1):
        raise InputError("must be an integer >= 1", field="requests", value=requests)
    rng = np.random.default_rng(seed)
    group_p = model.group_touch().astype(np.float32)
    table_p = model.conditional_touch().astype(np.float32)
    group = np.asarray(model.group)
    touched = np.empty((requests, model.num_tables), dtype=bool)
    for lo in range(0, requests, CHUNK):
        n = min(CHUNK, requests - lo)
        groups = rng.random((n, group_p.size), dtype=np.float32) < group_p
        tables = rng.random((n, table_p.size), dtype=np.float32) < table_p
        np.logical_and(tables, groups[:, group], out=touched[lo:lo + n])
    return RequestSample(touched, rng.exponential(1.0, requests), seed)


@dataclass(frozen=True)
class ServerLoad:
    """Per-request, per-server aggregates (column 0 the main server, then sparse servers).

    Args:
        work_us: Lookup CPU time. transfer_us: Network time. calls: Whether the server is called.
    """

    work_us: np.ndarray
    transfer_us: np.ndarray
    calls: np.ndarray


def server_load(sample: RequestSample, costs: TableCosts, mapping: Mapping) -> ServerLoad:
    """Aggregates each request's touched tables per server (blocked float32 matmul)."""
    cols = mapping.servers + 1
    onehot = np.zeros((costs.bytes.size, cols), dtype=np.float32)
    onehot[np.arange(costs.bytes.size), mapping.array + 1] = 1.0
    weights = np.concatenate([onehot * costs.work_us[:, None].astype(np.float32),
                              onehot * costs.transfer_us[:, None].astype(np.float32), onehot],
                             axis=1)
    out = np.empty((sample.requests, 3 * cols), dtype=np.float32)
    for lo in range(0, sample.requests, CHUNK):
        block = sample.touched[lo:lo + CHUNK].astype(np.float32)
        np.matmul(block, weights, out=out[lo:lo + CHUNK])
    return ServerLoad(out[:, :cols], out[:, cols:2 * cols], out[:, 2 * cols:] > 0.5)


def fifo_departures(arrivals: np.ndarray, service: np.ndarray, cores: int) -> np.ndarray:
    """Departure times of FIFO jobs dealt round-robin to ``cores`` queues (Lindley, closed form)."""
    n = arrivals.size
    if n == 0:
        return arrivals.astype(float)
    rows = -(-n // cores)
    pad = rows * cores - n
    a = np.concatenate([arrivals, np.full(pad, arrivals[-1])]).reshape(rows, cores)
    x = np.concatenate([service, np.zeros(pad)]).reshape(rows, cores)
    cum = np.cumsum(x, axis=0)
    dep = cum + np.maximum.accumulate(a - (cum - x), axis=0)
    return dep.reshape(-1)[:n]


@dataclass(frozen=True)
class Latencies:
    """Simulated requests of one mapping at one rate.

    Args:
        end_to_end_us: (requests,) latency per request.
        compute_us: (requests,) CPU time spent on the request over all servers.
        calls: (requests,) remote calls per request.
        utilisation: Busy share of each server's cores (main first); >= 1 means overloaded.
    """

    end_to_end_us: np.ndarray
    compute_us: np.ndarray
    calls: np.ndarray
    utilisation: np.ndarray

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.end_to_end_us, q)) / 1e3


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


def simulate_load(load: ServerLoad, sample: RequestSample, profile: ServingProfile,
                  items: int, qps: float) -> Latencies:
    """Queues every server's calls at ``qps`` and returns per-request latencies."""
    if not (np.isfinite(qps) and qps > 0):
        raise InputError("request rate must be a number > 0", field="qps", value=qps)
    arrivals = np.cumsum(sample.gaps) * (1e6 / qps)
    cols = load.calls.shape[1]
    rng = np.random.default_rng([sample.seed, cols])
    sigma = profile.tail_sigma
    tail = np.exp(sigma * rng.standard_normal((sample.requests, cols)) - sigma**2 / 2)
    dense = profile.dense_us_per_item * items
    service = (load.work_us + load.transfer_us) * tail
    service[:, 1:] += profile.call_overhead_us * tail[:, 1:]
    service[:, 1:] *= load.calls[:, 1:]
    calls = load.calls[:, 1:].sum(axis=1)
    issue = profile.main_call_us * calls * tail[:, 0]  # the main server issues calls in turn
    own = profile.main_request_us * tail[:, 0]
    service[:, 0] = load.work_us[:, 0] * tail[:, 0] + dense + issue + own
    span = arrivals[-1] + 1e-9
    if profile.host_cores:  # every process on one host: they share its cores
        slow = host_slowdown(service.sum(axis=0) / (span * profile.cores), profile.host_cores)
        service *= slow
        issue = issue * slow[0]
        own = own * slow[0]
    response = np.zeros((sample.requests, cols))
    busy = service.sum(axis=0)
    response[:, 0] = fifo_departures(arrivals, service[:, 0], profile.cores) - arrivals
    for s in range(1, cols):
        hit = np.flatnonzero(load.calls[:, s])
        if hit.size:
            done = fifo_departures(arrivals[hit], service[hit, s], profile.cores)
            response[hit, s] = done - arrivals[hit] + profile.network_latency_us * tail[hit, s]
    slowest = (own + issue + response[:, 1:].max(axis=1) + dense if cols > 1
               else np.zeros(sample.requests))
    return Latencies(np.maximum(response[:, 0], slowest), service.sum(axis=1), calls,
                     busy / (span * profile.cores))


def simulate(model: ServingModel, profile: ServingProfile, mapping: Mapping, qps: float,
             sample: RequestSample, costs: TableCosts | None = None) -> Latencies:
    """Simulates ``sample`` served by ``mapping`` at ``qps`` requests per second."""
    costs = costs if costs is not None else table_costs(model, profile)
    return simulate_load(server_load(sample, costs, mapping), sample, profile, model.items, qps)


def single_server(model: ServingModel) -> Mapping:
    """The hypothetical single server holding every table (memory not checked)."""
    return Mapping(0, (MAIN,) * model.num_tables, "single server")
