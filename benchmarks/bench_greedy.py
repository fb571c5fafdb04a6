"""How long the baseline sharders take on a large task: 856 DLRM-like tables on 128 devices.

Times each greedy sharder, random and round-robin (median of ``--repeats`` interleaved runs
after one warm-up) on two tasks built from :func:`autoshard.workloads.dlrm_tables`: a
capacity-constrained one (the devices' HBM holds 30% of the tables' bytes, so rows must be split
into host memory) and a capacity-rich one (HBM holds 4x the bytes). Speed is reported as a
ratio to round-robin, measured in the same run. Writes ``<out>/greedy_<T>x<D>.csv`` and ``.md``.

    .venv/bin/python benchmarks/bench_greedy.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from autoshard.fileio import atomic_write_text, csv_text
from autoshard.machine import describe_machine
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders import get_sharder
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables

SHARDERS = ("round_robin", "random", "size_greedy", "dim_greedy", "lookup_greedy",
            "size_lookup_greedy")
TASKS = {"constrained (HBM 0.3x bytes)": 0.3, "capacity-rich (HBM 4x bytes)": 4.0}
COLUMNS = ("task", "sharder", "median_s", "min_s", "time_vs_round_robin", "step_cost_ms",
           "cost_over_bound", "load_balance", "uvm_lookup_share", "split_tables")


def plan_quality(name: str, task: ShardingTask) -> dict[str, float]:
    """The plan's cost report under the analytical model (also the warm-up run)."""
    model = AnalyticalCostModel()
    plan = get_sharder(name).shard(task, model)
    report = evaluate(plan, task, model)
    _, hbm = plan.arrays(task)
    split = int(np.count_nonzero(hbm < task.table_arrays.rows))
    return {"step_cost_ms": report.step_cost_ms, "cost_over_bound": report.cost_ratio,
            "load_balance": report.load_balance, "uvm_lookup_share": report.uvm_lookup_share,
            "split_tables": split}


def time_sharders(task: ShardingTask, repeats: int) -> dict[str, list[float]]:
    """Wall-clock seconds of ``repeats`` runs of each sharder, interleaved (one run of each per
    round) so that load from other processes falls on all sharders alike."""
    model = AnalyticalCostModel()
    sharders = {name: get_sharder(name) for name in SHARDERS}
    seconds: dict[str, list[float]] = {name: [] for name in SHARDERS}
    for _ in range(repeats):
        for name, sharder in sharders.items():
            start = time.perf_counter()
            sharder.shard(task, model)
            seconds[name].append(time.perf_counter() - start)
    return seconds


def run(tables: int, devices: int, repeats: int) -> list[dict]:
    pool = dlrm_tables(tables, seed=0)
    rows = []
    for label, fraction in TASKS.items():
        task = constrained_task(pool, devices, hbm_fraction=fraction)
        quality = {name: plan_quality(name, task) for name in SHARDERS}
        seconds = time_sharders(task, repeats)
        baseline = statistics.median(seconds["round_robin"])
        for name in SHARDERS:
            median = statistics.median(seconds[name])
            rows.append({"task": label, "sharder": name, "median_s": median,
                         "min_s": min(seconds[name]), "time_vs_round_robin": median / baseline,
                         **quality[name]})
    return rows


def to_markdown(rows: list[dict], title: str, command: str, machine: str,
                repeats: int) -> str:
    lines = [f"# {title}", "", f"Command: `{command}`", "", f"Machine: {machine}", "",
             f"Median of {repeats} interleaved runs after one warm-up; time relative to "
             "round_robin in the same run. Plan quality under the analytical cost model.", "",
             "| task | sharder | median s | vs round_robin | step ms | cost / bound | "
             "balance | UVM lookups | split tables |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['sharder']} | {r['median_s']:.3f} | "
                     f"{r['time_vs_round_robin']:.2f}x | {r['step_cost_ms']:.2f} | "
                     f"{r['cost_over_bound']:.3f} | {r['load_balance']:.3f} | "
                     f"{r['uvm_lookup_share']:.1%} | {r['split_tables']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=856)
    parser.add_argument("--devices", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args(argv)
    command = " ".join(["python", "benchmarks/bench_greedy.py", *(argv or sys.argv[1:])])
    machine = describe_machine()
    rows = run(args.tables, args.devices, args.repeats)
    stem = args.out / f"greedy_{args.tables}x{args.devices}"
    atomic_write_text(stem.with_suffix(".csv"), csv_text(rows, COLUMNS))
    title = (f"Baseline sharders: planning time for {args.tables} tables on {args.devices} "
             "devices")
    markdown = to_markdown(rows, title, command, machine, args.repeats)
    atomic_write_text(stem.with_suffix(".md"), markdown)
    print(markdown)
    print(f"wrote {stem}.csv and {stem}.md")


if __name__ == "__main__":
    main()
