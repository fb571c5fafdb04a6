"""The demo: the main job end to end on the embedded default workload."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table as RichTable

from autoshard.cli import app
from autoshard.cli.common import console
from autoshard.compare import CompareRow, FixedTask, read_rows, run_suite
from autoshard.compare_report import markdown_table, summarize, write_plots
from autoshard.cost import CostModel, load_cost_model
from autoshard.errors import InputError
from autoshard.fileio import atomic_write_text, read_structured
from autoshard.tables import Table

#: Where the committed learned cost model lives (relative to the repository root).
COMMITTED_MODEL = Path(__file__).resolve().parents[2] / "results" / "cost_model" / "model"


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Folder for the demo's files.")] = Path("runs/demo"),
    tables: Annotated[int, typer.Option(help="Tables in the synthetic workload.")] = 100,
    devices: Annotated[int, typer.Option(help="Devices to shard onto.")] = 8,
    trace_batch: Annotated[int, typer.Option(
        help="Samples in the synthetic trace that is profiled.")] = 8192,
    batch_size: Annotated[int, typer.Option(help="Global batch size of the planned step.")] = 65536,
    hbm_fraction: Annotated[float, typer.Option(
        help="Cluster HBM as a share of the tables' bytes (< 1: capacity-constrained).")] = 0.3,
    hardware: Annotated[str, typer.Option(help="Bundled hardware profile.")] = "8xH100-80GB",
    cost_model: Annotated[str, typer.Option(
        help="'auto' (the committed learned model when present, else analytical), "
             "'analytical', or a model folder.")] = "auto",
    time_limit: Annotated[float, typer.Option(help="Time limit per plan (s).")] = 30.0,
    seed: Annotated[int, typer.Option(help="Seed of the workload and randomised sharders.")] = 0,
) -> None:
    """Synthesise a DLRM-like workload, profile it, plan it with every sharder, compare."""
    from autoshard.workloads import constrained_task

    for option, value in (("--tables", tables), ("--devices", devices),
                          ("--trace-batch", trace_batch), ("--batch-size", batch_size)):
        if value < 1:
            raise InputError("must be >= 1", source="command line", field=option, value=value)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    measured = _synth_and_profile(out, tables, trace_batch, seed)
    model = _cost_model(cost_model)
    task = constrained_task(measured, devices, hbm_fraction, hardware, batch_size)
    console.print(f"[bold]3.[/] task: {task.num_tables} tables on {task.num_devices} x "
                  f"{hardware.split('x', 1)[-1]}, HBM {hbm_fraction:.0%} of the tables' bytes; "
                  f"cost model: {model.name}")
    console.print("[bold]4.[/] planning with every registered sharder")
    rows = run_suite("demo", [FixedTask(f"demo-{tables}x{devices}", task)], model, out,
                     options={"seed": seed, "time_limit": time_limit}, fresh=True,
                     on_row=lambda r: console.print(f"   {r.sharder:<20} {r.status}"))
    _show(rows)
    breakdown = read_structured(out / "demo.devices.json") if (
        out / "demo.devices.json").is_file() else {}
    plots = write_plots(read_rows(out / "demo.csv"), breakdown, out, "demo")
    atomic_write_text(out / "demo.md", markdown_table(summarize(rows)))
    console.print(f"done in {time.perf_counter() - start:.0f} s; results in {out}/demo.csv, "
                  f"demo.md; plots: " + ", ".join(str(p) for p in plots))


def _synth_and_profile(out: Path, count: int, batch: int, seed: int) -> tuple[Table, ...]:
    """Steps 1-2: a synthetic trace in Meta's format, then its profiled table statistics."""
    from autoshard.stats import profile_trace_file
    from autoshard.stats.readers_dlrm import save_trace
    from autoshard.synth import draw_tables, generate_trace
    from autoshard.tables import save_tables

    specs = draw_tables(count, seed)
    indices, offsets, lengths = generate_trace(specs, batch, seed)
    trace = out / "trace.pt"
    save_trace(trace, indices, offsets, lengths)
    console.print(f"[bold]1.[/] synthesised {count} DLRM-like tables x {batch} samples "
                  f"({indices.size:,} lookups) -> {trace}")
    profiles = profile_trace_file(trace, [s.rows for s in specs], [s.name for s in specs])
    measured = tuple(p.to_table(s.dim) if p.lookups else s.to_table()
                     for p, s in zip(profiles, specs, strict=True))
    save_tables(out / "tables.json", measured)
    console.print(f"[bold]2.[/] profiled the trace -> {out / 'tables.json'} (measured access "
                  "curves, pooling, coverage, rows used)")
    return measured


def _cost_model(spec: str) -> CostModel:
    if spec != "auto":
        return load_cost_model(spec)
    if COMMITTED_MODEL.is_dir():
        try:
            return load_cost_model(str(COMMITTED_MODEL))
        except InputError as exc:
            console.print(f"[yellow]committed cost model unusable ({exc}); "
                          "using the analytical model[/]")
    return load_cost_model("analytical")


def _show(rows: list[CompareRow]) -> None:
    table = RichTable(title="sharders on the demo task (lower cost / bound is better)")
    for col in ("sharder", "status", "step ms", "cost/bound", "balance", "UVM lookups",
                "plan s"):
        table.add_column(col, justify="left" if col in ("sharder", "status") else "right",
                         no_wrap=True)
    notes = []
    for r in sorted(rows, key=lambda r: (r.status != "ok", r.cost_ratio)):
        if r.status != "ok":
            table.add_row(r.sharder, r.status, "", "", "", "", "")
            notes.append(f"{r.sharder} {r.status}: {r.reason}")
            continue
        table.add_row(r.sharder, "ok", f"{r.step_cost_ms:.3f}", f"{r.cost_ratio:.3f}",
                      f"{r.load_balance:.2f}", f"{r.uvm_lookup_share:.1%}",
                      f"{r.plan_seconds:.3f}")
    console.print(table)
    for note in notes:
        console.print(note)
