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
from autoshard.cli.common import CostModelOpt, OptOpt, console, options_named, parse_opts
from autoshard.compare import CompareRow, model_identity, read_rows, run_suite, sharder_options
from autoshard.compare_report import markdown_table, summarize, write_plots
from autoshard.cost import load_cost_model
from autoshard.errors import InputError
from autoshard.fileio import atomic_write_text, read_structured
from autoshard.machine import describe_machine
from autoshard.sharders import sharder_names
from autoshard.suites import SUITES, get_suite
from autoshard.tracking import Tracker, run_name


@app.command()
def compare(
    suite: Annotated[str, typer.Option(help=f"Suite: {', '.join(SUITES)}.")] = "tiny",
    cost_model: CostModelOpt = "analytical",
    sharders: Annotated[str | None, typer.Option(
        help="Comma-separated sharder names (default: every registered sharder).")] = None,
    out: Annotated[Path, typer.Option(help="Results folder.")] = Path("results/compare"),
    time_limit: Annotated[float, typer.Option(
        help="Time limit per plan for sharders that take one (s).")] = 60.0,
    seed: Annotated[int, typer.Option(help="Seed for randomised sharders.")] = 0,
    fresh: Annotated[bool, typer.Option(
        help="Recompute the selected sharders' rows instead of resuming.")] = False,
    opt: OptOpt = None,
    wandb_mode: Annotated[str, typer.Option(
        help="W&B tracking: offline (default, no account), online or disabled.")] = "offline",
    torchrec: Annotated[bool, typer.Option(
        "--torchrec", help="Also price every plan with TorchRec's estimators, as planned and "
        "as exported (fitted to TorchRec's HBM count): <suite>.torchrec.csv/.md; saves the "
        "plans under <suite>.plans/ (needs the torchrec extra).")] = False,
) -> None:
    """Run every registered sharder on a suite of tasks; write CSV, Markdown and plots.

    Rows already in the results folder are reused only when made with the same cost model
    (folder and digest) and the same sharder options. --seed and --time-limit go to every
    sharder that takes them; --opt SHARDER.KEY=VALUE to one sharder (KEY=VALUE: to all of
    them), checked strictly.
    """
    specs = get_suite(suite)
    names = _sharder_list(sharders)
    if not (math.isfinite(time_limit) and time_limit > 0):
        raise InputError("must be > 0", source="command line", field="--time-limit",
                         value=time_limit)
    given = parse_opts(opt, names)
    with options_named(sharder_options=True):
        sharder_options(names, {"seed": seed, "time_limit": time_limit}, given)
    model = load_cost_model(cost_model)
    model_id = model_identity(cost_model)
    tracker = Tracker(wandb_mode, Path("runs"), run_name(f"compare-{suite}", seed),
                      {"suite": suite, "cost_model": model.name, "cost_model_id": model_id,
                       "sharders": names, "time_limit": time_limit, "seed": seed,
                       "options": given}, job_type="compare")
    start = time.perf_counter()
    console.print(f"suite {suite}: {len(specs)} task(s) x {len(names)} sharder(s)")
    rows = run_suite(suite, specs, model, out, names,
                     {"seed": seed, "time_limit": time_limit}, on_row=_show_row, fresh=fresh,
                     given=given, cost_model_id=model_id, save_plans=torchrec)
    rows = [r for r in read_rows(out / f"{suite}.csv") if r.cost_model_id == model_id]
    breakdown = read_structured(out / f"{suite}.devices.json") if (
        out / f"{suite}.devices.json").is_file() else {}
    plots = write_plots(rows, breakdown, out, suite)
    table = markdown_table(summarize(rows))
    md = _markdown(suite, model.name, table, rows, time.perf_counter() - start)
    atomic_write_text(out / f"{suite}.md", md)
    console.print(table)
    console.print(f"wrote {out / (suite + '.csv')}, {out / (suite + '.md')}, "
                  + ", ".join(str(p) for p in plots))
    if torchrec:
        _torchrec_opinions(suite, specs, out, names, model, fresh)
    if tracker.enabled:
        _log_wandb(tracker, rows, plots)


def _show_row(row: CompareRow) -> None:
    ratio = "" if row.status != "ok" else f"cost/bound {row.cost_ratio:.3f}"
    console.print(f"  {row.task:<18} {row.sharder:<20} {row.status:<8} {ratio} "
                  f"{row.reason[:80]}", markup=False, highlight=False)


def _torchrec_opinions(suite: str, specs: Any, out: Path, names: list[str], model: Any,
                       fresh: bool) -> None:
    from autoshard.torchrec.opinion import opinions_markdown, run_opinions

    path = out / f"{suite}.torchrec.csv"
    if fresh and path.is_file():
        path.unlink()
    rows = run_opinions(suite, specs, out, names, model)
    command = "autoshard " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    md = (f"# TorchRec's estimators on suite `{suite}`\n\nCommand: `{command}`  \n"
          f"Machine: {describe_machine()}; torchrec 1.8.0 planner estimators (CPU, simulated "
          f"topology of the same hardware)\n\n{opinions_markdown(rows)}")
    atomic_write_text(out / f"{suite}.torchrec.md", md)
    console.print(opinions_markdown(rows).splitlines()[-1])
    console.print(f"wrote {path}, {out / (suite + '.torchrec.md')}")


def _sharder_list(spec: str | None) -> list[str]:
    known = sharder_names()
    if not spec:
        return known
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for name in names:
        if name not in known:
            raise InputError(f"unknown sharder (known: {', '.join(known)})", field="sharders",
                             value=name)
    return names


def _markdown(suite: str, model: str, table: str, rows: list[CompareRow], seconds: float) -> str:
    command = "autoshard " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    tasks = sorted({r.task for r in rows})
    names = list(dict.fromkeys(r.sharder for r in rows))
    cell = {(r.task, r.sharder): (f"{r.cost_ratio:.3f}" if r.status == "ok" else r.status)
            for r in rows}
    per_task = ["| task | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    per_task += [f"| {t} | " + " | ".join(cell.get((t, n), "") for n in names) + " |"
                 for t in tasks]
    found = [f"| {r.task} | {r.sharder} | {r.found_by} |" for r in rows if r.found_by]
    how = ("\n## How the plans were found\n\nThe winning candidate of each sharder that "
           "weighs several (its source: the learned policy, the policy over a split of the "
           "dominant tables, a rival sharder, the MILP) and what each search step took off "
           "its step cost.\n\n| task | sharder | found by |\n|---|---|---|\n"
           + "\n".join(found) + "\n") if found else ""
    return (f"# Comparison: suite `{suite}`\n\nCommand: `{command}`  \n"
            f"Machine: {describe_machine()}  \nCost model: {model}; this run took "
            f"{seconds:.1f} s (rows kept from earlier runs are not re-timed).\n\n"
            f"## Per sharder\n\n{table}\n## Step cost / lower bound per task\n\n"
            + "\n".join(per_task) + "\n" + how)


def _log_wandb(tracker: Tracker, rows: list[CompareRow], plots: list[Path]) -> None:
    from dataclasses import asdict

    columns = list(asdict(rows[0])) if rows else []
    tracker.table("compare/rows", columns, [list(asdict(r).values()) for r in rows])
    for path in plots:
        tracker.image(f"compare/{path.stem}", path)
    tracker.summary({f"{s.sharder}/mean_cost_ratio": s.mean_cost_ratio
                     for s in summarize(rows) if s.ok})
    tracker.finish()
