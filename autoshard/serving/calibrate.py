"""This machine's serving constants, measured (``serve calibrate``): the CPU cost of a remote
call and of each table it carries, the network's bandwidth and latency, the main server's own
time per call and per request, the spread of service times, stalls, and the local lookup
costs. A profile takes them with :func:`autoshard.serving.cluster.with_calibration`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from autoshard.limits import BANDWIDTH_GBPS
from autoshard.serving.bench import launch, pinned_cores

#: What a fitted bandwidth may be: a profile's range (a slope of zero is unmeasurably fast).
BANDWIDTH_GBPS_BOUNDS = (BANDWIDTH_GBPS.low, BANDWIDTH_GBPS.high)


def calibrate(calls: int = 200, pause_s: float = 0.004, logs: Path | None = None,
              pin: bool = False) -> dict[str, Any]:
    """Measures this machine's serving constants for a profile, none clamped to a bound.

    Local lookups (:func:`fit_lookup_costs`) give ``lookup_ns``, ``table_overhead_us`` and
    ``memory_bandwidth_gbps``. Remote calls of 1-8 tables and 16-512 lookups per table are made
    ``pause_s`` apart, as in a request stream. The server's CPU time per call (its process CPU
    time over the block) is fitted by non-negative least squares as ``a + b * tables``:
    ``call_overhead_us = a``, ``call_table_overhead_us = b`` less the local per-table cost.
    Calls returning 4 KB to 4 MB give ``network_gbps`` (and ``nic_gbps``: one loopback link)
    from the slope of their median round trip over the bytes. The median round trip beyond the
    server's CPU time is ``network_latency_us`` (it holds the caller's own work on the call:
    serialising, and taking the reply). The median time the caller takes to issue a call
    (until ``rpc_async`` returns, when the next call of a request can begin) is
    ``main_call_us``; the caller's CPU time per call, all threads (taking the reply too,
    partly beside the caller's thread), is reported beside it. ``tail_sigma`` is the
    spread of log round trip about each configuration's median, pooled. Requests touching no
    table, replayed as a measured run does, give ``main_request_us`` (their median), the
    spread of its log (``main_tail_sigma``: how late the main server wakes to a request) and
    the stalls: a request over its median by more than 1 ms is one, ``stall_per_s`` their
    rate and ``stall_us`` their mean excess.
    ``host_cores`` is the cores this process may run on. With ``pin`` the caller and the
    server keep to a core each, as ``serve bench --pin`` runs them.
    """
    import os

    from scipy.optimize import nnls

    spec = {"rows": [20_000] * 8, "dims": [32] * 8, "assign": [0] * 8, "calls": calls,
            "pause_s": pause_s, "timeout_s": 60.0, "mode": "calibrate",
            "cores": pinned_cores(pin)}
    measured = launch(spec, 2, 600.0, logs)
    points = np.asarray(measured["points"], float)
    (a, b), _ = nnls(np.c_[np.ones(len(points)), points[:, 0]], points[:, 2])
    local = fit_lookup_costs()
    sizes, trips = (np.asarray(v, float) for v in zip(*measured["payload"], strict=True))
    (_, per_byte_us), _ = nnls(np.c_[np.ones(sizes.size), sizes], trips)
    gbps = 1e-3 / per_byte_us if per_byte_us > 0 else BANDWIDTH_GBPS.high
    idle = np.asarray(measured["idle_us"], float)
    stalls = idle[idle > np.median(idle) + 1000.0] - np.median(idle)
    wake = idle[idle <= np.median(idle) + 1000.0]
    issue, cpu = float(np.median(points[:, 4])), float(np.median(points[:, 5]))
    return {"call_overhead_us": round(float(a), 2),
            "network_latency_us": round(max(float(np.mean(points[:, 3] - points[:, 2])), 0.0),
                                        2),
            "main_call_us": round(issue, 2),
            "main_cpu_per_call_us": round(cpu, 2),
            "main_tail_sigma": round(min(float(np.sqrt(np.mean(np.log(
                wake / np.median(wake)) ** 2))), 3.0), 3),
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
