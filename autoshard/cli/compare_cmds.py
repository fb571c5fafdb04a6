"""The comparison harness command."""

from __future__ import annotations

import math
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from autoshard.cli.app import app
from autoshard.cli.common import (
    CostModelOpt,
    OptOpt,
    SeedOpt,
    TimeLimitOpt,
    console,
    options_named,
    parse_opts,
)
from autoshard.compare.harness import (
    CompareRow,
    check_outputs,
    read_rows,
    run_suite,
    sharder_options,
)
from autoshard.compare.report import (
    reasons,
    reused_lines,
    suite_markdown,
    summarize,
    summary_table,
    write_plots,
)
from autoshard.compare.suites import SUITES, get_suite
from autoshard.errors import InputError
from autoshard.extras import require
from autoshard.fileio import atomic_write_text, read_structured
from autoshard.limits import names_in
from autoshard.machine import describe_machine
from autoshard.pricing.cost import load_cost_model, model_identity
from autoshard.sharders import sharder_names
from autoshard.tracking import Tracker, run_name

#: Where results go unless --out says otherwise: a scratch folder, never the committed results.
DEFAULT_OUT = Path("runs/compare")


@app.command()
def compare(
    suite: Annotated[str, typer.Option(help=f"Suite: {', '.join(SUITES)}.")] = "tiny",
    cost_model: CostModelOpt = "analytical",
    sharders: Annotated[str | None, typer.Option(
        help="Comma-separated sharder names (default: every registered sharder).")] = None,
    out: Annotated[Path, typer.Option(
        help="Results folder. The committed results are written only when named: --out "
             "results/compare.")] = DEFAULT_OUT,
    reuse: Annotated[Path | None, typer.Option(
        help="Also reuse this run's rows from this results folder (e.g. results/compare), "
             "copied into --out marked reused with their machine and date; nothing is "
             "written there.")] = None,
    time_limit: TimeLimitOpt = 60.0,
    seed: SeedOpt = 0,
    fresh: Annotated[bool, typer.Option(
        help="Recompute the selected sharders' rows instead of resuming.")] = False,
    opt: OptOpt = None,
    wandb_mode: Annotated[str, typer.Option(
        help="W&B tracking: offline (default, no account; saved under runs/wandb), online or "
             "disabled.")] = "offline",
    torchrec: Annotated[bool, typer.Option(
        "--torchrec", help="Also price every plan with TorchRec's estimators, as planned and "
        "as exported (fitted to TorchRec's HBM count): <suite>.torchrec.csv/.md; saves the "
        "plans under <suite>.plans/ (needs the torchrec extra).")] = False,
) -> None:
    """Run every registered sharder on a suite of tasks; write CSV, Markdown and plots.

    Rows already in the results folder (or in --reuse) are reused only when made with the same
    cost model (folder and digest) and the same sharder options, and every figure is finite;
    each reused row is marked with its machine and date. --seed and --time-limit go to every
    sharder that takes them; --opt SHARDER.KEY=VALUE to one sharder (KEY=VALUE: to all of
    them), checked strictly. A file in --out that the harness did not write is never replaced.
    """
    specs = get_suite(suite)
    names = _sharder_list(sharders)
    given = _given_options(names, time_limit, seed, opt)
    _check_folders(out, reuse, suite)
    require("matplotlib", "plots")
    model = load_cost_model(cost_model)
    model_id = model_identity(cost_model)
    tracker = Tracker(wandb_mode, Path("runs"), run_name(f"compare-{suite}", seed), dict(
        suite=suite, cost_model=model.name, cost_model_id=model_id, sharders=names,
        time_limit=time_limit, seed=seed, options=given, reuse=reuse and str(reuse)),
        job_type="compare")
    start = time.perf_counter()
    console.print(f"suite {suite}: {len(specs)} task(s) x {len(names)} sharder(s)")
    with options_named():
        run_suite(suite, specs, model, out, names, {"seed": seed, "time_limit": time_limit},
                  on_row=_show_row, fresh=fresh, given=given, cost_model_id=model_id,
                  save_plans=torchrec, reuse=reuse, on_note=_show_note)
    rows = [r for r in read_rows(out / f"{suite}.csv") if r.cost_model_id == model_id]
    plots = _write_reports(suite, out, model.name, rows, time.perf_counter() - start)
    if torchrec:
        _torchrec_opinions(suite, specs, out, names, model, fresh, rows)
    if tracker.enabled:
        _log_wandb(tracker, rows, plots)


def _given_options(names: list[str], time_limit: float, seed: int, opt: list[str] | None
                   ) -> dict[str, dict[str, Any]]:
    """The --opt options per sharder, checked strictly with --time-limit and --seed."""
    if not (math.isfinite(time_limit) and time_limit > 0):
        raise InputError("must be > 0", source="command line", field="--time-limit",
                         value=time_limit)
    given = parse_opts(opt, names)
    with options_named(sharder_options=True):
        sharder_options(names, {"seed": seed, "time_limit": time_limit}, given)
    return given


def _check_folders(out: Path, reuse: Path | None, suite: str) -> None:
    """Fails before any work when a file the run would replace in ``out``, or the CSV it would
    reuse from ``reuse``, is not the harness's."""
    check_outputs(out, suite)
    if reuse is not None:
        if not (reuse / f"{suite}.csv").is_file():
            raise InputError(f"no {suite}.csv there: no rows of suite '{suite}' to reuse",
                             source="command line", field="--reuse", value=str(reuse))
        check_outputs(reuse, suite)


def _write_reports(suite: str, out: Path, model: str, rows: list[CompareRow],
                   seconds: float) -> list[Path]:
    """Writes the Markdown report and the plots, prints the summary; returns the plots."""
    breakdown = read_structured(out / f"{suite}.devices.json") if (
        out / f"{suite}.devices.json").is_file() else {}
    plots = write_plots(rows, breakdown, out, suite)
    command = "autoshard " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    md = suite_markdown(suite, command, describe_machine(), model, rows, seconds)
    atomic_write_text(out / f"{suite}.md", md)
    summaries = summarize(rows)
    _print_whole(summary_table(summaries, title=f"suite {suite}, cost model {model}"))
    for line in reasons(summaries) + reused_lines(rows):
        console.print(line, markup=False, highlight=False)
    console.print(f"wrote {out / (suite + '.csv')}, {out / (suite + '.md')}, "
                  + ", ".join(str(p) for p in plots), markup=False, highlight=False)
    return plots


def _print_whole(table: Any) -> None:
    """Prints a rich table at its natural width, wider than the terminal (or than 80 columns
    when printing to a file) if need be: rich would otherwise cut figures or drop columns."""
    from rich.console import Console
    from rich.measure import Measurement

    width = Measurement.get(console, console.options.update_width(10_000), table).maximum
    (console if width <= console.width else Console(width=width)).print(table)


def _show_row(row: CompareRow) -> None:
    ratio = "" if row.status != "ok" else f"cost/bound {row.cost_ratio:.3f}"
    where = f" (reused: {row.provenance()})" if row.reused else ""
    console.print(f"  {row.task:<18} {row.sharder:<20} {row.status:<8} {ratio} "
                  f"{row.reason[:80]}{where}", markup=False, highlight=False)


def _show_note(note: str) -> None:
    console.print(f"  {note}", markup=False, highlight=False)


def _torchrec_opinions(suite: str, specs: Any, out: Path, names: list[str], model: Any,
                       fresh: bool, rows: list[CompareRow]) -> None:
    """TorchRec's estimators on every saved plan of the suite; says which rows (reused ones)
    have no plan to price."""
    from autoshard.torchrec.opinion import opinions_markdown, run_opinions

    unplanned = [r for r in rows if r.status == "ok" and r.sharder in names and not (
        out / f"{suite}.plans" / r.task / f"{r.sharder}.json").is_file()]

    path = out / f"{suite}.torchrec.csv"
    if fresh and path.is_file():
        path.unlink()
    opinions = run_opinions(suite, specs, out, names, model)
    command = "autoshard " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    md = (f"# TorchRec's estimators on suite `{suite}`\n\nCommand: `{command}`  \n"
          f"Machine: {describe_machine()}; torchrec 1.8.0 planner estimators (CPU, simulated "
          f"topology of the same hardware)\n\n{opinions_markdown(opinions)}")
    atomic_write_text(out / f"{suite}.torchrec.md", md)
    console.print(opinions_markdown(opinions).splitlines()[-1])
    console.print(f"wrote {path}, {out / (suite + '.torchrec.md')}")
    if unplanned:
        console.print(f"{len(unplanned)} reused row(s) have no saved plan, so TorchRec's "
                      "estimators did not price them (--fresh plans them again)")


def _sharder_list(spec: str | None) -> list[str]:
    """The sharders ``--sharders`` names (every registered one when it is not given)."""
    return names_in(spec, sharder_names(), "--sharders", "sharder", "command line")


def _log_wandb(tracker: Tracker, rows: list[CompareRow], plots: list[Path]) -> None:
    from dataclasses import asdict

    columns = list(asdict(rows[0])) if rows else []
    tracker.table("compare/rows", columns, [list(asdict(r).values()) for r in rows])
    for path in plots:
        tracker.image(f"compare/{path.stem}", path)
    tracker.summary({f"{s.sharder}/mean_cost_ratio": s.mean_cost_ratio
                     for s in summarize(rows) if s.ok})
    tracker.finish()
