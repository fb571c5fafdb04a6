"""Held-out evaluation: tasks of held-out tables, and sharders compared on them through the core
comparison harness (:func:`autoshard.compare.harness.run_one`). A policy is evaluated as the
``ppo-policy`` sharder plans with it (:data:`POLICY_SHARDER`): its greedy decodes, whole
tables and split, the cheapest winning; the figure is the mean step cost / lower bound over
the tasks (:func:`mean_ratio`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.compare.harness import CompareRow, FixedTask, run_one
from autoshard.envs.sampler import TaskSampler, roomy
from autoshard.pricing.cost import CostModel
from autoshard.reservation import get_reservation
from autoshard.sharders import common_options
from autoshard.sharders.ppo.candidates import GREEDY
from autoshard.task import ShardingTask

__all__ = ["BENCH_SEED", "EVAL_SEED", "GREEDY", "POLICY_SHARDER", "EvalTask",
           "best_greedy_ratio", "compare", "eval_tasks", "evaluate_policy", "mean_ratio"]

#: Seed of the held-out task draws that training evaluates on (the same for every run).
EVAL_SEED = 20_221
#: Seed of the benchmark's held-out task draws (other combinations of held-out tables).
BENCH_SEED = 31_337
#: The sharder a policy is evaluated with in training: the policy's greedy decodes alone
#: (whole tables, over the dominant tables' shards, and with the split choice), the cheapest
#: winning; no rival sharders and no search stage.
POLICY_SHARDER = "ppo-policy"


@dataclass(frozen=True)
class EvalTask:
    """A named held-out task."""

    name: str
    tables: int
    devices: int
    task: ShardingTask


def eval_tasks(tables: tuple[int, ...], devices: tuple[int, ...], hbm_fraction: float = 0.5,
               repeats: int = 1, family: str = "validation", hardware: str = "8xH100-80GB",
               seed: int = EVAL_SEED, mode: str = "train", batch_size: int = 65536,
               styles: tuple[str, ...] = ("mixed",), overheads: tuple[str, ...] = ("none",)
               ) -> list[EvalTask]:
    """Tasks drawing only tables of ``family`` (see :mod:`autoshard.envs.families`): every (tables,
    devices) pair, ``repeats`` draws, each in one of ``styles`` (in turn).

    Training selects its best policy on the ``validation`` family; the benchmark reports on
    ``test`` and on the suites' pool, which no training sees. With several ``overheads``
    (HBM reserved per table), every task is also given with each of the others where its
    reservations leave episodes room (:func:`autoshard.envs.sampler.roomy`), named
    ``<name>-<overhead>``.
    """
    sampler = TaskSampler(family=family, hardware=hardware, styles=styles)
    rng = np.random.default_rng(seed)
    out = []
    for count in tables:
        for n_dev in devices:
            for r in range(repeats):
                style = styles[r % len(styles)]
                idx = sampler._pick(rng, style, count)
                task = sampler.build(idx, n_dev, hbm_fraction, batch_size, mode)
                name = f"{style}-T{count}-D{n_dev}-r{r}"
                for overhead in overheads:
                    reserved = task.with_reservation(get_reservation(overhead))
                    if roomy(reserved):  # (always, without a reservation)
                        suffix = "" if overhead == overheads[0] else f"-{overhead}"
                        out.append(EvalTask(name + suffix, count, n_dev, reserved))
    return out


def evaluate_policy(policy_dir: str | Path, tasks: list[EvalTask], model: CostModel
                    ) -> list[CompareRow]:
    """The rows of :data:`POLICY_SHARDER` with the policy in ``policy_dir`` on every task: the
    one evaluation of a policy in training, during the run (the best so far is kept by it)
    and after (``eval.csv``), so both report the same figure for the same weights."""
    return compare(tasks, model, (POLICY_SHARDER,), {"policy": str(policy_dir)})


def mean_ratio(rows: list[CompareRow], sharder: str = POLICY_SHARDER) -> float | None:
    """The mean step cost / lower bound of ``sharder``'s rows over the tasks; None when it
    has no rows or failed on some task (no mean of the tasks it could plan stands for all)."""
    ratios = [r.cost_ratio for r in rows if r.sharder == sharder]
    if not ratios or any(r.status != "ok" for r in rows if r.sharder == sharder):
        return None
    mean = float(np.mean(ratios))
    return mean if math.isfinite(mean) else None


def best_greedy_ratio(rows: list[CompareRow]) -> float | None:
    """The mean over tasks of the best greedy sharder's step cost / lower bound; None when
    every greedy sharder failed on some task."""
    best: dict[str, float] = {}
    tasks = {r.task for r in rows}
    for r in rows:
        if r.status == "ok" and math.isfinite(r.cost_ratio):
            best[r.task] = min(best.get(r.task, math.inf), r.cost_ratio)
    if not tasks or set(best) != tasks:
        return None
    return float(np.mean(list(best.values())))


def compare(items: list[EvalTask], model: CostModel, sharders: tuple[str, ...],
            options: dict[str, Any] | None = None, suite: str = "held-out"
            ) -> list[CompareRow]:
    """Every registered sharder named on every task, as rows of the comparison harness
    (failed and skipped sharders become rows with the reason). ``options`` are common
    settings (``seed``, ``time_limit``), each given to the sharders that take it."""
    rows = []
    for item in items:
        task = FixedTask(item.name, item.task)
        for name in sharders:
            rows.append(run_one(suite, task, item.task, name, model, None,
                                common_options(name, options or {}))[0])
    return rows

