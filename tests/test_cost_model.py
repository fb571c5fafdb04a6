"""The LightGBM cost model: learning a known function, save/load, and the CostModel contract."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from autoshard.cli import main
from autoshard.cost_models.evaluate import AnalyticalFit, group_split, metrics
from autoshard.cost_models.features import FEATURE_NAMES, dataset, partition_features, work_bytes
from autoshard.cost_models.microbench import COLUMNS
from autoshard.cost_models.model import LightGBMCostModel, NotFittedError
from autoshard.errors import InputError
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.cost import CostModel, load_cost_model
from autoshard.workloads import constrained_task, dlrm_tables

OVERHEAD_MS = 0.03  # per pass
MS_PER_BYTE = 1e-6  # 1 GB/s


def known_latency(X: np.ndarray) -> np.ndarray:
    """Overhead per pass plus work bytes at 1 GB/s: the function the model must recover."""
    col = {n: i for i, n in enumerate(FEATURE_NAMES)}
    passes = 1.0 + X[:, col["train"]]
    return OVERHEAD_MS * passes + np.exp2(X[:, col["log2_work_bytes"]]) * MS_PER_BYTE


def synthetic(n: int, seed: int, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = np.exp(rng.uniform(np.log(10), np.log(1e6), n)).round()
    lookups = np.exp(rng.uniform(0, np.log(1e5), n)).round() * scale
    return partition_features(
        rows, lookups, np.minimum(lookups, rows) * 0.7, rng.choice([8, 16, 32, 64, 128], n),
        rng.choice([128, 512, 2048], n), rng.choice([2, 4], n), rng.choice([1, 2, 4], n),
        rng.integers(0, 2, n), rng.integers(0, 2, n), 0)


@pytest.fixture(scope="module")
def fitted() -> LightGBMCostModel:
    X = synthetic(3000, seed=0)
    return LightGBMCostModel(n_estimators=300, random_state=0).fit(X, known_latency(X))


def test_recovers_known_function_on_held_out_points(fitted: LightGBMCostModel) -> None:
    X = synthetic(500, seed=1)
    m = metrics(fitted.predict(X), known_latency(X))
    assert m["mape"] < 0.05 and m["spearman"] > 0.99


def test_scales_with_work_beyond_the_training_range(fitted: LightGBMCostModel) -> None:
    X = synthetic(200, seed=2, scale=100.0)  # 100x more lookups than ever seen
    assert metrics(fitted.predict(X), known_latency(X))["mape"] < 0.1


def test_use_before_fit_is_a_clear_error() -> None:
    model = LightGBMCostModel(n_estimators=5)
    with pytest.raises(NotFittedError, match="not fitted"):
        model.predict(synthetic(2, seed=0))
    task = constrained_task(dlrm_tables(2, seed=0), 2)
    with pytest.raises(NotFittedError):
        model.price(task, np.array([0]), np.array([0]), np.array([0]))
    assert not hasattr(model, "booster_") and model.get_params()["n_estimators"] == 5


def test_bad_targets_are_refused() -> None:
    X = synthetic(4, seed=0)
    with pytest.raises(InputError, match="> 0"):
        LightGBMCostModel().fit(X, np.array([1.0, 0.0, 1.0, 1.0]))


def test_save_load_round_trip(tmp_path: Path, fitted: LightGBMCostModel) -> None:
    fitted.save(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["metadata.json", "model.txt"]
    meta = json.loads((tmp_path / "m" / "metadata.json").read_text())
    assert meta["feature_names"] == list(FEATURE_NAMES) and meta["tiers"] == ["host"]
    loaded = load_cost_model(str(tmp_path / "m"))
    assert isinstance(loaded, LightGBMCostModel)
    X = synthetic(50, seed=3)
    np.testing.assert_allclose(loaded.predict(X), fitted.predict(X), rtol=1e-12)
    assert loaded.get_params() == fitted.get_params()


def test_load_names_the_bad_file(tmp_path: Path, fitted: LightGBMCostModel) -> None:
    with pytest.raises(InputError, match=r"model\.txt"):
        LightGBMCostModel.load(tmp_path)
    fitted.save(tmp_path)
    meta = json.loads((tmp_path / "metadata.json").read_text())
    meta["feature_names"] = ["x"]
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match="feature_names"):
        LightGBMCostModel.load(tmp_path)


# The CostModel contract, shared with the analytical model -------------------------------

@pytest.fixture(scope="module", params=["analytical", "lightgbm"])
def cost_model(request: pytest.FixtureRequest, fitted: LightGBMCostModel) -> CostModel:
    return AnalyticalCostModel() if request.param == "analytical" else fitted


@pytest.fixture(scope="module")
def task():  # type: ignore[no-untyped-def]
    return constrained_task(dlrm_tables(6, seed=1), 2, batch_size=4096)


def test_contract_shapes_and_signs(cost_model: CostModel, task) -> None:  # type: ignore
    assert isinstance(cost_model, CostModel)
    t = np.repeat(np.arange(6), 4)
    d = np.tile([0, 1, 0, 1], 6)
    k = (task.table_arrays.rows[t] * np.tile([0.0, 0.01, 0.5, 1.0], 6)).astype(int)
    p = cost_model.price(task, t, d, k)
    for arr in (p.hbm_ms, p.uvm_ms, p.comm_ms, p.total_ms):
        assert arr.shape == t.shape and np.all(np.isfinite(arr)) and np.all(arr >= 0)
    assert np.all(p.uvm_ms[k == task.table_arrays.rows[t]] == 0)
    assert np.all(p.uvm_ms[k == 0] > 0)


def test_contract_more_hbm_rows_never_cost_more(cost_model: CostModel, task) -> None:  # type: ignore
    for t in range(task.num_tables):
        rows = task.table_arrays.rows[t]
        k = np.unique(np.concatenate([np.linspace(0, rows, 400).astype(int),
                                      np.geomspace(1, rows, 200).astype(int)]))
        total = cost_model.price(task, np.full(k.size, t), np.zeros(k.size, int), k).total_ms
        assert np.all(np.diff(total) <= 1e-9 * total[0]), task.tables[t].name
        assert total[-1] < total[0]


def test_lightgbm_takes_communication_from_the_analytical_model(fitted, task) -> None:  # type: ignore
    t, d, k = np.arange(6), np.zeros(6, int), np.zeros(6, int)
    np.testing.assert_allclose(fitted.price(task, t, d, k).comm_ms,
                               AnalyticalCostModel().price(task, t, d, k).comm_ms)


# Evaluation and CLI ------------------------------------------------------------------------

def test_group_split_keeps_configurations_whole() -> None:
    groups = np.repeat(np.arange(50).astype(str), 2)
    test = group_split(groups, 0.2, seed=0)
    assert test.sum() == 20
    assert np.all(test[::2] == test[1::2])


def test_analytical_fit_recovers_its_own_form() -> None:
    X = synthetic(300, seed=4)
    y = AnalyticalFit.design(X) @ np.array([0.05, 2e-7])
    fit = AnalyticalFit().fit(X, y)
    assert fit.overhead_ms == pytest.approx(0.05) and fit.bandwidth_gbps == pytest.approx(5.0)


def write_csv(path: Path, n: int, seed: int) -> None:
    """A microbenchmark-shaped CSV whose latencies follow :func:`known_latency`."""
    rng = np.random.default_rng(seed)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, restval="")
        w.writeheader()
        for i in range(n):
            row = dict(config_id=f"c{i}", op=str(rng.choice(["torch", "fbgemm"])),
                       dim=int(rng.choice([8, 32, 128])), batch=int(rng.choice([128, 1024])),
                       num_tables=1, dtype="fp32", tier="host",
                       part_rows=int(rng.integers(10, 10**5)),
                       lookups=float(rng.integers(1, 10**4)), hardware="test-cpu")
            row["distinct_rows"] = min(row["lookups"], row["part_rows"])  # type: ignore
            fwd = OVERHEAD_MS + work_bytes(float(row["lookups"]), float(row["batch"]),  # type: ignore
                                           float(row["dim"]), 4, 1, 0) * MS_PER_BYTE  # type: ignore
            bwd = OVERHEAD_MS + 2 * (fwd - OVERHEAD_MS)
            row.update(fwd_ms=float(fwd), bwd_ms=float(bwd), fwd_p10_ms=float(fwd) * 0.9,
                       bwd_p10_ms=float(bwd) * 0.9)
            w.writerow(row)


def test_dataset_names_bad_values(tmp_path: Path) -> None:
    import pandas as pd

    write_csv(tmp_path / "d.csv", 3, seed=0)
    df = pd.read_csv(tmp_path / "d.csv")
    X, y, groups = dataset(df)
    assert X.shape == (6, len(FEATURE_NAMES)) and list(groups[:3]) == list(groups[3:])
    np.testing.assert_allclose(y[3:], df.fwd_p10_ms + df.bwd_p10_ms)
    np.testing.assert_allclose(dataset(df, stat="median")[1][3:], df.fwd_ms + df.bwd_ms)
    with pytest.raises(InputError, match="tier"):
        dataset(df.assign(tier="disk"), source="d.csv")
    with pytest.raises(InputError, match="lookups"):
        dataset(df.drop(columns="lookups"), source="d.csv")


@pytest.mark.slow
def test_cli_fit_eval_compare(tmp_path: Path) -> None:
    data = tmp_path / "d.csv"
    write_csv(data, 150, seed=1)
    main(["cost-model", "fit", str(data), "-o", str(tmp_path / "m"), "--n-estimators", "100"])
    before = sorted(p.name for p in (tmp_path / "m").iterdir())
    main(["cost-model", "eval", str(tmp_path / "m"), str(data), "-o",
          str(tmp_path / "report" / "eval.json")])
    doc = json.loads((tmp_path / "report" / "eval.json").read_text())
    assert doc["all"]["samples"] == 300 and doc["all"]["mape"] < 0.1
    main(["cost-model", "eval", str(tmp_path / "m"), str(data)])  # prints only
    with pytest.raises(SystemExit) as exc:  # never into the model folder
        main(["cost-model", "eval", str(tmp_path / "m"), str(data), "-o",
              str(tmp_path / "m" / "eval.json")])
    assert exc.value.code == 2
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == before
    out = tmp_path / "cmp"
    main(["cost-model", "compare", str(data), "-o", str(out), "--mlp-epochs", "5",
          "--n-estimators", "50"])
    scores = json.loads((out / "metrics.json").read_text())["models"]
    assert set(scores) == {"lightgbm", "analytical", "mlp"}
    assert (out / "pred_vs_measured.png").stat().st_size > 0
    with pytest.raises(SystemExit) as exc:
        main(["cost-model", "fit", str(tmp_path / "missing.csv"), "-o", str(tmp_path / "x")])
    assert exc.value.code == 2


def test_repeated_measurements_are_pooled(tmp_path: Path) -> None:
    import pandas as pd

    write_csv(tmp_path / "d.csv", 4, seed=2)
    df = pd.read_csv(tmp_path / "d.csv")
    again = df.assign(fwd_ms=df.fwd_ms * 4.0, bwd_ms=df.bwd_ms * 4.0)
    X, y, groups = dataset(pd.concat([df, again]), stat="median")
    assert X.shape[0] == 8 and len(set(groups)) == 4
    np.testing.assert_allclose(y[:4], df.fwd_ms * 2.0)  # geometric mean of x and 4x
    with pytest.raises(InputError, match="fwd_p10_ms"):
        dataset(df.assign(fwd_p10_ms=""), stat="p10")
