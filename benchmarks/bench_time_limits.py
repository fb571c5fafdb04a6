"""Wall seconds each sharder that takes a time limit runs with one, on tasks of the default
tables: 200 tables on 8 devices whose HBM holds 30% of their bytes, and the 856 default
tables on 8 devices (`plan -t default --devices 8`, where the torchrec sharder once ran 6.2 s
with a limit of 1 s). Per sharder and task: the limit, the seconds taken, their ratio and the
machine's load average, since a loaded machine stretches every run.

The tests check the limit on a fake clock (``tests/test_time_limits.py``); wall seconds
belong here.

Usage: ``.venv/bin/python benchmarks/bench_time_limits.py [--time-limit 2]``
"""

from __future__ import annotations

import argparse
import gc
import os
import time

from autoshard.cli.common import build_task
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.sharders import accepted_options, get_sharder, sharder_info, sharder_names
from autoshard.synth import default_tables
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task


def _tasks() -> dict[str, ShardingTask]:
    return {"200x8-constrained": constrained_task(default_tables()[:200], 8, 0.3,
                                                  reservation="torchrec"),
            "856x8-probe": build_task("default", "8xH100-80GB", devices=8)}


def main() -> None:
    """Prints one line per timed sharder and task."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=2.0, help="seconds per run")
    limit = parser.parse_args().time_limit
    model = AnalyticalCostModel()
    timed = [n for n in sharder_names() if "time_limit" in accepted_options(n)
             and not sharder_info(n).unavailable]
    print(f"{'sharder':<10} {'task':<18} {'limit s':>8} {'took s':>8} {'ratio':>6} {'load':>5}")
    for label, task in _tasks().items():
        for name in timed:
            sharder = get_sharder(name, time_limit=limit)  # imports its solver (not timed)
            gc.collect()
            start = time.perf_counter()
            sharder.shard(task, model)
            took = time.perf_counter() - start
            print(f"{name:<10} {label:<18} {limit:>8.1f} {took:>8.2f} {took / limit:>6.2f} "
                  f"{os.getloadavg()[0]:>5.1f}", flush=True)


if __name__ == "__main__":
    main()
