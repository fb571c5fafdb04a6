"""Core commands: plan, evaluate, hardware, sharders."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table as RichTable

from autoshard import planning
from autoshard.cli.app import app
from autoshard.cli.common import (
    BatchOpt,
    CostModelOpt,
    DevicesOpt,
    HardwareOpt,
    HbmOpt,
    JsonOpt,
    ModeOpt,
    NodesOpt,
    OptOpt,
    OverheadOpt,
    PolicyOpt,
    SeedOpt,
    SharderOpt,
    TimeLimitOpt,
    build_task,
    check_options,
    check_output_path,
    console,
    options_named,
    parse_opts,
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
    record_context,
)
from autoshard.cli.placement_view import (
    AllTablesOpt,
    ByOpt,
    PlotOpt,
    View,
    check_view,
)
from autoshard.cli.progress import timed
from autoshard.cli.report import show_report, show_torchrec_estimate
from autoshard.cli.torchrec_cmds import PlanTablesOpt as TablesOrModelOpt
from autoshard.cli.torchrec_cmds import StatsOpt, TorchRecModelOpt, plan_tables
from autoshard.errors import InputError, PlannerError
from autoshard.fileio import check_distinct_outputs
from autoshard.hardware import BUNDLED, load_hardware
from autoshard.layout.plan import Plan
from autoshard.limits import check_finite_costs, one_of
from autoshard.planning import Planned
from autoshard.pricing.cost import CostModel, load_cost_model, machine_warning
from autoshard.pricing.evaluator import CostReport, evaluate
from autoshard.pricing.shard_costs import shard_costs
from autoshard.sharders import (
    accepted_options,
    check_sharder_options,
    common_options,
    get_sharder,
    list_sharders,
)
from autoshard.task import ShardingTask
from autoshard.torchrec.runtime_memory import check_pipeline


@app.command()
def plan(
    tables: TablesOrModelOpt = None,
    hardware: HardwareOpt = "8xH100-80GB",
    sharder: SharderOpt = "recshard",
    output: Annotated[Path, typer.Option("--output", "-o", help="Plan file to write.")] = Path(
        "runs/plan.json"),
    devices: DevicesOpt = None,
    nodes: NodesOpt = None,
    hbm_gb: HbmOpt = None,
    batch_size: BatchOpt = None,
    mode: ModeOpt = None,
    overhead: OverheadOpt = "torchrec",
    cost_model: CostModelOpt = "analytical",
    seed: SeedOpt = 0,
    time_limit: TimeLimitOpt = 60.0,
    opt: OptOpt = None,
    policy: PolicyOpt = None,
    torchrec_model: TorchRecModelOpt = None,
    stats: StatsOpt = None,
    by: ByOpt = "device",
    all_tables: AllTablesOpt = False,
    plot: PlotOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Plan a task with a sharder and write the plan (JSON/YAML).

    The tables come from --tables or from a TorchRec model (--torchrec-model). --seed and
    --time-limit go to the sharder when it takes them; --opt and --policy must be options it
    takes. Prints the per-device cost and memory, the placement (--by device or table) and
    how the plan was found; --plot draws it.
    """
    check_output_path(output)
    check_view(by, plot)
    if plot is not None:
        check_output_path(plot)
        check_distinct_outputs({"--output": output, "--plot": plot})
    options = sharder_options(sharder, seed, time_limit, opt, policy)
    tables, given, module_paths = plan_tables(tables, torchrec_model, stats)
    task = build_task(given, hardware, devices, nodes, hbm_gb, batch_size, mode,
                      overhead=overhead)
    with options_named():
        model = load_cost_model(cost_model)
        chosen = get_sharder(sharder, **options)
    if note := machine_warning(model):
        typer.echo(f"warning: {note}", err=True)
    context = record_context(task, tables, hardware, devices, nodes, hbm_gb, cost_model,
                             inline=torchrec_model is not None, module_paths=module_paths)
    limit = options.get("time_limit")
    try:
        with timed(f"planning with {sharder}" + (f" (limit {limit:g} s)" if limit else ""),
                   float(limit) if isinstance(limit, (int, float)) else None):
            planned = planning.plan(task, chosen, model, context=context)
    except PlannerError as exc:
        raise PlannerError(exc.kind, f"{tables}: {exc}") from exc
    planned.plan.save(output)
    view = View(by, all_tables, plot)
    show_planned(planned, model, output, view, json_out)


def show_planned(planned: Planned, model: CostModel, output: Path, view: View,
                 json_out: bool, extra: dict[str, Any] | None = None) -> None:
    """The plan's report: JSON (with ``extra`` fields), or the per-device table, the
    placement, how the plan was found and the solver's figures; and its plot when asked."""
    report, plan, solver, seconds = (planned.report, planned.plan, planned.solver,
                                     planned.seconds)
    found = None if plan.provenance is None else plan.provenance.to_dict()
    view.draw(report, f"{output}: {report.sharder}, {report.cost_model} cost")
    if json_out:
        print_json(dict(report.to_dict(), plan_seconds=seconds, output=str(output),
                        provenance=found, solver=solver, notes=list(planned.notes),
                        **(extra or {})))
        return
    show_report(report)
    view.show(shard_costs(plan, planned.task, model), planned.task.num_devices)
    if plan.provenance is not None:
        console.print(f"found by {plan.provenance.summary()}", markup=False)
    if solver is not None:
        console.print(solver_line(solver, report.lower_bound_ms), markup=False)
    for note in planned.notes:
        console.print(f"note: {note}", markup=False)
    console.print(f"planned {len(plan.placements)} tables on "
                  f"{report.per_device and len(report.per_device)} devices in {seconds:.3f} s; "
                  f"wrote {output}" + (f" and {view.plot}" if view.plot else ""))


def sharder_options(sharder: str, seed: int, time_limit: float, opt: list[str] | None,
                     policy: Path | None) -> dict[str, object]:
    """The options ``plan`` makes its sharder with: the common settings it takes, then those
    given for it (checked strictly)."""
    if not (math.isfinite(time_limit) and time_limit > 0):
        raise InputError("must be > 0", source="command line", field="--time-limit",
                         value=time_limit)
    with options_named():
        options = common_options(sharder, {"seed": seed, "time_limit": time_limit})
    given = parse_opts(opt, [sharder]).get(sharder, {})
    if policy is not None:
        if "policy" not in accepted_options(sharder):
            raise InputError(f"sharder '{sharder}' takes no policy (the ppo sharder does)",
                             source="command line", field="--policy", value=str(policy))
        given["policy"] = str(policy)
    with options_named(sharder_options=True):
        check_sharder_options(sharder, given)
    return {**options, **given}


@app.command("evaluate")
def evaluate_cmd(
    plan_file: Annotated[Path, typer.Argument(help="Plan file from `autoshard plan`.")],
    tables: PlanTablesOpt = None,
    hardware: PlanHardwareOpt = None,
    devices: DevicesOpt = None,
    nodes: NodesOpt = None,
    hbm_gb: HbmOpt = None,
    batch_size: BatchOpt = None,
    mode: ModeOpt = None,
    overhead: PlanOverheadOpt = None,
    cost_model: PlanCostModelOpt = None,
    reprice: RepriceOpt = False,
    bound: Annotated[str, typer.Option(
        "--bound", help="Lower bound: 'simple' (fast, valid for every plan, split tables "
        "included; it counts the HBM the plan's reservation keeps) or 'lp' (adds the MILP's LP "
        "relaxation over whole-table plans, tighter; not used for a plan that splits "
        "tables).")] = "simple",
    estimator: Annotated[str, typer.Option(
        "--estimator", help="'ours' (the cost model), or 'torchrec' to also price and size "
        "the plan with TorchRec's EmbeddingPerfEstimator and EmbeddingStorageEstimator on the "
        "same topology (needs the torchrec extra).")] = "ours",
    torchrec_pipeline: Annotated[str | None, typer.Option(
        "--torchrec-pipeline", help="TorchRec training pipeline the estimate assumes: 'none' "
        "(TorchRec's default: a cached lookup at a bandwidth blended by the load factor) or "
        "'prefetch' (caches prefetched: lookups at HBM bandwidth plus the expected misses' "
        "fetch); default: the one the plan's reservation is for.")] = None,
    by: ByOpt = "device",
    all_tables: AllTablesOpt = False,
    plot: PlotOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Price a plan on the tables, hardware, workload, reservation and cost model it records:
    per-device cost and HBM (weights, reserved, free), step cost, lower bound, balance and UVM
    share, and the placement (--by device or table; --plot draws it). Options that contradict
    the plan are errors unless --reprice."""
    check_view(by, plot)
    if plot is not None:
        check_output_path(plot)
    loaded = Plan.load(plan_file)
    _check_choices(bound, estimator, torchrec_pipeline)
    priced = plan_task(loaded, plan_file, Given(tables, hardware, devices, nodes, hbm_gb,
                                                batch_size, mode, overhead, cost_model), reprice)
    task = priced.task
    with options_named():
        model = load_cost_model(priced.cost_model)
    for note in priced.notes:
        typer.echo(f"note: {note}", err=True)
    report = _priced_report(loaded, task, model, bound, plan_file)
    second = None
    if estimator == "torchrec":
        from autoshard.torchrec.estimate import estimate_plan

        second = (estimate_plan(loaded, task, pipeline=torchrec_pipeline),
                  per_table_ms(loaded, task, model))
    view = View(by, all_tables, plot)
    view.draw(report, f"{plan_file}: {report.sharder}, {report.cost_model} cost")
    _show_evaluated(report, second, priced.notes, json_out)
    if not json_out:
        view.show(shard_costs(loaded, task, model, str(plan_file)), task.num_devices,
                  written=True)


def _priced_report(loaded: Plan, task: ShardingTask, model: CostModel, bound: str,
                   plan_file: Path) -> CostReport:
    """The plan's report under ``model``, with the MILP's LP bound where ``bound`` is 'lp' and
    the plan keeps its tables whole; every figure checked finite."""
    bound_ms = None
    if bound == "lp" and not loaded.is_split:
        from autoshard.sharders.recshard import recshard_bound

        bound_ms = recshard_bound(task, model)
    report = evaluate(loaded, task, model, bound_ms=bound_ms, source=str(plan_file))
    check_finite_costs({"step_cost_ms": report.step_cost_ms,
                        "lower_bound_ms": report.lower_bound_ms}, f"{plan_file}")
    return report


def _show_evaluated(report: CostReport, second: tuple[Any, dict[str, float]] | None,
                    notes: tuple[str, ...], json_out: bool) -> None:
    """The report (JSON or tables), with TorchRec's estimate beside ours when asked."""
    if json_out:
        doc = dict(report.to_dict(), notes=list(notes))
        if second is not None:
            doc["torchrec"] = second[0].to_dict()
            for row in doc["torchrec"]["per_table"]:
                row["ours_ms"] = second[1][row["table"]]
        print_json(doc)
        return
    show_report(report)
    if second is not None:
        show_torchrec_estimate(report, *second)


def _check_choices(bound: str, estimator: str, pipeline: str | None) -> None:
    """Rejects an unknown ``--bound``, ``--estimator`` or ``--torchrec-pipeline``."""
    one_of(bound, ("simple", "lp"), "--bound", "command line")
    one_of(estimator, ("ours", "torchrec"), "--estimator", "command line")
    if pipeline is not None:
        check_pipeline(pipeline, "--torchrec-pipeline", "command line")


def solver_line(solver: dict[str, Any], lower_bound_ms: float) -> str:
    """A solver's report in one line: how its MILP stopped, the bound the sharder proved
    itself (its relaxation of the task) against the plan's lower bound ``lower_bound_ms``
    (the one cost / bound uses), and when it found the plan it returned.

    A bound is named with what it is; one the sharder did not prove (zero, or absent) is said
    in words, never as a share of the plan's cost."""
    stopped = {"Optimal": "its MILP over the splits it chose solved within HiGHS's MIP gap",
               "stalled": "its MILP stopped when it no longer improved",
               "Time limit reached": "its MILP stopped at its time limit",
               "search": "the whole MILP not run (search only)"}.get(
        str(solver["status"]), f"status {solver['status']}")
    proved = own_bound_words(solver.get("bound_ms"), lower_bound_ms)
    return (f"{solver['solver']}: {stopped}; {proved}; final plan found after "
            f"{solver['found_s']:.2f} s of {solver['seconds']:.2f} s")


def own_bound_words(bound_ms: Any, lower_bound_ms: float) -> str:
    """What the sharder's own bound is beside the plan's lower bound, in words."""
    if bound_ms is None or not math.isfinite(float(bound_ms)) or float(bound_ms) <= 0:
        return ("it proved no bound of its own; cost / bound uses the cost model's lower bound, "
                f"{lower_bound_ms:.3f} ms")
    own = float(bound_ms)
    if own >= lower_bound_ms * (1 - 1e-9):
        return (f"the bound it proved (its own relaxation) is {own:.3f} ms, the lower bound "
                "cost / bound uses")
    return (f"the bound it proved (its own relaxation) is {own:.3f} ms, below the cost "
            f"model's lower bound, {lower_bound_ms:.3f} ms, which cost / bound uses")


def per_table_ms(plan: Plan, task: ShardingTask, model: CostModel) -> dict[str, float]:
    """Each table's cost under ``model``, its shards' summed over their devices, ms."""
    import numpy as np

    from autoshard.layout.shards import plan_layout, price_layout

    layout = plan_layout(plan, task)
    total = np.bincount(layout.geometry.table, minlength=task.num_tables,
                        weights=price_layout(task, model, layout).total_ms)
    return {t.name: float(ms) for t, ms in zip(task.tables, total, strict=True)}


hardware_app = typer.Typer(help="Bundled and custom hardware profiles.", no_args_is_help=True)
app.add_typer(hardware_app, name="hardware")


@hardware_app.command("list")
def hardware_list() -> None:
    """List the bundled hardware profiles."""
    table = RichTable(title="bundled hardware profiles (spec-sheet figures)")
    table.add_column("name", no_wrap=True)
    for col in ("count", "HBM GB", "HBM GB/s", "host GB", "host GB/s", "intra GB/s",
                "inter GB/s"):
        table.add_column(col, justify="right")
    for p in BUNDLED.values():
        d = p.devices[0]
        table.add_row(p.name, str(p.num_devices), f"{d.hbm.capacity_bytes / 1e9:g}",
                      f"{d.hbm.bandwidth_gbps:g}", f"{d.host.capacity_bytes / 1e9:g}",
                      f"{d.host.bandwidth_gbps:g}", f"{p.intra_node_gbps:g}",
                      f"{p.inter_node_gbps:g}")
    console.print(table)


@hardware_app.command("show")
def hardware_show(
    name: Annotated[str, typer.Argument(help="Bundled profile name or YAML/JSON file.")],
    devices: DevicesOpt = None,
    nodes: NodesOpt = None,
    hbm_gb: HbmOpt = None,
) -> None:
    """Print a profile (with overrides applied) as YAML, ready to edit and reuse."""
    import yaml

    check_options(devices=devices, nodes=nodes, hbm_gb=hbm_gb)
    with options_named():
        profile = load_hardware(name, devices=devices, nodes=nodes, hbm_gb=hbm_gb)
    typer.echo(yaml.safe_dump(profile.to_dict(), sort_keys=False).rstrip())


@app.command()
def sharders(
    mode: Annotated[str, typer.Option(
        help="train / infer: sharders of GPU training and inference clusters; serve: the "
        "table-to-server mapping strategies of `autoshard serve`.")] = "train",
) -> None:
    """List the registered sharders of a mode and whether each can run here."""
    if mode not in ("train", "infer", "serve"):
        raise InputError("must be train, infer or serve", source="command line", field="--mode",
                         value=mode)
    table = RichTable(title=f"sharders ({mode})")
    table.add_column("name")
    table.add_column("status")
    table.add_column("summary")
    if mode == "serve":
        from autoshard.serving.registry import strategy_summaries

        for name, summary in strategy_summaries().items():
            table.add_row(name, "[green]available[/]", summary)
        console.print(table)
        return
    for info in list_sharders():
        status = "[green]available[/]" if info.unavailable is None else (
            f"[yellow]unavailable[/]: {escape(info.unavailable)}")  # '[extra]' is no markup
        table.add_row(info.name, status, info.summary)
    console.print(table)
