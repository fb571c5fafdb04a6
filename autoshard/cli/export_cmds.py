"""Export command: a plan as a TorchRec sharding plan."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autoshard import exporting
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
from autoshard.task import ShardingTask


@app.command("export")
def export(
    plan_file: Annotated[Path, typer.Argument(help="Plan file from `autoshard plan`.")],
    tables: PlanTablesOpt = None,
    hardware: PlanHardwareOpt = None,
    to: Annotated[str, typer.Option("--to", help="Target format: torchrec.")] = "torchrec",
    output: Annotated[Path, typer.Option("--output", "-o", help="File to write (JSON/YAML).")
                      ] = Path("runs/torchrec_plan.json"),
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
    module_path: Annotated[str | None, typer.Option(
        "--module-path", help="Module path of the collection every table belongs to in your "
        "model, the key of TorchRec's plan (e.g. sparse_arch.embedding_bag_collection in "
        "TorchRec's DLRM); default: each table's as the plan records it (plans made from "
        "--torchrec-model), else '' (the model is the collection).")] = None,
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
    if to not in exporting.export_targets():
        raise InputError(f"must be one of {', '.join(exporting.export_targets())}", field="--to",
                         value=to)
    check_output_path(output)
    if fitted_plan is not None:
        check_output_path(fitted_plan)
    check_distinct_outputs({"--output": output, "--fitted-plan": fitted_plan})
    loaded = Plan.load(plan_file)
    priced = plan_task(loaded, plan_file, Given(tables, hardware, devices, nodes, hbm_gb,
                                                batch_size, mode, overhead), reprice)
    for note in priced.notes:
        typer.echo(f"note: {note}", err=True)
    options: dict[str, object] = {"fit": fit, "check": check, "fitted_plan": fitted_plan,
                                  "module_path": module_path}
    _export(plan_file, loaded, priced.task, to, output, options)


def _export(plan_file: Path, loaded: Plan, task: ShardingTask, to: str, output: Path,
            options: dict[str, object]) -> None:
    """Exports ``loaded`` (:func:`autoshard.exporting.export`) and says what it holds."""
    try:
        exported = exporting.export(loaded, task, output, to=to, **options)
    except InputError as exc:
        raise exc.located(str(plan_file)) from exc
    except PlannerError as exc:
        raise PlannerError(exc.kind, f"{plan_file}: {exc}") from exc
    if exported.checked is not None:
        console.print(exported.checked)
    console.print(f"wrote {output}: {exported.summary}")
    changed = exported.changed
    if changed:
        console.print(f"lowered the HBM caches of {len(changed)} table(s) to fit TorchRec's "
                      f"HBM count (I/O buffers, cache state): {', '.join(changed[:8])}"
                      f"{' ...' if len(changed) > 8 else ''}")
