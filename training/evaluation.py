"""Held-out evaluation: tasks of held-out tables, planning with a policy's greedy decode, and
comparing sharders through the core comparison harness (:func:`autoshard.compare.run_one`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autoshard.compare import CompareRow, FixedTask, run_one
from autoshard.cost import CostModel
from autoshard.envs.sampler import TaskSampler, roomy
from autoshard.plan import Plan
from autoshard.policy.network import PlacementNet, decode, decode_choice
from autoshard.reservation import get_reservation
from autoshard.sharders import common_options
from autoshard.sharders.ppo import GREEDY
from autoshard.task import ShardingTask

__all__ = ["BENCH_SEED", "EVAL_SEED", "GREEDY", "EvalTask", "compare", "eval_tasks",
           "plan_task"]

#: Seed of the held-out task draws that training evaluates on (the same for every run).
EVAL_SEED = 20_221
#: Seed of the benchmark's held-out task draws (other combinations of held-out tables).
BENCH_SEED = 31_337


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


def plan_task(net: PlacementNet, multipliers: tuple[float, ...], task: ShardingTask,
              cost_model: CostModel, sharder_name: str = "ppo") -> Plan:
    """The policy's greedy decode (most likely allowed action for every table); a policy with
    the split choice (two option grids) also chooses which dominant tables to split."""
    if net.grids == 1:
        return decode(net, multipliers, task, cost_model)[0].plan(sharder_name)
    from autoshard.splitting import split_heavy_tables

    geometry = split_heavy_tables(task, cost_model).geometry
    return decode_choice(net, multipliers, task, cost_model, geometry)[0].plan(sharder_name)


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

