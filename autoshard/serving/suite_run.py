"""Run a serving suite: every strategy over server counts and request rates (simulated), and,
for small suites, every strategy served for real (measured), with a report."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from autoshard.fileio import atomic_write_text, write_structured
from autoshard.machine import describe_machine
from autoshard.serving.planning import (
    advantage_at_equal_servers,
    fewest_servers,
    server_range,
    sweep,
)
from autoshard.serving.profile import (
    CALIBRATED,
    ServingProfile,
    load_serving_profile,
    with_calibration,
)
from autoshard.serving.registry import get_strategy, strategy_names
from autoshard.serving.report import (
    BENCH_COLUMNS,
    SWEEP_COLUMNS,
    markdown_table,
    plot_measured_vs_simulated,
    plot_p99_vs_servers,
    spearman,
    write_csv,
)
from autoshard.serving.suites import SUITES, suite_model
from autoshard.serving.task import ServingTask

MEASURED_SERVERS = 2


def simulate_suite(name: str, requests: int, span: int, seed: int = 0,
                   profile: ServingProfile | None = None
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(sweep rows over every rate, per-rate summaries: fewest servers and advantage)."""
    spec = SUITES[name]
    model = suite_model(name, seed)
    profile = profile or load_serving_profile(spec.profile)
    rows: list[dict[str, Any]] = []
    per_rate = []
    for qps in spec.qps:
        task = ServingTask(model, profile, qps=qps, p99_ms=spec.p99_ms, requests=requests,
                           seed=seed)
        got = sweep(task, strategy_names(), server_range(task, span))
        rows += got
        fewest = fewest_servers(got, spec.p99_ms)
        per_rate.append({"qps": qps, "p99_target_ms": spec.p99_ms,
                         "memory_bound_servers": task.min_servers(),
                         "fewest_servers": fewest,
                         "optimiser_servers_over_bound": server_gap(fewest, task.min_servers()),
                         "advantage": advantage_at_equal_servers(got),
                         "single_server_p99_ms": _single_p99(got)})
    return rows, per_rate


def server_gap(fewest: dict[str, int | None], bound: int) -> int | None:
    """How many servers the optimiser needs beyond the memory bound (0: provably fewest)."""
    ours = fewest.get("optimiser")
    return None if ours is None else ours - max(bound, 1)


def _single_p99(rows: list[dict[str, Any]]) -> float | None:
    for r in rows:
        if not r.get("error") and r["p99_overhead"] is not None:
            return round(r["p99_ms"] / (1 + r["p99_overhead"]), 4)
    return None


def calibrated_profile(name: str) -> ServingProfile:
    """The suite's profile with this machine's constants measured now
    (:func:`autoshard.serving.bench.calibrate`)."""
    from autoshard.serving.bench import calibrate

    found = calibrate()
    return with_calibration(load_serving_profile(SUITES[name].profile), found)


def measure_suite(name: str, requests: int, seed: int = 0,
                  profile: ServingProfile | None = None,
                  simulated_requests: int = 20_000, rounds: int = 1,
                  warmup: int = 0) -> dict[str, Any]:
    """Serves every strategy's mapping here at each of the suite's rates (``requests`` each,
    ``warmup`` of them dropped, ``rounds`` times: the median per point); Spearman of measured
    against simulated (``simulated_requests``) P50, P90 and P99 over (strategy, rate)."""
    from autoshard.serving.bench import BenchConfig, run_bench

    spec = SUITES[name]
    model = suite_model(name, seed)
    profile = profile or load_serving_profile(spec.profile)
    task = ServingTask(model, profile, qps=spec.qps[0], requests=simulated_requests, seed=seed)
    config = BenchConfig(qps=spec.qps, requests=requests, seed=seed, rounds=rounds,
                         warmup=warmup, simulated_requests=simulated_requests)
    rows = []
    for strategy_name in strategy_names():
        strategy = get_strategy(strategy_name)
        mapping = strategy.map(task, MEASURED_SERVERS if strategy.needs_servers else 0)
        rows += run_bench(task, mapping, config)
    rho = {q: spearman([r[f"simulated_{q}_ms"] for r in rows],
                       [r[f"measured_{q}_ms"] for r in rows]) for q in ("p50", "p90", "p99")}
    return {"rows": rows, **{f"spearman_{q}": round(v, 4) for q, v in rho.items()},
            "profile": profile.to_dict(), "load_average": load_average()}


def load_average() -> list[float]:
    """This machine's 1, 5 and 15 minute load averages now (empty where unknown)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def write_suite(name: str, output: Path, command: str, rows: list[dict[str, Any]],
                per_rate: list[dict[str, Any]], measured: dict[str, Any] | None) -> None:
    """SUITE.csv, SUITE.md, SUITE.png (and SUITE.bench.* when measured), SUITE.json."""
    spec = SUITES[name]
    machine = describe_machine()
    lines = [f"# Serving suite `{name}`", "",
             f"Command: `{command}`  ", f"Machine: {machine}  ",
             f"Model: {spec.tables} tables, {spec.total_gb:g} GB, {spec.groups} feature groups, "
             f"{spec.items} items per request; profile `{spec.profile}`; P99 target "
             f"{spec.p99_ms:g} ms.", "", "## Fewest sparse servers meeting the P99 target", ""]
    for rate in per_rate:
        lines.append(f"- {rate['qps']:g} qps (memory bound {rate['memory_bound_servers']}, "
                     f"optimiser {rate['optimiser_servers_over_bound']} over it; "
                     f"single-server P99 {rate['single_server_p99_ms']} ms): " + ", ".join(
                         f"{k} {v if v is not None else 'none swept'}"
                         for k, v in rate["fewest_servers"].items()))
    lines += ["", "## Optimiser vs the best and worst baseline at equal servers", "",
              markdown_table([dict(a, qps=r["qps"]) for r in per_rate for a in r["advantage"]],
                             ("qps", "servers", "optimiser_p99_ms", "best_baseline",
                              "best_baseline_p99_ms", "p99_reduction",
                              "worst_baseline_p99_ms")),
              "## Every strategy (simulated)", "", markdown_table(rows, SWEEP_COLUMNS)]
    output.mkdir(parents=True, exist_ok=True)
    if measured is not None:
        lines += ["## Measured here vs simulated", "",
                  f"Spearman (measured vs simulated over strategy x rate): P99 "
                  f"{measured['spearman_p99']}, P90 {measured['spearman_p90']}, P50 "
                  f"{measured['spearman_p50']}. Load average (1, 5, 15 min) after measuring: "
                  f"{measured['load_average']}. Simulated with this machine's constants, "
                  "measured by `serve calibrate` in the same run before the measured requests: "
                  + ", ".join(f"{k} {measured['profile'][k]}"
                              for k in (*CALIBRATED, "host_cores")) + ".", "",
                  markdown_table(measured["rows"], BENCH_COLUMNS)]
        write_csv(output / f"{name}.bench.csv", measured["rows"], BENCH_COLUMNS)
        plot_measured_vs_simulated(measured["rows"], output / f"{name}.bench.png",
                                   f"{name}: measured vs simulated P99")
    write_csv(output / f"{name}.csv", rows, SWEEP_COLUMNS)
    plot_p99_vs_servers(rows, output / f"{name}.png", f"suite {name}", spec.p99_ms)
    write_structured(output / f"{name}.json", {
        "suite": name, "command": command, "machine": machine, "per_rate": per_rate,
        "spearman_p99": measured and measured["spearman_p99"],
        "spearman_p90": measured and measured["spearman_p90"],
        "spearman_p50": measured and measured["spearman_p50"],
        "load_average": measured and measured["load_average"],
        "profile": measured and measured["profile"]})
    atomic_write_text(output / f"{name}.md", "\n".join(lines) + "\n")
