"""Split tables: shards priced by hand, the evaluator per shard, the bound against brute force."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from handcase import HAND_BATCH, HAND_INTRA_GBPS, hand_profile, reference_price_ms

from autoshard.access import AccessCurve
from autoshard.errors import PlannerError
from autoshard.hardware import Device, Tier
from autoshard.layout.kinds import ShardingKind
from autoshard.layout.plan import Placement, Plan, Shard
from autoshard.layout.shards import (
    ShardLayout,
    even_split,
    plan_layout,
    price_layout,
    shard_memory,
    shard_task,
)
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.bounds import lower_bound_ms
from autoshard.pricing.evaluator import evaluate
from autoshard.tables import Table
from autoshard.task import ShardingTask, Workload

MODEL = AnalyticalCostModel()
A_ROWS_0_600 = Shard(0, 0, 600, 0, 8, 600)
A_ROWS_600_1000 = Shard(1, 600, 1000, 0, 8, 100)


def _prices(task: ShardingTask, plan: Plan) -> np.ndarray:
    layout = plan_layout(plan, task)
    p = price_layout(task, MODEL, layout)
    return np.stack([p.hbm_ms, p.uvm_ms, p.comm_ms], axis=1)


def test_row_shards_see_their_share_of_lookups(hand_task: ShardingTask) -> None:
    plan = Plan((Placement.split("A", "row_wise", (A_ROWS_0_600, A_ROWS_600_1000)),
                 Placement("B", 0, 0), Placement("C", 1, 0)))
    got = _prices(hand_task, plan)
    # A row shard of 600 rows of A (pooling 2, uniform access) is a 600-row table with pooling
    # 1.2, whose partial sums are the full dim 8.
    first = Table("A0", rows=600, dim=8, pooling_factor=1.2)
    second = Table("A1", rows=400, dim=8, pooling_factor=0.8)
    assert got[0] == pytest.approx(reference_price_ms(first, 1.0, 2), rel=1e-12)
    assert got[1] == pytest.approx(reference_price_ms(second, 100 / 400, 2), rel=1e-12)


def test_column_blocks_see_every_lookup(hand_task: ShardingTask) -> None:
    plan = Plan((Placement.split("A", "column_wise", (Shard(0, 0, 1000, 0, 2, 1000),
                                                      Shard(1, 0, 1000, 2, 8, 250))),
                 Placement("B", 0, 0), Placement("C", 1, 0)))
    got = _prices(hand_task, plan)
    narrow = Table("A0", rows=1000, dim=2, pooling_factor=2.0)
    wide = Table("A1", rows=1000, dim=6, pooling_factor=2.0)
    assert got[0] == pytest.approx(reference_price_ms(narrow, 1.0, 2), rel=1e-12)
    assert got[1] == pytest.approx(reference_price_ms(wide, 0.25, 2), rel=1e-12)
    hbm, host = shard_memory(hand_task, plan_layout(plan, hand_task))
    # Each block keeps its own 4 B of optimizer state per row: 2*4+4 and 6*4+4 bytes a row.
    assert hbm.tolist() == [1000 * 12, 250 * 28]
    assert host.tolist() == [500 * 36, 750 * 28 + 500 * 36]


def test_table_row_wise_reduces_within_the_node(hand_task: ShardingTask) -> None:
    shards = (Shard(0, 0, 500, 0, 8, 500), Shard(1, 500, 1000, 0, 8, 500))
    twrw = _prices(hand_task, Plan((Placement.split("A", "table_row_wise", shards),
                                    Placement("B", 0, 0), Placement("C", 1, 0))))
    rw = _prices(hand_task, Plan((Placement.split("A", "row_wise", shards),
                                  Placement("B", 0, 0), Placement("C", 1, 0))))
    assert twrw[:2, :2] == pytest.approx(rw[:2, :2], rel=1e-12)
    # Half the partial sums go through the all-to-all, half over the intra-node link, each
    # pass (forward and backward): batch x 32 B.
    reduce_ms = 2 * HAND_BATCH * 32 * 0.5 / (HAND_INTRA_GBPS * 1e9) * 1e3
    assert twrw[:2, 2] == pytest.approx(rw[:2, 2] / 2 + reduce_ms, rel=1e-12)


def test_evaluator_reports_per_shard(hand_task: ShardingTask) -> None:
    plan = Plan((Placement.split("A", "row_wise", (A_ROWS_0_600, A_ROWS_600_1000)),
                 Placement.split("B", "column_wise", (Shard(0, 0, 500, 0, 4, 0),
                                                      Shard(1, 0, 500, 4, 8, 500))),
                 Placement("C", 1, 0)), "hand")
    report = evaluate(plan, hand_task, MODEL)
    prices = _prices(hand_task, plan).sum(axis=1)
    device = np.array([0, 1, 0, 1, 1])
    totals = np.bincount(device, weights=prices)
    assert [d.total_ms for d in report.per_device] == pytest.approx(totals.tolist(), rel=1e-12)
    assert report.step_cost_ms == pytest.approx(totals.max(), rel=1e-12)
    assert [d.tables for d in report.per_device] == [2, 3]
    # Lookups: A 2000 (1200 + 800), B 1000 counted once over its two blocks, C 1000.
    assert sum(d.lookups for d in report.per_device) == pytest.approx(4000)
    # From host memory: 300 of A's second shard's 400 rows -> 600 lookups; B's first block
    # (half the columns) -> 500; C -> 1000.
    assert report.uvm_lookup_share == pytest.approx((600 + 500 + 1000) / 4000)
    assert report.per_device[1].hbm_bytes == 100 * 36 + 500 * 20


def test_over_capacity_split_plan_is_rejected(hand_task: ShardingTask) -> None:
    plan = Plan((Placement.split("A", "column_wise", (Shard(0, 0, 1000, 0, 4, 1000),
                                                      Shard(1, 0, 1000, 4, 8, 1000))),
                 Placement("B", 0, 500), Placement("C", 1, 0)))
    with pytest.raises(PlannerError, match="device 0 HBM") as info:
        evaluate(plan, hand_task, MODEL)
    assert info.value.kind == "capacity"


def test_whole_tables_as_shards_price_exactly_as_tables(hand_task: ShardingTask) -> None:
    from autoshard.layout.shards import whole_tables

    g = whole_tables(hand_task)
    sub = shard_task(hand_task, g)
    idx, dev, rows = np.arange(3), np.array([0, 1, 1]), np.array([1000, 250, 0])
    ours = MODEL.price(sub, idx, dev, rows)
    ref = MODEL.price(hand_task, idx, dev, rows)
    assert ours.total_ms == pytest.approx(ref.total_ms, rel=1e-15)


def test_even_split_covers_the_table(hand_task: ShardingTask) -> None:
    g = even_split(hand_task, 0, ShardingKind.ROW_WISE, 3)
    assert g.row_start.tolist() == [0, 333, 666] and g.row_end.tolist() == [333, 666, 1000]
    assert g.cols.tolist() == [8, 8, 8]
    g = even_split(hand_task, 0, ShardingKind.COLUMN_WISE, 8)
    assert g.cols.tolist() == [1] * 8 and g.rows.tolist() == [1000] * 8
    with pytest.raises(ValueError, match="into 9"):
        even_split(hand_task, 0, ShardingKind.COLUMN_WISE, 9)


# The bound against every plan of small split cases -------------------------------------------

def _options(task: ShardingTask, t: int) -> list[tuple[str, tuple[tuple[int, int, int, int], ...]]]:
    """Shardings of table t on 2 devices: whole, two row shards (two cut points), two column
    blocks; each shard as (row_start, row_end, col_start, col_end)."""
    table = task.tables[t]
    rows, dim = table.rows, table.dim
    out: list[tuple[str, tuple[tuple[int, int, int, int], ...]]] = [
        ("table_wise", ((0, rows, 0, dim),))]
    for cut in sorted({rows // 2, max(rows // 4, 1)}):
        out.append(("row_wise", ((0, cut, 0, dim), (cut, rows, 0, dim))))
    out.append(("column_wise", ((0, rows, 0, dim // 2), (0, rows, dim // 2, dim))))
    return out


def _choices(task: ShardingTask) -> list[list[Placement]]:
    """Per table, every combination of sharding, devices and a few HBM row counts per shard."""
    per_table = []
    for t, table in enumerate(task.tables):
        choices = []
        for sharding, pieces in _options(task, t):
            devices = [(0,), (1,)] if len(pieces) == 1 else [(0, 1), (1, 0), (0, 0)]
            for devs in devices:
                hot = [sorted({0, (r1 - r0) // 3, (r1 - r0) // 2, r1 - r0})
                       for r0, r1, _, _ in pieces]
                for rows in itertools.product(*hot):
                    shards = tuple(Shard(d, *p[:2], *p[2:], k)
                                   for d, p, k in zip(devs, pieces, rows, strict=True))
                    if sharding == "table_wise":
                        choices.append(Placement(table.name, devs[0], rows[0]))
                    else:
                        choices.append(Placement.split(table.name, sharding, shards))
        per_table.append(choices)
    return per_table


def _choice_loads(task: ShardingTask, choices: list[list[Placement]]
                  ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per table, each choice's (load, HBM bytes, host bytes) per device ([C, D] each), priced
    through the evaluator's path (a shard's price does not depend on the other shards)."""
    out = []
    for t, options in enumerate(choices):
        rows = []
        for p in options:
            placements = tuple(p if i == t else Placement(x.name, 0, 0)
                               for i, x in enumerate(task.tables))
            full = plan_layout(Plan(placements), task)
            mine = np.flatnonzero(full.geometry.table == t)
            layout = ShardLayout(full.geometry.take(mine), full.device[mine], full.hbm_rows[mine])
            price = price_layout(task, MODEL, layout).total_ms
            rows.append((np.bincount(layout.device, weights=price, minlength=2),
                         *shard_memory(task, layout)))
        out.append(tuple(np.array([r[i] for r in rows]) for i in range(3)))
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("seed", range(12))
def test_bound_holds_for_every_small_split_plan(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    tables = []
    for i in range(2):
        rows = int(rng.integers(4, 40))
        extra = {}
        if rng.random() < 0.5:
            extra["access_cdf"] = AccessCurve((0.0, 0.1, 0.5, 1.0),
                                              (0.0, float(rng.uniform(0.2, 0.9)), 0.95, 1.0))
        tables.append(Table(f"t{i}", rows=rows, dim=int(rng.choice([2, 4, 8])),
                            pooling_factor=float(rng.uniform(0.5, 40)), **extra))  # type: ignore[arg-type]
    hbm = int(rng.integers(0, 20)) * 36
    profile = hand_profile(2, hbm_bytes=hbm)
    if seed >= 8:  # two kinds of device: different HBM capacity and bandwidth
        fast = Device(Tier(hbm // 2, 300.0), profile.devices[0].host)
        profile = replace(profile, devices=(profile.devices[0], fast))
    task = ShardingTask(tuple(tables), profile,
                        Workload(batch_size=int(rng.integers(1, 5000)),
                                 mode="train" if seed % 2 else "infer"))
    bound = lower_bound_ms(task, MODEL)
    choices = _choices(task)
    (l0, h0, s0), (l1, h1, s1) = _choice_loads(task, choices)
    load = l0[:, None, :] + l1[None, :, :]
    cap = task.device_arrays
    ok = ((h0[:, None, :] + h1[None, :, :] <= cap.hbm_capacity).all(axis=2)
          & (s0[:, None, :] + s1[None, :, :] <= cap.host_capacity).all(axis=2))
    step = load.max(axis=2)
    assert ok.sum() > 100
    i, j = np.unravel_index(np.argmin(np.where(ok, step, np.inf)), step.shape)
    best = evaluate(Plan((choices[0][i], choices[1][j])), task, MODEL).step_cost_ms
    assert best == pytest.approx(step[i, j], rel=1e-12)  # the shortcut agrees with evaluate
    assert bound <= best * (1 + 1e-9)
    assert bound > 0


def test_split_plans_beat_the_whole_table_floor() -> None:
    """One hot table on two devices: splitting it beats the dearest whole table's cost, which
    is therefore no bound once tables may be split, while the spread-work bound still holds."""
    hot = Table("hot", rows=1000, dim=256, pooling_factor=100.0)
    task = ShardingTask((hot, Table("cold", rows=10, dim=8)), hand_profile(2, hbm_bytes=10**6),
                        Workload(batch_size=4096))
    whole_floor = lower_bound_ms(task, MODEL, whole_tables=True)
    split = Plan((Placement.split("hot", "column_wise", (Shard(0, 0, 1000, 0, 128, 1000),
                                                         Shard(1, 0, 1000, 128, 256, 1000))),
                  Placement("cold", 1, 10)))
    cost = evaluate(split, task, MODEL).step_cost_ms
    assert cost < 0.7 * whole_floor
    assert lower_bound_ms(task, MODEL) <= cost


def test_learned_model_prices_split_plans(hand_task: ShardingTask) -> None:
    pytest.importorskip("lightgbm")
    from pathlib import Path

    import autoshard
    from autoshard.pricing.cost import load_cost_model

    learned = load_cost_model(str(Path(autoshard.__file__).parent / "data" / "cost_model"))
    whole = Plan((Placement("A", 0, 1000), Placement("B", 1, 500), Placement("C", 1, 250)))
    split = Plan((Placement.split("A", "column_wise", (Shard(0, 0, 1000, 0, 4, 1000),
                                                       Shard(1, 0, 1000, 4, 8, 0))),
                  Placement("B", 0, 0), Placement("C", 1, 250)))
    for plan in (whole, split):
        report = evaluate(plan, hand_task, learned)
        assert np.isfinite(report.step_cost_ms) and report.step_cost_ms > 0
    # Half of A's columns: the learned model prices the narrower block lower than the table.
    layout = plan_layout(split, hand_task)
    block = price_layout(hand_task, learned, layout).compute_ms[0]
    table = learned.price(hand_task, np.array([0]), np.array([0]), np.array([1000])).compute_ms[0]
    assert block < table


def test_model_suites() -> None:
    from autoshard.compare.suites import get_suite
    from autoshard.public_models import dcnv2_tables
    from autoshard.workloads import total_bytes

    tables = dcnv2_tables()
    assert len(tables) == 26 and sum(t.rows == 40_000_000 for t in tables) == 5
    assert max(t.pooling_factor for t in tables) == 100.0
    task = get_suite("dcnv2-16")[0].build()
    assert task.num_devices == 16 and task.num_tables == 26
    hbm = task.device_arrays.hbm_capacity.sum()
    assert hbm == pytest.approx(0.3 * total_bytes(tables), rel=1e-3)
    # The dominant table alone costs more than the spread-work bound: splitting pays.
    assert lower_bound_ms(task, MODEL) < 0.5 * lower_bound_ms(task, MODEL, whole_tables=True)
