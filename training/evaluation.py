"""Held-out evaluation: tasks from the test table pool, planning with a policy, and comparing
sharders through the registry."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from autoshard.cost import CostModel
from autoshard.errors import PlannerError
from autoshard.evaluator import evaluate
from autoshard.plan import Plan
from autoshard.sharders import common_options, get_sharder, sharder_info
from autoshard.task import ShardingTask
from envs.placement import PlacementEnv
from envs.sampler import TaskSampler, default_pools
from training.policy import PlacementNet

GREEDY = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")
#: Seed of the held-out task draws that training evaluates on (the same for every run).
EVAL_SEED = 20_221
#: Seed of the benchmark's held-out task draws (other combinations of the same test tables).
BENCH_SEED = 31_337


@dataclass(frozen=True)
class EvalTask:
    """A named held-out task."""

    name: str
    tables: int
    devices: int
    task: ShardingTask


def eval_tasks(tables: tuple[int, ...], devices: tuple[int, ...], hbm_fraction: float = 0.5,
               repeats: int = 1, pool_seed: int = 0, hardware: str = "8xH100-80GB",
               seed: int = EVAL_SEED) -> list[EvalTask]:
    """Tasks drawing only test-pool tables: every (tables, devices) pair, ``repeats`` draws.

    Training selects its best policy on the draws of :data:`EVAL_SEED`; the benchmark uses
    another seed, so that its tasks are not the ones the selection saw.
    """
    test_pool = default_pools(pool_seed)[1]
    sampler = TaskSampler(pool=test_pool, tables=(1, len(test_pool)), devices=devices,
                          hardware=hardware)
    rng = np.random.default_rng(seed + pool_seed)
    out = []
    for count in tables:
        for n_dev in devices:
            for r in range(repeats):
                idx = np.sort(rng.choice(len(test_pool), size=min(count, len(test_pool)),
                                         replace=False))
                task = sampler.build(idx, n_dev, hbm_fraction)
                out.append(EvalTask(f"T{count}-D{n_dev}-r{r}", count, n_dev, task))
    return out


def plan_task(net: PlacementNet, multipliers: tuple[float, ...], task: ShardingTask,
              cost_model: CostModel, sharder_name: str = "ppo") -> Plan:
    """The policy's greedy (most likely allowed) action for every table: one call per table."""
    env = PlacementEnv(cost_model=cost_model, max_devices=task.num_devices,
                       multipliers=multipliers, report=False, sharder_name=sharder_name)
    obs, info = env.reset(options={"task": task})
    done = False
    with torch.inference_mode():
        while not done:
            logits, _ = net(torch.from_numpy(obs)[None])
            mask = torch.from_numpy(info["action_mask"])
            action = int(torch.where(mask, logits[0], -torch.inf).argmax())
            obs, _, done, _, info = env.step(action)
    return replace(info["plan"], sharder=sharder_name)


@dataclass(frozen=True)
class Result:
    """One sharder on one task: cost ratio (None if it failed) and planning time."""

    task: str
    tables: int
    devices: int
    sharder: str
    cost_ratio: float | None
    step_cost_ms: float | None
    lower_bound_ms: float
    seconds: float
    error: str = ""


def run_sharder(name: str, plan: Plan | None, item: EvalTask, model: CostModel,
                seconds: float, error: str = "") -> Result:
    from autoshard.bounds import lower_bound_ms

    if plan is None:
        return Result(item.name, item.tables, item.devices, name, None, None,
                      lower_bound_ms(item.task, model), seconds, error)
    report = evaluate(plan, item.task, model)
    return Result(item.name, item.tables, item.devices, name, report.cost_ratio,
                  report.step_cost_ms, report.lower_bound_ms, seconds)


def compare(items: list[EvalTask], model: CostModel, sharders: tuple[str, ...],
            options: dict[str, Any] | None = None) -> tuple[list[Result], dict[str, str]]:
    """Plans every task with every registered sharder named; returns the results and, for
    each sharder skipped, why it is unavailable. A sharder that fails on a task is recorded
    with its error (a failure, not skipped). ``options`` go to every sharder that takes them
    (e.g. ``time_limit``, ``seed``)."""
    results, skipped = [], {}
    for name in sharders:
        reason = sharder_info(name).unavailable
        if reason:
            skipped[name] = reason
            continue
        sharder = get_sharder(name, **common_options(name, options or {}))
        for item in items:
            start = time.perf_counter()
            try:
                plan: Plan | None = sharder.shard(item.task, model)
                error = ""
            except PlannerError as exc:
                plan, error = None, str(exc)
            seconds = time.perf_counter() - start
            results.append(run_sharder(name, plan, item, model, seconds, error))
    return results, skipped


def mean_ratio(results: list[Result], sharder: str) -> float:
    values = [r.cost_ratio for r in results if r.sharder == sharder]
    return float(np.mean([v if v is not None else np.inf for v in values]))
