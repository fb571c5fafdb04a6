"""Export command: a plan as a TorchRec sharding plan."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from autoshard.cli.app import app
from autoshard.cli.common import (
    BatchOpt,
    DevicesOpt,
    HbmOpt,
    ModeOpt,
    NodesOpt,
    check_output_path,
    console,
)
from autoshard.cli.context import (
    Given,
    PlanHardwareOpt,
    PlanOverheadOpt,
    PlanTablesOpt,
    RepriceOpt,
    plan_task,
)
from autoshard.errors import InputError, PlannerError
from autoshard.fileio import check_distinct_outputs
from autoshard.layout.plan import Plan

TARGETS = ("torchrec",)


@app.command("export")
def export(
    plan_file: Annotated[Path, typer.Argument(help="Plan file from `autoshard plan`.")],
    tables: PlanTablesOpt = None,
    hardware: PlanHardwareOpt = None,
    to: Annotated[str, typer.Option("--to", help="Target format: torchrec.")] = "torchrec",
    output: Annotated[Path, typer.Option("--output", "-o", help="File to write (JSON/YAML).")
                      ] = Path("torchrec_plan.json"),
    devices: DevicesOpt = None,
    nodes: NodesOpt = None,
    hbm_gb: HbmOpt = None,
    batch_size: BatchOpt = None,
    mode: ModeOpt = None,
    overhead: PlanOverheadOpt = None,
    reprice: RepriceOpt = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Load the result as a TorchRec ShardingPlan, check it against "
        "TorchRec's sharder and size it with TorchRec's storage estimator per rank (needs the "
        "torchrec extra).")] = False,
    fit: Annotated[bool, typer.Option(
        "--fit/--no-fit", help="Lower HBM caches on ranks whose HBM TorchRec's storage "
        "estimate overfills (I/O buffers, cache state) until every rank fits.")] = True,
    fitted_plan: Annotated[Path | None, typer.Option(
        "--fitted-plan", help="Also write the exported plan as our plan file (what TorchRec "
        "gets, fitted), to price it with `evaluate`.")] = None,
) -> None:
    """Write a plan as a TorchRec ShardingPlan description: each table table-wise, row-wise,
    table-row-wise or column-wise with its shards' ranks, offsets and sizes, and fused,
    fused_uvm or fused_uvm_caching with its share of rows in HBM as cache load factor.

    TorchRec counts more HBM per shard than the plan's memory model (I/O buffers and cache
    state, for the training pipeline ``--overhead`` names: with ``torchrec-prefetch`` the
    caches are exported prefetched, for TorchRec's prefetch pipeline); by default the caches of
    ranks it would overfill are lowered until they fit, and the tables changed are listed.
    Load the file in Python with ``autoshard.torchrec.export.load_sharding_plan(path)``.
    """
    if to not in TARGETS:
        raise InputError(f"must be one of {', '.join(TARGETS)}", field="--to", value=to)
    check_output_path(output)
    if fitted_plan is not None:
        check_output_path(fitted_plan)
    check_distinct_outputs({"--output": output, "--fitted-plan": fitted_plan})
    loaded = Plan.load(plan_file)
    priced = plan_task(loaded, plan_file, Given(tables, hardware, devices, nodes, hbm_gb,
                                                batch_size, mode, overhead), reprice)
    for note in priced.notes:
        typer.echo(f"note: {note}", err=True)
    _export(plan_file, loaded, priced.task, output, fitted_plan, fit, check)


def _export(plan_file: Path, loaded: Plan, task: Any, output: Path, fitted_plan: Path | None,
            fit: bool, check: bool) -> None:
    """Writes the description of ``loaded`` (and the fitted plan) and says what it holds."""
    from autoshard.fileio import write_structured
    from autoshard.torchrec.export import export_doc
    from autoshard.torchrec.shardings import table_shardings, to_plan
    from autoshard.torchrec.storage import fit_shardings

    try:
        shardings = table_shardings(loaded, task)
        changed: list[str] = []
        if fit:
            shardings, changed = fit_shardings(shardings, task)
        exported = to_plan(shardings, task, loaded.sharder)
        doc = export_doc(exported, task)
    except InputError as exc:
        raise exc.located(str(plan_file)) from exc
    except PlannerError as exc:
        raise PlannerError(exc.kind, f"{plan_file}: {exc}") from exc
    if check:
        _check(doc, task)
    write_structured(output, doc)
    if fitted_plan is not None:
        exported.save(fitted_plan)
    kinds = Counter(f"{t['sharding_type']}/{t['compute_kernel']}" for t in doc["tables"])
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    console.print(f"wrote {output}: {len(doc['tables'])} tables on {doc['world_size']} ranks "
                  f"({summary})")
    if changed:
        console.print(f"lowered the HBM caches of {len(changed)} table(s) to fit TorchRec's "
                      f"HBM count (I/O buffers, cache state): {', '.join(changed[:8])}"
                      f"{' ...' if len(changed) > 8 else ''}")


def _check(doc: dict[str, Any], task: Any) -> None:
    """TorchRec loads the description, its sharder accepts every table's sharding, and its
    storage estimator fits every rank; else a PlannerError naming what fails."""
    from autoshard.errors import gib
    from autoshard.torchrec.estimate import estimate_shardings
    from autoshard.torchrec.export import (
        check_sharding_plan,
        load_sharding_plan,
        meta_collection,
        read_export,
    )

    sharding_plan = load_sharding_plan(doc)
    _, shardings = read_export(doc)
    module = meta_collection([(s.table, s.rows, s.dim, s.data_type) for s in shardings])
    check_sharding_plan(sharding_plan, module, doc["world_size"], doc["local_world_size"])
    estimate = estimate_shardings(shardings, task)
    for r in estimate.per_rank:
        if not r.fits:
            raise PlannerError("capacity", f"TorchRec's storage estimate of rank {r.rank}: "
                               f"HBM {gib(r.hbm_bytes)} of {gib(r.hbm_capacity)}, host "
                               f"{gib(r.ddr_bytes)} of {gib(r.ddr_capacity)}")
    console.print(f"TorchRec accepts it: every table planned with a sharding type and kernel "
                  f"its EmbeddingBagCollection sharder offers, shards tiling each table, and "
                  f"its storage estimate fits every rank (fullest HBM "
                  f"{100 * estimate.hbm_fill:.1f}%)")
