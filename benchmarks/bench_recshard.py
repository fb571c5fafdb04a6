"""RecShard's MILP against the greedy family and TorchRec's planner on capacity-constrained tasks.

For each generated task (50 tables on 4 devices, 100 on 8, 200 on 8; HBM holding 30% of the
tables' bytes) every sharder plans, the analytical cost model prices the plan, and the table
prints step cost / lower bound, load balance (max / mean device cost), share of lookups served
from UVM and time to plan; then recshard's ratios against each other sharder. Last, the scale
runs: 856 tables on 128 devices and on 32, recshard against two greedy sharders (time, gap).
All rows go to results/recshard/benchmark.csv as they finish (a rerun skips rows already there;
--fresh starts over) and a summary to results/recshard/benchmark.md.

    .venv/bin/python benchmarks/bench_recshard.py [--time-limit 60] [--fresh]
"""

from __future__ import annotations

import argparse
import csv
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autoshard.errors import PlannerError
from autoshard.fileio import atomic_write_text
from autoshard.machine import cpu_model
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders import common_options, get_sharder, sharder_info
from autoshard.sharders.recshard_tables import RecShardResult
from autoshard.task import ShardingTask
from autoshard.torchrec import torchrec_unavailable
from autoshard.workloads import constrained_task, dlrm_tables

TASKS = (("50x4", 50, 4, 1), ("100x8", 100, 8, 2), ("200x8", 200, 8, 3))
SCALES = (("856x128", 856, 128, 0), ("856x32", 856, 32, 0))
SCALE_SHARDERS = ("lookup_greedy", "size_lookup_greedy", "recshard")
BASELINES = ("size_greedy", "lookup_greedy", "size_lookup_greedy", "torchrec")
COLUMNS = ("task", "tables", "devices", "sharder", "status", "step_cost_ms", "lower_bound_ms",
           "cost_ratio", "load_balance", "uvm_lookup_share", "plan_seconds", "gap", "method")
OUT = Path(__file__).resolve().parents[1] / "results" / "recshard"
HBM_FRACTION = 0.3


def machine() -> str:
    import os

    model = cpu_model()
    return f"{model}, {os.cpu_count()} cores, {platform.machine()}, no GPU used"


def build(spec: tuple[str, int, int, int]) -> ShardingTask:
    _, count, devices, seed = spec
    return constrained_task(dlrm_tables(count, seed=seed), devices, hbm_fraction=HBM_FRACTION)


def run_one(name: str, spec: tuple[str, int, int, int], task: ShardingTask, bound: float | None,
            time_limit: float) -> dict[str, Any]:
    model = AnalyticalCostModel()
    row: dict[str, Any] = {"task": spec[0], "tables": spec[1], "devices": spec[2],
                           "sharder": name}
    reason = sharder_info(name).unavailable
    if reason:
        return dict(row, status=f"unavailable: {reason}")
    sharder = get_sharder(name, **common_options(name, {"time_limit": time_limit}))
    if name == "torchrec":
        torchrec_unavailable(load=True)  # imports torch and torchrec outside the timed plan
    start = time.perf_counter()
    try:
        sharded = sharder.solve(task, model)
    except PlannerError as exc:
        return dict(row, status=f"failed: {exc}", plan_seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    result = sharded.details if isinstance(sharded.details, RecShardResult) else None
    report = evaluate(sharded.plan, task, model,
                      bound_ms=bound if sharded.bound_ms is None else sharded.bound_ms)
    row.update(status="ok", step_cost_ms=report.step_cost_ms,
               lower_bound_ms=report.lower_bound_ms, cost_ratio=report.cost_ratio,
               load_balance=report.load_balance, uvm_lookup_share=report.uvm_lookup_share,
               plan_seconds=seconds)
    if result is not None:
        row.update(gap=result.gap, method=result.method)
    return row


def load_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with path.open() as fh:
        return list(csv.DictReader(fh))


def save_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    from io import StringIO

    buf = StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: _fmt(r.get(k)) for k in COLUMNS})
    atomic_write_text(path, buf.getvalue())


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else ("" if v is None else v)


def _num(r: dict[str, Any], key: str) -> float:
    return float(r[key])


def ratios(rows: list[dict[str, Any]]) -> list[str]:
    """recshard against every other sharder on each task: throughput (inverse step cost),
    load balance, UVM lookups (each other / recshard: > 1 means recshard is better)."""
    lines = ["| task | recshard vs | throughput x | load balance x | UVM lookups x |",
             "| --- | --- | --- | --- | --- |"]
    for spec in TASKS:
        by = {r["sharder"]: r for r in rows if r["task"] == spec[0] and r["status"] == "ok"}
        rec = by.get("recshard")
        if rec is None:
            continue
        for name in BASELINES:
            other = by.get(name)
            if other is None:
                lines.append(f"| {spec[0]} | {name} | (no plan) | | |")
                continue
            uvm = _num(rec, "uvm_lookup_share")
            uvm_ratio = _num(other, "uvm_lookup_share") / uvm if uvm > 0 else float("inf")
            lines.append(f"| {spec[0]} | {name} | "
                         f"{_num(other, 'step_cost_ms') / _num(rec, 'step_cost_ms'):.2f} | "
                         f"{_num(other, 'load_balance') / _num(rec, 'load_balance'):.2f} | "
                         f"{uvm_ratio:.2f} |")
    return lines


def report(rows: list[dict[str, Any]], command: str) -> str:
    head = ["# RecShard MILP vs greedy sharders and TorchRec's planner", "",
            f"Command: `{command}`", "",
            f"Machine: {machine()}. Written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
            "", f"Tasks: generated DLRM-like tables (autoshard.workloads.dlrm_tables), "
            f"8xH100-80GB profile with HBM per device set so that all devices together hold "
            f"{HBM_FRACTION:.0%} of the tables' bytes (train mode, batch 65536); analytical "
            "cost model. Lower bound: the larger of autoshard.pricing.bounds.lower_bound_ms and "
            "the bound recshard proved on that task.", "",
            "| task | sharder | step ms | cost / bound | load balance | UVM lookups | plan s |"
            " gap |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["status"] != "ok":
            head.append(f"| {r['task']} | {r['sharder']} | {r['status'][:80]} | | | | | |")
            continue
        gap = f"{_num(r, 'gap'):.2%}" if r.get("gap") not in (None, "") else ""
        head.append(f"| {r['task']} | {r['sharder']} | {_num(r, 'step_cost_ms'):.3f} | "
                    f"{_num(r, 'cost_ratio'):.4f} | {_num(r, 'load_balance'):.3f} | "
                    f"{_num(r, 'uvm_lookup_share'):.2%} | {_num(r, 'plan_seconds'):.2f} | "
                    f"{gap} |")
    tail = ["", "recshard's advantage (other / recshard):", "", *ratios(rows)]
    return "\n".join([*head, *tail]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0, help="recshard's seconds")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--fresh", action="store_true", help="ignore rows already written")
    parser.add_argument("--skip-scale", action="store_true", help="skip the 856-table runs")
    args = parser.parse_args()
    csv_path = args.out / "benchmark.csv"
    rows = [] if args.fresh else load_rows(csv_path)
    done = {(r["task"], r["sharder"]) for r in rows}
    plan: list[tuple[tuple[str, int, int, int], str]] = [
        (spec, name) for spec in TASKS for name in ("recshard", *BASELINES)]
    if not args.skip_scale:
        plan += [(spec, name) for spec in SCALES for name in SCALE_SHARDERS]
    tasks: dict[str, ShardingTask] = {}
    for spec, name in plan:
        if (spec[0], name) in done:
            continue
        task = tasks.setdefault(spec[0], build(spec))
        rec = next((r for r in rows if r["task"] == spec[0] and r["sharder"] == "recshard"
                    and r["status"] == "ok"), None)
        bound = _num(rec, "lower_bound_ms") if rec else None
        row = run_one(name, spec, task, bound, args.time_limit)
        rows.append(row)
        print(" ".join(f"{k}={_fmt(row.get(k))}" for k in COLUMNS if row.get(k) is not None),
              flush=True)
        save_rows(csv_path, rows)
    command = "python benchmarks/bench_recshard.py --time-limit " + f"{args.time_limit:g}"
    atomic_write_text(args.out / "benchmark.md", report(rows, command))
    print(report(rows, command))


if __name__ == "__main__":
    main()
