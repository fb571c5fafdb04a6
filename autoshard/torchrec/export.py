"""The TorchRec sharding-plan description a plan is exported as, and TorchRec's objects from it.

The description (JSON or YAML, kind ``torchrec_sharding_plan``) lists every table's sharding
type, compute kernel, cache load factor and shards (rank, offsets, sizes), with the world and
node sizes and the training pipeline it is for. Writing it needs no TorchRec; turning it into a
``ShardingPlan`` (:func:`load_sharding_plan`) and checking that against TorchRec's sharder
(:func:`check_sharding_plan`) do. :mod:`autoshard.torchrec.exporter` exports a plan as one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autoshard.errors import InputError, PlannerError
from autoshard.fileio import SCHEMA_VERSION, check_schema, read_structured
from autoshard.layout.kinds import REPLICATED
from autoshard.layout.plan import Plan
from autoshard.task import ShardingTask
from autoshard.torchrec import torchrec_unavailable
from autoshard.torchrec.mapping import (
    DENSE,
    FUSED_UVM_CACHING,
    KERNELS,
    SHARDING_TYPES,
    WHOLE_TYPE,
    torchrec_name,
)
from autoshard.torchrec.runtime_memory import check_pipeline, pipeline_of
from autoshard.torchrec.shardings import (
    ShardSpec,
    TableSharding,
    check_shards,
    shard_doc,
    table_shardings,
)


def export_doc(plan: Plan, task: ShardingTask, module_paths: Mapping[str, str] | None = None
               ) -> dict[str, Any]:
    """A JSON/YAML-ready description of the TorchRec ShardingPlan of ``plan``.

    ``module_paths`` gives each table's collection's module path in the model, the key of
    TorchRec's plan (none given: ``""``, the model itself). One path for every table is written
    once (``module_path``); several are written per table, beside it."""
    paths = {s.table: (module_paths or {}).get(s.table, "")
             for s in table_shardings(plan, task)}
    shared = len(set(paths.values())) <= 1
    tables = []
    for s in table_shardings(plan, task):
        entry: dict[str, Any] = {
            "table": s.table, "rows": s.rows, "dim": s.dim, "data_type": s.data_type,
            "sharding_type": s.sharding_type, "compute_kernel": s.compute_kernel,
            "cache_load_factor": s.cache_load_factor,
            "shards": [shard_doc(x) for x in s.shards]}
        if not shared:
            entry["module_path"] = paths[s.table]
        tables.append(entry)
    return {
        "schema_version": SCHEMA_VERSION, "kind": "torchrec_sharding_plan",
        "sharder": plan.sharder, "world_size": task.num_devices,
        "local_world_size": task.hardware.node_devices, "device_type": "cuda",
        "module_path": next(iter(paths.values()), "") if shared else "",
        "pipeline": pipeline_of(task.reservation), "tables": tables}


def module_groups(doc: dict[str, Any], shardings: Sequence[TableSharding],
                  where: str = "<torchrec plan>") -> dict[str, list[TableSharding]]:
    """The description's table shardings grouped by their collection's module path (a table's
    own ``module_path``, else the description's), in order.

    Raises:
        InputError: A module path that is not a string, naming the field.
    """
    groups: dict[str, list[TableSharding]] = {}
    for i, (entry, s) in enumerate(zip(doc.get("tables") or [], shardings, strict=True)):
        path = entry.get("module_path", doc.get("module_path", "")) if isinstance(
            entry, dict) else ""
        if not isinstance(path, str):
            raise InputError("must be a module path (a string)", source=where,
                             field=f"tables[{i}].module_path", value=path)
        groups.setdefault(path, []).append(s)
    return groups


def read_export(source: str | Path | dict[str, Any]) -> tuple[dict[str, Any],
                                                              list[TableSharding]]:
    """An exported description (a file or its parsed content) and its table shardings.

    Raises:
        InputError: A field is missing or malformed, a kernel or sharding type unknown, a rank
            outside the world, or shards that do not tile their table exactly (the field
            named).
    """
    where = str(source) if not isinstance(source, dict) else "<torchrec plan>"
    doc = read_structured(source) if not isinstance(source, dict) else source
    doc = check_schema(doc, "torchrec_sharding_plan", where)
    world = doc.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise InputError("must be an integer >= 1", source=where, field="world_size", value=world)
    local = doc.get("local_world_size") or world
    check_pipeline(doc.get("pipeline", "none"), "pipeline", where)
    if not isinstance(doc.get("module_path", ""), str):
        raise InputError("must be a module path (a string)", source=where, field="module_path",
                         value=doc.get("module_path"))
    out = []
    for i, t in enumerate(doc.get("tables") or []):
        s = _read_table(t, f"tables[{i}]", where)
        check_shards(s, world, int(local), where, f"tables[{i}]")
        out.append(s)
    if not out:
        raise InputError("no tables", source=where, field="tables")
    return doc, out


def _read_table(t: Any, field: str, where: str) -> TableSharding:
    try:
        rows, dim = int(t["rows"]), int(t["dim"])
        if "shards" in t:
            shards = tuple(ShardSpec(int(x["rank"]), int(x["row_offset"]), int(x["rows"]),
                                     int(x["col_offset"]), int(x["cols"]))
                           for x in t["shards"])
        else:  # table-wise descriptions written before shards were described
            shards = (ShardSpec(int(t["rank"]), 0, rows, 0, dim),)
        clf = t.get("cache_load_factor")
        s = TableSharding(str(t["table"]), rows, dim, str(t.get("data_type", "FP32")),
                          str(t.get("sharding_type", WHOLE_TYPE)), str(t["compute_kernel"]),
                          None if clf is None else float(clf), shards)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"bad table entry ({exc})", source=where, field=field) from exc
    if s.compute_kernel not in KERNELS:
        raise InputError(f"compute kernel must be one of {', '.join(KERNELS)}",
                         source=where, field=f"{field}.compute_kernel", value=s.compute_kernel)
    if s.sharding_type not in SHARDING_TYPES:
        raise InputError(f"sharding type must be one of {', '.join(SHARDING_TYPES)}",
                         source=where, field=f"{field}.sharding_type", value=s.sharding_type)
    if (s.compute_kernel == DENSE) != s.kind.replicated:
        raise InputError(f"the {DENSE} kernel goes with {torchrec_name(REPLICATED)} tables, "
                         f"and only it", source=where, field=f"{field}.compute_kernel",
                         value=[s.sharding_type, s.compute_kernel])
    if s.compute_kernel == FUSED_UVM_CACHING and not 0 < (s.cache_load_factor or 0) < 1:
        raise InputError("fused_uvm_caching needs a cache load factor in (0, 1)",
                         source=where, field=f"{field}.cache_load_factor",
                         value=s.cache_load_factor)
    return s


def meta_collection(tables: list[tuple[str, int, int, str]]) -> Any:
    """A TorchRec EmbeddingBagCollection on the meta device (no memory) of (name, rows, dim,
    data type) tables, one feature per table named like the table."""
    import torch
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    configs = [EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r,
                                  feature_names=[n], data_type=DataType[dt])
               for n, r, d, dt in tables]
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


def load_sharding_plan(source: str | Path | dict[str, Any]) -> Any:
    """The exported description as a ``torchrec.distributed.types.ShardingPlan``
    (:func:`sharding_plan`, each table under its collection's module path:
    :func:`module_groups`)."""
    doc, shardings = read_export(source)
    where = str(source) if not isinstance(source, dict) else "<torchrec plan>"
    return sharding_plan(module_groups(doc, shardings, where),
                         str(doc.get("device_type", "cuda")),
                         int(doc.get("local_world_size") or doc["world_size"]),
                         str(doc.get("pipeline", "none")))


def sharding_plan(modules: Mapping[str, Sequence[TableSharding]], device_type: str = "cuda",
                  local_world_size: int = 1, pipeline: str = "none") -> Any:
    """A ``torchrec.distributed.types.ShardingPlan`` of table shardings keyed by the module
    path of their collection (``""``: the model itself).

    Each table becomes a ``ParameterSharding`` with its sharding type, compute kernel, ranks, an
    ``EnumerableShardingSpec`` of its shards (offsets, sizes and placements, ``rank:N/cpu`` or
    ``rank:N/cuda:M`` for ``device_type``, as TorchRec's own ``construct_module_sharding_plan``
    writes them; none for a replicated table) and its cache load factor, prefetched in the
    ``"prefetch"`` training pipeline.
    """
    reason = torchrec_unavailable(load=True)
    if reason:
        raise PlannerError("unavailable", reason)
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.sharding_plan import placement
    from torchrec.distributed.types import (
        CacheParams,
        EmbeddingModuleShardingPlan,
        ParameterSharding,
        ShardingPlan,
    )

    plan = {}
    for path, shardings in modules.items():
        module_plan = EmbeddingModuleShardingPlan()
        for s in shardings:
            spec = None if s.kind.replicated else EnumerableShardingSpec([
                ShardMetadata(shard_offsets=[x.row_offset, x.col_offset],
                              shard_sizes=[x.rows, x.cols],
                              placement=placement(device_type, x.rank, local_world_size))
                for x in s.shards])
            cache = (CacheParams(load_factor=s.cache_load_factor,
                                 prefetch_pipeline=pipeline == "prefetch")
                     if s.compute_kernel == FUSED_UVM_CACHING else None)
            module_plan[s.table] = ParameterSharding(
                sharding_type=s.sharding_type, compute_kernel=s.compute_kernel, ranks=s.ranks,
                sharding_spec=spec, cache_params=cache)
        plan[path] = module_plan
    return ShardingPlan(plan)


def check_sharding_plan(plan: Any, module: Any, world_size: int,
                        local_world_size: int | None = None, path: str = "") -> None:
    """Checks a ShardingPlan's entry for the collection at ``path`` against that collection
    (``module``) with TorchRec's sharder for it: every parameter planned, sharding type and
    compute kernel among those the sharder offers on CUDA, ranks in range, and shards tiling
    the parameter exactly as the sharding type says.

    Raises:
        PlannerError: The first mismatch found.
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    sharder = EmbeddingBagCollectionSharder()
    params = sharder.shardable_parameters(module)
    module_plan = plan.get_plan_for_module(path)
    if module_plan is None or set(module_plan) != set(params):
        raise PlannerError("invalid_plan", "the TorchRec plan does not cover the module's "
                           "tables exactly")
    for name, ps in module_plan.items():
        allowed = sharder.compute_kernels(ps.sharding_type, "cuda")
        if ps.sharding_type not in sharder.sharding_types("cuda") or ps.compute_kernel not in (
                allowed):
            raise PlannerError("invalid_plan", f"table '{name}': {ps.sharding_type} with "
                               f"{ps.compute_kernel} is not offered (kernels: {allowed})")
        rows, dim = (int(v) for v in params[name].shape)
        if ps.sharding_spec is None:  # data-parallel: a whole replica on each of its ranks
            shards = tuple(ShardSpec(int(r), 0, rows, 0, dim) for r in ps.ranks or ())
        else:
            metas = ps.sharding_spec.shards
            ranks = [int(m.placement.rank()) for m in metas]
            if list(ps.ranks) != ranks:
                raise PlannerError("invalid_plan", f"table '{name}': ranks {ps.ranks} differ "
                                   f"from its shards' placements {ranks}")
            shards = tuple(ShardSpec(r, int(m.shard_offsets[0]), int(m.shard_sizes[0]),
                                     int(m.shard_offsets[1]), int(m.shard_sizes[1]))
                           for r, m in zip(ranks, metas, strict=True))
        try:
            check_shards(TableSharding(name, rows, dim, "FP32", ps.sharding_type,
                                       ps.compute_kernel, None, shards),
                         world_size, local_world_size or world_size, "<torchrec plan>",
                         name)
        except InputError as exc:
            raise PlannerError("invalid_plan", f"table '{name}': {exc.reason} "
                               f"(shape {[rows, dim]}, {world_size} ranks)") from exc
