"""What ``serve plan`` writes: the answer's deployment, a summary, the sweep and its plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autoshard.fileio import atomic_write_text, output_folder, write_structured
from autoshard.machine import describe_machine
from autoshard.serving.evaluation import Evaluation
from autoshard.serving.planning import advantage_at_equal_servers, answer, fewest_servers
from autoshard.serving.report import (
    SWEEP_COLUMNS,
    markdown_table,
    plot_p99_vs_servers,
    write_csv,
)
from autoshard.serving.task import ServingTask


def plural(count: int, noun: str) -> str:
    """``1 server``, ``2 servers``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def deployment_words(row: dict[str, Any]) -> str:
    """A deployment's servers in words: ``14 servers (load_balanced: 4 shards, replicas
    3,3,3,3; 2 main)``, or ``1 server (main_only: no shard; 1 main)``."""
    shards = (f"{plural(int(row['servers']), 'shard')}, replicas {row['replicas']}"
              if row["servers"] else "no shard")
    return (f"{plural(int(row['total_servers']), 'server')} ({row['strategy']}: {shards}; "
            f"{row['main_replicas']} main)")


def describe(row: dict[str, Any]) -> str:
    """One deployment in words: strategy, shards and their replicas, main replicas, P99
    interval."""
    return (f"{deployment_words(row)}, P99 {row['p99_ms']:.3f} ms "
            f"[{row['p99_lo_ms']:.3f}, {row['p99_hi_ms']:.3f}]")


def verdict(task: ServingTask, rows: Sequence[dict[str, Any]], by: str = "servers") -> str:
    """The answer in one sentence: the fewest servers (or least cost) meeting the target, or
    that none does."""
    best = answer(rows, by)
    limit = task.profile.max_servers
    if best is not None:
        cost = f", cost {best['cost']:g}" if by == "cost" else ""
        edge = (" (marginal: the target lies within its P99 interval)" if best.get("marginal")
                else "")
        return f"meets P99 <= {task.p99_ms:g} ms with {describe(best)}{cost}{edge}"
    ok = [r for r in rows if not r.get("error")]
    if not ok:
        return f"no deployment within {limit} servers could be built"
    close = min(ok, key=lambda r: (not r["feasible"], r["p99_hi_ms"]))
    busiest = max(close["max_utilisation"], close["max_nic_utilisation"])
    why = "" if close["feasible"] else (f"; a server at utilisation {busiest:.2f} >= ceiling "
                                        f"{task.profile.utilisation_ceiling:g}")
    return (f"no deployment within {limit} servers meets P99 <= {task.p99_ms:g} ms; closest: "
            f"{describe(close)}{why}")


def write_plan_outputs(task: ServingTask, rows: list[dict[str, Any]],
                       found: dict[tuple[str, int], Evaluation], output: Path,
                       context: dict[str, Any], by: str = "servers") -> dict[str, Any]:
    """plan.json (the answer's deployment, when one meets the target), summary.json,
    sweep.csv/.md and p99_vs_servers.png, written together at the end."""
    best = answer(rows, by)
    plan_doc = None
    if best is not None:
        mapping = found[(best["strategy"], best["servers"])].mapping
        plan_doc = mapping.to_dict(task.model, task.precision)
    summary = {"model": task.model.name, "profile": task.profile.name, "qps": task.qps,
               "p99_target_ms": task.p99_ms, "requests": task.requests,
               "samples": task.samples, "seed": task.seed, "precision": task.precision,
               "utilisation_ceiling": task.profile.utilisation_ceiling,
               "memory_headroom": task.profile.memory_headroom,
               "memory_bound_shards": task.min_servers(),
               "fewest_servers": fewest_servers(rows), "minimise": by,
               "answer": verdict(task, rows, by),
               "answer_row": best, "advantage_at_equal_shards": advantage_at_equal_servers(rows),
               "machine": describe_machine(), **context}
    with output_folder(output):  # a failure leaves no new folder behind
        if plan_doc is not None:
            write_structured(output / "plan.json", plan_doc)
        write_structured(output / "summary.json", summary)
        write_csv(output / "sweep.csv", rows, SWEEP_COLUMNS)
        atomic_write_text(output / "sweep.md", markdown_table(rows, SWEEP_COLUMNS))
        plot_p99_vs_servers(rows, output / "p99_vs_servers.png",
                            f"{task.model.name} at {task.qps:g} qps", task.p99_ms)
    return summary
