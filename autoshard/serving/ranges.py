"""Ranges and parsers of the serving options that more than one module checks (light to
import: the command line reads them before any work)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from autoshard.errors import InputError
from autoshard.limits import QPS, SEED, Range

N = TypeVar("N", int, float)

#: Independent request samples a deployment is judged on (two at least, for an interval).
SAMPLES = Range(2, 100, integer=True)
#: Replicas of one shard or of the main tier.
REPLICAS = Range(1, 4096, integer=True)


def parse_rates(spec: str) -> tuple[float, ...]:
    """Comma-separated request rates (at least one), each in :data:`autoshard.limits.QPS`."""
    return _numbers(spec, float, QPS, "--qps", "numbers", "request rate")


def parse_seeds(spec: str) -> tuple[int, ...]:
    """Comma-separated seeds (none is allowed), each in :data:`autoshard.limits.SEED`."""
    return _numbers(spec, int, SEED, "--seeds", "integers")


def _numbers(spec: str, cast: Callable[[str], N], allowed: Range, field: str, kind: str,
             one: str | None = None) -> tuple[N, ...]:
    """The comma-separated values of ``spec`` as ``cast``, each in ``allowed``; at least one
    where ``one`` names what each is."""
    try:
        values = tuple(cast(v) for v in spec.split(",") if v.strip())
    except ValueError as exc:
        raise InputError(f"expected comma-separated {kind}", source="command line",
                         field=field, value=spec) from exc
    if one is not None and not values:
        raise InputError(f"names no {one}", source="command line", field=field, value=spec)
    for value in values:
        allowed.check(value, field, "command line")
    return values
