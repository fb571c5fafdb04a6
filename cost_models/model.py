"""A LightGBM model of embedding-partition latency that is also an autoshard CostModel.

The model learns log(latency per work byte) of a partition from :func:`features.partition_features`
(so its predictions grow with the bytes a partition moves beyond the measured sizes, where trees
alone would flatten). As a :class:`autoshard.pricing.cost.CostModel` it prices a table split at its
k hottest rows as two partitions, the hot rows in HBM and the cold rows in host memory (UVM),
each priced as FBGEMM's table-batched operator over that partition alone, for the task's batch
and mode:

- trained on GPU data (tiers ``hbm`` and ``uvm`` measured), each partition is predicted at its
  own tier;
- trained on CPU data only (tier ``host``), both partitions are predicted at the measured tier
  and the cold one is scaled by the device's HBM / host-link bandwidth ratio (e.g. 3350 / 64 for
  an H100 profile): lookups over the host link are that much slower than the same lookups in HBM.
  Absolute figures are then the benchmark machine's latencies, not the profile's.

A split's price is the cheapest split with at most k hot rows (a plan may leave rows it was given
HBM for in host memory), interpolated between the access grid's points, so more HBM rows never
cost more. Communication (``comm_ms``) comes from
:class:`autoshard.pricing.analytical.AnalyticalCostModel`: the microbenchmarks do not measure it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.access import GRID
from autoshard.cost_models.features import (
    FEATURE_NAMES,
    OP_CODES,
    TIER_CODES,
    WORK_COLUMN,
    partition_features,
    task_partitions,
)
from autoshard.cost_models.lgb_text import checked_model_text, file_digest, verify_digest
from autoshard.errors import InputError
from autoshard.extras import require
from autoshard.fileio import atomic_write_text, output_folder, write_structured
from autoshard.pricing.analytical import replica_update_ms
from autoshard.pricing.cost import CostModel, Pricing, load_cost_model
from autoshard.task import ShardingTask

MODEL_FILE = "model.txt"
META_FILE = "metadata.json"
FORMAT = "autoshard-lightgbm-cost-model"
_TIER_COLUMN = FEATURE_NAMES.index("tier")
_LN2 = math.log(2.0)


class NotFittedError(ValueError, AttributeError):
    """The model was used before ``fit`` (or ``load``)."""


class LightGBMCostModel:
    """Gradient-boosted trees over partition features, usable wherever a CostModel is.

    Args:
        n_estimators: Boosting rounds.
        learning_rate: Shrinkage per round.
        num_leaves: Leaves per tree.
        min_child_samples: Fewest samples in a leaf.
        subsample: Share of samples drawn for each tree (bagging every round when below 1).
        objective: LightGBM objective on log latency per work byte (``regression`` = squared
            error, ``huber``, ``regression_l1`` = absolute error, robust to noisy repeats).
        random_state: Seed of LightGBM's bagging and feature sampling.
        communication: Prices communication (``comm_ms``); None: the analytical model.
    """

    name = "lightgbm"
    kind = "lightgbm"

    def __init__(self, n_estimators: int = 600, learning_rate: float = 0.05,
                 num_leaves: int = 31, min_child_samples: int = 5, subsample: float = 0.8,
                 objective: str = "regression", random_state: int = 0,
                 communication: CostModel | None = None) -> None:
        self.communication = communication or load_cost_model("analytical")
        self.machine: dict[str, Any] | None = None
        self.source_ = "<fitted model>"
        self.objective = objective
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.subsample = subsample
        self.random_state = random_state

    def get_params(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("n_estimators", "learning_rate", "num_leaves",
                                              "min_child_samples", "subsample", "objective",
                                              "random_state")}

    def fit(self, X: np.ndarray, y: np.ndarray, info: dict[str, Any] | None = None
            ) -> LightGBMCostModel:
        """Fits latency ``y`` (ms, > 0) on features ``X`` from :func:`partition_features`.

        Args:
            info: Free-form metadata saved with the model (training data, hardware).
        """
        lightgbm = require("lightgbm", "costmodel")
        X, y = _check_xy(X, y)
        params = {"objective": self.objective, "learning_rate": self.learning_rate,
                  "num_leaves": self.num_leaves, "min_data_in_leaf": self.min_child_samples,
                  "bagging_fraction": self.subsample, "bagging_freq": int(self.subsample < 1),
                  "seed": self.random_state, "deterministic": True, "num_threads": 1,
                  "verbosity": -1}
        data = lightgbm.Dataset(X, _target(X, y), feature_name=list(FEATURE_NAMES),
                                free_raw_data=True)
        self.booster_ = lightgbm.train(params, data, num_boost_round=self.n_estimators)
        self.tiers_ = sorted({t for t, c in TIER_CODES.items() if np.any(X[:, _TIER_COLUMN] == c)})
        self.info_ = dict(info or {}, samples=int(X.shape[0]))
        machine = self.info_.get("machine")
        self.machine = machine if isinstance(machine, dict) else None
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Latency (ms) of each partition row of ``X``."""
        self._check_fitted()
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES):
            raise InputError(f"features must be [N, {len(FEATURE_NAMES)}]", field="X",
                             value=list(X.shape))
        if X.shape[0] == 0:
            return np.zeros(0)
        raw = np.asarray(self.booster_.predict(X, num_threads=1))
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.exp(raw + X[:, WORK_COLUMN] * _LN2)
        return finite_or_error(out, self.source_)

    def predict_partitions(self, X: np.ndarray) -> np.ndarray:
        """Latency (ms) of each partition row of ``X`` (what ``cost-model eval`` scores)."""
        return self.predict(X)

    def _check_fitted(self) -> None:
        if not hasattr(self, "booster_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet: call fit(X, y) "
                                 "or LightGBMCostModel.load(directory) first")

    # CostModel interface -----------------------------------------------------------------

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        """Prices table ``table_idx[i]`` on device ``device_idx[i]`` with ``hbm_rows[i]`` hot
        rows in HBM (see the module docstring)."""
        self._check_fitted()
        t = np.asarray(table_idx, dtype=np.int64)
        d = np.asarray(device_idx, dtype=np.int64)
        k = np.asarray(hbm_rows, dtype=np.float64)
        t, d, k = np.broadcast_arrays(t, d, k)
        hot, cold = self._grid_costs(task)
        dev = task.device_arrays
        scale = np.ones_like(dev.hbm_gbps) if "uvm" in self.tiers_ else dev.hbm_gbps / dev.host_gbps
        hbm_ms, uvm_ms = price_from_grid(task, t, d, k, hot, cold, scale)
        comm = self.communication.price(task, t, d, k).comm_ms
        return Pricing(hbm_ms=hbm_ms + replica_update_ms(task, t, d), uvm_ms=uvm_ms,
                       comm_ms=comm)

    def _grid_costs(self, task: ShardingTask) -> tuple[np.ndarray, np.ndarray]:
        """Latency (ms) of the hot and cold partition of every table at every grid split,
        [T, len(GRID)] each; cached per task."""
        cache: dict[int, tuple[ShardingTask, np.ndarray, np.ndarray]] = self.__dict__.setdefault(
            "_price_cache", {})
        hit = cache.get(id(task))
        if hit is not None and hit[0] is task:
            return hit[1], hit[2]
        a = task.table_arrays
        parts = task_partitions(task)
        hot_tier = "hbm" if "hbm" in self.tiers_ else "host"
        cold_tier = "uvm" if "uvm" in self.tiers_ else hot_tier
        common: dict[str, Any] = dict(dim=a.dim[:, None], batch=task.workload.batch_size,
                      bytes_per_element=(a.row_bytes / a.dim)[:, None], num_tables=1,
                      op=OP_CODES["fbgemm"], train=int(task.workload.train))
        out = []
        for rows, lookups, distinct, tier in (
                (parts.hot_rows, parts.hot_lookups, parts.hot_distinct, hot_tier),
                (parts.cold_rows, parts.cold_lookups, parts.cold_distinct, cold_tier)):
            X = partition_features(rows, lookups, distinct, tier=TIER_CODES[tier], **common)
            ms = self.predict(X).reshape(rows.shape)
            out.append(np.where(rows >= 1, ms, 0.0))
        if len(cache) >= 4:
            cache.pop(next(iter(cache)))
        cache[id(task)] = (task, out[0], out[1])
        return out[0], out[1]

    # Persistence ---------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Writes LightGBM's text model and a JSON of metadata into ``directory``."""
        import lightgbm

        self._check_fitted()
        out = Path(directory)
        with output_folder(out):  # a failed save leaves no new folder behind
            atomic_write_text(out / MODEL_FILE, self.booster_.model_to_string())
            meta = {"format": FORMAT, "kind": self.kind, "version": 1,
                    "model_sha256": file_digest(out / MODEL_FILE),
                    "communication": "analytical", "machine": self.machine,
                    "params": self.get_params(), "feature_names": list(FEATURE_NAMES),
                    "tiers": self.tiers_, "lightgbm_version": lightgbm.__version__,
                    "info": self.info_}
            write_structured(out / META_FILE, meta)
        return out

    @classmethod
    def load(cls, directory: str | Path, communication: CostModel | None = None
             ) -> LightGBMCostModel:
        """Reads and verifies a model written by :meth:`save`.

        Args:
            communication: Prices communication; None: the analytical model.

        Raises:
            InputError: a file is missing, damaged, edited (digest), or written for other
                features.
        """
        src = Path(directory)
        meta = read_metadata(src, FORMAT)
        model = cls(**meta["params"], communication=communication)
        model.booster_ = load_booster(src, meta)
        model.tiers_ = list(meta["tiers"])
        model.info_ = dict(meta.get("info", {}))
        model.machine = meta.get("machine")
        model.source_ = str(src)
        return model


def read_metadata(src: Path, fmt: str, feature_names: tuple[str, ...] = FEATURE_NAMES
                  ) -> dict[str, Any]:
    """A model folder's metadata, checked to be of format ``fmt`` with this package's features.

    Raises:
        InputError: missing files, invalid JSON, another format or feature list.
    """
    for name in (MODEL_FILE, META_FILE):
        if not (src / name).is_file():
            raise InputError("cost-model file missing", source=str(src), field=name,
                             value=None)
    try:
        meta = json.loads((src / META_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"invalid JSON ({exc})", source=str(src / META_FILE)) from exc
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise InputError(f"not a {fmt}", source=str(src / META_FILE), field="format",
                         value=meta.get("format") if isinstance(meta, dict) else None)
    if meta.get("feature_names", list(feature_names)) != list(feature_names):
        raise InputError("model was trained on other features", source=str(src / META_FILE),
                         field="feature_names", value=meta.get("feature_names"))
    return meta


def load_booster(src: Path, meta: dict[str, Any],
                 feature_names: tuple[str, ...] = FEATURE_NAMES, file: str = MODEL_FILE) -> Any:
    """LightGBM's booster from ``src/file`` after its digest (``meta["model_sha256"]``) and
    structure are checked."""
    lightgbm = require("lightgbm", "costmodel")
    path = src / file
    if not path.is_file():
        raise InputError("cost-model file missing", source=str(src), field=file)
    verify_digest(path, meta.get("model_sha256"), str(src / META_FILE))
    text = checked_model_text(path, feature_names)
    try:
        return lightgbm.Booster(model_str=text)
    except lightgbm.basic.LightGBMError as exc:
        raise InputError(f"LightGBM cannot read the model ({exc})", source=str(path)) from exc


def finite_or_error(ms: np.ndarray, source: str) -> np.ndarray:
    """``ms`` when every value is finite and >= 0, else an InputError naming the model."""
    if ms.size and not np.all(np.isfinite(ms) & (ms >= 0)):
        bad = ms[~(np.isfinite(ms) & (ms >= 0))][0]
        raise InputError("cost model predicts a latency that is not a finite number >= 0",
                         source=source, field="prediction", value=float(bad))
    return ms


def _check_xy(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES) or y.shape != (X.shape[0],):
        raise InputError(f"need X [N, {len(FEATURE_NAMES)}] and y [N]", field="X",
                         value=[list(X.shape), list(y.shape)])
    if X.shape[0] == 0 or not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise InputError("latencies must be finite and > 0", field="y",
                         value=float(np.min(y)) if y.size else None)
    return X, y


def _target(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """log(latency per work byte): what the trees learn."""
    return np.log(y) - X[:, WORK_COLUMN] * _LN2


def price_from_grid(task: ShardingTask, t: np.ndarray, d: np.ndarray, k: np.ndarray,
                    hot: np.ndarray, cold: np.ndarray, cold_scale: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(HBM ms, host ms) of table ``t[i]`` on device ``d[i]`` with ``k[i]`` hot rows, from the
    costs of every table's hot and cold partition at every grid split ([T, len(GRID)] each; the
    cold one scaled by ``cold_scale[d]``): the cheapest split with at most k hot rows,
    interpolated between grid points, so more HBM rows never cost more."""
    scales, s_idx = np.unique(cold_scale, return_inverse=True)
    pairs, inverse = np.unique(t * scales.size + s_idx[d], return_inverse=True)
    pt, ps = pairs // scales.size, scales[pairs % scales.size]
    hbm_env, uvm_env = _envelope(hot[pt], cold[pt] * ps[:, None])
    frac = np.clip(k / task.table_arrays.rows[t], 0.0, 1.0)
    j = np.clip(np.searchsorted(GRID, frac, side="right") - 1, 0, GRID.size - 2)
    w = (frac - GRID[j]) / (GRID[j + 1] - GRID[j])
    q = inverse.reshape(t.shape)

    def interp(env: np.ndarray) -> np.ndarray:
        return env[q, j] + (env[q, j + 1] - env[q, j]) * w

    return interp(hbm_env), interp(uvm_env)


def _envelope(hot: np.ndarray, cold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the (hot, cold) costs of the cheapest split at or before each grid point."""
    total = hot + cold
    best = np.minimum.accumulate(total, axis=1)
    cols = np.arange(total.shape[1])
    arg = np.maximum.accumulate(np.where(total <= best, cols, 0), axis=1)
    rows = np.arange(total.shape[0])[:, None]
    return hot[rows, arg], cold[rows, arg]
