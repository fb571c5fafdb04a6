"""Calibrating a learned cost model to the machine at hand.

A model fitted on one machine's microbenchmarks predicts that machine's latencies; another
machine (even one reporting the same CPU name) can be several times slower or faster, and not
uniformly across operators. :func:`calibrate` measures a small stratified sample of the model's
grid here (:func:`stratified_sample`, a time budget of about two minutes), and fits a correction
of the base model's prediction in log space:

- a scale per operator and mode (``torch``/``fbgemm`` x inference/training): the median log
  ratio of measured to predicted latency;
- a residual correction: a few shallow LightGBM trees over the same features (4, 8 or 16
  leaves), a robust linear model per operator and mode
  (:mod:`autoshard.cost_models.log_linear`), the
  average of the 8- or 16-leaf trees and the linear model, or none: whichever has the lowest
  error in a cross-validation over the sample.

:class:`CalibratedCostModel` is the base model times that correction, a CostModel like the base
model; its folder holds the base model's files (verified by digest), the residual trees (also
verified), the scales and linear correction (finite numbers, checked), and both machines.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.cost_models.features import FEATURE_NAMES, OP_CODES
from autoshard.cost_models.grid import BenchConfig, grid_configs
from autoshard.cost_models.lgb_text import file_digest
from autoshard.cost_models.log_linear import apply_linear, check_linear, fit_linear
from autoshard.cost_models.microbench import Timing, sweep
from autoshard.cost_models.model import (
    MODEL_FILE,
    LightGBMCostModel,
    finite_or_error,
    load_booster,
    read_metadata,
)
from autoshard.errors import InputError
from autoshard.fileio import atomic_write_text, write_output, write_structured
from autoshard.machine import machine_record
from autoshard.pricing.cost import CostModel

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
    "16 leaves x 300": ({"learning_rate": 0.03, "num_leaves": 16, "min_data_in_leaf": 5}, 300),
}
#: Corrections after the scales: name -> (trees of :data:`RESIDUALS` or None, linear or not).
#: When both, their log corrections are averaged.
CORRECTIONS: dict[str, tuple[str | None, bool]] = {
    **{name: (name, False) for name in RESIDUALS},
    "linear": (None, True),
    **{f"{name} + linear": (name, True) for name in list(RESIDUALS)[1:]},
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


def fit_correction(X: np.ndarray, base: np.ndarray, target: np.ndarray, name: str
                   ) -> tuple[Any, dict[str, Any] | None]:
    """Fits the correction ``name`` of :data:`CORRECTIONS` to ``target`` (log error left after
    the scales); returns (trees or None, linear parameters or None)."""
    trees, linear = CORRECTIONS[name]
    booster = _fit_residual(X, target, trees) if trees else None
    params = fit_linear(X, base, target, np.array(_group_keys(X))) if linear else None
    return booster, params


def apply_correction(X: np.ndarray, base: np.ndarray, booster: Any,
                     linear: dict[str, Any] | None) -> np.ndarray:
    """Log correction of each row by :func:`fit_correction`'s parts (their mean when both)."""
    parts = []
    if booster is not None:
        parts.append(np.asarray(booster.predict(X, num_threads=1)))
    if linear is not None:
        parts.append(apply_linear(linear, X, base, _group_keys(X)))
    return np.mean(parts, axis=0) if parts else np.zeros(len(X))


def _mape(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y) / y))


def cross_validate(X: np.ndarray, y: np.ndarray, base: np.ndarray, groups: np.ndarray,
                   folds: int = 5, seed: int = 0) -> dict[str, float]:
    """Group k-fold MAPE on the sample of: the base model, scales alone, and scales with each
    correction of :data:`CORRECTIONS`."""
    unique = np.unique(groups)
    rng = np.random.default_rng(seed)
    fold_of = dict(zip(rng.permutation(unique), np.arange(unique.size) % folds, strict=True))
    fold = np.array([fold_of[g] for g in groups])
    scaled = np.empty_like(y)
    full = {name: np.empty_like(y) for name in CORRECTIONS}
    r = np.log(y / base)
    for k in range(folds):
        test, train = fold == k, fold != k
        if not test.any() or not train.any():
            continue
        scales = fit_scales(X[train], r[train])
        s_train, s_test = apply_scales(X[train], scales), apply_scales(X[test], scales)
        scaled[test] = base[test] * np.exp(s_test)
        target = r[train] - s_train
        trees = {name: _fit_residual(X[train], target, name) for name in RESIDUALS}
        linear = fit_linear(X[train], base[train], target, np.array(_group_keys(X[train])))
        for name, (tree, lin) in CORRECTIONS.items():
            fix = apply_correction(X[test], base[test], trees[tree] if tree else None,
                                   linear if lin else None)
            full[name][test] = scaled[test] * np.exp(fix)
    return {"base": _mape(base, y), "scales": _mape(scaled, y), "folds": folds,
            **{f"scales + residual {name}": _mape(v, y) for name, v in full.items()}}


class CalibratedCostModel(LightGBMCostModel):
    """A LightGBM cost model times a per-operator scale and an optional residual correction.

    Attributes:
        scales: Log corrections per ``op/mode`` (:func:`fit_scales`).
        residual_: LightGBM booster of the remaining log error, or None.
        linear_: Linear correction of the remaining log error
            (:mod:`autoshard.cost_models.log_linear`), or None; averaged with the booster's
            when both are set.
        machines: ``{"base": ..., "calibrated": ...}`` machine records.
    """

    name = "calibrated"
    kind = "calibrated"
    scales: dict[str, float]
    residual_: Any
    linear_: dict[str, Any] | None
    machines: dict[str, Any]

    def predict(self, X: np.ndarray) -> np.ndarray:
        base = super().predict(X)
        if base.size == 0:
            return base
        X = np.asarray(X, dtype=np.float64)
        log_fix = apply_scales(X, self.scales) + apply_correction(X, base, self.residual_,
                                                                  self.linear_)
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
        model.linear_ = None
        if meta.get("linear") is not None:
            model.linear_ = check_linear(meta["linear"], str(src))
        machines = meta.get("machines")
        model.machines = dict(machines) if isinstance(machines, dict) else {}
        model.machine = model.machines.get("calibrated")
        model.source_ = str(src)
        return model


def _interleave(groups: list[list[BenchConfig]]) -> list[BenchConfig]:
    """One from each group in turn (groups that run out drop out)."""
    queues = [list(reversed(g)) for g in groups]
    out: list[BenchConfig] = []
    while any(queues):
        out.extend(q.pop() for q in queues if q)
    return out


def stratified_sample(grid: str, size: int, seed: int = 0,
                      exclude: set[str] | None = None) -> list[BenchConfig]:
    """``size`` configurations of a grid, drawn evenly from its strata and interleaved so any
    prefix is stratified too: in turn from each operator x tables per operator x whole/hot/cold
    partition, and within each of these in turn from each table size x batch (small and large
    operators alike)."""
    exclude = exclude or set()
    strata: dict[tuple[str, int, str], dict[tuple[int, int], list[BenchConfig]]] = {}
    for c in grid_configs(grid):
        if c.config_id not in exclude:
            cells = strata.setdefault((c.op, c.num_tables, c.part), {})
            cells.setdefault((c.rows, c.batch), []).append(c)
    rng = np.random.default_rng(seed)

    def shuffled(items: list[Any]) -> list[Any]:
        return [items[i] for i in rng.permutation(len(items))]

    members = [_interleave(shuffled([shuffled(cell) for cell in cells.values()]))
               for cells in strata.values()]
    return _interleave(members)[:size]


#: Timing of calibration measurements: less time per configuration than a full sweep's, to
#: measure more configurations in the budget, but as many repeats (31) of fast operators, whose
#: lower decile a few repeats overstate most.
CALIBRATION_TIMING = Timing(warmup=1, min_repeats=5, max_repeats=31, budget_s=0.04)
#: Default seconds of measuring: with the fit, the command takes about two minutes at most.
BUDGET_S = 90.0


def calibrate(model_dir: Path, output: Path, budget_s: float = BUDGET_S, size: int = 1200,
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

    from autoshard.cost_models.features import dataset

    src = Path(model_dir)
    base = LightGBMCostModel.load(src)
    if output.resolve() == src.resolve():
        raise InputError("write the calibrated model to a new folder", field="output",
                         value=str(output))
    sample = stratified_sample(grid, size, seed)  # an unknown grid fails before any output
    output.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    sweep(sample, output / SAMPLE_FILE, timing=CALIBRATION_TIMING, progress=progress,
          budget_s=budget_s)
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
    choice: str | None = min(CORRECTIONS, key=lambda n: cv[f"scales + residual {n}"])
    residual, linear = None, None
    if cv[f"scales + residual {choice}"] < cv["scales"]:
        residual, linear = fit_correction(X, before, log_ratio - apply_scales(X, scales),
                                          str(choice))
    else:
        choice = None
    summary = {"configurations": int(np.unique(groups).size), "samples": int(y.size),
               "measure_seconds": round(seconds, 1), "grid": grid, "seed": seed,
               "stat": stat, "cross_validated_mape": cv, "residual": choice}
    _write(output, src, base, scales, (residual, linear), summary)
    return dict(summary, scales=scales)


def _write(output: Path, src: Path, base: LightGBMCostModel, scales: dict[str, float],
           correction: tuple[Any, dict[str, Any] | None], summary: dict[str, Any]) -> None:
    residual, linear = correction
    with (src / MODEL_FILE).open("rb") as model_file:
        write_output(output / MODEL_FILE, lambda fh: shutil.copyfileobj(model_file, fh))
    meta: dict[str, Any] = {
        "format": FORMAT, "kind": "calibrated", "version": 1,
        "model_sha256": file_digest(output / MODEL_FILE), "communication": "analytical",
        "machine": machine_record(), "feature_names": list(FEATURE_NAMES),
        "base": {"source": str(src), "params": base.get_params(), "tiers": base.tiers_,
                 "info": base.info_},
        "machines": {"base": base.machine, "calibrated": machine_record()},
        "scales": scales, "residual": None, "linear": linear, "calibration": summary}
    if residual is not None:
        atomic_write_text(output / RESIDUAL_FILE, residual.model_to_string())
        meta["residual"] = {"file": RESIDUAL_FILE,
                            "sha256": file_digest(output / RESIDUAL_FILE)}
    else:
        (output / RESIDUAL_FILE).unlink(missing_ok=True)
    write_structured(output / "metadata.json", meta)
