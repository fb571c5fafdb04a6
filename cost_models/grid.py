"""Configurations of the embedding-operator microbenchmark, and the named grids that sample them.

A configuration is one operator call: ``num_tables`` tables of ``rows`` x ``dim`` fused in one
operator, fed ``batch`` bags of ``pooling`` lookups per table drawn from a Zipf(``alpha``)
distribution over the rows (alpha 0 = uniform). ``part`` says which rows the operator holds:
``full`` (the whole table) or, for a table split at its ``hot_fraction`` hottest rows, ``hot`` or
``cold`` (the operator over those rows only, fed only the lookups that fall into them: the two
lookups a tiered plan issues).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass, replace

import numpy as np

from autoshard.errors import InputError

OPERATORS = ("torch", "fbgemm")
PARTS = ("full", "hot", "cold")
DTYPES = {"fp32": 4, "fp16": 2}
#: Memory tiers: ``host`` on a CPU-only machine; on CUDA, FBGEMM's EmbeddingLocation DEVICE,
#: MANAGED and MANAGED_CACHING (or pinned host memory read by the torch path for ``uvm``).
TIERS = ("host", "hbm", "uvm", "uvm_caching")


@dataclass(frozen=True)
class BenchConfig:
    """One microbenchmark configuration (see the module docstring)."""

    op: str
    rows: int
    dim: int
    pooling: int
    batch: int
    alpha: float
    num_tables: int = 1
    dtype: str = "fp32"
    tier: str = "host"
    part: str = "full"
    hot_fraction: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {"op": self.op in OPERATORS, "part": self.part in PARTS,
                  "dtype": self.dtype in DTYPES, "tier": self.tier in TIERS,
                  "rows": self.rows > 0, "dim": self.dim > 0, "pooling": self.pooling > 0,
                  "batch": self.batch > 0, "alpha": self.alpha >= 0,
                  "num_tables": self.num_tables > 0,
                  "hot_fraction": 0.0 < self.hot_fraction <= 1.0}
        for field, ok in checks.items():
            if not ok:
                raise InputError("invalid microbenchmark setting", field=field,
                                 value=getattr(self, field))

    @property
    def config_id(self) -> str:
        """Deterministic id: a hash of every field (resuming a sweep skips ids already done)."""
        doc = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha1(doc.encode()).hexdigest()[:16]

    @property
    def draw_seed(self) -> int:
        """Seed of the lookups drawn for the whole table: shared by the full table and both
        partitions of every split of it, so hot and cold partitions divide one batch."""
        whole = replace(self, part="full", hot_fraction=1.0)
        return int(whole.config_id, 16) % (2**32)

    @property
    def hot_rows(self) -> int:
        """Rows in the hot partition of the split (at least 1, fewer than ``rows`` when split)."""
        if self.part == "full":
            return self.rows
        return int(min(max(round(self.rows * self.hot_fraction), 1), self.rows - 1))

    @property
    def part_rows(self) -> int:
        """Rows held by the operator."""
        if self.part == "cold":
            return self.rows - self.hot_rows
        return self.hot_rows


@dataclass(frozen=True)
class GridSpec:
    """Axes of a grid; ``size`` configurations are drawn without replacement from their product.

    Split configurations (``hot_fractions``) add both the hot and the cold partition.
    """

    ops: tuple[str, ...]
    rows: tuple[int, ...]
    dims: tuple[int, ...]
    poolings: tuple[int, ...]
    batches: tuple[int, ...]
    alphas: tuple[float, ...]
    num_tables: tuple[int, ...]
    dtypes: tuple[str, ...]
    hot_fractions: tuple[float, ...]
    size: int
    seed: int = 0


GRIDS: dict[str, GridSpec] = {
    "tiny": GridSpec(ops=("torch", "fbgemm"), rows=(64, 256), dims=(4, 8), poolings=(2,),
                     batches=(8,), alphas=(0.0, 1.0), num_tables=(1,), dtypes=("fp32",),
                     hot_fractions=(0.25,), size=6),
    "quick": GridSpec(ops=("torch", "fbgemm"), rows=(1_000, 20_000), dims=(16, 64),
                      poolings=(2, 8), batches=(128, 512), alphas=(0.0, 1.1), num_tables=(1, 2),
                      dtypes=("fp32",), hot_fractions=(0.1,), size=24),
    "default": GridSpec(ops=("torch", "fbgemm"), rows=(1_000, 10_000, 100_000, 1_000_000),
                        dims=(8, 16, 32, 64, 128), poolings=(1, 4, 12, 32),
                        batches=(128, 512, 1024, 4096), alphas=(0.0, 0.8, 1.05, 1.3),
                        num_tables=(1, 2, 4), dtypes=("fp32", "fp16"),
                        hot_fractions=(0.001, 0.01, 0.05, 0.2), size=1100),
    # For one GPU: GPU-scale batches and tables, measured at every tier.
    "gpu": GridSpec(ops=("torch", "fbgemm"), rows=(10_000, 100_000, 1_000_000, 2_000_000),
                    dims=(16, 32, 64, 128, 256), poolings=(1, 8, 32, 64),
                    batches=(1024, 8192, 32768, 65536), alphas=(0.0, 0.8, 1.05, 1.3),
                    num_tables=(1, 4), dtypes=("fp32", "fp16"),
                    hot_fractions=(0.001, 0.01, 0.05, 0.2), size=250),
}


def _sample(spec: GridSpec) -> list[tuple]:
    """``spec.size`` points of the product of the axes (with a split choice), deterministic."""
    splits: tuple[float | None, ...] = (None, *spec.hot_fractions)
    axes = (spec.ops, spec.rows, spec.dims, spec.poolings, spec.batches, spec.alphas,
            spec.num_tables, spec.dtypes, splits)
    total = int(np.prod([len(a) for a in axes]))
    rng = np.random.default_rng(spec.seed)
    picks = rng.choice(total, size=min(spec.size, total), replace=False)
    product = list(itertools.product(*axes)) if total <= 100_000 else None
    out = []
    for p in np.sort(picks):
        if product is not None:
            out.append(product[p])
            continue
        point, rest = [], int(p)
        for axis in reversed(axes):
            point.append(axis[rest % len(axis)])
            rest //= len(axis)
        out.append(tuple(reversed(point)))
    return out


def grid_configs(name: str, tier: str = "host") -> list[BenchConfig]:
    """The configurations of a named grid (``tiny``, ``quick``, ``default``) for one tier.

    A split point yields its hot and cold partitions; splits of tables too small to split are
    measured as full tables.
    """
    if name not in GRIDS:
        raise InputError(f"unknown grid (choose from {', '.join(GRIDS)})", field="grid",
                         value=name)
    configs: dict[str, BenchConfig] = {}
    for op, rows, dim, pooling, batch, alpha, tables, dtype, split in _sample(GRIDS[name]):
        base = dict(op=op, rows=rows, dim=dim, pooling=pooling, batch=batch, alpha=alpha,
                    num_tables=tables, dtype=dtype, tier=tier)
        if split is None or rows < 4:
            parts = [BenchConfig(**base)]  # type: ignore[arg-type]
        else:
            parts = [BenchConfig(**base, part=p, hot_fraction=split)  # type: ignore[arg-type]
                     for p in ("hot", "cold")]
        for c in parts:
            configs.setdefault(c.config_id, c)
    return list(configs.values())
