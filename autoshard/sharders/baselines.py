"""Random and round-robin sharders (DreamShard's simplest baselines), capacity-aware."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from autoshard.layout.placement import PlacementState
from autoshard.limits import SEED, Range
from autoshard.pricing.cost import CostModel
from autoshard.sharders.base import Sharded, Sharder
from autoshard.task import ShardingTask


class RandomSharder(Sharder):
    """Tables in random order, each on a random device where it fits whole in HBM, else split.

    Args:
        seed: Seed of the random generator (same seed, same plan).
    """

    name: ClassVar[str] = "random"
    summary: ClassVar[str] = "random device among those where the table fits (seeded)"
    option_ranges: ClassVar[dict[str, Range]] = {"seed": SEED}

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def solve(self, task: ShardingTask, cost_model: CostModel) -> Sharded[None]:
        rng = np.random.default_rng(self.seed)
        state = PlacementState(task, cost_model)
        for t in rng.permutation(task.num_tables):
            fits = np.flatnonzero(state.full_fit(int(t)))
            if fits.size:
                state.place(int(t), int(rng.choice(fits)), int(task.tables[t].rows))
            else:
                state.place(int(t), *state.best_split(int(t)))
        return Sharded(state.to_plan(self.name), None)


class RoundRobinSharder(Sharder):
    """Table i on device i mod D; if it does not fit there, the next device where it does."""

    name: ClassVar[str] = "round_robin"
    summary: ClassVar[str] = "table i on device i mod D, next device that fits"

    def solve(self, task: ShardingTask, cost_model: CostModel) -> Sharded[None]:
        state = PlacementState(task, cost_model)
        n = task.num_devices
        for t in range(task.num_tables):
            fits = state.full_fit(t)
            order = (t + np.arange(n)) % n
            chosen = order[fits[order]]
            if chosen.size:
                state.place(t, int(chosen[0]), int(task.tables[t].rows))
            else:
                state.place(t, *state.best_split(t))
        return Sharded(state.to_plan(self.name), None)
