"""The `ppo` sharder: registry, safe loading, deterministic plans, one policy call per table."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoshard.analytical import AnalyticalCostModel
from autoshard.errors import InputError
from autoshard.evaluator import evaluate
from autoshard.sharders import get_sharder, sharder_info
from autoshard.sharders import ppo as ppo_module
from autoshard.sharders.ppo import DEFAULT_POLICY, PPOSharder
from autoshard.workloads import constrained_task, dlrm_tables
from envs.buckets import MULTIPLIERS, N_BUCKETS
from training.evaluation import GREEDY, eval_tasks
from training.policy import PlacementNet, save_policy

MODEL = AnalyticalCostModel()


@pytest.fixture
def untrained(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    save_policy(PlacementNet(N_BUCKETS, hidden=16), tmp_path / "policy", MULTIPLIERS)
    return tmp_path / "policy"


def test_unavailable_explains_a_missing_policy(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ppo_module, "DEFAULT_POLICY", tmp_path / "absent")
    reason = PPOSharder.unavailable()
    assert reason is not None and "no trained policy" in reason and "absent" in reason
    assert sharder_info("ppo").unavailable == reason
    with pytest.raises(InputError, match="no trained policy"):
        PPOSharder(policy=tmp_path / "absent").shard(
            constrained_task(dlrm_tables(3), 2), MODEL)


def test_plans_are_valid_deterministic_and_one_call_per_table(untrained: Path) -> None:
    task = constrained_task(dlrm_tables(30, seed=4), 3, hbm_fraction=0.4)
    sharder = PPOSharder(policy=untrained)
    first = sharder.shard(task, MODEL)
    report = evaluate(first, task, MODEL)  # raises if invalid or over capacity
    assert report.sharder == "ppo" and report.cost_ratio >= 1.0
    assert PPOSharder(policy=untrained).shard(task, MODEL) == first
    calls = []
    net = sharder._net
    handle = net.register_forward_hook(lambda *_: calls.append(1))
    try:
        sharder.shard(task, MODEL)
    finally:
        handle.remove()
    assert len(calls) == task.num_tables


def test_plans_a_cluster_larger_than_any_in_training(untrained: Path) -> None:
    task = constrained_task(dlrm_tables(120, seed=5), 24, hbm_fraction=0.5)
    plan = PPOSharder(policy=untrained).shard(task, MODEL)
    report = evaluate(plan, task, MODEL)  # valid and within every capacity
    assert len(report.per_device) == 24 and report.cost_ratio >= 1.0


@pytest.mark.skipif(PPOSharder.unavailable() is not None,
                    reason=f"no committed policy at {DEFAULT_POLICY}")
def test_committed_policy_beats_the_best_greedy_on_held_out_tables() -> None:
    items = eval_tasks((60,), (4, 8), hbm_fraction=0.5)
    ppo = get_sharder("ppo")
    for item in items:
        ratio = evaluate(ppo.shard(item.task, MODEL), item.task, MODEL).cost_ratio
        greedy = min(evaluate(get_sharder(g).shard(item.task, MODEL), item.task,
                              MODEL).cost_ratio for g in GREEDY)
        assert ratio < greedy, item.name
