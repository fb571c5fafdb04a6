"""AutoshardPlanner, TorchRec's planner interface planned by autoshard: the quick start runs in
DistributedModelParallel on 2 gloo processes with outputs equal to the unsharded model's;
constraints are honoured or refused clearly; nested collections keep their module paths;
statistics fall back with a warning; ``plan --torchrec-model`` and ``tables from-torchrec``."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli

from autoshard.errors import InputError, PlannerError
from autoshard.layout.plan import Plan
from autoshard.tables import Table, load_tables
from autoshard.torchrec import torchrec_unavailable
from autoshard.torchrec.model_tables import factory_tables, load_factory

pytestmark = pytest.mark.skipif(torchrec_unavailable(load=True) is not None,
                                reason=f"torchrec not importable: {torchrec_unavailable()}")
ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "torchrec_quickstart.py"
MODEL_FILE = '''
from pathlib import Path

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection
from torchrec import EmbeddingConfig


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.user = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
            name="members", embedding_dim=64, num_embeddings=10**9, feature_names=["uid"])])
        self.tower = torch.nn.Sequential(torch.nn.Linear(4, 4), EmbeddingCollection(tables=[
            EmbeddingConfig(name="videos", embedding_dim=32, num_embeddings=5000,
                            feature_names=["iid"])]))


def build():
    model = Model()
    where = model.user.embedding_bags["members"].weight.device.type
    Path(__file__).with_name("built_on.txt").write_text(where)
    return model


def nothing():
    return torch.nn.Linear(2, 2)
'''


def cpu(world: int = 2) -> Any:
    from torchrec.distributed.planner import Topology

    return Topology(world_size=world, compute_device="cpu")


def cuda(world: int = 2) -> Any:
    from torchrec.distributed.planner import Topology

    return Topology(world_size=world, compute_device="cuda", hbm_cap=2**30,
                    local_world_size=world)


def ebc(dims: tuple[int, ...] = (16, 32, 48, 64), rows: int = 4000, features: int = 1) -> Any:
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    return EmbeddingBagCollection(device=torch.device("meta"), tables=[EmbeddingBagConfig(
        name=f"t{i}", embedding_dim=d, num_embeddings=rows,
        feature_names=[f"f{i}_{j}" for j in range(features)]) for i, d in enumerate(dims)])


def planned(topology: Any, module: Any, **options: Any) -> tuple[Any, Any]:
    """(the ShardingPlan, the planner) of ``module`` with TorchRec's default sharders."""
    from torchrec.distributed.sharding_plan import get_default_sharders

    from autoshard.torchrec.autoshard_planner import AutoshardPlanner

    planner = AutoshardPlanner(topology, time_limit=20, **options)
    return planner.plan(module, get_default_sharders()), planner


def constraint(**fields: Any) -> Any:
    from torchrec.distributed.planner import ParameterConstraints

    return ParameterConstraints(**fields)


@pytest.mark.slow
def test_quickstart_matches_the_unsharded_model_on_two_gloo_processes(tmp_path: Path) -> None:
    assert len(QUICKSTART.read_text().splitlines()) <= 30
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", str(QUICKSTART)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(f"quick start OK (rank {r}): sharded pooled embeddings equal" in done.stdout
               for r in range(2))


def test_the_quickstart_is_shown_as_it_is_in_the_docs() -> None:
    docs = (ROOT / "docs" / "torchrec.md").read_text()
    assert f"```python\n{QUICKSTART.read_text()}```" in docs
    assert "docs/torchrec.md#torchrec-quick-start" in (ROOT / "README.md").read_text()


def test_cpu_plan_is_ready_for_dmp_and_keeps_every_row_in_memory() -> None:
    plan, planner = planned(cpu(), ebc())
    module_plan = plan.get_plan_for_module("")
    assert set(module_plan) == {"t0", "t1", "t2", "t3"}
    for ps in module_plan.values():
        assert ps.compute_kernel == "fused"
        for shard in ps.sharding_spec.shards:
            assert str(shard.placement) == f"rank:{shard.placement.rank()}/cpu"
    assert planner.result.task.hardware.num_devices == 2
    assert planner.result.task.workload.batch_size == 512 * 2  # TorchRec's per-rank default


def test_sharding_types_and_min_partition_are_honoured() -> None:
    given = {"t3": constraint(sharding_types=["column_wise"], min_partition=32),
             "t0": constraint(sharding_types=["table_wise"])}
    module_plan = planned(cpu(4), ebc(), constraints=given)[0].get_plan_for_module("")
    assert module_plan["t0"].sharding_type == "table_wise"
    t3 = module_plan["t3"]
    assert t3.sharding_type == "column_wise"
    assert all(s.shard_sizes[1] >= 32 for s in t3.sharding_spec.shards)
    assert sum(s.shard_sizes[1] for s in t3.sharding_spec.shards) == 64


def test_a_type_the_sharders_do_not_offer_on_cpu_is_refused_naming_the_table() -> None:
    with pytest.raises(PlannerError, match=r"table 't2'.*row_wise"):
        planned(cpu(), ebc(), constraints={"t2": constraint(sharding_types=["row_wise"])})


def test_kernels_and_cache_load_factors_are_honoured_on_cuda() -> None:
    from torchrec.distributed.types import CacheParams

    given = {"t0": constraint(compute_kernels=["fused_uvm"]),
             "t1": constraint(compute_kernels=["fused_uvm_caching"],
                              cache_params=CacheParams(load_factor=0.25)),
             "t2": constraint(compute_kernels=["fused"], enforce_hbm=True,
                              sharding_types=["grid_shard", "table_wise"])}
    module_plan = planned(cuda(), ebc(), constraints=given)[0].get_plan_for_module("")
    assert module_plan["t0"].compute_kernel == "fused_uvm"
    assert module_plan["t1"].compute_kernel == "fused_uvm_caching"
    assert module_plan["t1"].cache_params.load_factor == pytest.approx(0.25)
    assert (module_plan["t2"].compute_kernel, module_plan["t2"].sharding_type) == (
        "fused", "table_wise")
    assert module_plan["t2"].enforce_hbm is True
    placements = {str(s.placement) for ps in module_plan.values()
                  for s in ps.sharding_spec.shards}
    assert placements <= {"rank:0/cuda:0", "rank:1/cuda:1"}


def test_a_sharder_that_never_splits_is_told_which_does() -> None:
    with pytest.raises(PlannerError, match=r"lookup_greedy.*'t3' whole.*recshard"):
        planned(cpu(), ebc(), sharder="lookup_greedy",
                constraints={"t3": constraint(sharding_types=["column_wise"])})


def test_nested_collections_are_planned_under_their_module_paths(tmp_path: Path) -> None:
    import torch
    from torchrec.distributed.planner import Topology

    (tmp_path / "models.py").write_text(MODEL_FILE)
    build = load_factory(f"{tmp_path / 'models.py'}:build")
    with torch.device("meta"):
        plan, planner = planned(Topology(world_size=2, compute_device="cpu", ddr_cap=2**40),
                                build())
    assert set(plan.plan) == {"user", "tower.1"}
    assert set(plan.plan["user"]) == {"members"} and set(plan.plan["tower.1"]) == {"videos"}
    assert planner.result is not None and planner.result.plan.context is not None


def test_statistics_come_from_stats_then_constraints_then_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    stats = [Table("f0_1", 10, 8, pooling_factor=3.0), Table("t1", 10, 8, pooling_factor=7.0,
                                                           zipf_alpha=1.1)]
    given = {"t2": constraint(pooling_factors=[2.0, 0.5])}
    with caplog.at_level(logging.WARNING, "autoshard"):
        _, planner = planned(cpu(), ebc(features=2), stats=stats, constraints=given)
    pooling = {t.name: t.pooling_factor for t in planner.result.task.tables}
    assert pooling == {"t0": 3.0, "t1": 7.0, "t2": 2.5, "t3": 2.0}  # t3: 1.0 per feature
    assert planner.result.task.tables[1].zipf_alpha == 1.1
    assert planner.result.task.tables[3].features == ("f3_0", "f3_1")
    warned = [r.getMessage() for r in caplog.records if "default pooling factor" in
              r.getMessage()]
    assert len(warned) == 1 and "(t3)" in warned[0]


def test_a_pooling_factor_of_one_given_counts_as_given(
        caplog: pytest.LogCaptureFixture) -> None:
    """1.0 is TorchRec's default value, but a constraint that carries it gives it: no warning
    names that table."""
    given = {name: constraint(pooling_factors=[1.0]) for name in ("t0", "t1", "t2")}
    with caplog.at_level(logging.WARNING, "autoshard"):
        _, planner = planned(cpu(), ebc(), constraints=given)
    pooling = {t.name: t.pooling_factor for t in planner.result.task.tables}
    assert pooling["t0"] == pooling["t1"] == pooling["t2"] == 1.0
    warned = [r.getMessage() for r in caplog.records if "default pooling factor" in
              r.getMessage()]
    assert len(warned) == 1 and "(t3)" in warned[0] and "t0" not in warned[0]


def test_the_result_plan_saves_and_evaluates_on_its_context(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, planner = planned(cpu(), ebc())
    path = tmp_path / "plan.json"
    planner.result.plan.save(path)
    code, out, err = run_cli(["evaluate", str(path), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["step_cost_ms"] == pytest.approx(planner.result.report.step_cost_ms)
    assert Plan.load(path).context.tables.startswith("torchrec-module:")
    assert Plan.load(path).context.module_paths == dict.fromkeys(("t0", "t1", "t2", "t3"), "")


def test_collective_plan_broadcasts_and_raises_failures(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torchrec.distributed.sharding_plan import get_default_sharders

    from autoshard.torchrec.autoshard_planner import AutoshardPlanner

    with pytest.raises(PlannerError, match=r"torch\.distributed"):
        AutoshardPlanner(cpu(1)).collective_plan(ebc())
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        plan = AutoshardPlanner(cpu(1)).collective_plan(ebc(), get_default_sharders())
        assert set(plan.get_plan_for_module("")) == {"t0", "t1", "t2", "t3"}
        refused = AutoshardPlanner(cpu(1), constraints={
            "t0": constraint(sharding_types=["row_wise"])})
        with pytest.raises(PlannerError, match="t0"):
            refused.collective_plan(ebc())
    finally:
        dist.destroy_process_group()


COLLECTIVE_FAILURE = """
import torch.distributed as dist
from torchrec.distributed.planner import ParameterConstraints, Topology
from autoshard.errors import PlannerError
from autoshard.torchrec.autoshard_planner import AutoshardPlanner
from test_torchrec_planner import ebc

dist.init_process_group("gloo")
planner = AutoshardPlanner(Topology(world_size=2, compute_device="cpu"), constraints={
    "t1": ParameterConstraints(sharding_types=["row_wise"])})
try:
    planner.collective_plan(ebc())
except PlannerError as exc:
    print(f"rank {dist.get_rank()} refused: {exc}")
dist.barrier()  # both done before either tears down its process group
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_failure_on_rank_0_is_raised_on_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "collective.py"
    script.write_text(COLLECTIVE_FAILURE)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", str(script)], cwd=tmp_path, timeout=600,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        assert f"rank {rank} refused: " in done.stdout and "'t1'" in done.stdout


def test_element_types_our_tables_cannot_hold_are_refused() -> None:
    from autoshard.torchrec.model_tables import ModelTable

    assert ModelTable("", "t", 10, 8, "BF16", ("f",)).bytes_per_element == 2
    with pytest.raises(InputError, match="INT4"):
        ModelTable("sparse", "t", 10, 8, "INT4", ("f",)).bytes_per_element  # noqa: B018


def test_a_plan_records_its_model_tables_inline_and_checks_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, planner = planned(cpu(), ebc())
    path = tmp_path / "plan.json"
    planner.result.plan.save(path)
    doc = json.loads(path.read_text())
    doc["context"]["inline_tables"][0]["rows"] += 1
    path.write_text(json.dumps(doc))
    code, _, err = run_cli(["evaluate", str(path)], capsys)
    assert code == 2 and "not the ones the plan was made for" in err
    doc["context"]["inline_tables"] = {"t0": 1}
    path.write_text(json.dumps(doc))
    code, _, err = run_cli(["evaluate", str(path)], capsys)
    assert code == 2 and "context.inline_tables" in err


def test_bad_arguments_fail_at_construction() -> None:
    from autoshard.torchrec.autoshard_planner import AutoshardPlanner

    for options in ({"batch_size": 0}, {"pipeline": "eager"}, {"cost_model": "nowhere"},
                    {"sharder": "nope"}, {"sharder_options": {"nope": 1}}):
        with pytest.raises(InputError):
            AutoshardPlanner(cpu(), **options)


def test_a_factory_on_the_meta_device_allocates_nothing(tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(MODEL_FILE)
    tables, fell_back = factory_tables(f"{tmp_path / 'models.py'}:build")
    assert (tmp_path / "built_on.txt").read_text() == "meta"  # a 256 GB table, not allocated
    assert [(t.name, t.rows, t.dim) for t in tables] == [("videos", 5000, 32),
                                                         ("members", 10**9, 64)]
    assert fell_back == ["videos", "members"]


def test_cli_plans_a_model_then_evaluates_and_exports_its_plan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "models.py").write_text(MODEL_FILE)
    spec, plan = f"{tmp_path / 'models.py'}:build", tmp_path / "plan.json"
    code, _, err = run_cli(["plan", "--torchrec-model", spec, "--devices", "2", "-o",
                            str(plan), "--time-limit", "20"], capsys)
    assert code == 0, err
    assert "default pooling factor" in err
    doc = json.loads(plan.read_text())
    assert doc["context"]["tables"] == f"torchrec-model:{spec}"
    assert [t["name"] for t in doc["context"]["inline_tables"]] == ["videos", "members"]
    code, out, err = run_cli(["evaluate", str(plan), "--json"], capsys)
    assert code == 0 and json.loads(out)["step_cost_ms"] > 0, err
    code, _, err = run_cli(["export", str(plan), "--to", "torchrec", "-o",
                            str(tmp_path / "sharding.yaml")], capsys)
    assert code == 0, err


DLRM_LIKE = '''
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig


class SparseArch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding_bag_collection = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="pair", embedding_dim=16, num_embeddings=1000,
                               feature_names=["left", "right"]),
            EmbeddingBagConfig(name="single", embedding_dim=16, num_embeddings=500,
                               feature_names=["one"])])


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sparse_arch = SparseArch()


def build():
    return Model()
'''


def test_exports_keep_the_collections_module_path_and_the_features(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plan of a model records where each table's collection lives, and ``export`` writes
    it (TorchRec's plan is keyed by it), unless ``--module-path`` says otherwise; the table file
    lists each table's features, a table of two features at two lookups per sample."""
    from autoshard.torchrec.export import load_sharding_plan

    (tmp_path / "dlrm_like.py").write_text(DLRM_LIKE)
    spec, plan = f"{tmp_path / 'dlrm_like.py'}:build", tmp_path / "plan.json"
    code, _, err = run_cli(["plan", "--torchrec-model", spec, "--devices", "2", "-o",
                            str(plan), "-s", "lookup_greedy"], capsys)
    assert code == 0, err
    path = "sparse_arch.embedding_bag_collection"
    assert json.loads(plan.read_text())["context"]["module_paths"] == {"pair": path,
                                                                        "single": path}
    exported = tmp_path / "sharding.yaml"
    code, out, err = run_cli(["export", str(plan), "-o", str(exported), "--check"], capsys)
    assert code == 0, err
    assert f"module path '{path}'" in " ".join(out.split())
    assert set(load_sharding_plan(exported).plan) == {path}
    code, _, err = run_cli(["export", str(plan), "-o", str(exported), "--module-path",
                            "model.ebc"], capsys)
    assert code == 0, err
    assert set(load_sharding_plan(exported).plan) == {"model.ebc"}
    tables = tmp_path / "tables.yaml"
    code, _, err = run_cli(["tables", "from-torchrec", spec, "--out", str(tables)], capsys)
    assert code == 0, err
    found = {t.name: t for t in load_tables(tables)}
    assert found["pair"].features == ("left", "right") and found["pair"].pooling_factor == 2.0
    assert found["single"].features == ("one",) and found["single"].pooling_factor == 1.0


def test_an_export_of_several_collections_keys_each_table_by_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autoshard.torchrec.export import load_sharding_plan

    (tmp_path / "models.py").write_text(MODEL_FILE)
    spec, plan = f"{tmp_path / 'models.py'}:build", tmp_path / "plan.json"
    code, _, err = run_cli(["plan", "--torchrec-model", spec, "--devices", "2", "-o",
                            str(plan), "-s", "lookup_greedy"], capsys)
    assert code == 0, err
    exported = tmp_path / "sharding.json"
    code, _, err = run_cli(["export", str(plan), "-o", str(exported)], capsys)
    assert code == 0, err
    doc = json.loads(exported.read_text())
    assert {t["table"]: t["module_path"] for t in doc["tables"]} == {"videos": "tower.1",
                                                                     "members": "user"}
    loaded = load_sharding_plan(exported).plan
    assert set(loaded) == {"user", "tower.1"} and set(loaded["user"]) == {"members"}


def test_tables_from_torchrec_round_trips(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "models.py").write_text(MODEL_FILE)
    spec, out = f"{tmp_path / 'models.py'}:build", tmp_path / "tables.yaml"
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"tables": [{"name": "uid", "rows": 10, "dim": 4,
                                             "pooling_factor": 4.0}]}))
    code, _, err = run_cli(["tables", "from-torchrec", spec, "--out", str(out), "--stats",
                            str(stats)], capsys)
    assert code == 0, err
    written = load_tables(out)
    assert written == factory_tables(spec, stats)[0]
    assert {t.name: t.pooling_factor for t in written} == {"videos": 1.0, "members": 4.0}


@pytest.mark.parametrize(("args", "message"), [
    (["--torchrec-model", "no_such_module_x:build"], "cannot import 'no_such_module_x'"),
    (["--torchrec-model", "MODELS:missing"], "has no function 'missing'"),
    (["--torchrec-model", "MODELS:nothing"], "no EmbeddingBagCollection"),
    (["--torchrec-model", "MODELS:build", "-t", "default"], "not both"),
    (["--torchrec-model", "MODELS"], "expected MODULE:FACTORY"),
    (["-t", "default", "--stats", "s.json"], "goes with --torchrec-model"),
    ([], "give the tables"),
])
def test_cli_errors_are_one_line_and_write_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
        message: str) -> None:
    (tmp_path / "models.py").write_text(MODEL_FILE)
    args = [a.replace("MODELS", str(tmp_path / "models.py")) for a in args]
    out = tmp_path / "plan.json"
    code, _, err = run_cli(["plan", *args, "-o", str(out)], capsys)
    assert code == 2 and message in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    assert not out.exists()
