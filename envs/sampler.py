"""Draws the sharding tasks an environment episode plays: tables, a cluster, its HBM, a batch
size and a mode, domain-randomised over the ranges real models span."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from autoshard.envs.families import family_pool
from autoshard.errors import InputError
from autoshard.hardware import HardwareProfile, load_hardware
from autoshard.reservation import NO_RESERVATION, check_reservation_names, get_reservation
from autoshard.tables import Table
from autoshard.task import ShardingTask, Workload
from autoshard.workloads import with_hbm_fraction

#: Device counts drawn (uniformly, so log-uniformly over 2-128).
DEVICE_COUNTS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
#: Devices per node drawn for a cluster (so 1 to 16 nodes for up to 128 devices).
PER_NODE = (2, 4, 8)
#: How a task picks its tables from the pool: any, a few dominant tables among many small ones,
#: profiled tables only, one-hot features only.
STYLES = ("mixed", "dominant", "profiled", "one_hot")
#: Share of the cluster's host memory a task's tables may fill (the rest is headroom).
HOST_HEADROOM = 0.6
#: With HBM reserved per table (TorchRec's buffers), a drawn task keeps its reservations within
#: this share of the cluster's HBM and each within this share of one device's HBM; others are
#: drawn again (at most :data:`REDRAWS` times, then planned without the reservation). Within
#: those limits no episode can run out of room: a table fits nowhere only where every device's
#: reservations fill more than half of it.
RESERVED_SHARE, RESERVED_PER_DEVICE, REDRAWS = 0.45, 0.5, 20


@dataclass(frozen=True)
class TaskSampler:
    """A distribution of sharding tasks.

    Each task picks a style (:data:`STYLES`), draws a table count log-uniformly in ``tables``
    and that many distinct tables of ``pool`` in that style, a device count from ``devices``
    (those within the environment's slots), devices per node from :data:`PER_NODE`, a
    log-uniform share of the tables' bytes for the cluster's HBM in ``hbm_fraction``
    (:func:`autoshard.workloads.with_hbm_fraction`), a batch size, a mode and the HBM reserved
    per table (``overheads``; with more than one, drawn; a task whose reservations would
    crowd its HBM is drawn again, see :data:`RESERVED_SHARE`). Host memory keeps the profile's
    capacity; the largest tables are dropped while the rest would fill more than
    :data:`HOST_HEADROOM` of it.

    Args:
        pool: Tables to draw from (default: the ``family`` pool of :mod:`autoshard.envs.families`).
        family: ``train``, ``validation`` or ``test`` (used when ``pool`` is not given).
        tables: (min, max) tables per task.
        devices: Device counts to draw from.
        hbm_fraction: (min, max) share of the task's bytes the cluster's HBM holds.
        hardware: Bundled profile name or YAML file of the device kind.
        batch_sizes: Global batch sizes to draw from.
        modes: Workload modes to draw from (``train``, ``infer``).
        styles: Table-picking styles to draw from.
        overheads: HBM reserved per table or shard to draw from
            (:func:`autoshard.reservation.reservation_names`; ``none``: rows only).
    """

    pool: tuple[Table, ...] | None = None
    family: str = "train"
    tables: tuple[int, int] = (4, 1000)
    devices: tuple[int, ...] = DEVICE_COUNTS
    hbm_fraction: tuple[float, float] = (0.05, 3.0)
    hardware: str = "8xH100-80GB"
    batch_sizes: tuple[int, ...] = (4096, 16384, 65536, 262144)
    modes: tuple[str, ...] = ("train", "infer")
    styles: tuple[str, ...] = STYLES
    overheads: tuple[str, ...] = ("none",)

    def __post_init__(self) -> None:
        lo, hi = self.tables
        if not 1 <= lo <= hi:
            raise InputError("need 1 <= min <= max", field="tables", value=self.tables)
        if not self.devices or min(self.devices) < 1:
            raise InputError("device counts must be >= 1", field="devices", value=self.devices)
        if not 0 < self.hbm_fraction[0] <= self.hbm_fraction[1]:
            raise InputError("need 0 < min <= max", field="hbm_fraction",
                             value=self.hbm_fraction)
        unknown = set(self.styles) - set(STYLES)
        if not self.styles or unknown:
            raise InputError(f"styles must be among {', '.join(STYLES)}", field="styles",
                             value=self.styles)
        for mode in self.modes:
            Workload(mode=mode)
        check_reservation_names(self.overheads)

    @property
    def max_devices(self) -> int:
        return max(self.devices)

    @cached_property
    def tables_pool(self) -> tuple[Table, ...]:
        return self.pool if self.pool is not None else family_pool(self.family)

    @cached_property
    def _groups(self) -> dict[str, np.ndarray]:
        """Pool indices of each style's candidates, and of the largest and smallest tables."""
        t = self.tables_pool
        size = np.array([x.rows * x.memory_bytes_per_row(True) for x in t], dtype=np.float64)
        order = np.argsort(size)
        n = len(t)
        groups = {"mixed": np.arange(n),
                  "profiled": np.array([i for i, x in enumerate(t) if x.access_cdf is not None
                                        and x.reuse_hist is not None], dtype=np.int64),
                  "one_hot": np.array([i for i, x in enumerate(t) if x.pooling_factor <= 1.0],
                                      dtype=np.int64),
                  "large": order[-max(n // 20, 1):], "small": order[:max(n * 6 // 10, 1)]}
        return {k: (v if v.size else groups["mixed"]) for k, v in groups.items()}

    @cached_property
    def _pools(self) -> dict[tuple[int, str], ShardingTask]:
        """One whole-pool task per workload, whose per-table arrays every draw slices."""
        profile = load_hardware(self.hardware)
        return {(b, m): ShardingTask(self.tables_pool, profile, Workload(b, m))
                for b in self.batch_sizes for m in self.modes}

    def sample(self, rng: np.random.Generator, max_devices: int | None = None) -> ShardingTask:
        """One task, every choice drawn from ``rng``; at most ``max_devices`` devices."""
        choices = [d for d in self.devices if max_devices is None or d <= max_devices]
        if not choices:
            raise InputError(f"no device count <= {max_devices}", field="devices",
                             value=self.devices)
        # One overhead: no draw for it (the streams of earlier samplers); without a
        # reservation every first draw is roomy, so those streams stay as they were.
        reservation = get_reservation(self.overheads[0] if len(self.overheads) == 1
                                      else str(rng.choice(self.overheads)))
        for _ in range(REDRAWS):
            task = self._draw(rng, choices).with_reservation(reservation)
            if roomy(task):  # (always, without a reservation)
                return task
        return task.with_reservation(NO_RESERVATION)

    def _draw(self, rng: np.random.Generator, choices: list[int]) -> ShardingTask:
        """A task on one of ``choices`` devices, before its reservation is chosen."""
        lo, hi = self.tables
        count = int(np.exp(rng.uniform(np.log(lo), np.log(hi + 1))))
        style = str(rng.choice(self.styles))
        idx = self._pick(rng, style, min(max(count, lo), hi))
        devices = int(rng.choice(choices))
        per_node = int(rng.choice(PER_NODE))
        fraction = float(np.exp(rng.uniform(*np.log(self.hbm_fraction))))
        batch = int(rng.choice(self.batch_sizes))
        mode = str(rng.choice(self.modes))
        return self.build(idx, devices, fraction, batch, mode, per_node)

    def _pick(self, rng: np.random.Generator, style: str, count: int) -> np.ndarray:
        """``count`` distinct pool indices in ``style`` (fewer if the style has fewer)."""
        g = self._groups
        if style == "dominant":
            few = min(int(rng.integers(1, 5)), count, g["large"].size)
            big = rng.choice(g["large"], size=few, replace=False)
            small = g["small"][~np.isin(g["small"], big)]
            rest = rng.choice(small, size=min(count - few, small.size), replace=False)
            return np.sort(np.concatenate([big, rest]))
        group = g[style]
        return np.sort(rng.choice(group, size=min(count, group.size), replace=False))

    def build(self, idx: Sequence[int] | np.ndarray, devices: int, hbm_fraction: float,
              batch_size: int | None = None, mode: str | None = None,
              per_node: int | None = None) -> ShardingTask:
        """The task of pool tables ``idx`` on ``devices`` devices with ``hbm_fraction``."""
        key = (batch_size or self.batch_sizes[0], mode or self.modes[0])
        if key not in self._pools:
            self._pools[key] = ShardingTask(self.tables_pool, load_hardware(self.hardware),
                                            Workload(*key))
        pool = self._pools[key]
        profile = _cluster(pool.hardware, devices, per_node)
        chosen = np.asarray(idx, dtype=np.int64)
        a = pool.table_arrays
        size = a.rows[chosen] * a.memory_bytes_per_row[chosen]
        host = float(profile.devices[0].host.capacity_bytes) * devices * HOST_HEADROOM
        while chosen.size > 1 and size.sum() > host:  # drop the largest tables until they fit
            keep = np.arange(chosen.size) != np.argmax(size)
            chosen, size = chosen[keep], size[keep]
        profile = with_hbm_fraction(profile, float(size.sum()), hbm_fraction)
        return pool.subset(chosen, profile)


def roomy(task: ShardingTask) -> bool:
    """Whether ``task``'s HBM reservations leave its episodes room (:data:`RESERVED_SHARE`)."""
    reserved = task.table_arrays.hbm_reserved_bytes
    hbm = task.device_arrays.hbm_capacity
    return bool(reserved.sum() <= RESERVED_SHARE * hbm.sum()
                and reserved.max(initial=0.0) <= RESERVED_PER_DEVICE * hbm.min())


def _cluster(profile: HardwareProfile, devices: int, per_node: int | None) -> HardwareProfile:
    """``devices`` devices of ``profile``'s kind, ``per_node`` to a node (default: the
    profile's)."""
    if per_node is not None:
        profile = replace(profile, devices_per_node=per_node)
    return profile.with_devices(devices)
