"""Data commands: profile lookup data into a table file, synthesise traces, calibrate."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table as RichTable
from rich.text import Text

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
from autoshard.extras import require
from autoshard.fileio import check_distinct_outputs
from autoshard.limits import MAX_DIM, TRACE_SIZE, Range, one_of
from autoshard.stats.engine import EngineOptions
from autoshard.stats.readers import reader_names
from autoshard.stats.scan import JOBS, MEMORY_GB, PIECE_MB, ScanOptions

if TYPE_CHECKING:
    from autoshard.stats.partial import PartialProfile
    from autoshard.stats.table_stats import TableProfile
    from autoshard.tables import Table

OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="File to write.")]
#: Where Meta's locality statistics come from (public data, MIT licence).
LOCALITY_STATS = ("embedding_bag/2021/locality_stats.txt of github.com/facebookresearch/"
                  "dlrm_datasets (MIT licence), saved as a file: --reference FILE")


@contextlib.contextmanager
def progress_bar(label: str, total: float | None) -> Iterator[Callable[[float], None]]:
    """A rich progress bar; yields a function that advances it."""
    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed:,.0f}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.advance(task, done)


class _LookupRate(ProgressColumn):
    """Lookups counted per second so far (the task's ``lookups`` field over its elapsed time)."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        rate = task.fields.get("lookups", 0) / elapsed if elapsed > 0 else 0.0
        return Text(f"{rate / 1e6:,.1f} M lookups/s")


@contextlib.contextmanager
def bytes_bar(label: str, total: int) -> Iterator[Callable[[int, int], None]]:
    """A progress bar over input bytes showing bytes and lookups per second; yields a function
    taking (bytes, lookups) done."""
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), _LookupRate(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=total, lookups=0)

        def advance(nbytes: int, lookups: int) -> None:
            done = bar.tasks[task].fields["lookups"] + lookups
            bar.update(task, advance=nbytes, lookups=done)

        yield advance


#: ``profile merge``'s word: ``autoshard profile merge A B`` merges partial profiles.
MERGE = "merge"
MemoryOpt = Annotated[float, ranged(MEMORY_GB, "Memory per process for exact per-row counts, "
                                    "GB; larger tables are counted by sketches, each with its "
                                    "stated error.")]
JobsOpt = Annotated[int, ranged(JOBS, "Processes (or local Dask workers); 0: one per core.")]
EngineOpt = Annotated[str, typer.Option(
    help="local (this machine's processes) or dask (a Dask cluster).")]
AddressOpt = Annotated[str | None, typer.Option(
    help="Dask scheduler address (tcp://host:8786); none: a local cluster of --jobs workers. "
    "Workers must see the inputs at the same paths.")]
SavePartialOpt = Annotated[Path | None, typer.Option(
    help="Also save the counts as a partial profile (.npz) for `profile merge`.")]
PartsOpt = Annotated[Path | None, typer.Option(
    help="Folder for finished pieces, from which an interrupted run resumes (default "
    "runs/profile-parts/RUN).")]
KeepPartsOpt = Annotated[bool, typer.Option(help="Keep the finished pieces after the run.")]
PieceOpt = Annotated[float, ranged(PIECE_MB, "Input per piece of work, MB.")]


@app.command()
def profile(
    inputs: Annotated[list[str], typer.Argument(
        metavar="INPUT...", help="Trace or data files, folders or (quoted) globs; or `merge` "
        "then partial profiles (.npz) to merge (a file named merge: ./merge).")],
    output: OutputOpt = Path("runs/tables.json"),
    fmt: Annotated[str | None, typer.Option(
        "--format", "-f", help=f"{', '.join(reader_names())} (default: from each file).")
    ] = None,
    hash_size: Annotated[str | None, typer.Option(
        help="Rows per table: N, or COL=N,... per column, or both (a DLRM trace: N).")] = None,
    table_file: Annotated[Path | None, typer.Option(
        help="DLRM: table file giving names, hash sizes and dims, in trace order.")] = None,
    columns: Annotated[str | None, typer.Option(
        help="Comma-separated categorical columns (features) to profile; default: all "
        "(Criteo: C1-C26).")] = None,
    dim: Annotated[int, ranged(Range(1, MAX_DIM, integer=True),
                               "Embedding dim when no table file gives it.")] = 64,
    report: Annotated[Path | None, typer.Option(
        help="Also write per-table details (expected rows used, reuse) as JSON.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    memory_gb: MemoryOpt = 8.0,
    jobs: JobsOpt = 0,
    engine: EngineOpt = "local",
    address: AddressOpt = None,
    save_partial: SavePartialOpt = None,
    parts: PartsOpt = None,
    keep_parts: KeepPartsOpt = False,
    piece_mb: PieceOpt = 256.0,
) -> None:
    """Measure per-table statistics of lookup data (files, folders, globs) and write a table
    file; `profile merge PARTIAL...` merges saved partial profiles instead."""
    from autoshard.stats.engine import ENGINES
    from autoshard.tables import load_tables

    outputs = {"--output": output, "--report": report, "--save-partial": save_partial}
    for path in outputs.values():
        if path is not None:
            check_output_path(path)
    check_distinct_outputs(outputs)
    one_of(engine, ENGINES, "--engine", "command line")
    given = load_tables(table_file) if table_file is not None else None
    if inputs and inputs[0] == MERGE:
        _refuse_scan_options({"--format": fmt, "--hash-size": hash_size, "--columns": columns,
                              "--engine": None if engine == "local" else engine,
                              "--address": address, "--parts": parts})
        merged = _merge_partials(inputs[1:])
    else:
        merged = _scan_inputs(inputs, ScanOptions(
            fmt=fmt, hash_size=hash_size,
            hash_sizes=tuple(t.rows for t in given) if given else None,
            names=tuple(t.name for t in given) if given else None,
            columns=tuple(columns.split(",")) if columns else None,
            memory_bytes=int(memory_gb * 1e9), piece_bytes=int(piece_mb * 1e6)),
            EngineOptions(engine, jobs or os.cpu_count() or 1, address, parts, keep_parts))
    if save_partial is not None:
        merged.save(save_partial)
    _write_profile(merged.profiles(), given, dim, output, report, json_out,
                   [p.path for p in merged.pieces])


def _refuse_scan_options(given: dict[str, object]) -> None:
    for option, value in given.items():
        if value is not None:
            raise InputError("not used by `profile merge` (the partial profiles say how they "
                             "were counted)", source="command line", field=option, value=value)


def _merge_partials(paths: list[str]) -> PartialProfile:
    from autoshard.stats.partial import load_partial, merge_partials

    if not paths:
        raise InputError("name the partial profiles to merge", source="command line",
                         field="PARTIAL")
    return merge_partials([(load_partial(p), p) for p in paths])


def _scan_inputs(inputs: list[str], scan: ScanOptions, run: EngineOptions) -> PartialProfile:
    """Plans the pieces of the inputs, counts them with the engine chosen, and merges them."""
    from autoshard.stats.engine import run_plan
    from autoshard.stats.inputs import expand_inputs
    from autoshard.stats.scan import plan_scan

    plan = plan_scan(expand_inputs(inputs), scan)
    if len(plan.pieces) > 1 or run.engine != "local":
        folder = run.parts or Path("runs/profile-parts") / plan.digest
        run = dataclasses.replace(run, parts=folder)
    else:
        run = dataclasses.replace(run, parts=None)
    label = Path(inputs[0]).name if len(inputs) == 1 else f"{len(plan.files)} files"
    total = sum(p.nbytes for p in plan.pieces)
    with bytes_bar(f"profiling {label}", total) as advance:
        merged = run_plan(plan, run, advance, log=console.print)
    return merged


def _write_profile(profiles: list[TableProfile], given: tuple[Table, ...] | None, dim: int,
                   output: Path, report: Path | None, json_out: bool,
                   inputs: list[str]) -> None:
    """Writes the table file (and the report) and shows the summary."""
    from autoshard.fileio import write_structured
    from autoshard.stats.table_stats import merged_reuse
    from autoshard.tables import save_tables

    tables = _measured_tables(profiles, given, dim, inputs[0] if len(inputs) == 1
                              else f"{len(set(inputs))} inputs")
    summaries = [p.summary() for p in profiles]
    rows_hist, lookups_hist = merged_reuse(profiles)
    if report is not None:
        write_structured(report, {
            "inputs": sorted(set(inputs)), "tables": summaries,
            "reuse": [{"table": p.name, "rows": p.reuse_rows.round(6).tolist(),
                       "lookups": p.reuse_lookups.round(6).tolist()} for p in profiles],
            "merged_reuse": {"rows": rows_hist.round(6).tolist(),
                             "lookups": lookups_hist.round(6).tolist()}})
    save_tables(output, tables)
    if json_out:
        print_json({"output": str(output), "tables": summaries})
        return
    _show_profiles(summaries)
    for p in profiles:
        if p.error is not None:
            console.print(f"{p.name}: counted by sketches (its exact counts exceed "
                          f"--memory-gb): rows used within {p.error.distinct_rows:,.0f}, "
                          f"lookup shares within {p.error.lookup_share:.4f} (95%)")
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
    output: OutputOpt = Path("runs/trace.pt"),
    tables: Annotated[int, ranged(TRACE_SIZE, "Number of tables (tables x --batch-size at "
                                  "most the same).", "--tables")] = 856,
    batch_size: Annotated[int, ranged(TRACE_SIZE, "Samples in the batch.")] = 4096,
    seed: SeedOpt = 0,
    table_file: Annotated[Path | None, typer.Option(
        help="Also write the tables with statistics measured on the trace.")] = None,
) -> None:
    """Generate a synthetic DLRM-like trace in Meta's format (.pt, or .pt.gz gzipped)."""
    from autoshard.stats.readers.dlrm import save_trace
    from autoshard.stats.table_stats import profile_table
    from autoshard.synth import draw_tables, generate_trace
    from autoshard.tables import save_tables

    require("torch", "data")  # the trace is a torch file
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
    reference: Annotated[Path | None, typer.Option(
        help="Meta's locality statistics of its open DLRM traces (the first entry is the "
        f"target): {LOCALITY_STATS}.")] = None,
    out: Annotated[Path, typer.Option(help="Folder for the results.")] = Path(
        "runs/calibration"),
    fit: Annotated[bool, typer.Option(
        help="Refit the generator's distributions (else check the built-in ones).")] = False,
    write_default: Annotated[bool, typer.Option(
        help="Write the measured tables as the package's default workload.")] = False,
    seed: SeedOpt = 0,
) -> None:
    """Fit/check the synthetic generator against Meta's reuse histograms; write results."""
    from autoshard.stats.calibration_report import run_calibration

    if reference is None or not reference.is_file():
        raise InputError(("no such file; " if reference is not None else "") +
                         f"give Meta's locality statistics, {LOCALITY_STATS}",
                         source="command line", field="--reference",
                         value=None if reference is None else str(reference))
    check_output_path(out / "calibration.json")
    require("matplotlib", "plots")
    summary = run_calibration(reference, out, fit=fit, write_default=write_default, seed=seed,
                              progress=progress_bar, log=console.print)
    console.print(f"distance (max |CDF difference|): distinct rows {summary['rows']:.4f}, "
                  f"lookups {summary['lookups']:.4f}; wrote {out}")
