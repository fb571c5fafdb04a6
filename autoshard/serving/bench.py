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
from autoshard.runner.launch import RunError, launch_local
from autoshard.serving.mapping import Mapping
from autoshard.serving.model import INDEX_BYTES, ServingModel
from autoshard.serving.planning import percentiles
from autoshard.serving.simulate import sample_requests, simulate
from autoshard.serving.task import ServingTask


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


def bench_spec(model: ServingModel, mapping: Mapping, config: BenchConfig) -> dict[str, Any]:
    """What every process needs: tables, mapping and the sampled requests."""
    sample = sample_requests(model, config.requests, config.seed)
    bags = np.where(np.asarray(model.per_item), model.items, 1)
    return {"rows": [min(t.rows, config.max_rows) for t in model.tables],
            "dims": [t.dim for t in model.tables], "assign": list(mapping.assign),
            "lookups": [float(v) for v in model.lookups()], "bags": [int(b) for b in bags],
            "touched": [np.flatnonzero(row).tolist() for row in sample.touched],
            "gaps": sample.gaps.tolist(), "qps": list(config.qps), "seed": config.seed,
            "rounds": config.rounds, "warmup": config.warmup, "timeout_s": config.timeout_s}


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
    """Serves ``mapping`` for real at each rate; one row per rate, measured beside simulated."""
    mapping.check_fits(task.model, task.profile)
    result = launch(bench_spec(task.model, mapping, config), mapping.servers + 1,
                    config.timeout_s, logs)
    sample = sample_requests(task.model, max(config.requests, config.simulated_requests),
                             config.seed)
    rows = []
    for qps in config.qps:
        rounds = [percentiles(np.asarray(r)) for r in result["latencies_us"][str(qps)]]
        sim = simulate(task.model, task.profile, mapping, qps, sample, task.costs)
        row: dict[str, Any] = {"strategy": mapping.strategy, "servers": mapping.servers,
                               "qps": qps, "requests": config.requests - config.warmup,
                               "rounds": config.rounds}
        row.update({f"measured_{k}": round(float(np.median([r[k] for r in rounds])), 4)
                    for k in rounds[0]})
        row.update({f"simulated_{k}": v for k, v in percentiles(sim.end_to_end_us).items()})
        row["calls_per_request"] = round(float(sim.calls.mean()), 3)
        rows.append(row)
    return rows


def calibrate(calls: int = 40, pause_s: float = 0.004, logs: Path | None = None
              ) -> dict[str, Any]:
    """Measures this machine's serving constants for a profile.

    Local lookups (:func:`fit_lookup_costs`) give ``lookup_ns``, ``table_overhead_us`` and
    ``memory_bandwidth_gbps``. Remote calls of 1-8 tables and 16-512 lookups per table are made
    ``pause_s`` apart, as in a request stream. The server's CPU time per call (its process CPU
    time over the block, so load from elsewhere does not inflate it) is fitted by least
    squares as ``a + b * tables + c * lookups``: ``call_overhead_us = a``,
    ``call_table_overhead_us = b`` less the local per-table cost, and ``network_gbps`` from
    what ``c`` adds to a local lookup (an 8-byte index per lookup). The median round trip
    beyond the server's CPU time (mean over configurations) is the latency a call adds
    without occupying the server, ``network_latency_us``; the main process's own CPU time per
    call (median over configurations) is ``main_call_us``. ``tail_sigma`` is the median spread
    (standard deviation of log time) of the round trips. Requests touching no table, replayed
    as a measured run does, give the main server's own time per request, ``main_request_us``
    (their median latency); ``host_cores`` is the cores this process may run on.
    """
    import os

    spec = {"rows": [20_000] * 8, "dims": [32] * 8, "assign": [0] * 8, "calls": calls,
            "pause_s": pause_s, "timeout_s": 60.0, "mode": "calibrate"}
    measured = launch(spec, 2, 120.0, logs)
    points = np.asarray(measured["points"], float)
    design = np.c_[np.ones(len(points)), points[:, 0], points[:, 1]]
    (a, b, c), *_ = np.linalg.lstsq(design, points[:, 2], rcond=None)
    local = fit_lookup_costs()
    local_ns = local["lookup_ns"] + 32 * 4 / local["memory_bandwidth_gbps"]
    extra_ns = max(float(c) * 1e3 - local_ns, 0.1)
    return {"call_overhead_us": round(max(float(a), 1.0), 2),
            "network_latency_us": round(max(float(np.mean(points[:, 3] - points[:, 2])), 0.0),
                                        2),
            "main_call_us": round(float(np.median(points[:, 4])), 2),
            "call_table_overhead_us": round(max(float(b) - local["table_overhead_us"], 0.0), 2),
            "network_gbps": round(INDEX_BYTES / extra_ns, 4), **local,
            "tail_sigma": round(min(float(measured["log_spread"]), 3.0), 3),
            "main_request_us": round(float(np.median(measured["idle_us"])), 2),
            "host_cores": len(os.sched_getaffinity(0)),
            "points": points.tolist()}


def fit_lookup_costs(rows: int = 20_000, repeats: int = 30) -> dict[str, float]:
    """Times EmbeddingBag lookups over dims and counts (thread CPU time, 10th percentile) and
    fits ``time = lookups * (lookup_ns + row_bytes / bandwidth) + fixed``."""
    import time

    import torch

    torch.set_num_threads(1)
    gen = np.random.default_rng(0)
    xs, ys = [], []
    for dim in (16, 64, 128):
        bag = torch.nn.EmbeddingBag(rows, dim, mode="sum")
        for count in (64, 512, 2048):
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
    coef, *_ = np.linalg.lstsq(np.asarray(xs, float), np.asarray(ys), rcond=None)
    per_lookup, per_byte = max(coef[0], 1.0), max(coef[1], 1e-3)
    return {"lookup_ns": round(float(per_lookup), 2),
            "memory_bandwidth_gbps": round(1.0 / float(per_byte), 3),
            "table_overhead_us": round(max(float(coef[2]), 0.0) / 1e3, 3)}
