"""Named suites of sharding tasks for the comparison harness.

Tables come from the held-out (test) half of a fixed DLRM-like pool, so that learned sharders are
compared on tables they were not trained on; the 856-table suite uses the whole pool. The
``dcnv2`` and ``criteo1tb`` suites place the tables of published models
(:mod:`autoshard.public_models`): a few huge, hot tables among small ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.errors import InputError
from autoshard.public_models import MODEL_TABLES, model_tables
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, default_pools


@dataclass(frozen=True)
class TaskSpec:
    """One task of a suite: ``tables`` drawn from a pool on ``devices`` devices.

    Args:
        name: Task name, unique in its suite.
        tables: Number of tables drawn (without replacement).
        devices: Device count.
        hbm_fraction: Cluster HBM as a fraction of the tables' bytes (< 1: capacity-constrained).
        seed: Seed of the table draw.
        mode: ``train`` or ``infer``.
        batch_size: Global batch size.
        hardware: Bundled hardware profile.
        pool: ``test`` (held-out half), ``all`` (the whole pool) or the name of a published
            model's table set (:data:`autoshard.public_models.MODEL_TABLES`; all its tables).

    The task reserves in HBM what TorchRec's runtime adds per table or shard
    (``reservation="torchrec"``, :mod:`autoshard.torchrec.runtime_memory`).
    """

    name: str
    tables: int
    devices: int
    hbm_fraction: float
    seed: int = 0
    mode: str = "train"
    batch_size: int = 65536
    hardware: str = "8xH100-80GB"
    pool: str = "test"

    def build(self) -> ShardingTask:
        import numpy as np

        if self.pool in MODEL_TABLES:
            tables = model_tables(self.pool)
            if self.tables != len(tables):
                raise InputError(f"model '{self.pool}' has {len(tables)} tables",
                                 field="tables", value=self.tables)
            return constrained_task(tables, self.devices, self.hbm_fraction, self.hardware,
                                    self.batch_size, self.mode, reservation="torchrec")
        train, test = default_pools()
        pool = test if self.pool == "test" else train + test
        if self.tables > len(pool):
            raise InputError(f"pool has {len(pool)} tables", field="tables", value=self.tables)
        rng = np.random.default_rng(self.seed)
        chosen = sorted(rng.choice(len(pool), size=self.tables, replace=False))
        return constrained_task([pool[i] for i in chosen], self.devices, self.hbm_fraction,
                                self.hardware, self.batch_size, self.mode, reservation="torchrec")


def _seeds(prefix: str, tables: int, devices: int, fraction: float, seeds: int,
           **kwargs: object) -> tuple[TaskSpec, ...]:
    return tuple(TaskSpec(f"{prefix}-{tables}x{devices}-s{s}", tables, devices, fraction, s,
                          **kwargs)  # type: ignore[arg-type]
                 for s in range(seeds))


#: Capacity-constrained tasks keep 30% of the tables' bytes in HBM; rich ones 200%.
CONSTRAINED = 0.3
RICH = 2.0

SUITES: dict[str, tuple[TaskSpec, ...]] = {
    "tiny": _seeds("tiny", 12, 2, CONSTRAINED, 2),
    "constrained-50x4": _seeds("c", 50, 4, CONSTRAINED, 3),
    "constrained-100x8": _seeds("c", 100, 8, CONSTRAINED, 3),
    "constrained-200x8": _seeds("c", 200, 8, CONSTRAINED, 3),
    "constrained-856x128": (TaskSpec("c-856x128", 856, 128, CONSTRAINED, 0, pool="all"),),
    "rich-100x8": _seeds("r", 100, 8, RICH, 3),
    "infer-100x8": _seeds("i", 100, 8, CONSTRAINED, 3, mode="infer"),
    "dcnv2-8": (TaskSpec("dcnv2-26x8", 26, 8, CONSTRAINED, pool="dcnv2"),),
    "dcnv2-16": (TaskSpec("dcnv2-26x16", 26, 16, CONSTRAINED, pool="dcnv2"),),
    "criteo1tb-8": (TaskSpec("criteo1tb-26x8", 26, 8, CONSTRAINED, pool="criteo1tb"),),
}


def get_suite(name: str) -> tuple[TaskSpec, ...]:
    if name not in SUITES:
        raise InputError(f"unknown suite (known: {', '.join(SUITES)})", field="suite",
                         value=name)
    return SUITES[name]
