"""The move arithmetic, on cases counted by hand: which bytes of each table (weights and optimizer
state) cross which link, which rows are copied between host memory and HBM, how long the move
takes at the profile's bandwidths, and the plan diff that reports it."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.hardware import GB, Device, HardwareProfile, Tier
from autoshard.layout.kinds import ShardingKind
from autoshard.layout.plan import Placement, Plan, Shard
from autoshard.layout.shards import plan_layout
from autoshard.pricing.cost import load_cost_model
from autoshard.replan.budget import MoveBudget
from autoshard.replan.carry import carry
from autoshard.replan.diff import diff_plans
from autoshard.replan.moves import Incumbent, ItemMoves, Link, move_time
from autoshard.tables import Table
from autoshard.task import ShardingTask, Workload

COLUMNS = ShardingKind.COLUMN_WISE
ROWS = ShardingKind.ROW_WISE


def hardware(devices: int = 4) -> HardwareProfile:
    """Two devices a node: intra-node links 100 GB/s, inter-node 10 GB/s, host buses 20 GB/s
    (round numbers, so that the times are counted by hand)."""
    device = Device(Tier(10 * 10**9, 1000.0), Tier(100 * 10**9, 20.0))
    return HardwareProfile("hand", tuple(Device(device.hbm, device.host, i // 2)
                                         for i in range(devices)), 100.0, 10.0, 5.0, 2)


# a: 1000 rows x 16 fp32 = 64 B of weights + 4 B of optimizer state a row (68 B);
# b: 2000 x 32, cut into two 16-column blocks (each 64 + 4 = 68 B a row);
# c: 500 x 8 (32 + 4 = 36 B a row).
TABLES = (Table("a", 1000, 16), Table("b", 2000, 32), Table("c", 500, 8))
OLD = Plan((Placement("a", 0, 100),
            Placement.split("b", COLUMNS, (Shard(1, 0, 2000, 0, 16, 0),
                                           Shard(2, 0, 2000, 16, 32, 0))),
            Placement("c", 3, 500)))
# a moves 0 -> 1 (same node); b's first block 1 -> 3 (another node), its second stays on 2 and
# takes all its 2,000 rows into HBM; c stays on 3 and keeps 300 of its 500 rows in HBM.
NEW = Plan((Placement("a", 1, 200),
            Placement.split("b", COLUMNS, (Shard(3, 0, 2000, 0, 16, 0),
                                           Shard(2, 0, 2000, 16, 32, 2000))),
            Placement("c", 3, 300)))


def task(tables: tuple[Table, ...] = TABLES, devices: int = 4) -> ShardingTask:
    return ShardingTask(tables, hardware(devices), Workload(1024))


def arithmetic(old: Plan, new: Plan, t: ShardingTask) -> tuple[ItemMoves, np.ndarray,
                                                                np.ndarray]:
    """The arithmetic of ``new``'s items against ``old``, made on the 4-device hardware."""
    layout = plan_layout(new, t)
    moves = ItemMoves.of(Incumbent.of(old, t, hardware()), t, layout.geometry)
    return moves, layout.device, layout.hbm_rows


def test_bytes_per_item_and_link_counted_by_hand() -> None:
    moves, device, rows = arithmetic(OLD, NEW, task())
    # items: a, b's two blocks, c
    assert moves.memory.tolist() == [68_000, 136_000, 136_000, 18_000]
    np.testing.assert_allclose(moves.copied(device, rows), [68_000, 136_000, 136_000, 7_200])
    np.testing.assert_allclose(moves.host_bytes(device, rows), [0, 0, 136_000, 7_200])
    links = moves.transfers(device, rows).by_link()
    assert links[Link.INTRA_NODE] == (68_000, 64_000)  # a: 1000 x 64 B weights, 1000 x 4 B
    assert links[Link.INTER_NODE] == (136_000, 128_000)  # b's first block
    assert links[Link.HOST_HBM] == pytest.approx((143_200, 128_000 + 6_400))


def test_move_time_is_the_slowest_device_counted_by_hand() -> None:
    moves, device, rows = arithmetic(OLD, NEW, task())
    time = move_time(moves.transfers(device, rows), task().hardware, 4)
    # device 0 sends a over NVLink-like 100 GB/s; device 1 receives it, and sends b's block
    # over the 10 GB/s inter-node link: 136,000 / 10e9 s; device 2 copies 136,000 B over its
    # 20 GB/s bus; device 3 receives b's block (as long as device 1 sends it) and copies c's
    # 200 rows x 36 B over its bus.
    assert time.device_seconds == pytest.approx((68_000 / 100e9, 136_000 / 10e9,
                                                 136_000 / 20e9, 136_000 / 10e9))
    assert time.seconds == pytest.approx(136_000 / 10e9)
    assert time.slowest == 1


def test_a_changed_split_sends_only_what_is_elsewhere() -> None:
    old = Plan((Placement.split("a", ROWS, (Shard(0, 0, 500, 0, 16, 250),
                                            Shard(1, 500, 1000, 0, 16, 0))),))
    new = Plan((Placement("a", 0, 600),))
    moves, device, rows = arithmetic(old, new, task(TABLES[:1]))
    # half of a is on 0 already (half of it in HBM); the other half comes from 1; of the half
    # that stays, the share in HBM goes from 0.5 to 0.6: 0.5 x (0.6 - 0.5) x 68,000 B
    assert moves.kept[0].tolist() == [0.5, 0.5, 0.0, 0.0]  # half on 0, half on 1
    assert moves.network()[0, 0] == pytest.approx(34_000)
    assert moves.host_bytes(device, rows)[0] == pytest.approx(3_400)
    transfers = moves.transfers(device, rows)
    found = sorted(zip(transfers.source.tolist(), transfers.target.tolist(),
                       transfers.bytes.tolist(), strict=True))
    assert found == [(0, 0, pytest.approx(3_400)), (1, 0, pytest.approx(34_000))]


def test_created_tables_copy_nothing_and_drained_devices_send() -> None:
    grown = (Table("a", 1000, 16), Table("b", 4000, 32), Table("c", 500, 8), Table("d", 10, 4))
    new = Plan((Placement("a", 1, 0), Placement("b", 0, 0), Placement("c", 2, 0),
                Placement("d", 0, 0)))
    t = task(grown, devices=3)
    moves, device, rows = arithmetic(OLD, new, t)
    # b was re-sized (4,000 rows now) and d is new: created where they go, nothing copied;
    # c leaves the drained device 3 for 2 (the same node in the new hardware's numbering,
    # node 1 in the old one's).
    assert moves.created.tolist() == [False, True, False, True]
    np.testing.assert_allclose(moves.copied(device, rows), [68_000, 0, 18_000, 0])
    transfers = moves.transfers(device, rows)
    assert (3, 2) in set(zip(transfers.source.tolist(), transfers.target.tolist(), strict=True))


def test_replicas_send_from_the_nearest_copy() -> None:
    old = Plan((Placement.split("c", ShardingKind.DATA_PARALLEL, tuple(
        Shard(d, 0, 500, 0, 8, 500) for d in range(2))),))
    new = Plan((Placement("c", 3, 500),))
    t = task(TABLES[2:])
    moves, device, rows = arithmetic(old, new, t)
    transfers = moves.transfers(device, rows)
    # no replica on device 3's node: one copy of the table from the first replica
    assert transfers.source.tolist() == [0] and transfers.bytes.tolist() == [18_000]
    assert moves.seconds_to()[0].tolist() == pytest.approx([0, 0, 18_000 / 10e9,
                                                            18_000 / 10e9])


def test_diff_lists_each_change_and_prices_it() -> None:
    model = load_cost_model("analytical")
    found = diff_plans(OLD, NEW, task(), model)
    by_table = {t.table: t for t in found.tables}
    assert {k: v.change for k, v in by_table.items()} == {"a": "moved", "b": "moved",
                                                          "c": "hbm"}
    assert by_table["b"].network_bytes == 136_000 and by_table["b"].host_bytes == 136_000
    report = found.report
    assert report.copied_bytes == pytest.approx(68_000 + 136_000 + 136_000 + 7_200)
    assert report.seconds == pytest.approx(136_000 / 10e9)
    assert (report.tables_moved, report.tables_changed) == (2, 3)
    # the tables' bytes: b whole keeps one 4 B optimizer row (2,000 x 132 B), its blocks one each
    assert report.copied_share == pytest.approx(347_200 / (68_000 + 264_000 + 18_000))


def test_a_zero_budget_carries_the_plan_in_use() -> None:
    moves = carry(OLD, task(), load_cost_model("analytical"), MoveBudget(max_bytes=0))
    assert moves.limit_bytes == 0 and moves.forced_bytes == 0
    assert moves.carried.to_plan(task()).placements == OLD.placements
    assert moves.copied(plan_layout(NEW, task())) == pytest.approx(347_200)
    assert not moves.allows(plan_layout(NEW, task()))


def test_budget_text() -> None:
    assert MoveBudget.parse("10%").max_share == pytest.approx(0.1)
    assert MoveBudget.parse("2.5GB").max_bytes == pytest.approx(2.5 * GB)
    assert MoveBudget.parse("30s").max_seconds == 30
    assert not MoveBudget.parse("none").limited
    for bad in ("ten", "-1GB", "150%", "3h"):
        with pytest.raises(ValueError, match="--move-budget"):
            MoveBudget.parse(bad)
    # 30 s at the slowest link (10 GB/s inter-node) is 300 GB
    assert MoveBudget(max_seconds=30).limit_bytes(1e15, 10.0) == pytest.approx(300e9)
