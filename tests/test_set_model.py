"""The device-level (set) cost model and calibration: fit, verify, price devices, evaluate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autoshard.compare.suites import get_suite
from autoshard.cost_models.evaluate import metrics
from autoshard.cost_models.set_model import (
    SET_FEATURES,
    SetCostModel,
    additive_design,
    set_features,
)
from autoshard.errors import InputError
from autoshard.layout.plan import Placement, Plan
from autoshard.pricing.cost import load_cost_model
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders import get_sharder
from autoshard.workloads import constrained_task, dlrm_tables


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


@pytest.mark.slow
def test_calibrate_writes_a_verified_model_recording_both_machines(tmp_path: Path) -> None:
    from autoshard.cost_models.calibrate import CalibratedCostModel, calibrate
    from autoshard.machine import machine_record

    summary = calibrate(Path("autoshard/data/cost_model"), tmp_path / "cal",
                        budget_s=float("inf"), size=20, grid="tiny", progress=False)
    assert summary["configurations"] == 9  # every one of the sample: no time budget cuts it
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
    (tmp_path / "cal" / "metadata.json").write_text(json.dumps(dict(meta, linear={"coef": 1})))
    with pytest.raises(InputError, match="linear"):
        load_cost_model(str(tmp_path / "cal"))


def test_environment_prices_the_episode_with_the_set_model(fitted: SetCostModel) -> None:
    from autoshard.envs.placement import PlacementEnv

    task = constrained_task(dlrm_tables(6, seed=0), 2, hbm_fraction=3.0, batch_size=512)
    ends = {}
    for name, model in (("set", fitted), ("summed", Summed(fitted))):
        env = PlacementEnv(max_devices=2, cost_model=model)
        env.reset(options={"task": task})
        rewards, done, step = [], False, 0
        while not done:  # alternate devices, the fill bucket
            action = (step % 2) * env.buckets + env.buckets - 1
            _, reward, done, _, info = env.step(action)
            rewards.append(reward)
            step += 1
        report = evaluate(info["plan"], task, model)
        assert info["step_cost_ms"] == pytest.approx(report.step_cost_ms, rel=1e-9)
        assert sum(rewards) == pytest.approx(-report.step_cost_ms / env.lower_bound, rel=1e-9)
        ends[name] = info
    # Same plan, same per-table prices: only the device-level pricing differs.
    assert ends["set"]["plan"] == ends["summed"]["plan"]
    summed = ends["summed"]["step_cost_ms"]
    assert ends["set"]["summed_step_cost_ms"] == pytest.approx(summed, rel=1e-9)
    assert abs(ends["set"]["step_cost_ms"] - summed) > 0.01 * summed


class Summed:
    """A set model seen only through its per-table prices (what an additive model offers)."""

    def __init__(self, model: SetCostModel) -> None:
        self.model, self.name = model, "summed"

    def price(self, *args: Any) -> Any:
        return self.model.price(*args)


@pytest.mark.slow
def test_compare_cli_with_a_set_model_folder(fitted: SetCostModel, tmp_path: Path) -> None:
    import csv
    import subprocess
    import sys

    fitted.save(tmp_path / "set")
    out = tmp_path / "cmp"
    proc = subprocess.run(
        [sys.executable, "-m", "autoshard", "compare", "--suite", "tiny", "--out", str(out),
         "--cost-model", str(tmp_path / "set"), "--sharders", "size_greedy,lookup_greedy",
         "--wandb-mode", "disabled"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    with (out / "tiny.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert {r["cost_model"] for r in rows} == {"set"}
    assert all(r["cost_model_id"].startswith(str(tmp_path / "set")) for r in rows)
    model = load_cost_model(str(tmp_path / "set"))
    tasks = {spec.name: spec.build() for spec in get_suite("tiny")}
    for row in rows:  # each step cost is the set model's device-level price of the plan
        task = tasks[row["task"]]
        plan = get_sharder(row["sharder"]).shard(task, model)
        step = float(row["step_cost_ms"])
        assert step == pytest.approx(evaluate(plan, task, model).step_cost_ms, rel=1e-9)
        summed = evaluate(plan, task, Summed(fitted)).step_cost_ms  # type: ignore[arg-type]
        assert abs(step - summed) > 0.01 * summed


def test_linear_correction_fits_a_known_log_error_and_refuses_damage() -> None:
    from autoshard.cost_models.features import partition_features
    from autoshard.cost_models.log_linear import apply_linear, check_linear, fit_linear

    rng = np.random.default_rng(0)
    n = 400
    batch = 2.0 ** rng.integers(6, 13, n)
    X = partition_features(rng.integers(100, 10**6, n), batch * 4, batch * 2,
                           2 ** rng.integers(3, 8, n), batch, 4, rng.integers(1, 5, n),
                           rng.integers(0, 2, n), rng.integers(0, 2, n), 0)
    base = rng.uniform(0.05, 5.0, n)
    keys = np.array([f"{int(o)}/{int(t)}" for o, t in X[:, [9, 10]]])
    target = np.where(keys == "0/0", 0.5 + 0.1 * np.log2(batch), -0.2)
    params = fit_linear(X, base, target, keys, ridge=1e-6)
    np.testing.assert_allclose(apply_linear(params, X, base, list(keys)), target, atol=1e-3)
    assert apply_linear(params, X[:1], base[:1], ["unseen"])[0] == 0.0
    assert check_linear(json.loads(json.dumps(params)), "m") == params
    bad = dict(params, mean=[float("nan")] * len(params["mean"]))
    with pytest.raises(InputError, match="linear"):
        check_linear(bad, "m")
    with pytest.raises(InputError, match="linear"):
        check_linear({"coef": 1}, "m")
