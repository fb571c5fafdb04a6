"""A Gymnasium environment that places a task's tables one by one on devices and memory tiers."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from autoshard.envs.sampler import TaskSampler
from autoshard.layout.plan import Plan
from autoshard.policy.buckets import MULTIPLIERS
from autoshard.policy.choice import ChoiceEpisode, choice_layout, split_offer
from autoshard.policy.episode import LIMIT, PlacementEpisode, PricedTask
from autoshard.policy.features import ObsLayout
from autoshard.policy.refill import checked_mode
from autoshard.pricing.cost import CostModel, load_cost_model, prices_device_sets
from autoshard.pricing.evaluator import evaluate
from autoshard.task import ShardingTask

#: Reward added (in units of the task's lower bound) when an action that does not fit was
#: replaced by the nearest legal one.
ILLEGAL_PENALTY = 0.1


class PlacementEnv(gym.Env[np.ndarray, np.int64]):
    """Places the tables of one sharding task per episode, costliest first.

    Each step places the next table with one discrete action ``device * buckets + bucket``:
    the device, and the HBM-split bucket that decides how many of its hottest rows stay in HBM,
    the rest living in the device's host memory (see
    :class:`autoshard.policy.episode.PlacementEpisode`, which this environment wraps).
    :meth:`action_masks` (also ``info["action_mask"]``) says exactly which actions fit. An
    action that does not fit is not an error: like other masked-action environments, it is
    replaced by the nearest legal action (same device, nearest bucket; else the option that
    raises the step cost least), ``info["illegal_action"]`` is True (``info["action"]`` is what
    was played) and the reward carries a penalty of :data:`ILLEGAL_PENALTY`. An action outside
    the action space raises ValueError.

    The reward is the increase of the step cost (max over devices) divided by the task's lower
    bound, negated, so an episode without illegal actions returns -(step cost / lower bound).
    At the end of an episode ``info`` holds the ``plan`` and, if enabled, its evaluator
    ``report``. With a cost model that prices a device's whole table set (a set model, see
    :func:`autoshard.pricing.cost.device_compute`), the steps add the tables' own prices, and the
    last reward settles the difference to the evaluator's device-level step cost: the return is
    still -(step cost / lower bound) and ``info["step_cost_ms"]`` is that step cost (the sum of the
    tables' prices is ``info["summed_step_cost_ms"]``).

    Args:
        sampler: Draws a task at every reset without ``options={"task": ...}`` (default: the
            domain-randomised :class:`autoshard.envs.sampler.TaskSampler`).
        cost_model: A :class:`autoshard.pricing.cost.CostModel`, or ``"analytical"`` / a model
            folder.
        max_devices: Device slots in the observation and action space (default: the sampler's
            largest device count, 8 without a sampler); tasks may use fewer.
        multipliers: The buckets' HBM value multipliers (see
            :mod:`autoshard.policy.buckets`).
        report: Whether to run the evaluator at the end of each episode.
        sharder_name: Name recorded in the final plan.
        split: Whether the actions also choose which dominant tables to split (two option
            grids per device, see :mod:`autoshard.policy.choice`; the plan may then hold
            split tables).
        fill: Whether the finished plan's HBM is water-filled per device over the items the
            episode placed there (as the ``ppo`` sharders plan each decode,
            :func:`autoshard.search.polish.polish_plan` with ``fill_only``; no item moves):
            the last reward then settles to that plan's step cost, so the return rewards the
            devices chosen rather than the buckets.
        refill: How each placement water-fills its device's HBM over the items there
            (:data:`autoshard.policy.refill.MODES`): with ``device`` or ``level``, the
            observation and the rewards show each device's load as the water-filled plan will
            have it.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)

    def __init__(self, sampler: TaskSampler | None = None,
                 cost_model: CostModel | str | None = None, max_devices: int | None = None,
                 multipliers: tuple[float, ...] = MULTIPLIERS, report: bool = True,
                 sharder_name: str = "env", split: bool = False, fill: bool = False,
                 refill: str = "none") -> None:
        self._sampler = sampler
        self.cost_model = (cost_model if cost_model is not None and not isinstance(cost_model, str)
                           else load_cost_model(cost_model))
        self.max_devices = int(max_devices or (sampler.max_devices if sampler else 8))
        if self.max_devices < 1:
            raise ValueError(f"max_devices must be >= 1, got {self.max_devices}")
        self.multipliers = tuple(float(m) for m in multipliers)
        self.buckets = len(self.multipliers) + 1  # the value buckets, then "fill"
        self.report = report
        self.sharder_name = sharder_name
        self.split, self.fill, self.refill = split, fill, checked_mode(refill)
        self.layout = (choice_layout(self.max_devices, self.buckets) if split
                       else ObsLayout(self.max_devices, self.buckets))
        self.action_space = spaces.Discrete(self.max_devices * self.layout.buckets)
        self.observation_space = spaces.Box(-LIMIT, LIMIT, (self.layout.size,), np.float32)
        self.episode: PlacementEpisode | None = None

    @property
    def task(self) -> ShardingTask | None:
        return self.episode.task if self.episode else None

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode on ``options["task"]`` if given, else on a sampled task."""
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            task = self.sampler.sample(self.np_random, self.max_devices)
        elif not isinstance(task, ShardingTask):
            raise ValueError(f"options['task'] must be a ShardingTask, got {type(task).__name__}")
        if task.num_devices > self.max_devices:
            raise ValueError(f"task has {task.num_devices} devices; this environment has "
                             f"{self.max_devices} device slots (max_devices)")
        if self.split:
            base = ObsLayout(self.max_devices, self.buckets)
            priced = PricedTask.prepare(task, self.cost_model, base, self.multipliers)
            self.episode = ChoiceEpisode(priced, self.layout, split_offer(priced, base),
                                         self.refill)
        else:
            priced = PricedTask.prepare(task, self.cost_model, self.layout, self.multipliers)
            self.episode = PlacementEpisode(priced, self.layout, self.refill)
        return self.episode.bounded_obs(), {"action_mask": self.episode.mask.copy()}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        ep = self.episode
        if ep is None or ep.done:
            raise RuntimeError("the episode is over (or never started): call reset()")
        a = int(action)
        if not 0 <= a < ep.mask.size:
            raise ValueError(ep.illegal_reason(a))
        illegal = not ep.mask[a]
        played = ep.nearest_legal(a) if illegal else a
        reward = ep.step(played) - (ILLEGAL_PENALTY if illegal else 0.0)
        info: dict[str, Any] = {"action_mask": ep.mask.copy(), "illegal_action": illegal,
                                "action": played}
        if ep.done:
            info.update(self._final(ep))
            reward -= (info["step_cost_ms"] - ep.step_cost_ms) / ep.lower_bound
        return ep.bounded_obs(), reward, ep.done, False, info

    def action_masks(self) -> np.ndarray:
        """Allowed actions for the next table: devices of the task where the bucket fits."""
        if self.episode is None:
            return np.zeros(self.max_devices * self.layout.buckets, dtype=bool)
        return self.episode.mask.copy()

    @property
    def sampler(self) -> TaskSampler:
        """The task sampler (the default one is built on first use)."""
        if self._sampler is None:
            self._sampler = TaskSampler()
        return self._sampler

    @property
    def lower_bound(self) -> float:
        """The task's lower bound (ms), the reward's unit."""
        assert self.episode is not None
        return self.episode.lower_bound

    def _final(self, ep: PlacementEpisode) -> dict[str, Any]:
        plan, cost = ep.plan(self.sharder_name), ep.step_cost_ms
        if self.fill:
            from autoshard.search.polish import polish_plan

            plan, cost = polish_plan(plan, ep.task, self.cost_model, cost, fill_only=True)
        return final_info(ep.task, plan, cost, ep.lower_bound, self.cost_model, self.report)


def final_info(task: ShardingTask, plan: Plan, step_cost_ms: float, lower_bound: float,
               cost_model: CostModel, report: bool) -> dict[str, Any]:
    """The ``info`` entries of an episode's last step: the finished plan, its step cost and,
    if ``report``, its evaluator report (always run for a model that prices devices' table
    sets: it gives the step cost; ``step_cost_ms`` is then the sum of the tables' prices)."""
    info: dict[str, Any] = {"plan": plan}
    sets = prices_device_sets(cost_model)
    if report or sets:
        info["report"] = evaluate(plan, task, cost_model)
    if sets:
        info["summed_step_cost_ms"] = step_cost_ms
        step_cost_ms = info["report"].step_cost_ms
    info.update({"step_cost_ms": step_cost_ms, "lower_bound_ms": lower_bound,
                 "cost_ratio": step_cost_ms / lower_bound})
    return info
