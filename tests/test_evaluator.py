"""The evaluator and the lower bound on the hand case, and the bound against brute force."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from handcase import HAND_HBM_BYTES, hand_profile, hand_tables, reference_price_ms

from autoshard.access import AccessCurve
from autoshard.errors import PlannerError
from autoshard.hardware import Device, Tier
from autoshard.layout.plan import Placement, Plan
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.bounds import lower_bound_ms
from autoshard.pricing.evaluator import evaluate
from autoshard.tables import Table
from autoshard.task import ShardingTask, Workload

MODEL = AnalyticalCostModel()


def hand_totals() -> dict[str, float]:
    """Each hand table's cost with all its rows in HBM, from the reference formula."""
    return {t.name: sum(reference_price_ms(t, 1.0, 2)) for t in hand_tables()}


def test_hand_optimum_is_priced_right(hand_task: ShardingTask) -> None:
    # Only A alone | B + C keeps every row in HBM (36,000 B each side). Any device holding two
    # tables costs at least those two all in HBM, and B + C is the cheapest pair, so this plan
    # is optimal: step cost = cost(B) + cost(C).
    cost = hand_totals()
    plan = Plan((Placement("A", 0, 1000), Placement("B", 1, 500), Placement("C", 1, 500)))
    report = evaluate(plan, hand_task, MODEL)
    assert cost["A"] == pytest.approx(0.02488, rel=1e-12)
    assert cost["B"] == pytest.approx(0.01808, rel=1e-12)
    assert report.step_cost_ms == pytest.approx(cost["B"] + cost["C"], rel=1e-12)
    d0, d1 = report.per_device
    assert (d0.tables, d1.tables) == (1, 2)
    assert d0.total_ms == pytest.approx(cost["A"], rel=1e-12)
    assert d1.comm_ms == pytest.approx(2 * 0.00064, rel=1e-12)
    assert d1.uvm_ms == 0.0
    assert (d0.hbm_bytes, d1.hbm_bytes, d0.host_bytes) == (HAND_HBM_BYTES, HAND_HBM_BYTES, 0)
    assert report.uvm_lookup_share == 0.0
    mean = (cost["A"] + cost["B"] + cost["C"]) / 2
    assert report.load_balance == pytest.approx(report.step_cost_ms / mean, rel=1e-12)
    # Bound: max(cheapest single table = A, total all-in-HBM work / 2 devices) = 0.06104 / 2.
    assert report.lower_bound_ms == pytest.approx(mean, rel=1e-9)
    assert report.lower_bound_ms == pytest.approx(0.03052, rel=1e-9)
    assert report.cost_ratio == pytest.approx(0.03616 / 0.03052, rel=1e-9)
    assert report.access_assumptions == {"uniform": 3}


def test_split_plan_reports_uvm_share(hand_task: ShardingTask) -> None:
    # A keeps 250 of its 1000 rows in HBM: 3/4 of its 2000 lookups go to host memory.
    plan = Plan((Placement("A", 0, 250), Placement("B", 1, 500), Placement("C", 1, 500)))
    report = evaluate(plan, hand_task, MODEL)
    assert report.uvm_lookup_share == pytest.approx(1500 / 4000)
    d0 = report.per_device[0]
    assert (d0.hbm_bytes, d0.host_bytes) == (250 * 36, 750 * 36)
    ref = reference_price_ms(hand_tables()[0], 0.25, 2)
    assert (d0.hbm_ms, d0.uvm_ms, d0.comm_ms) == pytest.approx(ref, rel=1e-12)
    assert d0.uvm_lookups == pytest.approx(1500)


def test_over_capacity_plan_is_rejected(hand_task: ShardingTask) -> None:
    plan = Plan((Placement("A", 0, 1000), Placement("B", 0, 500), Placement("C", 1, 500)))
    with pytest.raises(PlannerError, match="device 0 HBM") as info:
        evaluate(plan, hand_task, MODEL)
    assert info.value.kind == "capacity"


def test_known_bound_is_used_when_larger(hand_task: ShardingTask) -> None:
    plan = Plan((Placement("A", 0, 1000), Placement("B", 1, 500), Placement("C", 1, 500)))
    report = evaluate(plan, hand_task, MODEL, bound_ms=0.034)
    assert report.lower_bound_ms == 0.034
    assert evaluate(plan, hand_task, MODEL, bound_ms=0.001).lower_bound_ms == pytest.approx(0.03052)


def test_report_to_dict_has_the_documented_keys(hand_task: ShardingTask) -> None:
    plan = Plan((Placement("A", 0, 1000), Placement("B", 1, 500), Placement("C", 1, 500)))
    doc = evaluate(plan, hand_task, MODEL).to_dict()
    for key in ("step_cost_ms", "lower_bound_ms", "load_balance", "uvm_lookup_share",
                "per_device", "cost_ratio"):
        assert key in doc
    assert doc["per_device"][1]["tables"] == 2


def brute_force_optimum(task: ShardingTask) -> float:
    """Least step cost over every device assignment and every HBM row count of every table."""
    a = task.table_arrays
    dev = task.device_arrays
    per_row = a.memory_bytes_per_row
    n, d = task.num_tables, task.num_devices
    choices = [np.arange(int(r) + 1) for r in a.rows]
    prices = [MODEL.price(task, np.full(c.size * d, t), np.repeat(np.arange(d), c.size),
                          np.tile(c, d)).total_ms.reshape(d, c.size)
              for t, c in enumerate(choices)]
    best = np.inf
    for assign in itertools.product(range(d), repeat=n):
        grids = np.meshgrid(*choices, indexing="ij")
        load = np.zeros((d, *grids[0].shape))
        hbm = np.zeros_like(load)
        host = np.zeros_like(load)
        for t, k in enumerate(grids):
            load[assign[t]] += prices[t][assign[t]][k]
            hbm[assign[t]] += k * per_row[t]
            host[assign[t]] += (a.rows[t] - k) * per_row[t]
        shape = (d,) + (1,) * n
        ok = np.all((hbm <= dev.hbm_capacity.reshape(shape))
                    & (host <= dev.host_capacity.reshape(shape)), axis=0)
        if ok.any():
            best = min(best, float(load.max(axis=0)[ok].min()))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_bound_never_exceeds_brute_force_optimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tables = []
    for i in range(3):
        rows = int(rng.integers(1, 13))
        kind = rng.integers(3)
        extra: dict[str, object] = {}
        if kind == 1:
            extra["zipf_alpha"] = float(rng.uniform(0.0, 2.0))
        elif kind == 2:  # a measured, not necessarily concave, curve
            x = np.sort(rng.choice(np.arange(1, 10), size=3, replace=False)) / 10
            y = np.sort(rng.uniform(0, 1, 3))
            extra["access_cdf"] = AccessCurve((0.0, *x, 1.0), (0.0, *y, 1.0))
        tables.append(Table(f"t{i}", rows=rows, dim=int(rng.choice([4, 8, 16])),
                            pooling_factor=float(rng.uniform(0.5, 8)), **extra))  # type: ignore[arg-type]
    per_row = 16 * 4 + 4
    hbm = int(rng.integers(0, 12)) * per_row + int(rng.integers(0, per_row))
    profile = hand_profile(2, hbm_bytes=hbm)
    if seed >= 12:  # two kinds of device: different HBM capacity and bandwidth
        fast = Device(Tier(hbm // 2, 300.0), profile.devices[0].host)
        profile = replace(profile, devices=(profile.devices[0], fast))
    mode = "train" if seed % 2 else "infer"
    task = ShardingTask(tuple(tables), profile,
                        Workload(batch_size=int(rng.integers(1, 5000)), mode=mode))
    optimum = brute_force_optimum(task)
    bound = lower_bound_ms(task, MODEL)
    assert bound <= optimum * (1 + 1e-9)
    assert bound > 0
