"""Measured execution of a plan on torch.distributed: each rank holds the plan's tables, pools a
batch of lookups, exchanges pooled embeddings all-to-all (replicated tables pool the rank's own
samples and all-reduce their gradients instead), runs backward and row-wise Adagrad, and times
every part. See :func:`run_plan`; :func:`check_plan` checks a plan's results against one
unsharded copy of its tables."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError, gib
from autoshard.layout.plan import Plan
from autoshard.layout.shards import check_layout
from autoshard.pricing.cost import CostModel, load_cost_model
from autoshard.pricing.evaluator import evaluate
from autoshard.runner.check import CheckResult
from autoshard.runner.config import FAULT_ENV, RunConfig
from autoshard.runner.launch import RunError, launch_local
from autoshard.runner.report import MeasuredDeviceReport, MeasuredReport, RunResult, measured_report
from autoshard.task import ShardingTask, Workload

__all__ = ["FAULT_ENV", "CheckResult", "MeasuredDeviceReport", "MeasuredReport", "RunConfig",
           "RunError", "RunResult", "check_plan", "run_plan", "torchrun_env"]

#: Share of the host's available memory a local run may allocate for tables.
MEMORY_SHARE = 0.8


def torchrun_env() -> tuple[int, int, int, int] | None:
    """(rank, world, local rank, local world) when launched by torchrun (env:// rendezvous)."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return None
    world = int(env["WORLD_SIZE"])
    return (int(env["RANK"]), world, int(env.get("LOCAL_RANK", 0)),
            int(env.get("LOCAL_WORLD_SIZE", world)))


def run_plan(plan: Plan, task: ShardingTask, config: RunConfig,
             cost_model: CostModel | str = "analytical", logs: Path | None = None,
             stages: Callable[[list[str]], None] | None = None) -> RunResult | None:
    """Runs ``plan`` for real and prices it with ``cost_model`` for the same workload.

    Launches one process per device of ``task`` on this machine, or, under torchrun, runs this
    process's rank only (then only rank 0 returns a result; the others return None).

    Args:
        plan: The plan to run.
        task: Tables and hardware; its workload is replaced by the run's batch size and mode.
        config: Run settings.
        cost_model: Model for the modelled figures ('analytical', a model directory or a model).
        logs: Folder for the ranks' logs (kept if the run fails).
        stages: Given each local rank's stage while they run (``step 3 done``), for a
            progress display (:func:`autoshard.runner.launch.launch_local`).

    Raises:
        PlannerError: Invalid plan. InputError: bad trace or tables too large for this host.
        RunError: A rank failed or made no progress for ``config.timeout_s``.
    """
    task = task.with_workload(Workload(batch_size=config.batch_size, mode=config.mode))
    check_layout(plan, task)
    model = load_cost_model(cost_model) if isinstance(cost_model, str) else cost_model
    modelled = evaluate(plan, task, model)
    if config.trace:
        check_trace(config.trace, task, config.batch_size)
    spec: dict[str, Any] = {
        "tables": [t.to_dict() for t in task.tables],
        "plan": plan.to_dict(),
        "config": config.to_dict(),
    }
    launched = torchrun_env()
    results: list[dict[str, Any]] | None
    if launched is None:
        check_memory(task, plan)
        results = launch_local(dict(spec, pg_timeout_s=2 * config.timeout_s + 30),
                               task.num_devices, config.timeout_s, logs, stages=stages)
    else:
        results = _run_here(spec, task, config, launched)
        if results is None:
            return None
    return RunResult(measured_report(results, plan, task, config), modelled)


def check_plan(plan: Plan, task: ShardingTask, config: RunConfig, logs: Path | None = None
               ) -> CheckResult:
    """Runs ``plan``'s steps (warm-up and timed ones of ``config``, untimed) on one local process
    per device, every piece starting from its slice of its table's canonical weights, and sets
    each step's pooled features and the final weights beside one unsharded copy of the tables
    run in this process on the same lookups (:mod:`autoshard.runner.check`). For small tables:
    the ranks' results travel as JSON.

    Raises:
        PlannerError: Invalid plan. InputError: bad trace or tables too large for this host.
        RunError: A rank failed or made no progress for ``config.timeout_s``.
    """
    from autoshard.runner.check import compare
    from autoshard.runner.shard import rank_tables

    task = task.with_workload(Workload(batch_size=config.batch_size, mode=config.mode))
    check_layout(plan, task)
    if config.trace:
        check_trace(config.trace, task, config.batch_size)
    check_memory(task, plan)
    spec = {"tables": [t.to_dict() for t in task.tables], "plan": plan.to_dict(),
            "config": config.to_dict(), "check": True, "pg_timeout_s": 2 * config.timeout_s + 30}
    results = launch_local(spec, task.num_devices, config.timeout_s, logs)
    dims = {t.name: (i, t.rows, t.dim) for i, t in enumerate(task.tables)}
    layout = [rank_tables(plan, dims, r) for r in range(task.num_devices)]
    return compare(results, layout, task.tables, config)


def _run_here(spec: dict[str, Any], task: ShardingTask, config: RunConfig,
              launched: tuple[int, int, int, int]) -> list[dict[str, Any]] | None:
    from autoshard.runner.worker import run_rank

    rank, world, local_rank, local_world = launched
    if world != task.num_devices:
        raise InputError(f"the plan's hardware has {task.num_devices} devices",
                         source="WORLD_SIZE", value=world)
    return run_rank(dict(spec, pg_timeout_s=config.timeout_s), rank, world, "env://",
                    lambda stage: None, local_rank, local_world)


def check_trace(path: str, task: ShardingTask, batch_size: int) -> None:
    """The trace holds one table per task table and at least one batch."""
    from autoshard.stats.readers.dlrm import load_trace

    trace = load_trace(path)
    if trace.num_tables != task.num_tables:
        raise InputError(f"trace has {trace.num_tables} tables, the table file "
                         f"{task.num_tables} (trace table i is table file entry i)",
                         source=path, field="lengths", value=list(trace.lengths.shape))
    if batch_size > trace.batch_size:
        raise InputError(f"batch size is larger than the trace's {trace.batch_size} samples",
                         source=path, field="batch_size", value=batch_size)


def check_memory(task: ShardingTask, plan: Plan) -> None:
    """Every rank runs here: all tables (weights and one optimizer value per row; a replicated
    table once per replica, with its gradient) must fit."""
    a = task.table_arrays
    copies = np.ones(task.num_tables)
    position = {t.name: i for i, t in enumerate(task.tables)}
    for p in plan.placements:
        if p.sharding.replicated:
            copies[position[p.table]] = 2 * len(p.shards)  # weights and gradient per replica
    need = float((copies * a.rows * (a.row_bytes + 4)).sum())
    available = _available_bytes()
    if available is not None and need > MEMORY_SHARE * available:
        raise InputError(f"the tables need {gib(need)} but this host has {gib(available)} "
                         "available; run a smaller table set or several hosts under torchrun",
                         field="tables", value=task.num_tables)


def _available_bytes() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None
