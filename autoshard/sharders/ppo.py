"""The learned sharder: a trained placement policy, decoded greedily and by sampling, with the
greedy sharders' plans as candidates; the plan with the lowest step cost wins.

Splits: on tasks of up to :data:`SMALL_TASK` (table, device) pairs, the tables that dominate are
split as ``split_lookup_greedy`` and ``recshard`` split them
(:func:`autoshard.splitting.split_heavy_tables`), and the policy also places the resulting shards
as items (each shard priced like a table through the cost model); its split decodes compete with
its whole-table ones. In one more decode the policy chooses the splits itself
(:mod:`autoshard.policy.choice`): at each dominant table it either places the table whole
or splits it as the heuristic would and places its shards (``ppo-choice-greedy``).

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
from autoshard.evaluator import plan_cost_ms, step_cost_ms
from autoshard.limits import SEED, THREADS, Range
from autoshard.plan import Plan
from autoshard.provenance import Provenance
from autoshard.search.enforce import enforce
from autoshard.search.polish import polish_plan
from autoshard.search.stage import refine
from autoshard.search.waterfill import Curves
from autoshard.shards import ShardGeometry, ShardLayout, pricing_task
from autoshard.task import ShardingTask

#: The committed policy, shipped as package data (``autoshard train --export`` writes one).
DEFAULT_POLICY = Path(autoshard.__file__).resolve().parent / "data" / "ppo_policy"
#: Sampled rollouts by default: none. With the improvement stage polishing the cheapest
#: candidate, one rollout lowers the held-out families' mean cost by under 1% for about a third
#: more planning time (``benchmarks/bench_ppo.py --samples 1``, ``results/ppo/README.md``).
SAMPLES = 0
#: Tasks of up to this many (table, device) pairs also get the split decodes and candidates.
SMALL_TASK = 20_000
#: Tasks with fewer tables per device than this also get decodes over a finer split: tables
#: dearer than :data:`FINE_TARGET` times the split choice's target are split too.
FINE_TABLES_PER_DEVICE, FINE_TARGET = 4, 0.5
#: The table-wise greedy sharders (DreamShard's baselines).
GREEDY = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")
#: Candidates whose cheapest is polished besides the cheapest of all: the decodes over split
#: tables (the split choice, its node-local variant, the policy's own choice), those over the
#: finer split and those over row splits only. Each group's member polished is the cheapest
#: once its HBM is water-filled.
POLISHED_GROUPS = (("ppo-split", "ppo-node-split", "ppo-choice"), ("ppo-fine", "ppo-node-fine"),
                   ("ppo-rows", "ppo-node-rows"))
#: One more such group on tasks of up to :data:`SMALL_TASK` pairs: the whole-table plans (the
#: policy's and the table-wise greedy sharders'). With HBM reserved per table or shard, a
#: whole-table plan can polish to below a split one that cost less before.
WHOLE_GROUP = ("ppo-greedy", "ppo-sample", *GREEDY)
#: The greedy family whose plans are candidates: the table-wise four, and, for tasks of up to
#: :data:`SMALL_TASK` (table, device) pairs, the variant that splits dominant tables (the
#: policy's own actions are table-wise; the split variant takes 0.8 s at 856 x 128).
CANDIDATES = (*GREEDY, "split_lookup_greedy")


def _small(task: ShardingTask) -> bool:
    """Whether ``task`` has at most :data:`SMALL_TASK` (table, device) pairs."""
    return task.num_tables * task.num_devices <= SMALL_TASK


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
    decodes also run over the task's shards (``ppo-split-greedy``, ``ppo-split-sample-i``) and
    with the split choice in the policy's actions (``ppo-choice-greedy``,
    ``ppo-choice-sample-i``: the policy decides, table by table, which dominant tables to split).
    Each is priced by the cost model; with ``polish``, the cheapest then goes through the
    improvement stage of :mod:`autoshard.search.polish` (HBM rows re-chosen per device,
    tables and shards moved off the most loaded device), competing as ``<name>+polish`` if
    that improves it (the stage stops after a number of rounds, so plans stay deterministic,
    unless its time guard ends it first, as on large tasks); on tasks with fewer than
    :data:`FINE_TABLES_PER_DEVICE` tables per device the decodes also run over a finer split
    (``ppo-fine-greedy``, ...), whose best is polished too, and so is the best whole-table
    plan. Where tables dominate (the split decodes ran) the cheapest then has its heaviest
    tables' splits re-chosen (:mod:`autoshard.search.resplit`) and kicks around it
    (:mod:`autoshard.search.kick`), winning as ``<name>+resplit`` / ``+kick`` where
    that lowers its cost; on tasks over :data:`SMALL_TASK` pairs only the re-split's quick
    mode runs (the dearest table on the most loaded device split into a few column blocks or
    by rows). The cheapest step cost wins (ties: the earlier candidate).
    :attr:`last_choice` says which won. ``samples=0, candidates=False, polish=False`` is the
    policy alone: its greedy decodes (whole tables, shards where tables were split, and the
    decode in which it chooses the splits).

    Args:
        policy: Folder with ``config.json`` and ``weights.pt`` (default: the committed one).
        threads: torch threads for the policy (1: one CPU core).
        samples: Sampled rollouts (K of best-of-K); None: :data:`SAMPLES`.
        candidates: Whether the greedy sharders' plans compete.
        seed: Seed of the sampled rollouts.
        split: Whether the policy also places the shards of the dominant tables (and chooses
            which to split).
        polish: Whether the cheapest candidates go through the improvement stage.
    """

    name: ClassVar[str] = "ppo"
    summary: ClassVar[str] = ("learned placement policy: greedy and best-of-K sampled decodes, "
                              "greedy sharders as candidates")
    option_ranges: ClassVar[dict[str, Range]] = {
        "threads": THREADS, "samples": Range(0, 1000, integer=True), "seed": SEED}

    def __init__(self, policy: str | Path | None = None, threads: int = 1,
                 samples: int | None = None, candidates: bool = True, seed: int = 0,
                 split: bool = True, polish: bool = True) -> None:
        if samples is not None and samples < 0:
            raise InputError("must be >= 0", field="samples", value=samples)
        self.policy = Path(policy) if policy is not None else DEFAULT_POLICY
        self.threads, self.samples, self.candidates, self.seed = threads, samples, candidates, seed
        self.split, self.polish = split, polish
        self.last_choice: Choice | None = None
        self._net: Any = None
        self._choice_net: Any = None
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
        from autoshard.policy.choice import GRIDS
        from autoshard.policy.network import load_policy, regrid

        net, self._multipliers, _ = load_policy(self.policy)
        # The policy on one option grid (whole tables) and on two (with the split choice).
        self._net, self._choice_net = regrid(net, 1), regrid(net, GRIDS)

    def shard(self, task: ShardingTask, cost_model: CostModel) -> Plan:
        costs, plans, dominated = self._policy_plans(task, cost_model)
        if self.candidates:
            self._add_greedy(task, cost_model, costs, plans)
        if self.polish:
            self._polish(task, cost_model, costs, plans)
        winner = min(costs, key=costs.__getitem__)
        large = not _small(task)
        if self.polish and (dominated or (large and self.split)):
            refined = refine(plans[winner], task, cost_model, costs[winner], large=large,
                             seed=self.seed)
            for tag, cost in refined.steps:
                winner = f"{winner}+{tag}"
                costs[winner], plans[winner] = cost, refined.plan
        self.last_choice = Choice(winner, costs)
        return replace(plans[winner], sharder=self.name,
                       provenance=provenance(winner, costs))

    def _policy_plans(self, task: ShardingTask, cost_model: CostModel
                      ) -> tuple[dict[str, float], dict[str, Plan], bool]:
        """The policy's decodes, named, with their step costs; and whether some table dominates
        (the split decodes ran: tasks of up to :data:`SMALL_TASK` pairs)."""
        import torch

        small = _small(task)
        samples = SAMPLES if self.samples is None else self.samples
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            costs: dict[str, float] = {}
            plans: dict[str, Plan] = {}
            for name, ep in self._decode(task, cost_model, samples, "ppo"):
                plans[name] = ep.plan(self.name)
                costs[name] = step_cost_ms(task, cost_model, ep.state.device, ep.state.hbm_rows)
            geometries = (split_geometries(task, cost_model, fine=self.polish)
                          if self.split and small else {})
            if "ppo-split" in geometries:
                self._choose_splits(task, cost_model, geometries["ppo-split"], samples, costs,
                                    plans)
            for prefix, geometry in geometries.items():
                shards = pricing_task(task, geometry)
                try:
                    episodes = self._decode_or_greedy(shards, cost_model, samples, prefix)
                except PlannerError:  # some shard fits nowhere once others are placed
                    continue
                for name, ep in episodes:
                    layout = enforce(task, ShardLayout(geometry, ep.state.device,
                                                       ep.state.hbm_rows).even_shares(task),
                                     cost_model)
                    plans[name] = layout.to_plan(task, self.name)
                    costs[name] = step_cost_ms(shards, cost_model, layout.device,
                                               layout.hbm_rows)
        finally:
            torch.set_num_threads(before)
        # Some table dominates where a split ran (replicas alone do not say so).
        return costs, plans, any(name != "ppo-replicas" for name in geometries)

    def _choose_splits(self, task: ShardingTask, cost_model: CostModel, geometry: ShardGeometry,
                       samples: int, costs: dict[str, float], plans: dict[str, Plan]) -> None:
        """Adds the decodes in which the policy chooses which tables of ``geometry``'s split to
        split (``ppo-choice-greedy``, ``ppo-choice-sample-i``)."""
        from autoshard.policy.network import decode_choice

        try:
            episodes = decode_choice(self._choice_net, self._multipliers, task, cost_model,
                                     geometry, samples, self.seed)
        except PlannerError:  # some item fits nowhere once others are placed
            return
        names = ["ppo-choice-greedy"] + [f"ppo-choice-sample-{i}" for i in range(samples)]
        for name, ep in zip(names, episodes, strict=True):
            layout = ep.shard_layout().even_shares(task)
            plans[name] = layout.to_plan(task, self.name)
            costs[name] = step_cost_ms(pricing_task(task, layout.geometry), cost_model,
                                       layout.device, layout.hbm_rows)

    def _decode_or_greedy(self, task: ShardingTask, cost_model: CostModel, samples: int,
                          prefix: str) -> list[tuple[str, Any]]:
        """:meth:`_decode`, or its greedy decode alone where a sampled rollout places some
        item nowhere (the samples run in lockstep: one failure ends them all)."""
        try:
            return self._decode(task, cost_model, samples, prefix)
        except PlannerError:
            if samples == 0:
                raise
            return self._decode(task, cost_model, 0, prefix)

    def _decode(self, task: ShardingTask, cost_model: CostModel, samples: int, prefix: str
                ) -> list[tuple[str, Any]]:
        """The policy's greedy and ``samples`` sampled episodes on ``task``, named."""
        from autoshard.policy.network import decode

        episodes = decode(self._net, self._multipliers, task, cost_model, samples, self.seed)
        names = [f"{prefix}-greedy"] + [f"{prefix}-sample-{i}" for i in range(samples)]
        return list(zip(names, episodes, strict=True))

    @staticmethod
    def _polish(task: ShardingTask, cost_model: CostModel, costs: dict[str, float],
                plans: dict[str, Plan]) -> None:
        """Polishes the cheapest candidate (:func:`autoshard.search.polish.polish_plan`)
        and the cheapest of each group of :data:`POLISHED_GROUPS` and :data:`WHOLE_GROUP`
        (split pieces a polish can balance better than their raw cost shows, and on a task
        planned for TorchRec row shards stay one per device, which a whole-table plan's polish
        cannot reach; where HBM is reserved per shard, whole tables reserve less); each that
        improves competes as ``<name>+polish``."""
        ranked = sorted(costs, key=costs.__getitem__)
        chosen = ranked[:1]
        curves: dict[bytes, Curves] = {}
        for group in (*POLISHED_GROUPS, WHOLE_GROUP) if _small(task) else POLISHED_GROUPS:
            members = [n for n in ranked if n.startswith(group) and n not in chosen]
            if len(members) > 1:  # ranked by their cost with HBM water-filled, no move
                filled = {n: polish_plan(plans[n], task, cost_model, costs[n], curves=curves,
                                         fill_only=True)[1] for n in members}
                members.sort(key=filled.__getitem__)
            chosen += members[:1]
        for name in chosen:
            plan, cost = polish_plan(plans[name], task, cost_model, costs[name], curves=curves)
            if cost < costs[name]:
                costs[f"{name}+polish"], plans[f"{name}+polish"] = cost, plan

    @staticmethod
    def _add_greedy(task: ShardingTask, cost_model: CostModel, costs: dict[str, float],
                    plans: dict[str, Plan]) -> None:
        """Adds each candidate greedy sharder's plan and its step cost (failures and
        sharders that cannot run here are skipped)."""
        from autoshard.sharders import get_sharder

        for name in CANDIDATES if _small(task) else GREEDY:
            try:
                plan = get_sharder(name).shard(task, cost_model)
            except PlannerError:
                continue
            costs[name] = plan_cost_ms(plan, task, cost_model)
            plans[name] = plan


class PPOPolicySharder(PPOSharder):
    """The learned policy alone: its greedy decodes (whole tables, shards of the dominant
    tables, and the decode in which it chooses the splits), without rival sharders or the
    search stage; the cheapest decode wins. ``ppo`` adds those to it; comparing the two shows
    what the policy contributes.

    Args:
        policy, threads, samples, seed, split: As for :class:`PPOSharder`.
    """

    name: ClassVar[str] = "ppo-policy"
    summary: ClassVar[str] = "learned placement policy alone: its decodes, no rivals, no search"

    def __init__(self, policy: str | Path | None = None, threads: int = 1,
                 samples: int | None = None, seed: int = 0, split: bool = True) -> None:
        super().__init__(policy, threads, samples, candidates=False, seed=seed, split=split,
                         polish=False)


def provenance(winner: str, costs: dict[str, float]) -> Provenance:
    """How the winning candidate ``winner`` (``<candidate>+<step>+...``) was found, from every
    candidate's step cost (each step's result is a candidate of its own name)."""
    base, *stages = winner.split("+")
    steps, name = [], base
    for stage in stages:
        name = f"{name}+{stage}"
        steps.append((stage, costs[name]))
    source = ("rival sharder" if base in CANDIDATES else
              "policy" if base.startswith(("ppo-greedy", "ppo-sample")) else
              "policy over splits")
    return Provenance(base, source, costs[base], tuple(steps), tuple(costs.items()))


def split_geometries(task: ShardingTask, cost_model: CostModel, fine: bool = True
                     ) -> dict[str, ShardGeometry]:
    """The shards the policy also places, by candidate prefix: ``ppo-split``, the split choice
    of ``split_lookup_greedy`` and ``recshard`` (when some table dominates), and, with
    ``fine`` (the sharder polishes) on tasks with fewer than :data:`FINE_TABLES_PER_DEVICE`
    tables per device, ``ppo-fine``: the same choice with :data:`FINE_TARGET` times its target
    (more, smaller pieces), when that splits more. On hardware of several nodes each also as
    ``ppo-node-split`` / ``ppo-node-fine`` where the choice differs once table-row-wise splits
    are offered too (the episode keeps such a table's shards on one node, one per device).
    Each, and every table whole, also as ``<prefix>-replicas`` where light tables' replicas
    pay (:func:`autoshard.splitting.replicate_tables`: one per device, every row in HBM).
    """
    from autoshard.bounds import relax
    from autoshard.shards import same_split, whole_tables
    from autoshard.splitting import replicate_tables, split_heavy_tables

    relaxed = relax(task, cost_model)
    nodes = task.hardware.devices_per_node < task.num_devices
    out: dict[str, ShardGeometry] = {}
    for local in (False, True) if nodes else (False,):
        tag = "ppo-node" if local else "ppo"
        choice = split_heavy_tables(task, cost_model, relaxed=relaxed, node_local=local)
        found = [("split", choice.geometry)] if choice.split_tables.size else []
        if task.reservation.keeps_room and found:
            rows = split_heavy_tables(task, cost_model, relaxed=relaxed, node_local=local,
                                      rows_only=True)
            found.append(("rows", rows.geometry))
        if fine and task.num_tables < FINE_TABLES_PER_DEVICE * task.num_devices:
            finer = split_heavy_tables(task, cost_model, FINE_TARGET * choice.target_ms,
                                       relaxed=relaxed, node_local=local)
            if finer.geometry.num_shards > choice.geometry.num_shards:
                found.append(("fine", finer.geometry))
        for name, g in found:
            if not any(same_split(g, h) for h in out.values()):
                out[f"{tag}-{name}"] = g
    replicas: dict[str, ShardGeometry] = {}
    for name, g in [("ppo", whole_tables(task)), *out.items()]:
        replicated = replicate_tables(task, cost_model, g)
        if not any(same_split(replicated, h) for h in [g, *out.values(), *replicas.values()]):
            replicas[f"{name}-replicas"] = replicated
    return {**out, **replicas}
