"""The batched environment plays exactly the episodes of N registered single environments."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

from autoshard.envs import ENV_ID, TaskSampler
from autoshard.envs.batched import BatchedPlacementEnv
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.cost import Pricing
from autoshard.task import ShardingTask

FIXED = TaskSampler(tables=(40, 40), devices=(8,), hbm_fraction=(0.3, 0.3),
                    batch_sizes=(65536,), modes=("train",), styles=("mixed",))
VARIED = TaskSampler(tables=(4, 30), devices=(2, 3, 4, 6, 8, 12, 16))


class PerTaskModel:
    """The analytical model behind the plain interface only (no batched pricing)."""

    name = "analytical-per-task"

    def __init__(self) -> None:
        self.inner = AnalyticalCostModel()

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        return self.inner.price(task, table_idx, device_idx, hbm_rows)


def pair(n: int, sampler: TaskSampler, seed: int, **kwargs: Any
         ) -> tuple[DummyVecEnv, BatchedPlacementEnv]:
    """N registered single environments in SB3's DummyVecEnv, and the batched one."""
    single = DummyVecEnv([lambda: gym.make(ENV_ID, sampler=sampler, **kwargs)
                          for _ in range(n)])
    batched = BatchedPlacementEnv(n, sampler, **kwargs)
    single.seed(seed)
    batched.seed(seed)
    return single, batched


def same_info(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, np.ndarray):
            assert value.dtype == b[key].dtype and np.array_equal(value, b[key]), key
        else:
            assert value == b[key], key


def play(single: DummyVecEnv, batched: BatchedPlacementEnv, steps: int, seed: int,
         unmasked: float) -> dict[str, int]:
    """Steps both with the same actions (a share ``unmasked`` drawn over all actions, legal
    or not) and checks every output; returns counts of what happened."""
    assert np.array_equal(single.reset(), batched.reset())
    for a, b in zip(single.reset_infos, batched.reset_infos, strict=True):
        same_info(a, b)
    rng = np.random.default_rng(seed)
    seen = {"episodes": 0, "illegal": 0, "splits": 0}
    grid = single.get_attr("layout")[0].buckets // single.get_attr("buckets")[0]
    for _ in range(steps):
        masks = get_action_masks(single)
        assert np.array_equal(masks, get_action_masks(batched))
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
        wild = rng.random(len(actions)) < unmasked
        actions[wild] = rng.integers(0, masks.shape[1], int(wild.sum()))
        obs, rewards, dones, infos = single.step(actions)
        b_obs, b_rewards, b_dones, b_infos = batched.step(actions)
        assert np.array_equal(obs, b_obs) and obs.dtype == b_obs.dtype
        assert np.array_equal(rewards, b_rewards) and rewards.dtype == b_rewards.dtype
        assert np.array_equal(dones, b_dones)
        for a, b in zip(infos, b_infos, strict=True):
            same_info(a, b)
        seen["episodes"] += int(dones.sum())
        seen["illegal"] += sum(info["illegal_action"] for info in infos)
        if grid > 1:  # a split: an action of the second option grid was played
            k = single.get_attr("buckets")[0]
            seen["splits"] += sum((info["action"] % (grid * k)) >= k for info in infos)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize(("sampler", "n", "kwargs"), [
    (FIXED, 3, {"max_devices": 8, "report": True}),
    (VARIED, 5, {"max_devices": 16, "report": False}),
])
def test_same_episodes_as_single_envs(sampler: TaskSampler, n: int,
                                      kwargs: dict[str, Any]) -> None:
    single, batched = pair(n, sampler, seed=7, **kwargs)
    seen = play(single, batched, steps=130, seed=3, unmasked=0.15)
    assert seen["episodes"] >= n  # every slot finished and was reset at least once
    assert seen["illegal"] > 10  # unmasked illegal actions were mapped, flagged, penalised


@pytest.mark.slow
def test_same_episodes_with_a_model_priced_per_task() -> None:
    single, batched = pair(4, VARIED, seed=11, max_devices=16, report=False,
                           cost_model=PerTaskModel())
    assert play(single, batched, steps=80, seed=5, unmasked=0.1)["episodes"] >= 4


def test_masks_reach_maskable_ppo_through_wrappers() -> None:
    env = VecMonitor(BatchedPlacementEnv(3, VARIED, max_devices=16, report=False))
    assert is_masking_supported(env)
    env.seed(0)
    env.reset()
    masks = get_action_masks(env)
    assert masks.shape == (3, env.action_space.n) and masks.dtype == bool
    assert masks.any(axis=1).all()
    done = np.zeros(3, dtype=bool)
    for _ in range(40):
        _, _, dones, infos = env.step(get_action_masks(env).argmax(axis=1))
        done |= dones
    assert done.all() and all("episode" in info for info, d in zip(infos, dones, strict=True)
                              if d)


def test_actions_outside_the_space_raise() -> None:
    env = BatchedPlacementEnv(2, VARIED, max_devices=16)
    env.seed(0)
    env.reset()
    with pytest.raises(ValueError, match="outside"):
        env.step(np.array([0, env.action_space.n]))


DOMINANT = TaskSampler(tables=(6, 30), devices=(2, 4, 8), styles=("dominant",))


@pytest.mark.slow
@pytest.mark.parametrize(("sampler", "cost_model"), [
    (DOMINANT, None), (VARIED, None), (DOMINANT, PerTaskModel())])
def test_same_episodes_as_single_envs_with_the_split_choice(sampler: TaskSampler,
                                                            cost_model: Any) -> None:
    single, batched = pair(4, sampler, seed=5, max_devices=8, report=False, split=True,
                           cost_model=cost_model)
    seen = play(single, batched, steps=150, seed=2, unmasked=0.1)
    assert seen["episodes"] >= 4
    assert seen["splits"] > 0  # some episodes chose to split a table
