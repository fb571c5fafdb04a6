"""Replicated (data-parallel) tables in our runner: one replica per rank pooling the rank's own
samples, their gradients all-reduced; checked against one unsharded copy of the tables on 2 and 3
gloo ranks, and run end to end by ``autoshard run-plan``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from autoshard.cli import main
from autoshard.hardware import load_hardware
from autoshard.layout.kinds import REPLICATED, ShardingKind
from autoshard.layout.plan import Placement, Plan, Shard
from autoshard.pricing.cost import load_cost_model
from autoshard.runner import RunConfig, check_plan
from autoshard.runner.check import compare, reference, table_weights
from autoshard.runner.config import ShardTable
from autoshard.runner.data import TableBatch, own_samples
from autoshard.runner.exchange import Assembly, sample_blocks
from autoshard.runner.shard import rank_tables
from autoshard.tables import Table, save_tables
from autoshard.task import ShardingTask, Workload

TABLES = (
    Table("a", 120, 8, pooling_factor=3.0, zipf_alpha=1.0),
    Table("b", 60, 4, pooling_factor=2.0, coverage=0.5),
    Table("c", 200, 16, pooling_factor=1.5, zipf_alpha=0.8),
    Table("d", 150, 8, pooling_factor=2.5, zipf_alpha=1.1),
    Table("e", 40, 4, pooling_factor=1.0),
)
DIMS = {t.name: (i, t.rows, t.dim) for i, t in enumerate(TABLES)}
CONFIG = RunConfig(batch_size=48, iterations=2, warmup=1, timeout_s=60, distinct_batches=2)


def replicated(name: str, world: int) -> Placement:
    rows, dim = DIMS[name][1:]
    return Placement.split(name, REPLICATED, tuple(Shard(d, 0, rows, 0, dim, rows)
                                                   for d in range(world)))


def mixed_plan(world: int) -> Plan:
    """a and e replicated; b whole; c in two column blocks; d in row ranges. On 3 ranks, rank 1
    holds replicas only (nothing of its own goes through the all-to-all)."""
    last = world - 1
    rows_d = ((Shard(1, 0, 90, 0, 8, 30), Shard(0, 90, 150, 0, 8, 60)) if world == 2
              else (Shard(2, 0, 70, 0, 8, 70), Shard(0, 70, 150, 0, 8, 20)))
    return Plan((
        replicated("a", world),
        Placement("b", last, 10),
        Placement.split("c", ShardingKind.COLUMN_WISE, (Shard(0, 0, 200, 0, 8, 200),
                                                        Shard(last, 0, 200, 8, 16, 0))),
        Placement.split("d", ShardingKind.ROW_WISE, rows_d),
        replicated("e", world),
    ), "hand", Workload(CONFIG.batch_size), f"{world}xH100-80GB")


def table_wise(plan: Plan) -> Plan:
    """The plan with every replicated table placed whole on rank 0, all of it in HBM."""
    return Plan(tuple(Placement(p.table, 0, DIMS[p.table][1]) if p.sharding.replicated else p
                      for p in plan.placements), plan.sharder, plan.workload, plan.hardware)


def task(world: int, batch: int = CONFIG.batch_size) -> ShardingTask:
    return ShardingTask(TABLES, load_hardware("8xH100-80GB", devices=world), Workload(batch))


# --- layout and assembly -----------------------------------------------------------------------

def test_every_rank_holds_one_whole_replica_of_a_replicated_table() -> None:
    layout = [rank_tables(mixed_plan(3), DIMS, r) for r in range(3)]
    for pieces in layout:
        copies = [t for t in pieces if t.replica]
        assert [(t.name, t.rows, t.dim, t.hbm_rows) for t in copies] == [
            ("a", 120, 8, 120), ("e", 40, 4, 40)]
        assert all(not t.row_split and t.full_dim == t.dim for t in copies)
    assert [t.name for t in layout[1]] == ["a", "e"]  # replicas only
    assert not any(t.replica for t in rank_tables(table_wise(mixed_plan(3)), DIMS, 0))


def test_assembly_puts_replica_output_at_its_tables_columns() -> None:
    import torch

    # Received: rank 0 sends b (dim 4), rank 1 sends c (dim 16); the replicas a (8) and e (4).
    layout = [[ShardTable("b", 1, 60, 4, 0)], [ShardTable("c", 2, 200, 16, 0)]]
    copies = [ShardTable("a", 0, 120, 8, 120, replica=True),
              ShardTable("e", 4, 40, 4, 40, replica=True)]
    assembly = Assembly(layout, copies)
    assert not assembly.identity and assembly.width == 8 + 4 + 16 + 4
    received = torch.randn(5, 20)
    local = torch.randn(5, 12)
    out = assembly.forward(received, local)
    want = torch.cat([local[:, :8], received, local[:, 8:]], dim=1)  # a b c e, task order
    assert torch.equal(out, want)
    grad = torch.randn(5, 32)
    to_exchange, to_replicas = assembly.backward(grad)
    assert torch.equal(to_exchange, grad[:, 8:28])
    assert torch.equal(to_replicas, torch.cat([grad[:, :8], grad[:, 28:]], dim=1))
    in_order = Assembly([[ShardTable("b", 0, 60, 4, 0)]], [ShardTable("c", 1, 200, 16, 200,
                                                                      replica=True)])
    assert in_order.identity
    assert torch.equal(in_order.forward(received[:, :4], local), torch.cat(
        [received[:, :4], local], dim=1))


def test_own_samples_is_the_ranks_block_of_the_batch() -> None:
    batch = TableBatch(np.arange(9), np.array([2, 0, 3, 1, 3]))
    blocks = sample_blocks(5, 2)
    assert blocks == [3, 2]
    first, second = own_samples(batch, 0, 3), own_samples(batch, 3, 5)
    assert first.indices.tolist() == [0, 1, 2, 3, 4] and first.lengths.tolist() == [2, 0, 3]
    assert second.indices.tolist() == [5, 6, 7, 8] and second.lengths.tolist() == [1, 3]


# --- the check ---------------------------------------------------------------------------------

def replica_results(config: RunConfig) -> tuple[list[list[ShardTable]], list[dict]]:
    """Two ranks each holding a replica of table a, with the results a correct run returns."""
    tables = TABLES[:1]
    want = reference(tables, config, 2)
    layout = [[ShardTable("a", 0, 120, 8, 120, replica=True)] for _ in range(2)]
    edges = np.cumsum([0, *sample_blocks(config.batch_size, 2)])
    results = [{"rank": r, "features": [f[edges[r]:edges[r + 1]].tolist() for f in want.features],
                "weights": [want.weights[0].tolist()], "states": [want.states[0][0].tolist()]}
               for r in range(2)]
    return layout, results


def test_the_check_catches_replicas_that_drift_or_average_their_gradients() -> None:
    layout, results = replica_results(CONFIG)
    assert compare(results, layout, TABLES[:1], CONFIG).ok
    # Averaging instead of summing scales each accumulator by 1/world^2; Adagrad's step barely
    # changes, so only the accumulators tell.
    averaged = [dict(r, states=[(np.asarray(r["states"][0]) / 4).tolist()]) for r in results]
    check = compare(averaged, layout, TABLES[:1], CONFIG)
    assert not check.ok and check.state_diff == pytest.approx(0.75, rel=1e-3)
    drifted = [results[0], dict(results[1], weights=[(np.asarray(results[1]["weights"][0])
                                                      + 1e-3).tolist()])]
    check = compare(drifted, layout, TABLES[:1], CONFIG)
    assert not check.ok and check.replica_spread == pytest.approx(1e-3, rel=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_replicated_tables_train_as_one_unsharded_table(world: int, tmp_path: Path) -> None:
    plan = mixed_plan(world)
    check = check_plan(plan, task(world), CONFIG, logs=tmp_path)
    assert check.ok, check
    assert check.steps == 3 and set(check.weight_diff) == {t.name for t in TABLES}
    # The weights moved: the check compares trained weights, not the initial ones.
    for position, t in enumerate(TABLES):
        start = table_weights(CONFIG.seed, position, t.rows, t.dim).numpy()
        assert np.abs(check.weights[t.name] - start).max() > 1e-3
    if world == 3:  # the same plan with the replicated tables whole gives the same results
        whole = check_plan(table_wise(plan), task(world), CONFIG, logs=tmp_path)
        assert whole.ok, whole
        for got, want in zip(check.features, whole.features, strict=True):
            np.testing.assert_allclose(got, want, atol=1e-6)
        for name in check.weights:
            np.testing.assert_allclose(check.weights[name], whole.weights[name], atol=1e-6)


# --- run-plan ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_run_plan_reports_replicas_honestly(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    save_tables(tmp_path / "tables.json", TABLES)
    plan = mixed_plan(3)
    plan.save(tmp_path / "plan.json")
    main(["run-plan", str(tmp_path / "plan.json"), "--tables", str(tmp_path / "tables.json"),
          "--devices", "3", "--batch-size", "48", "--iterations", "3", "--warmup", "1",
          "--timeout", "60", "--json"])
    doc = json.loads(capsys.readouterr().out)
    ranks, modelled = doc["measured"]["per_device"], doc["modelled"]["per_device"]
    assert [r["table_names"] for r in ranks] == [["a", "c", "d", "e"], ["a", "e"],
                                                 ["a", "b", "c", "d", "e"]]
    for r, m in zip(ranks, modelled, strict=True):
        assert r["replicas"] == ["a", "e"]
        # The all-reduce is reported alone and counted in comm (every rank takes part in the
        # all-to-all too, rank 1 only receiving).
        assert 0 < r["allreduce_ms"] < r["comm_ms"] and r["backward_optimizer_ms"] > 0
        # Replicas' weights and accumulators sit in HBM, as the plan's memory counts them.
        assert r["hbm_bytes"] == m["hbm_bytes"]
        # A replica looks up its rank's own samples only, as the model prices it.
        assert r["lookups"] == pytest.approx(m["lookups"], rel=0.35)
    # Rank 1 holds replicas only: all its lookups are theirs, on its 16 samples.
    a, e = TABLES[0], TABLES[4]
    assert ranks[1]["lookups"] == pytest.approx(16 * (a.lookups_per_sample
                                                      + e.lookups_per_sample), rel=0.35)


@pytest.mark.slow
def test_run_plan_runs_recshards_replicated_plan_on_16_ranks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autoshard.sharders import get_sharder

    tables = (*(Table(f"t{i}", 20 + 7 * i, 128, pooling_factor=2.0) for i in range(12)),
              Table("big", 5000, 16, pooling_factor=4.0))
    planned = ShardingTask(tables, load_hardware("8xH100-80GB", devices=16, nodes=2),
                           Workload(65536))
    plan = get_sharder("recshard").shard(planned, load_cost_model("analytical"))
    copies = {p.table for p in plan.placements if p.sharding.replicated}
    assert copies and len(copies) < len(tables)
    save_tables(tmp_path / "tables.json", tables)
    plan.save(tmp_path / "plan.json")
    main(["run-plan", str(tmp_path / "plan.json"), "--tables", str(tmp_path / "tables.json"),
          "--devices", "16", "--nodes", "2", "--batch-size", "64", "--iterations", "1",
          "--warmup", "0", "--timeout", "120", "--json"])
    ranks = json.loads(capsys.readouterr().out)["measured"]["per_device"]
    assert len(ranks) == 16
    assert all(set(r["replicas"]) == copies and r["allreduce_ms"] > 0 for r in ranks)
