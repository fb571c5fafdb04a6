"""A small linear model of a cost model's remaining log error, one per operator and mode.

Calibration corrects a base model's latency in log space. Besides a few shallow trees, it can
use this linear correction: per ``op/mode`` group, ``log(measured / predicted)`` is regressed on
a handful of standardised size features and the base model's own log prediction (which says
which latency regime a partition is in), with a ridge penalty shrinking the slopes toward the
per-group constant, and fitted by iteratively reweighted least squares to an absolute-error loss
(robust to the one-sided timing noise of a shared machine). It is a few numbers, written to JSON
and verified on load.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autoshard.cost_models.features import FEATURE_NAMES
from autoshard.errors import InputError

#: Features of the linear correction (besides the base model's log prediction).
LINEAR_FEATURES = ("log2_work_bytes", "log2_batch", "log2_distinct", "log2_part_rows",
                   "log2_dim", "num_tables", "lookups_per_bag", "distinct_per_lookup")
_COLUMNS = [FEATURE_NAMES.index(f) for f in LINEAR_FEATURES]


def _design(X: np.ndarray, base: np.ndarray) -> np.ndarray:
    return np.column_stack([X[:, _COLUMNS], np.log(base)])


def fit_linear(X: np.ndarray, base: np.ndarray, target: np.ndarray, keys: np.ndarray,
               ridge: float = 1.0, iterations: int = 10) -> dict[str, Any]:
    """Fits the correction of ``target`` (a log error) per group of ``keys``.

    Args:
        X: Partition features (:data:`autoshard.cost_models.features.FEATURE_NAMES`).
        base: The base model's predictions (ms) of the same rows.
        target: Log error to explain, one per row.
        keys: Group of each row (``op/mode``).
        ridge: Penalty on the standardised slopes (not on the intercept).
        iterations: Reweighting rounds toward the absolute-error fit.

    Returns:
        ``{"features", "mean", "scale", "coef": {group: [intercept, slopes...]}}``.
    """
    Z = _design(X, base)
    mean, scale = Z.mean(axis=0), Z.std(axis=0) + 1e-9
    A_all = np.column_stack([np.ones(len(Z)), (Z - mean) / scale])
    penalty = np.eye(A_all.shape[1]) * ridge
    penalty[0, 0] = 0.0
    coef: dict[str, list[float]] = {}
    for key in np.unique(keys):
        rows = keys == key
        A, r = A_all[rows], target[rows]
        w = np.ones(len(r))
        for _ in range(iterations):
            Aw = A * w[:, None]
            c = np.linalg.solve(A.T @ Aw + penalty, Aw.T @ r)
            w = 1.0 / np.maximum(np.abs(r - A @ c), 0.02)
        coef[str(key)] = [float(v) for v in c]
    return {"features": [*LINEAR_FEATURES, "log_base_ms"], "mean": mean.tolist(),
            "scale": scale.tolist(), "coef": coef}


def apply_linear(params: dict[str, Any], X: np.ndarray, base: np.ndarray, keys: list[str]
                 ) -> np.ndarray:
    """Log correction of each row (0 for a group the fit never saw)."""
    Z = (_design(X, base) - np.asarray(params["mean"])) / np.asarray(params["scale"])
    A = np.column_stack([np.ones(len(Z)), Z])
    coef = params["coef"]
    zero = np.zeros(A.shape[1])
    C = np.array([coef.get(k, zero) for k in keys], dtype=np.float64).reshape(A.shape)
    return np.sum(A * C, axis=1)


def check_linear(params: Any, source: str) -> dict[str, Any]:
    """Verifies a correction read from a file: shapes match, every number finite.

    Raises:
        InputError: anything else.
    """
    width = len(LINEAR_FEATURES) + 1
    try:
        ok = (list(params["features"]) == [*LINEAR_FEATURES, "log_base_ms"]
              and len(params["mean"]) == width and len(params["scale"]) == width
              and all(len(c) == width + 1 for c in params["coef"].values()))
        numbers = [*params["mean"], *params["scale"],
                   *(v for c in params["coef"].values() for v in c)]
        ok = ok and all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers)
        ok = ok and all(v > 0 for v in params["scale"])
    except (AttributeError, KeyError, TypeError):
        ok = False
    if not ok:
        raise InputError("linear correction must hold finite numbers of the expected shape",
                         source=source, field="linear", value=str(params)[:200])
    return dict(params)
