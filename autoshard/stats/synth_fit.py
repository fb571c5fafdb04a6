"""Fitting the synthetic generator to Meta's published reuse histograms.

The target is a locality-stats file of Meta's open DLRM dataset: per trace, the share of
distinct rows and the share of lookups in each of 17 power-of-two reuse bins, all tables merged.
The fit works on the expected histograms (each row's count is Poisson with mean lookups times
its share), which take a fraction of a second for 856 tables; the result is then checked on a
real synthetic batch, profiled like any trace.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from autoshard.errors import InputError
from autoshard.fileio import read_text
from autoshard.stats.table_stats import TableProfile, cdf_distance, profile_table
from autoshard.synth import SynthConfig, SynthTable, power_law_cdf, table_parameters
from autoshard.tables import REUSE_BINS

Hist = Sequence[float] | np.ndarray
#: Upper edges of the reuse bins (bin 16 is open).
EDGES = np.array([2**i for i in range(REUSE_BINS - 1)] + [np.inf])


@dataclass(frozen=True)
class LocalityStats:
    """One trace's entry of a locality-stats file."""

    name: str
    lookups: int
    distinct: int
    rows_hist: tuple[float, ...]
    lookups_hist: tuple[float, ...]


def read_locality_stats(path: str | Path) -> list[LocalityStats]:
    """Parses Meta's ``locality_stats.txt`` (one block per trace file)."""
    path = Path(path)
    blocks = re.split(r"\n\s*\n", read_text(path).strip())
    out = []
    for block in blocks:
        lines = block.strip().splitlines()
        lookups = re.search(r"Avg # of indices: (\d+)", block)
        distinct = re.search(r"Avg # of unique cols: (\d+)", block)
        hists = [float(m) for m in re.findall(r"^\(\d+(?:, \d+\]|\+): ([\d.]+)$", block, re.M)]
        if not (lookups and distinct) or len(hists) != 2 * REUSE_BINS:
            raise InputError("not a locality-stats block", source=str(path),
                             field=lines[0] if lines else "", value=len(hists))
        out.append(LocalityStats(lines[0].strip(), int(lookups[1]), int(distinct[1]),
                                 tuple(hists[:REUSE_BINS]), tuple(hists[REUSE_BINS:])))
    return out


def expected_reuse(rows: np.ndarray, lookups: np.ndarray, alpha: np.ndarray,
                   groups: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """Expected distinct rows and lookups per reuse bin, summed over tables.

    Args:
        rows: Hash size per table.
        lookups: Lookups per table in the batch.
        alpha: Skew per table.
        groups: Log-spaced rank groups per table (the 16 hottest ranks are exact).
    """
    from scipy.special import pdtr

    size, lam = _rank_groups(np.asarray(rows), np.asarray(lookups, float), np.asarray(alpha),
                             groups)
    # P(X <= k) for k = -1, 0, 1, 2, 4, ..., 32768 (finite edges) and k - 1 for each edge.
    upper = EDGES[:-1]
    points = np.unique(np.concatenate(([-1.0, 0.0], upper, upper - 1)))
    cdf = np.where(points[None, :] < 0, 0.0, pdtr(np.maximum(points, 0)[None, :], lam[:, None]))
    cdf = np.concatenate((cdf, np.ones((lam.size, 1))), axis=1)
    at = {float(k): i for i, k in enumerate(points)}
    top = points.size
    hi = [at[float(e)] if np.isfinite(e) else top for e in EDGES]
    lo = [at[0.0], *hi[:-1]]
    hi_m = [at[float(e) - 1] if np.isfinite(e) else top for e in EDGES]
    lo_m = [at[-1.0], *hi_m[:-1]]
    rows_bin = size @ (cdf[:, hi] - cdf[:, lo])
    lookups_bin = (size * lam) @ (cdf[:, hi_m] - cdf[:, lo_m])
    return rows_bin, lookups_bin


def _rank_groups(rows: np.ndarray, lookups: np.ndarray, alpha: np.ndarray, groups: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Rows per rank group and the mean count of a row in it, all tables concatenated."""
    fractions = np.linspace(0.0, 1.0, groups)
    sizes, lams = [], []
    for h, n, a in zip(rows, lookups, alpha, strict=True):
        edges = np.unique(np.concatenate((np.arange(1.0, 17.0),
                                          17.0 * ((h + 1.0) / 17.0) ** fractions)))
        edges = np.round(edges[edges <= h + 1.0])
        edges = np.unique(np.append(edges, h + 1.0))
        size = np.diff(edges)
        sizes.append(size)
        lams.append(n * np.diff(power_law_cdf(edges, float(a), int(h))) / size)
    return np.concatenate(sizes), np.concatenate(lams)


def distances(rows_hist: Hist, lookups_hist: Hist, target: LocalityStats) -> tuple[float, float]:
    """CDF distances (distinct-row histogram, lookup histogram) to the target."""
    r = np.asarray(rows_hist, dtype=float)
    lk = np.asarray(lookups_hist, dtype=float)
    return (cdf_distance(r / r.sum(), target.rows_hist),
            cdf_distance(lk / lk.sum(), target.lookups_hist))


#: The fitted parameters: (field of SynthConfig, position in a tuple field or None).
FIT_PARAMS: tuple[tuple[str, int | None], ...] = (
    ("log10_rows", 0), ("log10_rows", 1), ("lookups_sigma", None), ("alpha", 0), ("alpha", 1))


def config_vector(cfg: SynthConfig) -> np.ndarray:
    return np.array([getattr(cfg, f) if i is None else getattr(cfg, f)[i] for f, i in FIT_PARAMS])


def vector_config(vec: np.ndarray, base: SynthConfig) -> SynthConfig:
    values: dict[str, object] = {}
    for (name, pos), v in zip(FIT_PARAMS, vec, strict=True):
        if pos is None:
            values[name] = round(float(v), 4)
        else:
            old = list(values.get(name, getattr(base, name)))  # type: ignore[call-overload]
            old[pos] = round(float(v), 4)
            values[name] = tuple(old)
    return replace(base, **values)  # type: ignore[arg-type]


def fit_config(target: LocalityStats, count: int = 856, batch: int = 65536, seed: int = 0,
               base: SynthConfig | None = None, max_evals: int = 300,
               on_step: Callable[[float], None] | None = None) -> tuple[SynthConfig, float]:
    """Fits ``SynthConfig`` (rows, lookups spread, skew range) to the target's two histograms
    by Nelder-Mead on the larger of the two expected CDF distances, over fixed draws."""
    from scipy.optimize import minimize

    base = base or SynthConfig()
    rng = np.random.default_rng(seed)
    normal, uniform = rng.standard_normal((2, count)), rng.random(count)

    def loss(vec: np.ndarray) -> float:
        cfg = vector_config(vec, base)
        if cfg.alpha[0] < 0 or cfg.alpha[1] < cfg.alpha[0] or cfg.log10_rows[1] < 0 \
                or cfg.lookups_sigma < 0:
            return 10.0
        rows, per_sample, alpha = table_parameters(cfg, normal, uniform)
        value = max(distances(*expected_reuse(rows, per_sample * batch, alpha), target))
        if on_step is not None:
            on_step(value)
        return value

    result = minimize(loss, config_vector(base), method="Nelder-Mead",
                      options={"maxfev": max_evals, "xatol": 1e-3, "fatol": 1e-4})
    return vector_config(result.x, base), float(result.fun)


def simulate_reuse(tables: Sequence[SynthTable], batch: int, seed: int,
                   progress: Callable[[int], None] | None = None) -> list[TableProfile]:
    """Profiles of one synthetic batch, generated and profiled table by table."""
    from autoshard.synth import iter_lookups

    profiles = []
    for table, (indices, lengths) in zip(tables, iter_lookups(tables, batch, seed),
                                         strict=True):
        profiles.append(profile_table(table.name, indices, lengths, table.rows))
        if progress is not None:
            progress(indices.size)
    return profiles
