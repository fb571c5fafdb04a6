"""The placement environment: Gymnasium/SB3 contracts, masks, rewards, determinism."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest

from autoshard.envs import ENV_ID, PlacementEnv, TaskSampler
from autoshard.envs.placement import ILLEGAL_PENALTY
from autoshard.errors import InputError, PlannerError
from autoshard.layout.plan import check_plan
from autoshard.policy.buckets import MULTIPLIERS, N_BUCKETS, bucket_rows
from autoshard.policy.features import ObsLayout
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.bounds import lower_bound_ms
from autoshard.pricing.cost import Pricing
from autoshard.pricing.evaluator import evaluate
from autoshard.reservation import get_reservation
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables

POOL = dlrm_tables(60, seed=3)


def constrained(devices: tuple[int, ...] = (2, 3, 5), max_devices: int | None = 8,
                **kw: object) -> PlacementEnv:
    sampler = TaskSampler(pool=POOL, tables=(8, 20), devices=devices, hbm_fraction=(0.3, 0.6),
                          batch_sizes=(65536,), modes=("train",))
    return PlacementEnv(sampler, max_devices=max_devices, **kw)  # type: ignore[arg-type]


def play(env: PlacementEnv, rng: np.random.Generator, seed: int | None = None,
         task: ShardingTask | None = None) -> tuple[list[np.ndarray], list[float], dict]:
    """One episode with uniformly random allowed actions."""
    obs, info = env.reset(seed=seed, options={"task": task} if task else None)
    seen, rewards, done = [obs], [], False
    while not done:
        assert np.array_equal(info["action_mask"], env.action_masks())
        action = rng.choice(np.flatnonzero(env.action_masks()))
        obs, reward, done, truncated, info = env.step(action)
        assert not truncated
        seen.append(obs)
        rewards.append(reward)
    return seen, rewards, info


@pytest.mark.slow
def test_registered_default_env_passes_both_checkers_with_no_warnings() -> None:
    from gymnasium.utils.env_checker import check_env as gym_check
    from stable_baselines3.common.env_checker import check_env as sb3_check

    # As a user makes it: the default, domain-randomised sampler, where most unmasked actions
    # the checkers sample do not fit.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check(gym.make(ENV_ID).unwrapped)
        sb3_check(gym.make(ENV_ID).unwrapped, warn=True)


def test_unmasked_random_actions_finish_the_episode_with_flags_and_penalties() -> None:
    env = gym.make(ENV_ID).unwrapped
    rng = np.random.default_rng(0)
    illegal_seen = 0
    for seed in range(4):
        _, info = env.reset(seed=seed)
        mask, total, done, penalties = info["action_mask"], 0.0, False, 0
        while not done:
            action = int(rng.integers(env.action_space.n))
            _, reward, done, _, info = env.step(action)
            assert info["illegal_action"] == (not mask[action])
            assert mask[info["action"]]  # what was played was allowed
            assert info["action"] == action or info["illegal_action"]
            penalties += info["illegal_action"]
            total += reward
            mask = info["action_mask"]
            assert np.array_equal(mask, env.action_masks())
        illegal_seen += penalties
        check_plan(info["plan"], env.task)  # a valid plan within every capacity
        assert total == pytest.approx(-info["cost_ratio"] - ILLEGAL_PENALTY * penalties,
                                      rel=1e-9)
    assert illegal_seen > 0


def test_registered_id_makes_the_env() -> None:
    env = gym.make(ENV_ID, sampler=TaskSampler(pool=POOL, tables=(3, 4), devices=(2,)))
    assert isinstance(env.unwrapped, PlacementEnv)
    obs, info = env.reset(seed=0)
    assert obs.shape == env.observation_space.shape
    assert info["action_mask"].any()


@pytest.mark.parametrize("seed", range(6))
def test_random_masked_agent_ends_with_a_valid_plan(seed: int) -> None:
    env = constrained()
    _, rewards, info = play(env, np.random.default_rng(seed), seed=seed)
    assert env.task is not None
    device, hbm = check_plan(info["plan"], env.task)  # raises if invalid or over capacity
    assert device.max() < env.task.num_devices
    assert (hbm <= env.task.table_arrays.rows).all()
    assert len(rewards) == env.task.num_tables
    assert info["report"].sharder == "env"


@pytest.mark.parametrize("seed", range(3))
def test_return_is_minus_evaluator_cost_over_bound(seed: int) -> None:
    env = constrained()
    _, rewards, info = play(env, np.random.default_rng(seed), seed=seed)
    report = info["report"]
    assert env.task is not None
    again = evaluate(info["plan"], env.task, AnalyticalCostModel())
    # The reward's unit is the bound of the plans an episode makes (no replicated tables).
    unit = lower_bound_ms(env.task, AnalyticalCostModel())
    assert sum(rewards) == pytest.approx(-again.step_cost_ms / unit, rel=1e-9)
    assert report.cost_ratio == pytest.approx(again.cost_ratio, rel=1e-12)
    assert info["step_cost_ms"] == pytest.approx(report.step_cost_ms, rel=1e-9)
    assert all(r <= 0.0 for r in rewards)


def test_same_seed_same_episode() -> None:
    a = play(constrained(), np.random.default_rng(5), seed=11)
    b = play(constrained(), np.random.default_rng(5), seed=11)
    c = play(constrained(), np.random.default_rng(5), seed=12)
    assert len(a[0]) == len(b[0])
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0], strict=True))
    assert a[1] == b[1]
    assert a[2]["plan"] == b[2]["plan"]
    assert not (len(a[0]) == len(c[0]) and all(
        np.array_equal(x, y) for x, y in zip(a[0], c[0], strict=True)))


def test_variable_device_counts_share_one_spec() -> None:
    env = constrained(devices=(2, 5, 8), max_devices=8)
    layout = ObsLayout(8, N_BUCKETS)
    seen = set()
    for seed in range(12):
        obs, info = env.reset(seed=seed)
        assert env.task is not None
        n = env.task.num_devices
        seen.add(n)
        assert obs.shape == (layout.size,)
        blocks = obs[layout.head:].reshape(8, layout.device_block)
        assert blocks[:, 0].tolist() == [1.0] * n + [0.0] * (8 - n)
        assert not blocks[n:].any()
        mask = info["action_mask"].reshape(8, N_BUCKETS)
        assert not mask[n:].any() and mask[:n].any()
    assert seen == {2, 5, 8}


def test_actions_outside_the_space_raise_with_expected_and_actual() -> None:
    env = constrained(devices=(2,), max_devices=4)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"outside \[0, 36\); expected one of"):
        env.step(36)


def test_illegal_action_goes_to_the_nearest_allowed_bucket_of_its_device() -> None:
    env = constrained(devices=(2,), max_devices=2)
    env.reset(seed=1)
    mask = env.action_masks().reshape(2, N_BUCKETS)
    device = int(np.flatnonzero((~mask).any(axis=1) & mask.any(axis=1))[0])
    bucket = int(np.flatnonzero(~mask[device])[0])
    allowed = np.flatnonzero(mask[device])
    nearest = int(allowed[np.argmin(np.abs(allowed - bucket))])
    _, _, _, _, info = env.step(device * N_BUCKETS + bucket)
    assert info["illegal_action"] and info["action"] == device * N_BUCKETS + nearest


def test_illegal_action_on_an_absent_device_plays_the_cheapest_increase() -> None:
    env = constrained(devices=(2,), max_devices=4)
    env.reset(seed=0)
    episode = env.episode
    assert episode is not None
    layout = env.layout
    options = episode.obs[layout.head:].reshape(4, layout.device_block)[
        :2, 1 + len(layout.device):].reshape(-1, len(layout.option))
    legal = np.flatnonzero(env.action_masks())
    increase = options[legal, layout.option["increase"]]
    _, _, _, _, info = env.step(3 * N_BUCKETS)  # device 3 of a 2-device task
    assert info["illegal_action"]
    assert options[info["action"], layout.option["increase"]] == increase.min()


def test_all_rows_bucket_is_there_and_buckets_grow() -> None:
    task = constrained_task(POOL[:15], 3, hbm_fraction=0.4)
    model = AnalyticalCostModel()
    rows = bucket_rows(task, model)
    assert (rows[:, 0] == 0).all()
    assert (rows[:, -1] == task.table_arrays.rows).all()
    assert (np.diff(rows, axis=1) >= 0).all()
    # Multiplier 1 is the relaxation's split: together it about fills the cluster's HBM.
    ref = rows[:, MULTIPLIERS.index(1.0)] * task.table_arrays.memory_bytes_per_row
    budget = task.device_arrays.hbm_capacity.sum()
    assert 0.8 * budget < ref.sum() <= 1.05 * budget


@dataclass
class Doubled:
    """A cost model that is the analytical one times two."""

    name: str = "doubled"

    def price(self, task: ShardingTask, table_idx: np.ndarray, device_idx: np.ndarray,
              hbm_rows: np.ndarray) -> Pricing:
        p = AnalyticalCostModel().price(task, table_idx, device_idx, hbm_rows)
        return Pricing(2 * p.hbm_ms, 2 * p.uvm_ms, 2 * p.comm_ms)


def test_prices_through_the_given_cost_model() -> None:
    task = constrained_task(POOL[:3], 2, hbm_fraction=5.0)
    plain, doubled = PlacementEnv(max_devices=2), PlacementEnv(max_devices=2, cost_model=Doubled())
    ends = []
    for env in (plain, doubled):
        env.reset(options={"task": task})
        total, done = 0.0, False
        while not done:  # everything on device 0, all rows in HBM
            _, reward, done, _, info = env.step(len(MULTIPLIERS) - 1)
            total += reward
        ends.append((total, info["step_cost_ms"], info["report"].cost_model))
    direct = AnalyticalCostModel().price(task, np.arange(3), np.zeros(3, int),
                                         task.table_arrays.rows).total_ms.sum()
    assert ends[0][1] == pytest.approx(direct, rel=1e-12)
    assert ends[1][1] == pytest.approx(2 * direct, rel=1e-12)
    assert ends[0][0] == pytest.approx(ends[1][0], rel=1e-9)  # the return is scale-free
    assert ends[1][2] == "doubled"


def test_given_task_too_large_or_wrong_type_is_refused() -> None:
    env = PlacementEnv(max_devices=2)
    with pytest.raises(ValueError, match="4 devices; this environment has 2 device slots"):
        env.reset(options={"task": constrained_task(POOL[:3], 4)})
    with pytest.raises(ValueError, match="must be a ShardingTask"):
        env.reset(options={"task": "tables.json"})
    with pytest.raises(RuntimeError, match="call reset"):
        PlacementEnv(max_devices=2).step(0)


def test_task_that_fits_nowhere_is_a_planner_error() -> None:
    task = constrained_task(POOL[:3], 2, hbm_fraction=0.1)
    tiny = task.hardware.with_hbm_bytes(0)
    from dataclasses import replace

    from autoshard.hardware import Tier

    devices = tuple(replace(d, host=Tier(0, d.host.bandwidth_gbps)) for d in tiny.devices)
    task = ShardingTask(task.tables, replace(tiny, devices=devices), task.workload)
    with pytest.raises(PlannerError, match="fits on no device"):
        PlacementEnv(max_devices=2).reset(options={"task": task})


def test_fill_bucket_keeps_the_hot_rows_that_fit_when_no_value_bucket_does() -> None:
    # One device whose HBM holds a third of the one table: only "none" and "fill" remain.
    task = constrained_task(POOL[:1], 1, hbm_fraction=0.33)
    env = PlacementEnv(max_devices=1)
    _, info = env.reset(options={"task": task})
    fit_rows = int(np.floor(task.device_arrays.hbm_capacity[0]
                            / task.table_arrays.memory_bytes_per_row[0]))
    assert info["action_mask"][N_BUCKETS - 2] == False  # all rows: no  # noqa: E712
    assert info["action_mask"][N_BUCKETS - 1]  # fill: yes
    _, reward, done, _, info = env.step(N_BUCKETS - 1)
    assert done and info["plan"].placements[0].hbm_rows == fit_rows
    direct = AnalyticalCostModel().price(task, np.array([0]), np.array([0]),
                                         np.array([fit_rows])).total_ms[0]
    assert info["step_cost_ms"] == pytest.approx(direct, rel=1e-12)
    assert -reward == pytest.approx(info["report"].cost_ratio, rel=1e-9)


def test_sampler_draws_reservations_that_leave_episodes_room() -> None:
    import dataclasses

    from autoshard.envs.sampler import roomy

    sampler = TaskSampler(pool=POOL, tables=(8, 40), devices=(2, 4, 8),
                          hbm_fraction=(0.05, 0.5), overheads=("none", "torchrec"))
    rng = np.random.default_rng(0)
    drawn = [sampler.sample(rng) for _ in range(30)]
    assert {t.reservation.name for t in drawn} == {"none", "torchrec"}
    for task in drawn:
        assert task.reservation.name == "none" or roomy(task)
        # The reservation is the one a task built from scratch has.
        fresh = ShardingTask(task.tables, task.hardware, task.workload, task.reservation)
        for f in dataclasses.fields(fresh.table_arrays):
            np.testing.assert_allclose(getattr(task.table_arrays, f.name),
                                       getattr(fresh.table_arrays, f.name), err_msg=f.name)
    reserved = [t for t in drawn if t.reservation.name == "torchrec"]
    assert all(t.table_arrays.hbm_reserved_bytes.min() > 0 for t in reserved)
    # With TorchRec's reservation the only overhead, crowded draws are drawn again too (they
    # once reached the episodes, where a table then fitted on no device).
    alone = dataclasses.replace(sampler, overheads=("torchrec",))
    rng = np.random.default_rng(0)
    raw = [alone._draw(rng, [2, 4, 8]).with_reservation(get_reservation("torchrec"))
           for _ in range(30)]
    assert not all(roomy(t) for t in raw)  # such draws exist in this distribution
    rng = np.random.default_rng(0)
    assert all(roomy(t) or t.reservation.name == "none"
               for t in (alone.sample(rng) for _ in range(30)))
    # Without a reservation, the same tasks as the plain draws (the streams unchanged).
    plain = dataclasses.replace(sampler, overheads=("none",))
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(5):
        assert plain.sample(a).tables == plain._draw(b, [2, 4, 8]).tables
    # Their episodes finish with valid plans.
    env = PlacementEnv(sampler, max_devices=8)
    for task in reserved[:3]:
        _, _, info = play(env, rng, task=task)
        check_plan(info["plan"], task)
        assert info["step_cost_ms"] == pytest.approx(
            evaluate(info["plan"], task, env.cost_model).step_cost_ms, rel=1e-9)
    with pytest.raises(InputError, match="overheads"):
        TaskSampler(overheads=("gpu",))


@pytest.mark.parametrize("split", [False, True])
def test_fill_settles_the_return_to_the_water_filled_plan_of_the_same_devices(
        split: bool) -> None:
    model = AnalyticalCostModel()
    task = constrained_task(dlrm_tables(30, seed=5), 4, 0.3, reservation="torchrec")
    ends = {}
    for fill in (False, True):  # through the registered id, as training makes it
        env = gym.make(ENV_ID, max_devices=8, split=split, fill=fill, report=False)
        _, info = env.reset(seed=1, options={"task": task})
        rng, rewards, done = np.random.default_rng(1), [], False
        while not done:
            action = rng.choice(np.flatnonzero(info["action_mask"]))
            _, reward, done, _, info = env.step(action)
            rewards.append(reward)
        ends[fill] = (sum(rewards), info)
    (plain, before), (filled, after) = ends[False], ends[True]
    assert [(p.table, p.device) for p in after["plan"].placements] == [
        (p.table, p.device) for p in before["plan"].placements]  # the same episode, no move
    cost = evaluate(after["plan"], task, model).step_cost_ms
    assert cost < before["step_cost_ms"]  # random buckets: far from each device's best split
    assert after["step_cost_ms"] == pytest.approx(cost, rel=1e-9)
    unit = lower_bound_ms(task, model)
    assert filled == pytest.approx(-cost / unit, rel=1e-9)
    assert filled - plain == pytest.approx((before["step_cost_ms"] - cost) / unit, rel=1e-9)
