"""Judging a deployment: latency percentiles with confidence intervals over independent request
samples, feasibility, and the overheads against the unsharded model.

A deployment is *feasible* when it fits every server's memory less headroom and every server's
cores and network interface stay below the profile's utilisation ceiling on every sample. It
*meets* a P99 target when it is feasible and its P99 is within the target on every sample. It
meets it *marginally* when the target also lies below the upper end of the 95% prediction
interval of one sample's P99 (Student's t over the samples): a fresh sample may well miss it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from autoshard.serving.mapping import Mapping
from autoshard.serving.simulate import (
    Latencies,
    RequestSample,
    offered_load,
    simulate,
    single_server,
)
from autoshard.serving.task import ServingTask


@dataclass(frozen=True)
class Interval:
    """A figure's mean over samples and its 95% confidence interval."""

    mean: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: np.ndarray) -> Interval:
        """Student's t interval of the mean of ``values`` (two or more)."""
        from scipy.stats import t

        values = np.asarray(values, float)
        mean = float(values.mean())
        half = float(t.ppf(0.975, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size))
        return cls(mean, mean - half, mean + half)

    @classmethod
    def of_one(cls, values: np.ndarray) -> Interval:
        """Student's t 95% prediction interval of one more value drawn like ``values`` (two or
        more): where a fresh sample's figure lies."""
        from scipy.stats import t

        values = np.asarray(values, float)
        mean = float(values.mean())
        half = float(t.ppf(0.975, values.size - 1) * values.std(ddof=1)
                     * np.sqrt(1 + 1 / values.size))
        return cls(mean, mean - half, mean + half)


@dataclass(frozen=True)
class Evaluation:
    """One deployment simulated on a task's samples, beside the unsharded reference."""

    task: ServingTask
    mapping: Mapping
    runs: list[Latencies]
    reference: list[Latencies] | None
    memory_gb: tuple[float, ...]

    def percentile(self, q: float) -> Interval:
        return Interval.of(self.per_sample(q))

    def per_sample(self, q: float) -> np.ndarray:
        """The ``q``-th percentile of each sample, ms."""
        return np.array([r.percentile_ms(q) for r in self.runs])

    @property
    def max_utilisation(self) -> float:
        return max(r.max_utilisation for r in self.runs)

    @property
    def max_nic(self) -> float:
        return max(r.max_nic for r in self.runs)

    @property
    def feasible(self) -> bool:
        ceiling = self.task.profile.utilisation_ceiling
        return (self.max_utilisation < ceiling and self.max_nic < ceiling
                and self.mapping.total_servers <= self.task.profile.max_servers)

    def meets(self, target_ms: float | None = None) -> bool:
        """Feasible, and the P99 within the target (the task's by default) on every sample."""
        target = self.task.p99_ms if target_ms is None else target_ms
        return (self.feasible and target is not None
                and float(self.per_sample(99).max()) <= target)

    def marginal(self, target_ms: float | None = None) -> bool:
        """Meets the target, but a fresh sample's P99 may well exceed it: the target lies below
        the upper end of the P99's 95% prediction interval (:meth:`Interval.of_one`)."""
        target = self.task.p99_ms if target_ms is None else target_ms
        return (target is not None and self.meets(target)
                and Interval.of_one(self.per_sample(99)).hi > target)

    def row(self) -> dict[str, Any]:
        """The figures of a sweep row (every one finite)."""
        p50, p90, p99 = (self.percentile(q) for q in (50, 90, 99))
        compute = float(np.mean([r.compute_us.mean() for r in self.runs]))
        ref = self.reference
        ref_p99 = float(np.mean([r.percentile_ms(99) for r in ref])) if ref else None
        ref_compute = float(np.mean([r.compute_us.mean() for r in ref])) if ref else None
        m = self.mapping
        return {
            "strategy": m.strategy, "servers": m.servers, "total_servers": m.total_servers,
            "main_replicas": m.main_replicas,
            "replicas": ",".join(str(r) for r in m.replica_counts) or "-",
            "cost": round(m.cost(self.task.profile), 3),
            "p50_ms": round(p50.mean, 4), "p90_ms": round(p90.mean, 4),
            "p99_ms": round(p99.mean, 4), "p99_lo_ms": round(p99.lo, 4),
            "p99_hi_ms": round(p99.hi, 4),
            "p99_max_ms": round(float(self.per_sample(99).max()), 4),
            "p99_sample_hi_ms": round(Interval.of_one(self.per_sample(99)).hi, 4),
            "p99_overhead": None if ref_p99 is None else round(p99.mean / ref_p99 - 1, 4),
            "calls_per_request": round(float(np.mean([r.calls.mean() for r in self.runs])), 3),
            "compute_us_per_request": round(compute, 2),
            "compute_overhead": None if ref_compute is None else round(
                compute / ref_compute - 1, 4),
            "max_utilisation": round(self.max_utilisation, 4),
            "max_nic_utilisation": round(self.max_nic, 4),
            "memory_gb_max": round(max(self.memory_gb), 3),
            "memory_gb_main": round(self.memory_gb[0], 3),
            "allocated_gb": round(self.allocated_gb(), 3),
            "feasible": self.feasible, "meets": self.meets(), "marginal": self.marginal(),
            "samples": len(self.runs), "note": m.note,
        }

    def allocated_gb(self) -> float:
        """Memory the deployment allocates: each server's tables times its replicas."""
        m = self.mapping
        return float(self.memory_gb[0] * m.main_replicas
                     + np.dot(self.memory_gb[1:], m.replica_counts))


class Evaluator:
    """Simulates deployments of one task on a set of its samples, beside the unsharded model
    (one server holding every table, replicated until it is below the ceiling).

    Args:
        task: The serving task.
        samples: The request samples judged on (default: the task's judging samples).
    """

    #: Evaluations kept for asking again (provisioning, then the sweep, ask of the same
    #: deployment on the validation samples).
    KEPT = 16

    def __init__(self, task: ServingTask, samples: list[RequestSample] | None = None) -> None:
        self.task = task
        self.samples = samples if samples is not None else task.judge_samples
        self._kept: dict[Mapping, Evaluation] = {}

    def simulate(self, mapping: Mapping) -> list[Latencies]:
        t = self.task
        costs = t.costs_for(mapping.part_set(t.model.num_tables))
        return simulate(t.model, t.profile, mapping, t.qps, self.samples, costs)

    def offered(self, mapping: Mapping) -> tuple[float, np.ndarray]:
        """Servers' worth of load offered to the main tier and to each shard."""
        t = self.task
        costs = t.costs_for(mapping.part_set(t.model.num_tables))
        return offered_load(t.model, t.profile, mapping, t.qps, self.samples[0], costs)

    @cached_property
    def reference_mapping(self) -> Mapping | None:
        """The unsharded model with enough main replicas for its offered load to sit below the
        ceiling (None when even ``max_servers`` are not enough)."""
        one = single_server(self.task.base_parts.size)
        one = Mapping(0, one.assign, one.strategy, parts=self.task.base_parts)
        main, _ = self.offered(one)
        replicas = int(main / self.task.profile.utilisation_ceiling) + 1
        if replicas > self.task.profile.max_servers:
            return None
        return one.with_replicas((), replicas)

    @cached_property
    def reference(self) -> list[Latencies] | None:
        """The reference's latencies (None when it is past capacity)."""
        if self.reference_mapping is None:
            return None
        runs = self.simulate(self.reference_mapping)
        ceiling = self.task.profile.utilisation_ceiling
        return runs if max(r.max_utilisation for r in runs) < ceiling else None

    def evaluate(self, mapping: Mapping) -> Evaluation:
        """Simulates ``mapping`` (which must fit memory less headroom) on every sample.

        Raises:
            PlannerError: A server's tables exceed its memory less headroom.
        """
        if mapping in self._kept:
            return self._kept[mapping]
        t = self.task
        costs = t.costs_for(mapping.part_set(t.model.num_tables))
        mapping.check_fits(costs.bytes, t.profile)
        memory = tuple(float(b) / 1e9 for b in mapping.memory_bytes(costs.bytes))
        found = Evaluation(t, mapping, self.simulate(mapping), self.reference, memory)
        if len(self._kept) >= self.KEPT:
            self._kept.pop(next(iter(self._kept)))
        self._kept[mapping] = found
        return found
