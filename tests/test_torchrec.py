"""TorchRec's planner as a sharder: runs on a simulated topology, converts exactly, prices with
our evaluator; a clear message when TorchRec is missing."""

from __future__ import annotations

import builtins
import importlib.util
from typing import Any

import pytest

from autoshard.analytical import AnalyticalCostModel
from autoshard.errors import PlannerError
from autoshard.evaluator import evaluate
from autoshard.export_torchrec import torchrec_unavailable
from autoshard.sharders import get_sharder, sharder_info
from autoshard.sharders.torchrec_planner import TorchRecSharder
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()
needs_torchrec = pytest.mark.skipif(
    torchrec_unavailable(load=True) is not None,
    reason=f"torchrec not importable: {torchrec_unavailable(load=True)}")


def test_unavailable_names_the_extra_when_torchrec_is_missing(monkeypatch: Any) -> None:
    real_find = importlib.util.find_spec
    real_import = builtins.__import__

    def no_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name.startswith("torchrec") else real_find(name, *args, **kwargs)

    def no_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("torchrec"):
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", no_spec)
    monkeypatch.setattr(builtins, "__import__", no_import)
    reason = TorchRecSharder.unavailable()
    assert reason is not None and "install the torchrec extra" in reason
    assert sharder_info("torchrec").unavailable == reason
    with pytest.raises(PlannerError, match="torchrec extra"):
        get_sharder("torchrec")
    assert "install the torchrec extra" in (torchrec_unavailable(load=True) or "")


@needs_torchrec
def test_plans_a_capacity_constrained_task_and_converts_exactly() -> None:
    task = constrained_task(dlrm_tables(8, seed=2), 2, hbm_fraction=0.5)
    sharder = TorchRecSharder()
    plan = sharder.shard(task, MODEL)
    report = evaluate(plan, task, MODEL)
    assert report.step_cost_ms > 0 and plan.sharder == "torchrec"
    device, rows = plan.arrays(task)
    assert sharder.last_repaired == []
    module_plan = sharder.last_sharding_plan.get_plan_for_module("")
    kernels = set()
    for i, t in enumerate(task.tables):
        ps = module_plan[t.name]
        kernels.add(ps.compute_kernel)
        assert ps.sharding_type == "table_wise" and ps.ranks == [device[i]]
        expected = {"fused": t.rows, "fused_uvm": 0}.get(ps.compute_kernel)
        if expected is None:
            expected = round(ps.cache_params.load_factor * t.rows)
        assert rows[i] == expected, t.name
    assert kernels - {"fused"}, "half the bytes fit in HBM: some table must leave it"


@needs_torchrec
def test_roomy_hbm_keeps_every_table_fused() -> None:
    task = constrained_task(dlrm_tables(6, seed=4), 2, hbm_fraction=3.0)
    device, rows = get_sharder("torchrec").shard(task, MODEL).arrays(task)
    assert (rows == task.table_arrays.rows).all()
    assert len(set(device)) == 2
