"""Export command: a plan as a TorchRec sharding plan."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from autoshard.cli import app
from autoshard.cli.common import (
    BatchOpt,
    DevicesOpt,
    HardwareOpt,
    HbmOpt,
    ModeOpt,
    NodesOpt,
    TablesOpt,
    build_task,
    check_output_path,
    console,
)
from autoshard.errors import InputError, PlannerError
from autoshard.plan import Plan

TARGETS = ("torchrec",)


@app.command("export")
def export(
    plan_file: Annotated[Path, typer.Argument(help="Plan file from `autoshard plan`.")],
    tables: TablesOpt,
    hardware: HardwareOpt = "8xH100-80GB",
    to: Annotated[str, typer.Option("--to", help="Target format: torchrec.")] = "torchrec",
    output: Annotated[Path, typer.Option("--output", "-o", help="File to write (JSON/YAML).")
                      ] = Path("torchrec_plan.json"),
    devices: DevicesOpt = None,
    nodes: NodesOpt = None,
    hbm_gb: HbmOpt = None,
    batch_size: BatchOpt = None,
    mode: ModeOpt = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Load the result as a TorchRec ShardingPlan and check it against "
        "TorchRec's sharder (needs the torchrec extra).")] = False,
) -> None:
    """Write a plan as a TorchRec ShardingPlan description (table-wise; fused, fused_uvm or
    fused_uvm_caching with the plan's HBM rows as cache load factor).

    Load it in Python with ``autoshard.export_torchrec.load_sharding_plan(path)``.
    """
    from autoshard.export_torchrec import (
        check_sharding_plan,
        load_sharding_plan,
        meta_collection,
        read_export,
        write_export,
    )

    if to not in TARGETS:
        raise InputError(f"must be one of {', '.join(TARGETS)}", field="--to", value=to)
    check_output_path(output)
    loaded = Plan.load(plan_file)
    task = build_task(tables, hardware, devices, nodes, hbm_gb, batch_size, mode,
                      default=loaded.workload)
    try:
        doc = write_export(output, loaded, task)
    except PlannerError as exc:
        raise PlannerError(exc.kind, f"{plan_file}: {exc}") from exc
    kernels = Counter(t["compute_kernel"] for t in doc["tables"])
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kernels.items()))
    console.print(f"wrote {output}: {len(doc['tables'])} tables on {doc['world_size']} ranks "
                  f"({summary})")
    if check:
        sharding_plan = load_sharding_plan(output)
        _, shardings = read_export(output)
        module = meta_collection([(s.table, s.rows, s.dim, s.data_type) for s in shardings])
        check_sharding_plan(sharding_plan, module, doc["world_size"])
        console.print("TorchRec accepts it: every table planned with a sharding type and kernel "
                      "its EmbeddingBagCollection sharder offers, shards covering each table")
