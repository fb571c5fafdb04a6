"""Measured serving on this machine (``serve bench``), beside the simulator on the same requests.

Two modes, over the same request stream (:mod:`autoshard.serving.schedule`: the simulator's
own sampler and seed, its dealing of calls to replicas):

- ``replay`` (the default): every server of a deployment is measured alone, one at a time,
  on its own call schedule, and each request is composed from what its servers took
  (:mod:`autoshard.serving.replay`). The simulator is run with each server on its own machine
  (``host_cores`` 0), as the deployment modelled has them.
- ``concurrent``: one process per shard replica and one main process, all at once on this
  host over ``torch.distributed.rpc`` (TensorPipe); the simulator charges the sharing of the
  host's cores (the profile's ``host_cores``). The main tier is one process whatever
  ``main_replicas`` says.

Tables are real ``EmbeddingBag`` s with their rows capped (``max_rows``). Each point is run in
``rounds`` interleaved rounds (every deployment and rate in turn, then again); the simulator
takes as many draws of its service times on the same requests. Each percentile is reported as
the median over rounds with the range over rounds as its interval (the range of ``R`` rounds
holds their median with probability ``1 - 2^(1-R)``). A process that dies, or makes no progress
for ``timeout_s``, ends the run with an error naming it; every process is stopped first.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError
from autoshard.limits import one_of
from autoshard.runner.launch import RunError, launch_local
from autoshard.serving.mapping import Mapping
from autoshard.serving.replay import RoundTimes
from autoshard.serving.schedule import RequestStream, Routing, held_rows, request_stream, route
from autoshard.serving.simulate import Latencies, RequestSample, sample_requests, simulate
from autoshard.serving.task import ServingTask

#: How a deployment is measured (see the module).
MODES = ("replay", "concurrent")


@dataclass(frozen=True)
class BenchConfig:
    """A measured run.

    Args:
        qps: Request rates.
        requests: Requests per rate and round, warm-up included.
        rounds: Interleaved rounds over every deployment and rate (and the simulator's draws).
        warmup: Requests dropped at the start of each rate's round.
        max_rows: Rows per table held for real (larger tables are capped).
        timeout_s: Longest time a process may go without progress.
        seed: Seed of the request stream (the simulator's judging stream 1 of it).
        mode: ``replay`` or ``concurrent`` (:data:`MODES`).
        network_us: Network a replayed call's round trip is given beyond this host's
            loopback, microseconds (0: the loopback is the network).
        pin: Keep the replayed server and its load generator each on a core of its own
            (on a quiet host the scheduler keeps them apart anyway; on a host busy with other
            work a pinned process cannot move off a busy core, and the load generator falls
            behind its schedule: ``late_p99_us`` says by how much).
    """

    qps: tuple[float, ...]
    requests: int = 300
    rounds: int = 3
    warmup: int = 0
    max_rows: int = 20_000
    timeout_s: float = 30.0
    seed: int = 0
    mode: str = "replay"
    network_us: float = 0.0
    pin: bool = False

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
        one_of(self.mode, MODES, "mode")
        if not (np.isfinite(self.network_us) and self.network_us >= 0):
            raise InputError("must be >= 0", field="network_us", value=self.network_us)


def pinned_cores(pin: bool) -> list[int] | None:
    """Cores for rank 0 (the caller) and rank 1 (the server): two of this process's, the
    server on the first; None when not pinning or fewer than two are allowed."""
    allowed = sorted(os.sched_getaffinity(0))
    return [allowed[1], allowed[0]] if pin and len(allowed) >= 2 else None


def process_name(rank: int) -> str:
    return "main server" if rank == 0 else f"sparse server {rank - 1}"


#: The processes of a replayed measurement, by rank.
REPLAY_NAMES = ("load generator", "server under test")


def launch(spec: dict[str, Any], world: int, timeout_s: float, logs: Path | None = None,
           worker: str = "autoshard.serving.bench_worker",
           names: Sequence[str] | None = None) -> Any:
    """Runs ``world`` processes and returns rank 0's result.

    Raises:
        RunError: A process died or stalled, named (``names`` by rank; by default rank 0 the
            main server, the others sparse servers); every process has been stopped.
    """
    try:
        return launch_local(spec, world, timeout_s, logs, worker=worker)
    except RunError as exc:
        names = names or [process_name(r) for r in range(world)]
        raise RunError(_named(str(exc), names)) from exc


def _named(message: str, names: Sequence[str]) -> str:
    """The launcher's message with ranks named."""
    for rank in reversed(range(len(names))):
        message = message.replace(f"rank {rank} ", f"{names[rank]} (rank {rank}) ")
    return message


def distinct(mappings: Sequence[Mapping]) -> tuple[list[Mapping], list[int]]:
    """(the distinct deployments, the index of each mapping's among them): strategies that
    give the same deployment are measured once."""
    keys: dict[tuple[Any, ...], int] = {}
    index = []
    for m in mappings:
        key = (m.assign, m.parts, tuple(m.replica_counts), m.main_replicas)
        index.append(keys.setdefault(key, len(keys)))
    firsts = {i: m for m, i in zip(mappings, index, strict=True)}
    return [firsts[i] for i in range(len(keys))], index


@dataclass(frozen=True)
class Trace:
    """A deployment's stream and routing, and where they are written for the processes."""

    stream: RequestStream
    routing: Routing
    stream_file: Path
    routing_file: Path


def traces(task: ServingTask, deployments: Sequence[Mapping], sample: RequestSample,
           config: BenchConfig, folder: Path) -> list[Trace]:
    """Each deployment's request stream (one per set of parts) and routing, written."""
    streams: dict[Any, tuple[RequestStream, Path]] = {}
    out = []
    for d, m in enumerate(deployments):
        parts = m.part_set(task.model.num_tables)
        if parts not in streams:
            path = folder / f"stream{len(streams)}.npz"
            streams[parts] = (request_stream(task, parts, sample, config.max_rows,
                                             config.seed), path)
            streams[parts][0].save(path)
        stream, path = streams[parts]
        routing = route(stream, sample, m)
        routing.save(folder / f"routing{d}.npz")
        out.append(Trace(stream, routing, path, folder / f"routing{d}.npz"))
    return out


def measured_latencies(task: ServingTask, deployments: Sequence[Mapping], sample: RequestSample,
                       config: BenchConfig, logs: Path | None = None
                       ) -> list[dict[float, tuple[list[np.ndarray], float]]]:
    """Per deployment, per rate: (each round's latencies in us, warm-up dropped; the load
    generator's 99th-percentile lateness in us, replay only)."""
    with tempfile.TemporaryDirectory(prefix="autoshard-bench-") as tmp:
        found = traces(task, deployments, sample, config, Path(tmp))
        if config.mode == "replay":
            return _replayed(task, deployments, found, config, logs)
        return [_concurrent(task, m, t, config, logs)
                for m, t in zip(deployments, found, strict=True)]


def _replayed(task: ServingTask, deployments: Sequence[Mapping], found: list[Trace],
              config: BenchConfig, logs: Path | None
              ) -> list[dict[float, tuple[list[np.ndarray], float]]]:
    """Replays every server of every deployment (one launch of two processes) and composes."""
    files = sorted({t.stream_file for t in found})
    jobs: list[dict[str, Any]] = [{"stream": files.index(t.stream_file), "routing": d,
                                   "mapping": d, "qps": q}
                                  for d, t in enumerate(found) for q in config.qps]
    held = {}
    for m, t in zip(deployments, found, strict=True):
        parts = m.part_set(task.model.num_tables)
        held[files.index(t.stream_file)] = (held_rows(task.model, parts, config.max_rows),
                                            [task.model.tables[p].dim for p in parts.table])
    spec = {"streams": [str(f) for f in files], "routings": [str(t.routing_file) for t in found],
            "mappings": [{"assign": list(m.assign), "replicas": [int(r) for r in
                                                                 m.replica_counts],
                          "main_replicas": m.main_replicas} for m in deployments],
            "jobs": jobs, "rows": [held[k][0].tolist() for k in range(len(files))],
            "dims": [held[k][1] for k in range(len(files))], "rounds": config.rounds,
            "timeout_s": config.timeout_s, "cores": pinned_cores(config.pin)}
    result = launch(spec, 2, config.timeout_s, logs, "autoshard.serving.replay_worker",
                    REPLAY_NAMES)
    out: list[dict[float, tuple[list[np.ndarray], float]]] = [{} for _ in deployments]
    for job, rounds in zip(jobs, result["jobs"], strict=True):
        t = found[job["routing"]]
        times = [RoundTimes(**{k: np.asarray(v) for k, v in r.items()}) for r in rounds]
        lat = [rt.latencies_us(t.stream, t.routing, job["qps"],
                               config.network_us)[config.warmup:] for rt in times]
        late = np.concatenate([rt.late_us for rt in times])
        out[job["mapping"]][job["qps"]] = (lat, float(np.percentile(late, 99))
                                           if late.size else 0.0)
    return out


def _concurrent(task: ServingTask, mapping: Mapping, trace: Trace, config: BenchConfig,
                logs: Path | None) -> dict[float, tuple[list[np.ndarray], float]]:
    """Serves one deployment with every process at once."""
    parts = mapping.part_set(task.model.num_tables)
    shard_of = [-1] + [s for s, count in enumerate(mapping.replica_counts)
                       for _ in range(int(count))]
    spec = {"rows": held_rows(task.model, parts, config.max_rows).tolist(),
            "dims": [task.model.tables[p].dim for p in parts.table],
            "assign": list(mapping.assign), "shard_of": shard_of,
            "stream": str(trace.stream_file), "routing": str(trace.routing_file),
            "gaps": trace.stream.gaps.tolist(), "qps": list(config.qps),
            "rounds": config.rounds, "timeout_s": config.timeout_s}
    result = launch(spec, len(shard_of), config.timeout_s, logs)
    return {q: ([np.asarray(r)[config.warmup:] for r in result["latencies_us"][str(q)]], 0.0)
            for q in config.qps}


def simulated(task: ServingTask, mapping: Mapping, qps: float, sample: RequestSample,
              config: BenchConfig) -> list[Latencies]:
    """The simulator on the measured requests, one draw of its service times per round:
    each server on its own machine when replayed, sharing the profile's host otherwise."""
    profile = replace(task.profile, host_cores=0) if config.mode == "replay" else task.profile
    costs = task.costs_for(mapping.part_set(task.model.num_tables))
    draws = [sample.redrawn(k) for k in range(config.rounds)]
    return simulate(task.model, profile, mapping, qps, draws, costs)


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, lowest, highest) of per-round values."""
    v = np.asarray(values, float)
    return float(np.median(v)), float(v.min()), float(v.max())


def bench_row(task: ServingTask, mapping: Mapping, qps: float, config: BenchConfig,
              measured: list[np.ndarray], sims: list[Latencies], late_us: float
              ) -> dict[str, Any]:
    """One point: measured and simulated percentiles (median over rounds, with the range)."""
    row: dict[str, Any] = {"strategy": mapping.strategy, "servers": mapping.servers,
                           "replicas": ",".join(str(r) for r in mapping.replica_counts),
                           "main_replicas": mapping.main_replicas, "qps": qps,
                           "mode": config.mode, "requests": config.requests - config.warmup,
                           "rounds": config.rounds}
    for name, runs in (("measured", measured), ("simulated",
                                                [s.end_to_end_us[config.warmup:] for s in sims])):
        for q in (50, 90, 99):
            mid, lo, hi = spread([np.percentile(r, q) / 1e3 for r in runs])
            row[f"{name}_p{q}_ms"] = round(mid, 4)
            if q == 99:
                row[f"{name}_p99_lo_ms"], row[f"{name}_p99_hi_ms"] = round(lo, 4), round(hi, 4)
    busiest = max(max(s.max_utilisation, s.max_nic) for s in sims)
    row.update(p99_ratio=round(row["measured_p99_ms"] / max(row["simulated_p99_ms"], 1e-9), 3),
               calls_per_request=round(float(np.mean([s.calls.mean() for s in sims])), 3),
               max_utilisation=round(busiest, 4),
               below_ceiling=busiest < task.profile.utilisation_ceiling,
               late_p99_us=round(late_us, 1))
    return row


def run_bench(task: ServingTask, mappings: Mapping | Sequence[Mapping], config: BenchConfig,
              logs: Path | None = None) -> list[dict[str, Any]]:
    """Measures each of ``mappings`` here at each rate (see the module); one row per mapping
    and rate, measured beside simulated. Strategies giving the same deployment are measured
    once."""
    asked = [mappings] if isinstance(mappings, Mapping) else list(mappings)
    if config.mode == "concurrent":  # one main process
        asked = [m.with_replicas(tuple(int(r) for r in m.replica_counts), 1) for m in asked]
    for m in asked:
        m.check_fits(task.costs_for(m.part_set(task.model.num_tables)).bytes, task.profile)
    deployments, index = distinct(asked)
    sample = sample_requests(task.model, config.requests, (config.seed, 1))
    found = measured_latencies(task, deployments, sample, config, logs)
    rows = []
    for m, d in zip(asked, index, strict=True):
        for q in config.qps:
            lat, late = found[d][q]
            sims = simulated(task, m, q, sample, config)
            rows.append(bench_row(task, m, q, config, lat, sims, late))
    return rows
