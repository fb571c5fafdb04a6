"""The demo: the main job end to end on the embedded default workload."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table as RichTable

from autoshard.cli.app import app
from autoshard.cli.common import (
    PolicyOpt,
    SeedOpt,
    TimeLimitOpt,
    check_trace_size,
    console,
    options_named,
    ranged,
)
from autoshard.compare.harness import CompareRow, FixedTask, read_rows, run_suite
from autoshard.compare.report import markdown_table, summarize, write_plots
from autoshard.errors import InputError
from autoshard.extras import require_all
from autoshard.fileio import atomic_write_text, output_folder, read_structured
from autoshard.limits import BATCH_SIZE, DEVICES, TIME_LIMIT_S, TRACE_SIZE, Range
from autoshard.pricing.cost import CostModel, load_cost_model, model_identity
from autoshard.pricing.evaluator import CostReport, evaluate
from autoshard.sharders import sharder_info
from autoshard.tables import Table
from autoshard.task import ShardingTask

#: Where the committed learned cost model lives (relative to the repository root).
COMMITTED_MODEL = Path(__file__).resolve().parents[1] / "data" / "cost_model"


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Folder for the demo's files.")] = Path("runs/demo"),
    tables: Annotated[int, ranged(TRACE_SIZE, "Tables in the synthetic workload (tables x "
                                  "--trace-batch at most the same).")] = 100,
    devices: Annotated[int, ranged(DEVICES, "Devices to shard onto.")] = 8,
    trace_batch: Annotated[int, ranged(
        TRACE_SIZE, "Samples in the synthetic trace that is profiled.")] = 8192,
    batch_size: Annotated[int, ranged(BATCH_SIZE, "Global batch size of the planned step.")
                          ] = 65536,
    hbm_fraction: Annotated[float, ranged(Range(0, 1000, open_low=True), "Cluster HBM as a "
                                          "share of the tables' bytes (< 1: capacity-"
                                          "constrained).")] = 0.3,
    hardware: Annotated[str, typer.Option(help="Bundled hardware profile.")] = "8xH100-80GB",
    cost_model: Annotated[str, typer.Option(
        help="Cost model the sharders plan with: 'analytical' (the profile's spec sheet) or "
             "a learned model folder.")] = "analytical",
    reprice: Annotated[str, typer.Option(
        help="Learned model folder that re-prices every plan ('auto': the committed model; "
             "'none' to skip).")] = "auto",
    time_limit: TimeLimitOpt = 30.0,
    torchrec_time_limit: Annotated[float, ranged(
        TIME_LIMIT_S, "Seconds for the torchrec sharder: TorchRec's planner with its cache-size "
        "search, which 30 s cut on a busy 2-core VM (results/README.md, the demo); a limit that "
        "cuts it is said under the table.")] = 120.0,
    seed: SeedOpt = 0,
    policy: PolicyOpt = None,
) -> None:
    """Synthesise a DLRM-like workload, profile it, plan it with every sharder, compare."""
    from autoshard.workloads import constrained_task

    check_trace_size(tables, trace_batch, "--trace-batch")
    given = _given(torchrec_time_limit, policy)
    require_all({"torch": "data", "matplotlib": "plots",
                 **({"lightgbm": "costmodel"} if reprice != "none" else {})})
    model, learned = _load_inputs(hardware, devices, cost_model, reprice)
    start = time.perf_counter()
    with output_folder(out):  # a failure leaves no new folder behind
        measured = _synth_and_profile(out, tables, trace_batch, seed)
        task = constrained_task(measured, devices, hbm_fraction, hardware, batch_size)
        console.print(f"[bold]3.[/] task: {task.num_tables} tables on {task.num_devices} x "
                      f"{hardware.split('x', 1)[-1]}, HBM {hbm_fraction:.0%} of the tables' "
                      f"bytes; cost model: {model.name}")
        console.print("[bold]4.[/] planning with every registered sharder")
        name = f"demo-{tables}x{devices}"
        rows = run_suite("demo", [FixedTask(name, task, str(out / "tables.json"))], model, out,
                         options={"seed": seed, "time_limit": time_limit}, fresh=True,
                         save_plans=True, given=given, cost_model_id=model_identity(cost_model),
                         on_row=lambda r: console.print(f"   {r.sharder:<20} {r.status}"))
        repriced = _reprice(learned, task, out / "demo.plans" / name) if learned else {}
        _show(rows, repriced)
        breakdown = read_structured(out / "demo.devices.json") if (
            out / "demo.devices.json").is_file() else {}
        plots = write_plots(read_rows(out / "demo.csv"), breakdown, out, "demo")
        atomic_write_text(out / "demo.md", markdown_table(summarize(rows)))
    console.print(f"done in {time.perf_counter() - start:.0f} s; results in {out}/demo.csv, "
                  f"demo.md; plots: " + ", ".join(str(p) for p in plots))


def _given(torchrec_time_limit: float, policy: Path | None) -> dict[str, dict[str, object]]:
    """The options the demo gives single sharders: torchrec's own limit, ppo's policy (checked
    to load)."""
    given: dict[str, dict[str, object]] = {"torchrec": {"time_limit": torchrec_time_limit}}
    if policy is not None:
        reason = sharder_info("ppo", policy=str(policy)).unavailable
        if reason:
            raise InputError(reason, source="command line", field="--policy", value=str(policy))
        given["ppo"] = {"policy": str(policy)}
    return given


def _load_inputs(hardware: str, devices: int, cost_model: str, reprice: str
                 ) -> tuple[CostModel, CostModel | None]:
    """Checks the hardware profile and loads the cost models (planning, re-pricing) before any
    file is written; errors name the option."""
    from autoshard.hardware import load_hardware

    with options_named():
        load_hardware(hardware, devices=devices)
    return load_cost_model(cost_model), _learned_model(reprice)


def _synth_and_profile(out: Path, count: int, batch: int, seed: int) -> tuple[Table, ...]:
    """Steps 1-2: a synthetic trace in Meta's format, then its profiled table statistics."""
    from autoshard.stats import profile_trace_file
    from autoshard.stats.readers.dlrm import save_trace
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


def _learned_model(spec: str) -> CostModel | None:
    """The learned model that re-prices the plans: the committed one for 'auto' (when present)."""
    if spec == "none":
        return None
    folder = COMMITTED_MODEL if spec == "auto" else Path(spec)
    if spec == "auto" and not folder.is_dir():
        console.print("[yellow]no committed learned cost model; skipping re-pricing[/]")
        return None
    model = load_cost_model(str(folder))
    hardware = getattr(model, "info_", {}).get("hardware") or ["unknown hardware"]
    trained_on = ", ".join(str(h) for h in hardware) if isinstance(hardware, list) else hardware
    console.print(f"   re-pricing with the learned model in {folder} (measured on {trained_on})")
    return model


def _reprice(model: CostModel, task: ShardingTask, plans: Path) -> dict[str, CostReport]:
    """Step 5: every saved plan priced by the learned model."""
    from autoshard.layout.plan import Plan

    return {p.stem: evaluate(Plan.load(p), task, model) for p in sorted(plans.glob("*.json"))}


def _show(rows: list[CompareRow], repriced: dict[str, CostReport]) -> None:
    table = RichTable(title="sharders on the demo task (cost / lower bound: 1.0 is optimal)")
    columns = ["sharder", "step\nms", "cost /\nbound", "UVM\nlookups", "plan\ns"]
    if repriced:
        columns.append("learned model\ncost / bound")
    for col in columns:
        table.add_column(col, justify="left" if col == "sharder" else "right", no_wrap=True,
                         min_width=18 if col == "sharder" else None)
    notes = []
    for r in sorted(rows, key=lambda r: (r.status != "ok", r.cost_ratio)):
        if r.status != "ok":
            table.add_row(r.sharder, r.status, *[""] * (len(columns) - 2))
            notes.append(f"{r.sharder} {r.status}: {r.reason}")
            continue
        if r.notes:  # what its time limit cut, say: the row is not the sharder at full strength
            notes.append(f"{r.sharder}: {r.notes} (--time-limit gives every sharder more)")
        cells = [r.sharder, f"{r.step_cost_ms:.3f}", f"{r.cost_ratio:.3f}",
                 f"{r.uvm_lookup_share:.1%}", f"{r.plan_seconds:.3f}"]
        if repriced:
            cells.append(f"{repriced[r.sharder].cost_ratio:.3f}" if r.sharder in repriced
                         else "")
        table.add_row(*cells)
    console.print(table)
    for note in notes:
        console.print(note, markup=False, highlight=False)
