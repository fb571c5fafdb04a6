"""Export of plans to TorchRec: the kernel mapping, the file, and TorchRec accepting it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from autoshard.access import AccessCurve
from autoshard.cli import main
from autoshard.errors import InputError, PlannerError
from autoshard.hardware import load_hardware
from autoshard.layout.plan import Placement, Plan, Shard
from autoshard.layout.shards import plan_layout
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.sharders import get_sharder
from autoshard.tables import Table, save_tables
from autoshard.task import ShardingTask
from autoshard.torchrec import torchrec_unavailable
from autoshard.torchrec.export import (
    check_sharding_plan,
    export_doc,
    load_sharding_plan,
    meta_collection,
    read_export,
)
from autoshard.torchrec.shardings import table_shardings, to_plan

needs_torchrec = pytest.mark.skipif(
    torchrec_unavailable(load=True) is not None,
    reason=f"torchrec not importable: {torchrec_unavailable(load=True)}")
TABLES = (Table("a", rows=1000, dim=16), Table("b", rows=400, dim=32, pooling_factor=3.0),
          Table("c", rows=2000, dim=8, access_cdf=AccessCurve.uniform()))


def _task() -> ShardingTask:
    return ShardingTask(TABLES, load_hardware("8xH100-80GB", devices=2))


def _plan() -> Plan:
    return Plan((Placement("a", 0, 1000), Placement("b", 1, 0), Placement("c", 1, 500)),
                sharder="hand")


def test_kernels_follow_the_hbm_rows() -> None:
    by_name = {s.table: s for s in table_shardings(_plan(), _task())}
    assert (by_name["a"].compute_kernel, by_name["a"].rank) == ("fused", 0)
    assert (by_name["b"].compute_kernel, by_name["b"].rank) == ("fused_uvm", 1)
    assert by_name["c"].compute_kernel == "fused_uvm_caching"
    assert by_name["c"].cache_load_factor == pytest.approx(0.25)
    assert [by_name[n].hbm_rows for n in "abc"] == [1000, 0, 500]


def test_description_round_trips_and_bad_entries_are_named(tmp_path: Path) -> None:
    doc = export_doc(_plan(), _task())
    assert doc["world_size"] == 2 and doc["kind"] == "torchrec_sharding_plan"
    _, shardings = read_export(doc)
    assert [s.hbm_rows for s in shardings] == [1000, 0, 500]
    doc["tables"][1]["compute_kernel"] = "dense"
    with pytest.raises(InputError, match=r"tables\[1\].compute_kernel"):
        read_export(doc)
    doc["tables"][1]["compute_kernel"] = "fused"
    doc["tables"][1]["shards"][0]["rank"] = 5
    with pytest.raises(InputError, match=r"tables\[1\].shards\[0\].rank"):
        read_export(doc)


def test_cli_export_writes_the_description(tmp_path: Path) -> None:
    tables, plan, out = tmp_path / "t.json", tmp_path / "p.json", tmp_path / "o" / "tr.yaml"
    save_tables(tables, TABLES)
    _plan().save(plan)
    main(["export", str(plan), "-t", str(tables), "--devices", "2", "-o", str(out)])
    _, shardings = read_export(out)
    assert [(s.rank, s.compute_kernel) for s in shardings] == [
        (0, "fused"), (1, "fused_uvm"), (1, "fused_uvm_caching")]


def test_cli_export_rejects_an_unknown_target(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    tables, plan = tmp_path / "t.json", tmp_path / "p.json"
    save_tables(tables, TABLES)
    _plan().save(plan)
    with pytest.raises(SystemExit) as exit_info:
        main(["export", str(plan), "-t", str(tables), "--to", "onnx", "-o",
              str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    assert "--to" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@needs_torchrec
def test_torchrec_accepts_the_exported_plan(tmp_path: Path) -> None:
    from torchrec.distributed.types import ShardingPlan

    path = tmp_path / "tr.json"
    tables = tmp_path / "t.json"
    save_tables(tables, TABLES)
    _plan().save(tmp_path / "p.json")
    main(["export", str(tmp_path / "p.json"), "-t", str(tables), "--devices", "2", "-o",
          str(path), "--check"])
    plan = load_sharding_plan(path)
    assert isinstance(plan, ShardingPlan)
    module_plan = plan.get_plan_for_module("")
    assert module_plan["a"].compute_kernel == "fused" and module_plan["a"].ranks == [0]
    assert module_plan["b"].compute_kernel == "fused_uvm" and module_plan["b"].ranks == [1]
    assert module_plan["c"].compute_kernel == "fused_uvm_caching"
    assert module_plan["c"].cache_params.load_factor == pytest.approx(0.25)
    module = meta_collection([(t.name, t.rows, t.dim, "FP32") for t in TABLES])
    check_sharding_plan(plan, module, world_size=2)
    # A module whose table has another shape is caught.
    other = meta_collection([("a", 999, 16, "FP32"), ("b", 400, 32, "FP32"),
                             ("c", 2000, 8, "FP32")])
    with pytest.raises(PlannerError, match="table 'a'"):
        check_sharding_plan(plan, other, world_size=2)


@needs_torchrec
def test_export_for_the_prefetch_pipeline_prefetches_its_caches(tmp_path: Path) -> None:
    path, tables = tmp_path / "tr.json", tmp_path / "t.json"
    save_tables(tables, TABLES)
    _plan().save(tmp_path / "p.json")
    main(["export", str(tmp_path / "p.json"), "-t", str(tables), "--devices", "2", "-o",
          str(path), "--overhead", "torchrec-prefetch", "--check"])
    doc = json.loads(path.read_text())
    assert doc["pipeline"] == "prefetch"
    module_plan = load_sharding_plan(path).get_plan_for_module("")
    assert module_plan["c"].cache_params.prefetch_pipeline is True
    main(["export", str(tmp_path / "p.json"), "-t", str(tables), "--devices", "2", "-o",
          str(path)])
    assert json.loads(path.read_text())["pipeline"] == "none"
    assert not load_sharding_plan(path).get_plan_for_module("")["c"].cache_params.prefetch_pipeline
    with pytest.raises(InputError, match="pipeline"):
        read_export(dict(doc, pipeline="eager"))


def _split_task() -> ShardingTask:
    tables = (Table("a", rows=1000, dim=16), Table("b", rows=400, dim=32, pooling_factor=3.0),
              Table("c", rows=2000, dim=8))
    return ShardingTask(tables, load_hardware("8xH100-80GB", devices=4))


def _split_plan() -> Plan:
    return Plan((
        Placement.split("a", "row_wise", (Shard(3, 0, 250, 0, 16, 175),
                                          Shard(1, 250, 500, 0, 16, 175),
                                          Shard(0, 500, 750, 0, 16, 175),
                                          Shard(2, 750, 1000, 0, 16, 175))),
        Placement.split("b", "column_wise", (Shard(0, 0, 400, 0, 8, 400),
                                             Shard(2, 0, 400, 8, 32, 400))),
        Placement.split("c", "table_row_wise", tuple(Shard(d, 500 * i, 500 * (i + 1), 0, 8, 0)
                                                     for i, d in enumerate((1, 2, 0, 3)))),
    ), sharder="hand")


def test_split_tables_export_with_ranks_offsets_and_sizes() -> None:
    by_name = {s.table: s for s in table_shardings(_split_plan(), _split_task())}
    a, b, c = by_name["a"], by_name["b"], by_name["c"]
    # Row-wise: TorchRec's even blocks, one per rank of the world in rank order.
    assert a.sharding_type == "row_wise" and a.ranks == [0, 1, 2, 3]
    assert [(x.row_offset, x.rows) for x in a.shards] == [(0, 250), (250, 250), (500, 250),
                                                           (750, 250)]
    assert a.compute_kernel == "fused_uvm_caching"
    assert a.cache_load_factor == pytest.approx(0.7)
    assert b.sharding_type == "column_wise" and b.compute_kernel == "fused"
    assert [(x.rank, x.col_offset, x.cols, x.rows) for x in b.shards] == [
        (0, 0, 8, 400), (2, 8, 24, 400)]
    assert c.sharding_type == "table_row_wise" and c.ranks == [0, 1, 2, 3]
    assert c.compute_kernel == "fused_uvm" and sum(x.rows for x in c.shards) == 2000
    # Back to our plan: same geometry; the row-wise table keeps its share of rows in HBM.
    back = {p.table: p for p in to_plan(list(by_name.values()), _split_task()).placements}
    assert [(s.device, s.rows, s.hbm_rows) for s in back["a"].shards] == [(d, 250, 175)
                                                                          for d in range(4)]
    assert back["b"] == _split_plan().placements[1]


def test_bad_shards_are_rejected_with_the_field_named() -> None:
    doc = export_doc(_split_plan(), _split_task())
    cases = [
        (("tables", 1, "shards", 1, "cols"), 0, r"tables\[1\]\.shards\[1\]"),  # empty block
        (("tables", 1, "shards", 1, "col_offset"), 4, r"tables\[1\]\.shards\[1\]"),  # overlap
        (("tables", 0, "shards", 3, "rows"), 500, r"tables\[0\]\.shards"),  # short of rows
        (("tables", 0, "shards", 2, "rank"), 9, r"tables\[0\]\.shards\[2\]\.rank"),
        (("tables", 0, "shards", 0, "rank"), 1, r"tables\[0\]\.shards"),  # not rank order
    ]
    for path, value, field in cases:
        bad = copy.deepcopy(doc)
        target = bad
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(InputError, match=field):
            read_export(bad)


def test_cli_export_rejects_a_plan_for_more_devices_than_the_hardware(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tables, plan, out = tmp_path / "t.json", tmp_path / "p.json", tmp_path / "tr.json"
    save_tables(tables, _split_task().tables)
    _split_plan().save(plan)
    with pytest.raises(SystemExit) as exit_info:
        main(["export", str(plan), "-t", str(tables), "--devices", "2", "-o", str(out)])
    assert exit_info.value.code == 2
    assert "device" in capsys.readouterr().err
    assert not out.exists()


@needs_torchrec
def test_torchrec_accepts_split_tables_and_its_storage_estimate_fits(tmp_path: Path) -> None:
    tables, plan, out = tmp_path / "t.json", tmp_path / "p.json", tmp_path / "tr.json"
    save_tables(tables, _split_task().tables)
    _split_plan().save(plan)
    main(["export", str(plan), "-t", str(tables), "--devices", "4", "-o", str(out), "--check"])
    module_plan = load_sharding_plan(out).get_plan_for_module("")
    a = module_plan["a"]
    assert a.sharding_type == "row_wise" and a.ranks == [0, 1, 2, 3]
    assert [list(m.shard_sizes) for m in a.sharding_spec.shards] == [[250, 16]] * 4
    assert [str(m.placement) for m in module_plan["b"].sharding_spec.shards] == [
        "rank:0/cuda:0", "rank:2/cuda:2"]


@pytest.mark.usefixtures("step_clock")
@needs_torchrec
def test_export_fits_a_full_plan_to_torchrecs_hbm_count(tmp_path: Path) -> None:
    from autoshard.torchrec.estimate import estimate_plan
    from autoshard.workloads import constrained_task, dlrm_tables

    task = constrained_task(dlrm_tables(10, seed=5), 2, hbm_fraction=0.3)
    plan = get_sharder("recshard", time_limit=10).shard(task, AnalyticalCostModel())
    assert estimate_plan(plan, task).hbm_fill > 1.0  # full under ours, over under TorchRec's
    tables, path, out = tmp_path / "t.json", tmp_path / "p.json", tmp_path / "tr.json"
    save_tables(tables, task.tables)
    plan.save(path)
    hbm_gb = str(task.device_arrays.hbm_capacity[0] / 1e9)
    args = ["export", str(path), "-t", str(tables), "--devices", "2", "--hbm-gb", hbm_gb,
            "-o", str(out), "--check"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--no-fit"])
    assert exit_info.value.code != 0 and not out.exists()
    main([*args, "--fitted-plan", str(tmp_path / "fitted.json")])
    fitted = Plan.load(tmp_path / "fitted.json")
    assert estimate_plan(fitted, task).fits
    fitted_rows = plan_layout(fitted, task).hbm_rows
    rows = plan_layout(plan, task).hbm_rows
    assert (fitted_rows <= rows).all() and fitted_rows.sum() < rows.sum()


def test_row_shards_must_be_torchrecs_even_blocks_one_per_rank() -> None:
    # TorchRec's training runtime sends id i of a row-wise table to rank i // ceil(rows /
    # ranks): two shards on one device, or shards on some devices only, would be misrouted.
    two_on_one = Plan((
        Placement.split("a", "row_wise", (Shard(1, 0, 300, 0, 16, 300),
                                          Shard(2, 300, 600, 0, 16, 0),
                                          Shard(1, 600, 1000, 0, 16, 100))),
        Placement("b", 0, 400), Placement("c", 3, 0)), sharder="hand")
    with pytest.raises(PlannerError, match="even blocks of 250 rows"):
        table_shardings(two_on_one, _split_task())
    # TorchRec's own layout of 10 rows over 4 ranks (3, 3, 3, 1) exports as it is, and one
    # that leaves a rank out does not.
    task = ShardingTask((Table("z", rows=10, dim=4),), load_hardware("8xH100-80GB", devices=4))
    edges = [0, 3, 6, 9, 10]
    theirs = Plan((Placement.split("z", "row_wise", tuple(
        Shard(d, edges[d], edges[d + 1], 0, 4, 0) for d in range(4))),), sharder="hand")
    z = table_shardings(theirs, task)[0]
    assert [(x.rank, x.row_offset, x.rows) for x in z.shards] == [
        (0, 0, 3), (1, 3, 3), (2, 6, 3), (3, 9, 1)]
    three = Plan((Placement.split("z", "row_wise", (Shard(0, 0, 4, 0, 4, 0),
                                                    Shard(1, 4, 7, 0, 4, 0),
                                                    Shard(2, 7, 10, 0, 4, 0))),), sharder="hand")
    with pytest.raises(PlannerError, match="one near-equal shard on each"):
        table_shardings(three, task)
