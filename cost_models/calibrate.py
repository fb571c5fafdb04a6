"""Calibrating a learned cost model to the machine at hand.

A model fitted on one machine's microbenchmarks predicts that machine's latencies; another
machine (even one reporting the same CPU name) can be several times slower or faster, and not
uniformly across operators. :func:`calibrate` measures a small stratified sample of the model's
grid here (:func:`stratified_sample`, a time budget of about two minutes), and fits a correction
of the base model's prediction in log space:

- a scale per operator and mode (``torch``/``fbgemm`` x inference/training): the median log
  ratio of measured to predicted latency;
- a small residual model (LightGBM, a few shallow trees) over the same features: of none, a
  4-leaf and an 8-leaf one, the one with the lowest error in a cross-validation over the sample.

:class:`CalibratedCostModel` is the base model times that correction, a CostModel like the base
model; its folder holds the base model's files (verified by digest), the residual trees (also
verified), the scales, and both machines.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.cost import CostModel
from autoshard.errors import InputError
from autoshard.fileio import atomic_write_text
from autoshard.machine import machine_record
from cost_models.features import FEATURE_NAMES, OP_CODES
from cost_models.grid import BenchConfig, grid_configs
from cost_models.lgb_text import file_digest
from cost_models.microbench import Timing, sweep
from cost_models.model import (
    MODEL_FILE,
    LightGBMCostModel,
    finite_or_error,
    load_booster,
    read_metadata,
)

FORMAT = "autoshard-calibrated-cost-model"
RESIDUAL_FILE = "residual.txt"
SAMPLE_FILE = "calibration.csv"
_OP, _TRAIN = FEATURE_NAMES.index("op"), FEATURE_NAMES.index("train")
_BASE_PARAMS = {"objective": "regression_l1", "lambda_l2": 1.0, "deterministic": True,
                "num_threads": 1, "verbosity": -1, "seed": 0}
#: Residual models tried: name -> (LightGBM parameters, boosting rounds).
RESIDUALS: dict[str, tuple[dict[str, Any], int]] = {
    "4 leaves x 40": ({"learning_rate": 0.1, "num_leaves": 4, "min_data_in_leaf": 8}, 40),
    "8 leaves x 200": ({"learning_rate": 0.03, "num_leaves": 8, "min_data_in_leaf": 5}, 200),
}


def _group_keys(X: np.ndarray) -> list[str]:
    ops = {v: k for k, v in OP_CODES.items()}
    return [f"{ops.get(int(o), int(o))}/{'train' if t else 'infer'}"
            for o, t in zip(X[:, _OP], X[:, _TRAIN], strict=True)]


def fit_scales(X: np.ndarray, log_ratio: np.ndarray) -> dict[str, float]:
    """Median log(measured / predicted) per operator and mode, plus ``*`` over all."""
    keys = np.array(_group_keys(X))
    scales = {"*": float(np.median(log_ratio))}
    for key in np.unique(keys):
        scales[str(key)] = float(np.median(log_ratio[keys == key]))
    return scales


def apply_scales(X: np.ndarray, scales: dict[str, float]) -> np.ndarray:
    """Log correction of each row from :func:`fit_scales` (``*`` for unseen groups)."""
    return np.array([scales.get(k, scales["*"]) for k in _group_keys(X)])


def _fit_residual(X: np.ndarray, r: np.ndarray, name: str) -> Any:
    import lightgbm

    params, rounds = RESIDUALS[name]
    data = lightgbm.Dataset(X, r, feature_name=list(FEATURE_NAMES), free_raw_data=True)
    return lightgbm.train({**_BASE_PARAMS, **params}, data, num_boost_round=rounds)


def _mape(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y) / y))


def cross_validate(X: np.ndarray, y: np.ndarray, base: np.ndarray, groups: np.ndarray,
                   folds: int = 5, seed: int = 0) -> dict[str, float]:
    """Group k-fold MAPE on the sample of: the base model, scales alone, and scales with each
    residual model of :data:`RESIDUALS`."""
    unique = np.unique(groups)
    rng = np.random.default_rng(seed)
    fold_of = dict(zip(rng.permutation(unique), np.arange(unique.size) % folds, strict=True))
    fold = np.array([fold_of[g] for g in groups])
    scaled = np.empty_like(y)
    full = {name: np.empty_like(y) for name in RESIDUALS}
    r = np.log(y / base)
    for k in range(folds):
        test, train = fold == k, fold != k
        if not test.any() or not train.any():
            continue
        scales = fit_scales(X[train], r[train])
        s_train, s_test = apply_scales(X[train], scales), apply_scales(X[test], scales)
        scaled[test] = base[test] * np.exp(s_test)
        for name in RESIDUALS:
            booster = _fit_residual(X[train], r[train] - s_train, name)
            full[name][test] = scaled[test] * np.exp(booster.predict(X[test], num_threads=1))
    return {"base": _mape(base, y), "scales": _mape(scaled, y), "folds": folds,
            **{f"scales + residual {name}": _mape(v, y) for name, v in full.items()}}


class CalibratedCostModel(LightGBMCostModel):
    """A LightGBM cost model times a per-operator scale and an optional residual model.

    Attributes:
        scales: Log corrections per ``op/mode`` (:func:`fit_scales`).
        residual_: LightGBM booster of the remaining log error, or None.
        machines: ``{"base": ..., "calibrated": ...}`` machine records.
    """

    name = "calibrated"
    kind = "calibrated"
    scales: dict[str, float]
    residual_: Any
    machines: dict[str, Any]

    def predict(self, X: np.ndarray) -> np.ndarray:
        base = super().predict(X)
        if base.size == 0:
            return base
        log_fix = apply_scales(np.asarray(X, dtype=np.float64), self.scales)
        if self.residual_ is not None:
            log_fix = log_fix + np.asarray(self.residual_.predict(X, num_threads=1))
        with np.errstate(over="ignore", invalid="ignore"):
            out = base * np.exp(log_fix)
        return finite_or_error(out, self.source_)

    def save(self, directory: str | Path) -> Path:
        raise NotImplementedError("calibrated models are written by cost_models.calibrate")

    @classmethod
    def load(cls, directory: str | Path, communication: CostModel | None = None
             ) -> CalibratedCostModel:
        """Reads and verifies a folder written by :func:`calibrate`.

        Raises:
            InputError: a missing, damaged or edited file (digests), another format.
        """
        src = Path(directory)
        meta = read_metadata(src, FORMAT)
        base = meta.get("base", {})
        model = cls(**base.get("params", {}), communication=communication)
        model.booster_ = load_booster(src, meta)
        model.tiers_ = list(base.get("tiers", ["host"]))
        model.info_ = dict(base.get("info", {}))
        try:
            model.scales = {str(k): float(v) for k, v in meta["scales"].items()}
        except (AttributeError, KeyError, TypeError, ValueError):
            model.scales = {"*": math.nan}
        if "*" not in model.scales or not all(
                math.isfinite(v) and abs(v) < 20 for v in model.scales.values()):
            raise InputError("scales must be finite log ratios", source=str(src),
                             field="scales", value=meta["scales"])
        model.residual_ = None
        if meta.get("residual"):
            model.residual_ = load_booster(src, {"model_sha256": meta["residual"]["sha256"]},
                                           file=RESIDUAL_FILE)
        machines = meta.get("machines")
        model.machines = dict(machines) if isinstance(machines, dict) else {}
        model.machine = model.machines.get("calibrated")
        model.source_ = str(src)
        return model


def stratified_sample(grid: str, size: int, seed: int = 0,
                      exclude: set[str] | None = None) -> list[BenchConfig]:
    """``size`` configurations of a grid, drawn evenly from its strata (operator x tables per
    operator x whole/hot/cold partition) and interleaved so any prefix is stratified too."""
    exclude = exclude or set()
    strata: dict[tuple[str, int, str], list[BenchConfig]] = {}
    for c in grid_configs(grid):
        if c.config_id not in exclude:
            strata.setdefault((c.op, c.num_tables, c.part), []).append(c)
    rng = np.random.default_rng(seed)
    queues = [list(rng.permutation(len(v))) for v in strata.values()]
    members = list(strata.values())
    out: list[BenchConfig] = []
    while len(out) < size and any(queues):
        for q, m in zip(queues, members, strict=True):
            if q and len(out) < size:
                out.append(m[q.pop()])
    return out


#: Timing of calibration measurements: shorter than a full sweep's, to fit the time budget.
CALIBRATION_TIMING = Timing(warmup=1, min_repeats=5, max_repeats=15, budget_s=0.06)


def calibrate(model_dir: Path, output: Path, budget_s: float = 85.0, size: int = 400,
              grid: str = "default", seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """Measures a stratified sample of ``grid`` here and writes a calibrated model to ``output``.

    The sample's rows go to ``output/calibration.csv`` as they are measured (a rerun resumes
    it); the model's files are written last.

    Args:
        budget_s: Stop measuring new configurations after this many seconds.
        size: Configurations in the sample at most.

    Returns:
        A summary: configurations measured, seconds, cross-validated MAPE, the scales.
    """
    import pandas as pd

    from cost_models.features import dataset

    src = Path(model_dir)
    base = LightGBMCostModel.load(src)
    if output.resolve() == src.resolve():
        raise InputError("write the calibrated model to a new folder", field="output",
                         value=str(output))
    output.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    sweep(stratified_sample(grid, size, seed), output / SAMPLE_FILE, timing=CALIBRATION_TIMING,
          progress=progress, budget_s=budget_s)
    seconds = time.perf_counter() - start
    df = pd.read_csv(output / SAMPLE_FILE)
    stat = str(base.info_.get("stat", "p10"))
    X, y, groups = dataset(df, source=str(output / SAMPLE_FILE), stat=stat)
    if np.unique(groups).size < 8:
        raise InputError("too few configurations measured to calibrate (raise the budget)",
                         field="budget_s", value=budget_s)
    before = base.predict(X)
    cv = cross_validate(X, y, before, groups)
    log_ratio = np.log(y / before)
    scales = fit_scales(X, log_ratio)
    choice = min(RESIDUALS, key=lambda n: cv[f"scales + residual {n}"])
    residual = None
    if cv[f"scales + residual {choice}"] < cv["scales"]:
        residual = _fit_residual(X, log_ratio - apply_scales(X, scales), choice)
    summary = {"configurations": int(np.unique(groups).size), "samples": int(y.size),
               "measure_seconds": round(seconds, 1), "grid": grid, "seed": seed,
               "stat": stat, "cross_validated_mape": cv,
               "residual": choice if residual is not None else None}
    _write(output, src, base, scales, residual, summary)
    return dict(summary, scales=scales)


def _write(output: Path, src: Path, base: LightGBMCostModel, scales: dict[str, float],
           residual: Any, summary: dict[str, Any]) -> None:
    shutil.copyfile(src / MODEL_FILE, output / MODEL_FILE)
    meta: dict[str, Any] = {
        "format": FORMAT, "kind": "calibrated", "version": 1,
        "model_sha256": file_digest(output / MODEL_FILE), "communication": "analytical",
        "machine": machine_record(), "feature_names": list(FEATURE_NAMES),
        "base": {"source": str(src), "params": base.get_params(), "tiers": base.tiers_,
                 "info": base.info_},
        "machines": {"base": base.machine, "calibrated": machine_record()},
        "scales": scales, "residual": None, "calibration": summary}
    if residual is not None:
        atomic_write_text(output / RESIDUAL_FILE, residual.model_to_string())
        meta["residual"] = {"file": RESIDUAL_FILE,
                            "sha256": file_digest(output / RESIDUAL_FILE)}
    else:
        (output / RESIDUAL_FILE).unlink(missing_ok=True)
    atomic_write_text(output / "metadata.json", json.dumps(meta, indent=2) + "\n")
