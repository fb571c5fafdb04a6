"""Measured runs: ``autoshard run-plan``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table as RichTable

from autoshard.cli.app import app
from autoshard.cli.common import (
    BatchOpt,
    DevicesOpt,
    HbmOpt,
    JsonOpt,
    ModeOpt,
    NodesOpt,
    check_output_path,
    console,
    print_json,
)
from autoshard.cli.context import (
    Given,
    PlanCostModelOpt,
    PlanHardwareOpt,
    PlanOverheadOpt,
    PlanTablesOpt,
    RepriceOpt,
    plan_task,
)
from autoshard.fileio import write_structured
from autoshard.plan import Plan


@app.command("run-plan")
def run_plan_cmd(
    plan_file: Annotated[Path, typer.Argument(help="Plan file from `autoshard plan`.")],
    tables: PlanTablesOpt = None,
    hardware: PlanHardwareOpt = None,
    trace: Annotated[str | None, typer.Option(
        help="Lookup trace (indices, offsets, lengths = torch.load(f)); synthetic if omitted."
    )] = None,
    iterations: Annotated[int, typer.Option(help="Timed steps (medians over them).")] = 10,
    warmup: Annotated[int, typer.Option(help="Untimed steps first.")] = 3,
    batch_size: BatchOpt = None,
    mode: ModeOpt = None,
    kernel: Annotated[str, typer.Option(help="torch (EmbeddingBag) or fbgemm (TBE).")] = "torch",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    devices: DevicesOpt = None,
    nodes: NodesOpt = None,
    hbm_gb: HbmOpt = None,
    overhead: PlanOverheadOpt = None,
    cost_model: PlanCostModelOpt = None,
    reprice: RepriceOpt = False,
    seed: Annotated[int, typer.Option(help="Seed of synthetic lookups and weights.")] = 0,
    timeout: Annotated[float, typer.Option(
        "--timeout", help="Seconds a rank may go without progress before the run is stopped.")
    ] = 120.0,
    logs: Annotated[Path | None, typer.Option(help="Folder for rank logs.")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="Also write the JSON report here.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run a plan for real on torch.distributed and time it beside the modelled cost.

    One process per device (gloo on CPU, NCCL on CUDA), or one rank per process under torchrun.
    """
    from autoshard.runner import RunConfig, run_plan

    if output is not None:
        check_output_path(output)
    loaded = Plan.load(plan_file)
    priced = plan_task(loaded, plan_file, Given(tables, hardware, devices, nodes, hbm_gb,
                                                batch_size, mode, overhead, cost_model), reprice)
    for note in priced.notes:
        typer.echo(f"note: {note}", err=True)
    task = priced.task
    config = RunConfig(batch_size=task.workload.batch_size, iterations=iterations, warmup=warmup,
                       mode=task.workload.mode, seed=seed, kernel=kernel, device=device,
                       timeout_s=timeout, trace=trace)
    result = run_plan(loaded, task, config, priced.cost_model, logs)
    if result is None:  # a rank other than 0 under torchrun
        return
    doc = result.to_dict()
    if output is not None:
        write_structured(output, doc)
    if json_out:
        print_json(doc)
        return
    show_run(result)


def show_run(result: object) -> None:
    """Per-rank measured parts beside the modelled device cost."""
    from autoshard.runner import RunResult

    assert isinstance(result, RunResult)
    m, c = result.measured, result.modelled
    table = RichTable(title=f"plan by {m.sharder or '?'}: measured ({m.backend}, {m.kernel}, "
                      f"{m.mode}, batch {m.batch_size}, median of {m.iterations}) vs "
                      f"{c.cost_model}")
    for col in ("dev", "tables", "lookup", "comm", "bwd+opt", "wait", "step", "work",
                "modelled", "ratio"):
        table.add_column(col, justify="right")
    for d, e, ratio in zip(m.per_device, c.per_device, result.device_ratios, strict=True):
        table.add_row(str(d.device), str(d.tables), f"{d.lookup_ms:.3f}", f"{d.comm_ms:.3f}",
                      f"{d.backward_optimizer_ms:.3f}", f"{d.wait_ms:.3f}", f"{d.step_ms:.3f}",
                      f"{d.total_ms:.3f}", f"{e.total_ms:.4f}", f"{ratio:.1f}")
    console.print(table)
    console.print("[dim]ms, medians per rank; work = the rank's own lookup, comm and bwd+opt "
                  "time (step less wait and the loss); ratio = measured work / modelled[/]")
    console.print(
        f"step cost: measured [bold]{m.step_cost_ms:.3f} ms[/] (wall {m.step_wall_ms:.3f} ms), "
        f"modelled {c.step_cost_ms:.4f} ms, measured / modelled [bold]{result.step_ratio:.1f}[/]; "
        f"load balance {m.load_balance:.3f} vs {c.load_balance:.3f}; UVM lookup share "
        f"{m.uvm_lookup_share:.2%} vs {c.uvm_lookup_share:.2%}")
    console.print(f"[dim]{m.note}[/]")
