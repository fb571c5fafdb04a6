"""The shards the learned sharder's policy also places: the split choices of the dominant
tables, by candidate prefix (:func:`split_geometries`)."""

from __future__ import annotations

from autoshard.layout.shards import ShardGeometry
from autoshard.pricing.cost import CostModel
from autoshard.task import ShardingTask

#: Tasks with fewer tables per device than this also get decodes over a finer split: tables
#: dearer than :data:`FINE_TARGET` times the split choice's target are split too.
FINE_TABLES_PER_DEVICE, FINE_TARGET = 4, 0.5


def split_geometries(task: ShardingTask, cost_model: CostModel, fine: bool = True,
                     variants: bool = True) -> dict[str, ShardGeometry]:
    """The shards the policy also places, by candidate prefix: ``ppo-split``, the split choice
    of ``split_lookup_greedy`` and ``recshard`` (when some table dominates), and, with
    ``fine`` on tasks with fewer than :data:`FINE_TABLES_PER_DEVICE`
    tables per device, ``ppo-fine``: the same choice with :data:`FINE_TARGET` times its target
    (more, smaller pieces), when that splits more. On hardware of several nodes each also as
    ``ppo-node-split`` / ``ppo-node-fine`` where the choice differs once table-row-wise splits
    are offered too (the episode keeps such a table's shards on one node, one per device).
    Each, and every table whole, also as ``<prefix>-replicas`` where light tables' replicas
    pay (:func:`autoshard.layout.splitting.replicate_tables`: one per device, every row in HBM).
    Without ``variants`` (large tasks) only ``ppo-split``, node-local on hardware of several
    nodes: the choice ``recshard`` makes there first (row shards kept on one node pay
    intra-node links only; ``results/large`` measures it on the 856 x 128 tasks of
    ``benchmarks/bench_large.py``).
    """
    from autoshard.layout.shards import same_split, whole_tables
    from autoshard.layout.splitting import replicate_tables, split_heavy_tables
    from autoshard.pricing.bounds import relax

    relaxed = relax(task, cost_model)
    if not variants:
        choice = split_heavy_tables(task, cost_model, relaxed=relaxed, node_local=True)
        return {"ppo-split": choice.geometry} if choice.split_tables.size else {}
    out: dict[str, ShardGeometry] = {}
    for local in (False, True) if task.hardware.spans_nodes else (False,):
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
