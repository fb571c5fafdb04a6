"""A device-level cost model: the latency of one device's whole table set, learned from sets.

FBGEMM fuses a device's tables into one table-batched operator, so a device's cost is not the
sum of its tables' costs measured alone. :class:`SetCostModel` prices a set (trained: forward +
backward with the fused optimizer) in two stages over :func:`set_features` (counts, sums,
maxima, means and spreads of the members' rows, dims, pooling, skew = distinct rows per lookup,
and bytes, computed with ``bincount`` over ragged sets so planning prices many sets at once):

- an additive part, per table an overhead plus bytes looked up, pooled and distinct, with
  coefficients fitted to the sets' totals (non-negative least squares on relative error);
- boosted trees learning log(measured / additive part) from the set features: what the set
  costs beyond (or below) the sum of its tables.

As a :class:`autoshard.pricing.cost.CostModel`:

- :meth:`SetCostModel.device_compute_ms` prices each device's set: the hot partitions (rows in
  HBM) as one set, the cold partitions (rows in host memory) as another, the latter scaled by
  the device's HBM / host-link bandwidth ratio as the CPU-trained LightGBM model does. The
  evaluator uses it for per-device compute when a model has it.
- :meth:`SetCostModel.price` prices each table as a set of its own (what a sharder that adds
  table prices sees); communication comes from the model handed in (the analytical one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from autoshard.access import GRID
from autoshard.cost_models.features import task_partitions
from autoshard.cost_models.lgb_text import file_digest
from autoshard.cost_models.model import (
    MODEL_FILE,
    finite_or_error,
    load_booster,
    price_from_grid,
    read_metadata,
)
from autoshard.errors import InputError
from autoshard.extras import require
from autoshard.fileio import atomic_write_text, output_folder, write_structured
from autoshard.pricing.analytical import replica_update_ms
from autoshard.pricing.cost import CostModel, Pricing, load_cost_model
from autoshard.task import ShardingTask

FORMAT = "autoshard-set-cost-model"
SET_FEATURES = (
    "num_tables", "log2_batch", "log2_work_bytes", "log2_sum_lookups", "log2_sum_lookup_bytes",
    "log2_sum_distinct_bytes", "log2_sum_table_bytes", "log2_sum_dim", "max_log2_rows",
    "mean_log2_rows", "std_log2_rows", "min_log2_rows", "max_dim", "mean_dim",
    "max_pooling", "mean_pooling", "mean_distinct_per_lookup", "min_distinct_per_lookup",
    "max_work_share",
)
_COL = {name: i for i, name in enumerate(SET_FEATURES)}
_PARAMS = {"objective": "regression", "learning_rate": 0.05, "num_leaves": 7,
           "min_data_in_leaf": 5, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
           "deterministic": True, "num_threads": 1, "verbosity": -1, "seed": 0}


def additive_design(X: np.ndarray) -> np.ndarray:
    """Per set, sums over its tables of [1, bytes looked up, bytes pooled, distinct bytes]
    (recovered from :func:`set_features`; 4-byte elements)."""
    batch = np.exp2(X[:, _COL["log2_batch"]])
    return np.column_stack([
        X[:, _COL["num_tables"]], np.exp2(X[:, _COL["log2_sum_lookup_bytes"]]) - 1.0,
        batch * (np.exp2(X[:, _COL["log2_sum_dim"]]) - 1.0) * 4.0,
        np.exp2(X[:, _COL["log2_sum_distinct_bytes"]]) - 1.0])


def set_features(set_id: np.ndarray, rows: np.ndarray, dims: np.ndarray, lookups: np.ndarray,
                 distinct: np.ndarray, batch: float, n_sets: int, bytes_per_element: float = 4.0
                 ) -> np.ndarray:
    """Features [n_sets, len(SET_FEATURES)] of sets given by their members (one entry per
    member table: the set it belongs to, its rows, dim, lookups per step and distinct rows
    touched). Sets without members get all-zero counts (price them as 0)."""
    sid = np.asarray(set_id, dtype=np.int64)
    r = np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
    d = np.asarray(dims, dtype=np.float64)
    lk = np.asarray(lookups, dtype=np.float64)
    u = np.asarray(distinct, dtype=np.float64)
    bpe = bytes_per_element

    def total(v: np.ndarray) -> np.ndarray:
        return np.bincount(sid, weights=v, minlength=n_sets)

    def biggest(v: np.ndarray, init: float) -> np.ndarray:
        out = np.full(n_sets, init)
        np.maximum.at(out, sid, v)
        return out

    n = np.maximum(total(np.ones_like(r)), 1.0)
    lr = np.log2(r)
    work = (lk + batch) * d * bpe * 3.0
    sum_work = total(work)
    per_lookup = u / np.maximum(lk, 1.0)
    mean_lr = total(lr) / n
    return np.column_stack([
        total(np.ones_like(r)), np.full(n_sets, np.log2(batch)),
        np.log2(np.maximum(sum_work, 1.0)), np.log2(total(lk) + 1.0),
        np.log2(total(lk * d * bpe) + 1.0), np.log2(total(u * d * bpe) + 1.0),
        np.log2(total(r * d * bpe) + 1.0), np.log2(total(d) + 1.0), biggest(lr, 0.0), mean_lr,
        np.sqrt(np.maximum(total(lr**2) / n - mean_lr**2, 0.0)), -biggest(-lr, -64.0),
        biggest(d, 0.0), total(d) / n, biggest(lk / batch, 0.0), total(lk / batch) / n,
        total(per_lookup) / n, -biggest(-per_lookup, -1.0),
        biggest(work, 0.0) / np.maximum(sum_work, 1.0),
    ])


def frame_features(df: Any) -> tuple[np.ndarray, np.ndarray]:
    """(features, latency ms of forward + backward at the p10) of measured sets (a DataFrame
    from :func:`autoshard.cost_models.set_bench.read_sets`), one row per set, each at its own
    batch."""
    X = np.vstack([set_features(np.zeros(len(r), dtype=np.int64), r, d, lk, u, float(b), 1)
                   for r, d, lk, u, b in zip(df["rows"], df["dims"], df["lookups"],
                                             df["distinct"], df["batch"], strict=True)])
    y = df["fwd_p10_ms"].to_numpy(float) + df["bwd_p10_ms"].to_numpy(float)
    return X, y


class SetCostModel:
    """Gradient-boosted trees over :func:`set_features` (module docstring).

    Args:
        n_estimators: Boosting rounds.
        communication: Prices communication; None: the analytical model.
    """

    name = "set"
    kind = "set"
    additive_: np.ndarray

    def __init__(self, n_estimators: int = 150, communication: CostModel | None = None) -> None:
        self.n_estimators = n_estimators
        self.communication = communication or load_cost_model("analytical")
        self.machine: dict[str, Any] | None = None
        self.info_: dict[str, Any] = {}
        self.source_ = "<fitted set model>"

    def fit(self, X: np.ndarray, y: np.ndarray, info: dict[str, Any] | None = None
            ) -> SetCostModel:
        """Fits set latency ``y`` (ms > 0) on ``X`` from :func:`set_features`."""
        from scipy.optimize import nnls

        lightgbm = require("lightgbm", "costmodel")
        if X.ndim != 2 or X.shape[1] != len(SET_FEATURES) or y.shape != (X.shape[0],):
            raise InputError(f"need X [N, {len(SET_FEATURES)}] and y [N]", field="X",
                             value=[list(X.shape), list(y.shape)])
        if not np.all(np.isfinite(y) & (y > 0)):
            raise InputError("latencies must be finite and > 0", field="y")
        A = additive_design(X)
        self.additive_ = nnls(A / y[:, None], np.ones_like(y))[0]
        base = np.maximum(A @ self.additive_, 1e-9)
        data = lightgbm.Dataset(X, np.log(y / base), feature_name=list(SET_FEATURES))
        self.booster_ = lightgbm.train(_PARAMS, data, num_boost_round=self.n_estimators)
        self.info_ = dict(info or {}, samples=int(X.shape[0]))
        machine = self.info_.get("machine")
        self.machine = machine if isinstance(machine, dict) else None
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Latency (ms) of each set row of ``X``; 0 for empty sets."""
        if not hasattr(self, "booster_"):
            raise InputError("the set model is not fitted", field="model")
        X = np.asarray(X, dtype=np.float64)
        if X.shape[0] == 0:
            return np.zeros(0)
        base = additive_design(X) @ self.additive_
        with np.errstate(over="ignore", invalid="ignore"):
            ms = base * np.exp(np.asarray(self.booster_.predict(X, num_threads=1)))
        ms = np.where(X[:, 0] > 0, ms, 0.0)
        return finite_or_error(ms, self.source_)

    # CostModel interface -----------------------------------------------------------------

    def _partitions(self, task: ShardingTask, t: np.ndarray, k: np.ndarray
                    ) -> tuple[np.ndarray, ...]:
        """(hot rows, hot lookups, hot distinct, cold rows, cold lookups, cold distinct) of
        table ``t[i]`` with ``k[i]`` rows in HBM."""
        parts = task_partitions(task)
        a = task.table_arrays
        rows = a.rows[t].astype(np.float64)
        frac = np.clip(k / rows, 0.0, 1.0)
        j = np.clip(np.searchsorted(GRID, frac, side="right") - 1, 0, GRID.size - 2)
        w = (frac - GRID[j]) / (GRID[j + 1] - GRID[j])
        dist = parts.hot_distinct[t, j] + (parts.hot_distinct[t, j + 1]
                                            - parts.hot_distinct[t, j]) * w
        hot_lk = a.lookups[t] * task.hbm_share(t, k)
        hot_rows = np.floor(rows * frac + 1e-9)
        return (hot_rows, hot_lk, dist, rows - hot_rows, a.lookups[t] - hot_lk,
                np.maximum(parts.hot_distinct[t, -1] - dist, 0.0))

    def _sets_ms(self, task: ShardingTask, set_id: np.ndarray, rows: np.ndarray,
                 lookups: np.ndarray, distinct: np.ndarray, dims: np.ndarray, n_sets: int
                 ) -> np.ndarray:
        keep = rows >= 1
        X = set_features(set_id[keep], rows[keep], dims[keep], lookups[keep], distinct[keep],
                         float(task.workload.batch_size), n_sets)
        ms = self.predict(X)
        if not task.workload.train:  # forward only: the measured share of forward in a step
            ms = ms * float(self.info_.get("forward_share", 1.0))
        return ms

    def _cold_scale(self, task: ShardingTask) -> np.ndarray:
        dev = task.device_arrays
        return dev.hbm_gbps / dev.host_gbps

    def device_compute_ms(self, task: ShardingTask, table_idx: np.ndarray,
                          device_idx: np.ndarray, hbm_rows: np.ndarray) -> np.ndarray:
        """Compute time of each device's whole set, ms ([D]): hot set + scaled cold set."""
        t = np.asarray(table_idx, dtype=np.int64)
        d = np.asarray(device_idx, dtype=np.int64)
        k = np.asarray(hbm_rows, dtype=np.float64)
        hr, hl, hd, cr, cl, cd = self._partitions(task, t, k)
        dims = task.table_arrays.dim[t].astype(np.float64)
        n = task.num_devices
        hot = self._sets_ms(task, d, hr, hl, hd, dims, n)
        cold = self._sets_ms(task, d, cr, cl, cd, dims, n)
        update = np.bincount(d, weights=np.broadcast_to(replica_update_ms(task, t, d), d.shape),
                             minlength=n)
        return hot + cold * self._cold_scale(task) + update

    def _singleton_grid(self, task: ShardingTask) -> tuple[np.ndarray, np.ndarray]:
        """Each table's hot and cold partition at every grid split priced as a set of its own,
        ms, [T, len(GRID)] each; cached per task."""
        cache: dict[int, tuple[ShardingTask, np.ndarray, np.ndarray]] = self.__dict__.setdefault(
            "_grid_cache", {})
        hit = cache.get(id(task))
        if hit is not None and hit[0] is task:
            return hit[1], hit[2]
        parts = task_partitions(task)
        shape = parts.hot_rows.shape
        own = np.arange(parts.hot_rows.size)
        dims = np.broadcast_to(task.table_arrays.dim[:, None], shape).ravel().astype(np.float64)
        out = [self._sets_ms(task, own, rows.ravel(), lk.ravel(), dist.ravel(), dims,
                             own.size).reshape(shape)
               for rows, lk, dist in ((parts.hot_rows, parts.hot_lookups, parts.hot_distinct),
                                      (parts.cold_rows, parts.cold_lookups,
                                       parts.cold_distinct))]
        if len(cache) >= 4:
            cache.pop(next(iter(cache)))
        cache[id(task)] = (task, out[0], out[1])
        return out[0], out[1]

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        """Each row priced as a set of its own on its device (see the module docstring),
        interpolated between the access grid's splits as the LightGBM model does."""
        t, d, k = np.broadcast_arrays(np.asarray(table_idx, dtype=np.int64),
                                      np.asarray(device_idx, dtype=np.int64),
                                      np.asarray(hbm_rows, dtype=np.float64))
        hot, cold = self._singleton_grid(task)
        hbm_ms, uvm_ms = price_from_grid(task, t, d, k, hot, cold, self._cold_scale(task))
        comm = self.communication.price(task, t, d, k).comm_ms
        return Pricing(hbm_ms=hbm_ms + replica_update_ms(task, t, d), uvm_ms=uvm_ms,
                       comm_ms=comm)

    # Persistence ---------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """LightGBM text model plus JSON metadata with its digest."""
        out = Path(directory)
        with output_folder(out):  # a failed save leaves no new folder behind
            atomic_write_text(out / MODEL_FILE, self.booster_.model_to_string())
            meta = {"format": FORMAT, "kind": self.kind, "version": 1,
                    "model_sha256": file_digest(out / MODEL_FILE),
                    "communication": "analytical", "machine": self.machine,
                    "feature_names": list(SET_FEATURES), "n_estimators": self.n_estimators,
                    "additive": list(map(float, self.additive_)), "info": self.info_}
            write_structured(out / "metadata.json", meta)
        return out

    @classmethod
    def load(cls, directory: str | Path, communication: CostModel | None = None
             ) -> SetCostModel:
        """Reads and verifies a folder written by :meth:`save`."""
        src = Path(directory)
        meta = read_metadata(src, FORMAT, feature_names=SET_FEATURES)
        model = cls(int(meta.get("n_estimators", 150)), communication=communication)
        model.booster_ = load_booster(src, meta, feature_names=SET_FEATURES)
        try:
            coef = np.asarray(meta.get("additive", []), dtype=np.float64)
        except (TypeError, ValueError):
            coef = np.full(1, np.nan)
        if coef.shape != (4,) or not np.all(np.isfinite(coef) & (coef >= 0)):
            raise InputError("must be 4 finite coefficients >= 0", source=str(src),
                             field="additive", value=meta.get("additive"))
        model.additive_ = coef
        model.info_ = dict(meta.get("info", {}))
        model.machine = meta.get("machine")
        model.source_ = str(src)
        return model
