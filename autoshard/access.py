"""Access curves: the share of a table's lookups served by its hottest rows.

A curve is a compact, monotone, piecewise-linear CDF over the *fraction* of a table's rows
(hottest first): ``share_at(0) == 0`` and ``share_at(rows_used / rows) == 1``. Rows beyond the
used fraction are never touched (RecShard's birthday-paradox observation), so they cost nothing
wherever they live.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.errors import InputError

#: Common grid of row fractions on which every task resamples its curves, so that the shares of
#: many tables can be evaluated in one vectorised call: 0, then 96 log-spaced points 1e-8 .. 1.
GRID = np.concatenate(([0.0], np.logspace(-8.0, 0.0, 97)))


@dataclass(frozen=True)
class AccessCurve:
    """A monotone CDF of lookups over the fraction of rows, hottest first.

    Args:
        row_fraction: Increasing points in [0, 1], starting at 0.
        lookup_share: Non-decreasing shares in [0, 1] at those points, starting at 0, ending at 1.
    """

    row_fraction: tuple[float, ...]
    lookup_share: tuple[float, ...]

    def __post_init__(self) -> None:
        x = np.asarray(self.row_fraction, dtype=float)
        y = np.asarray(self.lookup_share, dtype=float)
        if x.shape != y.shape or x.size < 2:
            raise InputError("access curve needs two equal-length lists of at least 2 points",
                             field="access_cdf", value=(len(x), len(y)))
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            raise InputError("access curve values must be finite numbers", field="access_cdf",
                             value=(list(x), list(y)))
        if x[0] != 0.0 or y[0] != 0.0:
            raise InputError("access curve must start at (0, 0)", field="access_cdf",
                             value=(float(x[0]), float(y[0])))
        if np.any(np.diff(x) <= 0) or x[-1] > 1.0 + 1e-12:
            raise InputError("row fractions must increase within [0, 1]", field="access_cdf",
                             value=list(x))
        if np.any(np.diff(y) < -1e-12) or abs(y[-1] - 1.0) > 1e-6:
            raise InputError("lookup shares must not decrease and must end at 1",
                             field="access_cdf", value=list(y))

    @property
    def used_fraction(self) -> float:
        """Fraction of rows that receive any lookup."""
        y = np.asarray(self.lookup_share)
        return float(self.row_fraction[int(np.argmax(y >= y[-1] - 1e-12))])

    def share_at(self, fraction: np.ndarray | float) -> np.ndarray:
        """Share of lookups served by the hottest ``fraction`` of rows."""
        return np.asarray(np.interp(fraction, self.row_fraction, self.lookup_share))

    def on_grid(self) -> np.ndarray:
        """This curve's shares at :data:`GRID`."""
        return self.share_at(GRID)

    def to_dict(self) -> dict[str, list[float]]:
        return {"row_fraction": list(self.row_fraction), "lookup_share": list(self.lookup_share)}

    @classmethod
    def from_dict(cls, doc: dict[str, list[float]]) -> AccessCurve:
        if not isinstance(doc, dict):
            raise InputError("expected a mapping with row_fraction and lookup_share",
                             field="access_cdf", value=doc)
        for key in ("row_fraction", "lookup_share"):
            if key not in doc:
                raise InputError("required field missing", field=f"access_cdf.{key}")
        return cls(tuple(float(v) for v in doc["row_fraction"]),
                   tuple(float(v) for v in doc["lookup_share"]))

    @classmethod
    def uniform(cls, used_fraction: float = 1.0) -> AccessCurve:
        """Every used row is equally hot."""
        return cls((0.0, float(used_fraction)), (0.0, 1.0))

    @classmethod
    def zipf(cls, alpha: float, rows: int, points: int = 48) -> AccessCurve:
        """Zipf(alpha) popularity over ``rows`` rows, sampled at log-spaced row counts."""
        if alpha < 0:
            raise InputError("zipf exponent must be >= 0", field="zipf_alpha", value=alpha)
        k = np.unique(np.round(np.logspace(0, np.log10(rows), points)).astype(np.int64))
        share = _harmonic(k.astype(float), alpha) / _harmonic(float(rows), alpha)
        x = np.concatenate(([0.0], k / rows))
        y = np.concatenate(([0.0], np.minimum(share, 1.0)))
        y[-1] = 1.0
        return cls(tuple(x), tuple(np.maximum.accumulate(y)))

    @classmethod
    def from_counts(cls, counts: np.ndarray, rows: int, points: int = 64) -> AccessCurve:
        """Curve of measured per-row lookup counts (zeros allowed) for a table of ``rows`` rows."""
        counts = np.asarray(counts)
        used = np.sort(counts[counts > 0])[::-1].astype(np.float64)
        if used.size == 0:
            return cls.uniform(1.0)
        cum = np.cumsum(used) / used.sum()
        k = np.unique(np.round(np.logspace(0, np.log10(used.size), points)).astype(np.int64))
        x = np.concatenate(([0.0], k / rows))
        y = np.concatenate(([0.0], cum[k - 1]))
        y[-1] = 1.0
        return cls(tuple(x), tuple(y))


def _harmonic(n: np.ndarray | float, alpha: float) -> np.ndarray:
    """Generalised harmonic number H(n, alpha) by Euler-Maclaurin (exact to ~1e-4 relative)."""
    n = np.asarray(n, dtype=float)
    # The integral of x^-alpha from 1 to n, then the Euler-Maclaurin end corrections.
    one = abs(alpha - 1.0) < 1e-9
    integral = np.log(n) if one else (n ** (1.0 - alpha) - 1.0) / (1.0 - alpha)
    return integral + 0.5 * (1.0 + n**-alpha) + alpha / 12.0 * (1.0 - n ** (-alpha - 1.0))


def expected_rows_used(hash_size: int | np.ndarray, draws: float | np.ndarray) -> np.ndarray:
    """Birthday-paradox expectation of distinct rows touched when ``draws`` values hash uniformly
    into ``hash_size`` rows: H * (1 - (1 - 1/H)^n) (REFERENCES.md, RecShard)."""
    h = np.asarray(hash_size, dtype=float)
    return h * -np.expm1(np.asarray(draws, dtype=float) * np.log1p(-1.0 / h))
