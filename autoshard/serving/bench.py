"""Measured serving on this machine: one process per server, torch.distributed.rpc (TensorPipe).

The measured requests are drawn by the simulator's own sampler (same seed: same tables
touched, same arrival gaps), and the simulated percentiles come from a longer stream of the same
distribution (``simulated_requests``). Tables are
real ``EmbeddingBag`` s with their rows capped (``max_rows``) to keep the run small; lookups
per touched table follow the model. A process that dies, or makes no progress for
``timeout_s``, ends the run with an error naming it (main server or sparse server N); every
process is stopped before the error is raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError
from autoshard.limits import BANDWIDTH_GBPS
from autoshard.runner.launch import RunError, launch_local
from autoshard.serving.mapping import MAIN, Mapping
from autoshard.serving.simulate import sample_requests, simulate, touched_parts
from autoshard.serving.task import ServingTask

#: What a fitted bandwidth may be: a profile's range (a slope of zero is unmeasurably fast).
BANDWIDTH_GBPS_BOUNDS = (BANDWIDTH_GBPS.low, BANDWIDTH_GBPS.high)


@dataclass(frozen=True)
class BenchConfig:
    """A measured run.

    Args:
        qps: Request rates, run one after the other in one launch.
        requests: Requests per rate and round, warm-up included.
        rounds: Rounds over every rate (interleaved); each percentile reported is the median
            over rounds.
        warmup: Requests dropped at the start of each rate's round.
        max_rows: Rows per table held for real (larger tables are capped).
        timeout_s: Longest time a process may go without progress.
        seed: Seed of the request sample.
        simulated_requests: Requests the simulator's percentiles are taken over (same seed,
            same distribution; more than are measured, so its P99 is not a 2nd-largest value).
    """

    qps: tuple[float, ...]
    requests: int = 300
    rounds: int = 1
    warmup: int = 0
    max_rows: int = 20_000
    timeout_s: float = 30.0
    seed: int = 0
    simulated_requests: int = 20_000

    def __post_init__(self) -> None:
        if not self.qps or any(not (np.isfinite(q) and q > 0) for q in self.qps):
            raise InputError("request rates must be numbers > 0", field="qps", value=self.qps)
        if not 10 <= self.requests <= 100_000:
            raise InputError("must be in [10, 100000]", field="requests", value=self.requests)
        if not 1 <= self.rounds <= 100:
            raise InputError("must be in [1, 100]", field="rounds", value=self.rounds)
        if not 0 <= self.warmup <= self.requests - 10:
            raise InputError("must be in [0, requests - 10]", field="warmup", value=self.warmup)
        if self.timeout_s <= 0:
            raise InputError("must be > 0", field="timeout", value=self.timeout_s)


def bench_spec(task: ServingTask, mapping: Mapping, config: BenchConfig) -> dict[str, Any]:
    """What every process needs: the parts (tables or row ranges, each an ``EmbeddingBag``),
    where they live, which process serves each shard replica, and the sampled requests."""
    model = task.model
    parts = mapping.part_set(model.num_tables)
    costs = task.costs_for(parts)
    sample = sample_requests(model, config.requests, (config.seed, 1))
    _, lookups = parts.touch(model)
    bags = np.where(costs.per_item, model.items, 1)
    rows = [max(1, min(int(model.tables[t].rows * (hi - lo)), config.max_rows))
            for t, lo, hi in zip(parts.table, parts.lo, parts.hi, strict=True)]
    ranks, shard_of = [], [MAIN]
    for s, count in enumerate(mapping.replica_counts):
        ranks.append(list(range(len(shard_of), len(shard_of) + int(count))))
        shard_of += [s] * int(count)
    return {"rows": rows, "dims": [model.tables[t].dim for t in parts.table],
            "assign": list(mapping.assign), "lookups": [float(v) for v in lookups],
            "bags": [int(b) for b in bags], "ranks_of": ranks, "shard_of": shard_of,
            "main_replicas": mapping.main_replicas,
            "touched": [np.flatnonzero(row).tolist()
                        for row in touched_parts(sample, costs)],
            "gaps": sample.gaps.tolist(), "qps": list(config.qps), "seed": config.seed,
            "rounds": config.rounds, "warmup": config.warmup, "timeout_s": config.timeout_s}


def percentiles(values_us: np.ndarray) -> dict[str, float]:
    return {f"p{q}_ms": round(float(np.percentile(values_us, q)) / 1e3, 4) for q in (50, 90, 99)}


def process_name(rank: int) -> str:
    return "main server" if rank == 0 else f"sparse server {rank - 1}"


def launch(spec: dict[str, Any], world: int, timeout_s: float,
           logs: Path | None = None) -> dict[str, Any]:
    """Runs ``world`` processes (rank 0 the main server) and returns rank 0's result.

    Raises:
        RunError: A process died or stalled (named); every process has been stopped.
    """
    try:
        result: dict[str, Any] = launch_local(spec, world, timeout_s, logs,
                                              worker="autoshard.serving.bench_worker")
    except RunError as exc:
        raise RunError(_named(str(exc), world)) from exc
    return result


def _named(message: str, world: int) -> str:
    """The launcher's message with ranks named as servers."""
    for rank in reversed(range(world)):
        message = message.replace(f"rank {rank} ", f"{process_name(rank)} (rank {rank}) ")
    return message


def run_bench(task: ServingTask, mapping: Mapping, config: BenchConfig,
              logs: Path | None = None) -> list[dict[str, Any]]:
    """Serves ``mapping`` for real at each rate (one process per shard replica; one main
    process, whatever ``main_replicas`` says); one row per rate, measured beside simulated."""
    costs = task.costs_for(mapping.part_set(task.model.num_tables))
    mapping.check_fits(costs.bytes, task.profile)
    single_main = mapping.with_replicas(tuple(int(r) for r in mapping.replica_counts), 1)
    spec = bench_spec(task, single_main, config)
    result = launch(spec, len(spec["shard_of"]), config.timeout_s, logs)
    sample = sample_requests(task.model, max(config.requests, config.simulated_requests),
                             (config.seed, 1))
    rows = []
    for qps in config.qps:
        rounds = [percentiles(np.asarray(r)) for r in result["latencies_us"][str(qps)]]
        sim = simulate(task.model, task.profile, single_main, qps, [sample], costs)[0]
        row: dict[str, Any] = {"strategy": mapping.strategy, "servers": mapping.servers,
                               "replicas": ",".join(str(r) for r in mapping.replica_counts),
                               "qps": qps, "requests": config.requests - config.warmup,
                               "rounds": config.rounds}
        row.update({f"measured_{k}": round(float(np.median([r[k] for r in rounds])), 4)
                    for k in rounds[0]})
        row.update({f"simulated_{k}": v for k, v in percentiles(sim.end_to_end_us).items()})
        row["calls_per_request"] = round(float(sim.calls.mean()), 3)
        row["p99_ratio"] = round(row["measured_p99_ms"] / max(row["simulated_p99_ms"], 1e-9), 3)
        rows.append(row)
    return rows


def calibrate(calls: int = 200, pause_s: float = 0.004, logs: Path | None = None
              ) -> dict[str, Any]:
    """Measures this machine's serving constants for a profile, none clamped to a bound.

    Local lookups (:func:`fit_lookup_costs`) give ``lookup_ns``, ``table_overhead_us`` and
    ``memory_bandwidth_gbps``. Remote calls of 1-8 tables and 16-512 lookups per table are made
    ``pause_s`` apart, as in a request stream. The server's CPU time per call (its process CPU
    time over the block) is fitted by non-negative least squares as ``a + b * tables``:
    ``call_overhead_us = a``, ``call_table_overhead_us = b`` less the local per-table cost.
    Calls returning 4 KB to 4 MB give ``network_gbps`` (and ``nic_gbps``: one loopback link)
    from the slope of their median round trip over the bytes. The median round trip beyond the
    server's CPU time is ``network_latency_us``; the main process's CPU time per call is
    ``main_call_us``; ``tail_sigma`` is the spread of log round trip about each
    configuration's median, pooled. Requests touching no table, replayed as a measured run
    does, give ``main_request_us`` (their median) and the stalls: a request over its median by
    more than 1 ms is one, ``stall_per_s`` their rate and ``stall_us`` their mean excess.
    ``host_cores`` is the cores this process may run on.
    """
    import os

    from scipy.optimize import nnls

    spec = {"rows": [20_000] * 8, "dims": [32] * 8, "assign": [0] * 8, "calls": calls,
            "pause_s": pause_s, "timeout_s": 60.0, "mode": "calibrate"}
    measured = launch(spec, 2, 600.0, logs)
    points = np.asarray(measured["points"], float)
    (a, b), _ = nnls(np.c_[np.ones(len(points)), points[:, 0]], points[:, 2])
    local = fit_lookup_costs()
    sizes, trips = (np.asarray(v, float) for v in zip(*measured["payload"], strict=True))
    (_, per_byte_us), _ = nnls(np.c_[np.ones(sizes.size), sizes], trips)
    gbps = 1e-3 / per_byte_us if per_byte_us > 0 else BANDWIDTH_GBPS.high
    idle = np.asarray(measured["idle_us"], float)
    stalls = idle[idle > np.median(idle) + 1000.0] - np.median(idle)
    return {"call_overhead_us": round(float(a), 2),
            "network_latency_us": round(max(float(np.mean(points[:, 3] - points[:, 2])), 0.0),
                                        2),
            "main_call_us": round(float(np.median(points[:, 4])), 2),
            "call_table_overhead_us": round(max(float(b) - local["table_overhead_us"], 0.0), 2),
            "network_gbps": round(float(np.clip(gbps, *BANDWIDTH_GBPS_BOUNDS)), 4),
            "nic_gbps": round(float(np.clip(gbps, *BANDWIDTH_GBPS_BOUNDS)), 4), **local,
            "tail_sigma": round(min(float(measured["log_spread"]), 3.0), 3),
            "main_request_us": round(float(np.median(idle)), 2),
            "stall_per_s": round(stalls.size / (idle.size * pause_s + idle.sum() / 1e6), 4),
            "stall_us": round(float(stalls.mean()) if stalls.size else 0.0, 1),
            "host_cores": len(os.sched_getaffinity(0)),
            "points": points.tolist(), "payload": measured["payload"]}


def fit_lookup_costs(rows: int = 20_000, repeats: int = 60) -> dict[str, float]:
    """Times EmbeddingBag lookups over dims and counts (thread CPU time, 10th percentile) and
    fits ``time = lookups * (lookup_ns + row_bytes / bandwidth) + fixed`` by non-negative least
    squares."""
    import time

    import torch
    from scipy.optimize import nnls

    torch.set_num_threads(1)
    gen = np.random.default_rng(0)
    xs, ys = [], []
    for dim in (16, 64, 128, 256):
        bag = torch.nn.EmbeddingBag(rows, dim, mode="sum")
        for count in (64, 512, 2048, 8192):
            idx = torch.from_numpy(gen.integers(0, rows, count))
            offs = torch.arange(0, count, 8)
            times = []
            with torch.no_grad():
                for _ in range(repeats):
                    t0 = time.thread_time()
                    bag(idx, offs)
                    times.append(time.thread_time() - t0)
            xs.append((count, count * dim * 4, 1.0))
            ys.append(float(np.percentile(times, 10)) * 1e9)
    (per_lookup, per_byte, fixed), _ = nnls(np.asarray(xs, float), np.asarray(ys))
    bandwidth = 1.0 / per_byte if per_byte > 0 else BANDWIDTH_GBPS.high
    return {"lookup_ns": round(float(per_lookup), 2),
            "memory_bandwidth_gbps": round(float(np.clip(bandwidth, *BANDWIDTH_GBPS_BOUNDS)), 3),
            "table_overhead_us": round(float(fixed) / 1e3, 3)}
