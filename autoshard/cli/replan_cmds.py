"""Re-planning commands: diff (what moves between two plans, priced), replan (plan again from
the plan in use, within a move budget), drift (a plan on the next day's statistics, and what
re-planning buys) and reshard (a TorchRec model re-sharded in place from one plan to the other
on local ranks, checked)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table as RichTable

from autoshard import planning
from autoshard.cli.app import app
from autoshard.cli.common import (
    BatchOpt,
    DevicesOpt,
    HbmOpt,
    JsonOpt,
    ModeOpt,
    NodesOpt,
    OptOpt,
    SeedOpt,
    SharderOpt,
    TimeLimitOpt,
    check_output_path,
    console,
    options_named,
    print_json,
    ranged,
)
from autoshard.cli.context import (
    Given,
    PlanCostModelOpt,
    PlanHardwareOpt,
    PlanOverheadOpt,
    PlanTablesOpt,
    plan_task,
)
from autoshard.cli.core_cmds import sharder_options, show_planned
from autoshard.cli.placement_view import View
from autoshard.errors import PlannerError
from autoshard.layout.plan import Plan
from autoshard.layout.plan_context import PlanContext
from autoshard.limits import MAX_BATCH_SIZE, TIME_LIMIT_S, Range
from autoshard.pricing.cost import load_cost_model, model_identity
from autoshard.pricing.evaluator import evaluate
from autoshard.replan.budget import MoveBudget, get_move_rules, move_rules_names
from autoshard.replan.diff import MoveReport, PlanDiff, diff_plans, link_label, payback_words
from autoshard.sharders import get_sharder
from autoshard.task import ShardingTask

#: Steps until the next re-plan (``--horizon``).
HORIZON = Range(1, 1e12)
#: Batch and training steps of ``reshard``.
BATCH = Range(1, MAX_BATCH_SIZE, integer=True)
STEPS = Range(0, 1000, integer=True)

MoveBudgetOpt = Annotated[str, typer.Option(
    "--move-budget", help="What the re-plan may copy from the plan in use: a share of the "
    "tables' bytes (10%), bytes (2.5GB, 500MB, 1e9), seconds at the hardware's bandwidths "
    "(30s), or none. Copies: weights and optimizer state sent to another device, and rows "
    "moved between a device's host memory and HBM.")]
HorizonOpt = Annotated[float | None, ranged(
    HORIZON, "Steps until the next re-plan: each copy is priced at its transfer time over "
    "them, so that a move is made only where it wins its time back within them (default: "
    "copies within the budget are free).", "--horizon")]
RulesOpt = Annotated[str, typer.Option(
    "--rules", help=f"Which moves the runtime can make: {', '.join(move_rules_names())} "
    "(torchrec: those TorchRec's reshard makes in place, docs/replan.md).")]


@app.command("diff")
def diff_cmd(
    old: Annotated[Path, typer.Argument(help="The plan in use.")],
    new: Annotated[Path, typer.Argument(help="The new plan, priced on its own context.")],
    every: Annotated[bool, typer.Option("--all", help="List every changed table (default: "
                                        "the 20 that copy most).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """List what moves from OLD to NEW (tables, shards, HBM rows) and price the move on NEW's
    hardware: bytes of weights and optimizer state per link, the time at the profile's
    bandwidths, and the step cost before and after on NEW's statistics."""
    before, after = Plan.load(old), Plan.load(new)
    priced = plan_task(after, new, Given())
    with options_named():
        model = load_cost_model(priced.cost_model)
    found = diff_plans(before, after, priced.task, model)
    if json_out:
        print_json(found.to_dict())
        return
    _show_tables(found, every)
    show_moves(found.report, budget=False)


def _show_tables(found: PlanDiff, every: bool) -> None:
    """The changed tables, those that copy most first."""
    rows = sorted(found.tables, key=lambda t: -(t.network_bytes + t.host_bytes))
    shown = rows if every else rows[:20]
    table = RichTable(title=f"{len(rows)} table(s) changed" + (
        "" if len(shown) == len(rows) else f" (the {len(shown)} that copy most; --all lists "
        "every one)"))
    for col in ("table", "change", "devices\nfrom", "devices\nto", "HBM rows\nfrom",
                "HBM rows\nto", "sent\nMiB", "host-\nHBM MiB"):
        table.add_column(col, justify="right")
    for t in shown:
        table.add_row(t.table, t.change, t.before, t.after, _count(t.hbm_before),
                      _count(t.hbm_after), f"{t.network_bytes / 2**20:.2f}",
                      f"{t.host_bytes / 2**20:.2f}")
    console.print(table)


def _count(rows: int | None) -> str:
    """A row count, short: ``950``, ``12.5k``, ``2.19M``."""
    if rows is None:
        return "-"
    if rows >= 1_000_000:
        return f"{rows / 1e6:.2f}M"
    return f"{rows / 1e3:.1f}k" if rows >= 10_000 else str(rows)


def show_moves(report: MoveReport, budget: bool = True) -> None:
    """A move's price in a few lines (with its budget where ``budget``)."""
    gib = 2**30
    console.print(f"copies {report.copied_bytes / gib:.3f} GiB ({report.copied_share:.2%} of "
                  f"the tables' {report.total_bytes / gib:.2f} GiB): "
                  f"{report.tables_moved} table(s) moved, {report.tables_changed} changed "
                  f"in all" + (f"; budget {report.budget}" if budget else ""), markup=False)
    console.print("by link: " + "; ".join(
        f"{link_label(x.link)} {x.bytes / gib:.3f} GiB (weights {x.weight_bytes / gib:.3f}, "
        f"optimizer {x.optimizer_bytes / gib:.3f})" for x in report.links), markup=False)
    slowest = f", slowest device {report.slowest_device}" if report.slowest_device >= 0 else ""
    console.print(f"move time {report.seconds:.4f} s at the profile's bandwidths{slowest}; step "
                  f"cost {report.before_ms:.3f} ms before (the plan in use on these "
                  f"statistics), {report.after_ms:.3f} ms after: {payback_words(report)}",
                  markup=False)
    if report.budget_bound_ms is not None:
        console.print(f"no plan within the budget that keeps the plan in use's splits costs "
                      f"less than {report.budget_bound_ms:.3f} ms (the MILP's bound)",
                      markup=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False)


@app.command("replan")
def replan_cmd(
    previous: Annotated[Path, typer.Argument(help="The plan in use (from `autoshard plan`).")],
    tables: PlanTablesOpt = None,
    hardware: PlanHardwareOpt = None,
    devices: DevicesOpt = None,
    nodes: NodesOpt = None,
    hbm_gb: HbmOpt = None,
    batch_size: BatchOpt = None,
    mode: ModeOpt = None,
    overhead: PlanOverheadOpt = None,
    cost_model: PlanCostModelOpt = None,
    sharder: SharderOpt = "recshard",
    move_budget: MoveBudgetOpt = "none",
    horizon: HorizonOpt = None,
    rules: RulesOpt = "any",
    seed: SeedOpt = 0,
    time_limit: TimeLimitOpt = 60.0,
    opt: OptOpt = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Plan file to write.")] = Path(
        "runs/replan.json"),
    json_out: JsonOpt = False,
) -> None:
    """Plan again from the plan in use, on new statistics (--tables), tables or hardware (the
    plan's own context where not given), copying within --move-budget; write the new plan and
    print its cost and its move (bytes per link, time, payback in steps)."""
    check_output_path(output)
    budget = MoveBudget.parse(move_budget, horizon,
                              get_move_rules(rules, "--rules", "command line"))
    options = sharder_options(sharder, seed, time_limit, opt, None)
    old = Plan.load(previous)
    given = Given(tables, hardware, devices, nodes, hbm_gb, batch_size, mode, overhead,
                  cost_model)
    priced = plan_task(old, previous, given, reprice=True)
    with options_named():
        model = load_cost_model(priced.cost_model)
        chosen = get_sharder(sharder, **options)
    context = _context(old, priced.task, given, priced.cost_model)
    try:
        planned = planning.plan(priced.task, chosen, model, context=context, previous=old,
                                move_budget=budget)
    except PlannerError as exc:
        raise PlannerError(exc.kind, f"{previous}: {exc}") from exc
    planned.plan.save(output)
    if json_out:
        assert planned.moves is not None
        show_planned(planned, model, output, View(), True,
                     {"moves": planned.moves.to_dict()})
        return
    show_planned(planned, model, output, View(), False)
    assert planned.moves is not None
    show_moves(planned.moves)


def _context(old: Plan, task: ShardingTask, given: Given, cost_model: str) -> PlanContext | None:
    """The new plan's context: the tables and hardware as given, else as the plan in use
    records them."""
    recorded = old.context
    tables = given.tables or (recorded.tables if recorded is not None else None)
    if tables is None:
        return None
    spec: dict[str, Any] = dict(recorded.hardware_spec) if recorded is not None else {}
    if given.hardware is not None:
        spec = {"profile": given.hardware}
    spec.update({k: v for k, v in (("devices", given.devices), ("nodes", given.nodes),
                                   ("hbm_gb", given.hbm_gb)) if v is not None})
    inline = recorded is not None and recorded.inline_tables is not None and not given.tables
    return PlanContext.of(task, tables, spec, model_identity(cost_model), inline=inline)


@app.command("reshard")
def reshard_cmd(
    old: Annotated[Path, typer.Argument(help="The plan the model is sharded with.")],
    new: Annotated[Path, typer.Argument(help="The plan to re-shard it to (its tables, "
                                        "hardware and workload are those it records).")],
    batch_size: Annotated[int, ranged(BATCH, "Global samples per step.")] = 64,
    before: Annotated[int, ranged(STEPS, "Training steps before the re-shard.",
                                  "--steps-before")] = 2,
    after: Annotated[int, ranged(STEPS, "Training steps after it.", "--steps-after")] = 2,
    timeout: Annotated[float, ranged(TIME_LIMIT_S, "Seconds a rank may go without progress.",
                                     "--timeout")] = 120.0,
    logs: Annotated[Path | None, typer.Option(help="Folder for rank logs.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Re-shard TorchRec's DLRM over NEW's tables in place from OLD to NEW, on one local CPU
    process per device (gloo), with TorchRec's reshard; check that its outputs equal the
    unsharded model's before and after, that every table's optimizer state is carried, and
    that training on matches a model never re-sharded. Exit 1 when a check fails."""
    from autoshard.torchrec import torchrec_unavailable

    reason = torchrec_unavailable(load=True)
    if reason:
        raise PlannerError("unavailable", reason)
    from autoshard.torchrec.reshard import ReshardSettings, run_reshard

    before_plan, after_plan = Plan.load(old), Plan.load(new)
    task = plan_task(after_plan, new, Given()).task
    run = run_reshard(before_plan, after_plan, task,
                      ReshardSettings(batch_size, before, after, timeout), logs)
    if json_out:
        print_json(run.to_dict())
    else:
        console.print(f"moved {len(run.moved)} table(s) ({', '.join(run.moved[:8])}"
                      f"{' ...' if len(run.moved) > 8 else ''}), {run.volume_mib:.3f} MiB by "
                      "TorchRec's count", markup=False)
        for line in _checks(run):
            console.print(line, markup=False)
    if not run.ok:
        raise typer.Exit(1)


def _checks(run: Any) -> list[str]:
    """One line per check of a re-shard."""
    def mark(ok: bool) -> str:
        return "ok" if ok else "FAILED"

    return [f"{mark(run.sharded_equal)}: sharded outputs equal the unsharded model's before",
            f"{mark(run.resharded_equal)}: and after the re-shard",
            f"{mark(run.optimizer_carried)}: optimizer state carried "
            f"({run.optimizer_nonzero:,} nonzero entries)",
            f"{mark(run.control_equal)}: after {run.steps_after} more steps, outputs equal a "
            f"model never re-sharded (largest difference {run.control_max_abs_diff:.2g})",
            *(f"note: {n}" for n in run.notes),
            *([f"note: {len(run.kept_caches)} table(s) stay with their old cache (TorchRec "
               "re-shards moved tables only)"] if run.kept_caches else [])]


@app.command("drift")
def drift_cmd(
    previous: Annotated[Path, typer.Argument(help="The plan in use, made on day k's "
                                             "statistics (from `autoshard plan`).")],
    tables: Annotated[str, typer.Option("--tables", "-t", help="Day k+1's table file "
                                        "(`autoshard profile` writes one).")],
    sharder: SharderOpt = "recshard",
    budgets: Annotated[str, typer.Option(
        "--budgets", help="Comma-separated move budgets to re-plan within, each as "
        "--move-budget takes it.")] = "0,5%,10%,none",
    horizon: HorizonOpt = None,
    rules: RulesOpt = "any",
    seed: SeedOpt = 0,
    time_limit: TimeLimitOpt = 60.0,
    opt: OptOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Price a plan made on day k's statistics on day k+1's (--tables), beside a re-plan from
    scratch and re-plans from it within each budget: step cost, cost / bound, bytes copied,
    the move's time and its payback in steps."""
    from autoshard.replan.drift import drift

    chosen = get_move_rules(rules, "--rules", "command line")
    wanted = [MoveBudget.parse(b, horizon, chosen, "--budgets") for b in budgets.split(",")]
    options = sharder_options(sharder, seed, time_limit, opt, None)
    old = Plan.load(previous)
    priced = plan_task(old, previous, Given(tables=tables), reprice=True)
    with options_named():
        model = load_cost_model(priced.cost_model)
    before = None
    if old.context is not None:
        before = evaluate(old, old.context.task(str(previous)), model).step_cost_ms
    found = drift(old, priced.task, sharder, model, wanted, before, **options)
    if json_out:
        print_json(found.to_dict())
        return
    _show_drift(found)


def _show_drift(found: Any) -> None:
    table = RichTable(title=f"the plan in use on the new statistics, and {found.sharder}'s "
                      "re-plans")
    for col in ("plan", "step\nms", "cost /\nbound", "copied\nGiB", "of the\nbytes",
                "tables\nmoved", "move\ns", "payback\nsteps"):
        table.add_column(col, justify="right")
    for r in found.rows:
        m = r.move
        table.add_row(r.name, f"{r.cost_ms:.3f}", f"{r.cost_ratio:.3f}",
                      f"{m.copied_bytes / 2**30:.3f}", f"{m.copied_share:.1%}",
                      str(m.tables_moved), f"{m.seconds:.4f}",
                      "-" if m.payback_steps is None else f"{m.payback_steps:,.0f}")
    console.print(table)
    before = "" if found.before_ms is None else (
        f"; the plan in use cost {found.before_ms:.3f} ms on the statistics it was made for")
    console.print(f"lower bound on the new statistics {found.bound_ms:.3f} ms{before}",
                  markup=False)
