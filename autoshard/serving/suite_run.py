"""Run a serving suite: every strategy over server counts and request rates (simulated), and,
for small suites, every strategy served for real (measured), with a report."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from autoshard.serving.cluster import (
    ServingProfile,
    load_serving_profile,
    with_calibration,
)
from autoshard.serving.planning import (
    advantage_at_equal_servers,
    answer,
    fewest_servers,
    replan,
    server_range,
    sweep,
)
from autoshard.serving.registry import get_strategy, strategy_names
from autoshard.serving.report import spearman
from autoshard.serving.suites import SUITES, suite_model
from autoshard.serving.task import ServingTask

MEASURED_SERVERS = 2


def simulate_suite(name: str, requests: int, span: int, seed: int = 0,
                   profile: ServingProfile | None = None, samples: int = 5,
                   seeds: Sequence[int] = ()) -> tuple[list[dict[str, Any]],
                                                       list[dict[str, Any]]]:
    """(sweep rows over every rate, per-rate summaries: the answer, fewest servers per
    strategy, the optimiser's out-of-sample margin, the answer on each of ``seeds`` and
    whether it holds there (:func:`autoshard.serving.planning.seed_check`))."""
    spec = SUITES[name]
    model = suite_model(name)
    profile = profile or load_serving_profile(spec.profile)
    rows: list[dict[str, Any]] = []
    per_rate = []
    for qps in spec.qps:
        task = ServingTask(model, profile, qps=qps, p99_ms=spec.p99_ms, requests=requests,
                           seed=seed, samples=samples)
        got, found = sweep(task, strategy_names(), server_range(task, span))
        rows += got
        first = answer(got)
        again, checked = replan(task, first, found, seeds, strategy_names(), span)
        per_rate.append({"qps": qps, "p99_target_ms": spec.p99_ms,
                         "memory_bound_shards": task.min_servers(), "answer": _brief(first),
                         "fewest_servers": fewest_servers(got),
                         "advantage": advantage_at_equal_servers(got),
                         "seeds": [{"seed": s, **_brief(a)} for s, a in zip(seeds, again,
                                                                            strict=True)],
                         **checked})
    return rows, per_rate


def _brief(row: dict[str, Any] | None) -> dict[str, Any]:
    """The figures of an answer row worth repeating (none when nothing meets the target)."""
    keys = ("strategy", "servers", "total_servers", "replicas", "main_replicas", "p99_ms",
            "p99_lo_ms", "p99_hi_ms", "p99_sample_hi_ms", "marginal", "max_utilisation")
    return {k: row[k] for k in keys} if row else {"total_servers": None}


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
    ``warmup`` of them dropped, ``rounds`` times: the median per point), then one shard of
    load-balanced tables on one server and on two replicas. Reports Spearman of measured
    against simulated (``simulated_requests``) P50, P90 and P99 over every (mapping, rate),
    the range of measured over simulated P99, and the load average before and after."""
    from autoshard.serving.bench import BenchConfig, run_bench

    spec = SUITES[name]
    model = suite_model(name)
    profile = profile or load_serving_profile(spec.profile)
    task = ServingTask(model, profile, qps=spec.qps[0], requests=simulated_requests, seed=seed)
    config = BenchConfig(qps=spec.qps, requests=requests, seed=seed, rounds=rounds,
                         warmup=warmup, simulated_requests=simulated_requests)
    before = load_average()
    rows = []
    for strategy_name in strategy_names():
        strategy = get_strategy(strategy_name)
        mapping = strategy.map(task, MEASURED_SERVERS if strategy.needs_servers else 0)
        rows += run_bench(task, mapping.with_replicas((1,) * mapping.servers, 1), config)
    one = get_strategy("load_balanced").map(task, 1)
    replicated = [*run_bench(task, one.with_replicas((1,), 1), config),
                  *run_bench(task, one.with_replicas((2,), 1), config)]
    every = rows + replicated
    rho = {q: spearman([r[f"simulated_{q}_ms"] for r in every],
                       [r[f"measured_{q}_ms"] for r in every]) for q in ("p50", "p90", "p99")}
    ratios = [r["p99_ratio"] for r in every]
    return {"rows": rows, "replicated": replicated,
            **{f"spearman_{q}": round(v, 4) for q, v in rho.items()},
            "p99_ratio_range": [min(ratios), max(ratios)],
            "within_1_5x": sum(1 / 1.5 <= r <= 1.5 for r in ratios), "points": len(ratios),
            "profile": profile.to_dict(), "load_average_before": before,
            "load_average": load_average()}


def load_average() -> list[float]:
    """This machine's 1, 5 and 15 minute load averages now (empty where unknown)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []
