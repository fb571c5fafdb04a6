"""A re-plan applied to a live TorchRec model: the delta of the moved tables, what TorchRec's
reshard cannot move refused before anything starts, re-plans under the ``torchrec`` move rules
that it can apply, and a DistributedModelParallel model on 2 gloo ranks re-sharded in place
(outputs equal before and after, optimizer state carried, training on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli

import autoshard
from autoshard.errors import PlannerError
from autoshard.hardware import load_hardware
from autoshard.layout.kinds import ShardingKind
from autoshard.layout.plan import Placement, Plan, Shard
from autoshard.layout.plan_context import PlanContext
from autoshard.replan.budget import MoveBudget, get_move_rules
from autoshard.tables import Table, save_tables
from autoshard.task import ShardingTask, Workload
from autoshard.torchrec import torchrec_unavailable
from autoshard.torchrec.reshard import TORCHREC_MOVES, plan_delta

COLUMNS = ShardingKind.COLUMN_WISE
#: One dim: the model the check builds is TorchRec's DLRM.
TABLES = (Table("a", 120, 16, pooling_factor=3.0, zipf_alpha=1.0),
          Table("b", 60, 16, pooling_factor=2.0, coverage=0.5),
          Table("c", 200, 16, pooling_factor=1.5, zipf_alpha=0.8))
OLD = Plan((Placement("a", 0, 120),
            Placement.split("b", COLUMNS, (Shard(0, 0, 60, 0, 8, 60), Shard(1, 0, 60, 8, 16, 60))),
            Placement("c", 1, 0)))
# a and c swap ranks, b's two blocks swap theirs.
NEW = Plan((Placement("a", 1, 120),
            Placement.split("b", COLUMNS, (Shard(1, 0, 60, 0, 8, 60), Shard(0, 0, 60, 8, 16, 60))),
            Placement("c", 0, 0)))

needs_torchrec = pytest.mark.skipif(
    torchrec_unavailable(load=True) is not None,
    reason=f"torchrec not importable: {torchrec_unavailable(load=True)}")


def task(tables: tuple[Table, ...] = TABLES, devices: int = 2) -> ShardingTask:
    return ShardingTask(tables, load_hardware("8xH100-80GB", devices=devices), Workload(64))


def test_the_delta_holds_the_tables_that_change_rank() -> None:
    delta = plan_delta(OLD, NEW, task())
    assert delta.names == ("a", "b", "c")
    assert [t.ranks for t in delta.tables] == [[1], [1, 0], [0]]
    # FP32 weights, as TorchRec counts its data volume: (120 + 60 + 200) rows x 16 x 4 B
    assert delta.volume_bytes == (120 + 60 + 200) * 16 * 4
    kept = Plan((Placement("a", 0, 60), *OLD.placements[1:]))  # a's cache shrinks in place
    assert plan_delta(OLD, kept, task()).names == ()
    assert plan_delta(OLD, kept, task()).kept_caches == ("a",)


@pytest.mark.parametrize(("new", "reason", "devices"), [
    (Plan((Placement("a", 0, 120),
           Placement.split("b", COLUMNS, (Shard(2, 0, 60, 0, 8, 60), Shard(1, 0, 60, 8, 16, 60))),
           Placement("c", 1, 0))), "a block stays on its rank", 3),
    (Plan((Placement("a", 0, 120),
           Placement.split("b", COLUMNS, (Shard(1, 0, 60, 0, 8, 60),
                                          Shard(1, 0, 60, 8, 16, 60))),
           Placement("c", 1, 0))), "a rank would hold two of its blocks", 2),
    (Plan((Placement.split("a", ShardingKind.ROW_WISE, (Shard(0, 0, 60, 0, 16, 60),
                                                       Shard(1, 60, 120, 0, 16, 60))),
           *OLD.placements[1:])), "moves table_wise, column_wise tables only", 2),
    (Plan((Placement.split("a", COLUMNS, (Shard(1, 0, 120, 0, 8, 120),
                                          Shard(0, 0, 120, 8, 16, 120))),
           *OLD.placements[1:])), "its sharding type changes", 2),
])
def test_what_torchrec_cannot_move_is_refused(new: Plan, reason: str, devices: int) -> None:
    with pytest.raises(PlannerError, match=reason):
        plan_delta(OLD, new, task(devices=devices))


@needs_torchrec
def test_the_delta_in_torchrec_terms() -> None:
    from autoshard.torchrec.reshard import changed_shard_to_params

    changed = changed_shard_to_params(plan_delta(OLD, NEW, task()), {}, "cpu", 2)
    volume, module = changed[""]
    assert volume == pytest.approx((120 + 60 + 200) * 16 * 4 / 2**20)
    assert {k: (v.sharding_type, v.ranks) for k, v in module.items()} == {
        "a": ("table_wise", [1]), "b": ("column_wise", [1, 0]), "c": ("table_wise", [0])}
    assert [m.placement.rank() for m in module["b"].sharding_spec.shards] == [1, 0]


def drifting() -> tuple[ShardingTask, ShardingTask, Plan]:
    """Four whole tables and a column-wise one on 2 devices, then two whole tables' pooling
    grown tenfold on device 0; the plan in use, by hand."""
    def tables(grow: float) -> tuple[Table, ...]:
        return (Table("t0", 200_000, 64, pooling_factor=4.0 * grow),
                Table("t1", 200_000, 64, pooling_factor=4.0 * grow),
                Table("t2", 200_000, 64, pooling_factor=4.0),
                Table("t3", 200_000, 64, pooling_factor=4.0),
                Table("s", 400_000, 64, pooling_factor=8.0))
    hw = load_hardware("8xH100-80GB", devices=2, hbm_gb=0.2)
    old = Plan((Placement("t0", 0, 100_000), Placement("t1", 0, 100_000),
                Placement("t2", 1, 100_000), Placement("t3", 1, 100_000),
                Placement.split("s", COLUMNS, (Shard(0, 0, 400_000, 0, 32, 50_000),
                                               Shard(1, 0, 400_000, 32, 64, 50_000)))))
    return (ShardingTask(tables(1.0), hw, Workload(65536)),
            ShardingTask(tables(10.0), hw, Workload(65536)), old)


def test_a_replan_under_torchrecs_rules_moves_whole_tables_only() -> None:
    _, new_task, old = drifting()
    assert get_move_rules("torchrec") is TORCHREC_MOVES
    free = autoshard.plan(new_task, "recshard", time_limit=10, previous=old,
                          move_budget=MoveBudget())
    kept = autoshard.plan(new_task, "recshard", time_limit=10, previous=old,
                          move_budget=MoveBudget(rules=TORCHREC_MOVES))
    assert kept.moves is not None and free.moves is not None
    assert kept.moves.tables_moved >= 1 and kept.report.step_cost_ms < kept.moves.before_ms
    placed = {p.table: p for p in kept.plan.placements}
    assert placed["s"] == old.placements[4]  # the split table stays, HBM rows and all
    for p in old.placements[:4]:  # a whole table that stays keeps its HBM rows
        if placed[p.table].device == p.device:
            assert placed[p.table].hbm_rows == p.hbm_rows
    delta = plan_delta(old, kept.plan, new_task)  # TorchRec can apply it
    assert set(delta.names) <= {"t0", "t1", "t2", "t3"} and delta.names
    assert free.report.step_cost_ms <= kept.report.step_cost_ms * (1 + 1e-9)


@pytest.mark.slow
@needs_torchrec
def test_a_dmp_model_is_resharded_in_place_on_two_gloo_ranks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_tables(tmp_path / "tables.json", TABLES)
    t = task()
    for name, plan in (("old", OLD), ("new", NEW)):
        context = PlanContext.of(t, str(tmp_path / "tables.json"),
                                 {"profile": "8xH100-80GB", "devices": 2}, "analytical")
        Plan(plan.placements, "hand", t.workload, t.hardware.name, context=context).save(
            tmp_path / f"{name}.json")
    code, out, err = run_cli(["reshard", str(tmp_path / "old.json"), str(tmp_path / "new.json"),
                              "--steps-before", "2", "--steps-after", "2", "--json"], capsys)
    assert code == 0, err
    run = json.loads(out)
    assert run["ok"] and run["moved"] == ["a", "b", "c"]
    assert run["ranks"] == {"a": [1], "b": [1, 0], "c": [0]}
    assert run["sharded_equal"] and run["resharded_equal"] and run["control_equal"]
    assert run["optimizer_carried"] and run["optimizer_nonzero"] > 0
    assert run["steps_after"] == 2 and run["control_max_abs_diff"] <= 1e-5
    assert run["volume_mib"] == pytest.approx((120 + 60 + 200) * 16 * 4 / 2**20)


def four_tables(grow: float = 1.0) -> list[Table]:
    """Statistics of :func:`ebc`'s tables: t0 and t1 looked up ``grow`` times as often."""
    return [Table(f"t{i}", 4000, 16, pooling_factor=(grow if i < 2 else 1.0) * 4.0)
            for i in range(4)]


def ebc() -> object:
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    return EmbeddingBagCollection(device=torch.device("meta"), tables=[EmbeddingBagConfig(
        name=f"t{i}", embedding_dim=16, num_embeddings=4000, feature_names=[f"t{i}"])
        for i in range(4)])


@needs_torchrec
def test_the_planner_replans_from_the_models_plan_within_its_budget() -> None:
    from torchrec.distributed.planner import Topology
    from torchrec.distributed.sharding_plan import get_default_sharders

    from autoshard.torchrec.autoshard_planner import AutoshardPlanner

    topology = Topology(world_size=2, compute_device="cpu")
    sharders = get_default_sharders()
    first = AutoshardPlanner(topology, stats=four_tables(), time_limit=10).plan(ebc(), sharders)
    ranks = {k: v.ranks for k, v in first.get_plan_for_module("").items()}
    held = AutoshardPlanner(topology, stats=four_tables(20.0), time_limit=10, previous=first,
                            move_budget=MoveBudget(max_bytes=0))
    again = held.plan(ebc(), sharders)
    assert {k: v.ranks for k, v in again.get_plan_for_module("").items()} == ranks
    assert held.result is not None and held.result.moves is not None
    assert held.result.moves.copied_bytes == 0
    assert held.result.moves.budget.endswith("torchrec's moves only")
    free = AutoshardPlanner(topology, stats=four_tables(20.0), time_limit=10, previous=first)
    moved = free.plan(ebc(), sharders)
    assert free.result is not None and free.result.moves is not None
    assert free.result.report.step_cost_ms <= held.result.report.step_cost_ms
    changed = [k for k, v in moved.get_plan_for_module("").items() if v.ranks != ranks[k]]
    assert all(moved.get_plan_for_module("")[k].sharding_type == "table_wise" for k in changed)
    with pytest.raises(ValueError, match="previous"):
        AutoshardPlanner(topology, move_budget=MoveBudget(max_bytes=0))


class _Model:
    """What :func:`reshard_to` asks of a DistributedModelParallel: its plan, and ``reshard``
    (recorded here)."""

    def __init__(self, plan: object) -> None:
        self.plan, self.calls = plan, []

    def reshard(self, changed: dict[str, object], sharded_module_fqn: str | None) -> float:
        self.calls.append((sharded_module_fqn, changed))
        return 1.0


@needs_torchrec
def test_reshard_to_moves_only_the_tables_whose_ranks_change() -> None:
    from autoshard.torchrec.export import sharding_plan
    from autoshard.torchrec.reshard import reshard_to
    from autoshard.torchrec.shardings import table_shardings

    def torchrec(plan: Plan) -> object:
        return sharding_plan({"": table_shardings(plan, task())}, "cpu", 2)

    model = _Model(torchrec(OLD))
    assert reshard_to(model, torchrec(NEW)) == 1.0
    (fqn, changed), = model.calls
    volume, module = changed[""]
    assert fqn is None and sorted(module) == ["a", "b", "c"]
    assert volume == pytest.approx((120 + 60 + 200) * 16 * 4 / 2**20)
    model = _Model(torchrec(OLD))
    assert reshard_to(model, torchrec(OLD)) == 0.0 and model.calls == []
