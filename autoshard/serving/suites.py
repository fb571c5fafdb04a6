"""DLRM-like served models of three sizes, and a tiny one for measured runs.

Tables come from the project's DLRM-like generator (:func:`autoshard.workloads.dlrm_tables`),
their rows scaled so the model's bytes hit a target; tables are dealt into feature groups
(sub-networks) whose touch probability is drawn per group, and a share are item-side.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autoshard.errors import InputError
from autoshard.hardware import GB
from autoshard.serving.model import ServingModel, build_model
from autoshard.workloads import dlrm_tables


@dataclass(frozen=True)
class SuiteSpec:
    """A generated served model.

    Args:
        tables: Number of tables. total_gb: Their bytes. groups: Feature groups.
        items: Candidates per request. qps: Request rates the suite is run at.
        p99_ms: P99 target for capacity planning. touch: Range of group touch probabilities.
        profile: Serving profile the suite is sized for.
        items_sigma: Spread of items per request (sigma of log; DeepRecSys: heavy-tailed).
        dense_overlap: Share of the dense part that overlaps the lookups.
    """

    tables: int
    total_gb: float
    groups: int
    items: int
    qps: tuple[float, ...]
    p99_ms: float
    touch: tuple[float, float] = (0.1, 0.9)
    profile: str = "cpu-256gb"
    items_sigma: float = 0.5
    dense_overlap: float = 0.0


SUITES: dict[str, SuiteSpec] = {
    # Fits the main server's 128 GB: the main_only mapping applies.
    "small": SuiteSpec(40, 90.0, 8, 16, (5000.0, 20000.0), 1.5),
    # 600 GB on 256 GB servers: at least 3 sparse servers.
    # 60,000 qps takes more than one main server's cores: replicas decide.
    "medium": SuiteSpec(200, 600.0, 25, 16, (5000.0, 20000.0, 60000.0), 5.0),
    # 2.2 TB: at least 9 sparse servers.
    "large": SuiteSpec(800, 2200.0, 100, 16, (5000.0, 20000.0), 8.0),
    # Sparse requests (60 groups, each touched by 1-6% of requests) on 1.2 TB: fan-out decides.
    "sparse": SuiteSpec(300, 1200.0, 60, 16, (5000.0, 20000.0), 2.05, (0.01, 0.06)),
    # Measured on this machine by `serve bench` (small tables, two sparse servers); the top
    # rate keeps the main process busy about half the time with the most fan-out.
    "bench": SuiteSpec(24, 0.02, 6, 8, (150.0, 300.0, 500.0), 100.0, (0.1, 0.5), "local-cpu",
                       items_sigma=0.0),
    # The setting of Lui et al.: dense compute dominating remote work (profile `ispass-2021`),
    # the bottom MLP overlapping the lookups; used by `serve study`.
    "paper": SuiteSpec(200, 600.0, 25, 64, (1000.0,), 100.0, profile="ispass-2021",
                       dense_overlap=0.5),
}


def suite_model(name: str, seed: int = 0) -> ServingModel:
    """The served model of suite ``name``."""
    if name not in SUITES:
        raise InputError(f"unknown serving suite (known: {', '.join(SUITES)})", field="suite",
                         value=name)
    spec = SUITES[name]
    return generated_model(name, spec, seed)


def generated_model(name: str, spec: SuiteSpec, seed: int = 0) -> ServingModel:
    """A model of ``spec.tables`` DLRM-like tables scaled to ``spec.total_gb``."""
    rng = np.random.default_rng([seed, spec.tables])
    tables = list(dlrm_tables(spec.tables, seed=seed, prefix="t"))
    row_bytes = np.array([t.row_bytes for t in tables], float)
    rows = np.array([t.rows for t in tables], float)
    scale = spec.total_gb * GB / float((rows * row_bytes).sum())
    new_rows = np.maximum(np.round(rows * scale), 1).astype(np.int64)
    group_of = rng.integers(spec.groups, size=spec.tables)
    group_of[: spec.groups] = np.arange(min(spec.groups, spec.tables))  # no empty group
    group_p = rng.uniform(*spec.touch, size=spec.groups)
    per_item = rng.random(spec.tables) < 0.3
    out = []
    for i, t in enumerate(tables):
        cover = float(group_p[group_of[i]] * rng.uniform(0.6, 1.0))
        pooling = min(t.pooling_factor, 4.0) if per_item[i] else t.pooling_factor
        out.append(replace(t, rows=int(new_rows[i]), coverage=round(max(cover, 1e-3), 4),
                           pooling_factor=pooling, rows_used=None))
    groups = {f"g{g}": [out[i].name for i in np.flatnonzero(group_of == g)]
              for g in range(spec.groups)}
    names = [out[i].name for i in np.flatnonzero(per_item)]
    return build_model(name, out, spec.items, groups, names, items_sigma=spec.items_sigma,
                       dense_overlap=spec.dense_overlap)
