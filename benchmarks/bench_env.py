"""Placement environment throughput: steps per second for 100 tables on 8 devices, one core.

Measured in one run, in thread CPU time (so other processes on the machine do not count):

- ``env.step``: the environment's step alone (random allowed actions; the agent's own time and
  the reset are not counted);
- ``episodes``: whole episodes, reset (pricing every table, device and bucket, the lower bound
  and the buckets) included, with and without the evaluator report at the end;
- baseline ``PlacementState loop``: the bare shared bookkeeping the environment wraps (the fit
  tests of all buckets, pricing the fill bucket, then ``place``) for the same actions, i.e.
  the least any environment built on it can cost per step.

Usage: ``python benchmarks/bench_env.py [--episodes N] [--out results/bench]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from autoshard.fileio import atomic_write_text
from autoshard.machine import describe_machine
from autoshard.placement import PlacementState
from envs import PlacementEnv, TaskSampler

TABLES, DEVICES = 100, 8


def run_env(env: PlacementEnv, episodes: int, seed: int) -> tuple[float, float, list]:
    """(seconds in step, seconds in all, actions taken per episode)."""
    rng = np.random.default_rng(seed)
    in_step, actions = 0.0, []
    start = time.thread_time()
    for e in range(episodes):
        env.reset(seed=seed + e)
        done, taken = False, []
        while not done:
            a = int(rng.choice(np.flatnonzero(env.action_masks())))
            t0 = time.thread_time()
            done = env.step(a)[2]
            in_step += time.thread_time() - t0
            taken.append(a)
        assert env.episode is not None
        p = env.episode.priced
        actions.append((env.task, p.order, p.rows, p.total, taken))
    return in_step, time.thread_time() - start, actions


def run_baseline(env: PlacementEnv, actions: list) -> float:
    """Seconds for the same placements through PlacementState and the cost model alone: the
    fit tests of every bucket, the pricing of the fill bucket, and ``place``."""
    k = env.buckets
    total = 0.0
    for task, order, rows, price, taken in actions:
        state = PlacementState(task, env.cost_model)
        devices = np.arange(task.num_devices)
        t0 = time.thread_time()
        for t, a in zip(order, taken, strict=True):
            d, b = divmod(a, k)
            state.fits(int(t), rows[t][:, None])
            fill = state.max_hbm_rows(int(t))
            fill_price = env.cost_model.price(task, np.full(devices.size, t), devices, fill)
            state.fits(int(t), fill)
            if b == k - 1:
                state.place(int(t), d, int(fill[d]), price=float(fill_price.total_ms[d]))
            else:
                state.place(int(t), d, int(rows[t, b]), price=float(price[t, d, b]))
        total += time.thread_time() - t0
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    sampler = TaskSampler(tables=(TABLES, TABLES), devices=(DEVICES,), hbm_fraction=(0.5, 0.5),
                          batch_sizes=(65536,), modes=("train",), styles=("mixed",))
    quiet = PlacementEnv(sampler, report=False)
    reported = PlacementEnv(sampler, report=True)
    run_env(quiet, 3, seed=1000)  # warm-up
    steps = args.episodes * TABLES
    step_s, all_s, actions = run_env(quiet, args.episodes, seed=0)
    _, all_report_s, _ = run_env(reported, args.episodes, seed=0)
    base_s = run_baseline(quiet, actions)
    rows = {
        "env.step only": steps / step_s,
        "episodes incl. reset, no report": steps / all_s,
        "episodes incl. reset and evaluator report": steps / all_report_s,
        "baseline: PlacementState loop (fits, fill price, place)": steps / base_s,
    }
    doc = {"tables": TABLES, "devices": DEVICES, "episodes": args.episodes,
           "buckets": quiet.buckets, "steps_per_second": rows,
           "step_over_baseline_time": step_s / base_s, "machine": describe_machine(),
           "command": "python benchmarks/bench_env.py"
                      + (f" --episodes {args.episodes}" if args.episodes != 60 else "")}
    lines = [f"# Placement environment throughput ({TABLES} tables, {DEVICES} devices)", "",
             f"Machine: {doc['machine']}, pinned to one core, thread CPU time. Command: "
             f"`{doc['command']}`.", "",
             f"{args.episodes} episodes of {TABLES} steps, random allowed actions, "
             f"{quiet.buckets} buckets x {DEVICES} devices = {quiet.buckets * DEVICES} actions.",
             "", "| measure | steps/s |", "| --- | ---: |"]
    lines += [f"| {k} | {v:,.0f} |" for k, v in rows.items()]
    lines += ["", f"One env step costs {step_s / base_s:.2f}x the bare PlacementState loop "
              "(the rest is building the observation and the mask's copy)."]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "env.md", "\n".join(lines) + "\n")
    atomic_write_text(args.out / "env.json", json.dumps(doc, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
