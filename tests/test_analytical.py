"""The analytical cost model against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
from handcase import hand_profile, hand_tables, reference_price_ms

from autoshard.errors import InputError
from autoshard.hardware import Device, HardwareProfile, Tier
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.cost import CostModel, load_cost_model
from autoshard.tables import Table
from autoshard.task import ShardingTask, Workload


def price_one(task: ShardingTask, table: int, device: int, rows: float) -> tuple[float, ...]:
    p = AnalyticalCostModel().price(task, np.array([table]), np.array([device]),
                                    np.array([rows]))
    return float(p.hbm_ms[0]), float(p.uvm_ms[0]), float(p.comm_ms[0])


def test_table_a_all_in_hbm_by_hand(hand_task: ShardingTask) -> None:
    # L = 1000 x 2 = 2000 lookups. A row of 8 floats is narrow: read as 32 floats x 1.75, so
    # 224 B; 3 x 224 + 2 x 4 = 680 B a lookup; plus 2 x 1000 x 32 B of output and its gradient:
    # 1,424,000 B at 100 GB/s = 0.01424 ms, + 2 kernels x 5 us = 0.01 ms.
    # All-to-all: 2 x 1000 x 32 B, half of it leaves, at 50 GB/s: 0.00064 ms.
    hbm, uvm, comm = price_one(hand_task, 0, 0, 1000)
    assert hbm == pytest.approx(0.02424, rel=1e-12)
    assert uvm == 0.0
    assert comm == pytest.approx(0.00064, rel=1e-12)


def test_split_and_infer_match_reference(hand_task: ShardingTask) -> None:
    a = hand_tables()[0]
    # Uniform access: 250 of 1000 rows in HBM serve a quarter of the lookups.
    assert price_one(hand_task, 0, 1, 250) == pytest.approx(reference_price_ms(a, 0.25, 2))
    infer = hand_task.with_workload(Workload(batch_size=1000, mode="infer"))
    # Forward only: 2000 x 224 B + 1000 x 32 B output = 480,000 B -> 0.0048 ms + 5 us.
    hbm, uvm, comm = price_one(infer, 0, 0, 1000)
    assert hbm == pytest.approx(0.0098, rel=1e-12)
    assert uvm == 0.0
    assert comm == pytest.approx(0.00032, rel=1e-12)
    assert price_one(infer, 0, 0, 0) == pytest.approx(reference_price_ms(a, 0.0, 2, False))


def test_price_falls_as_rows_move_to_hbm(hand_task: ShardingTask) -> None:
    rows = np.arange(0, 1001, 100)
    p = AnalyticalCostModel().price(hand_task, np.zeros_like(rows), np.zeros_like(rows), rows)
    assert np.all(np.diff(p.total_ms) < 0)
    assert np.allclose(p.total_ms, p.hbm_ms + p.uvm_ms + p.comm_ms)
    assert np.allclose(p.compute_ms, p.hbm_ms + p.uvm_ms)


def test_communication_over_two_nodes() -> None:
    # 3 devices, 2 per node: device 0 has one peer in its node and one outside.
    d = Device(hbm=Tier(10**6, 100.0), host=Tier(10**9, 10.0))
    profile = HardwareProfile("two-nodes", (d, d, Device(d.hbm, d.host, node=1)),
                              intra_node_gbps=50.0, inter_node_gbps=10.0,
                              kernel_overhead_us=5.0, devices_per_node=2)
    task = ShardingTask(hand_tables(), profile, Workload(batch_size=1000))
    _, _, comm0 = price_one(task, 0, 0, 1000)
    _, _, comm2 = price_one(task, 0, 2, 1000)
    # 64,000 B x 2/3 leave; device 0: half at 50 GB/s, half at 10 GB/s.
    assert comm0 == pytest.approx(64_000 * 2 / 3 * (0.5 / 50e9 + 0.5 / 10e9) * 1e3)
    # Device 2 has no peer in its node: everything at 10 GB/s.
    assert comm2 == pytest.approx(64_000 * 2 / 3 / 10e9 * 1e3)


def test_single_device_has_no_communication() -> None:
    task = ShardingTask(hand_tables(), hand_profile(devices=1), Workload(batch_size=1000))
    assert price_one(task, 1, 0, 500)[2] == 0.0


def test_efficiency_scales_bandwidth(hand_task: ShardingTask) -> None:
    slow = AnalyticalCostModel(hbm_efficiency=0.5, host_efficiency=0.5)
    p = slow.price(hand_task, np.array([0]), np.array([0]), np.array([0]))
    ref = reference_price_ms(hand_tables()[0], 0.0, 2)
    assert float(p.uvm_ms[0]) == pytest.approx(2 * ref[1])
    assert float(p.hbm_ms[0]) == pytest.approx(2 * (ref[0] - 0.01) + 0.01)


def test_zipf_table_serves_more_from_few_hot_rows() -> None:
    skewed = Table("z", rows=10**6, dim=8, zipf_alpha=1.1)
    task = ShardingTask((skewed, Table("u", rows=10**6, dim=8)), hand_profile(),
                        Workload(batch_size=1000))
    share = task.hbm_share(np.array([0, 1]), np.array([10**4, 10**4]))
    assert share[1] == pytest.approx(0.01, rel=1e-6)  # uniform: 1% of rows, 1% of lookups
    assert share[0] > 0.5  # Zipf(1.1): the hottest 1% of rows serve most lookups


def test_load_cost_model() -> None:
    model = load_cost_model("analytical")
    assert isinstance(model, CostModel) and model.name == "analytical"
    assert isinstance(load_cost_model(None), AnalyticalCostModel)
    with pytest.raises(InputError, match="cost_model"):
        load_cost_model("no-such-model-dir")


def test_narrow_rows_are_read_a_block_at_a_time() -> None:
    from autoshard.pricing.analytical import narrow_row_factor
    # At least 32 elements read, x1.75 below 64 elements, x1.15 below 128, exact from 128 up.
    assert narrow_row_factor(np.array([8, 16, 32, 48, 64, 100, 128, 256])) == pytest.approx(
        [7.0, 3.5, 1.75, 1.75, 1.15, 1.15, 1.0, 1.0])
    # So cutting a 128-wide table into 8 column blocks of 16 does 3.5x its lookup work.
    hw = hand_profile(devices=8, hbm_bytes=10**9)
    task = ShardingTask((Table("w", rows=1000, dim=128, pooling_factor=50.0),
                         Table("n", rows=1000, dim=16, pooling_factor=50.0)), hw,
                        Workload(batch_size=1000, mode="infer"))
    p = AnalyticalCostModel().price(task, np.array([0, 1]), np.array([0, 0]),
                                    np.array([1000, 1000]))
    per_lookup = (p.hbm_ms - 0.005) / 1e3 * 100e9 - 1000 * np.array([512, 64])
    assert per_lookup / 50_000 == pytest.approx([512, 64 * 3.5])
