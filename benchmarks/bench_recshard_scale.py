"""recshard at scale: does it keep its time limit, and what does splitting cost in planning time?

Two measurements, each in one run on this machine:

1. **Deadline.** recshard with ``--time-limit`` L on large generated tasks
   (:func:`autoshard.workloads.dlrm_tables`, HBM for 30% of the bytes): wall time of the whole
   ``shard`` call against L (the ratio must stay near 1). The task's own per-table arrays
   (access curves on the grid: what every sharder and the evaluator read) are built first and
   timed apart (``arrays_s``).
2. **Splitting.** recshard with splitting (the default) and without (``split=False``) on the
   856-table pool on 128 devices (as a task with no HBM kept for TorchRec, and as the
   ``constrained-856x128`` suite's task, which keeps it) and on the DCNv2 suites: planning
   seconds (ratio split / table-wise, same run) and step cost.

Writes ``<out>/scale.csv`` and ``<out>/scale.md``.

    .venv/bin/python benchmarks/bench_recshard_scale.py
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from autoshard.compare.suites import get_suite
from autoshard.fileio import atomic_write_text, csv_text
from autoshard.machine import describe_machine
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders.recshard import RecShard
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, default_pools, dlrm_tables

COLUMNS = ("measure", "task", "tables", "devices", "split", "time_limit_s", "arrays_s", "plan_s",
           "plan_s_over_limit", "step_cost_ms", "cost_over_bound", "split_tables", "status")


def run(task: ShardingTask, name: str, measure: str, split: bool, limit: float
        ) -> dict[str, object]:
    model = AnalyticalCostModel()
    start = time.perf_counter()
    assert task.table_arrays.rows.size == task.num_tables  # built once per task, for any sharder
    arrays = time.perf_counter() - start
    sharder = RecShard(time_limit=limit, split=split)
    start = time.perf_counter()
    result = sharder.solve(task, model).details
    seconds = time.perf_counter() - start
    plan = result.plan
    report = evaluate(plan, task, model)
    row = {"measure": measure, "task": name, "tables": task.num_tables,
           "devices": task.num_devices, "split": split, "time_limit_s": limit,
           "arrays_s": round(arrays, 2),
           "plan_s": round(seconds, 2), "plan_s_over_limit": round(seconds / limit, 2),
           "step_cost_ms": round(report.step_cost_ms, 4),
           "cost_over_bound": round(report.cost_ratio, 3),
           "split_tables": sum(p.is_split for p in plan.placements),
           "status": result.status}
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/recshard"))
    parser.add_argument("--limit", type=float, default=10.0, help="time limit of the deadline runs")
    parser.add_argument("--split-limit", type=float, default=60.0,
                        help="time limit of the split / table-wise runs")
    parser.add_argument("--sizes", default="5000x64,20000x64",
                        help="tables x devices of the deadline runs")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    rows = []
    for size in args.sizes.split(","):
        tables, devices = (int(v) for v in size.split("x"))
        task = constrained_task(dlrm_tables(tables, seed=0), devices, hbm_fraction=0.3)
        rows.append(run(task, size, "deadline", True, args.limit))
    train, test = default_pools()
    pool = constrained_task(train + test, 128, hbm_fraction=0.3)
    tasks = [("856x128", pool), *((s, get_suite(s)[0].build())
                                  for s in ("constrained-856x128", "dcnv2-8", "dcnv2-16"))]
    for name, task in tasks:
        for split in (False, True):
            rows.append(run(task, name, "split", split, args.split_limit))
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "scale.csv", csv_text(rows, COLUMNS))
    lines = [f"# recshard at scale\n\nMachine: {describe_machine()}. Command: "
             f"`python benchmarks/bench_recshard_scale.py --limit {args.limit} --split-limit "
             f"{args.split_limit} --sizes {args.sizes}`. Load average (1 min) at start and "
             f"end: {load_start:.1f}, {os.getloadavg()[0]:.1f} (other jobs share the machine).\n",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    for name, _ in tasks:
        pair = {r["split"]: r for r in rows if r["task"] == name and r["measure"] == "split"}
        ratio = float(pair[True]["plan_s"]) / max(float(pair[False]["plan_s"]), 1e-9)  # type: ignore[arg-type]
        gain = float(pair[False]["step_cost_ms"]) / float(pair[True]["step_cost_ms"])  # type: ignore[arg-type]
        lines.append(f"\n{name}: planning time with splitting / table-wise = {ratio:.2f}; "
                     f"table-wise step cost / split step cost = {gain:.2f}.")
    atomic_write_text(args.out / "scale.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
