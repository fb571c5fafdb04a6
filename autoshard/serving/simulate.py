"""Request-level serving simulator: Monte Carlo over requests, vectorised, seeded.

Per sampled request: which tables (and so which parts and shards) it touches, how many items it
scores, and a Poisson arrival at ``qps``. The request goes to a main-tier replica at random and
queues for a core there (:mod:`autoshard.serving.queueing`, one shared queue per server). On a core
the main server takes the request (``main_request_us``, with a tail of its own:
``main_tail_sigma``) and issues its remote calls one after another (``main_call_us`` each); each
call goes to a replica of its shard at random and queues there. A call's service time is the
per-call overhead plus its parts' lookups, transfer and per-table call cost; the network latency
adds to its response without occupying the server. Meanwhile the main server looks up its own parts
and, on another thread beside them, runs the dense part that overlaps the lookups
(``dense_overlap``); the rest of the dense part follows the slowest reply and the local lookups. A
request of more than ``batch_items`` items is split into batches (DeepRecSys): each batch is a job
of its own on the main server's queue, runs its share of the dense part (plus
``batch_overhead_us``), and the request waits for all of them. Every service time carries a
lognormal tail factor (mean 1), and stalls delay the calls in service
(:func:`autoshard.serving.queueing.stall_delays`). When every process runs on one host
(``host_cores`` > 0, as in ``serve bench --mode concurrent``), service times are stretched by the
sharing of its cores (:func:`autoshard.serving.queueing.host_slowdown`).

Simplification: the main server's queue holds each request (each batch) for its whole CPU
time (its own work, local lookups and dense compute) on one core; the request's latency path
runs the local lookups and the overlapping dense part side by side, and the rest of the dense
compute as soon as the replies arrive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoshard.errors import InputError
from autoshard.serving.cluster import ServingProfile
from autoshard.serving.costs import PartCosts
from autoshard.serving.mapping import MAIN, Mapping
from autoshard.serving.model import ServingModel
from autoshard.serving.queueing import host_slowdown, solve_queues, stall_delays

CHUNK = 8192  # requests per vectorised block (bounds working memory)


@dataclass(frozen=True)
class RequestSample:
    """Sampled requests: which tables each touches, arrival gaps and item counts.

    Args:
        touched: (requests, tables) bool.
        gaps: (requests,) exponential(1) inter-arrival gaps, scaled by 1 / qps when simulated.
        items: (requests,) each request's items over the model's mean (mean 1).
        seed: The seed they were drawn with (routing, tails and stalls derive from it).
        draw: Which draw of the service times (tails and stalls) the simulator takes: the
            requests and how they are dealt to replicas are the same for every draw.
    """

    touched: np.ndarray
    gaps: np.ndarray
    items: np.ndarray
    seed: tuple[int, ...]
    draw: int = 0

    @property
    def requests(self) -> int:
        return int(self.touched.shape[0])

    def head(self, count: int) -> RequestSample:
        return RequestSample(self.touched[:count], self.gaps[:count], self.items[:count],
                             self.seed, self.draw)

    def redrawn(self, draw: int) -> RequestSample:
        """The same requests, dealt alike, with draw ``draw`` of the service times."""
        return RequestSample(self.touched, self.gaps, self.items, self.seed, draw)

    @property
    def stream(self) -> tuple[int, ...]:
        """The key of this draw's random streams (the seed alone for draw 0)."""
        return (*self.seed, self.draw) if self.draw else self.seed


def sample_requests(model: ServingModel, requests: int,
                    seed: int | Sequence[int] = 0) -> RequestSample:
    """Draws ``requests`` requests: groups touched together, tables within them, items."""
    if not (isinstance(requests, int) and requests >= 1):
        raise InputError("must be an integer >= 1", field="requests", value=requests)
    key = (seed,) if isinstance(seed, int) else tuple(int(s) for s in seed)
    rng = np.random.default_rng(list(key))
    group_p = model.group_touch().astype(np.float32)
    table_p = model.conditional_touch().astype(np.float32)
    group = np.asarray(model.group)
    touched = np.empty((requests, model.num_tables), dtype=bool)
    for lo in range(0, requests, CHUNK):
        n = min(CHUNK, requests - lo)
        groups = rng.random((n, group_p.size), dtype=np.float32) < group_p
        tables = rng.random((n, table_p.size), dtype=np.float32) < table_p
        np.logical_and(tables, groups[:, group], out=touched[lo:lo + n])
    gaps = rng.exponential(1.0, requests)
    sigma = model.items_sigma
    items = np.exp(sigma * rng.standard_normal(requests) - sigma**2 / 2)
    return RequestSample(touched, gaps, items, key)


@dataclass(frozen=True)
class ServerLoad:
    """Per-request, per-server aggregates (column 0 the main server, then the shards).

    Args:
        work_us: Lookup CPU time. transfer_us: Network time. wire_bytes: Bytes on the network.
        calls: Whether the server is called.
    """

    work_us: np.ndarray
    transfer_us: np.ndarray
    wire_bytes: np.ndarray
    calls: np.ndarray


def touched_parts(sample: RequestSample, costs: PartCosts) -> np.ndarray:
    """(requests, parts) bool: a part is touched when its table is and a lookup falls on it."""
    out = sample.touched[:, costs.table]
    split = np.flatnonzero(costs.part_p < 1.0)
    if split.size:
        rng = np.random.default_rng([*sample.seed, 5])
        draw = rng.random((sample.requests, split.size), dtype=np.float32)
        out[:, split] &= draw < costs.part_p[split].astype(np.float32)
    return out


def server_load(sample: RequestSample, costs: PartCosts, mapping: Mapping) -> ServerLoad:
    """Aggregates each request's touched parts per server (blocked float32 matmul)."""
    cols = mapping.servers + 1
    parts = costs.bytes.size
    onehot = np.zeros((parts, cols), dtype=np.float32)
    onehot[np.arange(parts), mapping.array + 1] = 1.0
    weights = np.concatenate([onehot * costs.work_us[:, None].astype(np.float32),
                              onehot * costs.transfer_us[:, None].astype(np.float32),
                              onehot * costs.wire_bytes[:, None].astype(np.float32), onehot],
                             axis=1)
    touched = touched_parts(sample, costs)
    per_item = weights[:, :3 * cols] * costs.per_item.astype(np.float32)[:, None]
    out = np.empty((sample.requests, 4 * cols), dtype=np.float32)
    for lo in range(0, sample.requests, CHUNK):
        block = touched[lo:lo + CHUNK].astype(np.float32)
        extra = sample.items[lo:lo + CHUNK, None].astype(np.float32) - 1.0
        np.matmul(block, weights, out=out[lo:lo + CHUNK])
        # per-item parts scale with the request's items: add (items - 1) times their share
        out[lo:lo + CHUNK, :3 * cols] += extra * (block @ per_item)
    return ServerLoad(out[:, :cols], out[:, cols:2 * cols], out[:, 2 * cols:3 * cols],
                      out[:, 3 * cols:] > 0.5)


@dataclass(frozen=True)
class Latencies:
    """Simulated requests of one mapping at one rate (one request sample).

    Args:
        end_to_end_us: (requests,) latency per request.
        compute_us: (requests,) CPU time spent on the request over all servers.
        calls: (requests,) remote calls per request.
        main_utilisation: Busy share of each main-tier replica's cores.
        shard_utilisation: Busy share of each shard's busiest replica.
        main_nic: Share of a main replica's network interface its replies take (busiest).
        shard_nic: Share of each shard's busiest replica's network interface.
    """

    end_to_end_us: np.ndarray
    compute_us: np.ndarray
    calls: np.ndarray
    main_utilisation: np.ndarray
    shard_utilisation: np.ndarray
    main_nic: float
    shard_nic: np.ndarray

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.end_to_end_us, q)) / 1e3

    @property
    def utilisation(self) -> np.ndarray:
        """Busiest main replica, then each shard's busiest replica."""
        return np.r_[self.main_utilisation.max(), self.shard_utilisation]

    @property
    def max_utilisation(self) -> float:
        return float(self.utilisation.max())

    @property
    def max_nic(self) -> float:
        return float(max(self.main_nic, float(self.shard_nic.max(initial=0.0))))


@dataclass
class _Prepared:
    """One sample's per-request figures before queueing."""

    arrivals: np.ndarray
    pre: np.ndarray
    local: np.ndarray
    after: np.ndarray
    main_service: np.ndarray
    first_job: np.ndarray
    other_job: np.ndarray
    other_ready: np.ndarray
    batches: np.ndarray
    call_service: np.ndarray
    calls: np.ndarray
    net: np.ndarray
    wire: np.ndarray
    main_rep: np.ndarray
    call_rep: np.ndarray
    span: float


def deal(sample: RequestSample, mapping: Mapping) -> tuple[np.ndarray, np.ndarray]:
    """(main replica of each request, (requests, shards) replica each shard's call goes to):
    requests and calls are dealt to replicas uniformly at random, the same for every draw
    of the sample. The measured runs deal their calls by this too."""
    return _draws(sample, mapping)[1:]


def _draws(sample: RequestSample, mapping: Mapping
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(standard normals of the tails, main replicas, call replicas). The dealing follows the
    draw-0 tails in one stream; another draw takes its tails from a stream of its own, so the
    dealing stays put."""
    n, cols = sample.requests, mapping.servers + 1
    rng = np.random.default_rng([*sample.seed, cols, 11])
    normal = rng.standard_normal((n, cols))
    main_rep = rng.integers(mapping.main_replicas, size=n)
    call_rep = (rng.random((n, mapping.servers)) * mapping.replica_counts).astype(np.int64)
    if sample.draw:
        normal = np.random.default_rng([*sample.stream, cols, 11]).standard_normal((n, cols))
    return normal, main_rep, call_rep


def prepare(sample: RequestSample, model: ServingModel, profile: ServingProfile,
            mapping: Mapping, qps: float, costs: PartCosts) -> _Prepared:
    """Service times, routing and arrival times of one sample's requests and calls."""
    load = server_load(sample, costs, mapping)
    normal, main_rep, call_rep = _draws(sample, mapping)
    sigma = profile.tail_sigma
    tail = np.exp(sigma * normal - sigma**2 / 2)
    calls = load.calls[:, 1:]
    batches, dense, extra = _batches(model, profile, sample)
    count = calls.sum(axis=1)
    pre = (profile.main_request_us * _wake(sample, profile) + profile.main_call_us * count
           ) * tail[:, 0]
    lookups = load.work_us[:, 0] * tail[:, 0]
    ahead = model.dense_overlap * dense + extra  # one batch's part before the replies
    local = np.maximum(lookups, ahead)  # on two threads side by side
    after = (1 - model.dense_overlap) * dense
    service = (profile.call_overhead_us + load.work_us[:, 1:] + load.transfer_us[:, 1:]
               ) * tail[:, 1:] * calls
    arrivals = np.cumsum(sample.gaps) * (1e6 / qps)
    first = pre + lookups + dense + extra
    other = dense + extra
    return _Prepared(arrivals, pre, local, after, first + (batches - 1) * other, first, other,
                     ahead, batches, service, calls,
                     profile.network_latency_us * tail[:, 1:], load.wire_bytes[:, 1:],
                     main_rep, call_rep, float(arrivals[-1]) + 1e-9)


def _wake(sample: RequestSample, profile: ServingProfile) -> np.ndarray | float:
    """The factor (lognormal, mean 1, ``main_tail_sigma``) on each request's
    ``main_request_us``: how late the main server wakes to it; 1 when the profile has none."""
    sigma = profile.main_tail_sigma
    if not sigma:
        return 1.0
    rng = np.random.default_rng([*sample.stream, 19])
    return np.exp(sigma * rng.standard_normal(sample.requests) - sigma**2 / 2)


def _batches(model: ServingModel, profile: ServingProfile, sample: RequestSample
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(batches per request, dense compute per batch, fixed cost per batch): a request of more
    than ``batch_items`` items is split into batches that run side by side (DeepRecSys);
    ``batch_items`` 0 keeps every request whole at no extra cost."""
    dense = profile.dense_us_per_item * model.items * sample.items
    if not profile.batch_items:
        return np.ones(sample.requests, dtype=np.int64), dense, np.zeros(sample.requests)
    count = np.maximum(np.ceil(model.items * sample.items / profile.batch_items), 1)
    extra = np.where(count > 1, profile.batch_overhead_us, 0.0)
    return count.astype(np.int64), dense / count, extra


def offered_load(model: ServingModel, profile: ServingProfile, mapping: Mapping, qps: float,
                 sample: RequestSample, costs: PartCosts) -> tuple[float, np.ndarray]:
    """(main tier, each shard): the servers' worth of load each tier is offered, the larger of
    its cores' and its network interface's busy share on one server (no queueing simulated)."""
    one = Mapping(mapping.servers, mapping.assign, parts=mapping.parts)
    p = prepare(sample, model, profile, one, qps, costs)
    cores, nic = p.span * profile.cores, p.span * profile.nic_gbps * 1e3
    main = max(float(p.main_service.sum()) / cores, float(p.wire.sum()) / nic)
    shards = np.maximum(p.call_service.sum(axis=0) / cores, p.wire.sum(axis=0) / nic)
    return main, shards


def simulate(model: ServingModel, profile: ServingProfile, mapping: Mapping, qps: float,
             samples: Sequence[RequestSample], costs: PartCosts) -> list[Latencies]:
    """Simulates each of ``samples`` served by ``mapping`` at ``qps`` requests per second
    (their queues solved together)."""
    if not (np.isfinite(qps) and qps > 0):
        raise InputError("request rate must be a number > 0", field="qps", value=qps)
    if costs.bytes.size != len(mapping.assign):
        raise InputError("costs and mapping disagree on the parts", field="assign",
                         value=(costs.bytes.size, len(mapping.assign)))
    preps = [prepare(s, model, profile, mapping, qps, costs) for s in samples]
    if profile.host_cores:
        for p in preps:
            _share_host(p, mapping, profile)
    main_start, main_stall, ready = _main_tier(preps, mapping, profile, samples)
    done = _shards(preps, main_start, mapping, profile, samples)
    out = []
    for p, start, stall, remote, others in zip(preps, main_start, main_stall, done, ready,
                                               strict=True):
        local_done = np.maximum(start + p.pre + p.local + stall, others)
        end = np.maximum(local_done, remote) + p.after
        out.append(_latencies(p, end - p.arrivals, mapping, profile))
    return out


def _main_tier(preps: list[_Prepared], mapping: Mapping, profile: ServingProfile,
               samples: Sequence[RequestSample]
               ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per sample: each request's start on its main replica, the stalls it meets there, and
    when its other batches (if split) are ready for the replies (-inf when whole)."""
    arr, svc, index = [], [], []
    for k, p in enumerate(preps):
        for r in range(mapping.main_replicas):
            sel = np.flatnonzero(p.main_rep == r)
            more = np.repeat(sel, p.batches[sel] - 1)
            arr.append(np.r_[p.arrivals[sel], p.arrivals[more]])
            svc.append(np.r_[p.first_job[sel], p.other_job[more]])
            index.append((k, sel, more))
    starts, deps = solve_queues(arr, svc, profile.cores)
    rng = np.random.default_rng([*samples[0].stream, 13])
    span = max(p.span for p in preps)
    stalls = stall_delays(starts, deps, span, profile.stall_per_s, profile.stall_us,
                          profile.host_cores > 0, rng)
    start = [np.zeros(p.arrivals.size) for p in preps]
    stall = [np.zeros(p.arrivals.size) for p in preps]
    ready = [np.full(p.arrivals.size, -np.inf) for p in preps]
    for (k, sel, more), s, d in zip(index, starts, stalls, strict=True):
        start[k][sel] = s[:sel.size]
        stall[k][sel] = d[:sel.size]
        done = s[sel.size:] + d[sel.size:] + preps[k].other_ready[more]
        np.maximum.at(ready[k], more, done)
    return start, stall, ready


def _shards(preps: list[_Prepared], main_start: list[np.ndarray], mapping: Mapping,
            profile: ServingProfile, samples: Sequence[RequestSample]) -> list[np.ndarray]:
    """Per sample, when each request's slowest reply is back (-inf when it calls none)."""
    arr, svc, index = [], [], []
    for k, (p, start) in enumerate(zip(preps, main_start, strict=True)):
        sent = start + p.pre
        for s in range(mapping.servers):
            for r in range(int(mapping.replica_counts[s])):
                sel = np.flatnonzero(p.calls[:, s] & (p.call_rep[:, s] == r))
                arr.append(sent[sel])
                svc.append(p.call_service[sel, s])
                index.append((k, s, sel))
    done = [np.full(p.arrivals.size, -np.inf) for p in preps]
    if not arr:
        return done
    _, deps = solve_queues(arr, svc, profile.cores)
    rng = np.random.default_rng([*samples[0].stream, 17])
    span = max(p.span for p in preps)
    starts = [d - x for d, x in zip(deps, svc, strict=True)]
    stalls = stall_delays(starts, deps, span, profile.stall_per_s, profile.stall_us,
                          profile.host_cores > 0, rng)
    for (k, s, sel), d, extra in zip(index, deps, stalls, strict=True):
        reply = d + extra + preps[k].net[sel, s]
        done[k][sel] = np.maximum(done[k][sel], reply)
    return done


def _share_host(p: _Prepared, mapping: Mapping, profile: ServingProfile) -> None:
    """Stretches one sample's service times by the sharing of one host's cores."""
    main_busy = [p.main_service[p.main_rep == r].sum() for r in range(mapping.main_replicas)]
    shard_busy = [p.call_service[p.call_rep[:, s] == r, s].sum()
                  for s in range(mapping.servers) for r in range(mapping.replica_counts[s])]
    busy = np.array(main_busy + shard_busy) / (p.span * profile.cores)
    slow = host_slowdown(busy, profile.host_cores)
    main_slow = slow[p.main_rep]
    for name in ("pre", "local", "after", "main_service", "first_job", "other_job",
                 "other_ready"):
        setattr(p, name, getattr(p, name) * main_slow)
    offsets = np.r_[0, np.cumsum(mapping.replica_counts)] + mapping.main_replicas
    for s in range(mapping.servers):
        p.call_service[:, s] *= slow[offsets[s] + p.call_rep[:, s]]


def _latencies(p: _Prepared, end_to_end: np.ndarray, mapping: Mapping,
               profile: ServingProfile) -> Latencies:
    """Latencies of one sample, with busy shares of cores and network interfaces."""
    span, cores, nic = p.span, profile.cores, profile.nic_gbps * 1e3  # bytes per us
    main_u = np.array([p.main_service[p.main_rep == r].sum()
                       for r in range(mapping.main_replicas)]) / (span * cores)
    main_nic = max(float(p.wire[p.main_rep == r].sum()) for r in range(mapping.main_replicas))
    shard_u = np.zeros(mapping.servers)
    shard_nic = np.zeros(mapping.servers)
    for s in range(mapping.servers):
        for r in range(int(mapping.replica_counts[s])):
            hit = p.call_rep[:, s] == r
            shard_u[s] = max(shard_u[s], float(p.call_service[hit, s].sum()) / (span * cores))
            shard_nic[s] = max(shard_nic[s], float(p.wire[hit, s].sum()) / (span * nic))
    return Latencies(end_to_end, p.main_service + p.call_service.sum(axis=1),
                     p.calls.sum(axis=1), main_u, shard_u, main_nic / (span * nic), shard_nic)


def single_server(parts: int) -> Mapping:
    """The hypothetical single server holding every part (memory not checked)."""
    return Mapping(0, (MAIN,) * parts, "unsharded")
