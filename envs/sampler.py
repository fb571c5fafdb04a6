"""Draws the sharding tasks an environment episode plays: tables from a pool, a device count,
capacities, batch size and mode."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from autoshard.errors import InputError
from autoshard.hardware import load_hardware
from autoshard.tables import Table
from autoshard.task import ShardingTask, Workload
from autoshard.workloads import default_pools


@dataclass(frozen=True)
class TaskSampler:
    """A distribution of capacity-constrained sharding tasks.

    Each task draws ``tables`` (uniform in the inclusive range) distinct tables from ``pool``, a
    device count from ``devices``, and gives every device HBM for ``hbm_fraction`` (uniform in
    the range) of the tables' bytes divided by the device count, as
    :func:`autoshard.workloads.constrained_task` does; host memory keeps the profile's capacity.

    Args:
        pool: Tables to draw from (default: the train half of :func:`default_pools`).
        tables: (min, max) tables per task.
        devices: Device counts to draw from.
        hbm_fraction: (min, max) share of the task's bytes the cluster's HBM holds.
        hardware: Bundled profile name or YAML file of the device kind.
        batch_sizes: Global batch sizes to draw from.
        modes: Workload modes to draw from (``train``, ``infer``).
    """

    pool: tuple[Table, ...] = field(default_factory=lambda: default_pools()[0])
    tables: tuple[int, int] = (20, 120)
    devices: tuple[int, ...] = (2, 4, 8)
    hbm_fraction: tuple[float, float] = (0.3, 0.7)
    hardware: str = "8xH100-80GB"
    batch_sizes: tuple[int, ...] = (65536,)
    modes: tuple[str, ...] = ("train",)

    def __post_init__(self) -> None:
        lo, hi = self.tables
        if not 1 <= lo <= hi <= len(self.pool):
            raise InputError(f"need 1 <= min <= max <= pool size {len(self.pool)}",
                             field="tables", value=self.tables)
        if not self.devices or min(self.devices) < 1:
            raise InputError("device counts must be >= 1", field="devices", value=self.devices)
        if not 0 < self.hbm_fraction[0] <= self.hbm_fraction[1]:
            raise InputError("need 0 < min <= max", field="hbm_fraction",
                             value=self.hbm_fraction)
        for mode in self.modes:
            Workload(mode=mode)

    @property
    def max_devices(self) -> int:
        return max(self.devices)

    @cached_property
    def _pools(self) -> dict[tuple[int, str], ShardingTask]:
        """One whole-pool task per workload, whose per-table arrays every draw slices."""
        profile = load_hardware(self.hardware)
        return {(b, m): ShardingTask(self.pool, profile, Workload(b, m))
                for b in self.batch_sizes for m in self.modes}

    def sample(self, rng: np.random.Generator) -> ShardingTask:
        """One task, every choice drawn from ``rng``."""
        count = int(rng.integers(self.tables[0], self.tables[1] + 1))
        idx = np.sort(rng.choice(len(self.pool), size=count, replace=False))
        devices = int(rng.choice(self.devices))
        fraction = float(rng.uniform(*self.hbm_fraction))
        batch = int(rng.choice(self.batch_sizes))
        mode = str(rng.choice(self.modes))
        return self.build(idx, devices, fraction, batch, mode)

    def build(self, idx: Sequence[int] | np.ndarray, devices: int, hbm_fraction: float,
              batch_size: int | None = None, mode: str | None = None) -> ShardingTask:
        """The task of pool tables ``idx`` on ``devices`` devices with ``hbm_fraction``."""
        key = (batch_size or self.batch_sizes[0], mode or self.modes[0])
        if key not in self._pools:
            profile = load_hardware(self.hardware)
            self._pools[key] = ShardingTask(self.pool, profile, Workload(*key))
        pool = self._pools[key]
        idx = np.asarray(idx, dtype=np.int64)
        a = pool.table_arrays
        need = float((a.rows[idx] * a.memory_bytes_per_row[idx]).sum())
        profile = pool.hardware.with_devices(devices).with_hbm_bytes(
            int(hbm_fraction * need / devices))
        return pool.subset(idx, profile)
