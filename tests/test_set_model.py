"""The device-level (set) cost model and calibration: fit, verify, price devices, evaluate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoshard.cost import load_cost_model
from autoshard.errors import InputError
from autoshard.evaluator import evaluate
from autoshard.plan import Placement, Plan
from autoshard.workloads import constrained_task, dlrm_tables
from cost_models.evaluate import metrics
from cost_models.set_model import SET_FEATURES, SetCostModel, additive_design, set_features


def synthetic_sets(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sets whose cost is one shared launch per set plus bytes, minus a discount growing with
    the table count (not a sum of per-table costs)."""
    rng = np.random.default_rng(seed)
    feats, cost = [], []
    for _ in range(n):
        t = int(rng.integers(1, 33))
        rows = rng.integers(100, 50_000, t)
        dims = rng.choice([8, 32, 64], t)
        lookups = 512 * rng.integers(1, 20, t)
        X = set_features(np.zeros(t, dtype=np.int64), rows, dims, lookups, lookups * 0.5, 512.0,
                         1)
        feats.append(X[0])
        cost.append(0.2 + 2e-6 * float(np.sum(lookups * dims * 4)) / (1 + 0.05 * t))
    return np.array(feats), np.array(cost)


@pytest.fixture(scope="module")
def fitted() -> SetCostModel:
    X, y = synthetic_sets(300, seed=0)
    return SetCostModel(n_estimators=100).fit(X, y)


def test_set_model_learns_what_a_sum_cannot(fitted: SetCostModel) -> None:
    from scipy.optimize import nnls

    X, y = synthetic_sets(300, seed=0)
    Xt, yt = synthetic_sets(100, seed=1)
    coef = nnls(additive_design(X) / y[:, None], np.ones_like(y))[0]
    additive = metrics(additive_design(Xt) @ coef, yt)
    learned = metrics(fitted.predict(Xt), yt)
    assert learned["mape"] < 0.5 * additive["mape"] and learned["spearman"] > 0.95


def test_device_pricing_evaluator_and_round_trip(fitted: SetCostModel, tmp_path: Path) -> None:
    fitted.save(tmp_path / "m")
    model = load_cost_model(str(tmp_path / "m"))
    assert isinstance(model, SetCostModel) and model.name == "set"
    task = constrained_task(dlrm_tables(8, seed=0), 3, hbm_fraction=3.0, batch_size=512)
    t = np.arange(8)
    device = np.array([0, 0, 0, 0, 1, 1, 1, 1])  # device 2 empty
    hbm = task.table_arrays.rows // 2
    per_device = model.device_compute_ms(task, t, device, hbm)
    assert per_device.shape == (3,) and np.all(per_device[:2] > 0) and per_device[2] == 0
    plan = Plan(tuple(Placement(task.tables[i].name, int(device[i]), int(hbm[i]))
                      for i in range(8)), sharder="test")
    report = evaluate(plan, task, model)
    got = np.array([d.hbm_ms + d.uvm_ms for d in report.per_device])
    np.testing.assert_allclose(got, per_device, rtol=1e-9)
    single = model.price(task, t, device, hbm)
    assert single.total_ms.shape == (8,) and np.all(np.isfinite(single.total_ms))


def test_damaged_set_model_is_refused(fitted: SetCostModel, tmp_path: Path) -> None:
    out = fitted.save(tmp_path / "m")
    meta = json.loads((out / "metadata.json").read_text())
    (out / "metadata.json").write_text(json.dumps(dict(meta, additive=[1.0, "x"])))
    with pytest.raises(InputError, match="additive"):
        load_cost_model(str(out))
    (out / "metadata.json").write_text(json.dumps(meta))
    text = (out / "model.txt").read_text()
    (out / "model.txt").write_text(text[:-200])
    with pytest.raises(InputError, match="model_sha256"):
        load_cost_model(str(out))
    assert len(SET_FEATURES) == fitted.booster_.num_feature()


def test_calibrate_writes_a_verified_model_recording_both_machines(tmp_path: Path) -> None:
    from autoshard.machine import machine_record
    from cost_models.calibrate import CalibratedCostModel, calibrate

    summary = calibrate(Path("autoshard/data/cost_model"), tmp_path / "cal", budget_s=60,
                        size=20, grid="tiny", progress=False)
    assert summary["configurations"] == 9
    model = load_cost_model(str(tmp_path / "cal"))
    assert isinstance(model, CalibratedCostModel)
    assert model.machines["calibrated"]["fingerprint"] == machine_record()["fingerprint"]
    assert model.machines["base"]["cpu_model"] == "AMD EPYC"
    task = constrained_task(dlrm_tables(4, seed=0), 2)
    assert np.all(np.isfinite(model.price(task, np.arange(4), np.zeros(4, dtype=np.int64),
                                          np.zeros(4)).total_ms))
    meta = json.loads((tmp_path / "cal" / "metadata.json").read_text())
    for scales in ({"*": "nan"}, {"*": "x"}, [1.0]):
        (tmp_path / "cal" / "metadata.json").write_text(json.dumps(dict(meta, scales=scales)))
        with pytest.raises(InputError, match="scales"):
            load_cost_model(str(tmp_path / "cal"))
