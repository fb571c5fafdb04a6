"""Measured execution of a plan on torch.distributed: each rank holds the plan's tables, pools a
batch of lookups, exchanges pooled embeddings all-to-all, runs backward and row-wise Adagrad, and
times every part. See :func:`run_plan`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from autoshard.cost import CostModel, load_cost_model
from autoshard.errors import InputError, gib
from autoshard.evaluator import evaluate
from autoshard.plan import Plan
from autoshard.runner.config import FAULT_ENV, RunConfig
from autoshard.runner.launch import RunError, launch_local
from autoshard.runner.report import MeasuredDeviceReport, MeasuredReport, RunResult, measured_report
from autoshard.shards import check_layout
from autoshard.task import ShardingTask, Workload

__all__ = ["FAULT_ENV", "MeasuredDeviceReport", "MeasuredReport", "RunConfig", "RunError",
           "RunResult", "run_plan", "torchrun_env"]

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
             cost_model: CostModel | str = "analytical", logs: Path | None = None
             ) -> RunResult | None:
    """Runs ``plan`` for real and prices it with ``cost_model`` for the same workload.

    Launches one process per device of ``task`` on this machine, or, under torchrun, runs this
    process's rank only (then only rank 0 returns a result; the others return None).

    Args:
        plan: The plan to run.
        task: Tables and hardware; its workload is replaced by the run's batch size and mode.
        config: Run settings.
        cost_model: Model for the modelled figures ('analytical', a model directory or a model).
        logs: Folder for the ranks' logs (kept if the run fails).

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
        check_memory(task)
        results = launch_local(dict(spec, pg_timeout_s=2 * config.timeout_s + 30),
                               task.num_devices, config.timeout_s, logs)
    else:
        results = _run_here(spec, task, config, launched)
        if results is None:
            return None
    return RunResult(measured_report(results, plan, task, config), modelled)


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
    from autoshard.stats.readers_dlrm import load_trace

    trace = load_trace(path)
    if trace.num_tables != task.num_tables:
        raise InputError(f"trace has {trace.num_tables} tables, the table file "
                         f"{task.num_tables} (trace table i is table file entry i)",
                         source=path, field="lengths", value=list(trace.lengths.shape))
    if batch_size > trace.batch_size:
        raise InputError(f"batch size is larger than the trace's {trace.batch_size} samples",
                         source=path, field="batch_size", value=batch_size)


def check_memory(task: ShardingTask) -> None:
    """Every rank runs here: all tables (weights and one optimizer value per row) must fit."""
    a = task.table_arrays
    need = float((a.rows * (a.row_bytes + 4)).sum())
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
