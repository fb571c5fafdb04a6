"""Measured plan execution: lookups, kernels, the all-to-all layout, and 2-rank gloo runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from autoshard.cli import main
from autoshard.errors import InputError
from autoshard.hardware import load_hardware
from autoshard.layout.plan import Placement, Plan, Shard
from autoshard.pricing.cost import load_cost_model
from autoshard.pricing.evaluator import CostReport, evaluate
from autoshard.runner import FAULT_ENV, MeasuredReport, RunConfig, RunError, run_plan
from autoshard.runner.config import ShardTable
from autoshard.runner.data import (
    TableBatch,
    rank_rows,
    shard_lookups,
    split_tier,
    synthetic_batch,
)
from autoshard.runner.exchange import Assembly, sample_blocks
from autoshard.runner.kernels import TierTable, TorchTier, rowwise_adagrad
from autoshard.tables import Table, save_tables
from autoshard.task import ShardingTask, Workload

TABLES = (
    Table("a", 120, 8, pooling_factor=3.0, zipf_alpha=1.0),
    Table("b", 60, 4, pooling_factor=2.0, coverage=0.5),
    Table("c", 200, 16, pooling_factor=1.5, zipf_alpha=0.8),
)
# a alone on rank 0, all in HBM; b (10 hot rows) and c (all in host memory) on rank 1.
PLAN = Plan((Placement("a", 0, 120), Placement("b", 1, 10), Placement("c", 1, 0)), "hand",
            Workload(64), "2xH100-80GB")


def task(batch: int = 64) -> ShardingTask:
    return ShardingTask(TABLES, load_hardware("8xH100-80GB", devices=2), Workload(batch))


def workers_of(folder: Path) -> dict[int, int]:
    """Rank -> pid of the live worker processes whose spec lies under ``folder``."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (proc / "stat").read_text().split()[2]
        except OSError:
            continue
        if "autoshard.runner.worker" in cmd and str(folder) in cmd[-3] and state != "Z":
            found[int(cmd[-2])] = int(proc.name)
    return found


# --- lookups -----------------------------------------------------------------------------------

def test_synthetic_batch_follows_table_statistics() -> None:
    rng = np.random.default_rng(0)
    t = Table("z", 1000, 4, pooling_factor=4.0, coverage=0.5, zipf_alpha=1.0)
    b = synthetic_batch(t, 4000, rng)
    assert b.lengths.shape == (4000,) and b.indices.size == b.lengths.sum()
    assert b.indices.min() >= 0 and b.indices.max() < 1000
    assert b.lengths.mean() == pytest.approx(t.lookups_per_sample, rel=0.05)
    assert np.mean(b.lengths == 0) == pytest.approx(0.5, abs=0.03)
    hot = np.mean(b.indices < 10)  # hottest 1% of rows
    assert hot == pytest.approx(float(t.access_curve().share_at(0.01)), abs=0.03)


def test_uniform_table_touches_only_used_rows() -> None:
    t = Table("u", 100, 4, pooling_factor=2.0, rows_used=20)
    b = synthetic_batch(t, 500, np.random.default_rng(1))
    assert b.indices.max() < 20 and len(np.unique(b.indices)) == 20


def test_split_tier_by_row_range() -> None:
    batch = TableBatch(np.array([0, 5, 1, 7, 2, 6]), np.array([2, 0, 1, 3]))
    hot = split_tier(batch, 0, 3)
    cold = split_tier(batch, 3, 8)
    assert hot.indices.tolist() == [0, 1, 2] and hot.offsets.tolist() == [0, 1, 1, 2, 3]
    assert hot.bags.tolist() == [0, 2, 3]
    assert cold.indices.tolist() == [2, 4, 3] and cold.offsets.tolist() == [0, 1, 1, 1, 3]


def test_rank_rows_puts_hottest_first() -> None:
    t = Table("r", 5, 2)
    ranked = rank_rows(TableBatch(np.array([4, 4, 4, 1, 1, 3]), np.array([6])), t)
    assert ranked.indices.tolist() == [0, 0, 0, 1, 1, 2]
    with pytest.raises(InputError, match="beyond table 'r'"):
        rank_rows(TableBatch(np.array([5]), np.array([1])), t)


def test_sample_blocks_split_the_batch() -> None:
    assert sample_blocks(10, 3) == [4, 3, 3]
    assert sum(sample_blocks(64, 2)) == 64


# --- kernels -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_rowwise_adagrad_by_hand() -> None:
    import torch

    w = torch.zeros(3, 2)
    state = torch.zeros(3)
    rowwise_adagrad(w, state, torch.tensor([1]), torch.tensor([[3.0, 4.0]]), lr=0.5)
    assert state.tolist() == [0.0, 12.5, 0.0]  # mean(9, 16)
    expect = -0.5 * np.array([3.0, 4.0]) / np.sqrt(12.5)
    assert np.allclose(w[1].numpy(), expect, atol=1e-6) and w[0].abs().sum() == 0


def test_torch_tier_pools_and_updates_touched_rows_only() -> None:
    import torch

    batch = TableBatch(np.array([0, 2, 2, 1]), np.array([3, 0, 1]))
    tiers = [TorchTier([TierTable(0, 4, 3)], "cpu", "cpu", 0.1, seed=7, staged=s)
             for s in (False, True)]
    before = tiers[0].weights[0].clone()
    outs = []
    for tier in tiers:
        prepared = tier.prepare([split_tier(batch, 0, 4)])
        (pooled,) = tier.forward(prepared)
        outs.append(pooled)
        tier.backward(prepared, [torch.ones_like(pooled)])
    w = before.numpy()
    assert np.allclose(outs[0].numpy(), [w[0] + 2 * w[2], np.zeros(3), w[1]], atol=1e-6)
    assert torch.allclose(outs[0], outs[1])
    after = tiers[0].weights[0]
    assert torch.equal(after[3], before[3])  # row 3 untouched
    assert not torch.equal(after[2], before[2])
    assert torch.allclose(tiers[0].weights[0], tiers[1].weights[0])


def test_fbgemm_tier_matches_torch_tier() -> None:
    pytest.importorskip("fbgemm_gpu", reason="FBGEMM (fbgemm-gpu-cpu) is not installed")
    import torch

    from autoshard.runner.kernels import FbgemmTier

    blocks = [TierTable(0, 6, 4), TierTable(1, 5, 8)]
    batches = [TableBatch(np.array([0, 5, 5, 2]), np.array([2, 2])),
               TableBatch(np.array([4, 1]), np.array([0, 2]))]
    inputs = [split_tier(b, 0, n) for b, n in zip(batches, (6, 5), strict=True)]
    ref = TorchTier(blocks, "cpu", "cpu", 0.1, seed=3)
    fb = FbgemmTier(blocks, "hbm", "cpu", 0.1, seed=3)
    for mine, theirs in zip(fb.op.split_embedding_weights(), ref.weights, strict=True):
        mine.copy_(theirs)
    fb_batch, ref_batch = fb.prepare(inputs), ref.prepare(inputs)
    got = fb.forward(fb_batch)
    want = ref.forward(ref_batch)
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-6)
    # The same row-wise Adagrad step; weights and accumulators read back alike (the check's).
    grads = [torch.linspace(-1, 1, w.numel()).view_as(w) for w in want]
    fb.backward(fb_batch, grads)
    ref.backward(ref_batch, grads)
    for mine, theirs in zip(fb.weights + fb.state, ref.weights + ref.state, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6)
    assert ref.state[0][5] > 0 and ref.state[0][1] == 0  # touched rows only


# --- 2-rank runs -------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_runs_a_plan_on_two_gloo_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    save_tables(tmp_path / "tables.json", TABLES)
    PLAN.save(tmp_path / "plan.json")
    out = tmp_path / "report.json"
    main(["run-plan", str(tmp_path / "plan.json"), "--tables", str(tmp_path / "tables.json"),
          "--devices", "2", "--iterations", "4", "--warmup", "1", "--timeout", "60",
          "--output", str(out), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text())
    measured, modelled = doc["measured"], doc["modelled"]
    assert measured["measured"] is True and measured["backend"] == "gloo"
    assert set(CostReport.__dataclass_fields__) <= set(MeasuredReport.__dataclass_fields__)
    ranks = measured["per_device"]
    # Each rank built exactly the tables the plan gives it, with the plan's HBM rows.
    assert [r["table_names"] for r in ranks] == [["a"], ["b", "c"]]
    assert [r["hbm_rows"] for r in ranks] == [[120], [10, 0]]
    assert ranks[0]["uvm_lookups"] == 0 and ranks[0]["host_bytes"] == 0
    assert ranks[1]["hbm_bytes"] == 10 * (4 * 4 + 4)  # 10 rows of b: weights + adagrad state
    for r in ranks:
        for key in ("lookup_ms", "comm_ms", "backward_optimizer_ms", "step_ms", "total_ms",
                    "compute_cpu_ms"):
            assert r[key] > 0, key
        assert r["total_ms"] <= r["step_ms"]
    assert measured["step_cost_ms"] == max(r["total_ms"] for r in ranks)
    # Synthetic lookups follow the statistics the model prices.
    for r, m in zip(ranks, modelled["per_device"], strict=True):
        assert r["lookups"] == pytest.approx(m["lookups"], rel=0.25)
    want = evaluate(PLAN, task(), load_cost_model("analytical"))
    assert modelled["step_cost_ms"] == pytest.approx(want.step_cost_ms)
    assert doc["ratio"]["step_cost"] == pytest.approx(
        measured["step_cost_ms"] / modelled["step_cost_ms"])


@pytest.mark.slow
def test_trace_lookups_reach_the_planned_tiers(tmp_path: Path) -> None:
    from autoshard.stats.readers.dlrm import save_trace

    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 4, size=(3, 32))
    rows = [t.rows for t in TABLES]
    indices = np.concatenate([rng.integers(0, rows[t], lengths[t].sum()) for t in range(3)])
    offsets = np.concatenate(([0], np.cumsum(lengths.reshape(-1))))
    save_trace(tmp_path / "trace.pt.gz", indices, offsets, lengths)
    config = RunConfig(batch_size=16, iterations=2, warmup=0, mode="infer",
                       trace=str(tmp_path / "trace.pt.gz"), timeout_s=60)
    result = run_plan(PLAN, task(16), config, logs=tmp_path / "logs")
    assert result is not None
    # Rank 1 holds b (10 hottest rows of 60 in HBM) and c (all 200 rows in host memory).
    starts = offsets[::32]
    b_ids = indices[starts[1]:starts[2]]
    counts = np.bincount(b_ids, minlength=60)
    hot = np.argsort(-counts, kind="stable")[:10]
    per_step_b = b_ids.size / 2  # the 32 samples make two batches of 16
    per_step_c = lengths[2].sum() / 2
    r1 = result.measured.per_device[1]
    assert r1.lookups == per_step_b + per_step_c
    assert r1.uvm_lookups == (b_ids.size - np.isin(b_ids, hot).sum()) / 2 + per_step_c
    assert result.measured.per_device[0].lookups == lengths[0].sum() / 2
    assert r1.backward_optimizer_ms == 0  # infer: forward and all-to-all only
    assert result.measured.lookups_from.endswith("trace.pt.gz")


def test_torchrun_launches_the_same_run(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.is_file():
        pytest.skip("torchrun is not installed next to this Python")
    save_tables(tmp_path / "tables.json", TABLES)
    PLAN.save(tmp_path / "plan.json")
    done = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "autoshard", "run-plan",
         str(tmp_path / "plan.json"), "--tables", str(tmp_path / "tables.json"), "--devices",
         "2", "--iterations", "2", "--warmup", "0", "--timeout", "60", "--json"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # rank 0 alone prints the report
    assert [r["table_names"] for r in doc["measured"]["per_device"]] == [["a"], ["b", "c"]]


def test_plan_for_more_devices_exits_2_before_launching(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_tables(tmp_path / "tables.json", TABLES)
    Plan((Placement("a", 0, 1), Placement("b", 2, 0), Placement("c", 1, 0))).save(
        tmp_path / "plan.json")
    with pytest.raises(SystemExit) as exit_info:
        main(["run-plan", str(tmp_path / "plan.json"), "--tables", str(tmp_path / "tables.json"),
              "--devices", "2", "--logs", str(tmp_path / "logs")])
    assert exit_info.value.code == 2
    assert "placements[1].device', value 2" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


def test_trace_with_other_table_count_is_refused(tmp_path: Path) -> None:
    from autoshard.stats.readers.dlrm import save_trace

    save_trace(tmp_path / "t.pt", np.array([1, 2]), np.array([0, 1, 2]), np.array([[1, 1]]))
    with pytest.raises(InputError, match="trace has 1 tables"):
        run_plan(PLAN, task(2), RunConfig(batch_size=2, trace=str(tmp_path / "t.pt")))


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["exit", "hang"])
def test_a_failed_rank_ends_the_run(fault: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, f"1:{fault}")
    config = RunConfig(batch_size=16, iterations=3, warmup=1, timeout_s=8)
    # The run ends by the failed rank's exit or by the run's own watchdog (its timeout), and
    # says which; it is not timed here.
    expected = ("rank 1 exited with code 3 at 'ready'" if fault == "exit"
                else "no progress for 8 s: .*rank 1 at 'ready'")
    with pytest.raises(RunError, match=expected):
        run_plan(PLAN, task(16), config, logs=tmp_path)
    assert workers_of(tmp_path) == {}


def _default_sigint() -> None:
    """In the child before it runs the command: SIGINT's default action, unblocked."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


#: Seconds after which a command still running is taken as hung (no duration is asserted: a
#: command that should have stopped is given far longer than any machine needs).
HANG_S = 300


@pytest.mark.slow
@pytest.mark.parametrize("action", ["ctrl-c", "kill rank 1"])
def test_interrupt_or_killed_rank_stops_every_rank(action: str, tmp_path: Path) -> None:
    save_tables(tmp_path / "tables.json", TABLES)
    PLAN.save(tmp_path / "plan.json")
    env = dict(os.environ, **{FAULT_ENV: "1:hang"})
    # Its stderr goes to a file, not a pipe: the test waits for the command, not for every
    # process that may hold a copy of the pipe. It starts with Ctrl-C's default action, as
    # from a terminal: a process started with SIGINT ignored keeps ignoring it, and a library
    # loaded by earlier tests may leave this one ignoring it while it runs a command.
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err_file:
        cli = subprocess.Popen(
            [sys.executable, "-m", "autoshard", "run-plan", str(tmp_path / "plan.json"),
             "--tables", str(tmp_path / "tables.json"), "--devices", "2", "--timeout", "60",
             "--logs", str(tmp_path / "logs")], env=env, stderr=err_file, text=True,
            preexec_fn=_default_sigint)

    def stages() -> list[str]:
        return [p.read_text() for p in sorted((tmp_path / "logs").glob("*/rank*.progress"))]

    # Rank 0 waits for the hung rank 1; a run that never gets there ends by its own watchdog
    # (--timeout), and then the command is no longer running.
    while stages()[:1] != ["step 0 (in a collective)"]:
        assert cli.poll() is None, err_path.read_text()
        time.sleep(0.1)
    workers = workers_of(tmp_path)
    assert sorted(workers) == [0, 1]
    if action == "ctrl-c":
        cli.send_signal(signal.SIGINT)
    else:
        os.kill(workers[1], signal.SIGKILL)
    try:  # every rank stopped within 2 x 3 s, then the command exits; the wait guards a hang
        cli.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        cli.kill()
        raise AssertionError(f"run-plan still running {HANG_S} s after the {action}; ranks "
                             f"at {stages()}; stderr: {err_path.read_text()}") from None
    err = err_path.read_text()
    if action == "ctrl-c":
        assert cli.returncode == 130, err
    else:
        assert cli.returncode == 2 and "rank 1 exited with code -9" in err, err
    assert workers_of(tmp_path) == {}


# a split row-wise over both ranks (hashed ids), c split into two column blocks, b whole.
SPLIT_PLAN = Plan((
    Placement.split("a", "row_wise", (Shard(1, 0, 70, 0, 8, 20), Shard(0, 70, 120, 0, 8, 50))),
    Placement("b", 1, 10),
    Placement.split("c", "column_wise", (Shard(0, 0, 200, 0, 8, 200),
                                         Shard(1, 0, 200, 8, 16, 0))),
), "hand", Workload(64), "2xH100-80GB")


def test_assembly_places_column_blocks_and_adds_row_partial_sums() -> None:
    import torch

    # Rank 0 sends [a rows 70-120 (dim 8) | c cols 0-8], rank 1 [a rows 0-70 | b | c cols 8-16].
    layout = [[ShardTable("a", 0, 50, 8, 0, 120, 8, 70, 0), ShardTable("c", 2, 200, 8, 0, 200,
                                                                       16, 0, 0)],
              [ShardTable("a", 0, 70, 8, 0, 120, 8, 0, 0), ShardTable("b", 1, 60, 4, 0),
               ShardTable("c", 2, 200, 8, 0, 200, 16, 0, 8)]]
    assembly = Assembly(layout)
    assert not assembly.identity and assembly.width == 8 + 4 + 16
    received = torch.arange(3 * 36, dtype=torch.float32).view(3, 36)
    out = assembly.forward(received)
    assert torch.equal(out[:, :8], received[:, 0:8] + received[:, 16:24])  # a: partial sums
    assert torch.equal(out[:, 8:12], received[:, 24:28])  # b whole
    assert torch.equal(out[:, 12:20], received[:, 8:16])  # c columns 0-8 from rank 0
    assert torch.equal(out[:, 20:28], received[:, 28:36])  # c columns 8-16 from rank 1
    grad = torch.randn(3, 28)
    back, replica_grad = assembly.backward(grad)
    assert torch.equal(back[:, 0:8], grad[:, :8]) and torch.equal(back[:, 16:24], grad[:, :8])
    assert torch.equal(back[:, 8:16], grad[:, 12:20])
    assert back.shape == (3, 36) and replica_grad.shape == (3, 0)
    whole = Assembly([[ShardTable("a", 0, 120, 8, 0)], [ShardTable("b", 1, 60, 4, 0)]])
    assert whole.identity
    # Whole tables received out of task order are put in task order.
    swapped = Assembly([[ShardTable("b", 1, 60, 4, 0)], [ShardTable("a", 0, 120, 8, 0)]])
    got = swapped.forward(received[:, :12])
    assert not swapped.identity and torch.equal(got, torch.cat([received[:, 4:12],
                                                                received[:, :4]], dim=1))


def test_row_shards_split_a_tables_lookups_by_hashed_id() -> None:
    table = TABLES[0]
    batch = synthetic_batch(table, 4000, np.random.default_rng(2))
    low = shard_lookups(batch, ShardTable("a", 0, 70, 8, 20, 120, 8, 0, 0))
    high = shard_lookups(batch, ShardTable("a", 0, 50, 8, 50, 120, 8, 70, 0))
    assert np.array_equal(low.lengths + high.lengths, batch.lengths)
    assert low.indices.max() < 70 and high.indices.max() < 50
    # Hashing spreads hot rows over both shards: each sees about its share of the lookups.
    share = low.indices.size / batch.indices.size
    assert 0.3 < share < 0.9
    # Within a shard, ids are renumbered hottest first.
    counts = np.bincount(low.indices, minlength=70)
    assert counts[:10].sum() > counts[-10:].sum()
    column = ShardTable("c", 2, 200, 8, 0, 200, 16, 0, 8)
    assert shard_lookups(batch, column) is batch


@pytest.mark.slow
def test_split_plan_runs_on_two_gloo_ranks(tmp_path: Path) -> None:
    config = RunConfig(batch_size=64, iterations=3, warmup=1, timeout_s=60)
    result = run_plan(SPLIT_PLAN, task(64), config, logs=tmp_path / "logs")
    assert result is not None
    ranks = result.measured.per_device
    assert [r.table_names for r in ranks] == [("a", "c"), ("a", "b", "c")]
    assert [r.hbm_rows for r in ranks] == [(50, 200), (20, 10, 0)]
    for r, m in zip(ranks, result.modelled.per_device, strict=True):
        assert r.comm_ms > 0 and r.backward_optimizer_ms > 0
        # Row shards see their share of a's lookups, column blocks all of c's, as modelled.
        assert r.lookups == pytest.approx(m.lookups, rel=0.3)
    want = evaluate(SPLIT_PLAN, task(64), load_cost_model("analytical"))
    assert result.modelled.step_cost_ms == pytest.approx(want.step_cost_ms)
