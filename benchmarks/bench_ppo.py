"""The `ppo` sharder against every other registered sharder on held-out tables, and its speed.

Quality: capacity-constrained tasks (the cluster's HBM holds half of the tables' bytes) drawing
only test-pool tables (the policy trained on the other half), for 50/100/200 tables on 4 and 8
devices and on 16 devices (a count never seen in training, which used 2, 3, 4, 6, 8 and 12):
step cost / lower bound of every registered sharder (unavailable ones are listed with the
reason).

Speed: time for ppo to plan 856 tables on 128 devices on one core (median of three runs),
against, in the same run, the environment alone driven by a trivial policy (the first allowed
action, no network) and the size-lookup greedy sharder.

Usage: ``python benchmarks/bench_ppo.py [--repeats 2] [--time-limit 10] [--out results/ppo]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from autoshard.analytical import AnalyticalCostModel
from autoshard.fileio import atomic_write_text
from autoshard.machine import describe_machine
from autoshard.sharders import get_sharder, sharder_names
from autoshard.workloads import POOL_SIZE, constrained_task, dlrm_tables
from envs import PlacementEnv
from training.evaluation import BENCH_SEED, GREEDY, Result, compare, eval_tasks
from training.plots import comparison
from training.train import results_csv

TABLES, DEVICES = (50, 100, 200), (4, 8, 16)
UNSEEN = 16


def quality(repeats: int, time_limit: float, sharders: tuple[str, ...]) -> tuple[
        list[Result], dict[str, str]]:
    items = eval_tasks(TABLES, DEVICES, hbm_fraction=0.5, repeats=repeats, seed=BENCH_SEED)
    return compare(items, AnalyticalCostModel(), sharders,
                   {"time_limit": time_limit, "seed": 0})


def env_only(task: object, model: AnalyticalCostModel) -> float:
    """Seconds to run the environment over a task with the first allowed action each step."""
    start = time.perf_counter()
    env = PlacementEnv(cost_model=model, max_devices=task.num_devices, report=False)  # type: ignore[attr-defined]
    _, info = env.reset(options={"task": task})
    done = False
    while not done:
        _, _, done, _, info = env.step(int(np.argmax(info["action_mask"])))
    return time.perf_counter() - start


def speed() -> dict[str, float]:
    """Median seconds of three runs: ppo, the environment alone, size_lookup_greedy."""
    model = AnalyticalCostModel()
    task = constrained_task(dlrm_tables(POOL_SIZE, seed=0), 128, hbm_fraction=0.5)
    ppo, greedy = get_sharder("ppo", threads=1), get_sharder("size_lookup_greedy")
    ppo.shard(task, model)  # loads the policy, warms up
    out = {}
    for name, fn in (("ppo", lambda: ppo.shard(task, model)),
                     ("environment only (first allowed action)", lambda: env_only(task, model)),
                     ("size_lookup_greedy", lambda: greedy.shard(task, model))):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        out[name] = float(np.median(times))
    return out


def summary_table(results: list[Result]) -> list[str]:
    """Mean cost ratio per (tables, devices) group and sharder; failures counted."""
    sharders = list(dict.fromkeys(r.sharder for r in results))
    groups = sorted({(r.tables, r.devices) for r in results})
    cell: dict[tuple, list] = defaultdict(list)
    for r in results:
        cell[r.sharder, r.tables, r.devices].append(r.cost_ratio)
    lines = ["| tables | devices | " + " | ".join(sharders) + " | ppo vs best greedy |",
             "| ---: | ---: |" + " ---: |" * (len(sharders) + 1)]

    def mean(values: list) -> float:
        return float(np.mean([v if v is not None else np.inf for v in values]))

    for t, d in groups:
        row = [mean(cell[s, t, d]) for s in sharders]
        text = [f"{v:.3f}" if np.isfinite(v) else
                f"failed {sum(x is None for x in cell[s, t, d])}" for v, s in zip(
                    row, sharders, strict=True)]
        best_greedy = min(mean(cell[g, t, d]) for g in GREEDY)
        gap = mean(cell["ppo", t, d]) / best_greedy - 1.0
        unseen = " (unseen)" if d == UNSEEN else ""
        lines.append(f"| {t} | {d}{unseen} | " + " | ".join(text) + f" | {gap:+.1%} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="tasks per (tables, devices)")
    parser.add_argument("--time-limit", type=float, default=10.0,
                        help="seconds for sharders with a time limit (MILP)")
    parser.add_argument("--sharders", nargs="*", default=None, help="default: all registered")
    parser.add_argument("--out", type=Path, default=Path("results/ppo"))
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    names = tuple(args.sharders or sharder_names())
    results, skipped = quality(args.repeats, args.time_limit, names)
    seconds = speed()
    command = (f"python benchmarks/bench_ppo.py --repeats {args.repeats} --time-limit "
               f"{args.time_limit:g}" + (f" --sharders {' '.join(names)}" if args.sharders
                                         else ""))
    lines = ["# ppo on held-out tables", "",
             f"Machine: {describe_machine()}, one core. Command: `{command}`.", "",
             "Step cost / lower bound (1.000 = provably optimal), mean over "
             f"{args.repeats} task(s) per row; tasks draw only test-pool tables; the cluster's "
             "HBM holds half of the tables' bytes (8xH100-80GB links and bandwidths); "
             "16 devices were never seen in training (2, 3, 4, 6, 8, 12).", ""]
    lines += summary_table(results)
    if skipped:
        lines += ["", "Skipped (unavailable here): " + "; ".join(
            f"{k}: {v}" for k, v in skipped.items())]
    lines += ["", f"## Planning time, {POOL_SIZE} tables on 128 devices (median of 3, one core)",
              "", "| planner | seconds |", "| --- | ---: |"]
    lines += [f"| {k} | {v:.3f} |" for k, v in seconds.items()]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "eval.md", "\n".join(lines) + "\n")
    atomic_write_text(args.out / "eval.csv", results_csv(results))
    atomic_write_text(args.out / "speed.json", json.dumps(
        {"tables": POOL_SIZE, "devices": 128, "seconds": seconds, "machine": describe_machine(),
         "command": command}, indent=2) + "\n")
    comparison(results, args.out / "comparison.png",
               "held-out tasks: step cost / lower bound (16 devices unseen)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
