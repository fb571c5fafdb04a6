"""The `ppo` sharder: registry, safe loading, deterministic plans, one policy call per table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from autoshard.errors import InputError, PlannerError
from autoshard.layout.plan import Plan
from autoshard.layout.shards import check_layout
from autoshard.policy.buckets import MULTIPLIERS, N_BUCKETS
from autoshard.policy.network import PlacementNet, save_policy
from autoshard.policy.refill import MODES
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.bounds import lower_bound_ms
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders import get_sharder, sharder_info
from autoshard.sharders.ppo import DEFAULT_POLICY, PPOSharder, tuning
from autoshard.sharders.ppo import sharder as ppo_module
from autoshard.sharders.ppo.candidates import TUNED_SUFFIX, Candidate
from autoshard.sharders.ppo.portfolio import refined_starts
from autoshard.tables import Table
from autoshard.task import ShardingTask
from autoshard.training.evaluation import GREEDY, eval_tasks
from autoshard.workloads import constrained_task, dlrm_tables

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


@pytest.mark.parametrize("samples", [0, 3])
def test_plans_are_valid_deterministic_and_one_batched_call_per_table(untrained: Path,
                                                                      samples: int) -> None:
    task = constrained_task(dlrm_tables(30, seed=4), 3, hbm_fraction=0.4)
    sharder = PPOSharder(policy=untrained, samples=samples, candidates=False, split=False,
                         polish=False)
    first = sharder.shard(task, MODEL)
    report = evaluate(first, task, MODEL)  # raises if invalid or over capacity
    assert report.sharder == "ppo" and report.cost_ratio >= 1.0
    assert PPOSharder(policy=untrained, samples=samples, candidates=False, split=False,
                      polish=False).shard(task, MODEL) == first
    calls: list[int] = []
    net = sharder._net
    handle = net.register_forward_hook(lambda _m, args, _o: calls.append(args[0].shape[0]))
    try:
        sharder.shard(task, MODEL)
    finally:
        handle.remove()
    # greedy + samples, one batch per table, in each of the three refill modes
    assert calls == [1 + samples] * task.num_tables * len(MODES)
    one = PPOSharder(policy=untrained, samples=samples, candidates=False, split=False,
                     polish=False, refills=False)
    calls.clear()
    handle = one._net.register_forward_hook(lambda _m, args, _o: calls.append(args[0].shape[0]))
    try:
        one.shard(task, MODEL)
    finally:
        handle.remove()
    assert calls == [1 + samples] * task.num_tables  # the policy's own mode alone


def test_best_of_candidates_is_never_behind_any_candidate(untrained: Path) -> None:
    task = constrained_task(dlrm_tables(40, seed=7), 4, hbm_fraction=0.3)
    alone = PPOSharder(policy=untrained, samples=0, candidates=False, polish=False)
    best = PPOSharder(policy=untrained, samples=4, candidates=True)
    sharded = best.solve(task, MODEL)
    ratio = evaluate(sharded.plan, task, MODEL).step_cost_ms
    choice = sharded.details
    assert set(GREEDY) <= set(choice.costs)
    assert {f"ppo-sample-{i}" for i in range(4)} | {"ppo-greedy"} <= set(choice.costs)
    assert ratio == pytest.approx(choice.costs[choice.winner], rel=1e-9)
    assert ratio == pytest.approx(min(choice.costs.values()), rel=1e-9)
    own = evaluate(alone.shard(task, MODEL), task, MODEL).step_cost_ms
    # The policy alone: the cheapest of its greedy decodes (whole tables, and shards or
    # replicas where the split choice offers them).
    decodes = [c for n, c in choice.costs.items() if n.startswith("ppo") and n.endswith("-greedy")]
    assert own == pytest.approx(min(decodes), rel=1e-9)
    for name in GREEDY:
        greedy = evaluate(get_sharder(name).shard(task, MODEL), task, MODEL).step_cost_ms
        assert ratio <= greedy * (1 + 1e-9)


@pytest.mark.slow
def test_plans_a_cluster_larger_than_any_in_training(untrained: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    task = constrained_task(dlrm_tables(120, seed=5), 24, hbm_fraction=0.5)
    monkeypatch.setattr(tuning, "MIN_RESOLVE_S", float("inf"))  # the policy's part, not the LNS
    plan = PPOSharder(policy=untrained).shard(task, MODEL)
    report = evaluate(plan, task, MODEL)  # valid and within every capacity
    assert len(report.per_device) == 24 and report.cost_ratio >= 1.0


@pytest.mark.slow
@pytest.mark.skipif(PPOSharder.unavailable() is not None,
                    reason=f"no committed policy at {DEFAULT_POLICY}")
def test_committed_policy_at_or_below_the_best_greedy_on_held_out_tables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    items = eval_tasks((60,), (4, 8), hbm_fraction=0.3, family="test")
    monkeypatch.setattr(tuning, "MIN_RESOLVE_S", float("inf"))  # no LNS: it can only lower ppo
    ppo = get_sharder("ppo")
    for item in items:
        ratio = evaluate(ppo.shard(item.task, MODEL), item.task, MODEL).cost_ratio
        greedy = min(evaluate(get_sharder(g).shard(item.task, MODEL), item.task,
                              MODEL).cost_ratio for g in GREEDY)
        assert ratio <= greedy * (1 + 1e-9), item.name


def test_the_sharder_and_its_policy_import_no_environment_or_training_code() -> None:
    import subprocess
    import sys

    code = ("import sys, autoshard.sharders.ppo, autoshard.policy.network; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('gymnasium', 'stable_baselines3') or m.split('.')[:2] in "
            "(['autoshard', 'envs'], ['autoshard', 'training'], ['autoshard', 'cost_models'])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def _dominated_task() -> ShardingTask:
    """Ten small tables and one whose lookups dwarf the rest, on 4 devices."""
    tables = (*dlrm_tables(10, seed=3),
              Table("huge", rows=2_000_000, dim=128, pooling_factor=100.0, zipf_alpha=1.05))
    return constrained_task(tables, 4, hbm_fraction=0.3)


def _whole_table_floor(task: ShardingTask) -> float:
    """No table-wise plan is cheaper: 'huge' alone on a device, as many of its rows in HBM as the
    device's whole HBM holds (its cheapest price on any device)."""
    t = task.index["huge"]
    devices = np.arange(task.num_devices)
    per_row = task.table_arrays.memory_bytes_per_row[t]
    rows = np.minimum(task.tables[t].rows, task.device_arrays.hbm_capacity // per_row)
    return float(MODEL.price(task, np.full(task.num_devices, t), devices, rows).total_ms.min())


@pytest.mark.skipif(PPOSharder.unavailable() is not None,
                    reason=f"no committed policy at {DEFAULT_POLICY}")
def test_policy_alone_splits_a_dominant_table_and_beats_every_whole_table_plan() -> None:
    task = _dominated_task()
    floor = _whole_table_floor(task)
    whole = PPOSharder(samples=0, candidates=False, split=False,
                         polish=False).shard(task, MODEL)
    assert not whole.is_split
    assert evaluate(whole, task, MODEL).step_cost_ms >= floor * (1 - 1e-9)
    alone = PPOSharder(samples=0, candidates=False, polish=False)
    sharded = alone.solve(task, MODEL)
    plan, choice = sharded.plan, sharded.details
    check_layout(plan, task)  # shards within their tables, every device within capacity
    assert "huge" in [p.table for p in plan.placements if p.is_split]
    # 11 tables on 4 devices: the finer split (fewer than 4 tables per device) is decoded too,
    # each in the policy's own refill mode and in the two others (no HBM room is kept: the
    # first policy alone).
    decodes = ("ppo", "ppo-choice", "ppo-split", "ppo-fine")
    assert set(choice.costs) == {f"{d}{s}-greedy" for d in decodes
                                 for s in ("", "-refill", "-level")}
    assert choice.winner.split("-greedy")[0].removesuffix("-refill").removesuffix(
        "-level") in decodes[1:]
    # The policy chose to split 'huge' itself: its choice decode beats every whole-table plan.
    assert choice.costs["ppo-choice-greedy"] < 0.5 * floor
    cost = evaluate(plan, task, MODEL).step_cost_ms
    assert cost == pytest.approx(choice.costs[choice.winner], rel=1e-9)
    assert cost < 0.5 * floor  # the whole-table plans: at least 16.1 ms; split: 4.5 ms
    assert cost >= lower_bound_ms(task, MODEL)


@pytest.mark.slow
def test_split_decodes_are_valid_candidates_and_only_the_main_ones_on_large_tasks(
        untrained: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = _dominated_task()
    best = PPOSharder(policy=untrained, samples=2)
    sharded = best.solve(task, MODEL)
    plan, choice = sharded.plan, sharded.details
    assert {"ppo-split-greedy", "ppo-split-sample-0", "ppo-split-sample-1",
            "ppo-choice-greedy", "ppo-choice-sample-0", "ppo-choice-sample-1",
            "split_lookup_greedy"} <= set(choice.costs)
    assert evaluate(plan, task, MODEL).step_cost_ms == pytest.approx(
        min(choice.costs.values()), rel=1e-9)
    for name in ("ppo-split-greedy", "ppo-split-sample-1", "ppo-choice-sample-1"):  # valid plans
        assert choice.costs[name] >= lower_bound_ms(task, MODEL)
    monkeypatch.setattr(tuning, "SMALL_TASK", task.num_tables * task.num_devices - 1)
    names = set(best.solve(task, MODEL).details.costs)
    # Large tasks: the policy's own choice over the main split choice, no whole-table decode
    # where tables dominate, and the fallback as the only rival, made only where the first
    # decode might not end in time (with a 60 s limit it would); the plain decode over the
    # split only where the choice decode made no plan.
    assert "ppo-choice-greedy" in names and "lookup_greedy" not in names
    assert not any(n.startswith(("ppo-greedy", "ppo-split", "ppo-node", "ppo-fine", "ppo-rows",
                                 "split_lookup_greedy", "size_greedy")) for n in names)
    monkeypatch.setattr(tuning, "FALLBACK_MARGIN", 1e9)  # as if it might not
    assert {"ppo-choice-greedy", "lookup_greedy"} <= set(best.solve(task, MODEL).details.costs)
    monkeypatch.setattr(PPOSharder, "_choose_splits", lambda *args: None)
    names = set(best.solve(task, MODEL).details.costs)
    assert {"ppo-split-greedy", "lookup_greedy"} <= names
    assert not any(n.startswith("ppo-choice") for n in names)
    monkeypatch.setattr(tuning, "FALLBACK_MARGIN", 2.0)

    def no_plan(*args: object) -> list[tuple[str, object]]:
        raise PlannerError("capacity", "some shard fits nowhere")

    monkeypatch.setattr(PPOSharder, "_decode_or_greedy", no_plan)
    sharded = best.solve(task, MODEL)  # no decode made a plan: the fallback is made after them
    plan = sharded.plan
    assert {n.split("+")[0] for n in sharded.details.costs} == {"lookup_greedy"}
    evaluate(plan, task, MODEL)  # a valid plan within every capacity


def test_large_tasks_on_several_nodes_are_offered_the_node_local_split() -> None:
    """The one split choice of a large task is the one ``recshard`` makes first there: with
    row shards kept on one node offered (on 16 devices of 8 per node it differs from the
    choice without them)."""
    from autoshard.layout.shards import same_split
    from autoshard.layout.splitting import split_heavy_tables
    from autoshard.policy.geometries import split_geometries

    task = constrained_task(_dominated_task().tables, 16, hbm_fraction=0.3)
    assert task.hardware.devices_per_node < task.num_devices
    local = split_heavy_tables(task, MODEL, node_local=True).geometry
    assert not same_split(local, split_heavy_tables(task, MODEL).geometry)
    (only,) = split_geometries(task, MODEL, variants=False).values()
    assert same_split(only, local)


def test_each_decode_keeps_its_devices_with_its_hbm_water_filled(untrained: Path) -> None:
    """TorchRec's room reserved per table: the policy's buckets leave HBM far from each
    device's best split; the decode as planned is the policy's devices with it water-filled."""
    from autoshard.policy.network import decode
    from autoshard.search.polish import polish_plan

    task = constrained_task(dlrm_tables(40, seed=3), 4, 0.3, reservation="torchrec")
    alone = PPOSharder(policy=untrained, samples=0, candidates=False, split=False,
                       polish=False, refills=False)
    sharded = alone.solve(task, MODEL)
    plan = sharded.plan
    (ep,) = decode(alone._net, alone._multipliers, task, MODEL, 0, 0)
    raw = ep.plan("ppo")
    assert [(p.table, p.device) for p in plan.placements] == [
        (p.table, p.device) for p in raw.placements]  # no table moved
    cost, raw_cost = (evaluate(p, task, MODEL).step_cost_ms for p in (plan, raw))
    assert cost < raw_cost  # this untrained policy's buckets are far off
    assert sharded.details.costs["ppo-greedy"] == pytest.approx(cost, rel=1e-9)
    # Already water-filled: filling it again finds nothing cheaper.
    assert polish_plan(plan, task, MODEL, cost, fill_only=True)[1] == cost


def _candidate(layout: str, cost: float, *, rival: str | None = None, tuned: bool = False,
               polished: float | None = None) -> list[Candidate]:
    """A candidate (a rival's where ``rival``; the first policy's greedy decode, or the tuned
    one's, over ``layout`` otherwise) and, with ``polished``, the polish's result from it."""
    plan = Plan((), "test")
    made = (Candidate.of_rival(rival, plan, cost) if rival else
            Candidate.decoded(layout, "", tuned, None, plan, cost))
    return [made] if polished is None else [made, made.then("polish", plan, polished)]


def test_the_search_stage_runs_from_the_two_cheapest_candidates_of_distinct_decodes() -> None:
    found = [*_candidate("ppo-split", 5.0, polished=3.0),
             *_candidate("ppo-choice", 4.0, polished=3.0),
             *_candidate("ppo", 3.5, rival="lookup_greedy")]
    assert [c.name for c in refined_starts(found)] == ["ppo-split-greedy+polish",
                                                       "ppo-choice-greedy+polish"]
    alone = _candidate("ppo", 1.0, rival="lookup_greedy")
    assert [c.name for c in refined_starts(alone)] == ["lookup_greedy"]
    # The tuned policy's cheapest comes after the starts there would be without it.
    tuned = [*_candidate("ppo-split", 0.7, tuned=True, polished=0.5),
             *_candidate("ppo-choice", 0.6, tuned=True), *_candidate("ppo-split", 2.0),
             *_candidate("ppo", 3.2, polished=3.0),
             *_candidate("ppo", 4.0, rival="lookup_greedy")]
    assert [c.name for c in refined_starts(tuned)] == ["ppo-split-greedy", "ppo-greedy+polish",
                                                       "ppo-split-greedy-tuned+polish"]


def test_the_default_decodes_both_committed_policies_on_tasks_up_to_the_small_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no policy is named, the tuned policy's decodes compete too (named ``-tuned``), on
    tasks of up to ``SMALL_TASK`` pairs that keep HBM room per table only; so the policy alone
    is never dearer there than the first policy's decodes alone, and a named policy decodes
    alone."""
    task = constrained_task(dlrm_tables(24, seed=5), 4, 0.3, reservation="torchrec")
    both = get_sharder("ppo-policy")
    first = get_sharder("ppo-policy", policy=str(DEFAULT_POLICY))
    assert both.tuned and not first.tuned  # type: ignore[attr-defined]
    with_both, with_first = both.solve(task, MODEL), first.solve(task, MODEL)
    cost_both = evaluate(with_both.plan, task, MODEL).step_cost_ms
    cost_first = evaluate(with_first.plan, task, MODEL).step_cost_ms
    names, own = set(with_both.details.costs), set(with_first.details.costs)
    tuned = {n for n in names if n.endswith(TUNED_SUFFIX)}
    assert tuned == {n + TUNED_SUFFIX for n in own} and names == own | tuned
    assert cost_both <= cost_first
    bare = constrained_task(dlrm_tables(24, seed=5), 4, 0.3)  # no room kept
    assert not any(n.endswith(TUNED_SUFFIX) for n in both.solve(bare, MODEL).details.costs)
    monkeypatch.setattr(tuning, "SMALL_TASK", task.num_tables * task.num_devices - 1)
    assert not any(n.endswith(TUNED_SUFFIX) for n in both.solve(task, MODEL).details.costs)


def test_the_tuned_policy_must_share_the_first_ones_buckets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import shutil

    other = tmp_path / "tuned"
    shutil.copytree(ppo_module.TUNED_POLICY, other)
    config = json.loads((other / "config.json").read_text())
    config["multipliers"] = [m if m != "2.0" else "2.5" for m in config["multipliers"]]
    (other / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(ppo_module, "TUNED_POLICY", other)
    with pytest.raises(InputError, match="bucket multipliers") as info:
        PPOSharder()
    assert str(other) in str(info.value)
