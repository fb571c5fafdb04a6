"""Generated DLRM-like table sets and sharding tasks, for benchmarks, training and suites.

The distributions follow the shape of Meta's open DLRM dataset (REFERENCES.md): hash sizes
spread over several orders of magnitude, a mean pooling factor near 15.8 lookups per table per
sample, partial coverage, and skewed (Zipf-like) row popularity.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np

from autoshard.errors import InputError
from autoshard.hardware import GB, HardwareProfile, load_hardware
from autoshard.reservation import get_reservation
from autoshard.tables import Table
from autoshard.task import ShardingTask, Workload

DIMS = (16, 32, 64, 128, 256)
DIM_WEIGHTS = (0.15, 0.25, 0.3, 0.2, 0.1)


def dlrm_tables(count: int, seed: int = 0, prefix: str = "t") -> tuple[Table, ...]:
    """``count`` DLRM-like tables with statistics (pooling, coverage, Zipf skew, rows used)."""
    if count < 1:
        raise InputError("must be >= 1", field="tables", value=count)
    rng = np.random.default_rng(seed)
    rows = np.round(10 ** rng.uniform(3.0, 7.3, count)).astype(np.int64)
    dims = rng.choice(DIMS, size=count, p=DIM_WEIGHTS)
    pooling = np.clip(rng.lognormal(np.log(8.0), 1.1, count), 1.0, 200.0)
    coverage = np.clip(rng.beta(2.0, 1.0, count), 0.05, 1.0)
    alpha = rng.uniform(0.6, 1.3, count)
    return tuple(
        Table(name=f"{prefix}{i}", rows=int(rows[i]), dim=int(dims[i]),
              pooling_factor=round(float(pooling[i]), 3), coverage=round(float(coverage[i]), 3),
              zipf_alpha=round(float(alpha[i]), 3))
        for i in range(count)
    )


#: Tables in the fixed generated pool, as many as Meta's open DLRM dataset (REFERENCES.md).
POOL_SIZE = 856


@cache
def default_pools(seed: int = 0) -> tuple[tuple[Table, ...], tuple[Table, ...]]:
    """(train pool, test pool): disjoint halves of the fixed 856-table pool that the agent's
    training, its evaluation and the comparison suites all draw from."""
    return split_pool(dlrm_tables(POOL_SIZE, seed=seed), seed=seed)


def split_pool(tables: Sequence[Table], seed: int = 0) -> tuple[tuple[Table, ...],
                                                                 tuple[Table, ...]]:
    """Splits tables into two disjoint halves (train pool, test pool), as DreamShard does."""
    order = np.random.default_rng(seed).permutation(len(tables))
    half = len(tables) // 2
    return (tuple(tables[i] for i in sorted(order[:half])),
            tuple(tables[i] for i in sorted(order[half:])))


def total_bytes(tables: Sequence[Table], train: bool = True) -> int:
    return int(sum(t.rows * t.memory_bytes_per_row(train) for t in tables))


def constrained_task(tables: Sequence[Table], devices: int, hbm_fraction: float = 0.5,
                     hardware: str = "8xH100-80GB", batch_size: int = 65536,
                     mode: str = "train", reservation: str = "none") -> ShardingTask:
    """A task whose devices together hold ``hbm_fraction`` of the tables' bytes in HBM.

    A fraction below 1 makes the task capacity-constrained: some rows must live in host memory.
    Host memory keeps the profile's capacity. With ``reservation="torchrec"`` (as the suites
    build their tasks) sharders keep room in HBM for what TorchRec's runtime adds per table or
    shard (:func:`autoshard.reservation.get_reservation` names the reservations).
    """
    workload = Workload(batch_size=batch_size, mode=mode)
    need = total_bytes(tables, workload.train)
    profile = with_hbm_fraction(load_hardware(hardware, devices=devices), need, hbm_fraction)
    return ShardingTask(tuple(tables), profile, workload, get_reservation(reservation))


def with_hbm_fraction(profile: HardwareProfile, need_bytes: float,
                      hbm_fraction: float) -> HardwareProfile:
    """``profile`` with every device's HBM sized so that all its devices together hold
    ``hbm_fraction`` of ``need_bytes`` (the tables' bytes); host memory is unchanged."""
    if not hbm_fraction > 0:
        raise InputError("must be > 0", field="hbm_fraction", value=hbm_fraction)
    hbm_gb = hbm_fraction * need_bytes / profile.num_devices / GB
    return profile.with_hbm_bytes(int(hbm_gb * GB))
