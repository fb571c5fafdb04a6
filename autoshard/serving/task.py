"""A serving task: a model, a serving profile, a request rate, a latency target, and the
request samples every mapping of it is judged on."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from autoshard.errors import PlannerError, gib
from autoshard.limits import P99_TARGET_MS, QPS, SIMULATED_REQUESTS
from autoshard.serving.cluster import ServingProfile
from autoshard.serving.costs import PartCosts, part_costs
from autoshard.serving.model import ServingModel
from autoshard.serving.parts import PartSet, check_precision, fitting_parts
from autoshard.serving.ranges import SAMPLES
from autoshard.serving.simulate import RequestSample, sample_requests

#: Stream of the optimiser's own search sample, apart from the judging samples 1..samples.
SEARCH_STREAM = 0
#: Streams of the validation samples (provisioning, the optimiser's choice of its result).
VALIDATE_STREAMS = (101, 102, 103)


@dataclass(frozen=True)
class ServingTask:
    """What to serve, on what, at what rate.

    Args:
        model: The served model.
        profile: The serving cluster.
        qps: Request rate, requests per second.
        p99_ms: P99 latency target, ms (None: no target).
        requests: Requests per sample.
        seed: Seed of the samples: judging sample ``k`` is drawn from ``(seed, k)``,
            ``k = 1..samples``; the optimiser searches on ``(seed, 0)`` and choices before
            judging (replicas, the optimiser's pick) use :data:`VALIDATE_STREAMS`.
        samples: Independent request samples each mapping is judged on.
        precision: Serving precision of the rows (:data:`autoshard.serving.parts.PRECISIONS`).
    """

    model: ServingModel
    profile: ServingProfile
    qps: float
    p99_ms: float | None = None
    requests: int = 10_000
    seed: int = 0
    samples: int = 5
    precision: str = "fp32"

    def __post_init__(self) -> None:
        QPS.check(self.qps, "qps")
        if self.p99_ms is not None:
            P99_TARGET_MS.check(self.p99_ms, "p99_ms")
        SIMULATED_REQUESTS.check(self.requests, "requests")
        SAMPLES.check(self.samples, "samples")
        check_precision(self.precision)

    @cached_property
    def base_parts(self) -> PartSet:
        """Whole tables, a table larger than a server row-split to fit."""
        return fitting_parts(self.model, self.precision, self.profile.usable_server_bytes)

    @cached_property
    def _costs(self) -> dict[PartSet, PartCosts]:
        return {}

    def costs_for(self, parts: PartSet) -> PartCosts:
        """The parts' costs on this task's profile and precision (cached)."""
        if parts not in self._costs:
            self._costs[parts] = part_costs(self.model, self.profile, parts, self.precision)
        return self._costs[parts]

    @property
    def costs(self) -> PartCosts:
        return self.costs_for(self.base_parts)

    @cached_property
    def judge_samples(self) -> list[RequestSample]:
        """The independent samples every mapping is judged on."""
        return [sample_requests(self.model, self.requests, (self.seed, k))
                for k in range(1, self.samples + 1)]

    @cached_property
    def validate_samples(self) -> list[RequestSample]:
        """Samples for choices made before judging (replicas, the optimiser's pick)."""
        return [sample_requests(self.model, self.requests, (self.seed, k))
                for k in VALIDATE_STREAMS]

    @cached_property
    def search_sample(self) -> RequestSample:
        """The optimiser's own sample, used by no judgement."""
        return sample_requests(self.model, self.requests, (self.seed, SEARCH_STREAM))

    def total_bytes(self) -> float:
        return float(self.costs.bytes.sum())

    def min_servers(self) -> int:
        """Lower bound on sparse shards: 0 if the main server holds everything (less
        headroom), else the tables' bytes over one server's memory less headroom, rounded up.

        Raises:
            PlannerError: Even ``max_servers`` servers cannot hold the tables.
        """
        total = self.total_bytes()
        if total <= self.profile.usable_main_bytes:
            return 0
        low = max(1, math.ceil(total / self.profile.usable_server_bytes - 1e-9))
        if low > self.profile.max_servers:
            raise PlannerError("capacity", f"the tables need {gib(total)}: {low} servers of "
                               f"{gib(self.profile.usable_server_bytes)} usable each, the "
                               f"profile allows {self.profile.max_servers}")
        return low
