"""Export of plans to TorchRec: the kernel mapping, the file, and TorchRec accepting it."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoshard.access import AccessCurve
from autoshard.cli import main
from autoshard.errors import InputError, PlannerError
from autoshard.export_torchrec import (
    check_sharding_plan,
    export_doc,
    load_sharding_plan,
    meta_collection,
    read_export,
    table_shardings,
    torchrec_unavailable,
)
from autoshard.hardware import load_hardware
from autoshard.plan import Placement, Plan
from autoshard.tables import Table, save_tables
from autoshard.task import ShardingTask

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
