"""Serving across CPU servers: ``autoshard serve plan|simulate|bench|compare|calibrate``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table as RichTable

from autoshard.cli.app import app
from autoshard.cli.common import (
    JsonOpt,
    SeedOpt,
    check_output_path,
    console,
    print_json,
    ranged,
)
from autoshard.errors import InputError
from autoshard.limits import (
    P99_TARGET_MS,
    QPS,
    SIMULATED_REQUESTS,
    TIME_LIMIT_S,
    Range,
)

serve_app = typer.Typer(help="Plan, simulate and measure a model served across CPU servers.",
                        no_args_is_help=True)
app.add_typer(serve_app, name="serve")

ModelOpt = Annotated[str, typer.Option(
    "--model", "-m", help="Serving suite (small, medium, large, sparse, bench) or a serving "
    "model file (YAML/JSON, kind: serving_model).")]
ProfileOpt = Annotated[str | None, typer.Option(
    "--profile", "-P", help="Serving profile: bundled name (see `serve profiles`) or YAML file; "
    "default: the suite's.")]
QpsOpt = Annotated[float, ranged(QPS, "Request rate, requests per second.", "--qps")]
StrategyOpt = Annotated[str, typer.Option("--strategy", "-s", help="Mapping strategy.")]
RequestsOpt = Annotated[int, ranged(SIMULATED_REQUESTS, "Requests simulated.")]
SpanOpt = Annotated[int, ranged(Range(1, 1000, integer=True),
                                "Server counts swept from the memory bound.")]
#: Sparse servers of a simulated mapping (a profile allows at most 4,096).
SERVERS = Range(0, 4096, integer=True)
SHOWN = ("strategy", "servers", "p50_ms", "p90_ms", "p99_ms", "p99_overhead",
         "calls_per_request", "compute_overhead", "max_utilisation", "memory_gb_max")


def load_inputs(model: str, profile: str | None) -> tuple[Any, Any]:
    """The served model and its serving profile (a suite's own profile by default)."""
    from autoshard.serving.model import load_model
    from autoshard.serving.profile import load_serving_profile
    from autoshard.serving.suites import SUITES, suite_model

    if model in SUITES and not Path(model).exists():
        served = suite_model(model)
        default = SUITES[model].profile
    elif Path(model).suffix.lower() in (".yaml", ".yml", ".json"):
        served = load_model(model)
        default = "cpu-256gb"
    else:
        raise InputError(f"unknown serving suite or model file (suites: {', '.join(SUITES)})",
                         source="command line", field="--model", value=model)
    return served, load_serving_profile(profile or default)


def make_task(model: str, profile: str | None, qps: float, requests: int, seed: int,
              p99_ms: float | None = None) -> Any:
    from autoshard.serving.task import ServingTask

    served, prof = load_inputs(model, profile)
    try:
        return ServingTask(served, prof, qps=qps, p99_ms=p99_ms, requests=requests, seed=seed)
    except InputError as exc:
        if exc.field in ("qps", "p99_ms", "requests"):
            raise InputError(exc.reason, source="command line",
                             field="--" + exc.field.replace("_", "-"), value=exc.value) from exc
        raise


def show_rows(rows: list[dict[str, Any]], title: str) -> None:
    table = RichTable(title=title)
    for col in SHOWN:
        table.add_column(col, justify="right")
    for row in rows:
        if row.get("error"):
            table.add_row(row["strategy"], str(row["servers"]), "[red]" + row["error"][:60])
            continue
        table.add_row(*(_fmt(row[c]) for c in SHOWN))
    console.print(table)
    console.print("[dim]ms; p99_overhead and compute_overhead vs one hypothetical server holding "
                  "every table; calls = remote calls per request; memory in GB[/]")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@serve_app.command("profiles")
def profiles_cmd(name: Annotated[str | None, typer.Argument(
        help="Print this profile as editable YAML.")] = None) -> None:
    """List bundled serving profiles, or print one as YAML."""
    import yaml

    from autoshard.serving.profile import BUNDLED, load_serving_profile

    if name is None:
        for key, prof in BUNDLED.items():
            typer.echo(f"{key}: {prof.server_memory_gb:g} GB per server, {prof.cores} cores, "
                       f"call overhead {prof.call_overhead_us:g} us")
        return
    typer.echo(yaml.safe_dump(load_serving_profile(name).to_dict(), sort_keys=False), nl=False)


@serve_app.command("simulate")
def simulate_cmd(
    model: ModelOpt = "small",
    profile: ProfileOpt = None,
    strategy: StrategyOpt = "feature_group",
    servers: Annotated[int | None, ranged(
        SERVERS, "Sparse servers (default: the memory bound).")] = None,
    qps: QpsOpt = 1000.0,
    requests: RequestsOpt = 100_000,
    seed: SeedOpt = 0,
    plan: Annotated[Path | None, typer.Option(help="Simulate this plan file instead.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o",
                                                help="Write the plan (JSON/YAML).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Simulate one mapping: P50/P90/P99, fan-out, compute and memory per server."""
    from autoshard.serving.mapping import load_mapping, save_mapping
    from autoshard.serving.planning import Evaluator
    from autoshard.serving.registry import get_strategy

    if output is not None:
        check_output_path(output)
    task = make_task(model, profile, qps, requests, seed)
    if plan is not None:
        mapping = load_mapping(plan, task.model)
    else:
        chosen = get_strategy(strategy)
        count = servers if servers is not None else max(task.min_servers(), 1)
        mapping = chosen.map(task, count)
    row = dict(Evaluator(task).evaluate(mapping).row(), qps=qps, requests=requests)
    if output is not None:
        save_mapping(output, mapping, task.model)
    if json_out:
        print_json(row)
        return
    show_rows([row], f"{task.model.name} on {task.profile.name} at {qps:g} qps, "
              f"{requests} simulated requests")


@serve_app.command("plan")
def plan_cmd(
    p99_ms: Annotated[float, ranged(P99_TARGET_MS, "P99 latency target, ms.", "--p99-ms")],
    qps: QpsOpt,
    model: ModelOpt = "medium",
    profile: ProfileOpt = None,
    strategies: Annotated[str | None, typer.Option(
        help="Comma-separated strategies (default: all).")] = None,
    span: SpanOpt = 6,
    requests: RequestsOpt = 20_000,
    seed: SeedOpt = 0,
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder.")] = Path(
        "runs/serve-plan"),
) -> None:
    """How many servers, and which mapping, meet a P99 target at a request rate.

    Writes plan.json (the optimiser's mapping at the fewest servers that meet the target, else
    the lowest P99 found), sweep.csv/.md and p99_vs_servers.png to the output folder.
    """
    from autoshard.serving.planning import fewest_servers, server_range, sweep
    from autoshard.serving.registry import parse_strategies

    check_output_path(output / "plan.json")
    names = parse_strategies(strategies, "--strategies", "command line")
    task = make_task(model, profile, qps, requests, seed, p99_ms)
    rows = sweep(task, names, server_range(task, span))
    fewest = fewest_servers(rows, p99_ms)
    doc = write_plan_outputs(task, rows, fewest, output)
    show_rows(rows, f"{task.model.name} on {task.profile.name} at {qps:g} qps")
    for name, count in fewest.items():
        console.print(f"{name}: " + (f"{count} sparse servers meet P99 <= {p99_ms:g} ms"
                                     if count is not None else "no swept server count meets "
                                     f"P99 <= {p99_ms:g} ms"))
    console.print(f"memory bound: at least {task.min_servers()} sparse servers; "
                  f"wrote {output}/ ({doc['answer']})")


def write_plan_outputs(task: Any, rows: list[dict[str, Any]], fewest: dict[str, int | None],
                       output: Path) -> dict[str, Any]:
    """The answer (best mapping) and the sweep, written together at the end."""
    from autoshard.fileio import write_structured
    from autoshard.machine import describe_machine
    from autoshard.serving.planning import advantage_at_equal_servers
    from autoshard.serving.registry import get_strategy
    from autoshard.serving.report import (
        SWEEP_COLUMNS,
        markdown_table,
        plot_p99_vs_servers,
        write_csv,
    )
    from autoshard.serving.suite_run import server_gap

    ours = [r for r in rows if r["strategy"] == "optimiser" and not r.get("error")]
    answer = "no optimiser rows"
    plan_doc = None
    if ours:
        count = fewest.get("optimiser")
        pick = (next(r for r in ours if r["servers"] == count) if count is not None
                else min(ours, key=lambda r: r["p99_ms"]))
        mapping = get_strategy("optimiser").map(task, pick["servers"])
        plan_doc = mapping.to_dict(task.model)
        met = "meets" if count is not None else "misses"
        answer = f"optimiser, {pick['servers']} sparse servers, P99 {pick['p99_ms']:.3f} ms " \
                 f"({met} the target)"
    summary = {"model": task.model.name, "profile": task.profile.name, "qps": task.qps,
               "p99_target_ms": task.p99_ms, "requests": task.requests,
               "memory_bound_servers": task.min_servers(), "fewest_servers": fewest,
               "optimiser_servers_over_bound": server_gap(fewest, task.min_servers()),
               "advantage_at_equal_servers": advantage_at_equal_servers(rows),
               "answer": answer, "machine": describe_machine()}
    from autoshard.fileio import atomic_write_text, output_folder

    with output_folder(output):  # a failure leaves no new folder behind
        if plan_doc is not None:
            write_structured(output / "plan.json", plan_doc)
        write_structured(output / "summary.json", summary)
        write_csv(output / "sweep.csv", rows, SWEEP_COLUMNS)
        atomic_write_text(output / "sweep.md", markdown_table(rows, SWEEP_COLUMNS))
        plot_p99_vs_servers(rows, output / "p99_vs_servers.png",
                            f"{task.model.name} at {task.qps:g} qps", task.p99_ms)
    return summary


def parse_rates(spec: str) -> tuple[float, ...]:
    """Comma-separated request rates, each in :data:`autoshard.limits.QPS`."""
    try:
        rates = tuple(float(v) for v in spec.split(",") if v.strip())
    except ValueError as exc:
        raise InputError("expected comma-separated numbers", source="command line",
                         field="--qps", value=spec) from exc
    if not rates:
        raise InputError("names no request rate", source="command line", field="--qps",
                         value=spec)
    for rate in rates:
        QPS.check(rate, "--qps", "command line")
    return rates


@serve_app.command("bench")
def bench_cmd(
    model: ModelOpt = "bench",
    profile: ProfileOpt = None,
    strategy: StrategyOpt = "feature_group",
    servers: Annotated[int, ranged(Range(1, 64, integer=True),
                                   "Sparse server processes.")] = 2,
    qps: Annotated[str, typer.Option("--qps", help="Request rates, comma-separated, each "
                                     f"{QPS.help()}.")] = "100",
    requests: Annotated[int, typer.Option(
        help="Requests per rate and round, warm-up included.")] = 300,
    rounds: Annotated[int, typer.Option(
        help="Rounds over the rates; each percentile is the median over rounds.")] = 1,
    warmup: Annotated[int, typer.Option(
        help="Requests dropped at the start of each rate's round.")] = 0,
    max_rows: Annotated[int, ranged(Range(1, 10_000_000, integer=True),
                                    "Rows held per table (capped).")] = 20_000,
    seed: SeedOpt = 0,
    timeout: Annotated[float, ranged(TIME_LIMIT_S, "Seconds a process may go without "
                                     "progress before the run is stopped.")] = 30.0,
    logs: Annotated[Path | None, typer.Option(help="Folder for process logs.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o",
                                                help="Write the rows (CSV or JSON).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Serve a mapping for real here (torch.distributed.rpc, one process per server) and report
    measured P50/P90/P99 next to the simulator's for the same requests."""
    from autoshard.serving.bench import BenchConfig, run_bench
    from autoshard.serving.registry import get_strategy

    if output is not None:
        check_output_path(output)
    rates = parse_rates(qps)
    with_field = {"requests": "--requests", "timeout": "--timeout", "qps": "--qps",
                  "rounds": "--rounds", "warmup": "--warmup"}
    try:
        config = BenchConfig(qps=rates, requests=requests, max_rows=max_rows, timeout_s=timeout,
                             seed=seed, rounds=rounds, warmup=warmup)
    except InputError as exc:
        raise InputError(exc.reason, source="command line",
                         field=with_field.get(exc.field or "", exc.field), value=exc.value
                         ) from exc
    task = make_task(model, profile, rates[0], config.simulated_requests, seed)
    mapping = get_strategy(strategy).map(task, servers)
    rows = run_bench(task, mapping, config, logs)
    if output is not None:
        write_rows(output, rows)
    if json_out:
        print_json(rows)
        return
    show_bench(rows, f"{task.model.name}: {strategy} on {mapping.servers} sparse servers, "
               "measured here vs simulated")


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    from autoshard.fileio import write_structured
    from autoshard.serving.report import BENCH_COLUMNS, write_csv

    if path.suffix.lower() == ".csv":
        write_csv(path, rows, BENCH_COLUMNS)
    else:
        write_structured(path, rows)


def show_bench(rows: list[dict[str, Any]], title: str) -> None:
    table = RichTable(title=title)
    cols = ("strategy", "servers", "qps", "calls_per_request", "measured_p50_ms",
            "simulated_p50_ms", "measured_p99_ms", "simulated_p99_ms")
    for col in cols:
        table.add_column(col.replace("_ms", "").replace("_", " "), justify="right")
    for row in rows:
        table.add_row(*(_fmt(row[c]) for c in cols))
    console.print(table)


@serve_app.command("calibrate")
def calibrate_cmd(
    output: Annotated[Path, typer.Option("--output", "-o", help="Profile YAML to write.")],
    base: Annotated[str, typer.Option(help="Profile whose other fields are kept.")] = (
        "local-cpu"),
    calls: Annotated[int, ranged(Range(3, 100_000, integer=True),
                                 "Timed calls per configuration.")] = 40,
) -> None:
    """Measure this machine's call and lookup costs (torch.distributed.rpc, EmbeddingBag) and
    write a serving profile with them."""
    from autoshard.machine import describe_machine
    from autoshard.serving.bench import calibrate
    from autoshard.serving.profile import (
        CALIBRATED,
        load_serving_profile,
        save_serving_profile,
        with_calibration,
    )

    check_output_path(output)
    prof = load_serving_profile(base)
    found = calibrate(calls)
    prof = with_calibration(prof, found, output.stem)
    save_serving_profile(output, prof)
    for key in CALIBRATED:
        console.print(f"{key}: {found[key]:g}")
    console.print(f"[dim]{describe_machine()}; wrote {output}[/]")


def check_bench_options(suite: str, requests: int, rounds: int, warmup: int) -> None:
    """Rejects bad --bench-* options before anything is run."""
    from autoshard.serving.bench import BenchConfig
    from autoshard.serving.suites import SUITES

    names = {"requests": "--bench-requests", "rounds": "--bench-rounds",
             "warmup": "--bench-warmup"}
    try:
        BenchConfig(qps=SUITES[suite].qps, requests=requests, rounds=rounds, warmup=warmup)
    except InputError as exc:
        raise InputError(exc.reason, source="command line",
                         field=names.get(exc.field or "", exc.field), value=exc.value) from exc


@serve_app.command("compare")
def compare_cmd(
    suite: Annotated[str, typer.Option(help="Serving suite: small, medium, large, sparse, "
                                       "bench.")] = "medium",
    requests: RequestsOpt = 20_000,
    span: SpanOpt = 4,
    measure: Annotated[bool, typer.Option(
        help="Also serve every strategy for real here (small suites).")] = False,
    bench_requests: Annotated[int, typer.Option(
        help="Measured requests per rate and round, warm-up included.")] = 300,
    bench_rounds: Annotated[int, typer.Option(
        help="Measured rounds over the rates; the median round is reported.")] = 1,
    bench_warmup: Annotated[int, typer.Option(
        help="Requests dropped at the start of each rate's round.")] = 0,
    seed: SeedOpt = 0,
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder.")] = Path(
        "results/serving"),
) -> None:
    """Every strategy on a suite at its request rates: P99 vs servers, fewest servers meeting
    the target, the optimiser's margin at equal servers. With --measure, first calibrates this
    machine's constants (`serve calibrate`), then serves every strategy for real and reports
    measured beside simulated. Writes SUITE.md/.csv/.png/.json (and SUITE.bench.*)."""
    import sys

    from autoshard.serving.suite_run import (
        calibrated_profile,
        measure_suite,
        simulate_suite,
        write_suite,
    )
    from autoshard.serving.suites import SUITES

    if suite not in SUITES:
        raise InputError(f"unknown serving suite (known: {', '.join(SUITES)})",
                         source="command line", field="--suite", value=suite)
    check_output_path(output / f"{suite}.md")
    if measure:
        check_bench_options(suite, bench_requests, bench_rounds, bench_warmup)
    profile = calibrated_profile(suite) if measure else None
    rows, per_rate = simulate_suite(suite, requests, span, seed, profile)
    measured = (measure_suite(suite, bench_requests, seed, profile, requests, bench_rounds,
                              bench_warmup) if measure else None)
    command = "autoshard serve " + " ".join(sys.argv[sys.argv.index("compare"):]) \
        if "compare" in sys.argv else f"autoshard serve compare --suite {suite}"
    write_suite(suite, output, command, rows, per_rate, measured)
    for rate in per_rate:
        console.print(f"{rate['qps']:g} qps: fewest servers meeting P99 <= "
                      f"{rate['p99_target_ms']:g} ms: {rate['fewest_servers']}")
    if measured is not None:
        console.print(f"measured vs simulated Spearman: P99 {measured['spearman_p99']}, "
                      f"P90 {measured['spearman_p90']}, P50 {measured['spearman_p50']}")
    console.print(f"wrote {output}/{suite}.md")
