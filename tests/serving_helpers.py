"""Small served models for the serving tests."""

from __future__ import annotations

from dataclasses import replace

from autoshard.serving.cluster import ServingProfile
from autoshard.serving.model import ServingModel, build_model
from autoshard.tables import Table

GBYTES = 10**9


def gb_table(name: str, gb: float, coverage: float = 1.0, pooling: float = 10.0) -> Table:
    """A dim-64 fp32 table of about ``gb`` GB."""
    return Table(name, rows=int(gb * GBYTES / 256), dim=64, coverage=coverage,
                 pooling_factor=pooling)


def two_group_model(coverage: float = 0.3) -> ServingModel:
    """Four 10 GB tables in two groups (a0, a1) and (b0, b1), each group touched at ``coverage``."""
    tables = [gb_table(n, 10, coverage) for n in ("a0", "a1", "b0", "b1")]
    return build_model("two-groups", tables, items=4, groups={"a": ["a0", "a1"],
                                                              "b": ["b0", "b1"]})


def profile(**changes: object) -> ServingProfile:
    base = ServingProfile(name="test", server_memory_gb=25.0, main_memory_gb=15.0, cores=1,
                          tail_sigma=0.0, max_servers=8, memory_headroom=0.0)
    return replace(base, **changes)  # type: ignore[arg-type]
