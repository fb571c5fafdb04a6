"""Simulator speed: 100,000 requests over 800 tables on one core, and the shared-queue solver
against a per-job heap loop.

The simulator's queues are solved together, one vectorised step per job index
(:func:`autoshard.serving.queueing.solve_queues`). The baseline serves the same jobs one at a
time in plain Python (a heap of free cores per server). Both must give the same departures.
Prints and writes ``results/serving/bench_simulator.md``.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/bench_serving.py
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import heapq  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from autoshard.fileio import atomic_write_text  # noqa: E402
from autoshard.machine import describe_machine  # noqa: E402
from autoshard.serving.cluster import load_serving_profile  # noqa: E402
from autoshard.serving.queueing import solve_queues  # noqa: E402
from autoshard.serving.registry import get_strategy  # noqa: E402
from autoshard.serving.simulate import sample_requests, simulate  # noqa: E402
from autoshard.serving.suites import suite_model  # noqa: E402
from autoshard.serving.task import ServingTask  # noqa: E402


def heap_departures(arrivals: np.ndarray, service: np.ndarray, cores: int) -> np.ndarray:
    """FCFS on ``cores`` cores sharing one queue, one job at a time (the baseline)."""
    free = [0.0] * cores
    out = np.empty(arrivals.size)
    for k in np.argsort(arrivals, kind="stable"):
        start = max(float(arrivals[k]), heapq.heappop(free))
        out[k] = start + float(service[k])
        heapq.heappush(free, out[k])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--output", default="results/serving/bench_simulator.md")
    args = parser.parse_args()
    model = suite_model("large")
    task = ServingTask(model, load_serving_profile("cpu-256gb"), qps=5_000.0, requests=1000)
    mapping = get_strategy("capacity_balanced").map(task, 10).with_replicas((1,) * 10, 1)
    t0, c0 = time.perf_counter(), time.thread_time()
    sample = sample_requests(model, args.requests, seed=(0, 1))
    lat = simulate(model, task.profile, mapping, task.qps, [sample], task.costs)[0]
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    rng = np.random.default_rng(0)
    queues = [np.cumsum(rng.exponential(1.0, args.requests // 4)) for _ in range(10)]
    service = [rng.exponential(0.8 * task.profile.cores, q.size) for q in queues]
    c1 = time.thread_time()
    _, vec = solve_queues(queues, service, task.profile.cores)
    vec_cpu = time.thread_time() - c1
    c2 = time.thread_time()
    loop = [heap_departures(a, x, task.profile.cores) for a, x in zip(queues, service,
                                                                       strict=True)]
    loop_cpu = time.thread_time() - c2
    gap = max(float(np.max(np.abs(v - b))) for v, b in zip(vec, loop, strict=True))
    lines = [
        "# Serving simulator speed", "",
        "Command: `OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python "
        "benchmarks/bench_serving.py`  ", f"Machine: {describe_machine()} (one thread)", "",
        f"- {args.requests:,} requests x {model.num_tables} tables (suite `large`, "
        f"capacity_balanced on {mapping.servers} shards, {task.qps:g} qps, 16-core shared-queue "
        f"servers): {wall:.2f} s wall, {cpu:.2f} s thread CPU, sampling included; P99 "
        f"{lat.percentile_ms(99):.3f} ms",
        f"- 10 queues of {args.requests // 4:,} jobs at 80% load on 16 cores: solved together "
        f"{vec_cpu:.2f} s CPU, one job at a time with a heap (baseline) {loop_cpu:.2f} s CPU",
        f"- both give the same departures: largest gap {gap:.1e} (time units)",
        f"- goal < 5 s on one core for the simulation: {'met' if cpu < 5 else 'NOT met'}",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    atomic_write_text(Path(args.output), text)


if __name__ == "__main__":
    main()
