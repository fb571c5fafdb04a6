"""Episodes that water-fill each device's HBM after every placement (``refill``): the policy's
observation then shows the loads the decode's water-filled end will have."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from autoshard.envs import ENV_ID, PlacementEnv, TaskSampler
from autoshard.errors import InputError
from autoshard.layout.plan import check_plan
from autoshard.policy.buckets import MULTIPLIERS, N_BUCKETS
from autoshard.policy.episode import PlacementEpisode, PricedTask
from autoshard.policy.features import ObsLayout
from autoshard.policy.network import PlacementNet, load_policy, save_policy
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.bounds import lower_bound_ms
from autoshard.pricing.curves import Curves
from autoshard.pricing.evaluator import evaluate
from autoshard.search.move_search import Polisher
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()


def played(task: ShardingTask, refill: str, seed: int = 0) -> tuple[PlacementEpisode, float]:
    """An episode of random allowed actions on ``task``; its return."""
    layout = ObsLayout(task.num_devices, N_BUCKETS)
    ep = PlacementEpisode(PricedTask.prepare(task, MODEL, layout, MULTIPLIERS), layout, refill)
    rng, total = np.random.default_rng(seed), 0.0
    while not ep.done:
        total += ep.step(int(rng.choice(np.flatnonzero(ep.mask))))
    return ep, total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_device_ends_water_filled_over_its_items(seed: int) -> None:
    task = constrained_task(dlrm_tables(40, seed=seed), 4, 0.3)
    ep, total = played(task, refill="device", seed=seed)
    state = ep.state
    # No reservation: nothing is kept back, so each device's last placement filled its HBM over
    # the items it ends with, as the polish's water-fill of the finished placement does.
    filled = Polisher(task, MODEL, Curves.price(task, MODEL), state.device,
                      state.hbm_rows).filled_rows()
    price = MODEL.price(task, np.arange(task.num_tables), state.device, filled).total_ms
    best = np.bincount(state.device, weights=price, minlength=task.num_devices)
    assert np.allclose(state.load_ms, best, rtol=1e-9, atol=1e-12)
    # The loads the observation reads are the plan's, and the return is minus its step cost.
    report = evaluate(ep.plan("t"), task, MODEL)
    assert report.step_cost_ms == pytest.approx(state.load_ms.max(), rel=1e-9)
    assert total == pytest.approx(-report.step_cost_ms / lower_bound_ms(task, MODEL), rel=1e-9)


def test_refilled_devices_cost_less_than_the_buckets_the_actions_chose() -> None:
    task = constrained_task(dlrm_tables(40, seed=4), 4, 0.3)
    plain, _ = played(task, refill="none", seed=4)
    filled, _ = played(task, refill="device", seed=4)
    assert filled.step_cost_ms < plain.step_cost_ms


@pytest.mark.parametrize(("seed", "mode"), [(0, "device"), (1, "device"), (0, "level"),
                                            (1, "level")])
def test_with_reservations_every_refill_keeps_room_for_the_tables_still_to_place(
        seed: int, mode: str) -> None:
    task = constrained_task(dlrm_tables(40, seed=seed), 4, 0.3, reservation="torchrec")
    ep, _ = played(task, refill="device", seed=seed)
    plan = ep.plan("t")
    check_plan(plan, task)
    report = evaluate(plan, task, MODEL)
    assert all(d.hbm_bytes <= d.hbm_capacity_bytes for d in report.per_device)
    a = task.table_arrays
    used = np.bincount(ep.state.device, weights=a.hbm_bytes(slice(None), ep.state.hbm_rows),
                       minlength=task.num_devices)
    assert (used <= task.device_arrays.hbm_capacity + 1e-6).all()


@pytest.mark.slow
def test_the_refilling_environment_passes_both_checkers() -> None:
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for split in (False, True):
            for mode in ("device", "level"):
                gym_check(gym.make(ENV_ID, split=split, refill=mode).unwrapped)
                sb3_check(gym.make(ENV_ID, split=split, refill=mode).unwrapped, warn=True)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("mode", ["device", "level"])
def test_a_refilling_episode_returns_minus_its_plans_cost(split: bool, mode: str) -> None:
    sampler = TaskSampler(pool=dlrm_tables(60, seed=3), tables=(8, 20), devices=(2, 4),
                          hbm_fraction=(0.2, 0.4), overheads=("torchrec",))
    env = PlacementEnv(sampler, max_devices=4, split=split, refill=mode)
    rng = np.random.default_rng(0)
    for seed in range(3):
        _, info = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            _, reward, done, _, info = env.step(rng.choice(np.flatnonzero(info["action_mask"])))
            total += reward
        assert total == pytest.approx(-info["report"].step_cost_ms / info["lower_bound_ms"],
                                      rel=1e-9)


def test_the_policy_file_records_its_refill_mode_and_refuses_another_value(tmp_path: Path) -> None:
    save_policy(PlacementNet(N_BUCKETS, 16, refill="level"), tmp_path, MULTIPLIERS)
    net, _, doc = load_policy(tmp_path)
    assert net.refill == doc["refill"] == "level"
    config = tmp_path / "config.json"
    raw = json.loads(config.read_text())
    raw["refill"] = True
    config.write_text(json.dumps(raw))
    with pytest.raises(InputError, match="refill") as err:
        load_policy(tmp_path)
    assert str(config) in str(err.value)
