"""The learned sharder: a trained placement policy, decoded greedily and by sampling, with the
greedy sharders' plans as candidates; the plan with the lowest step cost wins.

Splits: on tasks of up to :data:`SMALL_TASK` (table, device) pairs, the tables that dominate are
split as ``split_lookup_greedy`` and ``recshard`` split them
(:func:`autoshard.splitting.split_heavy_tables`), and the policy also places the resulting shards
as items (each shard priced like a table through the cost model); its split decodes compete with
its whole-table ones.

The policy is read safely: a JSON config and a plain state dict of tensors
(``torch.load(weights_only=True)``), never a pickle. By default it is the policy committed
as package data under ``autoshard/data/ppo_policy``; ``policy=`` names another folder (e.g. the
``policy`` folder of an ``autoshard train`` run).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import autoshard
from autoshard.cost import CostModel
from autoshard.errors import InputError, PlannerError
from autoshard.evaluator import evaluate
from autoshard.plan import Plan
from autoshard.shards import ShardGeometry, ShardLayout, pricing_task
from autoshard.task import ShardingTask

#: The committed policy, shipped as package data (``autoshard train --export`` writes one).
DEFAULT_POLICY = Path(autoshard.__file__).resolve().parent / "data" / "ppo_policy"
#: Sampled rollouts by default: :data:`SAMPLES_SMALL` for tasks of up to :data:`SMALL_TASK`
#: (table, device) pairs, :data:`SAMPLES_LARGE` above (856 tables x 128 devices in under 2 s on
#: one core, ``python benchmarks/bench_ppo.py``).
SAMPLES_SMALL, SAMPLES_LARGE, SMALL_TASK = 4, 2, 20_000
#: The table-wise greedy sharders (DreamShard's baselines).
GREEDY = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")
#: The greedy family whose plans are candidates: the table-wise four, and, for tasks of up to
#: :data:`SMALL_TASK` (table, device) pairs, the variant that splits dominant tables (the
#: policy's own actions are table-wise; the split variant takes 0.8 s at 856 x 128).
CANDIDATES = (*GREEDY, "split_lookup_greedy")


def _missing(folder: Path) -> str | None:
    """Why no policy can be loaded from ``folder`` (None if the files are there)."""
    if importlib.util.find_spec("torch") is None:
        return "the 'torch' package is not installed"
    for name in ("config.json", "weights.pt"):
        if not (folder / name).is_file():
            return (f"no trained policy: {folder / name} is missing (train one with "
                    f"`autoshard train --export results/ppo`, or pass policy=<folder>)")
    return None


@dataclass(frozen=True)
class Choice:
    """Which candidate won the last plan, and every candidate's step cost (ms)."""

    winner: str
    costs: dict[str, float]


class PPOSharder:
    """Plans with a trained placement policy: tables costliest first, each placed on a
    (device, HBM-split bucket) option.

    Candidates: the policy's greedy decode (the highest allowed logit at every step),
    ``samples`` rollouts that sample each action from the policy (seeded, so plans are
    deterministic), all run in lockstep with one batched network call per table, and, if
    ``candidates``, the plans of the greedy family (:data:`CANDIDATES`). With ``split``, on
    tasks of up to :data:`SMALL_TASK` (table, device) pairs where some table dominates, the same
    decodes also run over the task's shards (``ppo-split-greedy``, ``ppo-split-sample-i``).
    Each is priced by the cost model; the cheapest step cost wins (ties: the earlier candidate).
    :attr:`last_choice` says which won. ``samples=0, candidates=False`` is the policy alone: its
    greedy decodes (whole tables, and shards where tables were split).

    Args:
        policy: Folder with ``config.json`` and ``weights.pt`` (default: the committed one).
        threads: torch threads for the policy (1: one CPU core).
        samples: Sampled rollouts (K of best-of-K); None: :data:`SAMPLES_SMALL` or, for tasks
            of more than :data:`SMALL_TASK` (table, device) pairs, :data:`SAMPLES_LARGE`.
        candidates: Whether the greedy sharders' plans compete.
        seed: Seed of the sampled rollouts.
        split: Whether the policy also places the shards of the dominant tables.
    """

    name: ClassVar[str] = "ppo"
    summary: ClassVar[str] = ("learned placement policy: greedy and best-of-K sampled decodes, "
                              "greedy sharders as candidates")

    def __init__(self, policy: str | Path | None = None, threads: int = 1,
                 samples: int | None = None, candidates: bool = True, seed: int = 0,
                 split: bool = True) -> None:
        if samples is not None and samples < 0:
            raise InputError("must be >= 0", field="samples", value=samples)
        self.policy = Path(policy) if policy is not None else DEFAULT_POLICY
        self.threads, self.samples, self.candidates, self.seed = threads, samples, candidates, seed
        self.split = split
        self.last_choice: Choice | None = None
        self._net: Any = None
        self._multipliers: tuple[float, ...] = ()
        self._load()  # load (and import torch) now, so that shard() is planning only

    @classmethod
    def unavailable(cls, policy: str | Path | None = None) -> str | None:
        """Why the policy in ``policy`` (default: the committed one) cannot be loaded here."""
        return _missing(Path(policy) if policy is not None else DEFAULT_POLICY)

    def _load(self) -> None:
        reason = _missing(self.policy)
        if reason:
            raise InputError(reason, field="policy", value=str(self.policy))
        from autoshard.sharders.ppo_policy import load_policy

        self._net, self._multipliers, _ = load_policy(self.policy)

    def shard(self, task: ShardingTask, cost_model: CostModel) -> Plan:
        costs, plans = self._policy_plans(task, cost_model)
        if self.candidates:
            self._add_greedy(task, cost_model, costs, plans)
        winner = min(costs, key=costs.__getitem__)
        self.last_choice = Choice(winner, costs)
        return replace(plans[winner], sharder=self.name)

    def _policy_plans(self, task: ShardingTask, cost_model: CostModel
                      ) -> tuple[dict[str, float], dict[str, Plan]]:
        import torch

        small = task.num_tables * task.num_devices <= SMALL_TASK
        samples = self.samples
        if samples is None:
            samples = SAMPLES_SMALL if small else SAMPLES_LARGE
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            costs: dict[str, float] = {}
            plans: dict[str, Plan] = {}
            for name, ep in self._decode(task, cost_model, samples, "ppo"):
                costs[name], plans[name] = ep.step_cost_ms, ep.plan(self.name)
            geometry = split_geometry(task, cost_model) if self.split and small else None
            if geometry is not None:
                shards = pricing_task(task, geometry)
                for name, ep in self._decode(shards, cost_model, samples, "ppo-split"):
                    layout = ShardLayout(geometry, ep.state.device,
                                         ep.state.hbm_rows).even_shares(task)
                    plans[name] = layout.to_plan(task, self.name)
                    costs[name] = evaluate(plans[name], task, cost_model).step_cost_ms
        finally:
            torch.set_num_threads(before)
        return costs, plans

    def _decode(self, task: ShardingTask, cost_model: CostModel, samples: int, prefix: str
                ) -> list[tuple[str, Any]]:
        """The policy's greedy and ``samples`` sampled episodes on ``task``, named."""
        from autoshard.sharders.ppo_policy import decode

        episodes = decode(self._net, self._multipliers, task, cost_model, samples, self.seed)
        names = [f"{prefix}-greedy"] + [f"{prefix}-sample-{i}" for i in range(samples)]
        return list(zip(names, episodes, strict=True))

    @staticmethod
    def _add_greedy(task: ShardingTask, cost_model: CostModel, costs: dict[str, float],
                    plans: dict[str, Plan]) -> None:
        """Adds each candidate greedy sharder's plan and its evaluated step cost (failures and
        sharders that cannot run here are skipped)."""
        from autoshard.sharders import get_sharder

        small = task.num_tables * task.num_devices <= SMALL_TASK
        for name in CANDIDATES if small else GREEDY:
            try:
                plan = get_sharder(name).shard(task, cost_model)
            except PlannerError:
                continue
            costs[name] = evaluate(plan, task, cost_model).step_cost_ms
            plans[name] = plan


def split_geometry(task: ShardingTask, cost_model: CostModel) -> ShardGeometry | None:
    """The shards of ``split_lookup_greedy`` and ``recshard``'s split choice, or None when no
    table dominates (nothing to split)."""
    from autoshard.splitting import split_heavy_tables

    choice = split_heavy_tables(task, cost_model)
    return choice.geometry if choice.split_tables.size else None

