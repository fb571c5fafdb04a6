"""TorchRec's estimator as a cost model (prices as TorchRec rates a plan), and recshard planning
for our model and TorchRec's at once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoshard.compare.suites import get_suite
from autoshard.errors import InputError
from autoshard.layout.plan import Plan
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.cost import load_cost_model, model_identity
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders import get_sharder
from autoshard.sharders.recshard import RecShard
from autoshard.sharders.recshard_blend import BlendedCostModel, choose
from autoshard.tables import save_tables
from autoshard.torchrec import torchrec_unavailable
from autoshard.torchrec.runtime_memory import PIPELINES
from autoshard.workloads import constrained_task, dlrm_tables
from tests.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
MODEL = AnalyticalCostModel()
needs_torchrec = pytest.mark.skipif(
    torchrec_unavailable(load=True) is not None,
    reason=f"torchrec not importable: {torchrec_unavailable(load=True)}")


def _small_task() -> object:
    return constrained_task(dlrm_tables(10, seed=3), 4, hbm_fraction=0.4, reservation="torchrec")


@needs_torchrec
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_plans_step_under_the_model_is_torchrecs_estimate(pipeline: str) -> None:
    """Every committed plan of the 16-device DCNv2 suite (whole tables, column blocks, row-wise
    and table-row-wise shards; fused, UVM and cached tables): the evaluator's step cost under
    the model equals TorchRec's own rating of the plan, and so does each rank's load."""
    from autoshard.torchrec.cost import TorchRecCostModel
    from autoshard.torchrec.estimate import estimate_plan

    spec = get_suite("dcnv2-16")[0]
    task = spec.build()
    model = TorchRecCostModel(pipeline)
    folder = ROOT / "results" / "torchrec" / "dcnv2-16.plans" / spec.name
    plans = sorted(folder.glob("*.json"))
    assert len(plans) >= 4
    kinds = set()
    for path in plans:
        plan = Plan.load(path)
        kinds |= {p.sharding.value for p in plan.placements if p.is_split}
        report = evaluate(plan, task, model)
        estimate = estimate_plan(plan, task, pipeline=pipeline)
        assert report.step_cost_ms == pytest.approx(estimate.step_ms, rel=1e-9), path.name
        assert [d.total_ms for d in report.per_device] == pytest.approx(
            [r.perf_ms for r in estimate.per_rank], rel=1e-9)
    assert {"row_wise", "table_row_wise", "column_wise"} <= kinds


@needs_torchrec
def test_prices_do_not_depend_on_the_device_and_follow_the_kernel() -> None:
    """TorchRec's topology is uniform; all rows in HBM (fused) is cheapest, a cache dearer, the
    table in host memory dearest; compute is split between the tiers by the cache's rows."""
    from autoshard.torchrec.cost import TorchRecCostModel

    task = _small_task()
    model = TorchRecCostModel()
    t = int(np.argmax(task.table_arrays.rows))
    rows = int(task.table_arrays.rows[t])
    idx = np.array([t, t, t, t])
    p = model.price(task, idx, np.array([0, 3, 0, 0]), np.array([rows, rows, rows // 2, 0]))
    assert p.total_ms[0] == p.total_ms[1]
    assert p.total_ms[0] < p.total_ms[2] < p.total_ms[3]
    assert p.uvm_ms[0] == 0.0 and p.hbm_ms[3] == 0.0
    assert p.uvm_ms[2] == pytest.approx(0.5 * p.compute_ms[2], rel=1e-3)
    assert (p.comm_ms > 0).all()


@needs_torchrec
def test_load_cost_model_names_torchrec_and_compare_identifies_it() -> None:
    from autoshard.torchrec.cost import TorchRecCostModel

    assert isinstance(load_cost_model("torchrec"), TorchRecCostModel)
    assert model_identity("torchrec").startswith("torchrec@")


def test_blend_sums_weighted_prices() -> None:
    task = _small_task()
    idx = np.arange(task.num_tables)
    dev = idx % task.num_devices
    rows = task.table_arrays.rows // 3
    one = MODEL.price(task, idx, dev, rows)
    both = BlendedCostModel((MODEL, MODEL), (0.25, 2.0)).price(task, idx, dev, rows)
    assert both.hbm_ms == pytest.approx(2.25 * one.hbm_ms)
    assert both.uvm_ms == pytest.approx(2.25 * one.uvm_ms)
    assert both.comm_ms == pytest.approx(2.25 * one.comm_ms)
    with pytest.raises(ValueError):
        BlendedCostModel((MODEL,), (1.0, 2.0))


def test_unknown_second_model_is_refused_when_the_sharder_is_made() -> None:
    with pytest.raises(InputError, match="also_for"):
        RecShard(also_for="no/such/model")


def test_choose_picks_the_least_worse_relative_cost() -> None:
    """Three plans under two models: each plan's score is its worse cost over the least of
    the three under each model, and the least score wins."""
    task = _small_task()
    plans = [get_sharder(name).shard(task, MODEL)
             for name in ("size_greedy", "lookup_greedy", "round_robin")]
    slow = AnalyticalCostModel(hbm_efficiency=0.25)
    picked = choose(plans, task, (MODEL, slow))
    costs = [[evaluate(p, task, m).step_cost_ms for m in (MODEL, slow)] for p in plans]
    assert picked.costs == [pytest.approx(c) for c in costs]
    least = [min(c[i] for c in costs) for i in range(2)]
    scores = [max(c[i] / least[i] for i in range(2)) for c in costs]
    assert picked.scores == pytest.approx(scores)
    assert picked.index == int(np.argmin(scores)) and min(scores) >= 1.0


@pytest.mark.usefixtures("step_clock")
@needs_torchrec
def test_planning_for_both_reports_both_figures() -> None:
    """recshard for our model and TorchRec's: a valid plan that fits TorchRec's storage
    estimate, its cost and bound ours, its status both models' figures."""
    from autoshard.torchrec.estimate import estimate_plan

    task = _small_task()
    result = RecShard(time_limit=6.0, also_for="torchrec").solve(task, MODEL).details
    plan = result.plan
    assert result.method.startswith("both-")
    assert plan.sharder == "recshard"
    report = evaluate(plan, task, MODEL)
    assert result.step_cost_ms == pytest.approx(report.step_cost_ms)
    assert 0.0 < result.bound_ms <= report.step_cost_ms
    assert "analytical" in result.status and "torchrec" in result.status
    assert estimate_plan(plan, task).fits


@pytest.mark.usefixtures("step_clock")
@needs_torchrec
def test_cli_plans_with_torchrecs_estimator_and_for_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tables = tmp_path / "tables.json"
    save_tables(tables, dlrm_tables(8, seed=1))
    base = ["plan", "-t", str(tables), "--devices", "2", "--hbm-gb", "2"]
    out = tmp_path / "plan.json"
    code, text, _ = run_cli([*base, "-s", "lookup_greedy", "--cost-model", "torchrec", "-o",
                             str(out), "--json"], capsys)
    assert code == 0 and out.is_file()
    assert json.loads(text)["cost_model"] == "torchrec"
    both = tmp_path / "both.json"
    code, _, _ = run_cli([*base, "-s", "recshard", "--time-limit", "3", "--opt",
                          "also_for=torchrec", "-o", str(both)], capsys)
    assert code == 0 and Plan.load(both).sharder == "recshard"
    bad = tmp_path / "bad.json"
    code, _, err = run_cli([*base, "-s", "recshard", "--opt", "also_for=nowhere", "-o",
                            str(bad)], capsys)
    assert code == 2 and "also_for" in err and "nowhere" in err
    assert not bad.exists()
