"""Ranges and parsers of the serving options that more than one module checks (light to
import: the command line reads them before any work)."""

from __future__ import annotations

from autoshard.errors import InputError
from autoshard.limits import QPS, SEED, Range

#: Independent request samples a deployment is judged on (two at least, for an interval).
SAMPLES = Range(2, 100, integer=True)
#: Replicas of one shard or of the main tier.
REPLICAS = Range(1, 4096, integer=True)


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


def parse_seeds(spec: str) -> tuple[int, ...]:
    """Comma-separated seeds, each in :data:`autoshard.limits.SEED`."""
    try:
        out = tuple(int(v) for v in spec.split(",") if v.strip())
    except ValueError as exc:
        raise InputError("expected comma-separated integers", source="command line",
                         field="--seeds", value=spec) from exc
    for value in out:
        SEED.check(value, "--seeds", "command line")
    return out
