"""Run a serving suite: every strategy over server counts and request rates (simulated), and,
for small suites, every strategy served for real (measured), with a report."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from autoshard.progress import Advance
from autoshard.serving.cluster import (
    ServingProfile,
    load_serving_profile,
    with_calibration,
)
from autoshard.serving.mapping import Mapping
from autoshard.serving.planning import (
    advantage_at_equal_servers,
    answer,
    fewest_servers,
    replan,
    server_range,
    sweep,
    sweep_size,
)
from autoshard.serving.registry import get_strategy, strategy_names
from autoshard.serving.report import spearman
from autoshard.serving.suites import SUITES, suite_model
from autoshard.serving.task import ServingTask

MEASURED_SERVERS = 2


def suite_size(name: str, span: int, seeds: Sequence[int] = ()) -> int:
    """The deployments :func:`simulate_suite` evaluates."""
    spec = SUITES[name]
    model, profile = suite_model(name), load_serving_profile(spec.profile)
    total = 0
    for qps in spec.qps:
        task = ServingTask(model, profile, qps=qps, p99_ms=spec.p99_ms)
        total += (1 + len(seeds)) * sweep_size(strategy_names(), server_range(task, span))
    return total


def simulate_suite(name: str, requests: int, span: int, seed: int = 0,
                   profile: ServingProfile | None = None, samples: int = 5,
                   seeds: Sequence[int] = (), advance: Advance | None = None
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(sweep rows over every rate, per-rate summaries: the answer, fewest servers per
    strategy, the optimiser's out-of-sample margin, the answer on each of ``seeds`` and
    whether it holds there (:func:`autoshard.serving.planning.seed_check`)); ``advance(1)`` as
    each deployment is done (:func:`suite_size` in all)."""
    spec = SUITES[name]
    model = suite_model(name)
    profile = profile or load_serving_profile(spec.profile)
    rows: list[dict[str, Any]] = []
    per_rate = []
    for qps in spec.qps:
        task = ServingTask(model, profile, qps=qps, p99_ms=spec.p99_ms, requests=requests,
                           seed=seed, samples=samples)
        got, found = sweep(task, strategy_names(), server_range(task, span), advance=advance)
        rows += got
        first = answer(got)
        again, checked = replan(task, first, found, seeds, strategy_names(), span,
                                advance=advance)
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


def calibrated_profile(name: str, pin: bool = False) -> ServingProfile:
    """The suite's profile with this machine's constants measured now
    (:func:`autoshard.serving.calibrate.calibrate`)."""
    from autoshard.serving.calibrate import calibrate

    found = calibrate(pin=pin)
    return with_calibration(load_serving_profile(SUITES[name].profile), found)


#: Shards of the wide measured deployment: with its main server, more servers than a small
#: host has cores.
WIDE_SHARDS = 6
#: The extra rate one shard on one and on two replicas is also measured at (requests per
#: second): where the simulator puts the replicated shard clearly ahead.
REPLICA_QPS = 800.0


def measured_deployments(task: ServingTask) -> dict[str, list[Mapping]]:
    """What ``measure_suite`` serves: every strategy on two shards (main_only on none), one
    server each; one shard of load-balanced tables on one and on two replicas; load-balanced
    tables on :data:`WIDE_SHARDS` shards."""
    mappings = []
    for name in strategy_names():
        strategy = get_strategy(name)
        mapping = strategy.map(task, MEASURED_SERVERS if strategy.needs_servers else 0)
        mappings.append(mapping.with_replicas((1,) * mapping.servers, 1))
    one = get_strategy("load_balanced").map(task, 1)
    wide = get_strategy("load_balanced").map(task, WIDE_SHARDS)
    return {"rows": mappings, "replicated": [one.with_replicas((1,), 1),
                                             one.with_replicas((2,), 1)],
            "wide": [wide.with_replicas((1,) * WIDE_SHARDS, 1)]}


def measure_suite(name: str, requests: int, seed: int = 0,
                  profile: ServingProfile | None = None, rounds: int = 3, warmup: int = 0,
                  mode: str = "replay", pin: bool = False) -> dict[str, Any]:
    """Measures here (``serve bench``'s ``mode``) every deployment of
    :func:`measured_deployments` at each of the suite's rates, ``rounds`` interleaved rounds
    of ``requests`` each (``warmup`` of them dropped), and the replicated pair also at
    :data:`REPLICA_QPS`. Reports how the simulator agrees with the measurement
    (:func:`agreement`) and whether two replicas measured faster than one
    (:func:`replica_verdicts`), with the load average before and after."""
    from autoshard.serving.bench import BenchConfig, pinned_cores, run_bench

    spec = SUITES[name]
    profile = profile or load_serving_profile(spec.profile)
    wide = replace(profile, max_servers=max(profile.max_servers, WIDE_SHARDS + 1))
    task = ServingTask(suite_model(name), wide, qps=spec.qps[0], seed=seed)
    config = BenchConfig(qps=spec.qps, requests=requests, seed=seed, rounds=rounds,
                         warmup=warmup, mode=mode, pin=pin)
    before = load_average()
    groups = measured_deployments(task)
    every = [m for ms in groups.values() for m in ms]
    found = run_bench(task, every, config)
    extra = run_bench(task, groups["replicated"], replace(config, qps=(REPLICA_QPS,)))
    out: dict[str, Any] = {}
    at = 0
    for key, ms in groups.items():
        out[key] = found[at:at + len(ms) * len(spec.qps)]
        at += len(ms) * len(spec.qps)
    out["replicated"] += extra
    return {**out, **agreement(out["rows"] + out["replicated"] + out["wide"]),
            "replica_verdicts": replica_verdicts(out["replicated"]), "mode": mode,
            "pinned": bool(mode == "replay" and pinned_cores(pin)),
            "profile": profile.to_dict(), "load_average_before": before,
            "load_average": load_average()}


def agreement(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Over the points below the utilisation ceiling: Spearman of measured against simulated
    P50, P90 and P99, the range of measured over simulated P99 and how many points lie within
    1.5x."""
    ok = [r for r in rows if r["below_ceiling"]]
    rho = {q: spearman([r[f"simulated_{q}_ms"] for r in ok],
                       [r[f"measured_{q}_ms"] for r in ok]) for q in ("p50", "p90", "p99")}
    ratios = [r["p99_ratio"] for r in ok]
    return {**{f"spearman_{q}": round(v, 4) for q, v in rho.items()},
            "p99_ratio_range": [min(ratios), max(ratios)],
            "within_1_5x": sum(1 / 1.5 <= r <= 1.5 for r in ratios), "points": len(ratios),
            "above_ceiling": len(rows) - len(ok)}


def replica_verdicts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rate, one shard on two replicas against one server: whether the simulator puts the
    replicated one lower (P99), and whether it measured lower with intervals (the range over
    rounds) apart."""
    out = []
    for qps in sorted({r["qps"] for r in rows}):
        one = next(r for r in rows if r["qps"] == qps and r["replicas"] == "1")
        two = next(r for r in rows if r["qps"] == qps and r["replicas"] == "2")
        out.append({"qps": qps, "one_p99_ms": one["measured_p99_ms"],
                    "one_interval": [one["measured_p99_lo_ms"], one["measured_p99_hi_ms"]],
                    "two_p99_ms": two["measured_p99_ms"],
                    "two_interval": [two["measured_p99_lo_ms"], two["measured_p99_hi_ms"]],
                    "simulated_faster": two["simulated_p99_ms"] < one["simulated_p99_ms"],
                    "measured_faster_apart": two["measured_p99_hi_ms"]
                    < one["measured_p99_lo_ms"]})
    return out


def load_average() -> list[float]:
    """This machine's 1, 5 and 15 minute load averages now (empty where unknown)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []
