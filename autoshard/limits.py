"""Upper limits on every size a user can give, and the check that priced figures are finite.

The limits sit far above any real DLRM cluster, yet low enough that every derived quantity
(a table's bytes, a step's lookups, a tier's transfer time) stays exact in int64 and finite in
float64, and that no command allocates per-device or per-table state beyond memory. A value over
a limit is an input error that names the field, never an overflow or a NaN further down.

Largest real figures, for scale: Meta's open DLRM dataset has 856 tables of at most ~4e7 rows
(REFERENCES.md); production embedding tables reach ~1e10 rows; the largest recommendation
training clusters have a few thousand GPUs; one node has 8-16 devices.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from autoshard.errors import InputError, PlannerError

#: Devices in one cluster (16,384: well above the largest recommendation-training clusters).
MAX_DEVICES = 16_384
#: Tables in one task.
MAX_TABLES = 1_000_000
#: Rows in one table (2^40, about 1.1e12: 100x the largest production tables).
MAX_ROWS = 2**40
#: Embedding dimension (elements per row).
MAX_DIM = 65_536
#: Optimizer state bytes per row.
MAX_OPTIMIZER_BYTES_PER_ROW = 1 << 20
#: Mean (and spread of) lookups per sample of one feature.
MAX_POOLING = 1e6
#: Zipf skew exponent (beyond ~5 all lookups already hit one row).
MAX_ZIPF_ALPHA = 100.0
#: Table-samples (tables x batch) of a generated trace, which is held in memory: about 16
#: lookups of 8 bytes each per cell, so the largest trace takes about 17 GB.
MAX_TRACE_CELLS = 1 << 27
#: Global batch size, samples per step.
MAX_BATCH_SIZE = 1 << 30
#: Bytes in one memory tier of one device (2^50, about 1.1 PB).
MAX_CAPACITY_BYTES = 2**50
#: The same limit in GB (1e9 bytes), the unit of ``--hbm-gb`` and hardware files.
MAX_CAPACITY_GB = MAX_CAPACITY_BYTES / 1e9
#: Bandwidth of a tier or link, GB/s: at least 1 MB/s, at most 1 PB/s.
MIN_BANDWIDTH_GBPS = 1e-3
MAX_BANDWIDTH_GBPS = 1e6
#: Fixed cost of one embedding kernel, microseconds (one second at most).
MAX_KERNEL_OVERHEAD_US = 1e6
#: Width of the placement policy's hidden layers (1,024: about 8.7M weights, 16x the committed
#: policy's 64; a policy file or a training run asking for more is refused before any network
#: is built).
MAX_POLICY_HIDDEN = 1024

#: Run time of one job (a sharder's time limit, a measuring budget), seconds: 1e6 s is about
#: 11.6 days.
MAX_SECONDS = 1e6
#: Request rate of a served model, requests per second: from one request in about 17 minutes
#: to 1e9 (well above the largest production serving fleets' ~1e8).
MIN_QPS = 1e-3
MAX_QPS = 1e9
#: A fixed cost of one operation (a remote call, a lookup, a table's dispatch), microseconds:
#: one second at most, already far beyond any serving target.
MAX_LATENCY_US = 1e6
#: CPU threads one process may ask for.
MAX_THREADS = 256


def is_int(value: Any) -> bool:
    """True for a Python ``int``, not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    """True for a finite real number, not a ``bool``."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


def int_in(value: Any, low: int, high: int) -> bool:
    """True for an integer in ``[low, high]``."""
    return is_int(value) and low <= value <= high


def number_in(value: Any, low: float, high: float, *, open_low: bool = False) -> bool:
    """True for a finite number in ``[low, high]`` (``(low, high]`` when ``open_low``)."""
    if not is_finite(value):
        return False
    return (value > low if open_low else value >= low) and value <= high


def one_of(value: Any, names: tuple[str, ...], field: str, source: str | None = None) -> str:
    """``value`` if it is one of ``names``.

    Raises:
        InputError: Another value, naming ``field`` (and ``source``) and the names allowed.
    """
    if value not in names:
        raise InputError(f"must be one of {', '.join(names)}", source=source, field=field,
                         value=value)
    return str(value)


def names_in(spec: str | None, names: list[str] | tuple[str, ...], field: str, what: str,
             source: str | None = None) -> list[str]:
    """The comma-separated names in ``spec``, each one of ``names``; all of them when ``spec``
    is None.

    Raises:
        InputError: A name not among ``names``, or a choice of none (``","``, ``""``): the
            message lists the names allowed and says that leaving the option out takes all.
    """
    if spec is None:
        return list(names)
    chosen = [part.strip() for part in spec.split(",") if part.strip()]
    if not chosen:
        raise InputError(f"names no {what} (give one or more of {', '.join(names)}, comma-"
                         "separated, or leave it out for all)", source=source, field=field,
                         value=spec)
    for name in chosen:
        if name not in names:
            raise InputError(f"unknown {what} (known: {', '.join(names)})", source=source,
                             field=field, value=name)
    return chosen


def check_fields(doc: dict[str, Any], known: tuple[str, ...] | frozenset[str],
                 where: str = "") -> None:
    """Fails when a document (or the mapping at ``where`` in it) holds a field not in
    ``known``, so that a misspelt field is never silently ignored.

    Raises:
        InputError: The first unknown field (under ``where``), listing the known ones.
    """
    unknown = sorted(str(key) for key in doc if key not in known)
    if unknown:
        raise InputError(f"unknown field (known: {', '.join(sorted(known))})",
                         field=f"{where}.{unknown[0]}" if where else unknown[0])


def check_finite_costs(values: dict[str, float], what: str) -> None:
    """Fails when a priced figure is NaN or infinite, so no such plan or row is ever written.

    Args:
        values: Figure name -> value (e.g. ``{"step_cost_ms": ..., "lower_bound_ms": ...}``).
        what: What was priced, for the message (e.g. ``"plan of size_greedy"``).

    Raises:
        PlannerError: kind ``non_finite``, naming the first bad figure.
    """
    for name, value in values.items():
        if not math.isfinite(value):
            raise PlannerError("non_finite", f"{what}: {name} is {value} (the inputs are too "
                               "large for the cost model; check the sizes, pooling factors and "
                               "bandwidths)")


@dataclass(frozen=True)
class Range:
    """The values a numeric option or field may take; its message states them.

    Args:
        low: Smallest value allowed (excluded when ``open_low``).
        high: Largest value allowed.
        open_low: ``low`` itself is not allowed (a time limit must be > 0).
        integer: Only integers are allowed (``2``, not ``2.0`` nor ``True``).
        open_high: ``high`` itself is not allowed (a share held out must be < 1).
    """

    low: float
    high: float
    open_low: bool = False
    integer: bool = False
    open_high: bool = False

    def __contains__(self, value: Any) -> bool:
        """Whether ``value`` is allowed (never a bool, a NaN or an infinity)."""
        if self.integer and not is_int(value):
            return False
        if self.open_high and is_finite(value) and value >= self.high:
            return False
        return number_in(value, self.low, self.high, open_low=self.open_low)

    def __str__(self) -> str:
        """``an integer in [0, 4294967295]``, ``a number in (0, 1e+06]``."""
        kind = "an integer" if self.integer else "a number"
        return (f"{kind} in {'(' if self.open_low else '['}{_num(self.low)}, "
                f"{_num(self.high)}{')' if self.open_high else ']'}")

    def help(self) -> str:
        """The range for an option's help text: ``[0 <= x <= 4294967295]``."""
        return (f"[{_num(self.low)} {'<' if self.open_low else '<='} x "
                f"{'<' if self.open_high else '<='} {_num(self.high)}]")

    def check(self, value: Any, field: str, source: str | None = None) -> Any:
        """``value`` when allowed.

        Raises:
            InputError: Another value, naming ``field`` (and ``source``) and this range.
        """
        if value not in self:
            raise InputError(f"must be {self}", source=source, field=field, value=value)
        return value


def _num(value: float) -> str:
    """A range's bound as written in messages: integers in full, others as ``%g``."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else f"{value:g}"


#: A seed: NumPy's legacy generator, torch and Gymnasium take 32 bits; 31 leave room for the
#: seeds derived from it (``seed + environment``, ``seed + steps done``).
SEED = Range(0, 2**31 - 1, integer=True)
#: A time limit, seconds.
TIME_LIMIT_S = Range(0, MAX_SECONDS, open_low=True)
#: CPU threads.
THREADS = Range(1, MAX_THREADS, integer=True)
#: Tables, or samples, of a generated trace (:data:`MAX_TRACE_CELLS` also bounds their product).
TRACE_SIZE = Range(1, MAX_TRACE_CELLS, integer=True)
#: Devices of a cluster.
DEVICES = Range(1, MAX_DEVICES, integer=True)
#: A global batch size, samples per step.
BATCH_SIZE = Range(1, MAX_BATCH_SIZE, integer=True)
#: A request rate, requests per second.
QPS = Range(MIN_QPS, MAX_QPS)
#: A capacity in GB (a tier of a device, a server's memory).
CAPACITY_GB = Range(0, MAX_CAPACITY_GB)
#: A bandwidth in GB/s (a tier, a link, a network).
BANDWIDTH_GBPS = Range(MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS)
#: A fixed cost or latency, microseconds.
LATENCY_US = Range(0, MAX_LATENCY_US)
#: A P99 latency target of a served model, ms (a minute at most).
P99_TARGET_MS = Range(0, 60_000, open_low=True)
#: Requests simulated per evaluation of a serving mapping (each is held in memory).
SIMULATED_REQUESTS = Range(100, 10_000_000, integer=True)
#: Width of the placement policy's hidden layers (a policy file's, a training run's).
POLICY_HIDDEN = Range(1, MAX_POLICY_HIDDEN, integer=True)
