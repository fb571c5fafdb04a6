"""Synthetic DLRM-like workloads: table sets, lookup traces in Meta's format, table files.

A table draws its lookups independently from a bounded power law over its rows (rank r has
weight proportional to the integral of x^-alpha over [r, r+1)), with the ranks scattered over
the rows by a fixed bijective hash. Per table: hash size, dimension, coverage (share of samples
that use the feature), pooling factor (lookups per sample when used, 1 + Poisson) and skew
alpha. The distributions of these per-table parameters (``SynthConfig``) were fitted so that a
batch of 65536 samples over 856 tables reproduces the merged reuse histograms of Meta's open
DLRM traces (``autoshard calibrate``, results/calibration/).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import numpy as np

from autoshard.errors import InputError
from autoshard.tables import Table, load_tables

#: Multiplier of the rank-to-row hash: a prime larger than any hash size, so it is a bijection.
ROW_HASH = 2654435761
DIMS = (16, 32, 64, 128, 256)
DIM_WEIGHTS = (0.15, 0.25, 0.3, 0.2, 0.1)
#: Tables and batch size of Meta's open DLRM traces (fbgemm_t856_bs65536).
DEFAULT_COUNT = 856
DEFAULT_BATCH = 65536


@dataclass(frozen=True)
class SynthConfig:
    """Distributions of per-table parameters (defaults: fitted by ``autoshard calibrate``).

    Args:
        log10_rows: Mean and spread (normal, clipped to ``rows_range``) of log10 hash size.
        rows_range: Smallest and largest log10 hash size.
        lookups_mean: Mean lookups per table per sample (pooling times coverage); Meta's
            fbgemm_t856_bs65536 trace has 887,017,990 lookups / 856 / 65536 = 15.8.
        lookups_sigma: Log-normal spread of lookups per sample across tables.
        alpha: Range of the per-table skew exponent (uniform).
        coverage_beta: Beta(a, b) of coverage, clipped to [0.05, 1].
    """

    log10_rows: tuple[float, float] = (5.4324, 0.4968)
    rows_range: tuple[float, float] = (2.0, 7.5)
    lookups_mean: float = 15.8
    lookups_sigma: float = 1.5973
    alpha: tuple[float, float] = (0.6199, 0.9814)
    coverage_beta: tuple[float, float] = (2.0, 1.0)
    dims: tuple[int, ...] = DIMS
    dim_weights: tuple[float, ...] = field(default=DIM_WEIGHTS)


@dataclass(frozen=True)
class SynthTable:
    """Parameters of one synthetic table."""

    name: str
    rows: int
    dim: int
    pooling_factor: float
    coverage: float
    alpha: float

    def to_table(self) -> Table:
        """The planner's view of the parameters alone (Zipf skew, no measured curve)."""
        return Table(name=self.name, rows=self.rows, dim=self.dim,
                     pooling_factor=round(self.pooling_factor, 3),
                     coverage=round(self.coverage, 3), zipf_alpha=round(self.alpha, 3))


def draw_tables(count: int, seed: int = 0, config: SynthConfig | None = None,
                prefix: str = "t") -> tuple[SynthTable, ...]:
    """``count`` tables with parameters drawn from ``config`` (vectorised, deterministic)."""
    if count < 1:
        raise InputError("must be >= 1", field="tables", value=count)
    cfg = config or SynthConfig()
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal((2, count))
    uniform = rng.random(count)
    rows, lookups, alpha = table_parameters(cfg, normal, uniform)
    coverage = np.clip(rng.beta(*cfg.coverage_beta, count), 0.05, 1.0)
    pooling = np.maximum(lookups / coverage, 1.0)
    dims = rng.choice(np.asarray(cfg.dims), size=count, p=np.asarray(cfg.dim_weights))
    return tuple(SynthTable(f"{prefix}{i}", int(rows[i]), int(dims[i]), float(pooling[i]),
                            float(coverage[i]), float(alpha[i])) for i in range(count))


def table_parameters(cfg: SynthConfig, normal: np.ndarray, uniform: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hash sizes, lookups per sample and skews from standard draws (normal [2, T], uniform
    [T]); shared with the calibration, which refits ``cfg`` on fixed draws."""
    mu, spread = cfg.log10_rows
    log_rows = np.clip(mu + spread * normal[0], *cfg.rows_range)
    rows = np.round(10.0**log_rows).astype(np.int64)
    sigma = cfg.lookups_sigma
    lookups = cfg.lookups_mean * np.exp(sigma * normal[1] - sigma**2 / 2)
    alpha = cfg.alpha[0] + (cfg.alpha[1] - cfg.alpha[0]) * uniform
    return rows, lookups, alpha


def power_law_cdf(x: np.ndarray, alpha: float, rows: int) -> np.ndarray:
    """Share of a table's lookups on ranks below ``x`` (x in [1, rows+1], continuous)."""
    x = np.asarray(x, dtype=np.float64)
    if abs(alpha - 1.0) < 1e-9:
        return np.log(x) / np.log(rows + 1.0)
    return np.expm1((1.0 - alpha) * np.log(x)) / np.expm1((1.0 - alpha) * np.log(rows + 1.0))


def sample_rows(table: SynthTable, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` row ids of ``table`` (inverse-CDF draw of ranks, then the rank-to-row hash)."""
    u = rng.random(n)
    a, h = table.alpha, float(table.rows + 1)
    if abs(a - 1.0) < 1e-9:
        x = np.exp(u * np.log(h))
    else:
        x = np.exp(np.log1p(u * np.expm1((1.0 - a) * np.log(h))) / (1.0 - a))
    rank = np.minimum(x.astype(np.int64) - 1, table.rows - 1)
    return (rank * ROW_HASH + 7919) % table.rows


def sample_lengths(table: SynthTable, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Lookups per sample: 0 when the feature is absent, else 1 + Poisson(pooling - 1)."""
    present = rng.random(batch) < table.coverage
    return np.where(present, 1 + rng.poisson(table.pooling_factor - 1.0, batch), 0)


def iter_lookups(tables: Sequence[SynthTable], batch: int, seed: int
                 ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each table's (row ids, lookups per sample) for one batch, table by table."""
    if batch < 1:
        raise InputError("must be >= 1", field="batch_size", value=batch)
    for i, table in enumerate(tables):
        rng = np.random.default_rng([seed, i])
        lengths = sample_lengths(table, batch, rng)
        yield sample_rows(table, int(lengths.sum()), rng), lengths


def generate_trace(tables: Sequence[SynthTable], batch: int, seed: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One batch in Meta's layout: (indices, offsets [T*B+1], lengths [T, B])."""
    parts = list(iter_lookups(tables, batch, seed))
    lengths = np.stack([p[1] for p in parts]).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths.reshape(-1))))
    indices = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    return indices.astype(np.int64, copy=False), offsets.astype(np.int64), lengths


@lru_cache(maxsize=1)
def default_tables() -> tuple[Table, ...]:
    """The embedded default workload: 856 tables of the calibrated generator (seed 0), with the
    statistics measured on one synthetic batch of 65536 samples (``autoshard calibrate``)."""
    ref = resources.files("autoshard") / "data" / "default_tables.json"
    with resources.as_file(ref) as path:
        if not path.is_file():
            raise InputError("default workload missing; run `autoshard calibrate`",
                             source=str(path))
        return load_tables(path)
