"""A serving task: a model, a serving profile, a request rate and a latency target."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from autoshard.errors import InputError, gib
from autoshard.limits import P99_TARGET_MS, QPS, SIMULATED_REQUESTS
from autoshard.serving.model import ServingModel, TableCosts, table_costs
from autoshard.serving.profile import ServingProfile
from autoshard.serving.simulate import RequestSample, sample_requests


@dataclass(frozen=True)
class ServingTask:
    """What to serve, on what, at what rate.

    Args:
        model: The served model.
        profile: The serving cluster.
        qps: Request rate, requests per second.
        p99_ms: P99 latency target, ms (None: no target).
        requests: Requests simulated per evaluation.
        seed: Seed of the sampled requests and tail factors.
    """

    model: ServingModel
    profile: ServingProfile
    qps: float
    p99_ms: float | None = None
    requests: int = 20_000
    seed: int = 0

    def __post_init__(self) -> None:
        QPS.check(self.qps, "qps")
        if self.p99_ms is not None:
            P99_TARGET_MS.check(self.p99_ms, "p99_ms")
        SIMULATED_REQUESTS.check(self.requests, "requests")
        largest = max(self.profile.server_bytes, self.profile.main_bytes)
        sizes = self.model.table_bytes()
        big = int(np.argmax(sizes))
        if sizes[big] > largest:
            table = self.model.tables[big]
            raise InputError(f"table needs {gib(sizes[big])}, larger than any server "
                             f"({gib(largest)})", field=f"{table.name}.rows", value=table.rows)

    @cached_property
    def costs(self) -> TableCosts:
        return table_costs(self.model, self.profile)

    @cached_property
    def sample(self) -> RequestSample:
        return sample_requests(self.model, self.requests, self.seed)

    def min_servers(self) -> int:
        """Lower bound on sparse servers: 0 if the main server holds everything, else the
        tables' bytes over one server's memory, rounded up."""
        total = float(self.model.table_bytes().sum())
        if total <= self.profile.main_bytes:
            return 0
        return max(1, math.ceil(total / self.profile.server_bytes - 1e-9))
