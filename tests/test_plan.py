"""Plans: round trips, validation and memory accounting."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoshard.errors import InputError, PlannerError
from autoshard.plan import Placement, Plan, check_plan, memory_use
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
    ({"schema_version": 3, "placements": []}, ["'schema_version'", "3"]),
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
