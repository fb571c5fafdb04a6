"""Table-row-wise splits: priced apart from row-wise, offered by recshard on several nodes, kept
on one node, above the bound and accepted by the TorchRec export."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from clocks import fake_perf_counter

from autoshard.cli import main
from autoshard.layout.kinds import ShardingKind
from autoshard.layout.shards import check_layout, even_split, shard_task, split_pins
from autoshard.layout.splitting import candidate_splits, split_heavy_tables
from autoshard.policy.buckets import MULTIPLIERS
from autoshard.policy.episode import PlacementEpisode, PricedTask
from autoshard.policy.features import ObsLayout
from autoshard.policy.geometries import split_geometries
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.bounds import lower_bound_ms
from autoshard.pricing.evaluator import evaluate
from autoshard.reservation import NO_RESERVATION
from autoshard.sharders import get_sharder
from autoshard.sharders.base import Sharded
from autoshard.sharders.recshard import RecShard
from autoshard.tables import Table, save_tables
from autoshard.task import ShardingTask
from autoshard.torchrec import torchrec_unavailable
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()


def _two_nodes(inter_gbps: float = 12.5) -> ShardingTask:
    """2 nodes x 8 devices with a slow inter-node link, and one dominant table whose dim (36)
    allows column blocks of 2 and 4 only."""
    tables = (*dlrm_tables(6, seed=3),
              Table("huge", rows=40_000_000, dim=36, pooling_factor=100.0, zipf_alpha=1.05))
    task = constrained_task(tables, 16, hbm_fraction=0.5, hardware="16xH100-80GB",
                            reservation="torchrec")
    return replace(task, hardware=replace(task.hardware, inter_node_gbps=inter_gbps))


@cache
def _planned(name: str, node_splits: bool = True) -> Sharded:
    """``name``'s run on :func:`_two_nodes` (recshard with a 10 s limit, or without node-local
    splits), made once for this module's tests, its limit kept on a fake clock (0.2 s a
    reading) so that what it cuts is the same on every machine."""
    sharder = (RecShard(time_limit=10, node_splits=node_splits) if name == "recshard"
               else get_sharder(name))
    with pytest.MonkeyPatch.context() as patch:
        fake_perf_counter(patch, 0.2)
        return sharder.solve(_two_nodes(), MODEL)


def test_table_row_wise_comm_is_an_intra_node_reduce_and_a_share_of_the_all_to_all() -> None:
    task = _two_nodes()
    huge = task.num_tables - 1
    hw = task.hardware
    passes, batch = 2.0, task.workload.batch_size
    r = task.table_arrays.row_bytes[huge]
    leaving = (task.num_devices - 1) / task.num_devices
    a2a = leaving * (7 / 15 / hw.intra_node_gbps + 8 / 15 / hw.inter_node_gbps) / 1e9
    for k in (2, 8):
        comm = {}
        for kind in (ShardingKind.ROW_WISE, ShardingKind.TABLE_ROW_WISE):
            g = even_split(task, huge, kind, k)
            p = MODEL.price(shard_task(task, g), np.arange(k), np.zeros(k, dtype=np.int64),
                            np.zeros(k))
            comm[kind] = p.comm_ms
        # Row-wise: every shard's full partial sums through the all-to-all.
        assert comm[ShardingKind.ROW_WISE] == pytest.approx(passes * batch * r * a2a * 1e3)
        # Table-row-wise: (k-1)/k of them reduced over intra-node links, 1/k all-to-all.
        want = passes * batch * r * (a2a / k + (k - 1) / k / (hw.intra_node_gbps * 1e9)) * 1e3
        assert comm[ShardingKind.TABLE_ROW_WISE] == pytest.approx(want)
        assert (comm[ShardingKind.TABLE_ROW_WISE] < comm[ShardingKind.ROW_WISE]).all()


def test_candidates_include_table_row_wise_only_on_several_nodes_for_node_aware_sharders(
        ) -> None:
    task = _two_nodes()
    huge = task.num_tables - 1
    kinds = [(int(g.kind[0]), int(g.parts[0])) for g in candidate_splits(task, huge, 16, True)]
    twrw = sorted(k for kind, k in kinds if kind == ShardingKind.TABLE_ROW_WISE.code)
    # Planned for TorchRec: the row splits its runtime routes, over every device of the world
    # (row-wise) or of a node (table-row-wise); for our own runner, 2..devices.
    assert twrw == [8]
    assert sorted(k for kind, k in kinds if kind == ShardingKind.ROW_WISE.code) == [16]
    ours = task.with_reservation(NO_RESERVATION)
    kinds = [(int(g.kind[0]), int(g.parts[0])) for g in candidate_splits(ours, huge, 16, True)]
    twrw_code, rw_code = ShardingKind.TABLE_ROW_WISE.code, ShardingKind.ROW_WISE.code
    assert sorted(k for kind, k in kinds if kind == twrw_code) == list(range(2, 9))
    assert sorted(k for kind, k in kinds if kind == rw_code) == list(range(2, 17))
    assert twrw_code not in {int(g.kind[0]) for g in candidate_splits(task, huge, 16)}
    one_node = constrained_task(task.tables, 8, hbm_fraction=0.5, reservation="torchrec")
    assert twrw_code not in {int(g.kind[0]) for g in candidate_splits(one_node, huge, 8, True)}


def test_pins_put_each_row_split_table_on_every_device_of_its_node_or_world() -> None:
    task = _two_nodes()
    g = split_heavy_tables(task, MODEL, node_local=True).geometry
    pins = split_pins(task, g)
    assert pins is not None
    twrw = g.kind == ShardingKind.TABLE_ROW_WISE.code
    rw = g.kind == ShardingKind.ROW_WISE.code
    assert twrw.any()
    for t in np.unique(g.table[twrw]):
        on = pins[g.table == t]
        assert sorted(on.tolist()) == list(range(on[0] // 8 * 8, on[0] // 8 * 8 + 8))
    for t in np.unique(g.table[rw]):
        assert sorted(pins[g.table == t].tolist()) == list(range(16))
    assert (pins[~(twrw | rw)] == -1).all()


@pytest.mark.slow
def test_recshard_splits_the_dominant_table_within_a_node_where_that_is_cheaper(
        tmp_path: Path) -> None:
    task = _two_nodes()
    with_twrw = _planned("recshard").details
    without = _planned("recshard", node_splits=False).details
    huge = next(p for p in with_twrw.plan.placements if p.table == "huge")
    assert huge.sharding == ShardingKind.TABLE_ROW_WISE
    devices = [s.device for s in huge.shards]
    assert len(set(devices)) == len(devices) and len({d // 8 for d in devices}) == 1
    assert all(p.sharding != ShardingKind.TABLE_ROW_WISE for p in without.plan.placements)
    report = evaluate(with_twrw.plan, task, MODEL)
    assert report.step_cost_ms == pytest.approx(with_twrw.step_cost_ms)
    assert report.step_cost_ms < evaluate(without.plan, task, MODEL).step_cost_ms
    assert report.step_cost_ms >= lower_bound_ms(task, MODEL) * (1 - 1e-9)
    if torchrec_unavailable(load=True) is None:  # TorchRec's own check of the export
        tables, plan, out = tmp_path / "t.json", tmp_path / "p.json", tmp_path / "tr.json"
        save_tables(tables, task.tables)
        with_twrw.plan.save(plan)
        hw = tmp_path / "hw.yaml"
        from autoshard.hardware import save_hardware

        save_hardware(hw, task.hardware)
        main(["export", str(plan), "-t", str(tables), "--hardware", str(hw), "-o", str(out),
              "--check", "--no-fit"])
        assert out.is_file()


@pytest.mark.slow
def test_ppo_places_table_row_wise_shards_on_one_node_one_per_device() -> None:
    task = _two_nodes()
    geometries = split_geometries(task, MODEL)
    node = [g for name, g in geometries.items() if name.startswith("ppo-node")]
    assert node and any((g.kind == ShardingKind.TABLE_ROW_WISE.code).any() for g in node)
    # The episode's mask: once a shard of such a table is placed, only the devices of its node
    # holding none of the table's shards are offered to the next.
    g = next(g for g in node if (g.kind == ShardingKind.TABLE_ROW_WISE.code).any())
    shards = shard_task(task, g)
    layout = ObsLayout(task.num_devices, len(MULTIPLIERS) + 1)
    episode = PlacementEpisode(PricedTask.prepare(shards, MODEL, layout), layout)
    dev = task.device_arrays.node
    while not episode.done:
        t = episode.order[episode.step_index]
        if g.kind[t] == ShardingKind.TABLE_ROW_WISE.code:
            placed = episode.state.device[(g.table == g.table[t]) & (episode.state.device >= 0)]
            offered = episode.mask.reshape(-1, episode.buckets)[:task.num_devices].any(axis=1)
            if placed.size:
                assert not offered[placed].any()
                assert (dev[offered] == dev[placed[0]]).all()
        episode.step(int(np.flatnonzero(episode.mask)[0]))
    # The sharder's plan, whichever candidate wins, is valid and keeps such tables on a node.
    plan = _planned("ppo").plan
    check_layout(plan, task)
    for p in plan.placements:
        if p.sharding == ShardingKind.TABLE_ROW_WISE:
            devices = [s.device for s in p.shards]
            assert len(set(dev[devices].tolist())) == 1
    assert evaluate(plan, task, MODEL).step_cost_ms >= lower_bound_ms(task, MODEL) * (1 - 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["recshard", "split_lookup_greedy", "ppo"])
def test_row_splits_planned_for_torchrec_are_one_shard_per_device_and_export(name: str) -> None:
    # TorchRec routes a row-wise table's ids in even blocks over every rank (table-row-wise:
    # every rank of one node), so each such table must hold one shard on each of them.
    from autoshard.torchrec.shardings import table_shardings

    task = _two_nodes()
    plan = _planned(name).plan
    split = [p for p in plan.placements if p.sharding.splits_rows]
    assert split, f"{name} splits no table by rows"
    for p in split:
        devices = sorted(s.device for s in p.shards)
        if p.sharding == ShardingKind.ROW_WISE:
            assert devices == list(range(task.num_devices))
            continue
        # table_row_wise: one node's 8 devices; a grid: each column block's on one node
        blocks = ({(s.col_start, s.col_end) for s in p.shards}
                  if p.sharding == ShardingKind.GRID_SHARD else {None})
        for block in blocks:
            mine = sorted(s.device for s in p.shards
                          if block is None or (s.col_start, s.col_end) == block)
            first = mine[0] // 8 * 8
            assert mine == list(range(first, first + 8))
    exported = {s.table: s for s in table_shardings(plan, task)}
    assert all(sorted(exported[p.table].ranks) == sorted(s.device for s in p.shards)
               for p in split)
