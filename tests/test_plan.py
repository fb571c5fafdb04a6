"""Plans: round trips, validation and memory accounting."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoshard.errors import InputError, PlannerError
from autoshard.layout.plan import Placement, Plan, Shard, check_placement, check_plan, memory_use
from autoshard.task import ShardingTask, Workload

GOOD = (Placement("A", 0, 1000), Placement("B", 1, 500), Placement("C", 1, 250))


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_plan_round_trip(tmp_path: Path, suffix: str) -> None:
    plan = Plan(GOOD, "size_greedy", Workload(512, "infer"), "hand")
    path = tmp_path / f"plan{suffix}"
    plan.save(path)
    assert Plan.load(path) == plan
    assert not list(tmp_path.glob(".*tmp"))  # nothing left from the atomic write


def test_from_arrays_and_back(hand_task: ShardingTask) -> None:
    plan = Plan.from_arrays(hand_task, np.array([0, 1, 1]), np.array([1000, 500, 250]), "x")
    assert plan.placements == GOOD
    assert plan.workload == hand_task.workload and plan.hardware == "hand"
    device, hbm = plan.arrays(hand_task)
    assert list(device) == [0, 1, 1] and list(hbm) == [1000, 500, 250]


def test_memory_use_counts_optimizer_state(hand_task: ShardingTask) -> None:
    hbm, host = memory_use(hand_task, np.array([0, 1, 1]), np.array([1000, 500, 250]))
    # 36 B per row in train mode (32 B weights + 4 B optimizer state).
    assert list(hbm) == [36_000, 750 * 36]
    assert list(host) == [0, 250 * 36]
    infer = hand_task.with_workload(Workload(1000, "infer"))
    hbm, _ = memory_use(infer, np.array([0, 1, 1]), np.array([1000, 500, 250]))
    assert list(hbm) == [32_000, 750 * 32]


@pytest.mark.parametrize(("placements", "kind", "pieces"), [
    (GOOD[:2], "invalid_plan", ["unplaced", "'C'"]),
    ((*GOOD, Placement("C", 0, 0)), "invalid_plan", ["'C'", "twice"]),
    ((*GOOD, Placement("Z", 0, 0)), "invalid_plan", ["unknown", "'Z'"]),
    ((GOOD[0], GOOD[1], Placement("C", 2, 0)), "invalid_plan", ["'C'", "device 2 of 2"]),
    ((GOOD[0], GOOD[1], Placement("C", 1, 501)), "invalid_plan", ["hbm_rows 501 of 500"]),
    ((GOOD[0], GOOD[1], Placement("C", -1, 0)), "invalid_plan", ["'C'", "device -1"]),
    ((Placement("A", 1, 1000), GOOD[1], GOOD[2]), "capacity", ["device 1 HBM", "GiB", "A"]),
])
def test_invalid_plans(hand_task: ShardingTask, placements: tuple[Placement, ...], kind: str,
                       pieces: list[str]) -> None:
    with pytest.raises(PlannerError) as info:
        check_plan(Plan(placements), hand_task)
    assert info.value.kind == kind
    for piece in pieces:
        assert piece in str(info.value)


def test_host_capacity_is_checked(hand_task: ShardingTask) -> None:
    from dataclasses import replace

    from handcase import hand_profile

    tight = replace(hand_task, hardware=hand_profile(host_bytes=100))
    with pytest.raises(PlannerError, match="device 0 host"):
        check_plan(Plan((Placement("A", 0, 0), GOOD[1], Placement("C", 1, 500))), tight)


@pytest.mark.parametrize(("doc", "pieces"), [
    ({"schema_version": 4, "placements": []}, ["'schema_version'", "4"]),
    ({"placements": "x"}, ["'placements'"]),
    ({"placements": [{"table": "A", "device": 0}]}, ["'placements[0].hbm_rows'", "missing"]),
    ({"placements": [{"table": "A", "device": -1, "hbm_rows": 0}]},
     ["'placements[0].device'", "-1"]),
    ({"placements": [{"table": "A", "device": 0, "hbm_rows": 1.5}]},
     ["'placements[0].hbm_rows'", "1.5"]),
    ({"placements": [], "workload": {"batch_size": 0}}, ["'workload.batch_size'", "0"]),
    ({"placements": [], "workload": {"mode": "serve"}}, ["'workload.mode'", "'serve'"]),
    ({"placements": [], "workload": {"speed": 1}}, ["'workload'"]),
    ({"placements": [], "kind": "tables"}, ["'kind'", "'tables'"]),
])
def test_bad_plan_files(tmp_path: Path, doc: dict[str, object], pieces: list[str]) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as info:
        Plan.load(path)
    for piece in [str(path), *pieces]:
        assert piece in str(info.value)


# Split tables ---------------------------------------------------------------------------------

ROW_SPLIT = Placement.split("A", "row_wise", (Shard(0, 0, 600, 0, 8, 600),
                                              Shard(1, 600, 1000, 0, 8, 100)))
COL_SPLIT = Placement.split("B", "column_wise", (Shard(0, 0, 500, 0, 4, 500),
                                                 Shard(1, 0, 500, 4, 8, 0)))
SPLIT = (ROW_SPLIT, COL_SPLIT, Placement("C", 1, 250))


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_split_plan_round_trip(tmp_path: Path, suffix: str) -> None:
    plan = Plan(SPLIT, "hand", Workload(1000, "train"), "hand")
    path = tmp_path / f"plan{suffix}"
    plan.save(path)
    assert Plan.load(path) == plan
    doc = json.loads(path.read_text()) if suffix == ".json" else None
    if doc is not None:
        assert doc["schema_version"] == 2
        assert doc["placements"][0] == {"table": "A", "sharding": "row_wise", "shards": [
            {"device": 0, "rows": [0, 600], "cols": [0, 8], "hbm_rows": 600},
            {"device": 1, "rows": [600, 1000], "cols": [0, 8], "hbm_rows": 100}]}
        assert doc["placements"][2] == {"table": "C", "device": 1, "hbm_rows": 250}
    assert ROW_SPLIT.device == 0 and ROW_SPLIT.hbm_rows == 700 and plan.is_split


def test_version_1_plans_still_load(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema_version": 1, "kind": "plan", "sharder": "x",
                                "placements": [{"table": "A", "device": 0, "hbm_rows": 1000},
                                               {"table": "B", "device": 1, "hbm_rows": 500}]}))
    plan = Plan.load(path)
    assert plan.placements == GOOD[:2] and not plan.is_split


def test_split_plan_layout(hand_task: ShardingTask) -> None:
    from autoshard.layout.shards import plan_layout

    plan = Plan(SPLIT)
    layout = plan_layout(plan, hand_task)
    g = layout.geometry
    assert g.table.tolist() == [0, 0, 1, 1, 2]
    assert g.rows.tolist() == [600, 400, 500, 500, 500]
    assert g.cols.tolist() == [8, 8, 4, 4, 8]
    assert layout.device.tolist() == [0, 1, 0, 1, 1]
    assert layout.to_plan(hand_task).placements == SPLIT
    with pytest.raises(PlannerError, match="'A' is split"):
        plan.arrays(hand_task)


def _shard(device: int = 0, rows: object = (0, 500), cols: object = (0, 8),
           hbm_rows: object = 0) -> dict[str, object]:
    return {"device": device, "rows": list(rows) if isinstance(rows, tuple) else rows,
            "cols": list(cols) if isinstance(cols, tuple) else cols, "hbm_rows": hbm_rows}


@pytest.mark.parametrize(("entry", "field", "value"), [
    ({"sharding": "diagonal", "shards": [_shard()]}, "placements[0].sharding", "'diagonal'"),
    ({"sharding": "row_wise", "shards": []}, "placements[0].shards", "[]"),
    ({"sharding": "column_wise", "shards": [_shard(cols=(0, 0)), _shard(cols=(0, 8))]},
     "placements[0].shards[0].cols", "[0, 0]"),
    ({"sharding": "column_wise", "shards": [_shard(cols=(0, 4)), _shard(cols=(3, 8))]},
     "placements[0].shards[1].cols", "[3, 8]"),
    ({"sharding": "row_wise", "shards": [_shard(rows=(0, 200)), _shard(rows=(300, 500))]},
     "placements[0].shards[1].rows", "[300, 500]"),
    ({"sharding": "row_wise", "shards": [_shard(rows=(0, 200), hbm_rows=201),
                                         _shard(rows=(200, 500))]},
     "placements[0].shards[0].hbm_rows", "201"),
    ({"sharding": "row_wise", "shards": [_shard(rows=(0, 200)),
                                         _shard(rows=(200, 500), cols=(0, 4))]},
     "placements[0].shards[1].cols", "[0, 4]"),
    ({"sharding": "row_wise", "shards": [_shard(rows=[0])]}, "placements[0].shards[0].rows",
     "[0]"),
    ({"sharding": "row_wise", "shards": [{"device": 0, "rows": [0, 5]}]},
     "placements[0].shards[0].cols", None),
    ({"sharding": "row_wise", "shards": [_shard(device=-1)]}, "placements[0].shards[0].device",
     "-1"),
])
def test_bad_split_entries(tmp_path: Path, entry: dict[str, object], field: str,
                           value: str | None) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"schema_version": 2, "placements": [{"table": "B", **entry}]}))
    with pytest.raises(InputError) as info:
        Plan.load(path)
    assert info.value.field == field
    assert str(path) in str(info.value)
    if value is not None:
        assert value in str(info.value)


@pytest.mark.parametrize(("placement", "field", "value"), [
    # 1001 one-row shards of a 1000-row table: the last one runs past the table.
    (Placement.split("A", "row_wise", tuple(Shard(i % 2, i, i + 1, 0, 8, 0)
                                            for i in range(1001))),
     "placements[0].shards[1000].rows", 1001),
    (Placement.split("A", "row_wise", (Shard(0, 0, 500, 0, 8, 0),)),
     "placements[0].shards[0].rows", 500),
    (Placement.split("A", "column_wise", (Shard(0, 0, 1000, 0, 4, 0),
                                          Shard(1, 0, 1000, 4, 9, 0))),
     "placements[0].shards[1].cols", 9),
    (Placement.split("A", "column_wise", (Shard(0, 0, 999, 0, 8, 0),)),
     "placements[0].shards[0].rows", [0, 999]),
    (Placement("A", 0, 1001), "placements[0].hbm_rows", 1001),
    (Placement.split("A", "row_wise", (Shard(0, 0, 500, 0, 8, 0), Shard(2, 500, 1000, 0, 8, 0))),
     "placements[0].shards[1].device", 2),
    (Placement("A", 5, 0), "placements[0].device", 5),
])
def test_splits_checked_against_the_task(hand_task: ShardingTask, placement: Placement,
                                         field: str, value: object) -> None:
    from autoshard.layout.shards import plan_layout

    plan = Plan((placement, GOOD[1], GOOD[2]))
    with pytest.raises(InputError) as info:
        plan_layout(plan, hand_task, "p.json")
    assert info.value.field == field and info.value.value == value
    assert "p.json" in str(info.value)


def test_table_row_wise_stays_on_one_node() -> None:
    from dataclasses import replace

    from handcase import hand_profile, hand_tables

    from autoshard.layout.shards import plan_layout

    hw = replace(hand_profile(devices=4), devices_per_node=2).with_devices(4)
    task = ShardingTask(hand_tables(), hw, Workload(1000))
    ok = Placement.split("A", "table_row_wise", (Shard(2, 0, 500, 0, 8, 0),
                                                 Shard(3, 500, 1000, 0, 8, 0)))
    assert plan_layout(Plan((ok, GOOD[1], GOOD[2])), task).device.tolist() == [2, 3, 1, 1]
    bad = Placement.split("A", "table_row_wise", (Shard(1, 0, 500, 0, 8, 0),
                                                  Shard(2, 500, 1000, 0, 8, 0)))
    with pytest.raises(InputError) as info:
        plan_layout(Plan((bad, GOOD[1], GOOD[2])), task)
    assert info.value.field == "placements[0].shards" and info.value.value == [0, 1]


def test_a_shard_past_the_table_is_the_one_blamed() -> None:
    """A column block past the table's dim names that block, not the next one."""
    p = Placement.split("A", "column_wise", (Shard(0, 0, 1000, 0, 129, 0),
                                             Shard(1, 0, 1000, 129, 256, 0)))
    with pytest.raises(InputError) as info:
        check_placement(p, "placements[0]", "plan.json", rows=1000, dim=128)
    assert info.value.field == "placements[0].shards[0].cols"
    assert info.value.value == 129 and "128" in str(info.value)
