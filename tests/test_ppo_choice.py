"""The split choice in the policy's action space: the choice episode, its masks, its plans, the
policy on two option grids and its warm start from a one-grid policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from autoshard.layout.kinds import ShardingKind
from autoshard.layout.shards import check_layout
from autoshard.layout.splitting import split_heavy_tables
from autoshard.policy.buckets import MULTIPLIERS, N_BUCKETS
from autoshard.policy.choice import GRIDS, ChoiceEpisode, choice_layout, split_offer
from autoshard.policy.episode import PlacementEpisode, PricedTask
from autoshard.policy.features import ObsLayout
from autoshard.policy.network import PlacementNet, decode, decode_choice, regrid
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.tables import Table
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()
K = N_BUCKETS


def dominated(devices: int = 4, reservation: str = "none") -> ShardingTask:
    """Ten small tables and two whose lookups dwarf the rest (8 devices a node)."""
    tables = (*dlrm_tables(10, seed=3),
              Table("huge", rows=2_000_000, dim=128, pooling_factor=100.0, zipf_alpha=1.05),
              Table("big", rows=1_500_000, dim=128, pooling_factor=90.0, zipf_alpha=1.05))
    return constrained_task(tables, devices, hbm_fraction=0.3, reservation=reservation)


def episodes(task: ShardingTask, node_local: bool = False
             ) -> tuple[ChoiceEpisode, PlacementEpisode]:
    """A choice episode on ``task`` and the whole-table episode it extends."""
    base = ObsLayout(task.num_devices, K)
    priced = PricedTask.prepare(task, MODEL, base, MULTIPLIERS)
    offer = split_offer(priced, base, node_local=node_local)
    return (ChoiceEpisode(priced, choice_layout(task.num_devices, K), offer),
            PlacementEpisode(priced, base))


def grids(ep: ChoiceEpisode) -> np.ndarray:
    """The mask as [devices, grids, buckets]."""
    n = ep.task.num_devices
    return ep.mask[:n * GRIDS * K].reshape(n, GRIDS, K)


def grid0(ep: ChoiceEpisode) -> np.ndarray:
    """The observation with grid 1 cut out: the layout of a whole-table episode."""
    lay = ep.layout
    blocks = ep.obs[lay.head:].reshape(lay.max_devices, lay.device_block)
    head = 1 + len(lay.device)
    kept = blocks[:, :head + K * len(lay.option)]
    return np.concatenate([ep.obs[:lay.head], kept.ravel()])


def test_split_options_only_for_the_tables_that_dominate_and_only_before_they_split() -> None:
    task = dominated()
    ep, _ = episodes(task)
    assert ep.offer is not None
    dominant = set(np.unique(ep.offer.geometry.table).tolist())
    assert {task.tables[t].name for t in dominant} == {"huge", "big"}
    assert dominant == set(split_heavy_tables(task, MODEL).split_tables.tolist())
    offered = []
    while not ep.done:
        item = ep.table
        split = grids(ep)[:, 1]
        whole_item = item < task.num_tables
        assert split.any() == (whole_item and item in dominant)
        if split.any():
            offered.append(item)
            d, k = np.argwhere(split)[0]
            ep.step(int(d * GRIDS * K + K + k))
        else:
            d, k = np.argwhere(grids(ep)[:, 0])[0]
            ep.step(int(d * GRIDS * K + k))
    assert sorted(offered) == sorted(dominant)
    assert sorted(ep.split_tables) == sorted(dominant)


@pytest.mark.parametrize("overhead", ["none", "torchrec"])
def test_with_the_splits_not_taken_the_episode_is_the_whole_table_one(overhead: str) -> None:
    task = dominated(reservation=overhead)
    ep, base = episodes(task)
    rng = np.random.default_rng(0)
    while not base.done:
        np.testing.assert_array_equal(grid0(ep), base.obs)
        np.testing.assert_array_equal(grids(ep)[:, 0].ravel(),
                                      base.mask[:task.num_devices * K])
        a = int(rng.choice(np.flatnonzero(base.mask)))
        d, k = divmod(a, K)
        assert ep.step(d * GRIDS * K + k) == base.step(a)
    assert ep.done
    assert ep.plan("x") == base.plan("x")
    assert ep.step_cost_ms == base.step_cost_ms


@pytest.mark.parametrize(("seed", "overhead"), [(0, "none"), (1, "none"), (2, "torchrec")])
def test_a_chosen_split_gives_a_valid_plan_with_the_offered_shards(seed: int,
                                                                    overhead: str) -> None:
    task = dominated(reservation=overhead)
    ep, _ = episodes(task)
    assert ep.offer is not None
    rng = np.random.default_rng(seed)
    total = 0.0
    while not ep.done:
        total += ep.step(int(rng.choice(np.flatnonzero(ep.mask))))
    plan = ep.plan("x")
    layout = check_layout(plan, task)  # ranges, devices, every device within capacity
    split = {task.tables[t].name for t in ep.split_tables}
    assert {p.table for p in plan.placements if p.is_split} == split
    g = ep.offer.geometry
    for t in ep.split_tables:
        mine = layout.geometry.table == t
        theirs = g.table == t
        for name in ("kind", "parts", "row_start", "row_end", "col_start", "col_end"):
            np.testing.assert_array_equal(getattr(layout.geometry, name)[mine],
                                          getattr(g, name)[theirs])
    # The return is minus the step cost over the bound, the step cost the evaluator's.
    assert -total == pytest.approx(ep.step_cost_ms / ep.lower_bound, rel=1e-9)
    assert evaluate(plan, task, MODEL).step_cost_ms == pytest.approx(ep.step_cost_ms, rel=1e-6)


def test_table_row_wise_shards_stay_on_one_node_one_per_device() -> None:
    task = dominated(16)
    assert task.hardware.devices_per_node < task.num_devices
    ep, _ = episodes(task, node_local=True)
    assert ep.offer is not None
    kinds = set(ep.offer.geometry.kind.tolist())

    if ShardingKind.TABLE_ROW_WISE.code not in kinds:
        pytest.skip("the split heuristic chose no table-row-wise split here")
    rng = np.random.default_rng(0)
    while not ep.done:
        ep.step(int(rng.choice(np.flatnonzero(ep.mask))))
    check_layout(ep.plan("x"), task)  # refuses a table-row-wise table across nodes
    layout = ep.shard_layout()
    for t in ep.split_tables:
        on = layout.device[layout.geometry.table == t]
        if layout.geometry.kind[layout.geometry.table == t][0] == ShardingKind.TABLE_ROW_WISE.code:
            assert len(set(on.tolist())) == on.size  # one per device


@pytest.mark.slow
def test_a_widened_policy_scores_grid_0_as_before_and_decodes_the_same_plan() -> None:
    torch.manual_seed(0)
    net = PlacementNet(K, 32)
    with torch.no_grad():  # distinct bucket embeddings, so a mapping mistake would show
        net.opt_bucket.normal_()
    wide = regrid(net, GRIDS)
    task = dominated()
    ep, base = episodes(task)
    with torch.inference_mode():
        a, _ = net(torch.from_numpy(base.obs[None]))
        b, _ = wide(torch.from_numpy(ep.obs[None]))
    n = task.num_devices
    torch.testing.assert_close(b.reshape(-1, GRIDS, K)[:n, 0], a.reshape(-1, K)[:n])
    # With no split offered (grid 1 masked) the greedy choice decode is the whole-table one.
    g = split_heavy_tables(task, MODEL).geometry
    none = g.take(np.flatnonzero(g.parts == 1))
    choice = decode_choice(net, MULTIPLIERS, task, MODEL, none)[0]
    plain = decode(net, MULTIPLIERS, task, MODEL)[0]
    assert choice.plan("x") == plain.plan("x")
    assert choice.plan("x") != decode(PlacementNet(K, 32), MULTIPLIERS, task, MODEL)[0].plan("x")
    assert regrid(wide, 1).state_dict().keys() == net.state_dict().keys()
    for key, value in regrid(wide, 1).state_dict().items():
        torch.testing.assert_close(value, net.state_dict()[key])


@pytest.mark.slow
def test_the_environment_with_the_split_choice_passes_both_checkers() -> None:
    import warnings

    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    from autoshard.envs import ENV_ID

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check(gym.make(ENV_ID, split=True).unwrapped)
        sb3_check(gym.make(ENV_ID, split=True).unwrapped, warn=True)


def test_the_environment_splits_on_request_and_maps_unmasked_actions() -> None:
    from autoshard.envs import PlacementEnv
    from autoshard.envs.placement import ILLEGAL_PENALTY

    env = PlacementEnv(max_devices=8, split=True, report=True)
    task = dominated()
    _, info = env.reset(seed=0, options={"task": task})
    assert env.action_space.n == 8 * GRIDS * K
    rng = np.random.default_rng(1)
    done, total, flagged = False, 0.0, 0
    while not done:
        mask = env.action_masks()
        np.testing.assert_array_equal(mask, info["action_mask"])
        split = np.flatnonzero(mask.reshape(8, GRIDS, K)[:, 1].ravel())
        if split.size:  # always split: grid 1 of the first device that allows it
            d, k = divmod(int(split[0]), K)
            action = d * GRIDS * K + K + k
        else:  # any action, masked or not
            action = int(rng.integers(env.action_space.n))
        _, reward, done, _, info = env.step(action)
        flagged += info["illegal_action"]
        total += reward + (ILLEGAL_PENALTY if info["illegal_action"] else 0.0)
        assert mask[info["action"]]
    assert flagged > 0
    assert info["plan"].is_split
    check_layout(info["plan"], task)
    assert -total == pytest.approx(info["report"].step_cost_ms / info["lower_bound_ms"],
                                   rel=1e-6)


def test_a_one_grid_policy_of_format_1_loads_and_plans_with_the_split_choice(
        tmp_path: Path) -> None:
    import json

    from autoshard.policy.network import load_policy, save_policy
    from autoshard.sharders.ppo import PPOSharder

    torch.manual_seed(0)
    save_policy(PlacementNet(K, 16), tmp_path, MULTIPLIERS)
    doc = json.loads((tmp_path / "config.json").read_text())
    assert doc["version"] == 3 and doc["grids"] == 1 and doc["refill"] == "none"
    doc["version"] = 1  # as policies were written before the split choice
    del doc["grids"], doc["refill"]
    (tmp_path / "config.json").write_text(json.dumps(doc))
    net, _, _ = load_policy(tmp_path)
    assert net.grids == 1
    sharder = PPOSharder(policy=tmp_path, samples=0, candidates=False, polish=False)
    task = dominated()
    sharded = sharder.solve(task, MODEL)
    check_layout(sharded.plan, task)
    assert "ppo-choice-greedy" in sharded.details.costs


def test_a_policy_of_an_unknown_version_is_refused(tmp_path: Path) -> None:
    import json

    from autoshard.errors import InputError
    from autoshard.policy.network import load_policy, save_policy

    save_policy(PlacementNet(K, 16, GRIDS), tmp_path, MULTIPLIERS)
    assert load_policy(tmp_path)[0].grids == GRIDS
    doc = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**doc, "version": 9}))
    with pytest.raises(InputError, match="version"):
        load_policy(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**doc, "grids": 3}))
    with pytest.raises(InputError, match=r"field 'grids', value 3: must be an integer in \[1, 2\]"):
        load_policy(tmp_path)


@pytest.mark.slow
def test_training_with_the_split_choice_starts_from_a_one_grid_policy(tmp_path: Path) -> None:
    import json

    from autoshard.policy.network import load_policy, save_policy
    from autoshard.training.config import TrainConfig
    from autoshard.training.train import train

    torch.manual_seed(0)
    start = PlacementNet(K, 16)
    save_policy(start, tmp_path / "start", MULTIPLIERS)
    cfg = TrainConfig(out=str(tmp_path / "run"), wandb_mode="disabled", split=True,
                      vec_env="dummy", init_policy=str(tmp_path / "start"), timesteps=256,
                      n_envs=2, n_steps=64, batch_size=64, n_epochs=2, train_tables=(4, 12),
                      batch_sizes=(4096,), modes=("train",), eval_tables=(12,),
                      eval_devices=(2, 3), eval_repeats=1, eval_every=128,
                      checkpoint_every=128, hidden=16)
    result = train(cfg)
    net, _, _ = load_policy(result.policy_dir)
    assert net.grids == GRIDS
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [h["step"] for h in history if "eval_ratio" in h] == [0, 128, 256]
