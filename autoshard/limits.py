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
