"""Simulator speed: 100,000 requests over 800 tables on one core, against a per-request loop.

The baseline simulates the same requests one at a time in plain Python (per request: sum its
touched tables per server, then each server's FIFO cores in arrival order); it runs on a
subset and is scaled per request. Both must give the same latencies on that subset. Prints
and writes ``results/serving/bench_simulator.md``.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/bench_serving.py
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from autoshard.fileio import atomic_write_text  # noqa: E402
from autoshard.machine import describe_machine  # noqa: E402
from autoshard.serving.profile import load_serving_profile  # noqa: E402
from autoshard.serving.registry import get_strategy  # noqa: E402
from autoshard.serving.simulate import (  # noqa: E402
    RequestSample,
    sample_requests,
    simulate,
)
from autoshard.serving.suites import suite_model  # noqa: E402
from autoshard.serving.task import ServingTask  # noqa: E402


def loop_simulate(task: ServingTask, assign: np.ndarray, servers: int, qps: float,
                  sample: RequestSample) -> np.ndarray:
    """The same model, one request at a time (the baseline)."""
    prof, costs = task.profile, task.costs
    n = sample.requests
    cols = servers + 1
    rng = np.random.default_rng([sample.seed, cols])
    tail = np.exp(prof.tail_sigma * rng.standard_normal((n, cols)) - prof.tail_sigma**2 / 2)
    arrivals = np.cumsum(sample.gaps) * (1e6 / qps)
    dense = prof.dense_us_per_item * task.model.items
    free = [[0.0] * prof.cores for _ in range(cols)]
    calls_seen = [0] * cols
    out = np.zeros(n)
    for r in range(n):
        work = [0.0] * cols
        wire = [0.0] * cols
        called = [False] * cols
        for t in np.flatnonzero(sample.touched[r]):
            s = int(assign[t]) + 1
            work[s] += float(np.float32(costs.work_us[t]))
            wire[s] += float(np.float32(costs.transfer_us[t]))
            called[s] = True
        slowest = 0.0
        main = 0.0
        issue = prof.main_call_us * sum(called[1:]) * tail[r, 0]
        for s in range(cols):
            if s and not called[s]:
                continue
            if s == 0:
                service = work[0] * tail[r, 0] + dense + issue
            else:
                service = (work[s] + wire[s] + prof.call_overhead_us) * tail[r, s]
            core = calls_seen[s] % prof.cores
            calls_seen[s] += 1
            done = max(arrivals[r], free[s][core]) + service
            free[s][core] = done
            if s == 0:
                main = done - arrivals[r]
            else:
                slowest = max(slowest, done - arrivals[r] + prof.network_latency_us * tail[r, s])
        out[r] = max(main, issue + slowest + dense if any(called[1:]) else 0.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--subset", type=int, default=2_000)
    parser.add_argument("--output", default="results/serving/bench_simulator.md")
    args = parser.parse_args()
    model = suite_model("large")
    task = ServingTask(model, load_serving_profile("cpu-256gb"), qps=5_000.0, requests=1000)
    mapping = get_strategy("capacity_balanced").map(task, 10)
    costs = task.costs
    t0, c0 = time.perf_counter(), time.thread_time()
    sample = sample_requests(model, args.requests, seed=0)
    lat = simulate(model, task.profile, mapping, task.qps, sample, costs)
    p99 = lat.percentile_ms(99)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    sub = RequestSample(sample.touched[: args.subset], sample.gaps[: args.subset], 0)
    c1 = time.thread_time()
    base = loop_simulate(task, mapping.array, mapping.servers, task.qps, sub)
    base_cpu = (time.thread_time() - c1) * args.requests / args.subset
    check = simulate(model, task.profile, mapping, task.qps, sub, costs).end_to_end_us
    gap = float(np.max(np.abs(check - base) / np.maximum(base, 1e-9)))
    lines = [
        "# Serving simulator speed", "",
        "Command: `OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/bench_serving.py`",
        f"Machine: {describe_machine()} (one thread)", "",
        f"- {args.requests:,} requests x {model.num_tables} tables (suite `large`, "
        f"capacity_balanced on {mapping.servers} sparse servers, {task.qps:g} qps): "
        f"{wall:.2f} s wall, {cpu:.2f} s thread CPU, sampling included; P99 {p99:.3f} ms",
        f"- per-request Python loop (baseline), {args.subset:,} requests scaled to "
        f"{args.requests:,}: {base_cpu:.1f} s thread CPU",
        f"- vectorised / loop: {base_cpu / cpu:.0f}x less CPU time",
        f"- both give the same latencies on the subset: largest relative gap {gap:.1e}",
        f"- goal < 5 s on one core: {'met' if cpu < 5 else 'NOT met'}",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    atomic_write_text(Path(args.output), text)


if __name__ == "__main__":
    main()
