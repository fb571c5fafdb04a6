"""When `recshard` stops: at its MIP gap or its stall rule, against running to its time limit.

On the public 26-table models (DLRM-DCNv2 and DLRM on Criteo 1TB, :mod:`autoshard.public_models`)
on 8 and 16 devices, each with the CLI's hardware (8xH100-80GB profile, 80 GB HBM per device)
and with the suites' (HBM for 30% of the tables' bytes), both keeping TorchRec's room in HBM:
`recshard` as registered (it stops once its MILP is optimal within its gap or no longer
improves, ``stall`` 0.5%) against the same sharder with ``stall=0`` (the MILP runs to its gap or
its time limit, as before the stall rule), both with ``--time-limit``. Per task: wall seconds,
step cost, the ratio of the two costs, how the solve stopped, its proven bound and gap, and when
the final plan was found.

Usage: ``.venv/bin/python benchmarks/bench_recshard_stop.py [--time-limit 60]
[--out results/recshard]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from autoshard.fileio import atomic_write_text
from autoshard.hardware import load_hardware
from autoshard.machine import describe_machine
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.public_models import model_tables
from autoshard.reservation import get_reservation
from autoshard.sharders.recshard import RecShard
from autoshard.task import ShardingTask, Workload
from autoshard.workloads import constrained_task

MODEL = AnalyticalCostModel()


def tasks() -> list[tuple[str, ShardingTask]]:
    """The benchmark's tasks, named."""
    out = []
    for model in ("dcnv2", "criteo1tb"):
        tables = model_tables(model)
        for devices in (8, 16):
            out.append((f"{model} {devices} x 80 GB", ShardingTask(
                tuple(tables), load_hardware("8xH100-80GB", devices=devices), Workload(),
                get_reservation("torchrec"))))
            out.append((f"{model} {devices} x 30%", constrained_task(
                tables, devices, 0.3, reservation="torchrec")))
    return out


def solve(task: ShardingTask, **options: float) -> dict[str, object]:
    """One recshard solve: wall seconds and its report."""
    sharder = RecShard(**options)
    start = time.perf_counter()
    result = sharder.solve(task, MODEL).details
    seconds = time.perf_counter() - start
    return dict(result.report(), wall_s=seconds, step_cost_ms=result.step_cost_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=Path("results/recshard"))
    args = parser.parse_args()
    rows = []
    for name, task in tasks():
        stops = solve(task, time_limit=args.time_limit)
        runs = solve(task, time_limit=args.time_limit, stall=0.0)
        rows.append({"task": name, "stopping": stops, "to_the_limit": runs})
        print(name, f"{stops['wall_s']:.1f} s vs {runs['wall_s']:.1f} s, cost ratio "
              f"{stops['step_cost_ms'] / runs['step_cost_ms']:.4f}", flush=True)
    command = (".venv/bin/python benchmarks/bench_recshard_stop.py --time-limit "
               f"{args.time_limit:g}")
    lines = [
        "# When recshard stops", "", f"Machine: {describe_machine()}. Command: `{command}`.", "",
        "`recshard` as registered (stops at its MIP gap or when its MILP no longer improves: "
        "`stall` 0.5%) against `stall=0` (its MILP runs to the gap or the time limit), "
        "TorchRec's room kept in HBM. Cost ratio: the first's step cost over the second's.", "",
        "| task | seconds | seconds, stall=0 | cost ratio | stopped | gap | plan found after (s) |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for row in rows:
        a, b = row["stopping"], row["to_the_limit"]
        lines.append(f"| {row['task']} | {a['wall_s']:.1f} | {b['wall_s']:.1f} | "
                     f"{a['step_cost_ms'] / b['step_cost_ms']:.4f} | {a['status']} | "
                     f"{100 * a['gap']:.1f}% | {a['found_s']:.2f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "stop.md", "\n".join(lines) + "\n")
    atomic_write_text(args.out / "stop.json", json.dumps(
        {"machine": describe_machine(), "command": command, "rows": rows}, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
