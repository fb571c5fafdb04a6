"""Plans as TorchRec sharding plans, both ways, and the TorchRec objects they are checked against.

A plan places each table whole on one rank (TorchRec's ``table_wise`` sharding) with its hottest
``hbm_rows`` in HBM. That maps onto TorchRec's compute kernels exactly:

- all rows in HBM: ``fused``;
- no row in HBM: ``fused_uvm`` (the table in host memory, reached over UVM);
- otherwise: ``fused_uvm_caching`` with cache load factor = HBM rows / rows (an HBM cache of that
  many rows over the table in host memory).

Writing the description needs no TorchRec; turning it back into a ``ShardingPlan`` object
(:func:`load_sharding_plan`) and checking it (:func:`check_sharding_plan`) do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoshard.errors import InputError, PlannerError
from autoshard.fileio import SCHEMA_VERSION, check_schema, read_structured, write_structured
from autoshard.plan import Plan, check_plan
from autoshard.task import ShardingTask

TORCHREC_EXTRA = ('pip install "autoshard[torchrec]" (torchrec 1.8.0 with fbgemm-gpu-cpu 1.8.0 '
                  "and torch 2.13 on CPU machines; fbgemm-gpu on GPU machines)")
FUSED, FUSED_UVM, FUSED_UVM_CACHING = "fused", "fused_uvm", "fused_uvm_caching"
KERNELS = (FUSED, FUSED_UVM, FUSED_UVM_CACHING)
_DATA_TYPES = {4: "FP32", 2: "FP16", 1: "INT8"}


def torchrec_unavailable(load: bool = False) -> str | None:
    """Why TorchRec cannot be used here (None when it can).

    By default only checks that the packages are installed (fast: importing TorchRec takes
    seconds); with ``load`` imports them, which also catches native libraries that fail to load.
    """
    import importlib.util

    try:
        for name in ("fbgemm_gpu", "torchrec"):
            if importlib.util.find_spec(name) is None:
                raise ImportError(f"No module named '{name}'")
        if load:
            import fbgemm_gpu  # noqa: F401
            import torchrec.distributed.planner  # noqa: F401
    except Exception as exc:  # ImportError, or a native library that fails to load
        return f"install the torchrec extra: {TORCHREC_EXTRA} ({type(exc).__name__}: {exc})"
    return None


@dataclass(frozen=True)
class TableSharding:
    """One table in TorchRec's terms: table-wise on ``rank`` with ``compute_kernel``."""

    table: str
    rows: int
    dim: int
    data_type: str
    rank: int
    compute_kernel: str
    cache_load_factor: float | None

    @property
    def hbm_rows(self) -> int:
        if self.compute_kernel == FUSED:
            return self.rows
        if self.compute_kernel == FUSED_UVM:
            return 0
        return round((self.cache_load_factor or 0.0) * self.rows)


def table_shardings(plan: Plan, task: ShardingTask) -> list[TableSharding]:
    """The plan's tables as TorchRec table-wise shardings (validated against the task)."""
    device, hbm = check_plan(plan, task)
    out = []
    for i, t in enumerate(task.tables):
        k = int(hbm[i])
        if k >= t.rows:
            kernel, clf = FUSED, None
        elif k == 0:
            kernel, clf = FUSED_UVM, None
        else:
            kernel, clf = FUSED_UVM_CACHING, k / t.rows
        if t.bytes_per_element not in _DATA_TYPES:
            raise InputError("TorchRec tables hold 1, 2 or 4 bytes per element",
                             field=f"{t.name}.bytes_per_element", value=t.bytes_per_element)
        out.append(TableSharding(t.name, t.rows, t.dim, _DATA_TYPES[t.bytes_per_element],
                                 int(device[i]), kernel, clf))
    return out


def export_doc(plan: Plan, task: ShardingTask) -> dict[str, Any]:
    """A JSON/YAML-ready description of the TorchRec ShardingPlan of ``plan``."""
    return {
        "schema_version": SCHEMA_VERSION, "kind": "torchrec_sharding_plan",
        "sharder": plan.sharder, "world_size": task.num_devices,
        "local_world_size": min(task.hardware.devices_per_node, task.num_devices),
        "device_type": "cuda", "module_path": "",
        "tables": [{"table": s.table, "rows": s.rows, "dim": s.dim, "data_type": s.data_type,
                    "sharding_type": "table_wise", "rank": s.rank,
                    "compute_kernel": s.compute_kernel, "cache_load_factor": s.cache_load_factor}
                   for s in table_shardings(plan, task)],
    }


def write_export(path: str | Path, plan: Plan, task: ShardingTask) -> dict[str, Any]:
    doc = export_doc(plan, task)
    write_structured(path, doc)
    return doc


def read_export(source: str | Path | dict[str, Any]) -> tuple[dict[str, Any],
                                                              list[TableSharding]]:
    """An exported description (a file or its parsed content) and its table shardings."""
    where = str(source) if not isinstance(source, dict) else "<torchrec plan>"
    doc = read_structured(source) if not isinstance(source, dict) else source
    doc = check_schema(doc, "torchrec_sharding_plan", where)
    world = doc.get("world_size")
    if not isinstance(world, int) or world < 1:
        raise InputError("must be an integer >= 1", source=where, field="world_size", value=world)
    out = []
    for i, t in enumerate(doc.get("tables") or []):
        field = f"tables[{i}]"
        try:
            s = TableSharding(str(t["table"]), int(t["rows"]), int(t["dim"]),
                              str(t.get("data_type", "FP32")), int(t["rank"]),
                              str(t["compute_kernel"]), t.get("cache_load_factor"))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"bad table entry ({exc})", source=where, field=field) from exc
        if s.compute_kernel not in KERNELS:
            raise InputError(f"compute kernel must be one of {', '.join(KERNELS)}",
                             source=where, field=f"{field}.compute_kernel",
                             value=s.compute_kernel)
        if not 0 <= s.rank < world:
            raise InputError(f"rank must be in [0, {world})", source=where,
                             field=f"{field}.rank", value=s.rank)
        out.append(s)
    if not out:
        raise InputError("no tables", source=where, field="tables")
    return doc, out


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
    """The exported description as a ``torchrec.distributed.types.ShardingPlan``.

    Built with TorchRec's own ``construct_module_sharding_plan`` over a meta-device
    EmbeddingBagCollection of the described tables, then given the cache load factors.
    """
    reason = torchrec_unavailable(load=True)
    if reason:
        raise PlannerError("unavailable", reason)
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import CacheParams, ShardingPlan

    doc, shardings = read_export(source)
    ebc = meta_collection([(s.table, s.rows, s.dim, s.data_type) for s in shardings])
    module_plan = construct_module_sharding_plan(
        ebc, {s.table: table_wise(rank=s.rank, compute_kernel=s.compute_kernel)
              for s in shardings},
        local_size=int(doc.get("local_world_size") or doc["world_size"]),
        world_size=doc["world_size"], device_type=str(doc.get("device_type", "cuda")))
    for s in shardings:
        if s.compute_kernel == FUSED_UVM_CACHING:
            module_plan[s.table].cache_params = CacheParams(load_factor=s.cache_load_factor)
    return ShardingPlan({str(doc.get("module_path", "")): module_plan})


def check_sharding_plan(plan: Any, module: Any, world_size: int) -> None:
    """Checks a ShardingPlan against a module with TorchRec's sharder for it: every parameter
    planned, sharding type and compute kernel among those the sharder offers on CUDA, ranks in
    range, and shard shapes covering the parameter exactly.

    Raises:
        PlannerError: The first mismatch found.
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    sharder = EmbeddingBagCollectionSharder()
    params = sharder.shardable_parameters(module)
    module_plan = plan.get_plan_for_module("")
    if module_plan is None or set(module_plan) != set(params):
        raise PlannerError("invalid_plan", "the TorchRec plan does not cover the module's "
                           "tables exactly")
    for name, ps in module_plan.items():
        allowed = sharder.compute_kernels(ps.sharding_type, "cuda")
        if ps.sharding_type not in sharder.sharding_types("cuda") or ps.compute_kernel not in (
                allowed):
            raise PlannerError("invalid_plan", f"table '{name}': {ps.sharding_type} with "
                               f"{ps.compute_kernel} is not offered (kernels: {allowed})")
        shards = ps.sharding_spec.shards
        shape = list(params[name].shape)
        if any(not 0 <= r < world_size for r in ps.ranks) or len(shards) != 1 or list(
                shards[0].shard_sizes) != shape:
            raise PlannerError("invalid_plan", f"table '{name}': shards {shards} do not cover "
                               f"shape {shape} on ranks < {world_size}")
