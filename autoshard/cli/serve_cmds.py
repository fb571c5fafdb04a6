"""Serving across CPU servers: ``autoshard serve plan|simulate|bench|compare|calibrate``."""

from __future__ import annotations

from functools import partial
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
from autoshard.cli.progress import progress_bar
from autoshard.errors import InputError
from autoshard.extras import require, require_all
from autoshard.limits import (
    P99_TARGET_MS,
    QPS,
    SIMULATED_REQUESTS,
    TIME_LIMIT_S,
    Range,
)
from autoshard.serving.ranges import REPLICAS, SAMPLES, parse_rates, parse_seeds

serve_app = typer.Typer(help="Plan, simulate and measure a model served across CPU servers.",
                        no_args_is_help=True)
app.add_typer(serve_app, name="serve")

ModelOpt = Annotated[str, typer.Option(
    "--model", "-m", help="Serving suite (small, medium, large, sparse, bench, paper) or a "
    "serving model file (YAML/JSON, kind: serving_model).")]
ProfileOpt = Annotated[str | None, typer.Option(
    "--profile", "-P", help="Serving profile: bundled name (see `serve profiles`) or YAML file; "
    "default: the suite's.")]
QpsOpt = Annotated[float, ranged(QPS, "Request rate, requests per second.", "--qps")]
StrategyOpt = Annotated[str, typer.Option("--strategy", "-s", help="Mapping strategy.")]
RequestsOpt = Annotated[int, ranged(SIMULATED_REQUESTS, "Requests per simulated sample.")]
SamplesOpt = Annotated[int, ranged(SAMPLES, "Independent request samples; percentiles are "
                                   "reported with their 95% interval over them.")]
SpanOpt = Annotated[int, ranged(Range(1, 1000, integer=True),
                                "Shard counts swept from the memory bound.")]
PrecisionOpt = Annotated[str, typer.Option(help="Serving precision of the rows: fp32 (the "
                                           "tables' own), fp16, int8 or int4.")]
CeilingOpt = Annotated[float | None, ranged(
    Range(0, 1, open_low=True), "Utilisation a feasible server stays below "
    "(default: the profile's).", "--max-utilisation")]
HeadroomOpt = Annotated[float | None, ranged(
    Range(0, 0.9), "Share of each server's memory left free (default: the profile's).",
    "--headroom")]
SeedsOpt = Annotated[str, typer.Option(help="Fresh seeds the plan is made again on "
                                       "(comma-separated; empty: none): the report says "
                                       "whether the answer holds on each.")]
#: Sparse shards of a simulated mapping (a profile allows at most 4,096 servers).
SERVERS = Range(0, 4096, integer=True)
SHOWN = ("strategy", "servers", "total_servers", "p99_ms", "max_utilisation",
         "calls_per_request", "p99_overhead", "meets")
HEADERS = ("strategy", "shards", "servers", "P99 ms", "util", "calls", "vs 1", "verdict")


def load_inputs(model: str, profile: str | None, ceiling: float | None = None,
                headroom: float | None = None) -> tuple[Any, Any]:
    """The served model and its serving profile (a suite's own profile by default)."""
    from dataclasses import replace

    from autoshard.serving.cluster import load_serving_profile
    from autoshard.serving.model import load_model
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
    prof = load_serving_profile(profile or default)
    if ceiling is not None:
        prof = replace(prof, utilisation_ceiling=ceiling)
    if headroom is not None:
        prof = replace(prof, memory_headroom=headroom)
    return served, prof


def make_task(model: str, profile: str | None, qps: float, requests: int, seed: int,
              p99_ms: float | None = None, samples: int = 5, precision: str = "fp32",
              ceiling: float | None = None, headroom: float | None = None) -> Any:
    from autoshard.serving.task import ServingTask

    served, prof = load_inputs(model, profile, ceiling, headroom)
    try:
        return ServingTask(served, prof, qps=qps, p99_ms=p99_ms, requests=requests, seed=seed,
                           samples=samples, precision=precision)
    except InputError as exc:
        if exc.field in ("qps", "p99_ms", "requests", "samples", "precision"):
            raise InputError(exc.reason, source="command line",
                             field="--" + exc.field.replace("_", "-"), value=exc.value) from exc
        raise


def show_rows(rows: list[dict[str, Any]], title: str, target_ms: float | None) -> None:
    """The deployments as a table. The verdict is against the P99 target ``target_ms`` (meets,
    misses, or over: beyond a server's memory or utilisation ceiling); with no target it says
    only whether the deployment is feasible (fits, over)."""
    from rich import box

    table = RichTable(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                      show_edge=False)
    names = max((len(r["strategy"]) for r in rows), default=8)
    for col, head in zip(SHOWN, HEADERS, strict=True):
        table.add_column(head, justify="left" if col == "strategy" else "right", no_wrap=True,
                         min_width=names if col == "strategy" else len(head))
    errors = []
    for row in rows:
        if row.get("error"):
            table.add_row(row["strategy"], str(row["servers"]), *["-"] * 5, "[red]no map")
            errors.append(f"{row['strategy']} on {row['servers']} shards: {row['error']}")
            continue
        cells = [_fmt(row[c]) for c in SHOWN]
        cells[3] = f"{row['p99_ms']:.3g}±{row['p99_hi_ms'] - row['p99_ms']:.2g}"
        cells[4] = f"{max(row['max_utilisation'], row['max_nic_utilisation']):.2f}"
        cells[6] = "-" if row["p99_overhead"] is None else f"{row['p99_overhead']:+.0%}"
        cells[7] = _verdict(row, target_ms)
        table.add_row(*cells)
    console.print(table)
    for line in errors:
        console.print(f"[red]{line}[/]")
    console.print("[dim]P99 ms: mean over the samples ± half its 95% interval; servers: main "
                  "tier and shard replicas; util: busiest server's cores or network interface; "
                  "calls: remote calls per request; vs 1: P99 against one server holding every "
                  "table, replicated below the ceiling[/]")


def _verdict(row: dict[str, Any], target_ms: float | None) -> str:
    """A deployment's verdict: against the target when there is one, else feasibility."""
    if not row["feasible"]:
        return "[red]over"
    if target_ms is None:
        return "fits"
    return "meets" if row["meets"] else "misses"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


@serve_app.command("profiles")
def profiles_cmd(name: Annotated[str | None, typer.Argument(
        help="Print this profile as editable YAML.")] = None) -> None:
    """List bundled serving profiles, or print one as YAML."""
    import yaml

    from autoshard.serving.cluster import BUNDLED, load_serving_profile

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
        SERVERS, "Sparse shards (default: the memory bound; main_only takes none).")] = None,
    replicas: Annotated[int | None, ranged(
        REPLICAS, "Servers per shard (default: provisioned below the utilisation ceiling).")
    ] = None,
    main_replicas: Annotated[int | None, ranged(
        REPLICAS, "Main-tier servers (default: provisioned).")] = None,
    qps: QpsOpt = 1000.0,
    p99_ms: Annotated[float | None, ranged(
        P99_TARGET_MS, "P99 latency target, ms: the verdict says whether the deployment meets "
        "it (none: the verdict says only whether it is feasible).", "--p99-ms")] = None,
    requests: RequestsOpt = 20_000,
    samples: SamplesOpt = 5,
    precision: PrecisionOpt = "fp32",
    cache: Annotated[bool, typer.Option(help="Move hot rows to the main server.")] = False,
    seed: SeedOpt = 0,
    plan: Annotated[Path | None, typer.Option(help="Simulate this plan file instead.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o",
                                                help="Write the plan (JSON/YAML).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Simulate one deployment: P50/P90/P99 with intervals, fan-out, utilisation, memory;
    with --p99-ms, whether it meets that target."""
    from autoshard.serving.evaluation import Evaluator
    from autoshard.serving.mapping import load_mapping, save_mapping

    if output is not None:
        check_output_path(output)
    task = make_task(model, profile, qps, requests, seed, p99_ms, samples=samples,
                     precision=precision)
    if plan is not None:
        mapping = load_mapping(plan, task.model, task.precision)
    else:
        mapping = _deployment(task, strategy, servers, cache, replicas, main_replicas)
    row = dict(Evaluator(task).evaluate(mapping).row(), qps=qps, requests=requests,
               p99_target_ms=p99_ms)
    if p99_ms is None:
        row["meets"] = None  # no target, no verdict on latency
    if output is not None:
        save_mapping(output, mapping, task.model, task.precision)
    if json_out:
        print_json(row)
        return
    show_rows([row], f"{task.model.name} on {task.profile.name} at {qps:g} qps, "
              f"{samples} samples of {requests} requests", p99_ms)


def _deployment(task: Any, strategy: str, servers: int | None, cache: bool,
                replicas: int | None, main_replicas: int | None) -> Any:
    """Strategy ``strategy``'s mapping on ``servers`` shards (default: the memory bound), with
    the hot-row cache if asked, and the replicas given or provisioned."""
    from autoshard.serving.evaluation import Evaluator
    from autoshard.serving.hotcold import with_main_cache
    from autoshard.serving.provision import first_replicas
    from autoshard.serving.registry import get_strategy

    chosen = get_strategy(strategy)
    if servers and not chosen.needs_servers:
        raise InputError(f"{strategy} uses no sparse server", source="command line",
                         field="--servers", value=servers)
    count = (servers if servers is not None else max(task.min_servers(), 1)) \
        if chosen.needs_servers else 0
    mapping = chosen.map(task, count)
    if cache and mapping.servers:
        mapping = with_main_cache(task, mapping)
    if mapping.replicas is None:
        auto = first_replicas(Evaluator(task, task.validate_samples), mapping)
        mapping = mapping.with_replicas(
            tuple([replicas] * mapping.servers) if replicas else tuple(
                int(r) for r in auto.replica_counts),
            main_replicas or auto.main_replicas)
    return mapping


@serve_app.command("plan")
def plan_cmd(
    p99_ms: Annotated[float, ranged(P99_TARGET_MS, "P99 latency target, ms.", "--p99-ms")],
    qps: QpsOpt,
    model: ModelOpt = "medium",
    profile: ProfileOpt = None,
    strategies: Annotated[str | None, typer.Option(
        help="Comma-separated strategies (default: all).")] = None,
    span: SpanOpt = 4,
    requests: RequestsOpt = 10_000,
    samples: SamplesOpt = 5,
    precision: PrecisionOpt = "fp32",
    replicas: Annotated[bool, typer.Option(
        help="Provision replicas of shards and of the main tier.")] = True,
    cache: Annotated[bool, typer.Option(help="Move hot rows to the main server.")] = False,
    minimise: Annotated[str, typer.Option(help="What the answer minimises first: servers, or "
                                          "cost (the profile's main_cost and server_cost).")
                        ] = "servers",
    max_utilisation: CeilingOpt = None,
    headroom: HeadroomOpt = None,
    seed: SeedOpt = 0,
    seeds: SeedsOpt = "",
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder.")] = Path(
        "runs/serve-plan"),
) -> None:
    """The fewest servers, and the deployment, that meet a P99 target at a request rate.

    Every strategy is swept over shard counts from the memory bound, each deployment given
    replicas below the utilisation ceiling and judged on fresh request samples; it meets the
    target when feasible and its P99 is within it on every sample (marginally when the target
    lies within the P99's interval). With --seeds the plan is made again on each seed and the
    servers that meet the target on every seed are named. Writes plan.json (the answer's
    deployment), summary.json, sweep.csv/.md and p99_vs_servers.png.
    """
    from autoshard.limits import one_of
    from autoshard.serving.parts import check_precision
    from autoshard.serving.plan_output import verdict, write_plan_outputs
    from autoshard.serving.planning import OBJECTIVES, PlanOptions
    from autoshard.serving.registry import parse_strategies

    check_output_path(output / "plan.json")
    require("matplotlib", "plots")
    one_of(minimise, OBJECTIVES, "--minimise", "command line")
    names = parse_strategies(strategies, "--strategies", "command line")
    check_precision(precision, "--precision", "command line")
    fresh = parse_seeds(seeds)
    task = make_task(model, profile, qps, requests, seed, p99_ms, samples, precision,
                     max_utilisation, headroom)
    options = PlanOptions(replicas=replicas, cache=cache)
    rows, found = _swept(task, names, span, options)
    checked = check_seeds(task, rows, found, fresh, names, span, options, minimise)
    write_plan_outputs(task, rows, found, output, {"replicas": replicas, "cache": cache,
                                                   **checked}, minimise)
    show_rows(rows, f"{task.model.name} on {task.profile.name} at {qps:g} qps, {samples} "
              f"samples of {requests} requests", p99_ms)
    console.print(f"memory bound: at least {task.min_servers()} shards "
                  f"({task.profile.memory_headroom:.0%} headroom); utilisation ceiling "
                  f"{task.profile.utilisation_ceiling:g}")
    console.print(f"answer: {verdict(task, rows, minimise)}; wrote {output}/")
    if fresh:
        show_seeds(checked, seeds)


def show_seeds(checked: dict[str, Any], seeds: str) -> None:
    """The answers on fresh seeds, and whether the first one holds on them."""
    again = ", ".join(f"{s['total_servers']} ({s.get('strategy', '-')})"
                      for s in checked["seeds"])
    holds = ("the same answer on every seed" if checked["same"] else
             f"{checked['servers_on_every_seed']} servers meet the target on every seed")
    edge = "; marginal" if checked["marginal"] else ""
    console.print(f"seeds {seeds}: {again}; {holds}{edge}")


def check_seeds(task: Any, rows: list[dict[str, Any]], found: dict[Any, Any],
                seeds: tuple[int, ...], names: list[str], span: int, options: Any,
                minimise: str) -> dict[str, Any]:
    """The plan made again on each of ``seeds``: each seed's answer and whether the first
    answer holds (:func:`autoshard.serving.planning.replan`); empty without seeds."""
    from autoshard.serving.planning import answer, replan

    if not seeds:
        return {}
    again, checked = replan(task, answer(rows, minimise), found, seeds, names, span, options,
                            minimise)
    keys = ("strategy", "servers", "total_servers", "p99_ms", "p99_lo_ms", "p99_hi_ms")
    return {"seeds": [{"seed": s, **({k: a[k] for k in keys} if a else
                                     {"total_servers": None})}
                      for s, a in zip(seeds, again, strict=True)], **checked}


ModeOpt = Annotated[str, typer.Option(
    help="replay: each server measured alone on its own calls, the requests composed; "
    "concurrent: every server at once on this host.")]
NetworkOpt = Annotated[float, typer.Option(
    "--network-us", help="Network a replayed call is given beyond this host's loopback, "
    "microseconds.")]
PinOpt = Annotated[bool, typer.Option(help="Keep the server and its caller (replay: the load "
                                      "generator) on cores of their own.")]


def _swept(task: Any, names: list[str], span: int, options: Any) -> tuple[Any, Any]:
    """:func:`autoshard.serving.planning.sweep` over ``span`` shard counts, its deployments
    shown as they are simulated."""
    from autoshard.serving.planning import server_range, sweep, sweep_size

    counts = server_range(task, span)
    with progress_bar("simulating deployments", sweep_size(names, counts),
                      "deployments") as advance:
        return sweep(task, names, counts, options, advance)


@serve_app.command("bench")
def bench_cmd(
    model: ModelOpt = "bench",
    profile: ProfileOpt = None,
    strategy: StrategyOpt = "feature_group",
    servers: Annotated[int, ranged(Range(1, 64, integer=True),
                                   "Sparse shards.")] = 2,
    replicas: Annotated[int, ranged(Range(1, 64, integer=True),
                                    "Servers per shard.")] = 1,
    main_replicas: Annotated[int, ranged(Range(1, 64, integer=True),
                                         "Main-tier servers (replay mode; concurrent runs "
                                         "one main process).")] = 1,
    qps: Annotated[str, typer.Option("--qps", help="Request rates, comma-separated, each "
                                     f"{QPS.help()}.")] = "100",
    requests: Annotated[int, typer.Option(
        help="Requests per rate and round, warm-up included.")] = 300,
    rounds: Annotated[int, typer.Option(
        help="Interleaved rounds over the rates (and simulator draws); each percentile is "
        "the median over rounds, with their range.")] = 3,
    warmup: Annotated[int, typer.Option(
        help="Requests dropped at the start of each rate's round.")] = 0,
    mode: ModeOpt = "replay",
    network_us: NetworkOpt = 0.0,
    pin: PinOpt = False,
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
    """Serve a mapping for real here (torch.distributed.rpc) and report measured P50/P90/P99
    next to the simulator's for the same requests. By default each server is replayed its
    own calls alone (one at a time) and the requests are composed from the measured calls;
    --mode concurrent runs every server at once on this host."""
    from autoshard.serving.bench import run_bench
    from autoshard.serving.registry import get_strategy

    require("torch", "run")
    if output is not None:
        check_output_path(output)
    rates = parse_rates(qps)
    config = bench_config(qps=rates, requests=requests, max_rows=max_rows, timeout_s=timeout,
                          seed=seed, rounds=rounds, warmup=warmup, mode=mode,
                          network_us=network_us, pin=pin)
    task = make_task(model, profile, rates[0], 1000, seed)
    chosen = get_strategy(strategy)
    mapping = chosen.map(task, servers if chosen.needs_servers else 0)
    mapping = mapping.with_replicas((replicas,) * mapping.servers, main_replicas)
    rows = run_bench(task, mapping, config, logs)
    if output is not None:
        write_rows(output, rows)
    if json_out:
        print_json(rows)
        return
    show_bench(rows, f"{task.model.name}: {strategy} on {mapping.servers} shards x {replicas} "
               f"+ {main_replicas} main, measured here ({mode}) vs simulated")


def bench_config(names: dict[str, str] | None = None, **values: Any) -> Any:
    """A :class:`autoshard.serving.bench.BenchConfig`, its errors naming the command-line
    option (``names`` maps a field to it when it is not ``--field``)."""
    from autoshard.serving.bench import BenchConfig

    try:
        return BenchConfig(**values)
    except InputError as exc:
        field = exc.field or ""
        option = (names or {}).get(field, "--" + field.replace("_", "-"))
        raise InputError(exc.reason, source="command line", field=option,
                         value=exc.value) from exc


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    from autoshard.fileio import write_structured
    from autoshard.serving.report import BENCH_COLUMNS, write_csv

    if path.suffix.lower() == ".csv":
        write_csv(path, rows, BENCH_COLUMNS)
    else:
        write_structured(path, rows)


def show_bench(rows: list[dict[str, Any]], title: str) -> None:
    table = RichTable(title=title)
    cols = ("strategy", "servers", "replicas", "qps", "calls_per_request", "measured_p50_ms",
            "simulated_p50_ms", "measured_p99_ms", "simulated_p99_ms", "p99_ratio")
    for col in cols:
        table.add_column(col.replace("_ms", "").replace("_", " "), justify="right")
    for row in rows:
        cells = [_fmt(row[c]) for c in cols]
        for i, name in ((7, "measured"), (8, "simulated")):
            cells[i] += f" [{row[f'{name}_p99_lo_ms']:.3g}, {row[f'{name}_p99_hi_ms']:.3g}]"
        table.add_row(*cells)
    console.print(table)
    console.print("[dim]P99: median over rounds \\[lowest, highest round]; "
                  + ("replayed: each server alone, requests composed" if rows and
                     rows[0]["mode"] == "replay" else "every server at once on this host")
                  + "[/]")


@serve_app.command("calibrate")
def calibrate_cmd(
    output: Annotated[Path, typer.Option("--output", "-o", help="Profile YAML to write.")],
    base: Annotated[str, typer.Option(help="Profile whose other fields are kept.")] = (
        "local-cpu"),
    calls: Annotated[int, ranged(Range(3, 100_000, integer=True),
                                 "Timed calls per configuration.")] = 200,
    pin: PinOpt = False,
) -> None:
    """Measure this machine's call and lookup costs (torch.distributed.rpc, EmbeddingBag) and
    write a serving profile with them."""
    from autoshard.machine import describe_machine
    from autoshard.serving.calibrate import calibrate
    from autoshard.serving.cluster import (
        CALIBRATED,
        load_serving_profile,
        save_serving_profile,
        with_calibration,
    )

    require("torch", "run")
    check_output_path(output)
    prof = load_serving_profile(base)
    found = calibrate(calls, pin=pin)
    prof = with_calibration(prof, found, output.stem)
    save_serving_profile(output, prof)
    for key in CALIBRATED:
        console.print(f"{key}: {found[key]:g}")
    console.print(f"[dim]{describe_machine()}; wrote {output}[/]")


def check_bench_options(suite: str, requests: int, rounds: int, warmup: int,
                        mode: str) -> None:
    """Rejects bad --bench-* options before anything is run."""
    from autoshard.serving.suites import SUITES

    bench_config({"requests": "--bench-requests", "rounds": "--bench-rounds",
                  "warmup": "--bench-warmup", "mode": "--bench-mode"},
                 qps=SUITES[suite].qps, requests=requests, rounds=rounds, warmup=warmup,
                 mode=mode)


@serve_app.command("compare")
def compare_cmd(
    suite: Annotated[str, typer.Option(help="Serving suite: small, medium, large, sparse, "
                                       "bench, paper.")] = "medium",
    requests: RequestsOpt = 10_000,
    samples: SamplesOpt = 5,
    span: SpanOpt = 4,
    seeds: Annotated[str, typer.Option(help="Fresh seeds the answer is planned again on "
                                       "(comma-separated; empty: none).")] = "",
    measure: Annotated[bool, typer.Option(
        help="Also serve every strategy for real here (small suites).")] = False,
    bench_requests: Annotated[int, typer.Option(
        help="Measured requests per rate and round, warm-up included.")] = 300,
    bench_rounds: Annotated[int, typer.Option(
        help="Measured rounds over the deployments and rates; the median round is "
        "reported, with the range.")] = 3,
    bench_warmup: Annotated[int, typer.Option(
        help="Requests dropped at the start of each rate's round.")] = 0,
    bench_mode: ModeOpt = "replay",
    bench_pin: Annotated[bool, typer.Option(
        help="Calibrate and replay with the server and its caller on cores of their own.")
    ] = False,
    seed: SeedOpt = 0,
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder.")] = Path(
        "runs/serving"),
) -> None:
    """Every strategy on a suite at its request rates: P99 vs servers, the fewest servers
    meeting the target (and again on each of --seeds), the optimiser's out-of-sample margin at
    equal shards. With --measure, first calibrates this
    machine's constants (`serve calibrate`), then serves every strategy for real and reports
    measured beside simulated. Writes SUITE.md/.csv/.png/.json (and SUITE.bench.*)."""
    import sys

    from autoshard.serving.suite_report import write_suite
    from autoshard.serving.suite_run import calibrated_profile, measure_suite
    from autoshard.serving.suites import SUITES

    if suite not in SUITES:
        raise InputError(f"unknown serving suite (known: {', '.join(SUITES)})",
                         source="command line", field="--suite", value=suite)
    check_output_path(output / f"{suite}.md")
    require_all({"matplotlib": "plots", **({"torch": "run"} if measure else {})})
    if measure:
        check_bench_options(suite, bench_requests, bench_rounds, bench_warmup, bench_mode)
    fresh = parse_seeds(seeds)
    profile = calibrated_profile(suite, bench_pin) if measure else None
    rows, per_rate = _simulated_suite(suite, requests, span, seed, profile, samples, fresh)
    measured = (measure_suite(suite, bench_requests, seed, profile, bench_rounds, bench_warmup,
                              bench_mode, bench_pin) if measure else None)
    command = "autoshard serve " + " ".join(sys.argv[sys.argv.index("compare"):]) \
        if "compare" in sys.argv else f"autoshard serve compare --suite {suite}"
    write_suite(suite, output, command, rows, per_rate, measured)
    for rate in per_rate:
        again = ", ".join(str(r["total_servers"]) for r in rate["seeds"])
        console.print(f"{rate['qps']:g} qps: fewest servers meeting P99 <= "
                      f"{rate['p99_target_ms']:g} ms: {rate['answer']['total_servers']}"
                      + (f" (seeds {seeds}: {again})" if again else ""))
    if measured is not None:
        console.print(f"measured vs simulated Spearman: P99 {measured['spearman_p99']}, "
                      f"P90 {measured['spearman_p90']}, P50 {measured['spearman_p50']}")
    console.print(f"wrote {output}/{suite}.md")


def _simulated_suite(suite: str, requests: int, span: int, seed: int, profile: Any,
                     samples: int, fresh: tuple[int, ...]) -> tuple[Any, Any]:
    """:func:`autoshard.serving.suite_run.simulate_suite`, its deployments shown as they are
    simulated."""
    from autoshard.serving.suite_run import simulate_suite, suite_size

    with progress_bar("simulating deployments", suite_size(suite, span, fresh),
                      "deployments") as advance:
        return simulate_suite(suite, requests, span, seed, profile, samples, fresh, advance)


@serve_app.command("study")
def study_cmd(
    requests: RequestsOpt = 10_000,
    samples: SamplesOpt = 5,
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder.")] = Path(
        "runs/serving"),
) -> None:
    """Lui et al.'s findings checked here: the best mapping's P99 overhead against the
    unsharded model, compute overhead growing with shards, capacity- against load-balanced,
    and sparsity against fan-out, each as a function of the dense-to-remote work ratio.
    Writes study.md and study.json."""
    from autoshard.serving.study import run_study, write_study

    check_output_path(output / "study.md")
    found = run_study(requests, samples, partial(progress_bar, unit="deployments"))
    write_study(found, output)
    for line in found["verdicts"]:
        console.print(f"- {line}")
    console.print(f"wrote {output}/study.md")
