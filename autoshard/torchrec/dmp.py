"""Plans run by TorchRec: a plan's tables sharded in DistributedModelParallel on local processes,
checked against the unsharded model and timed, beside our runner and the cost model.

``autoshard run-plan PLAN --engine torchrec`` comes here. What runs:

- the model (:mod:`autoshard.torchrec.dmp_model`): the built-in one (TorchRec's DLRM over an
  EmbeddingBagCollection of the plan's tables when they share one dim, else an MLP over the
  concatenated pooled embeddings; a small dense arch either way), or a user's factory
  ``MODULE:FACTORY`` returning a module whose EmbeddingBagCollections hold the plan's tables
  (matched by name, each at the plan's size);
- the plan: exported as TorchRec's ShardingPlan (:mod:`autoshard.torchrec.export`), each table
  with its sharding type, shards and compute kernel (:class:`TableRun`). Before anything is
  launched, every sharding type must be one TorchRec's ``EmbeddingBagCollectionSharder`` offers
  on the device type (asked of it); a plan holding others is refused, never changed. On CPU
  TorchRec offers the ``fused`` kernel only, so ``fused_uvm`` and ``fused_uvm_caching`` tables
  run as ``fused`` there, and the report says which; on GPUs each runs the plan's own kernel;
- the run: one process per device (:mod:`autoshard.torchrec.dmp_worker`, launched and watched
  like our runner's: rank logs, a timeout, a failing rank named), gloo on CPU, NCCL on GPUs.
  Each rank compares the sharded collections' pooled embeddings with the unsharded model's on
  its own batches (:data:`TOLERANCE`), then trains a few steps (a dense optimizer beside
  TorchRec's fused row-wise Adagrad) and reports the median step time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from autoshard.errors import InputError, gib
from autoshard.layout.plan import Plan
from autoshard.pricing.cost import CostModel, load_cost_model
from autoshard.pricing.evaluator import CostReport, evaluate
from autoshard.runner.config import RunConfig
from autoshard.runner.report import MeasuredReport
from autoshard.tables import Table
from autoshard.task import ShardingTask, Workload
from autoshard.torchrec.dmp_model import builtin_name, check_user_model
from autoshard.torchrec.mapping import DENSE, FUSED, FUSED_UVM_CACHING, NODE_COLUMN_TYPE, kind_of

#: Pooled embeddings (and logits) count as equal when ``torch.allclose(sharded, unsharded,
#: rtol, atol)`` holds: FP32 sums of the same rows in another order differ by rounding only.
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
#: TorchRec's fused kernels need every shard's columns to be a multiple of this
#: (torchrec/distributed/batched_embedding_kernel.py, ``_assert_local_cols_divisible_by_4``).
COLUMN_MULTIPLE = 4
#: Share of the host's available memory a local run may take.
MEMORY_SHARE = 0.8
#: The run's module, started once per rank by the launcher.
WORKER = "autoshard.torchrec.dmp_worker"


@dataclass(frozen=True)
class TableRun:
    """One table as TorchRec runs it.

    Args:
        table: Its name.
        sharding_type: TorchRec's sharding type.
        planned_kernel: The compute kernel the plan gives it.
        kernel: The kernel it runs with (the planned one unless the device lacks it).
        cache_load_factor: The cache's share of rows (``fused_uvm_caching`` only).
        ranks: Its shards' ranks.
        shards: (row offset, column offset, rows, columns, rank) of each shard; none for a
            table replicated on every rank.
    """

    table: str
    sharding_type: str
    planned_kernel: str
    kernel: str
    cache_load_factor: float | None
    ranks: tuple[int, ...]
    shards: tuple[tuple[int, int, int, int, int], ...]

    def on_rank(self, rank: int) -> bool:
        """Whether ``rank`` holds a shard or a replica of the table."""
        return not self.shards or rank in self.ranks

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def table_runs(sharding_plan: Any, module_path: str = "") -> list[TableRun]:
    """The tables of one module's TorchRec ``ShardingPlan``, with the kernels as planned.

    Raises:
        InputError: The plan has nothing for ``module_path``.
    """
    module_plan = sharding_plan.get_plan_for_module(module_path)
    if not module_plan:
        raise InputError("the ShardingPlan has no tables for this module", field="module_path",
                         value=module_path)
    out = []
    for name, ps in module_plan.items():
        spec = ps.sharding_spec
        shards = () if spec is None else tuple(
            (int(m.shard_offsets[0]), int(m.shard_offsets[1]), int(m.shard_sizes[0]),
             int(m.shard_sizes[1]), int(m.placement.rank())) for m in spec.shards)
        clf = getattr(ps.cache_params, "load_factor", None) if ps.cache_params else None
        out.append(TableRun(str(name), str(ps.sharding_type), str(ps.compute_kernel),
                            str(ps.compute_kernel), None if clf is None else float(clf),
                            tuple(int(r) for r in ps.ranks or ()), shards))
    return out


def plan_runs(plan: Plan, task: ShardingTask, node_columns: bool = False) -> list[TableRun]:
    """The plan's tables as TorchRec runs them: its description
    (:func:`autoshard.torchrec.export.export_doc`; the plan as planned, not fitted, as
    :mod:`autoshard.torchrec.exporter` says), with column blocks that all lie in one node as
    TorchRec's node-local column sharding when ``node_columns``."""
    from autoshard.torchrec.export import export_doc, load_sharding_plan

    doc = export_doc(plan, task)
    if node_columns:
        local = int(doc["local_world_size"])
        doc = dict(doc, tables=[
            dict(t, sharding_type=NODE_COLUMN_TYPE)
            if kind_of(t["sharding_type"]).splits_cols
            and not kind_of(t["sharding_type"]).splits_rows
            and t["sharding_type"] != NODE_COLUMN_TYPE
            and len({s["rank"] // local for s in t["shards"]}) == 1 else t
            for t in doc["tables"]])
    return table_runs(load_sharding_plan(doc))


# --- checks before launching --------------------------------------------------------------------

def device_type(choice: str, world: int) -> str:
    """``cpu`` or ``cuda`` for ``world`` ranks on this host: CUDA when asked, or for ``auto``
    when every rank can have its own GPU.

    Raises:
        InputError: ``cuda`` asked with fewer GPUs than ranks, or another choice.
    """
    if choice not in ("auto", "cpu", "cuda"):
        raise InputError("must be auto, cpu or cuda", field="--device", value=choice)
    if choice == "cpu":
        return "cpu"
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if choice == "cuda" and gpus < world:
        raise InputError(f"the plan has {world} devices but {gpus} GPU(s) are visible",
                         source="command line", field="--device", value=choice)
    return "cuda" if gpus >= world else "cpu"


def fit_to_device(runs: list[TableRun], device: str, source: str = "plan"
                  ) -> tuple[list[TableRun], list[str]]:
    """The tables as they run on ``device`` (``cpu`` or ``cuda``), and notes on what changed.

    Sharding types and kernels are those TorchRec's ``EmbeddingBagCollectionSharder`` offers
    on ``device``. A kernel it lacks there runs as ``fused`` on CPU (noted); nothing else
    changes.

    Raises:
        InputError: A sharding type not offered on ``device`` (the tables named), a kernel not
            offered on a GPU, or a shard TorchRec's fused kernels cannot hold.
    """
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    sharder = EmbeddingBagCollectionSharder()
    offered = list(sharder.sharding_types(device))
    refused = [r for r in runs if r.sharding_type not in offered]
    if refused:
        types = sorted({r.sharding_type for r in refused})
        cuda_only = all(t in sharder.sharding_types("cuda") for t in types)
        names = ", ".join(r.table for r in refused[:5]) + (" ..." if len(refused) > 5 else "")
        raise InputError(
            f"{len(refused)} table(s) ({names}) are sharded {' / '.join(types)}, which TorchRec "
            f"offers {'on CUDA only' if cuda_only else 'nowhere'} (on {device}: "
            f"{', '.join(offered)}); run the plan on GPUs, one per device (--device cuda), or "
            "plan without that sharding", source=source, field="sharding_type",
            value=refused[0].sharding_type)
    fitted: list[TableRun] = []
    moved: dict[str, list[str]] = {}
    for r in runs:
        kernels = list(sharder.compute_kernels(r.sharding_type, device))
        kernel = r.kernel
        if kernel not in kernels:
            if device != "cpu" or FUSED not in kernels:
                raise InputError(f"table '{r.table}': TorchRec offers {', '.join(kernels)} for "
                                 f"{r.sharding_type} on {device}", source=source,
                                 field="compute_kernel", value=kernel)
            kernel = FUSED
            moved.setdefault(r.kernel, []).append(r.table)
        check_columns(r, kernel, source)
        fitted.append(replace(r, kernel=kernel, cache_load_factor=(
            r.cache_load_factor if kernel == FUSED_UVM_CACHING else None)))
    notes = [f"{len(t)} table(s) planned {k} ran {FUSED} (TorchRec offers only {FUSED} for "
             f"sharded tables on CPU): {', '.join(t[:8])}{' ...' if len(t) > 8 else ''}"
             for k, t in moved.items()]
    return fitted, notes


def check_columns(run: TableRun, kernel: str, source: str) -> None:
    """Every shard of a table run by a fused kernel holds a multiple of
    :data:`COLUMN_MULTIPLE` columns.

    Raises:
        InputError: The first shard that does not.
    """
    if kernel == DENSE:
        return
    for _, c0, _, cols, rank in run.shards:
        if cols % COLUMN_MULTIPLE:
            raise InputError(f"table '{run.table}': the shard of columns [{c0}, {c0 + cols}) on "
                             f"rank {rank} has {cols} columns; TorchRec's fused kernels need a "
                             f"multiple of {COLUMN_MULTIPLE}", source=source, field="shards",
                             value=cols)


def check_host_memory(tables: tuple[Table, ...], world: int, copies: int) -> None:
    """Every rank holds the unsharded model and its shards here: ``copies`` FP32 copies of
    every table per rank, plus one over the ranks, must fit the host's available memory.

    Raises:
        InputError: They would not.
    """
    from autoshard.runner import _available_bytes

    need = float(sum(t.rows * t.dim * 4 for t in tables)) * (copies * world + 1)
    available = _available_bytes()
    if available is not None and need > MEMORY_SHARE * available:
        raise InputError(f"running the plan in TorchRec needs about {gib(need)} here (each of "
                         f"the {world} ranks holds the unsharded model to check against) but "
                         f"this host has {gib(available)} available; use smaller tables",
                         field="tables", value=len(tables))


# --- the run ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DmpSettings:
    """How to run a plan in DistributedModelParallel.

    Args:
        run: Steps, batch size (global; each rank feeds its ``1 / ranks`` share), mode, seed,
            device (``auto``, ``cpu``, ``cuda``), timeout, trace and learning rate. Its kernel
            is our runner's, used only with ``compare_runner``.
        model: ``MODULE:FACTORY`` of a user's model, or None for the built-in model.
        node_columns: Export column blocks that lie in one node as TorchRec's node-local
            column sharding (``table_column_wise``) rather than ``column_wise``.
        compare_runner: Also run the plan with our runner (:func:`autoshard.runner.run_plan`).
    """

    run: RunConfig = field(default_factory=RunConfig)
    model: str | None = None
    node_columns: bool = False
    compare_runner: bool = False


@dataclass(frozen=True)
class RankFigures:
    """One rank's figures: the tables it holds, its median step (wall and this thread's CPU
    time, ms, over the timed steps), and its checks of the sharded model's outputs, each with
    its own verdict and largest difference: the pooled embeddings, and the logits where both
    sides share the dense part (the built-in model; None where not checked)."""

    rank: int
    tables: tuple[str, ...]
    step_ms: float
    step_cpu_ms: float
    steps: int
    pooled_equal: bool
    outputs_checked: int
    max_abs_diff: float | None
    logits_max_abs_diff: float | None
    where: str
    logits_equal: bool | None = None

    @property
    def outputs_equal(self) -> bool:
        """Whether every check passed."""
        return self.pooled_equal and self.logits_equal is not False


@dataclass(frozen=True)
class DmpRun:
    """A run of tables in DistributedModelParallel: the setting, each table as run, each rank's
    figures, and notes on what differs from the plan."""

    model: str
    backend: str
    device_type: str
    batch_size: int
    local_batch_size: int
    mode: str
    iterations: int
    warmup: int
    tables: tuple[TableRun, ...]
    per_rank: tuple[RankFigures, ...]
    notes: tuple[str, ...]
    tolerance: dict[str, float] = field(default_factory=lambda: dict(TOLERANCE))

    @property
    def outputs_equal(self) -> bool:
        """Whether every check passed on every rank."""
        return all(r.outputs_equal for r in self.per_rank)

    @property
    def pooled_equal(self) -> bool:
        """Whether the pooled embeddings are equal on every rank."""
        return all(r.pooled_equal for r in self.per_rank)

    @property
    def logits_equal(self) -> bool | None:
        """Whether the logits are equal on every rank (None: not checked)."""
        found = [r.logits_equal for r in self.per_rank if r.logits_equal is not None]
        return all(found) if found else None

    @property
    def step_ms(self) -> float:
        """The slowest rank's median step, ms."""
        return max(r.step_ms for r in self.per_rank)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        for rank, figures in zip(doc["per_rank"], self.per_rank, strict=True):
            rank["outputs_equal"] = figures.outputs_equal
        doc.update(outputs_equal=self.outputs_equal, pooled_equal=self.pooled_equal,
                   logits_equal=self.logits_equal, step_ms=self.step_ms,
                   world_size=len(self.per_rank))
        return doc


def run_tables(runs: list[TableRun], tables: tuple[Table, ...], settings: DmpSettings,
               world: int, logs: Path | None = None, source: str = "plan",
               stages: Callable[[list[str]], None] | None = None) -> DmpRun:
    """Runs ``tables`` sharded as ``runs`` say on ``world`` local ranks.

    Everything is checked before a process starts: the sharding types and kernels on the
    device, the user's model, the batch size and this host's memory. ``stages`` is given each
    rank's stage while they run (``step 3 done``), for a progress display.

    Raises:
        InputError: A check failed. RunError: A rank failed or made no progress.
    """
    from autoshard.runner.launch import launch_local

    config = settings.run
    names = sorted(r.table for r in runs)
    if names != sorted(t.name for t in tables):
        raise InputError("the sharding plan must give every table exactly once",
                         source=source, field="tables", value=names[:8])
    outside = [r.table for r in runs if any(not 0 <= k < world for k in r.ranks)]
    if outside:
        raise InputError(f"ranks outside the {world} devices", source=source, field="ranks",
                         value=outside[:8])
    if config.batch_size % world:
        raise InputError(f"must be a multiple of the plan's {world} devices (TorchRec feeds "
                         "every rank the same number of samples)", field="--batch-size",
                         value=config.batch_size)
    device = device_type(config.device, world)
    fitted, notes = fit_to_device(runs, device, source)
    model = check_user_model(settings.model, tables) if settings.model else builtin_name(tables)
    check_host_memory(tables, world, 2 if settings.model else 1)
    spec = {"tables": [t.to_dict() for t in tables], "runs": [r.to_dict() for r in fitted],
            "config": config.to_dict(), "model": settings.model, "device_type": device,
            "tolerance": TOLERANCE, "pg_timeout_s": 2 * config.timeout_s + 30}
    if any(t.bytes_per_element != 4 for t in tables):
        notes.append("tables of other element sizes ran in FP32")
    results = launch_local(spec, world, config.timeout_s, logs, worker=WORKER, stages=stages)
    per_rank = tuple(_figures(r, fitted) for r in sorted(results, key=lambda r: r["rank"]))
    return DmpRun(model, str(results[0]["backend"]), device,
                  config.batch_size, config.batch_size // world, config.mode, config.iterations,
                  config.warmup, tuple(fitted), per_rank, tuple(notes))


def _figures(result: dict[str, Any], runs: list[TableRun]) -> RankFigures:
    check = result["check"]
    rank = int(result["rank"])
    return RankFigures(rank, tuple(r.table for r in runs if r.on_rank(rank)),
                       float(result["step_ms"]), float(result["step_cpu_ms"]),
                       int(result["steps"]), bool(check["pooled_equal"]),
                       int(check["checked"]), check["max_abs_diff"],
                       check["logits_max_abs_diff"], f"{result['host']}:{result['device']}",
                       check["logits_equal"])


@dataclass(frozen=True)
class DmpReport:
    """A plan run in DistributedModelParallel beside the cost model's figures for it and,
    when asked, our runner's measurement of it."""

    sharder: str
    torchrec: DmpRun
    modelled: CostReport
    runner: MeasuredReport | None = None

    def per_device(self) -> list[dict[str, Any]]:
        """Per device: TorchRec's median step (wall, CPU), our runner's step and own work, and
        the cost model's figure, ms."""
        rows = []
        for r, c in zip(self.torchrec.per_rank, self.modelled.per_device, strict=True):
            m = self.runner.per_device[r.rank] if self.runner else None
            rows.append({"device": r.rank, "torchrec_step_ms": r.step_ms,
                         "torchrec_step_cpu_ms": r.step_cpu_ms,
                         "runner_step_ms": m.step_ms if m else None,
                         "runner_work_ms": m.total_ms if m else None,
                         "modelled_ms": c.total_ms})
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {"engine": "torchrec", "sharder": self.sharder,
                "outputs_equal": self.torchrec.outputs_equal,
                "step_ms": self.torchrec.step_ms, "modelled_step_ms": self.modelled.step_cost_ms,
                "runner_step_ms": self.runner.step_wall_ms if self.runner else None,
                "per_device": self.per_device(), "torchrec": self.torchrec.to_dict(),
                "modelled": self.modelled.to_dict(),
                "runner": self.runner.to_dict() if self.runner else None}


#: Makes the function a run reports its ranks' stages to, for the run named (a context
#: manager, as :func:`autoshard.cli.progress.rank_steps` is).
Progress = Callable[[str], AbstractContextManager[Callable[[list[str]], None]]]


@contextlib.contextmanager
def _unwatched(label: str) -> Iterator[Callable[[list[str]], None]]:
    yield lambda stages: None


def run_plan_in_dmp(plan: Plan, task: ShardingTask, settings: DmpSettings,
                    cost_model: CostModel | str = "analytical", logs: Path | None = None,
                    source: str = "plan", progress: Progress | None = None) -> DmpReport:
    """Runs ``plan`` in DistributedModelParallel on ``task.num_devices`` local ranks, prices it
    with ``cost_model`` for the run's workload and, with ``settings.compare_runner``, runs it
    with our runner too (after TorchRec's run, not beside it). ``progress(label)`` gives the
    function each run reports its ranks' stages to (a progress display).

    Raises:
        InputError: The plan cannot run here as planned (see :func:`run_tables`).
        PlannerError: An invalid plan. RunError: A rank failed or made no progress.
    """
    from autoshard.runner import check_trace, run_plan

    config = settings.run
    task = task.with_workload(Workload(batch_size=config.batch_size, mode=config.mode))
    if config.trace:
        check_trace(config.trace, task, config.batch_size)
    model = load_cost_model(cost_model) if isinstance(cost_model, str) else cost_model
    modelled = evaluate(plan, task, model)
    runs = plan_runs(plan, task, settings.node_columns)
    watch = progress or _unwatched
    with watch("TorchRec's DistributedModelParallel") as stages:
        run = run_tables(runs, task.tables, settings, task.num_devices, logs, source, stages)
    runner = None
    if settings.compare_runner:
        with watch("our runner") as stages:
            result = run_plan(plan, task, config, model, logs, stages)
        runner = result.measured if result is not None else None
    return DmpReport(plan.sharder, run, modelled, runner)

