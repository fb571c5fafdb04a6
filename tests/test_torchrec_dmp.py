"""Plans run in TorchRec's DistributedModelParallel on 2 gloo processes: the sharded model's
outputs equal the unsharded model's for every sharding type TorchRec offers on CPU, row-wise
plans pass TorchRec's checks and are refused on CPU before anything starts, and the report
holds TorchRec's, our runner's and the cost model's figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_cli

from autoshard.errors import InputError
from autoshard.hardware import load_hardware
from autoshard.layout.kinds import ShardingKind
from autoshard.layout.plan import Placement, Plan, Shard
from autoshard.runner import FAULT_ENV, RunConfig, RunError
from autoshard.tables import Table, save_tables
from autoshard.task import ShardingTask, Workload
from autoshard.torchrec import torchrec_unavailable

pytestmark = pytest.mark.skipif(
    torchrec_unavailable(load=True) is not None,
    reason=f"torchrec not importable: {torchrec_unavailable(load=True)}")

COLUMNS = ShardingKind.COLUMN_WISE
#: One dim: the built-in model is TorchRec's DLRM.
TABLES = (Table("a", 120, 16, pooling_factor=3.0, zipf_alpha=1.0),
          Table("b", 60, 16, pooling_factor=2.0, coverage=0.5),
          Table("c", 200, 16, pooling_factor=1.5, zipf_alpha=0.8))
# a whole on rank 0 in HBM (fused); b in two column blocks with a 10-row cache each
# (fused_uvm_caching); c whole on rank 1 in host memory (fused_uvm).
PLAN = Plan((Placement("a", 0, 120),
             Placement.split("b", COLUMNS, (Shard(0, 0, 60, 0, 8, 10), Shard(1, 0, 60, 8, 16, 10))),
             Placement("c", 1, 0)), "hand", Workload(64), "2xH100-80GB")
#: Several dims: the built-in model is an MLP over the pooled embeddings.
MIXED = (Table("a", 120, 8, pooling_factor=3.0, zipf_alpha=1.0),
         Table("b", 60, 16, pooling_factor=2.0, coverage=0.5),
         Table("c", 200, 8, pooling_factor=1.5))
# b in three column blocks, rank 0 holding two of different widths (8 and 4 columns).
MIXED_PLAN = Plan((Placement("a", 1, 120),
                   Placement.split("b", COLUMNS, (Shard(0, 0, 60, 0, 8, 60),
                                                  Shard(1, 0, 60, 8, 12, 60),
                                                  Shard(0, 0, 60, 12, 16, 60))),
                   Placement.split("c", COLUMNS, (Shard(1, 0, 200, 0, 4, 200),
                                                  Shard(0, 0, 200, 4, 8, 200)))),
                  "hand", Workload(64), "2xH100-80GB")
ROW_SPLITS = Plan((Placement("a", 0, 120),
                   Placement.split("b", ShardingKind.ROW_WISE, (Shard(0, 0, 30, 0, 16, 30),
                                                                Shard(1, 30, 60, 0, 16, 30))),
                   Placement.split("c", ShardingKind.TABLE_ROW_WISE,
                                   (Shard(0, 0, 100, 0, 16, 100),
                                    Shard(1, 100, 200, 0, 16, 100)))),
                  "hand", Workload(64), "2xH100-80GB")


def task(tables: tuple[Table, ...] = TABLES, batch: int = 64) -> ShardingTask:
    return ShardingTask(tables, load_hardware("8xH100-80GB", devices=2), Workload(batch))


def settings(**kwargs: Any) -> Any:
    from autoshard.torchrec.dmp import DmpSettings

    config = RunConfig(batch_size=64, iterations=3, warmup=1, device="cpu", timeout_s=90)
    return DmpSettings(config, **kwargs)


def files(tmp_path: Path, plan: Plan, tables: tuple[Table, ...]) -> list[str]:
    save_tables(tmp_path / "tables.json", tables)
    plan.save(tmp_path / "plan.json")
    return [str(tmp_path / "plan.json"), "--tables", str(tmp_path / "tables.json"),
            "--devices", "2", "--batch-size", "64"]


# --- runs ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_runs_table_and_column_wise_in_dmp_beside_runner_and_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    code, stdout, err = run_cli(["run-plan", *files(tmp_path, PLAN, TABLES), "--engine",
                                 "torchrec", "--compare-runner", "--iterations", "3",
                                 "--warmup", "1", "--device", "cpu", "--json", "-o", str(out)],
                                capsys)
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc == json.loads(out.read_text())
    run = doc["torchrec"]
    assert doc["outputs_equal"] is True and run["model"] == "torchrec.models.dlrm.DLRM"
    assert run["backend"] == "gloo" and run["world_size"] == 2
    kinds = {t["table"]: (t["sharding_type"], t["planned_kernel"], t["kernel"])
             for t in run["tables"]}
    assert kinds == {"a": ("table_wise", "fused", "fused"),
                     "b": ("column_wise", "fused_uvm_caching", "fused"),
                     "c": ("table_wise", "fused_uvm", "fused")}
    assert any("fused_uvm_caching ran fused" in n and ": b" in n for n in run["notes"])
    assert [r["tables"] for r in run["per_rank"]] == [["a", "b"], ["b", "c"]]
    for r in run["per_rank"]:
        assert r["outputs_equal"] and r["max_abs_diff"] <= 1e-5 and r["outputs_checked"] > 0
        assert r["logits_max_abs_diff"] <= 1e-4 and r["steps"] == 3
    for row in doc["per_device"]:
        assert row["torchrec_step_ms"] > 0 and row["runner_step_ms"] > 0
        assert row["runner_work_ms"] > 0 and row["modelled_ms"] > 0
    assert doc["step_ms"] == max(r["step_ms"] for r in run["per_rank"])
    assert doc["runner"]["backend"] == "gloo" and doc["modelled"]["cost_model"] == "analytical"


@pytest.mark.slow
def test_column_blocks_in_one_node_run_table_column_wise_with_equal_outputs(
        tmp_path: Path) -> None:
    from autoshard.torchrec.dmp import run_plan_in_dmp

    report = run_plan_in_dmp(MIXED_PLAN, task(MIXED), settings(node_columns=True),
                             logs=tmp_path / "logs")
    run = report.torchrec
    assert {t.sharding_type for t in run.tables} == {"table_wise", "table_column_wise"}
    assert run.model.startswith("concat-MLP") and run.outputs_equal
    assert all(r.max_abs_diff is not None and r.max_abs_diff <= 1e-5 for r in run.per_rank)
    assert report.runner is None and len(report.modelled.per_device) == 2


#: Our plan with a replicated table: a on both ranks (data_parallel, dense), b and c whole.
REPLICATED_PLAN = Plan((Placement.split("a", ShardingKind.DATA_PARALLEL,
                                        (Shard(0, 0, 120, 0, 16, 120),
                                         Shard(1, 0, 120, 0, 16, 120))),
                        Placement("b", 0, 60), Placement("c", 1, 200)),
                       "hand", Workload(64), "2xH100-80GB")


@pytest.mark.slow
def test_our_replicated_plan_runs_in_dmp_with_equal_outputs_and_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, err = run_cli(["run-plan", *files(tmp_path, REPLICATED_PLAN, TABLES),
                                 "--engine", "torchrec", "--compare-runner", "--iterations",
                                 "3", "--warmup", "1", "--device", "cpu", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(stdout)
    run = doc["torchrec"]
    assert doc["outputs_equal"] is True
    kinds = {t["table"]: (t["sharding_type"], t["kernel"]) for t in run["tables"]}
    assert kinds["a"] == ("data_parallel", "dense")
    # Both ranks hold the replica; each trained the planned steps with equal outputs.
    assert [sorted(r["tables"]) for r in run["per_rank"]] == [["a", "b"], ["a", "c"]]
    assert all(r["outputs_equal"] and r["steps"] == 3 for r in run["per_rank"])
    assert doc["runner"]["backend"] == "gloo"


@pytest.mark.slow
def test_a_hand_built_data_parallel_plan_runs_with_equal_outputs(tmp_path: Path) -> None:
    from torchrec.distributed.sharding_plan import (
        construct_module_sharding_plan,
        data_parallel,
        table_wise,
    )
    from torchrec.distributed.types import ShardingPlan

    from autoshard.torchrec.dmp import run_tables, table_runs
    from autoshard.torchrec.export import meta_collection

    ebc = meta_collection([(t.name, t.rows, t.dim, "FP32") for t in TABLES])
    module_plan = construct_module_sharding_plan(
        ebc, {"a": data_parallel(), "b": table_wise(rank=0, compute_kernel="fused"),
              "c": table_wise(rank=1, compute_kernel="fused")},
        local_size=2, world_size=2, device_type="cpu")
    runs = table_runs(ShardingPlan({"": module_plan}))
    assert (runs[0].sharding_type, runs[0].kernel, runs[0].shards) == ("data_parallel", "dense",
                                                                       ())
    run = run_tables(runs, TABLES, settings(), 2, tmp_path / "logs")
    assert run.outputs_equal and run.tables[0].kernel == "dense"
    assert [r.tables for r in run.per_rank] == [("a", "b"), ("a", "c")]


USER_MODEL = '''
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection


def _ebc(specs):
    return EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=f)
        for n, r, d, f in specs])


class TwoTowers(torch.nn.Module):
    def __init__(self, b_dim=16):
        super().__init__()
        self.user = _ebc([("a", 120, 16, ["a_click", "a_view"])])
        self.item = _ebc([("b", 60, b_dim, ["b"]), ("c", 200, 16, ["c"])])
        self.head = torch.nn.Linear(16, 1)


def make():
    return TwoTowers()


def wrong_size():
    return TwoTowers(b_dim=8)
'''


@pytest.mark.slow
def test_a_user_model_runs_with_its_tables_matched_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoshard.torchrec.dmp import run_plan_in_dmp

    (tmp_path / "dmp_user_towers.py").write_text(USER_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(InputError, match="'b' is 60 x 8 in the model, 60 x 16 in the plan"):
        run_plan_in_dmp(PLAN, task(), settings(model="dmp_user_towers:wrong_size"))
    with pytest.raises(InputError, match="has no function 'nothing'"):
        run_plan_in_dmp(PLAN, task(), settings(model="dmp_user_towers:nothing"))
    report = run_plan_in_dmp(PLAN, task(), settings(model="dmp_user_towers:make"),
                             logs=tmp_path / "logs")
    run = report.torchrec
    assert run.model == "dmp_user_towers:make (TwoTowers)" and run.outputs_equal
    # a's two features, b and c, on each of 4 batches, per rank; no logits for a user model.
    assert [r.outputs_checked for r in run.per_rank] == [16, 16]
    assert all(r.logits_max_abs_diff is None and r.step_ms > 0 for r in run.per_rank)


@pytest.mark.slow
def test_a_failing_rank_is_named_and_every_rank_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoshard.torchrec.dmp import run_plan_in_dmp

    monkeypatch.setenv(FAULT_ENV, "1:exit")
    with pytest.raises(RunError, match="rank 1 exited with code 3 at 'checked'"):
        run_plan_in_dmp(PLAN, task(), settings(), logs=tmp_path / "logs")


@pytest.mark.filterwarnings("ignore:`broadcast_buffers` is deprecated:FutureWarning")
def test_the_output_check_sees_a_wrong_weight() -> None:
    """In this process, one rank: equal after the weights are copied, different after one
    sharded weight is changed."""
    import torch
    import torch.distributed as dist

    from autoshard.runner.launch import free_port
    from autoshard.torchrec import dmp_worker as w
    from autoshard.torchrec.dmp import TOLERANCE
    from autoshard.torchrec.dmp_model import BUILTIN_PATH, dense_batch, feature_batches

    cpu = torch.device("cpu")
    config = RunConfig(batch_size=16, iterations=1, warmup=0, device="cpu")
    spec = {"config": config.to_dict(), "model": None, "world_size": 1,
            "runs": [{"table": t.name, "sharding_type": "table_wise", "kernel": "fused",
                      "cache_load_factor": None, "ranks": [0],
                      "shards": [[0, 0, t.rows, t.dim, 0]]} for t in TABLES]}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        reference, to_shard = w.build_models(spec, list(TABLES), cpu)
        paths = dict.fromkeys((t.name for t in TABLES), BUILTIN_PATH)
        dmp = w.shard_model(to_shard, w.sharding_plan(spec, paths, "cpu", 1), cpu, 0.01)
        assert w.copy_weights(dmp, reference) > 3
        keys = {BUILTIN_PATH: [t.name for t in TABLES]}
        batches = feature_batches(spec, list(TABLES), {t.name: [t.name] for t in TABLES}, 0)
        inputs = [({BUILTIN_PATH: w.to_kjt(b, keys[BUILTIN_PATH], cpu)},
                   dense_batch(0, 0, i, 16, cpu)) for i, b in enumerate(batches)]
        assert w.compare_outputs(dmp, reference, keys, inputs, True, TOLERANCE)["equal"]
        weight = dmp.state_dict()[f"{BUILTIN_PATH}.embedding_bags.a.weight"]
        with torch.no_grad():
            weight.local_shards()[0].tensor.add_(1.0)
        check = w.compare_outputs(dmp, reference, keys, inputs, True, TOLERANCE)
        assert not check["equal"] and check["max_abs_diff"] >= 1.0
    finally:
        dist.destroy_process_group()


def test_logits_of_the_concat_model_match_whatever_order_the_sharded_outputs_come_in(
        ) -> None:
    """In this process, one rank: tables of several dims (the concat-MLP model), b in column
    blocks, a and c whole. The sharded collection returns its features grouped by sharding
    (a, c, then b), the unsharded in table order; the model concatenates them in its own
    order, so the logits are equal, and each check has its own verdict."""
    import torch
    import torch.distributed as dist

    from autoshard.runner.launch import free_port
    from autoshard.torchrec import dmp_worker as w
    from autoshard.torchrec.dmp import TOLERANCE
    from autoshard.torchrec.dmp_model import BUILTIN_PATH, dense_batch, feature_batches

    cpu = torch.device("cpu")
    config = RunConfig(batch_size=16, iterations=1, warmup=0, device="cpu")
    whole = {"sharding_type": "table_wise", "kernel": "fused", "cache_load_factor": None,
             "ranks": [0]}
    spec = {"config": config.to_dict(), "model": None, "world_size": 1, "runs": [
        dict(whole, table="a", shards=[[0, 0, 120, 8, 0]]),
        {"table": "b", "sharding_type": "column_wise", "kernel": "fused",
         "cache_load_factor": None, "ranks": [0, 0],
         "shards": [[0, 0, 60, 8, 0], [0, 8, 60, 8, 0]]},
        dict(whole, table="c", shards=[[0, 0, 200, 8, 0]])]}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        reference, to_shard = w.build_models(spec, list(MIXED), cpu)
        paths = dict.fromkeys((t.name for t in MIXED), BUILTIN_PATH)
        dmp = w.shard_model(to_shard, w.sharding_plan(spec, paths, "cpu", 1), cpu, 0.01)
        w.copy_weights(dmp, reference)
        keys = {BUILTIN_PATH: [t.name for t in MIXED]}
        batches = feature_batches(spec, list(MIXED), {t.name: [t.name] for t in MIXED}, 0)
        inputs = [({BUILTIN_PATH: w.to_kjt(b, keys[BUILTIN_PATH], cpu)},
                   dense_batch(0, 0, i, 16, cpu)) for i, b in enumerate(batches)]
        sharded = w._wait(dmp.module.get_submodule(BUILTIN_PATH)(inputs[0][0][BUILTIN_PATH]))
        assert sharded.keys() != ["a", "b", "c"]  # another order than the unsharded one's
        check = w.compare_outputs(dmp, reference, keys, inputs, True, TOLERANCE)
        assert check["pooled_equal"] and check["logits_equal"] and check["equal"]
        assert check["logits_max_abs_diff"] <= 1e-5
        with torch.no_grad():  # one sharded weight changed: both checks see it
            dmp.state_dict()[f"{BUILTIN_PATH}.embedding_bags.a.weight"].local_shards()[
                0].tensor.add_(1.0)
        check = w.compare_outputs(dmp, reference, keys, inputs, True, TOLERANCE)
        assert check["pooled_equal"] is False and check["logits_equal"] is False
    finally:
        dist.destroy_process_group()


def test_outputs_that_differ_end_the_command_with_exit_1_after_the_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from autoshard.pricing.cost import load_cost_model
    from autoshard.pricing.evaluator import evaluate
    from autoshard.torchrec import dmp

    bad = dmp.RankFigures(0, ("a", "b"), 2.0, 1.0, 3, False, 8, 0.25, 0.5, "host:cpu", False)
    good = dmp.RankFigures(1, ("b", "c"), 2.5, 1.0, 3, True, 8, 0.0, 0.0, "host:cpu", True)
    run = dmp.DmpRun("torchrec.models.dlrm.DLRM", "gloo", "cpu", 64, 32, "train", 3, 1, (),
                     (bad, good), ())
    report = dmp.DmpReport("hand", run, evaluate(PLAN, task(), load_cost_model("analytical")))
    monkeypatch.setattr(dmp, "run_plan_in_dmp", lambda *args, **kwargs: report)
    out = tmp_path / "report.json"
    code, stdout, err = run_cli(["run-plan", *files(tmp_path, PLAN, TABLES), "--engine",
                                 "torchrec", "-o", str(out)], capsys)
    assert code == 1 and "pooled embeddings differ from the unsharded model's on rank(s) [0]" \
        in err and "logits differ from the unsharded model's on rank(s) [0]" in err
    assert "pooled embeddings DIFFERENT" in stdout and "2.500 ms" in stdout
    doc = json.loads(out.read_text())
    assert doc["outputs_equal"] is False and doc["step_ms"] == 2.5 and doc["runner"] is None


def test_each_rank_feeds_its_share_of_the_lookups_our_runner_draws(tmp_path: Path) -> None:
    import numpy as np

    from autoshard.runner.data import synthetic_batch
    from autoshard.stats.readers.dlrm import save_trace
    from autoshard.torchrec.dmp_model import HASH_SEED, feature_batches

    features = {t.name: [t.name] for t in TABLES}
    spec = {"config": RunConfig(batch_size=64, seed=3, distinct_batches=2).to_dict(),
            "world_size": 2}
    ranks = [feature_batches(spec, list(TABLES), features, r) for r in (0, 1)]
    for position, t in enumerate(TABLES):
        rng = np.random.default_rng([3, position])
        hashed = np.random.default_rng([HASH_SEED, position]).permutation(t.rows)
        for i in range(2):
            drawn = synthetic_batch(t, 64, rng)
            ids = np.concatenate([ranks[r][i][t.name][0] for r in (0, 1)])
            lengths = np.concatenate([ranks[r][i][t.name][1] for r in (0, 1)])
            assert [len(ranks[r][i][t.name][1]) for r in (0, 1)] == [32, 32]
            assert (lengths == drawn.lengths).all() and (ids == hashed[drawn.indices]).all()
    lengths = np.random.default_rng(5).integers(0, 4, size=(3, 32))
    indices = np.concatenate([np.arange(lengths[k].sum()) % TABLES[k].rows for k in range(3)])
    save_trace(tmp_path / "trace.pt", indices, np.concatenate(([0], np.cumsum(lengths))),
               lengths)
    spec["config"] = RunConfig(batch_size=16, trace=str(tmp_path / "trace.pt")).to_dict()
    got = [feature_batches(spec, list(TABLES), features, r) for r in (0, 1)]
    assert len(got[0]) == 2  # 32 samples: two batches of 16, whatever was asked
    for k, t in enumerate(TABLES):
        for i in range(2):
            per_rank = [got[r][i][t.name][1] for r in (0, 1)]
            assert (np.concatenate(per_rank) == lengths[k, 16 * i:16 * (i + 1)]).all()


# --- checks before anything runs ----------------------------------------------------------------

def test_row_wise_plans_match_torchrecs_own_plans_and_pass_its_checks() -> None:
    from torchrec.distributed.sharding_plan import (
        construct_module_sharding_plan,
        row_wise,
        table_row_wise,
        table_wise,
    )

    from autoshard.torchrec.export import (
        check_sharding_plan,
        export_doc,
        load_sharding_plan,
        meta_collection,
    )

    ebc = meta_collection([(t.name, t.rows, t.dim, "FP32") for t in TABLES])
    ours = load_sharding_plan(export_doc(ROW_SPLITS, task())).get_plan_for_module("")
    theirs = construct_module_sharding_plan(
        ebc, {"a": table_wise(rank=0), "b": row_wise(), "c": table_row_wise(host_index=0)},
        local_size=2, world_size=2, device_type="cuda")

    def layout(ps: Any) -> tuple[Any, ...]:
        return (ps.sharding_type, list(ps.ranks), [
            (list(m.shard_offsets), list(m.shard_sizes), str(m.placement))
            for m in ps.sharding_spec.shards])

    assert {n: layout(p) for n, p in ours.items()} == {n: layout(p) for n, p in theirs.items()}
    check_sharding_plan(load_sharding_plan(export_doc(ROW_SPLITS, task())), ebc, 2, 2)


def test_row_wise_plans_are_refused_on_cpu_before_any_process_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from autoshard.runner import launch
    from autoshard.torchrec.dmp import fit_to_device, plan_runs

    runs = plan_runs(ROW_SPLITS, task())
    assert [r.table for r in fit_to_device(runs, "cuda")[0]] == ["a", "b", "c"]
    with pytest.raises(InputError, match=r"2 table\(s\) \(b, c\) are sharded row_wise / "
                                         r"table_row_wise, which TorchRec offers on CUDA only"):
        fit_to_device(runs, "cpu")

    def no_launch(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("launched")

    monkeypatch.setattr(launch, "launch_local", no_launch)
    out = tmp_path / "report.json"
    code, _, err = run_cli(["run-plan", *files(tmp_path, ROW_SPLITS, TABLES), "--engine",
                            "torchrec", "--device", "cpu", "-o", str(out)], capsys)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "on CUDA only (on cpu: data_parallel, table_wise" in err and not out.exists()


@pytest.mark.parametrize(("plan", "extra", "message"), [
    (PLAN, ["--batch-size", "63"], "multiple of the plan's 2 devices"),
    (Plan((Placement("a", 0, 120), Placement.split("b", COLUMNS, (
        Shard(0, 0, 60, 0, 6, 60), Shard(1, 0, 60, 6, 16, 60))), Placement("c", 1, 0)),
        "hand", Workload(64), "2xH100-80GB"), [], "has 6 columns; TorchRec's fused kernels "
     "need a multiple of 4"),
    (PLAN, ["--torchrec-model", "nocolon"], "expected MODULE:FACTORY"),
])
def test_plans_torchrec_cannot_run_are_refused_naming_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], plan: Plan, extra: list[str],
        message: str) -> None:
    code, _, err = run_cli(["run-plan", *files(tmp_path, plan, TABLES), "--engine",
                            "torchrec", "--device", "cpu", *extra], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("option", [["--compare-runner"], ["--node-columns"],
                                    ["--torchrec-model", "m:f"]])
def test_torchrec_options_need_the_torchrec_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str]) -> None:
    code, _, err = run_cli(["run-plan", *files(tmp_path, PLAN, TABLES), *option], capsys)
    assert code == 2 and f"'{option[0]}'" in err and "only with --engine torchrec" in err


@pytest.mark.parametrize(("option", "value"), [("--iterations", "0"), ("--warmup", "-1"),
                                               ("--timeout", "nan"), ("--seed", "-1"),
                                               ("--engine", "jax")])
def test_run_plan_options_out_of_range_exit_2_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    out = tmp_path / "report.json"
    engine = [] if option == "--engine" else ["--engine", "torchrec"]
    code, _, err = run_cli(["run-plan", *files(tmp_path, PLAN, TABLES), *engine, option, value,
                            "-o", str(out)], capsys)
    assert code == 2 and option in err and not out.exists(), err
