"""A re-plan applied to a live TorchRec model: the delta as TorchRec's
``changed_shard_to_params``, which moves it in place with ``DistributedModelParallel.reshard``
(``EmbeddingBagCollectionSharder.reshard`` -> ``ShardedEmbeddingBagCollection.update_shards``:
weights and optimizer state sent rank to rank).

What TorchRec 1.8 can move (torchrec/distributed/sharding/dynamic_sharding.py, checked on its
CPU build over gloo):

- a table-wise table, to another rank, with its weights and its fused optimizer's state;
- a column-wise table only where every block changes rank and no rank ends with two of its
  blocks (``update_shards`` sends a block that stays to its own rank, which gloo refuses, and a
  rank receives into one local block); no other sharding type (``prepare_comm_ops`` asserts it);
- no change of sharding type or of the blocks' shapes, and no change of a table's cache (its
  compute kernel or cache load factor) where the table stays: the delta holds only tables whose
  ranks change.

So a re-plan for a live TorchRec model plans only moves of whole tables (:data:`TORCHREC_MOVES`,
the ``torchrec`` move rules: every split table, column-wise included, stays; splits are kept;
a table that stays keeps its HBM rows). :func:`plan_delta` checks a delta against the list
above and refuses what TorchRec would not move.

On gloo, TorchRec matches each send with its receive by a tag made with Python's ``hash()`` of
the table's name, which differs between processes unless every rank starts with the same
``PYTHONHASHSEED``; :func:`run_reshard` starts its ranks so (NCCL ignores tags).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError, PlannerError
from autoshard.layout.kinds import WHOLE, split_kind
from autoshard.layout.plan import Plan
from autoshard.replan.budget import MoveBudget, MoveRules
from autoshard.task import ShardingTask
from autoshard.torchrec.mapping import FUSED, WHOLE_TYPE, data_type, torchrec_name
from autoshard.torchrec.shardings import ShardSpec, TableSharding, shard_doc, table_shardings

#: The moves TorchRec's reshard makes in place (module docstring): whole tables only.
TORCHREC_MOVES = MoveRules("torchrec", movable=frozenset({WHOLE}), keep_splits=True,
                           hbm_with_device=True)
#: The sharding types whose tables TorchRec 1.8's reshard moves.
MOVABLE_TYPES = (WHOLE_TYPE, torchrec_name(split_kind(rows=False)))
#: The same ``PYTHONHASHSEED`` every rank of a gloo re-shard starts with (module docstring).
HASH_SEED = "0"


@dataclass(frozen=True)
class Delta:
    """The tables that change rank between two plans, as the new plan shards them.

    Args:
        tables: Each moved table's new sharding.
        volume_bytes: Bytes of weights (FP32, as TorchRec counts its data volume) they move.
        kept_caches: Tables that stay but whose HBM rows differ: TorchRec keeps their old
            cache (a delta holds only moved tables).
    """

    tables: tuple[TableSharding, ...]
    volume_bytes: float
    kept_caches: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.table for t in self.tables)

    def on_cpu(self) -> Delta:
        """The delta as TorchRec's CPU build runs it: every moved table with the ``fused``
        kernel, the only one it offers for sharded tables there."""
        return replace(self, tables=tuple(replace(t, compute_kernel=FUSED,
                                                  cache_load_factor=None)
                                          for t in self.tables))

    def to_dict(self) -> dict[str, Any]:
        return {"tables": [dict(asdict(t), shards=[shard_doc(x) for x in t.shards])
                           for t in self.tables],
                "volume_bytes": self.volume_bytes, "kept_caches": list(self.kept_caches)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Delta:
        tables = tuple(TableSharding(**{**t, "shards": tuple(ShardSpec(**x)
                                                               for x in t["shards"])})
                       for t in doc["tables"])
        return cls(tables, float(doc["volume_bytes"]), tuple(doc["kept_caches"]))


def plan_delta(old: Plan, new: Plan, task: ShardingTask) -> Delta:
    """The tables that ``new`` puts on other ranks than ``old`` does (both plans of
    ``task``), checked against what TorchRec can move (module docstring).

    Raises:
        PlannerError: A moved table TorchRec cannot move: another sharding type, a changed
            sharding type or block, a block that stays or a rank that would hold two blocks
            (the table and the reason named).
    """
    before = {s.table: s for s in table_shardings(old, task)}
    moved, caches = [], []
    volume = 0.0
    for s in table_shardings(new, task):
        was = before[s.table]
        if s.ranks == was.ranks:
            if (s.compute_kernel, s.cache_load_factor) != (was.compute_kernel,
                                                          was.cache_load_factor):
                caches.append(s.table)
            continue
        _check_movable(was, s)
        moved.append(s)
        volume += sum(4.0 * x.rows * x.cols for x in s.shards)
    return Delta(tuple(moved), volume, tuple(caches))


def _check_movable(was: TableSharding, now: TableSharding) -> None:
    def refuse(reason: str) -> PlannerError:
        return PlannerError("reshard", f"table '{now.table}': TorchRec's reshard cannot move "
                            f"it: {reason}")

    if now.sharding_type not in MOVABLE_TYPES:
        raise refuse(f"it moves {', '.join(MOVABLE_TYPES)} tables only, not {now.sharding_type}")
    if was.sharding_type != now.sharding_type:
        raise refuse(f"its sharding type changes ({was.sharding_type} to {now.sharding_type})")
    shapes = [(x.row_offset, x.rows, x.col_offset, x.cols) for x in was.shards]
    if shapes != [(x.row_offset, x.rows, x.col_offset, x.cols) for x in now.shards]:
        raise refuse("its blocks change shape")
    if len(set(now.ranks)) < len(now.ranks):
        raise refuse("a rank would hold two of its blocks")
    if any(a == b for a, b in zip(was.ranks, now.ranks, strict=True)):
        raise refuse("a block stays on its rank while the others move")


def changed_shard_to_params(delta: Delta, paths: Mapping[str, str], device_type: str = "cuda",
                            local_world_size: int = 1) -> dict[str, tuple[float, Any]]:
    """``DistributedModelParallel.reshard``'s argument: per module path of a collection (``""``:
    the model itself; ``paths`` gives each table's, all ``""`` when empty), TorchRec's data
    volume (MiB, FP32 weights, as its own ``output_sharding_plan_delta`` counts it) and the
    ``EmbeddingModuleShardingPlan`` of its moved tables."""
    from autoshard.torchrec.export import sharding_plan

    modules: dict[str, list[TableSharding]] = {}
    for s in delta.tables:
        modules.setdefault(paths.get(s.table, ""), []).append(s)
    plan = sharding_plan(modules, device_type, local_world_size)
    return {path: (sum(4.0 * x.rows * x.cols for s in found for x in s.shards) / 2**20,
                   plan.plan[path]) for path, found in modules.items()}


def reshard(dmp: Any, delta: Delta, paths: Mapping[str, str] | None = None) -> float:
    """Moves ``delta``'s tables of ``dmp`` (a ``DistributedModelParallel``) in place, every
    rank calling it alike; returns TorchRec's data volume moved (MiB).

    Raises:
        PlannerError: A table ``dmp``'s plan does not hold.
    """
    from torchrec.distributed.comm import get_local_size

    paths = dict(paths or {})
    known = {name for module in dmp.plan.plan.values() for name in module}
    missing = [n for n in delta.names if n not in known]
    if missing:
        raise PlannerError("reshard", f"the model's plan has no table {missing[0]!r}")
    device = "cuda" if dmp.device.type == "cuda" else "cpu"
    changed = changed_shard_to_params(delta, paths, device, get_local_size(
        dmp._env.world_size))
    volume = 0.0
    for path in changed:
        volume += float(dmp.reshard(changed, sharded_module_fqn=path or None))
    return volume


def reshard_to(dmp: Any, new: Any) -> float:
    """Moves ``dmp`` (a ``DistributedModelParallel``) in place to ``new`` (TorchRec's
    ``ShardingPlan`` of the same tables, as :class:`autoshard.torchrec.autoshard_planner.
    AutoshardPlanner` re-plans it on every rank): the tables whose ranks change, every rank
    calling it alike; returns TorchRec's data volume moved (MiB).

    Raises:
        PlannerError: A table TorchRec cannot move (its sharding type, or a changed one).
    """
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    volume = 0.0
    for path, module in new.plan.items():
        before = dmp.plan.plan[path]
        changed = {name: ps for name, ps in module.items() if ps.ranks != before[name].ranks}
        for name, ps in changed.items():
            if ps.sharding_type not in MOVABLE_TYPES or ps.sharding_type != before[
                    name].sharding_type:
                raise PlannerError("reshard", f"table '{name}': TorchRec's reshard cannot move "
                                   f"a {before[name].sharding_type} table to "
                                   f"{ps.sharding_type}")
        if changed:
            mib = sum(4.0 * math.prod(m.shard_sizes) for ps in changed.values()
                      for m in ps.sharding_spec.shards) / 2**20
            volume += float(dmp.reshard({path: (mib, EmbeddingModuleShardingPlan(changed))},
                                        sharded_module_fqn=path or None))
    return volume


def previous_plan(previous: Plan | str | Path | Any, task: ShardingTask) -> Plan:
    """The plan in use in our terms: ``previous`` itself, a plan file (``autoshard plan``'s,
    or an exported TorchRec description), or TorchRec's ``ShardingPlan`` (every module path's
    tables); only the tables ``task`` holds, the others are dropped from it.

    Raises:
        InputError: A file that is neither.
        PlannerError: A table whose sharding our plans cannot hold.
    """
    from autoshard.fileio import read_structured
    from autoshard.torchrec.export import load_sharding_plan
    from autoshard.torchrec.shardings import from_parameter_sharding, to_plan

    if isinstance(previous, Plan):
        return previous
    if isinstance(previous, (str, Path)):
        doc = read_structured(previous)
        if isinstance(doc, dict) and doc.get("kind") == "plan":
            return Plan.from_dict(doc, str(previous))
        previous = load_sharding_plan(previous)
    found = {name: ps for module in previous.plan.values() for name, ps in module.items()}
    held = [i for i, t in enumerate(task.tables) if t.name in found]
    sub = task.subset(np.array(held, dtype=np.int64))
    return to_plan([from_parameter_sharding(t.name, found[t.name], t.rows, t.dim,
                                            data_type(t)) for t in sub.tables], sub)


def torchrec_budget(budget: MoveBudget | None) -> MoveBudget:
    """``budget`` (default: no limit) holding TorchRec's move rules (:data:`TORCHREC_MOVES`):
    a live model's re-plan makes only the moves its reshard can."""
    return replace(budget or MoveBudget(), rules=TORCHREC_MOVES)


@dataclass(frozen=True)
class ReshardSettings:
    """How :func:`run_reshard` checks a re-shard on local ranks.

    Args:
        batch_size: Global samples per step.
        before_steps: Training steps under the plan in use before the re-shard.
        after_steps: Training steps after it.
        timeout_s: Seconds a rank may go without progress.
        seed: Seeds the weights and batches.
        learning_rate: Of the fused row-wise Adagrad and the dense optimizer.
    """

    batch_size: int = 64
    before_steps: int = 2
    after_steps: int = 2
    timeout_s: float = 120.0
    seed: int = 0
    learning_rate: float = 0.1


@dataclass(frozen=True)
class ReshardRun:
    """A re-shard checked on local ranks (:mod:`autoshard.torchrec.reshard_worker`), every
    check over all ranks.

    Args:
        moved: The tables moved.
        ranks: Each moved table's ranks afterwards, as the model's own plan has them.
        sharded_equal: The sharded model's outputs equalled the unsharded model's before.
        resharded_equal: They still do after the re-shard (the unsharded model holding the
            trained weights).
        optimizer_carried: Every table's fused optimizer state after the re-shard is the one
            before.
        optimizer_nonzero: Entries of that state that were not zero (there was state to carry).
        control_equal: After training on, the outputs equal those of a control model trained
            alike and never re-sharded.
        control_max_abs_diff: The largest difference from the control's outputs.
        volume_mib: TorchRec's count of the data moved (MiB of FP32 weights).
        steps_after: Training steps run after the re-shard.
        kept_caches: Tables that stay whose HBM rows differ (TorchRec keeps their cache).
        notes: What ran otherwise than planned (kernels on CPU).
    """

    moved: tuple[str, ...]
    ranks: dict[str, list[int]]
    sharded_equal: bool
    resharded_equal: bool
    optimizer_carried: bool
    optimizer_nonzero: int
    control_equal: bool
    control_max_abs_diff: float
    volume_mib: float
    steps_after: int
    kept_caches: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Every check held."""
        return (self.sharded_equal and self.resharded_equal and self.optimizer_carried
                and self.control_equal)

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), ok=self.ok)

    @classmethod
    def of(cls, per_rank: list[dict[str, Any]], delta: Delta, notes: list[str]) -> ReshardRun:
        """The ranks' figures (rank 0's gathered list) in one record."""
        return cls(delta.names, per_rank[0]["ranks"],
                   all(r["sharded"]["equal"] for r in per_rank),
                   all(r["resharded"]["equal"] for r in per_rank),
                   all(r["optimizer_state"]["carried"] for r in per_rank),
                   int(per_rank[0]["optimizer_state"]["nonzero"]),
                   all(r["control"]["equal"] for r in per_rank),
                   max(float(r["control"]["max_abs_diff"]) for r in per_rank),
                   float(per_rank[0]["volume_mib"]), int(per_rank[0]["steps_after"]),
                   delta.kept_caches, tuple(notes))


def run_reshard(old: Plan, new: Plan, task: ShardingTask,
                settings: ReshardSettings = ReshardSettings(), logs: Path | None = None
                ) -> ReshardRun:
    """Re-shards the built-in model (TorchRec's DLRM over ``task``'s tables, an MLP over them
    when their dims differ) from ``old`` to ``new`` on ``task.num_devices`` local CPU ranks
    (gloo; :mod:`autoshard.torchrec.reshard_worker` says what each rank checks); returns rank
    0's figures, gathered (:class:`ReshardRun`).

    Raises:
        InputError: A plan that cannot run here (:func:`autoshard.torchrec.dmp.run_tables`'s
            checks), or a batch not a multiple of the ranks.
        PlannerError: A delta TorchRec cannot move. RunError: A rank failed or stalled.
    """
    from autoshard.runner.config import RunConfig
    from autoshard.runner.launch import launch_local
    from autoshard.torchrec.dmp import TOLERANCE, check_host_memory, fit_to_device, plan_runs

    world = task.num_devices
    if settings.batch_size % world:
        raise InputError(f"must be a multiple of the plan's {world} devices",
                         field="batch_size", value=settings.batch_size)
    delta = plan_delta(old, new, task)
    before, notes = fit_to_device(plan_runs(old, task), "cpu", "plan in use")
    fit_to_device(plan_runs(new, task), "cpu", "new plan")
    check_host_memory(task.tables, world, 3)
    config = RunConfig(batch_size=settings.batch_size, iterations=settings.after_steps,
                       warmup=0, seed=settings.seed, device="cpu", timeout_s=settings.timeout_s,
                       learning_rate=settings.learning_rate)
    spec = {"tables": [t.to_dict() for t in task.tables],
            "runs": [r.to_dict() for r in before], "delta": delta.on_cpu().to_dict(),
            "config": config.to_dict(), "model": None, "device_type": "cpu",
            "tolerance": TOLERANCE, "pg_timeout_s": 2 * settings.timeout_s + 30,
            "before_steps": settings.before_steps, "after_steps": settings.after_steps}
    result = launch_local(spec, world, settings.timeout_s, logs,
                          worker="autoshard.torchrec.reshard_worker",
                          env={"PYTHONHASHSEED": HASH_SEED})
    return ReshardRun.of(result, delta, notes)


__all__ = ["HASH_SEED", "TORCHREC_MOVES", "Delta", "ReshardRun", "ReshardSettings",
           "changed_shard_to_params", "plan_delta", "previous_plan", "reshard", "reshard_to",
           "run_reshard", "torchrec_budget"]
