"""Capacity planning: every strategy over a range of server counts, and the fewest servers
that meet a P99 target."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from autoshard.errors import PlannerError
from autoshard.serving.mapping import Mapping
from autoshard.serving.registry import get_strategy
from autoshard.serving.simulate import Latencies, simulate, single_server
from autoshard.serving.task import ServingTask


@dataclass(frozen=True)
class Evaluation:
    """One mapping simulated on a task, next to the single hypothetical server."""

    mapping: Mapping
    latencies: Latencies
    single: Latencies
    memory_gb: tuple[float, ...]

    def row(self) -> dict[str, Any]:
        lat, one = self.latencies, self.single
        p99 = lat.percentile_ms(99)
        fits = float(one.utilisation.max()) < 1.0  # an overloaded reference has no P99 to compare
        return {
            "strategy": self.mapping.strategy, "servers": self.mapping.servers,
            "p50_ms": round(lat.percentile_ms(50), 4), "p90_ms": round(lat.percentile_ms(90), 4),
            "p99_ms": round(p99, 4),
            "p99_overhead": round(p99 / one.percentile_ms(99) - 1, 4) if fits else None,
            "calls_per_request": round(float(lat.calls.mean()), 3),
            "compute_us_per_request": round(float(lat.compute_us.mean()), 2),
            "compute_overhead": round(float(lat.compute_us.mean() / one.compute_us.mean()) - 1,
                                      4),
            "max_utilisation": round(float(lat.utilisation.max()), 4),
            "memory_gb_max": round(max(self.memory_gb), 3),
            "memory_gb_main": round(self.memory_gb[0], 3),
            "note": self.mapping.note,
        }


class Evaluator:
    """Simulates mappings of one task (one request sample, one single-server reference)."""

    def __init__(self, task: ServingTask) -> None:
        self.task = task

    @cached_property
    def single(self) -> Latencies:
        return self.simulate(single_server(self.task.model))

    def simulate(self, mapping: Mapping) -> Latencies:
        t = self.task
        return simulate(t.model, t.profile, mapping, t.qps, t.sample, t.costs)

    def evaluate(self, mapping: Mapping) -> Evaluation:
        mapping.check_fits(self.task.model, self.task.profile)
        memory = tuple(float(b) / 1e9 for b in mapping.memory_bytes(self.task.model))
        return Evaluation(mapping, self.simulate(mapping), self.single, memory)


def server_range(task: ServingTask, span: int) -> list[int]:
    """Sparse server counts to sweep: from the memory bound, ``span`` counts."""
    low = max(task.min_servers(), 1)
    return list(range(low, min(low + span, task.profile.max_servers + 1)))


def sweep(task: ServingTask, strategies: Sequence[str], servers: Sequence[int],
          options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A row per (strategy, server count) that fits; ``singular`` once, at 0 servers."""
    ev = Evaluator(task)
    rows = []
    for name in strategies:
        strategy = get_strategy(name, **(options or {}).get(name, {}))
        counts = list(servers) if strategy.needs_servers else [0]
        for count in counts:
            try:
                mapping = strategy.map(task, count)
            except PlannerError as exc:
                rows.append({"strategy": name, "servers": count, "error": str(exc)})
                continue
            rows.append(dict(ev.evaluate(mapping).row(), qps=task.qps))
    return rows


def fewest_servers(rows: Sequence[dict[str, Any]], p99_ms: float) -> dict[str, int | None]:
    """Per strategy, the fewest servers whose P99 meets the target (None: none swept does)."""
    out: dict[str, int | None] = {}
    for row in rows:
        name = row["strategy"]
        out.setdefault(name, None)
        if "error" in row or row["p99_ms"] > p99_ms:
            continue
        best = out[name]
        out[name] = row["servers"] if best is None else min(best, row["servers"])
    return out


def advantage_at_equal_servers(rows: Sequence[dict[str, Any]],
                               ours: str = "optimiser") -> list[dict[str, Any]]:
    """Per server count: our P99, the best baseline's, and how much lower ours is."""
    out = []
    counts = sorted({r["servers"] for r in rows if r["strategy"] == ours and "error" not in r})
    for count in counts:
        at = [r for r in rows if r["servers"] == count and "error" not in r]
        mine = next(r for r in at if r["strategy"] == ours)
        others = [r for r in at if r["strategy"] != ours]
        if not others:
            continue
        best = min(others, key=lambda r: r["p99_ms"])
        out.append({"servers": count, "optimiser_p99_ms": mine["p99_ms"],
                    "best_baseline": best["strategy"], "best_baseline_p99_ms": best["p99_ms"],
                    "p99_reduction": round(1 - mine["p99_ms"] / best["p99_ms"], 4),
                    "worst_baseline_p99_ms": max(r["p99_ms"] for r in others)})
    return out


def percentiles(values_us: np.ndarray) -> dict[str, float]:
    return {f"p{q}_ms": round(float(np.percentile(values_us, q)) / 1e3, 4) for q in (50, 90, 99)}
