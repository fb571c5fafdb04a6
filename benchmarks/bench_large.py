"""Sharders at production scale, at equal time limits: step cost over the bound and planning time.

Tasks (analytical cost model, HBM for 30% of the tables' bytes, 8xH100-80GB devices):

- **856 x 128**: the ``constrained-856x128`` suite's task (the whole 856-table pool, TorchRec's
  room kept in HBM) and the same tables without the room; generated DLRM-like tables
  (:func:`autoshard.workloads.dlrm_tables`, seeds 1-3), with and without the room;
- **2,000 x 256, 5,000 x 64, 20,000 x 64**: generated tables (seed 0), no room.

Every sharder of ``--sharders`` runs on every task with each ``--limits`` time limit (seconds),
all in one process; before the first row each plans one small task, untimed and not recorded
(:func:`warm_up`), so that the first task's row does not carry the process's start-up costs.
A row: wall seconds of the ``shard`` call (the task's per-table arrays are built first, untimed,
as every sharder reads them), step cost, the reservation-aware lower bound of the evaluator and
their ratio, which candidate won (``ppo``) or how the solve ended (``recshard``), and what the
limit cut (``ppo``'s and ``torchrec``'s notes). Rows are appended to ``<out>/large.jsonl`` as
they are measured; a rerun skips the rows already there (so an interrupted run resumes), and
``<out>/large.md`` is rewritten from all of them with the comparisons the summary names.
``--rerun ppo,recshard`` drops those sharders' rows first and measures them again (after a
change to them; the header then counts the rows kept from the earlier run).

    .venv/bin/python benchmarks/bench_large.py [--limits 10,60] [--out results/large]
        [--rerun SHARDERS]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import time
from pathlib import Path

from autoshard.compare.suites import get_suite
from autoshard.errors import PlannerError
from autoshard.fileio import atomic_write_text
from autoshard.machine import describe_machine
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders import get_sharder
from autoshard.sharders.base import Sharder
from autoshard.sharders.ppo.sharder import Choice
from autoshard.sharders.recshard_tables import RecShardResult
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, default_pools, dlrm_tables

MODEL = AnalyticalCostModel()
OUT = Path("results/large")
SHARDERS = "lookup_greedy,ppo,recshard,torchrec"
#: The 856 x 128 tasks: (name, pool or generator seed, whether TorchRec's room is kept).
TASKS_856 = [("suite", "pool", True), ("pool", "pool", False),
             *((f"s{s}", s, room) for s in (1, 2, 3) for room in (True, False))]
BIG = [(2000, 256), (5000, 64), (20000, 64)]
#: The warm-up task (:func:`warm_up`): this many generated tables of this seed (no task of the
#: benchmark's), on the first task's device count.
WARM_UP_TABLES, WARM_UP_SEED = 200, 99


def build(name: str) -> ShardingTask:
    """A task of the benchmark by its row name (``856x128-<which>-<room|none>`` or
    ``<tables>x<devices>``)."""
    if name == "856x128-suite-room":
        return get_suite("constrained-856x128")[0].build()
    size, *rest = name.split("-")
    tables, devices = (int(v) for v in size.split("x"))
    if not rest:
        return constrained_task(dlrm_tables(tables, seed=0), devices, hbm_fraction=0.3)
    which, room = rest
    reservation = "torchrec" if room == "room" else "none"
    if which == "pool":
        train, test = default_pools()
        return constrained_task(train + test, devices, 0.3, reservation=reservation)
    return constrained_task(dlrm_tables(tables, seed=int(which[1:])), devices, 0.3,
                            reservation=reservation)


def task_names() -> list[str]:
    names = [f"856x128-{which}-{'room' if room else 'none'}" for which, _, room in TASKS_856]
    return names + [f"{t}x{d}" for t, d in BIG]


def limited(name: str, limit: float) -> Sharder:
    """Sharder ``name`` under the time limit ``limit`` (``lookup_greedy`` takes none)."""
    return get_sharder(name, **({} if name == "lookup_greedy" else {"time_limit": limit}))


def measure(task: ShardingTask, name: str, sharder_name: str, limit: float) -> dict[str, object]:
    sharder = limited(sharder_name, limit)
    gc.collect()
    start = time.perf_counter()
    base = {"task": name, "tables": task.num_tables, "devices": task.num_devices,
            "room": task.reservation.keeps_room, "sharder": sharder_name, "limit_s": limit}
    try:
        sharded = sharder.solve(task, MODEL)
    except PlannerError as exc:  # recorded: a sharder that finds no plan in its limit
        return {**base, "plan_s": round(time.perf_counter() - start, 3), "step_cost_ms": None,
                "bound_ms": None, "cost_over_bound": None, "how": f"no plan: {exc}",
                "notes": []}
    seconds = time.perf_counter() - start
    report = evaluate(sharded.plan, task, MODEL)
    details = sharded.details
    how = (details.winner if isinstance(details, Choice) else
           f"{details.status}; warm start {details.warm_start}"
           if isinstance(details, RecShardResult) else "")
    return {**base, "plan_s": round(seconds, 3), "step_cost_ms": round(report.step_cost_ms, 4),
            "bound_ms": round(report.lower_bound_ms, 4),
            "cost_over_bound": round(report.cost_ratio, 4), "how": how,
            "notes": list(sharded.notes)}


def warm_up(sharders: list[str], devices: int) -> None:
    """Plans one small task (:data:`WARM_UP_TABLES` generated tables on ``devices`` devices,
    TorchRec's room kept) with each sharder, untimed and not recorded, so that no timed row
    carries this process's one-off start-up costs (first calls into torch, the solver and
    numpy's allocations at that device count), which only the first task measured would
    otherwise pay."""
    task = constrained_task(dlrm_tables(WARM_UP_TABLES, seed=WARM_UP_SEED), devices, 0.3,
                            reservation="torchrec")
    for name in sharders:
        with contextlib.suppress(PlannerError):  # a warm-up without a plan still warmed up
            limited(name, 10.0).shard(task, MODEL)


def summary(rows: list[dict], limits: list[float]) -> list[str]:
    """The comparisons of the module docstring, as markdown lines."""
    by = {(r["task"], r["sharder"], r["limit_s"]): r for r in rows}
    lines = ["", "## ppo against recshard on the 856 x 128 tasks", "",
             "| limit s | task | ppo / recshard cost | ppo s / recshard s |", "|---|---|---|---|"]
    for limit in limits:
        for name in task_names()[:len(TASKS_856)]:
            p, r = by.get((name, "ppo", limit)), by.get((name, "recshard", limit))
            if p and r and p["step_cost_ms"] and r["step_cost_ms"]:
                lines.append(f"| {limit:g} | {name} | {p['step_cost_ms'] / r['step_cost_ms']:.3f}"
                             f" | {p['plan_s'] / r['plan_s']:.3f} |")
    lines += ["", "## Large tasks: cost over the bound, wall seconds over the limit", "",
              "| limit s | task | sharder | cost / bound | plan s / limit |",
              "|---|---|---|---|---|"]
    for limit in limits:
        for t, d in BIG:
            for s in ("ppo", "recshard"):
                r = by.get((f"{t}x{d}", s, limit))
                if r and r["cost_over_bound"]:
                    lines.append(f"| {limit:g} | {t}x{d} | {s} | {r['cost_over_bound']:.3f} | "
                                 f"{r['plan_s'] / limit:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--limits", default="10,60")
    parser.add_argument("--sharders", default=SHARDERS)
    parser.add_argument("--tasks", default=None, help="comma-separated task names (default: all)")
    parser.add_argument("--rerun", default="", help="comma-separated sharders whose rows in "
                        "large.jsonl are dropped and measured again (the others are kept)")
    args = parser.parse_args()
    limits = [float(v) for v in args.limits.split(",")]
    sharders = args.sharders.split(",")
    names = args.tasks.split(",") if args.tasks else task_names()
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "large.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    again = set(filter(None, args.rerun.split(",")))
    if again & {r["sharder"] for r in rows}:  # measured again: their old rows go first
        rows = [r for r in rows if r["sharder"] not in again]
        atomic_write_text(log, "".join(json.dumps(r) + "\n" for r in rows))
    done = {(r["task"], r["sharder"], r["limit_s"]) for r in rows}
    load_start = os.getloadavg()[0]
    kept = len(rows)
    todo = [s for s in sharders if any((n, s, lim) not in done for n in names for lim in limits)]
    if todo:
        warm_up(todo, build(names[0]).num_devices)
    for name in names:
        task = None
        for limit in limits:
            for s in sharders:
                if (name, s, limit) in done or (s == "lookup_greedy" and limit != limits[0]):
                    continue
                if task is None:
                    task = build(name)
                    assert task.table_arrays.rows.size == task.num_tables  # built, untimed
                row = measure(task, name, s, limit)
                print(json.dumps(row), flush=True)
                rows.append(row)
                with log.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
    columns = ("task", "sharder", "limit_s", "plan_s", "step_cost_ms", "bound_ms",
               "cost_over_bound", "how", "notes")
    lines = [f"# Sharders at production scale\n\nMachine: {describe_machine()}, "
             f"{time.strftime('%Y-%m-%d')}. Command: `python benchmarks/bench_large.py --limits "
             f"{args.limits} --sharders {args.sharders}"
             + (f" --rerun {args.rerun}" if args.rerun else "")
             + (f" --tasks {args.tasks}" if args.tasks else "")
             + (f" --out {args.out}" if args.out != OUT else "")
             + f"`. {len(rows) - kept} rows measured in "
             f"the run that wrote this file (load average, 1 min, at its start and end: "
             f"{load_start:.1f}, {os.getloadavg()[0]:.1f}), {kept} kept from an earlier run "
             "(large.jsonl). Each sharder planned one small task first, untimed (warm_up: "
             f"{WARM_UP_TABLES} generated tables, seed {WARM_UP_SEED}, TorchRec's room).\n",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    lines += summary(rows, limits)
    atomic_write_text(args.out / "large.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
