"""Data commands: profile lookup data into a table file, synthesise traces, calibrate."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable

from autoshard.cli.app import app
from autoshard.cli.common import (
    SeedOpt,
    check_output_path,
    check_trace_size,
    console,
    print_json,
    ranged,
)
from autoshard.errors import InputError
from autoshard.fileio import check_distinct_outputs
from autoshard.limits import MAX_DIM, TRACE_SIZE, Range

if TYPE_CHECKING:
    from autoshard.stats.profile import TableProfile
    from autoshard.tables import Table

OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="File to write.")]


@contextlib.contextmanager
def progress_bar(label: str, total: float | None) -> Iterator[Callable[[int], None]]:
    """A rich progress bar; yields a function that advances it."""
    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed:,.0f}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.advance(task, done)


@app.command()
def profile(
    input_file: Annotated[Path, typer.Argument(metavar="INPUT", help="Trace or data file.")],
    output: OutputOpt = Path("tables.json"),
    fmt: Annotated[str | None, typer.Option(
        "--format", "-f", help="dlrm, criteo or columnar (default: from the file).")] = None,
    hash_size: Annotated[str | None, typer.Option(
        help="Rows per table: N, or COL=N,... (criteo/columnar), or both.")] = None,
    table_file: Annotated[Path | None, typer.Option(
        help="DLRM: table file giving names, hash sizes and dims, in trace order.")] = None,
    columns: Annotated[str | None, typer.Option(
        help="Comma-separated categorical columns (criteo/columnar).")] = None,
    dim: Annotated[int, ranged(Range(1, MAX_DIM, integer=True),
                               "Embedding dim when no table file gives it.")] = 64,
    report: Annotated[Path | None, typer.Option(
        help="Also write per-table details (expected rows used, reuse) as JSON.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Measure per-table statistics of lookup data and write a table file."""
    from autoshard.stats import profile_file
    from autoshard.stats.profile import merged_reuse
    from autoshard.tables import load_tables, save_tables

    check_output_path(output)
    if report is not None:
        check_output_path(report)
    check_distinct_outputs({"--output": output, "--report": report})
    given = load_tables(table_file) if table_file is not None else None
    names = [t.name for t in given] if given else None
    with progress_bar(f"profiling {input_file.name}", None) as advance:
        profiles = profile_file(input_file, fmt, hash_size,
                                hash_sizes=[t.rows for t in given] if given else None,
                                names=names, progress=advance,
                                columns=columns.split(",") if columns else None)
    tables = _measured_tables(profiles, given, dim, str(input_file))
    summaries = [p.summary() for p in profiles]
    rows_hist, lookups_hist = merged_reuse(profiles)
    if report is not None:
        from autoshard.fileio import write_structured

        write_structured(report, {
            "input": str(input_file), "tables": summaries,
            "reuse": [{"table": p.name, "rows": p.reuse_rows.round(6).tolist(),
                       "lookups": p.reuse_lookups.round(6).tolist()} for p in profiles],
            "merged_reuse": {"rows": rows_hist.round(6).tolist(),
                             "lookups": lookups_hist.round(6).tolist()}})
    save_tables(output, tables)
    if json_out:
        print_json({"output": str(output), "tables": summaries})
        return
    _show_profiles(summaries)
    console.print(f"profiled {len(tables)} tables, "
                  f"{sum(p.lookups for p in profiles):,} lookups; wrote {output}")


def _measured_tables(profiles: list[TableProfile], given: tuple[Table, ...] | None, dim: int,
                     source: str) -> list[Table]:
    """Tables with the measured statistics; a table never looked up keeps its given entry."""
    out = []
    for i, p in enumerate(profiles):
        if p.lookups:
            out.append(p.to_table(given[i].dim if given else dim))
        elif given:
            console.print(f"[yellow]warning:[/] {p.name} has no lookups; kept as given")
            out.append(given[i])
        else:
            raise InputError("table has no lookups (give a table file, or leave the column out "
                             "with --columns)", source=source, field=p.name, value=0)
    return out


def _show_profiles(summaries: list[dict[str, float | int | str]]) -> None:
    view = RichTable("table", "rows", "lookups", "pooling", "coverage", "rows used",
                     "expected used")
    for s in summaries[:40]:
        view.add_row(str(s["name"]), f"{s['rows']:,}", f"{s['lookups']:,}",
                     f"{s['pooling_factor']:.2f}", f"{s['coverage']:.3f}",
                     f"{s['rows_used']:,}", f"{s['expected_rows_used']:,.0f}")
    console.print(view)
    if len(summaries) > 40:
        console.print(f"... {len(summaries) - 40} more tables")


@app.command()
def synth(
    output: OutputOpt = Path("trace.pt"),
    tables: Annotated[int, ranged(TRACE_SIZE, "Number of tables (tables x --batch-size at "
                                  "most the same).", "--tables")] = 856,
    batch_size: Annotated[int, ranged(TRACE_SIZE, "Samples in the batch.")] = 4096,
    seed: SeedOpt = 0,
    table_file: Annotated[Path | None, typer.Option(
        help="Also write the tables with statistics measured on the trace.")] = None,
) -> None:
    """Generate a synthetic DLRM-like trace in Meta's format (.pt, or .pt.gz gzipped)."""
    from autoshard.stats.profile import profile_table
    from autoshard.stats.readers_dlrm import save_trace
    from autoshard.synth import draw_tables, generate_trace
    from autoshard.tables import save_tables

    check_trace_size(tables, batch_size)
    check_output_path(output)
    if table_file is not None:
        check_output_path(table_file)
    check_distinct_outputs({"--output": output, "--table-file": table_file})
    specs = draw_tables(tables, seed)
    indices, offsets, lengths = generate_trace(specs, batch_size, seed)
    save_trace(output, indices, offsets, lengths)
    if table_file is not None:
        measured = []
        for t, spec in enumerate(specs):
            part = indices[offsets[t * batch_size]:offsets[(t + 1) * batch_size]]
            stats = profile_table(spec.name, part, lengths[t], spec.rows)
            measured.append(stats.to_table(spec.dim) if stats.lookups else spec.to_table())
        save_tables(table_file, measured)
    console.print(f"wrote {output}: {tables} tables x {batch_size} samples, "
                  f"{indices.size:,} lookups" + (f"; tables in {table_file}" if table_file
                                                else ""))


@app.command()
def calibrate(
    reference: Annotated[Path, typer.Option(
        help="Meta's locality stats (the first entry is the target).")] = Path(
        "../shared/data/dlrm_locality_stats_2021.txt"),
    out: Annotated[Path, typer.Option(help="Folder for the results.")] = Path(
        "results/calibration"),
    fit: Annotated[bool, typer.Option(
        help="Refit the generator's distributions (else check the built-in ones).")] = False,
    write_default: Annotated[bool, typer.Option(
        help="Write the measured tables as the package's default workload.")] = False,
    seed: SeedOpt = 0,
) -> None:
    """Fit/check the synthetic generator against Meta's reuse histograms; write results."""
    from autoshard.stats.calibration_report import run_calibration

    check_output_path(out / "calibration.json")
    summary = run_calibration(reference, out, fit=fit, write_default=write_default, seed=seed,
                              progress=progress_bar, log=console.print)
    console.print(f"distance (max |CDF difference|): distinct rows {summary['rows']:.4f}, "
                  f"lookups {summary['lookups']:.4f}; wrote {out}")
