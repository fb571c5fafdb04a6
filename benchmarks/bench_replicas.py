"""Replicated (``data_parallel``) tables: `recshard` with and without them, under both models.

On the public 26-table models (DLRM-DCNv2 and DLRM on Criteo 1TB, :mod:`autoshard.public_models`:
a few huge tables among many small ones) on 16 devices of two nodes, with the suites' HBM (30%
of the tables' bytes) and TorchRec's room kept in HBM, in training and in inference: `recshard`
planning for our analytical model and for TorchRec's own estimator (``--cost-model torchrec``),
each with replicas offered (``replicate=True``, the default) and without. Every plan is priced
under both models, so that a gain under the model planned for is checked under the other. Per
row: the tables replicated, the step cost under each model, the bound recshard proved (its
model) and the wall seconds.

Rows are appended to ``<out>/replicas.jsonl`` as they finish; a rerun skips the rows there (an
interrupted run resumes), ``--fresh`` starts over. The Markdown table is written at the end.

Usage: ``.venv/bin/python benchmarks/bench_replicas.py [--time-limit 60]
[--out results/replicas] [--fresh]``
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from autoshard.fileio import atomic_write_text
from autoshard.machine import describe_machine
from autoshard.pricing.cost import load_cost_model
from autoshard.pricing.evaluator import evaluate
from autoshard.public_models import model_tables
from autoshard.sharders.recshard import RecShard
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task

MODELS = ("analytical", "torchrec")


def tasks() -> list[tuple[str, ShardingTask]]:
    """The benchmark's tasks, named."""
    return [(f"{model} 16 x 30% {mode}", constrained_task(
        model_tables(model), 16, 0.3, mode=mode, reservation="torchrec"))
        for model in ("dcnv2", "criteo1tb") for mode in ("train", "infer")]


def one_row(name: str, task: ShardingTask, planned_for: str, replicate: bool,
            time_limit: float) -> dict[str, object]:
    """One recshard plan and its prices under both models."""
    models = {m: load_cost_model(m) for m in MODELS}
    sharder = RecShard(time_limit=time_limit, replicate=replicate)
    start = time.perf_counter()
    result = sharder.solve(task, models[planned_for]).details
    seconds = time.perf_counter() - start
    plan = result.plan
    row: dict[str, object] = {
        "task": name, "planned_for": planned_for, "replicate": replicate,
        "replicated": [p.table for p in plan.placements if p.sharding.replicated],
        "bound_ms": result.bound_ms, "status": result.status,
        "wall_s": seconds}
    for m, model in models.items():
        row[f"{m}_ms"] = evaluate(plan, task, model).step_cost_ms
    return row


def _done(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _table(rows: list[dict[str, object]]) -> list[str]:
    """The Markdown rows: each (task, model) pair with and without replicas, and the ratio."""
    lines = ["| task | planned for | replicas | tables replicated | analytical ms | "
             "TorchRec estimate ms | ratio, model planned for | bound ms | seconds |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    by = {(r["task"], r["planned_for"], r["replicate"]): r for r in rows}
    for (task, model, rep), r in by.items():
        other = by.get((task, model, not rep))
        own = f"{model}_ms"
        ratio = (float(r[own]) / float(other[own])  # type: ignore[arg-type]
                 if rep and other else None)
        names = r["replicated"]
        assert isinstance(names, list)
        lines.append(
            f"| {task} | {model} | {'on' if rep else 'off'} | {len(names)}"
            f"{' (' + ', '.join(names) + ')' if names else ''} | {r['analytical_ms']:.3f} | "
            f"{r['torchrec_ms']:.3f} | {'' if ratio is None else f'{ratio:.4f}'} | "
            f"{r['bound_ms']:.3f} | {r['wall_s']:.1f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=Path("results/replicas"))
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "replicas.jsonl"
    if args.fresh and partial.exists():
        partial.unlink()
    rows = _done(partial)
    seen = {(r["task"], r["planned_for"], r["replicate"]) for r in rows}
    for name, task in tasks():
        for model in MODELS:
            for replicate in (True, False):
                if (name, model, replicate) in seen:
                    continue
                row = one_row(name, task, model, replicate, args.time_limit)
                if not all(math.isfinite(float(row[k]))  # type: ignore[arg-type]
                           for k in ("analytical_ms", "torchrec_ms", "bound_ms", "wall_s")):
                    raise SystemExit(f"non-finite figure in {row}")
                with partial.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                rows.append(row)
                print(name, model, "replicas" if replicate else "none",
                      f"{row[model + '_ms']:.3f} ms", len(row["replicated"]),  # type: ignore[arg-type]
                      flush=True)
    command = (".venv/bin/python benchmarks/bench_replicas.py --time-limit "
               f"{args.time_limit:g}")
    lines = [
        "# Replicated tables (data_parallel)", "",
        f"Machine: {describe_machine()}. Command: `{command}`.", "",
        "`recshard` with replicas offered (`replicate=True`, the default) and without, "
        "planning for the model named, on 16 devices of two nodes (8xH100-80GB profile, HBM "
        "for 30% of the tables' bytes, TorchRec's room kept). Each plan is priced under both "
        "models (step cost, ms). Ratio: with replicas over without, under the model planned "
        "for. Bound: recshard's, under the model planned for (a relaxation's figure, not a "
        "proof, under TorchRec's estimator).", "", *_table(rows), ""]
    atomic_write_text(args.out / "replicas.md", "\n".join(lines))
    print("wrote", args.out / "replicas.md")


if __name__ == "__main__":
    main()
